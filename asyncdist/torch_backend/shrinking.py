"""``torch.distributed.shrink_group`` on an asyncdist group: the one adapter torch needs.

torch 2.13's ``shrink_group`` asks the group's device backend
(``pg._get_backend(device)``) whether it ``supports_shrinking`` and calls its
``shrink(ranks_to_exclude, flags, options)``. Then it wraps what that
returns in a new C++ ``ProcessGroup`` with ``_register_backend``, which takes
only a C++ ``Backend``, and a backend written in Python cannot be one (torch
offers no constructor for a Python subclass of ``Backend``). torch serves
Python backends as whole ``ProcessGroup`` subclasses instead: when a backend
creator returns one, ``init_process_group`` and ``new_group`` use it as the
group itself ("the old behavior for PythonProcessGroups", torch's comment in
``_new_process_group_helper``). :func:`install` gives ``shrink_group`` that
same rule: a shrink that returns a ``ProcessGroup`` is the new group. For
every other backend torch's own function runs unchanged.

So ``AsyncdistProcessGroup`` answers ``_get_backend`` for its own device with
itself, and its ``shrink`` returns the new ``AsyncdistProcessGroup``; torch
then registers it (default group, names, rank mapping) as it would its own.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch.distributed as tdist
from torch.distributed import distributed_c10d as c10d

__all__ = ["install"]


def install() -> None:
    """Let torch's ``shrink_group`` take a Python ProcessGroup from a backend's
    ``shrink`` as the new group (idempotent; nothing on a torch without ``shrink_group``)."""
    create: Callable[..., Any] | None = getattr(c10d, "_create_shrunk_process_group", None)
    if create is None or getattr(create, "__asyncdist__", False):
        return

    @functools.wraps(create)
    def create_shrunk(new_backend: Any, remaining_ranks: list[int], metadata: dict, is_default_group: bool) -> Any:
        if not isinstance(new_backend, tdist.ProcessGroup):
            return create(new_backend, remaining_ranks, metadata, is_default_group)
        new_backend._set_group_name(metadata["new_group_name"])
        desc = "default:shrunken" if is_default_group else f"{metadata['original_group_name']}:shrunk"
        new_backend._set_group_desc(desc)
        return new_backend

    setattr(create_shrunk, "__asyncdist__", True)  # marks the installed wrapper
    c10d._create_shrunk_process_group = create_shrunk
