"""asyncdist as torchft's process group: ``Manager(pg=ProcessGroupAsyncdist(), ...)``.

torchft (the PyTorch project for fault-tolerant training) runs its
``Manager`` over a process group that it reconfigures at each change of
quorum. :class:`ProcessGroupAsyncdist` is that group over asyncdist::

    from torchft import Manager
    from asyncdist.torchft import ProcessGroupAsyncdist

    manager = Manager(pg=ProcessGroupAsyncdist(), min_replica_size=2, ...)

See ``docs/fault-tolerance.md`` ("With torchft"). This package is the only
part of asyncdist that imports torchft (``pip install 'asyncdist[torchft]'``);
``import asyncdist`` never imports it, and it imports torchft and torch at once.

* :mod:`.process_group` - :class:`ProcessGroupAsyncdist`: a fresh asyncdist
  group per quorum, ``abort`` that fails what is outstanding at once, and
  ``errored``.
"""

from __future__ import annotations

from .process_group import ProcessGroupAsyncdist

__all__ = ["ProcessGroupAsyncdist"]
