"""Point-to-point messages of a group: send, recv and their ``i*`` forms.

Messages use the group's p2p context with the user's tag, and match by
MPI's rules (:mod:`asyncdist.engine.matching`): between one pair, with one
tag, they never overtake each other. Ranks are group ranks; the engine is
given global ones.

Ordering with device tensors: a staged device send must first copy its
data off the device, which takes an unknown time, yet it keeps its place
in the stream to its peer. It queues a *turn* (:meth:`PointToPoint.queue_send`)
that later sends to the same peer wait behind; :mod:`.devices` ends the turn.

Loop thread only.
"""

from __future__ import annotations

import asyncio
import contextvars
from functools import partial
from typing import Any, Callable

from ..buffers.host import as_host_buffer
from ..engine.matching import PostedRecv
from ..engine.operation import Operation
from ..engine.progress import Progress
from ..errors import InvalidArgumentError
from ..flight.descriptions import describe_message
from .calls import Calls
from .work import Work, completed_future

__all__ = ["PointToPoint", "check_tag"]

_INT64 = 1 << 63
# Set in the task of a send whose turn has come: its own send must not queue again.
_MY_TURN: contextvars.ContextVar[bool] = contextvars.ContextVar("asyncdist_send_turn", default=False)


def check_tag(tag: object) -> int:
    """``tag`` if it is an int64.

    Raises:
        InvalidArgumentError: it is not.
    """
    if type(tag) is not int or not -_INT64 <= tag < _INT64:
        raise InvalidArgumentError(f"tag must be an int64, got {tag!r}")
    return tag


class PointToPoint:
    """The host point-to-point operations of one group.

    Args:
        calls: the group's contexts and deadlines.
    """

    def __init__(self, calls: Calls) -> None:
        self._calls = calls
        self._engine = calls.engine
        self._members = calls.members
        self._gates: dict[int, asyncio.Future] = {}  # dst -> the turn that later sends wait behind

    def isend(self, tensor: Any, dst: int, tag: int = 0) -> Work:
        """Start sending ``tensor`` to group rank ``dst``; see ProcessGroup.isend."""
        operation, future = self._start_send(tensor, dst, tag)
        sent = future or completed_future(asyncio.get_running_loop())  # recorded either way
        operation.follow(sent, (dst,), sending=True)
        operation.watch(sent)
        return self._work(sent, operation, tensor)

    async def send(self, tensor: Any, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to group rank ``dst``; see ProcessGroup.send."""
        operation, future = self._start_send(tensor, dst, tag)
        if future is not None:
            try:
                await operation.awaiting(future, None, (dst,), sending=True)
            except BaseException as error:
                operation.close(error, dump=False)
                raise
        operation.close()

    def irecv(self, tensor: Any, src: int | None = None, tag: int = 0) -> Work:
        """Start receiving into ``tensor``; see ProcessGroup.irecv."""
        operation, recv, sources = self._start_recv(tensor, src, tag)
        operation.follow(recv.future, sources, sending=False)
        future = _chain(recv.future, lambda header: self._members.group_rank(header.src))
        operation.watch(future, partial(self._engine.cancel_recv, recv))
        return self._work(future, operation, tensor)

    async def recv(self, tensor: Any, src: int | None = None, tag: int = 0) -> int:
        """Receive into ``tensor``; see ProcessGroup.recv."""
        operation, recv, sources = self._start_recv(tensor, src, tag)
        withdraw = partial(self._engine.cancel_recv, recv)
        try:
            header = await operation.awaiting(recv.future, withdraw, sources)
        except BaseException as error:
            if isinstance(error, asyncio.CancelledError):
                withdraw()  # a cancelled recv must not take a later message
            operation.close(error, dump=False)
            raise
        operation.close()
        return self._members.group_rank_of[header.src]  # a member's: the group's context carries no other

    def _start_send(self, tensor: Any, dst: int, tag: int) -> tuple[Operation, asyncio.Future | None]:
        """Open the message and send it: its future, None if it is in the kernel already."""
        peer = self._members.peer(dst, "dst")
        check_tag(tag)
        buf = as_host_buffer(tensor)
        calls, members = self._calls, self._members
        operation = Operation(self._engine, "p2p", calls.p2p_context, 0,
                              describe_message("send", dst, tag, members.name, buf.nbytes), members.name, members.ranks,
                              calls.timeout, (peer,), started=True)  # fmt: skip
        try:
            if not self._gates:  # no device send is copying: send now
                return operation, operation.send_payload(peer, tag, buf)
            return operation, self._send_in_order(dst, lambda: operation.send_payload(peer, tag, buf))
        except BaseException as error:
            operation.close(error, dump=False)
            raise

    def _start_recv(self, tensor: Any, src: int | None, tag: int) -> tuple[Operation, PostedRecv, tuple[int, ...]]:
        """Post the receive and open the message: also the group ranks it waits on."""
        if src is None:
            self._members.check_member()
            peer = None
        else:
            peer = self._members.peer(src, "src")
        check_tag(tag)
        buf = as_host_buffer(tensor, writable=True)
        recv = self._engine.post_recv(self._calls.p2p_context, peer, tag, buf, self._members.others)
        sources = (src,) if src is not None else self._members.sources(src)
        calls, members = self._calls, self._members
        operation = Operation(self._engine, "p2p", calls.p2p_context, 0,
                              describe_message("recv", src, tag, members.name, buf.nbytes), members.name, members.ranks,
                              calls.timeout, tuple(map(members.ranks.__getitem__, sources)), started=True)  # fmt: skip
        return operation, recv, sources

    def _work(self, future: asyncio.Future, operation: Operation, tensor: Any) -> Work:
        """The Work of a message started with an ``i*`` call: a timed-out ``wait``
        names its peer, as a collective's names the peers it waits on."""
        return Work(future, operation.where, [tensor], Progress(self._members.me, operation.where, [operation]))

    # -- turns: sends that wait for an earlier device send's copy ---------------------

    def queue_send(self, dst: int) -> tuple[asyncio.Future | None, asyncio.Future]:
        """Take the next turn to send to ``dst``: (the previous turn or None, this turn).

        Sends made meanwhile wait until :meth:`end_turn` ends this one.
        """
        previous = self._gates.get(dst)
        gate = asyncio.get_running_loop().create_future()
        self._gates[dst] = gate
        return previous, gate

    def end_turn(self, dst: int, gate: asyncio.Future) -> None:
        """End a turn from :meth:`queue_send`: the sends behind it may go."""
        if not gate.done():
            gate.set_result(None)
        if self._gates.get(dst) is gate:
            del self._gates[dst]

    @staticmethod
    def my_turn() -> None:
        """Mark the running task as the one whose turn it is (its sends do not queue)."""
        _MY_TURN.set(True)

    def _send_in_order(self, dst: int, send: Callable[[], asyncio.Future | None]) -> asyncio.Future | None:
        """Run ``send`` now, or after the device sends to ``dst`` still copying (so
        that no send overtakes an earlier one); returns its future."""
        if dst not in self._gates or _MY_TURN.get():
            return send()
        previous, gate = self.queue_send(dst)

        async def later() -> None:
            assert previous is not None
            await asyncio.wait([previous])
            _MY_TURN.set(True)
            try:
                sent = send()
            finally:
                self.end_turn(dst, gate)
            if sent is not None:
                await sent

        return _plain_future(asyncio.ensure_future(later()))


def _chain(source: asyncio.Future, convert: Callable[[Any], Any]) -> asyncio.Future:
    """A future that completes with ``convert(source.result())`` or source's error."""
    target = source.get_loop().create_future()

    def transfer(done: asyncio.Future) -> None:
        if target.done():
            return
        if done.cancelled():
            target.cancel()
            return
        error = done.exception()
        if error is not None:
            target.set_exception(error)
        else:
            target.set_result(convert(done.result()))

    source.add_done_callback(transfer)
    return target


def _plain_future(task: asyncio.Task) -> asyncio.Future:
    """A future that a timeout may fail (a Task refuses set_exception), following ``task``."""
    future = task.get_loop().create_future()

    def transfer(done: asyncio.Task) -> None:
        if future.done():
            return
        if done.cancelled():
            future.cancel()
            return
        error = done.exception()
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(None)

    task.add_done_callback(transfer)
    future.add_done_callback(lambda f: task.cancel() if f.cancelled() or f.exception() else None)
    return future
