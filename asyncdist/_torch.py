"""The one place asyncdist imports torch.

torch is optional: ``import asyncdist`` must work, and NumPy arrays must
travel, on a machine without it. Every other module reaches torch through
:func:`torch_or_none`, so there is exactly one import to find, to fake in a
test, and to keep lazy.

Invariants:

* Importing this module never imports torch; only :func:`torch_or_none` does,
  on its first call.
* :func:`is_torch_tensor` never imports torch. A torch tensor cannot exist
  unless torch was imported already, so when ``sys.modules`` has no torch the
  answer is ``False`` without paying torch's import time (about a second).
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterable, TypeGuard

from .errors import adopt_torch_bases

if TYPE_CHECKING:  # for the checker only: importing this module never imports torch
    import torch

__all__ = ["torch_or_none", "is_torch_tensor", "torch_future"]


@functools.cache
def torch_or_none() -> ModuleType | None:
    """Import torch on first use and cache the outcome.

    Returns:
        The ``torch`` module, or ``None`` when it is not installed. The outcome
        is cached for the life of the process. Any thread.
    """
    try:
        import torch
    except ImportError:
        return None
    # For an installation without the torch.backends entry point, which
    # adopts torch's error classes as soon as torch is imported.
    adopt_torch_bases(torch)
    return torch


def is_torch_tensor(obj: Any) -> TypeGuard[torch.Tensor]:
    """Whether ``obj`` is a ``torch.Tensor`` (any device, layout or subclass).

    Never imports torch: if torch is not in ``sys.modules`` no tensor can exist.
    Any thread.
    """
    module = sys.modules.get("torch")
    # getattr: torch may be half-imported (an import in progress on another thread).
    tensor_type = getattr(module, "Tensor", None)
    return tensor_type is not None and isinstance(obj, tensor_type)


def torch_future(torch: ModuleType, values: Iterable[Any]) -> Any:
    """A ``torch.futures.Future`` that may carry ``values``.

    torch refuses to complete a future with CUDA tensors unless it was made
    with their devices; made so, completing it records an event on each
    device's current stream, and its ``wait()`` and ``.then()`` callbacks
    order the waiting stream after that event (torch's rule for device
    results). The completing thread's current stream must therefore already
    be ordered after the result.
    """
    devices = sorted({str(v.device) for v in values if is_torch_tensor(v) and v.is_cuda})
    return torch.futures.Future(devices=devices) if devices else torch.futures.Future()
