"""The wire: what goes over a connection, as bytes, with no sockets and no clock.

Sans-I/O, after h11: :mod:`~asyncdist.wire.frames` turns headers into bytes
and bytes back into headers and payload destinations;
:mod:`~asyncdist.wire.control` gives each control frame (goodbye, heartbeat,
abort, revoke, agreement, hang question, ring agreement) a typed value and
is the one place that maps it to a header and back;
:mod:`~asyncdist.wire.handshake` is the state machine of the authenticated
handshake. Nothing here awaits, reads a clock or touches a socket; the
transport layer feeds bytes in and writes bytes out. Limits (the largest
frame, the longest handshake message) are named constants with their reason.
"""
