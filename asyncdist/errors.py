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
"""

from __future__ import annotations

__all__ = [
    "AsyncDistError",
    "InvalidArgumentError",
    "InvalidRankError",
    "BufferMismatchError",
    "UnsupportedBufferError",
    "NotInitializedError",
    "AlreadyInitializedError",
    "WrongThreadError",
    "RendezvousError",
    "StoreError",
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
]


class AsyncDistError(RuntimeError):
    """Base class of every error raised by asyncdist.

    Attributes:
        relayed_from: the rank whose ABORT frame carried this error to this
            rank; None for an error raised here.
    """

    relayed_from: int | None = None


# -- the caller's mistakes -------------------------------------------------


class InvalidArgumentError(AsyncDistError, ValueError):
    """An argument is out of range or of the wrong kind (caught locally)."""


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


class StoreError(AsyncDistError):
    """A key-value store operation failed (connection refused, bad reply)."""


# -- time ------------------------------------------------------------------


class DistTimeoutError(AsyncDistError, TimeoutError):
    """An operation did not complete within its timeout.

    Also a builtin ``TimeoutError``, so ``except TimeoutError`` catches it.
    """


class StoreTimeoutError(DistTimeoutError, StoreError):
    """A store ``get``/``wait`` did not see its keys within the timeout."""


class OperationTimeoutError(DistTimeoutError):
    """A send, receive or collective did not complete within its timeout."""


class OperationCancelledError(AsyncDistError):
    """Another rank cancelled its part of a collective call this rank is in.

    The rank whose task was cancelled (``Task.cancel``, Ctrl-C) sees
    ``asyncio.CancelledError`` itself; the other members of the call get
    this error at once, instead of waiting for data that will not come.
    Never a timeout: nothing ran out of time.
    """


# -- the other side --------------------------------------------------------


class PeerLostError(AsyncDistError):
    """The connection to a peer closed or failed while an operation needed it.

    Attributes:
        rank: the global rank of the lost peer.
    """

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
        self.rank = rank

    def __reduce__(self):  # keep ``rank`` across pickling (spawned ranks)
        return (type(self), (self.args[0], self.rank))


class ProtocolError(AsyncDistError):
    """A peer sent bytes that break the wire protocol (the remote's fault)."""


class FrameTooLargeError(ProtocolError):
    """A header or payload length exceeds its limit; refused before allocation."""


class HandshakeError(ProtocolError):
    """A connection failed the handshake: wrong magic, version, job or secret."""


class CollectiveMismatchError(AsyncDistError):
    """Ranks disagree about an operation (kind, size, dtype, root or op)."""


class ClosedError(AsyncDistError):
    """The process group, engine or store was closed before or during the call."""


# -- the device --------------------------------------------------------------


class DeviceError(AsyncDistError):
    """The GPU library under an operation failed (CUDA, NCCL, torch.cuda, CuPy).

    The library's own exception is the ``__cause__``.
    """
