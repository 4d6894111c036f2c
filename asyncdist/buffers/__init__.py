"""Host memory as the runtime sees it: buffers, dtype adapters, scratch space.

:mod:`~asyncdist.buffers.host` views NumPy arrays and torch CPU tensors as
:class:`~asyncdist.buffers.host.HostBuffer` s (a flat byte view plus dtype
and shape); :mod:`~asyncdist.buffers.scratch` lends reusable scratch buffers;
:mod:`~asyncdist.buffers.contiguous` gives non-contiguous inputs a
contiguous stand-in and writes results back. No I/O, no ranks, no loop.
"""
