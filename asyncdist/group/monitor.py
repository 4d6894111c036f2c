"""``monitored_barrier``: a barrier that names the ranks that did not come (await API).

Like torch.distributed's (gloo) monitored barrier, it is a star, not a
dissemination barrier, because its purpose is diagnosis: group rank 0 hears
from every other rank, so it knows exactly who is missing.

* Every rank other than 0 sends an arrival message to rank 0, then waits for
  rank 0's verdict: a uint8 flag per rank, set for the ranks that failed.
* Rank 0 waits for the arrivals until its timeout (with ``wait_all_ranks``
  for all of them; without it, it stops at the first rank that is lost), then
  sends the verdict to every other rank and raises
  :class:`~asyncdist.errors.OperationTimeoutError` naming the failed ranks,
  all of them with ``wait_all_ranks``, else the first. The ranks that arrived
  raise too, naming the same ranks; with no failure everyone returns.

The verdict also goes to the missing ranks: a late rank then fails at once
(its monitored_barrier reads the verdict; any other collective of the same
call number reports the mismatch) instead of waiting out its own timeout.

A rank other than 0 waits twice the timeout for the verdict: rank 0 may enter
up to one timeout after it and then wait one timeout itself. Loop thread only.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import numpy as np

from ..buffers.host import as_host_buffer
from ..engine.channel import Channel
from ..engine.operation import wait_until
from ..errors import AsyncDistError, OperationTimeoutError
from ..timeouts import as_seconds
from .calls import Calls

__all__ = ["Monitor"]


class Monitor:
    """``monitored_barrier`` of one group.

    Args:
        calls: the group's numbering and timeouts.
    """

    def __init__(self, calls: Calls) -> None:
        self._calls = calls
        self._members = calls.members
        self.rank = calls.members.rank
        self.size = calls.members.size
        self.ranks = calls.members.ranks
        self.name = calls.members.name

    async def monitored_barrier(self, timeout: timedelta | float | None = None, wait_all_ranks: bool = False) -> None:
        """Return once every member has entered; otherwise fail, naming who did not.

        Args:
            timeout: seconds or a ``timedelta`` that group rank 0 waits for
                the others (None: the group's timeout).
            wait_all_ranks: name every rank that failed, not only the first.

        Raises:
            OperationTimeoutError: on every rank that entered, when some rank
                did not enter in time (or was lost); the message names it.
            InvalidArgumentError: ``timeout`` is not positive.
        """
        seconds = as_seconds(timeout, default=self._calls.timeout, what="monitored_barrier: timeout")
        channel = self._calls.channel("monitored_barrier")
        # run(): a failure marks the call failed here, so late arrivals are
        # dropped, not taken for a later call's. No ABORT: the verdict tells
        # every rank, the late ones included.
        if self.rank == 0:
            await channel.run(self._monitor(channel, seconds, wait_all_ranks), relay=False)
        else:
            await channel.run(self._check_in(channel, seconds), relay=False)

    async def _monitor(self, channel: Channel, seconds: float, wait_all_ranks: bool) -> None:
        arrivals = {peer: channel.start_recv(_flags(1), peer) for peer in range(1, self.size)}
        futures = {recv.future: peer for peer, recv in arrivals.items()}
        done: set = set()
        if futures:
            done, _ = await asyncio.wait(
                futures, timeout=seconds, return_when=asyncio.ALL_COMPLETED if wait_all_ranks else asyncio.FIRST_EXCEPTION
            )
        lost = {futures[f]: f.exception() for f in done if f.exception() is not None}
        late = sorted(peer for peer, recv in arrivals.items() if not recv.future.done())
        for peer in late:
            channel.withdraw(arrivals[peer])
        failed = sorted(set(lost) | set(late))
        if failed and not wait_all_ranks:
            failed = [min(lost)] if lost else failed[:1]
        verdict = np.zeros(self.size, np.uint8)
        verdict[failed] = 1
        sends = []
        for peer in range(1, self.size):
            try:
                sends.append((peer, channel.start_send(as_host_buffer(verdict), peer)))
            except AsyncDistError:
                if peer not in failed:
                    raise
        for peer, sending in sends:
            try:
                await channel.wait_send(sending, peer)
            except AsyncDistError:
                if not failed:
                    raise
        if failed:
            cause = next((lost[p] for p in failed if p in lost), None)
            error = OperationTimeoutError(
                f"rank {self.ranks[0]}: monitored_barrier of group {self.name!r}: {self._members.who(failed)} "
                f"failed to pass it within {seconds:g} s" + (f" ({cause})" if cause else "")
            )
            raise error from cause

    async def _check_in(self, channel: Channel, seconds: float) -> None:
        verdict = np.zeros(self.size, np.uint8)
        recv = channel.start_recv(as_host_buffer(verdict, writable=True), 0)
        try:
            await channel.send(_flags(1), 0)
        except AsyncDistError:
            # A late rank may find rank 0 gone but its verdict already here.
            future = recv.future
            if not (future.done() and not future.cancelled() and future.exception() is None):
                channel.withdraw(recv)
                raise
        me = self.ranks[self.rank]

        def no_verdict() -> Exception:
            return OperationTimeoutError(
                f"rank {me}: monitored_barrier of group {self.name!r}: Timed out after {2 * seconds:g} s "
                "waiting for group rank 0's verdict"
            )

        deadline = asyncio.get_running_loop().time() + 2 * seconds
        await wait_until(recv.future, deadline, no_verdict, lambda: channel.withdraw(recv))
        failed = np.flatnonzero(verdict).tolist()
        if failed:
            raise OperationTimeoutError(
                f"rank {me}: monitored_barrier of group {self.name!r}: group rank 0 reports that "
                f"{self._members.who(failed)} failed to pass it in time"
            )


def _flags(n: int):
    return as_host_buffer(np.ones(n, np.uint8), writable=True)
