"""The process, faked for the exit-hook tests: ``atexit.register``, ``signal.signal``,
``signal.getsignal``, ``os.kill`` and ``signal.raise_signal`` are replaced by recorders,
so installing and chaining can be counted without touching the test process."""

from __future__ import annotations

import atexit
import os
import signal

import pytest


class FakeProcess:
    """Records what the hooks do to the process instead of letting them do it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.previous = signal.SIG_DFL
        self.atexit_calls: list = []
        self.signal_calls: list = []
        self.events: list = []
        monkeypatch.setattr(atexit, "register", self._register)
        monkeypatch.setattr(signal, "signal", self._signal)
        monkeypatch.setattr(signal, "getsignal", self._getsignal)
        monkeypatch.setattr(os, "kill", self._kill)
        monkeypatch.setattr(signal, "raise_signal", self._raise_signal)

    def _register(self, func, *args, **kwargs):
        self.atexit_calls.append(func)
        return func

    def _signal(self, signum, handler):
        self.signal_calls.append((signum, handler))
        self.events.append(("signal", signum, handler))
        return self.previous

    def _getsignal(self, signum):
        return self.previous

    def _kill(self, pid, signum):
        self.events.append(("kill", pid, signum))

    def _raise_signal(self, signum):
        self.events.append(("kill", os.getpid(), signum))

    def resends(self):
        return [e for e in self.events if e[0] == "kill"]


class PreviousHandler:
    """A Python SIGTERM handler that was there before ours; records what it saw."""

    def __init__(self, phases_ref=None) -> None:
        self.calls: list = []
        self.phases_ref = phases_ref

    def __call__(self, signum, frame):
        phases = self.phases_ref() if self.phases_ref else None
        self.calls.append((signum, frame, phases.state if phases else None))
