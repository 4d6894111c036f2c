"""The blocking facade's point-to-point calls: send, recv, their ``i*`` forms, and batches.

Peers are global ranks (``src``, ``dst``, ``peer``) or ranks within the
group (``group_src``, ``group_dst``, ``group_peer``), as torch takes them;
the group translates them (:meth:`~asyncdist.group.members.Members.named`).
A rank that is not in ``group`` returns at once (None, or -1 from ``recv``).

A batch (:func:`batch_isend_irecv`) is a list of sends and receives started
together. In asyncdist every ``isend``/``irecv`` is already non-blocking and
matched by (source, tag, order), so a batch is simply each op started in
turn, all in one step of the loop: the order of sends and receives in the
list cannot deadlock, operations between the same pair in the same
direction match in list order, as torch documents, and on a group whose CUDA
tensors go through NCCL the batch is one NCCL group call, as in torch.

Thread affinity: any thread but asyncdist's loop thread.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgumentError
from ..group.work import Work
from .._profiling import profiled
from .lifecycle import Group, _group, _member, _portal

__all__ = ["send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv"]


def isend(
    tensor: Any, dst: int | None = None, group: Group = None, tag: int = 0, group_dst: int | None = None
) -> Work | None:
    """Start sending ``tensor`` to ``dst``; returns a Work (None if this rank is not in ``group``).

    Do not modify ``tensor`` before ``work.wait()`` returns.

    Args:
        tensor: a contiguous torch CPU tensor or NumPy array, any dtype.
        dst: the destination's global rank (or give ``group_dst``).
        group: the process group (default: the world).
        tag: matches the receive's tag.
        group_dst: the destination's rank within ``group``.
    """
    g = _member(group)
    if g is None:
        return None
    peer = g.members.root(dst, group_dst, "dst")
    return profiled("isend", (tensor,), _portal().start, g.isend, tensor, peer, tag, what="isend()")


def irecv(
    tensor: Any, src: int | None = None, group: Group = None, tag: int = 0, group_src: int | None = None
) -> Work | None:
    """Start receiving into ``tensor`` from ``src`` (any rank if None); returns a Work
    (None if this rank is not in ``group``)."""
    g = _member(group)
    if g is None:
        return None
    peer = g.members.named(src, group_src, "src")
    event = "irecv" if peer is not None else "recvAnySource"  # torch's name for a receive from any rank
    return profiled(event, (tensor,), _portal().start, g.irecv, tensor, peer, tag, what="irecv()")


def send(
    tensor: Any, dst: int | None = None, group: Group = None, tag: int = 0, group_dst: int | None = None
) -> None:
    """Send ``tensor`` to ``dst`` and return once ``tensor`` may be modified again.

    Args:
        tensor: a contiguous torch CPU tensor or NumPy array, any dtype.
        dst: the destination's global rank (or give ``group_dst``).
        group: the process group (default: the world).
        tag: matches the receive's tag.
        group_dst: the destination's rank within ``group``.

    Raises:
        InvalidRankError: ``dst`` is out of range or this rank.
        UnsupportedBufferError: ``tensor`` is not contiguous or not on the CPU.
        PeerLostError: the destination is gone.
        OperationTimeoutError: not sent within the group's timeout.

    Example::

        tensor = torch.ones(4)
        dist.send(tensor, dst=1)
    """
    g = _member(group)
    if g is not None:  # one round trip to the loop thread
        profiled("send", (tensor,), _portal().run, g.send(tensor, g.members.root(dst, group_dst, "dst"), tag),
                 what="send()")


def recv(
    tensor: Any, src: int | None = None, group: Group = None, tag: int = 0, group_src: int | None = None
) -> int:
    """Receive into ``tensor`` (in place) from ``src``, or from any rank if ``src`` is None.

    Args:
        tensor: the receive buffer; the message must have its dtype and
            element count.
        src: the sender's global rank (or give ``group_src``; None: any rank).
        group: the process group (default: the world).
        tag: matches the send's tag.
        group_src: the sender's rank within ``group``.

    Returns:
        the sender's global rank (-1 if this rank is not in ``group``).

    Raises:
        BufferMismatchError: the message's dtype or size differs from ``tensor``'s.
        PeerLostError, OperationTimeoutError: as for :func:`send`.

    Example::

        tensor = torch.zeros(4)
        sender = dist.recv(tensor)   # from whoever sends first
    """
    g = _member(group)
    if g is None:
        return -1
    peer = g.members.named(src, group_src, "src")
    event = "recv" if peer is not None else "recvAnySource"  # torch's name for a receive from any rank
    sender = profiled(event, (tensor,), _portal().run, g.recv(tensor, peer, tag), what="recv()")
    return g.ranks[sender]


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
        g = _member(group)
        self.op, self.tensor, self.tag, self._start = op, tensor, tag, start
        self.group = _group(group) if group is None else group
        self.peer, self.group_peer = peer, group_peer
        if g is not None:
            if peer is None and group_peer is None:
                raise InvalidArgumentError("P2POp needs peer (a global rank) or group_peer (a rank within the group)")
            self.group_peer = g.members.root(peer, group_peer, "peer")
            self.peer = g.ranks[self.group_peer]

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
    g = _member(p2p_op_list[0].group)
    if g is None:
        return []
    starts = []
    for p in p2p_op_list:
        assert p.group_peer is not None  # resolved when the op was made, on a member
        starts.append((g.isend if p._start is isend else g.irecv, p.tensor, p.group_peer, p.tag))

    def start_all() -> list[Work]:
        # One step of the loop: the NCCL path issues ops started together as one group call.
        return [start(tensor, peer, tag) for start, tensor, peer, tag in starts]

    tensors = [p.tensor for p in p2p_op_list]
    return profiled("batch_isend_irecv", tensors, _portal().start, start_all, what="batch_isend_irecv()")
