"""The per-rank runtime: connections in, matched messages out.

The :class:`~asyncdist.engine.engine.Engine` owns a rank's connections and
control frames; the :mod:`~asyncdist.engine.mailbox` routes each arriving
payload to the receive it matches (:mod:`~asyncdist.engine.matching`, MPI's
rules) or keeps it as unexpected; :mod:`~asyncdist.engine.losses` fails what
depended on a lost peer; :mod:`~asyncdist.engine.progress` says what an
operation still waits for; :mod:`~asyncdist.engine.channel` is the view of
one collective call that algorithms send and receive through. Nothing here
knows the names of collectives.
"""
