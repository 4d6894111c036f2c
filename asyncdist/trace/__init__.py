"""``asyncdist-trace``: reading the flight recorder's dumps of every rank.

Each rank's dump (:mod:`asyncdist.flight.dumps`) says what that rank did;
only together do they say what went wrong. :mod:`.load` reads a folder of
them, :mod:`.analyze` says in plain words which rank is behind, which ranks
disagree about a call and which rank died, :mod:`.timeline` writes a
Chrome/Perfetto trace, :mod:`.torch_fr` writes the dumps in torch's
flight-recorder format for torch's analyzer, and :mod:`.cli` is the
command line.

Beside the layers (like ``bench/``): it reads files, never a live job.
"""
