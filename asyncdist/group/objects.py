"""The object collectives of a group (await API), over its tensor operations.

``broadcast_object_list``, ``all_gather_object``, ``gather_object``,
``scatter_object_list``, ``send_object_list`` and ``recv_object_list`` move
picklable Python objects, as torch.distributed's functions of those names do:
each object is pickled into a uint8 NumPy array, the sizes travel first (as
int64) so that receivers can allocate, then the payloads, padded to the
largest where the collective needs equal sizes. Everything moves through the
group's own collectives and point-to-point methods, so the ordering and
mismatch rules of those apply unchanged.

Security: unpickling runs code chosen by the sender. These methods unpickle
only what arrives over the group's connections, and every peer on those passed
the authenticated handshake (the job's secret, see ``handshake.py``); nothing
else can inject a payload. This module is the only place asyncdist pickles.

Each of these makes two or three collective (or p2p) calls of the group one
after the other, so do not run another collective of the same group
concurrently with one (``asyncio.gather``): await it first. The blocking
facade's object collectives always do. Ranks are group ranks; loop thread only.
"""

from __future__ import annotations

import pickle
from typing import Any, Protocol, Sequence

import numpy as np

from ..errors import InvalidArgumentError

__all__ = ["ObjectCollectives", "TensorOps"]


def _pickled(obj: Any) -> np.ndarray:
    """``obj`` pickled into a new writable uint8 array."""
    return np.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), np.uint8)


def _unpickled(payload: np.ndarray, size: int) -> Any:
    return pickle.loads(payload[:size].data)


def _padded(payloads: Sequence[np.ndarray], width: int) -> list[np.ndarray]:
    """Each payload copied into a zeroed array of ``width`` bytes."""
    out = []
    for payload in payloads:
        slot = np.zeros(width, np.uint8)
        slot[: payload.size] = payload
        out.append(slot)
    return out


def _unpickle_all(payload: np.ndarray, sizes: np.ndarray, out: list) -> None:
    """Fill ``out[i]`` with the i-th object of the concatenated ``payload``."""
    offset = 0
    for i, size in enumerate(sizes.tolist()):
        out[i] = _unpickled(payload[offset:], size)
        offset += size


class TensorOps(Protocol):
    """The group's tensor operations that the object collectives move bytes with."""

    rank: int
    size: int

    async def broadcast(self, tensor: Any, src: int) -> None: ...
    async def all_gather_into_tensor(self, output_tensor: Any, input_tensor: Any) -> None: ...
    async def gather(self, tensor: Any, gather_list: Sequence[Any] | None = None, dst: int = 0) -> None: ...
    async def scatter(self, tensor: Any, scatter_list: Sequence[Any] | None = None, src: int = 0) -> None: ...
    async def send(self, tensor: Any, dst: int, tag: int = 0) -> None: ...
    async def recv(self, tensor: Any, src: int | None = None, tag: int = 0) -> int: ...


class ObjectCollectives:
    """The object collectives of one group.

    Args:
        tensors: the group's public tensor operations (the ProcessGroup).
    """

    def __init__(self, tensors: TensorOps) -> None:
        self._tensors = tensors
        self.rank = tensors.rank
        self.size = tensors.size

    async def broadcast_object_list(self, object_list: list, src: int = 0) -> None:
        """Replace every rank's ``object_list`` items with group rank ``src``'s (in place).

        Every rank passes a list of the same length; on ranks other than
        ``src`` its items are placeholders.

        Raises:
            InvalidArgumentError: ``src`` is not a rank of the group.
            CollectiveMismatchError: the lists' lengths differ between ranks.
        """
        sizes = np.zeros(len(object_list), np.int64)
        payload = None
        if self.rank == src:
            pickled = [_pickled(obj) for obj in object_list]
            sizes[:] = [p.size for p in pickled]
            payload = np.concatenate(pickled) if pickled else np.zeros(0, np.uint8)
        await self._tensors.broadcast(sizes, src)
        if payload is None:
            payload = np.empty(int(sizes.sum()), np.uint8)
        await self._tensors.broadcast(payload, src)
        if self.rank != src:
            _unpickle_all(payload, sizes, object_list)

    async def all_gather_object(self, object_list: list, obj: Any) -> None:
        """Every rank's ``obj`` lands in every rank's ``object_list[rank]``.

        Raises:
            InvalidArgumentError: ``object_list`` does not have one item per rank.
        """
        self._object_slots(object_list, "object_list")
        slots = await self._gather_pickled(obj, None)
        assert slots is not None
        object_list[:] = slots

    async def gather_object(self, obj: Any, object_gather_list: list | None = None, dst: int = 0) -> None:
        """Every rank's ``obj`` lands in ``object_gather_list[rank]`` on group rank ``dst``.

        Raises:
            InvalidArgumentError: on ``dst``, ``object_gather_list`` does not
                have one item per rank; elsewhere it is not None or empty.
        """
        if self.rank == dst:
            self._object_slots(object_gather_list, "object_gather_list")
        elif object_gather_list:
            raise InvalidArgumentError(f"object_gather_list must be None or empty on ranks other than dst={dst}")
        slots = await self._gather_pickled(obj, dst)
        if slots is not None and object_gather_list is not None:
            object_gather_list[:] = slots

    async def _gather_pickled(self, obj: Any, dst: int | None) -> list | None:
        """Every rank's ``obj`` unpickled at ``dst``, or everywhere when ``dst`` is None."""
        mine = _pickled(obj)
        sizes = np.zeros(self.size, np.int64)
        await self._tensors.all_gather_into_tensor(sizes, np.array([mine.size], np.int64))
        width = int(sizes.max())
        (mine,) = _padded([mine], width)
        if dst is None:
            whole = np.empty(width * self.size, np.uint8)
            await self._tensors.all_gather_into_tensor(whole, mine)
            slots = np.split(whole, self.size)
        elif self.rank == dst:
            slots = [np.empty(width, np.uint8) for _ in range(self.size)]
            await self._tensors.gather(mine, slots, dst)
        else:
            await self._tensors.gather(mine, None, dst)
            return None
        return [_unpickled(slot, size) for slot, size in zip(slots, sizes.tolist())]

    async def scatter_object_list(
        self, scatter_object_output_list: list, scatter_object_input_list: Sequence[Any] | None = None, src: int = 0
    ) -> None:
        """Group rank ``src``'s ``scatter_object_input_list[rank]`` lands in every
        rank's ``scatter_object_output_list[0]``.

        Raises:
            InvalidArgumentError: the output list is empty, or on ``src`` the
                input list does not have one item per rank.
        """
        if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
            raise InvalidArgumentError("scatter_object_output_list must be a list of at least one item")
        sizes = np.zeros(self.size, np.int64)
        pieces = None
        if self.rank == src:
            pickled = [_pickled(obj) for obj in self._object_slots(scatter_object_input_list, "scatter_object_input_list")]
            sizes[:] = [p.size for p in pickled]
            pieces = _padded(pickled, int(sizes.max()))
        await self._tensors.broadcast(sizes, src)
        mine = np.empty(int(sizes.max()), np.uint8)
        await self._tensors.scatter(mine, pieces, src)
        scatter_object_output_list[0] = _unpickled(mine, int(sizes[self.rank]))

    async def send_object_list(self, object_list: Sequence[Any], dst: int) -> None:
        """Send the objects of ``object_list`` to group rank ``dst``.

        ``dst`` receives them with :meth:`recv_object_list` into a list of the
        same length.

        Raises:
            InvalidRankError, PeerLostError, OperationTimeoutError: as for ``send``.
        """
        pickled = [_pickled(obj) for obj in object_list]
        await self._tensors.send(np.array([p.size for p in pickled], np.int64), dst)
        await self._tensors.send(np.concatenate(pickled) if pickled else np.zeros(0, np.uint8), dst)

    async def recv_object_list(self, object_list: list, src: int | None = None) -> int:
        """Receive objects sent with :meth:`send_object_list` into ``object_list`` (in place).

        Args:
            object_list: a list as long as the sender's; its items are replaced.
            src: the sender's group rank; None receives from any rank.

        Returns:
            The sender's group rank.

        Raises:
            BufferMismatchError: the sender's list has another length.
            PeerLostError, OperationTimeoutError: as for ``recv``.
        """
        sizes = np.zeros(len(object_list), np.int64)
        sender = await self._tensors.recv(sizes, src)
        payload = np.empty(int(sizes.sum()), np.uint8)
        await self._tensors.recv(payload, sender)
        _unpickle_all(payload, sizes, object_list)
        return sender

    def _object_slots(self, objects: Any, what: str) -> list:
        if not isinstance(objects, (list, tuple)) or len(objects) != self.size:
            got = len(objects) if isinstance(objects, (list, tuple)) else type(objects).__name__
            raise InvalidArgumentError(f"{what} must be a list of {self.size} items (one per rank), got {got}")
        return list(objects)
