"""The blocking facade: torch.distributed's functions over the await API.

``import asyncdist as dist`` exposes these functions. Each one checks its
arguments' shapes, submits the await API's coroutine to the rank's loop and
waits on its :class:`~asyncdist.group.work.Work`; the logic lives below, in
:mod:`asyncdist.group`.
"""
