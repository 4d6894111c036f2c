"""torch.profiler sees asyncdist: one event ``asyncdist:<op>`` per call.

Under ``torch.profiler.profile()`` (or the legacy autograd profiler) every
collective and point-to-point call made through the facade or the torch
backend records one event named ``asyncdist:<op>`` (gloo's are
``gloo:<op>``), around the call on the calling thread: the whole call for a
blocking one, its start for ``async_op=True``, ``isend`` and ``irecv``. With
``record_shapes=True`` the event carries the shapes of the call's torch
tensors, as torch's own operators do.

Cost when no profiler runs: a look into ``sys.modules`` and, with torch
imported, ``torch.autograd._profiler_enabled()`` (a C call). Nothing else.
Never imports torch.

Any thread but the loop's (the facade's and the backend's callers).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence, TypeVar

__all__ = ["profiled"]

R = TypeVar("R")


def profiled(op: str, tensors: Sequence[Any], call: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """``call(*args, **kwargs)``, recorded as the event ``asyncdist:<op>`` if a torch profiler is on.

    Args:
        op: the operation's name ("all_reduce", "isend").
        tensors: its operands; the torch tensors among them give the event's input shapes.
    """
    torch = sys.modules.get("torch")
    autograd = getattr(torch, "autograd", None)  # None while torch is still being imported
    if torch is None or autograd is None or not autograd._profiler_enabled():
        return call(*args, **kwargs)
    inputs = [t for t in tensors if isinstance(t, torch.Tensor)]
    handle = torch._C._autograd._record_function_with_args_enter(f"asyncdist:{op}", *inputs)
    try:
        return call(*args, **kwargs)
    finally:
        torch._C._autograd._record_function_with_args_exit(handle)
