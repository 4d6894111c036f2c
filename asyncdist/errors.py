"""The exceptions asyncdist raises, in one hierarchy.

Every error a user can see is an :class:`AsyncDistError`, which is a
``RuntimeError`` as torch.distributed's own errors are, so that code written
against torch (``except RuntimeError``) keeps working. Errors are split by
blame, as h11 does: the caller's mistake (:class:`InvalidArgumentError`, a
``ValueError`` too), the other side's mistake (:class:`ProtocolError`), the
environment (:class:`PeerLostError`, :class:`DistTimeoutError`).

Messages name what went wrong and where: the rank, the group, the operation,
the peer. Lower-layer exceptions (OSError, msgpack's) are translated into
these at the layer boundary with ``raise ... from exc``; nothing below the
facade lets a bare OSError escape.

torch's own error classes, when torch is there
----------------------------------------------

torch.distributed raises ``DistError`` and its subclasses
(``DistNetworkError``, ``DistStoreError``, ``DistBackendError``,
``QueueEmptyError``), and code written for it catches them. Here those five
names are asyncdist's classes, at the root of the hierarchy: a lost peer is a
``DistNetworkError``, a store failure a ``DistStoreError``, a failed or timed
out collective a ``DistBackendError``, and every asyncdist error a
``DistError``. Once torch is imported, :func:`adopt_torch_bases` makes each
of the five a subclass of torch's class of the same name, so that
``except torch.distributed.DistNetworkError`` catches asyncdist's
:class:`PeerLostError`.

torch costs about 0.7 s to import against asyncdist's 0.17 s (measured on
the CI image), so this module never imports it. Classes cannot be recreated
once other modules hold them, so the adoption rewrites ``__bases__`` of the
five instead, which CPython allows only between bases of one memory layout:
torch's classes add a ``__weakref__`` slot to ``RuntimeError``, and so does
:class:`_Root`, the base the five stand on until then. Who calls
:func:`adopt_torch_bases`: this module at its import, if torch is imported
already; the ``torch.backends`` entry point (``asyncdist_torch_hook``) when
torch is imported later; and :func:`asyncdist._torch.torch_or_none`, for an
installation without that entry point.
"""

from __future__ import annotations

import sys
from types import ModuleType

__all__ = [
    "DistError",
    "DistBackendError",
    "DistNetworkError",
    "DistStoreError",
    "QueueEmptyError",
    "adopt_torch_bases",
    "AsyncDistError",
    "InvalidArgumentError",
    "ConfigurationError",
    "InvalidRankError",
    "BufferMismatchError",
    "UnsupportedBufferError",
    "NotInitializedError",
    "AlreadyInitializedError",
    "WrongThreadError",
    "RendezvousError",
    "JoinClosedError",
    "StoreError",
    "StoreLostError",
    "DistTimeoutError",
    "StoreTimeoutError",
    "OperationTimeoutError",
    "OperationCancelledError",
    "PeerLostError",
    "ProtocolError",
    "FrameTooLargeError",
    "HandshakeError",
    "CollectiveMismatchError",
    "ClosedError",
    "DeviceError",
    "GroupRevokedError",
    "RankExcludedError",
]


class _Root(RuntimeError):
    """``RuntimeError`` with torch's errors' memory layout (a ``__weakref__``
    slot, which a Python subclass adds), so that :func:`adopt_torch_bases`
    may put torch's ``DistError`` in its place."""


class DistError(_Root):
    """torch.distributed's ``DistError``: the base of every distributed error.

    A subclass of ``torch.distributed.DistError`` once torch is imported.
    """


class DistBackendError(DistError):
    """torch.distributed's ``DistBackendError``: a collective or message failed in the backend."""


class DistNetworkError(DistError):
    """torch.distributed's ``DistNetworkError``: a peer or the network failed."""


class DistStoreError(DistError):
    """torch.distributed's ``DistStoreError``: the key-value store failed."""


class QueueEmptyError(DistStoreError):
    """torch.distributed's ``QueueEmptyError``: a store queue was empty (torch's name; asyncdist
    raises it nowhere, it exists for ``except`` clauses written for torch)."""


_TORCH_NAMES = {  # asyncdist's class -> the name of torch's in torch._C
    DistError: "_DistError",
    DistBackendError: "_DistBackendError",
    DistNetworkError: "_DistNetworkError",
    DistStoreError: "_DistStoreError",
    QueueEmptyError: "_DistQueueEmptyError",
}


def adopt_torch_bases(torch: ModuleType) -> bool:
    """Make each torch-named class here a subclass of torch's own (idempotent, any thread).

    Args:
        torch: the ``torch`` module, imported (far enough to have ``torch._C``).

    Returns:
        True if torch's classes are now bases; False if this torch has none
        (a build without distributed support).
    """
    found = {ours: getattr(getattr(torch, "_C", None), name, None) for ours, name in _TORCH_NAMES.items()}
    torch_classes = {ours: theirs for ours, theirs in found.items() if isinstance(theirs, type)}
    if len(torch_classes) < len(found):
        return False
    for ours, theirs in torch_classes.items():
        if theirs in ours.__mro__:
            continue
        # The class's own asyncdist base first, then torch's: one consistent
        # MRO (asyncdist's class, then torch's, then RuntimeError).
        own = tuple(base for base in ours.__bases__ if base is not _Root)
        ours.__bases__ = (*own, theirs)
    return True


class AsyncDistError(DistError):
    """Base class of every error raised by asyncdist.

    Attributes:
        relayed_from: the rank whose ABORT frame carried this error to this
            rank; None for an error raised here.
    """

    relayed_from: int | None = None


# -- the caller's mistakes -------------------------------------------------


class InvalidArgumentError(AsyncDistError, ValueError):
    """An argument is out of range or of the wrong kind (caught locally)."""


class ConfigurationError(InvalidArgumentError):
    """An environment variable has a value asyncdist cannot use; the message
    names the variable, the value and what it must be (:mod:`asyncdist.settings`)."""


class InvalidRankError(InvalidArgumentError):
    """A rank is negative, not below the world or group size, or not a member."""


class BufferMismatchError(InvalidArgumentError):
    """A buffer does not fit the message: wrong element count or dtype.

    Raised on the receiving rank; the message names what the sender sent and
    what the receiver offered.
    """


class UnsupportedBufferError(InvalidArgumentError):
    """The object cannot be sent or received as it is (type, device, layout).

    Non-contiguous tensors raise this with torch's own words, "Tensors must be
    contiguous", since torch.distributed's gloo backend refuses them too.
    """


class NotInitializedError(AsyncDistError, ValueError):
    """The default process group has not been initialized.

    A ``ValueError`` too, as torch.distributed raises one in this case.
    """


class AlreadyInitializedError(AsyncDistError):
    """``init_process_group`` was called twice without ``destroy_process_group``."""


class WrongThreadError(AsyncDistError):
    """A blocking call was made on the event loop's own thread.

    Blocking there would deadlock: the loop that must complete the operation
    would be the one waiting for it. Use the await API inside coroutines.
    """


# -- rendezvous and stores -------------------------------------------------


class RendezvousError(AsyncDistError):
    """Ranks could not agree on the job: duplicate ranks, size mismatch, bad env."""


class JoinClosedError(RendezvousError):
    """A process waiting to join a running job (``ASYNCDIST_JOIN=1``,
    ``init_world(join=True)``) will never be admitted: the job ended first.

    Its launcher says so once no rank of the job is left to call ``grow()``
    (``asyncdist-run --replace``); the message names the process and why.
    """


class StoreError(AsyncDistError, DistStoreError):
    """A key-value store operation failed (connection refused, bad reply)."""


class StoreLostError(StoreError):
    """The connection to the store was lost before the reply came: its server
    closed it or stopped (as the last generation's store on a port does)."""


# -- time ------------------------------------------------------------------


class DistTimeoutError(AsyncDistError, TimeoutError):
    """An operation did not complete within its timeout.

    Also a builtin ``TimeoutError``, so ``except TimeoutError`` catches it.
    """


class StoreTimeoutError(DistTimeoutError, StoreError):
    """A store ``get``/``wait`` did not see its keys within the timeout."""


class OperationTimeoutError(DistTimeoutError, DistBackendError):
    """A send, receive or collective did not complete within its timeout."""


class OperationCancelledError(AsyncDistError, DistBackendError):
    """Another rank cancelled its part of a collective call this rank is in.

    The rank whose task was cancelled (``Task.cancel``, Ctrl-C) sees
    ``asyncio.CancelledError`` itself; the other members of the call get
    this error at once, instead of waiting for data that will not come.
    Never a timeout: nothing ran out of time. It is also the error of the
    torch future of an operation cancelled on this rank
    (:meth:`asyncdist.group.work.Work.get_future`), since torch's futures
    take no ``asyncio.CancelledError``.
    """


# -- the other side --------------------------------------------------------


class PeerLostError(AsyncDistError, DistNetworkError):
    """The connection to a peer closed or failed while an operation needed it.

    Attributes:
        rank: the global rank of the lost peer.
    """

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
        self.rank = rank

    def __reduce__(self):  # keep ``rank`` across pickling (spawned ranks)
        return (type(self), (self.args[0], self.rank))


class ProtocolError(AsyncDistError, DistNetworkError):
    """A peer sent bytes that break the wire protocol (the remote's fault)."""


class FrameTooLargeError(ProtocolError):
    """A header or payload length exceeds its limit; refused before allocation."""


class HandshakeError(ProtocolError):
    """A connection failed the handshake: wrong magic, version, job or secret."""


class CollectiveMismatchError(AsyncDistError, DistBackendError):
    """Ranks disagree about an operation (kind, size, dtype, root or op)."""


class GroupRevokedError(AsyncDistError, DistBackendError):
    """The group was revoked (``await group.revoke()`` on some member): every
    pending and later operation on it fails; ``agree`` and ``shrink`` still work.

    Attributes:
        rank: the global rank that began the revoke.
    """

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
        self.rank = rank

    def __reduce__(self):  # keep ``rank`` across pickling (spawned ranks)
        return (type(self), (self.args[0], self.rank))


class RankExcludedError(AsyncDistError, DistNetworkError):
    """This process was declared lost by the others (it was silent past the
    heartbeat timeout, or an agreement counted it as failed) and is no longer
    part of the job: fail-stop is enforced, so it must not go on as if it were."""


class ClosedError(AsyncDistError, DistBackendError):
    """The process group, engine or store was closed before or during the call."""


# -- the device --------------------------------------------------------------


class DeviceError(AsyncDistError, DistBackendError):
    """The GPU library under an operation failed (CUDA, NCCL, torch.cuda, CuPy).

    The library's own exception is the ``__cause__``.
    """


if "torch" in sys.modules:  # imported already: adopting its classes costs nothing
    adopt_torch_bases(sys.modules["torch"])
