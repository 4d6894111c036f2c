"""Process groups: the await API's objects, built on the engine and the algorithms.

:class:`~asyncdist.group.process_group.ProcessGroup` is what
``await asyncdist.init_world(...)`` returns and what every subgroup is:
point-to-point, collectives, object collectives, subgroups and device
routing, each call numbered so that calls never mix.
:class:`~asyncdist.group.work.Work` wraps an operation in flight.
Nothing here knows that a background thread exists.
"""
