"""Real subprocesses: a Python script driving a lifecycle, its output read as it runs."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT_PRELUDE = textwrap.dedent(
    """
    import json
    import os
    import signal
    import sys
    import time

    from megatron.core.telemetry import TelemetryConfig, setup_telemetry
    from megatron.training.telemetry_spans import EXIT_HOOKS, SpanPhases, install_exit_hooks

    TRACE_FILE = sys.argv[1]


    def say(*parts):
        print(*parts, flush=True)


    def make_handle():
        config = TelemetryConfig.from_env(
            env={
                "MEGATRON_OTEL_ENABLED": "1",
                "MEGATRON_OTEL_TRACE_FILE": TRACE_FILE,
                "MEGATRON_OTEL_SPAN_GROUPS": "per_step",
            }
        )
        handle = setup_telemetry(config, rank=0, world_size=1)
        assert handle.is_exporting, "the real handle is not exporting"
        return handle


    class Proxy:
        '''Any object with the handle surface is accepted by SpanPhases.'''

        def __init__(self, handle, tracer=None):
            self._handle = handle
            self.tracer = tracer if tracer is not None else handle.tracer
            self.is_exporting = handle.is_exporting
            self.span_groups = handle.span_groups
            self.shutdown_calls = 0

        def force_flush(self, *args, **kwargs):
            return self._handle.force_flush(*args, **kwargs)

        def shutdown(self, *args, **kwargs):
            self.shutdown_calls += 1
            return self._handle.shutdown(*args, **kwargs)
    """
)


def subprocess_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "MEGATRON_", "PYTHON", "SLURM_"))
    }
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ScriptRun:
    """A Python script in a subprocess whose stdout lines are collected by a thread."""

    def __init__(
        self,
        tmp_path: Path,
        body: str,
        name: str = "driver.py",
        extra_args: Iterable[str] = (),
    ) -> None:
        self.trace_file = tmp_path / "telemetry" / "traces.jsonl"
        self.script = tmp_path / name
        self.script.write_text(SCRIPT_PRELUDE + "\n" + textwrap.dedent(body))
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stdout: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, str(self.script), str(self.trace_file), *extra_args],
            cwd=str(tmp_path),
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._stderr_parts: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()

    @property
    def stderr(self) -> str:
        return "".join(self._stderr_parts)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for chunk in self.proc.stderr:
            self._stderr_parts.append(chunk)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, marker: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                pytest.fail(f"timed out waiting for {marker!r}; {self.describe()}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                self.finish(timeout=5)
                pytest.fail(f"process ended before printing {marker!r}; {self.describe()}")
            self.stdout.append(line)
            if line.startswith(marker):
                return line

    def sigterm(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def finish(self, timeout: float = 30.0) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"process did not end within {timeout}s; {self.describe()}")
        self._reader.join(timeout=5)
        self._err_reader.join(timeout=5)
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.stdout.append(line)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def lines_starting(self, prefix: str) -> list[str]:
        return [line for line in self.stdout if line.startswith(prefix)]

    def describe(self) -> str:
        return (
            f"returncode={self.proc.returncode}\n--- stdout ---\n"
            + "\n".join(self.stdout)
            + f"\n--- stderr ---\n{self.stderr}"
        )

    def read_spans(self) -> list[dict]:
        from megatron.core.telemetry.reader import read_spans

        assert self.trace_file.exists(), f"no trace file written; {self.describe()}"
        return list(read_spans(self.trace_file))


def named(spans: Iterable[dict], name: str) -> list[dict]:
    return [s for s in spans if s["name"] == name]
