"""asyncdist's ``torch.backends`` entry point: ``init_process_group("asyncdist")``
in torch code that never imports asyncdist.

torch 2.13 calls every entry point of the group ``torch.backends`` while
``import torch`` runs, after ``torch.distributed`` is imported
(``torch._import_device_backends``; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
turns that off). :func:`register` is asyncdist's. It must cost ``import
torch`` next to nothing, so it lives outside the ``asyncdist`` package,
whose ``__init__`` imports the whole runtime (about 0.17 s), and it imports
nothing of asyncdist:

* it registers the backend name "asyncdist" with torch, with a creator that
  imports :mod:`asyncdist.torch_backend` only when torch creates a group
  (the package's own ``register()`` then finds the name taken and keeps it);
* if :mod:`asyncdist.errors` is imported already (asyncdist before torch),
  it makes asyncdist's ``Dist*Error`` classes subclasses of torch's, which
  the errors module does itself when torch comes first.

It never raises: torch turns an entry point's exception into a failed
``import torch``. A failure is logged on the ``asyncdist`` logger instead,
and ``import asyncdist.torch_backend`` still registers the backend.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["register"]

# Copies of asyncdist.torch_backend.process_group's BACKEND_NAME and DEVICES: importing
# that module would import asyncdist's runtime (tests/torch_backend/test_entry_point.py
# checks that they agree). The package imports nothing from here.

#: torch's name of the backend.
BACKEND_NAME = "asyncdist"
#: The devices whose tensors the backend serves (CUDA through pinned staging).
DEVICES = ["cpu", "cuda"]


def register() -> None:
    """Called by torch during ``import torch``: register "asyncdist" lazily (idempotent)."""
    try:
        import torch.distributed as tdist  # imported already by then: a dict lookup

        if not tdist.is_available():
            return
        if BACKEND_NAME.upper() not in tdist.Backend._plugins:
            tdist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=DEVICES)
        errors = sys.modules.get("asyncdist.errors")
        if errors is not None:
            errors.adopt_torch_bases(sys.modules["torch"])
    except Exception:  # never fail torch's import
        logging.getLogger("asyncdist").warning("could not register asyncdist as a torch backend", exc_info=True)


def _create_backend(*args: Any, **kwargs: Any) -> Any:
    """torch's creator of an "asyncdist" group: asyncdist's, imported on first use."""
    from asyncdist.torch_backend.backend import create_backend

    return create_backend(*args, **kwargs)
