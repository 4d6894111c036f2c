"""What the device paths use of a group and of a store: the seams gpu/ defines.

gpu/ sits below group/ (``docs/architecture.md``), so pinned staging and NCCL
may not import :class:`~asyncdist.group.process_group.ProcessGroup`. They see
a group through the Protocols here, which ProcessGroup satisfies without
naming them (mypy checks it where group/ passes a group in: ``group/devices.py``
for staging, ``facade/lifecycle.py`` for NCCL), and a test may pass a fake.

* :class:`StagingGroup`: what :func:`~.pinned_staging.run_staged` reads (the
  group's rank and name), where it opens its device operation, and the call
  numbers it reserves.
* :class:`NcclGroup`: what :class:`~.nccl.NcclBackend` reads, besides: the
  group's size, its collective context (the key of its unique id), the
  check of a peer argument, its close hook and its store.
* :class:`DeviceWait`: a device operation's deadline and timeout error (an
  :class:`~asyncdist.engine.operation.Operation` of kind "device"), which
  every wait for the device is bounded by; both groups open one per operation.
* :class:`IdStore`: the two store calls the NCCL unique id travels through;
  every :class:`~asyncdist.rendezvous.store.Store` has them.

Nothing here runs: these are types only.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Protocol

__all__ = ["CallNumbers", "DeviceCalls", "DeviceWait", "IdStore", "NcclGroup", "StagingGroup"]


class IdStore(Protocol):
    """A key-value store, as far as the NCCL unique id needs one (blocking; any thread)."""

    def set(self, key: str, value: str | bytes) -> None: ...

    def get(self, key: str) -> bytes: ...


class CallNumbers(Protocol):
    """Collective call numbers taken now, for calls that open their channels later
    (:class:`~asyncdist.group.calls.CallReservation`)."""

    def active(self) -> AbstractContextManager[None]:
        """Within this block, the running task's channels take the reserved numbers."""
        ...

    def abandon(self, error: BaseException) -> None:
        """Fail the numbers not used yet, on every member, with ``error``."""
        ...


class DeviceWait(Protocol):
    """A device operation's deadline (an :class:`~asyncdist.engine.operation.Operation`)."""

    @property
    def deadline(self) -> float:
        """When its waits give up (loop time)."""
        ...

    def timeout_error(self) -> Exception:
        """The error of a wait that reached the deadline, naming the operation."""
        ...


class StagingGroup(Protocol):
    """A group, as pinned staging sees it."""

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        ...

    @property
    def name(self) -> str:
        """The group's name, for error messages."""
        ...

    @property
    def calls(self) -> DeviceCalls:
        """Its calls: where a device operation is opened."""
        ...

    def reserve_calls(self, count: int) -> CallNumbers:
        """Number this rank's next ``count`` collective calls of the group now."""
        ...


class DeviceCalls(Protocol):
    """A group's calls, as far as a device operation needs them."""

    def device_operation(self, op: str, what: str) -> DeviceWait:
        """Open a device operation ``op`` ("all_reduce", "send"), named ``what`` in
        messages; its deadline is the group's timeout from now."""
        ...


class _Contexts(DeviceCalls, Protocol):
    @property
    def collective_context(self) -> int: ...


class _Members(Protocol):
    def peer(self, rank: object, what: str) -> int: ...


class NcclGroup(Protocol):
    """A group, as its NCCL backend sees it."""

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        ...

    @property
    def size(self) -> int:
        """The number of members."""
        ...

    @property
    def name(self) -> str:
        """The group's name, for error messages."""
        ...

    @property
    def calls(self) -> _Contexts:
        """Its calls: the engine context of its collective calls (the same on every
        member), and where a device operation is opened."""
        ...

    @property
    def members(self) -> _Members:
        """Its membership: ``peer(rank, "dst" | "src")`` checks a point-to-point peer argument."""
        ...

    @property
    def store(self) -> IdStore | None:
        """The store the members share, or None."""
        ...

    def on_close(self, closer: Callable[[], Any]) -> None:
        """Run ``closer`` when the group closes."""
        ...
