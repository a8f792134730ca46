"""Keeping asynchronous signals away from telemetry's background threads.

A process-directed signal (``kill -TERM <pid>``) goes to any thread that does
not block it. CPython runs Python-level handlers in the main thread, but if
the kernel hands the signal to a helper thread, the handler is scheduled
even while the main thread has that signal blocked with
``signal.pthread_sigmask``. The job lifecycle blocks SIGTERM around each
transition so a SIGTERM handler never sees one half done; that only works
if no other thread is willing to take the signal. So every thread this
package starts (and the SDK threads it causes to start) is created with the
asynchronous signals blocked; a new thread inherits its creator's mask.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["BLOCKED_SIGNALS", "signals_blocked", "start_daemon_thread"]

#: Signals a training process may handle in Python. Synchronous signals
#: (SIGSEGV, SIGFPE...) are left alone: blocking them in the thread that
#: raises them is undefined behaviour.
BLOCKED_SIGNALS: frozenset[signal.Signals] = frozenset(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")
    if hasattr(signal, name)
)


@contextmanager
def signals_blocked() -> Iterator[None]:
    """Block :data:`BLOCKED_SIGNALS` in the calling thread for the duration.

    Threads started inside the block inherit the mask. A signal arriving
    meanwhile stays pending and is delivered when the mask is restored.
    Without ``pthread_sigmask`` (Windows) this does nothing.
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_daemon_thread(target: Callable[[], Any], name: str) -> threading.Thread:
    """Start a daemon thread that never receives :data:`BLOCKED_SIGNALS`."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    with signals_blocked():
        thread.start()
    return thread
