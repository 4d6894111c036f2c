"""How the end of a process reaches every LoopThread in it: Ctrl-C and exit.

Both are process-wide, while a :class:`~asyncdist.loop.thread.LoopThread`
is one of possibly several (the facade's, the torch backend's): each
registers here when made (:func:`register`) and leaves when stopped
(:func:`unregister`). This module knows them only as :class:`Stoppable`
(it must not import :mod:`asyncdist.loop.thread`, which imports it).

* **Ctrl-C.** Python runs signal handlers in the main thread between any
  two bytecodes, so the default handler's ``KeyboardInterrupt`` could land
  inside a loop callback (half a frame read). While the main thread runs a
  call, the handler installed here has that call's LoopThread cancel it
  (:meth:`LoopThread.interrupt`); the call then raises ``KeyboardInterrupt``
  once its coroutine has ended. Elsewhere it raises ``KeyboardInterrupt`` at
  once, as Python's default does. It is installed once per process, by the
  first LoopThread made in the main thread, and only over Python's default
  handler (a handler of the user's is left alone).
* **SIGTERM** (what launchers send to stop a job). Python's default dies
  at once, and the peers only see the connection drop. The handler
  installed here (over the default only, like SIGINT's) says goodbye
  first: it runs the hooks given to :func:`call_on_termination` (the
  facade's destroys its group, whose BYE tells the peers "rank 1 was
  terminated (SIGTERM)"), then dies by the same signal, as the default
  would, so exit statuses do not change. A call the main thread runs on a
  loop is cancelled first, as for Ctrl-C, so the hooks never run inside a
  loop callback.
* **Exit.** A process that exits with a daemon thread still running a loop
  (a script that never called ``destroy_process_group``) stops every
  LoopThread first: interpreter shutdown with a loop running on a daemon
  thread can crash the process (SIGSEGV with uvloop; seen on about 40% of
  such exits here). :func:`call_at_exit` is the hook for that, and for the
  facade's own cleanup.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import signal
import threading
import weakref
from typing import Any, Callable, Protocol

__all__ = ["Stoppable", "register", "unregister", "call_at_exit", "call_on_termination", "terminate"]

log = logging.getLogger("asyncdist")



class Stoppable(Protocol):
    """What Ctrl-C and exit need of a loop's owner (a LoopThread)."""

    def stop(self) -> None:
        """Cancel what runs on the loop, stop its thread and close it (idempotent)."""

    def interrupt(self, thread: int, signum: int) -> bool:
        """Ctrl-C (or SIGTERM) in ``thread``: cancel the call it runs on this
        loop, then raise KeyboardInterrupt (or :func:`terminate`); False if none."""


_running: weakref.WeakSet[Stoppable] = weakref.WeakSet()
_hooked_in: int | None = None  # the process whose SIGINT handler and exit hook are in place
_farewells: list[tuple[int, Callable[[int], None]]] = []  # (pid, hook) for SIGTERM


def register(portal: Stoppable) -> None:
    """Let Ctrl-C and process exit reach ``portal`` (called as it is made)."""
    global _hooked_in
    _running.add(portal)
    if _hooked_in != os.getpid():
        _hooked_in = os.getpid()
        call_at_exit(_stop_all, priority=10)
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_signal)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_signal)


def unregister(portal: Stoppable) -> None:
    """``portal`` has stopped."""
    _running.discard(portal)


def call_at_exit(fn: Callable[[], None], priority: int) -> None:
    """Run ``fn`` when this process exits normally, also as a multiprocessing
    child (which skips ``atexit``); higher ``priority`` runs first.

    ``fn`` must be idempotent (it may be called twice) and runs only in the
    process that registered it, not in forked children that inherit it.
    """
    pid = os.getpid()

    def in_this_process() -> None:
        if os.getpid() == pid:
            try:
                fn()
            except Exception:  # exiting anyway: say why, and let the rest run
                log.exception("asyncdist: cleanup at exit failed")

    # threading's exit hooks run before thread pools shut down (atexit's run
    # after), and closing a group still hands its store's close to one.
    getattr(threading, "_register_atexit", atexit.register)(in_this_process)
    multiprocessing.util.Finalize(None, in_this_process, exitpriority=priority)


def call_on_termination(fn: Callable[[int], None]) -> None:
    """Run ``fn(signum)`` when this process is ended by SIGTERM, before it
    dies (in the main thread, never inside a loop callback; see the module
    docstring). ``fn`` must return within a few seconds: a launcher follows
    SIGTERM with SIGKILL."""
    _farewells.append((os.getpid(), fn))


def terminate(signum: int) -> None:
    """Run the termination hooks, then die by ``signum`` as Python's default would."""
    pid = os.getpid()
    for owner, fn in list(_farewells):
        if owner == pid:
            try:
                fn(signum)
            except Exception:  # dying anyway: say why, and let the rest run
                log.exception("asyncdist: goodbye on %s failed", signal.Signals(signum).name)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(pid, signum)


def _stop_all() -> None:
    for portal in list(_running):
        portal.stop()


def _on_signal(signum: int, frame: Any) -> None:
    me = threading.get_ident()
    for portal in list(_running):
        if portal.interrupt(me, signum):
            return
    if signum == signal.SIGINT:
        signal.default_int_handler(signum, frame)
    terminate(signum)
