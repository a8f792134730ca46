"""Keeping asynchronous signals away from telemetry's background threads.

A process-directed signal (``kill -TERM <pid>``) goes to any thread that does
not block it. CPython runs the Python-level handler in the main thread
either way, but only a signal the kernel hands to the main thread interrupts
what that thread is blocked in (a sleep, a lock or queue wait, a read): taken
by a helper thread, the handler waits until the main thread next runs Python
code, and a graceful drain or a checkpoint-and-exit starts late. So every
thread this package starts (and the SDK threads it causes to start) is
created with the asynchronous signals blocked; a new thread inherits its
creator's mask, and the signals stay the main thread's.

The job lifecycle does not rely on masks to keep a handler out of a
transition or out of a lock: its exit hooks defer their work until the main
thread has left telemetry code, a transition in flight among it
(``ExitHooks.handle_sigterm`` in :mod:`megatron.training.telemetry_spans`),
whichever thread took the signal.
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
