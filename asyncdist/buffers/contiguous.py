"""Contiguous stand-ins for non-contiguous arrays in collectives.

torch.distributed's gloo backend accepts non-contiguous tensors in most
collectives (not in send/recv or ``all_to_all_single``) and handles them by
copying. :func:`staged` gives the collective a contiguous buffer and, for
outputs, a function that copies the result back into the user's object.
Contiguous objects (the common case) pass through without a copy.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .._torch import is_torch_tensor, torch_or_none
from .host import HostBuffer, as_host_buffer, torch_layout_problem
from ..errors import UnsupportedBufferError

__all__ = ["staged", "Writeback", "NO_WRITE_BACK"]

Writeback = Callable[[], None]


#: The write-back of a buffer used in place (or of a scratch buffer): NoneType()
#: returns None, a no-op that is a C call (every collective calls its write-back).
NO_WRITE_BACK: Writeback = type(None)


def _is_non_contiguous(obj: Any) -> bool:
    """Whether contiguity is what keeps ``obj`` from being a host buffer: a
    strided, dense tensor (a sparse one's ``is_contiguous()`` is False too,
    and its ``.contiguous()`` fails with torch's "unsupported memory format
    option", hiding the refusal that says what to do) or a NumPy array."""
    if is_torch_tensor(obj):
        torch = torch_or_none()
        return torch is not None and torch_layout_problem(obj, torch) is None and not obj.is_contiguous()
    return isinstance(obj, np.ndarray) and not obj.flags.c_contiguous


def staged(obj: Any, *, writable: bool, name: str = "tensor") -> tuple[HostBuffer, Writeback]:
    """A contiguous host buffer for ``obj`` and the function that writes a
    result back into ``obj`` (a no-op unless a copy had to be made).

    Raises:
        UnsupportedBufferError: ``obj`` cannot be used at all (type, device).
    """
    try:
        return as_host_buffer(obj, writable=writable, name=name), NO_WRITE_BACK
    except UnsupportedBufferError:
        if not _is_non_contiguous(obj):
            raise
    if is_torch_tensor(obj):
        tensor, tensor_copy = obj, obj.contiguous()
        buf = as_host_buffer(tensor_copy, writable=writable, name=name)

        def write_back() -> None:
            tensor.copy_(tensor_copy)

    else:
        array_copy = np.ascontiguousarray(obj)
        buf = as_host_buffer(array_copy, writable=writable, name=name)

        def write_back() -> None:
            np.copyto(obj, array_copy)

    return buf, (write_back if writable else NO_WRITE_BACK)
