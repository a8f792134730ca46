"""Telemetry threads must not take process-directed signals from the main thread.

A signal the kernel hands to a helper thread does not interrupt what the main
thread is blocked in, so its handler runs late. Every telemetry thread blocks
the asynchronous signals; then a signal held off in the main thread is held
off for the whole process, which is what the script checks. These run in a
subprocess so no thread of the test runner itself can take the signal.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.core.telemetry._signals import BLOCKED_SIGNALS, start_daemon_thread

pytestmark = pytest.mark.skipif(
    not hasattr(signal, "pthread_sigmask"), reason="needs POSIX signal masks"
)

REPO_ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import os, signal, sys, threading, time
from megatron.core.telemetry import TelemetryConfig, managed_span, setup_telemetry

before = {t.ident for t in threading.enumerate()}
config = TelemetryConfig(enabled=True, exporter="jsonl", trace_file=sys.argv[1])
handle = setup_telemetry(config)
with managed_span("job", "root"):
    pass
handle.force_flush()
new_threads = [t for t in threading.enumerate() if t.ident not in before]
assert new_threads, "expected telemetry worker threads"

# Every telemetry thread blocks SIGTERM (Linux exposes each thread's mask).
for thread in new_threads:
    status = f"/proc/self/task/{thread.native_id}/status"
    if os.path.exists(status):
        (line,) = [l for l in open(status) if l.startswith("SigBlk:")]
        mask = int(line.split()[1], 16)
        assert mask & (1 << (signal.SIGTERM - 1)), f"{thread.name} takes SIGTERM"

# Held off in the main thread means held off for the whole process.
calls = []
signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(time.monotonic()))
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.3)
held_off = not calls
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
time.sleep(0.05)
handle.shutdown()
print("held_off", held_off, "delivered", len(calls))
"""


def test_telemetry_threads_leave_signals_to_the_main_thread(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "traces.jsonl")],
        capture_output=True,
        text=True,
        cwd=str(REPO_ROOT),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["held_off", "True", "delivered", "1"]


def test_bounded_helper_threads_block_signals() -> None:
    seen: list[set[int]] = []
    thread = start_daemon_thread(
        lambda: seen.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, []))), "probe"
    )
    thread.join(5)
    assert seen and set(BLOCKED_SIGNALS) <= seen[0]
    # the creating thread's own mask is restored
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert thread.daemon
