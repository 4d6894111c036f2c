"""Collective algorithms: pure coroutines over a :class:`~asyncdist.collectives.channel.Channel`.

Each algorithm sees only its channel (rank, size, send/recv by group rank)
and host buffers; it is correct for every group size, 1 and odd sizes
included. Which algorithm runs for a call is chosen by the group.
"""
