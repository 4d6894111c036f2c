"""``P2POp`` and ``batch_isend_irecv``: torch.distributed's batched point-to-point calls.

A batch is a list of sends and receives started together. In asyncdist
every ``isend``/``irecv`` is already non-blocking and matched by (source,
tag, order), so a batch is simply each op started in turn, all in one step
of the loop: the order of sends and receives in the list cannot deadlock,
operations between the same pair in the same direction match in list
order, as torch documents, and on a group whose CUDA tensors go through
NCCL the batch is one NCCL group call, as in torch.

Thread affinity: any thread but asyncdist's loop thread.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgumentError
from .state import _group, _group_peer, _portal, irecv, isend
from .collectives import Group
from ..group.work import Work

__all__ = ["P2POp", "batch_isend_irecv"]

_STARTERS = {"isend": isend, "irecv": irecv}


class P2POp:
    """One send or receive of a :func:`batch_isend_irecv` batch (any thread; nothing is sent yet).

    Args:
        op: ``isend`` or ``irecv`` (asyncdist's or torch.distributed's: the
            function is recognised by its name).
        tensor: the tensor or array to send, or to receive into.
        peer: the peer's global rank (or give ``group_peer``).
        group: the process group (default: the world).
        tag: matches the send with the receive.
        group_peer: the peer's rank within ``group``.

    Attributes:
        op, tensor, tag: as given.
        group: the group (the world for None).
        peer, group_peer: the peer's global rank and rank within ``group``
            (as given, when this rank is not in ``group``).

    Raises:
        InvalidArgumentError: ``op`` is not isend/irecv; neither or both of
            ``peer`` and ``group_peer``.
        InvalidRankError: ``peer`` is not in ``group``.
    """

    __slots__ = ("op", "tensor", "peer", "group", "tag", "group_peer", "_start")

    def __init__(
        self, op: Any, tensor: Any, peer: int | None = None, group: Group = None, tag: int = 0, group_peer: int | None = None
    ) -> None:
        start = _STARTERS.get(getattr(op, "__name__", ""))
        if start is None:
            raise InvalidArgumentError(f"P2POp's op must be isend or irecv, got {op!r}")
        g = _group(group)
        self.op, self.tensor, self.tag, self._start = op, tensor, tag, start
        self.group = g if group is None else group
        self.peer, self.group_peer = peer, group_peer
        if g.rank >= 0:
            if peer is None and group_peer is None:
                raise InvalidArgumentError("P2POp needs peer (a global rank) or group_peer (a rank within the group)")
            self.group_peer = _group_peer(g, peer, group_peer, "peer")
            self.peer = g.ranks[self.group_peer]  # type: ignore[index]

    def __repr__(self) -> str:
        return f"P2POp({self._start.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Start every send and receive of ``p2p_op_list``; return their Works.

    Any thread but asyncdist's loop thread (there it raises WrongThreadError).

    Args:
        p2p_op_list: :class:`P2POp` s, all on the same group. Their order
            does not matter for deadlock; ops between the same pair of ranks
            in the same direction match in list order.

    Returns:
        One Work per op, in list order (none for ops on a group this rank
        is not in). Wait for each before touching its tensor.

    Raises:
        InvalidArgumentError: not a non-empty list of P2POp, or mixed groups.
        InvalidRankError, PeerLostError: as for ``isend``/``irecv``.

    Example::

        right, left = (rank + 1) % size, (rank - 1) % size
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, right), dist.P2POp(dist.irecv, got, left)])
        for work in works:
            work.wait()
    """
    if not isinstance(p2p_op_list, list) or not p2p_op_list or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise InvalidArgumentError("p2p_op_list must be a non-empty list of P2POp")
    if any(p.group != p2p_op_list[0].group for p in p2p_op_list):
        raise InvalidArgumentError("all ops of a batch_isend_irecv must use the same group")
    g = _group(p2p_op_list[0].group)
    if g.rank < 0:
        return []
    starts = [(g.isend if p._start is isend else g.irecv, p.tensor, p.group_peer, p.tag) for p in p2p_op_list]

    def start_all() -> list[Work]:
        # One step of the loop: the NCCL path issues ops started together as one group call.
        return [start(tensor, peer, tag) for start, tensor, peer, tag in starts]

    return _portal().start(start_all, what="batch_isend_irecv()")
