"""Backend names, as torch.distributed spells them, and what asyncdist does with each.

torch names a backend per device type: ``"gloo"`` (CPU and CUDA tensors),
``"nccl"`` (CUDA only), or a map such as ``"cpu:gloo,cuda:nccl"``. asyncdist
always moves host data itself, whatever name is given for the CPU; for CUDA
tensors (and CuPy arrays) it has two paths (``docs/gpu.md``):

* ``"staging"``: pinned host staging over asyncdist's transport, for
  ``None``, ``"gloo"``, ``"asyncdist"`` and ``"cuda:gloo"``/``"cuda:asyncdist"``;
* ``"nccl"``: NCCL through CuPy, for ``"nccl"`` and ``"cuda:nccl"``.

Unlike torch, a group whose CUDA backend is NCCL still accepts CPU tensors
(asyncdist moves them), and ``None`` means staging, not NCCL, so that no
script needs CuPy unless it asks for NCCL. Pure parsing: no I/O, no imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["BackendSpec", "parse_backend"]

_HOST_NAMES = ("gloo", "asyncdist")
_DEVICE_PATHS = {"gloo": "staging", "asyncdist": "staging", "nccl": "nccl"}


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """A parsed backend name.

    Attributes:
        name: the name as given, lower-cased ("asyncdist" for None).
        cuda: the path of device operands: "staging" or "nccl".
    """

    name: str
    cuda: str


def parse_backend(backend: Any) -> BackendSpec:
    """Parse a backend name (``init_process_group`` / ``new_group``'s ``backend``).

    Raises:
        InvalidArgumentError: a name asyncdist does not serve ("mpi",
            "cpu:nccl", ...), naming the ones it does.

    Example:
        >>> parse_backend("cpu:gloo,cuda:nccl").cuda, parse_backend("gloo").cuda
        ('nccl', 'staging')
    """
    if backend is None:
        return BackendSpec("asyncdist", "staging")
    name = str(backend).lower()
    if name in _DEVICE_PATHS:
        return BackendSpec(name, _DEVICE_PATHS[name])
    parts: dict[str, str] = {}
    for part in name.split(","):
        device, sep, value = part.strip().partition(":")
        if not sep or device in parts:
            raise _unsupported(backend)
        parts[device] = value
    if set(parts) - {"cpu", "cuda"} or parts.get("cpu", "gloo") not in _HOST_NAMES:
        raise _unsupported(backend)
    cuda = _DEVICE_PATHS.get(parts.get("cuda", "gloo"))
    if cuda is None:
        raise _unsupported(backend)
    return BackendSpec(name, cuda)


def _unsupported(backend: Any) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"backend {backend!r} is not supported; use None, 'gloo', 'asyncdist', 'nccl' or a map such as "
        "'cpu:gloo,cuda:nccl' (CPU: gloo or asyncdist, both run by asyncdist; CUDA: gloo/asyncdist for "
        "pinned staging, nccl for NCCL through CuPy)"
    )
