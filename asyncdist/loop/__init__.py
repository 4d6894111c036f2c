"""The one bridge between user threads and the event loop.

The blocking facade and the torch backend call into a rank's loop through
:class:`~asyncdist.loop.thread.LoopThread`: it runs the loop in the calling
thread when the loop is free (:mod:`~asyncdist.loop.turns`), and in a
daemon thread while operations are in flight; :mod:`~asyncdist.loop.exits`
handles Ctrl-C and process exit for every LoopThread;
:mod:`~asyncdist.loop.choice` picks uvloop's loop or asyncio's; the private parts of
asyncio that turning a loop by hand needs are all in
:mod:`~asyncdist.loop.asyncio_internals`.
"""
