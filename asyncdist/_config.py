"""Environment variables that more than one layer reads, named once.

A variable that one module alone reads is defined in that module, beside
the code that reads it; a name shared across layers lives here, at the
bottom of the import graph, so that no layer imports another sideways or
upwards just to spell it.
"""

from __future__ import annotations

__all__ = ["SECRET_ENV", "JOB_ID_ENV", "JOIN_ENV"]

# The job's shared secret (HMAC key of the peer handshake and the store):
# read by the rendezvous, the TCP store and the torch store adapter, set by
# the launcher for its workers.
SECRET_ENV = "ASYNCDIST_SECRET"
# The job's id: which run a rank belongs to.
JOB_ID_ENV = "ASYNCDIST_JOB_ID"
# "1": init_process_group joins a running job (waits until its ranks call
# grow_group) instead of starting one; set by the launcher for --replace workers.
JOIN_ENV = "ASYNCDIST_JOIN"
