"""Shared helpers for the tests of ``megatron/training/telemetry_spans.py``.

Nothing here replaces the OpenTelemetry SDK: the fake handle owns a real
``TracerProvider`` with a ``SimpleSpanProcessor`` over an ``InMemorySpanExporter``,
so span ids, parents, links and timestamps are the SDK's own. It never touches the
process-global tracer provider.
"""

from __future__ import annotations

import collections
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

# Bound at import time so a test that forbids the OTel API cannot break the cleanup.
from opentelemetry.context import Context as _Context
from opentelemetry.context import attach as _attach
from opentelemetry.context import detach as _detach
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

REPO_ROOT = Path(__file__).resolve().parents[2]

STARTUP = "megatron.startup"
TRAIN = "megatron.train"
PRE_STARTUP = "pre_startup"
LAUNCH_SCRIPT = "megatron.startup.launch_script"
CONTAINER_LOAD = "megatron.startup.container_load"
STRUCTURAL_ROOTS = frozenset({STARTUP, TRAIN})

STATES = ("job", "startup", "train", "interval", "shutdown")
TRIGGERS = (
    "start_job",
    "record_phase",
    "start_train",
    "reroot",
    "end_train",
    "flush",
    "shutdown",
    "step",
)

# The transition table as the README documents it, written out by hand on purpose: the
# tests derive legality from this, never from the module's own TRANSITIONS.
# (state, trigger) -> destination state.  ``step`` is not in that table (it is a
# method that fires ``reroot`` on a boundary); its entries describe a lifecycle that
# has just run ``start_train`` (pass counter 0, so the first step is a boundary).
SPEC_TABLE: dict[tuple[str, str], str] = {
    ("job", "start_job"): "startup",
    ("startup", "record_phase"): "startup",
    ("startup", "start_train"): "train",
    ("train", "reroot"): "interval",
    ("interval", "reroot"): "interval",
    ("interval", "end_train"): "train",
    **{(s, "shutdown"): "shutdown" for s in ("job", "startup", "train", "interval")},
    **{(s, "flush"): s for s in ("job", "startup", "train", "interval")},
}
STEP_TABLE: dict[tuple[str, str], str] = {
    ("train", "step"): "interval",
    ("interval", "step"): "interval",
}
FULL_TABLE = {**SPEC_TABLE, **STEP_TABLE}

# A legal path from a fresh lifecycle to each state.
PATH_TO_STATE: dict[str, tuple[str, ...]] = {
    "job": (),
    "startup": ("start_job",),
    "train": ("start_job", "start_train"),
    "interval": ("start_job", "start_train", "reroot"),
    "shutdown": ("shutdown",),
}


def ns(seconds: float) -> int:
    """Seconds since the epoch -> the SDK's integer nanoseconds (same rounding)."""
    return int(seconds * 1e9)


# --------------------------------------------------------------------------------------
# In-process telemetry handles
# --------------------------------------------------------------------------------------


class RecordingProcessor(SpanProcessor):
    """Records on_start / on_end per span id, counts ``end()`` calls (so a second
    ``end()``, which the SDK swallows with a log line, is still seen) and tracks the
    structural roots that are currently open."""

    def __init__(self) -> None:
        self.started: dict[int, str] = {}
        self.start_order: list[str] = []
        self.on_end_count: collections.Counter[int] = collections.Counter()
        self.end_calls: collections.Counter[int] = collections.Counter()
        self.open_roots: dict[int, str] = {}
        self.max_open_roots = 0
        self.end_order: list[str] = []

    def on_start(self, span, parent_context=None) -> None:
        sid = span.context.span_id
        self.started[sid] = span.name
        self.start_order.append(span.name)
        if span.name in STRUCTURAL_ROOTS and span.parent is None:
            self.open_roots[sid] = span.name
            self.max_open_roots = max(self.max_open_roots, len(self.open_roots))
        original_end = span.end
        calls = self.end_calls

        def counting_end(end_time=None):
            calls[sid] += 1
            return original_end(end_time)

        span.end = counting_end

    def on_end(self, span: ReadableSpan) -> None:
        sid = span.context.span_id
        self.on_end_count[sid] += 1
        self.end_order.append(span.name)
        self.open_roots.pop(sid, None)

    def open_spans(self) -> dict[int, str]:
        return {sid: name for sid, name in self.started.items() if self.on_end_count[sid] == 0}

    def assert_all_ended_exactly_once(self) -> None:
        assert self.open_spans() == {}, f"spans never ended: {self.open_spans()}"
        bad_on_end = {self.started[s]: c for s, c in self.on_end_count.items() if c != 1}
        assert bad_on_end == {}, f"on_end count != 1: {bad_on_end}"
        bad_calls = {self.started[s]: c for s, c in self.end_calls.items() if c != 1}
        assert bad_calls == {}, f"end() called more than once: {bad_calls}"

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class RaisingProcessor(SpanProcessor):
    """A processor whose on_end raises: an SDK/exporter failure inside span.end()."""

    def __init__(self) -> None:
        self.calls = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.calls += 1
        raise RuntimeError("exporter exploded in on_end")


class FakeHandle:
    """A real in-memory SDK pipeline with the TelemetryHandle surface."""

    def __init__(
        self,
        *,
        is_exporting: bool = True,
        span_groups: Iterable[str] | None = ("job",),
        extra_processors: Iterable[SpanProcessor] = (),
        shutdown_raises: bool = False,
        flush_raises: bool = False,
    ) -> None:
        self.exporter = InMemorySpanExporter()
        self.recorder = RecordingProcessor()
        self.provider = TracerProvider(shutdown_on_exit=False)
        self.provider.add_span_processor(self.recorder)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        for processor in extra_processors:
            self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("tests.telemetry_spans")
        self.is_exporting = is_exporting
        if span_groups is not None:
            self.span_groups = frozenset(span_groups)
        self.flush_calls: list[Any] = []
        self.shutdown_calls: list[Any] = []
        self._shutdown_raises = shutdown_raises
        self._flush_raises = flush_raises

    def force_flush(self, timeout_ms: int | None = None) -> bool:
        self.flush_calls.append(timeout_ms)
        if self._flush_raises:
            raise RuntimeError("force_flush exploded")
        return self.provider.force_flush(timeout_millis=timeout_ms or 30000)

    def shutdown(self, timeout_ms: int | None = None) -> None:
        self.shutdown_calls.append(timeout_ms)
        if self._shutdown_raises:
            raise RuntimeError("shutdown exploded")
        if len(self.shutdown_calls) == 1:
            self.provider.shutdown()

    # ---- finished-span queries -------------------------------------------------------
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"expected exactly one {name!r}, got {len(found)}"
        return found[0]

    def children_of(self, parent: ReadableSpan) -> list[ReadableSpan]:
        return [s for s in self.spans() if parent_id(s) == span_id(parent)]

    def in_trace(self, trace: int) -> list[ReadableSpan]:
        return [s for s in self.spans() if trace_id(s) == trace]

    def intervals(self) -> list[ReadableSpan]:
        return sorted(self.named(TRAIN), key=lambda s: s.attributes["megatron.interval.index"])


def span_id(span: ReadableSpan) -> int:
    return span.context.span_id


def trace_id(span: ReadableSpan) -> int:
    return span.context.trace_id


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def links(span: ReadableSpan) -> list[tuple[int, int]]:
    return [(link.context.trace_id, link.context.span_id) for link in span.links]


def ref(span: ReadableSpan) -> tuple[int, int]:
    return (trace_id(span), span_id(span))


class ForbiddenTracer:
    """Every attribute access is a test failure (``pytest.fail`` raises a
    BaseException, so a callback's ``except Exception`` cannot swallow it); touches
    are also recorded in case something swallows even that."""

    def __init__(self) -> None:
        object.__setattr__(self, "touches", [])

    def __getattribute__(self, name: str):
        if name == "touches":
            return object.__getattribute__(self, name)
        object.__getattribute__(self, "touches").append(name)
        pytest.fail(f"ForbiddenTracer.{name} was accessed while telemetry is off")

    def __setattr__(self, name: str, value: Any) -> None:
        object.__getattribute__(self, "touches").append(f"set {name}")
        pytest.fail(f"ForbiddenTracer.{name} was assigned while telemetry is off")


class ForbiddenHandle:
    """A handle around a ForbiddenTracer. force_flush / shutdown are allowed and counted."""

    def __init__(self, *, is_exporting: bool, span_groups: Iterable[str] | None = ("job",)):
        self.tracer = ForbiddenTracer()
        self.is_exporting = is_exporting
        if span_groups is not None:
            self.span_groups = frozenset(span_groups)
        self.flush_calls: list[Any] = []
        self.shutdown_calls: list[Any] = []

    def force_flush(self, timeout_ms: int | None = None) -> bool:
        self.flush_calls.append(timeout_ms)
        return True

    def shutdown(self, timeout_ms: int | None = None) -> None:
        self.shutdown_calls.append(timeout_ms)


class RaisingTracer:
    """A tracer whose every span factory raises (an SDK failure inside a callback)."""

    def __init__(self) -> None:
        self.calls = 0

    def start_span(self, *args, **kwargs):
        self.calls += 1
        raise RuntimeError("tracer exploded in start_span")

    def start_as_current_span(self, *args, **kwargs):
        self.calls += 1
        raise RuntimeError("tracer exploded in start_as_current_span")


class RaisingTracerHandle:
    def __init__(self) -> None:
        self.tracer = RaisingTracer()
        self.is_exporting = True
        self.span_groups = frozenset({"job"})
        self.flush_calls: list[Any] = []
        self.shutdown_calls: list[Any] = []

    def force_flush(self, timeout_ms: int | None = None) -> bool:
        self.flush_calls.append(timeout_ms)
        raise RuntimeError("force_flush exploded")

    def shutdown(self, timeout_ms: int | None = None) -> None:
        self.shutdown_calls.append(timeout_ms)
        raise RuntimeError("shutdown exploded")


# The OpenTelemetry API functions a lifecycle would need to do anything; with
# telemetry off none of them may be called.
FORBIDDEN_OTEL_API = (
    ("opentelemetry.context", "attach"),
    ("opentelemetry.context", "detach"),
    ("opentelemetry.context", "get_current"),
    ("opentelemetry.context", "Context"),
    ("opentelemetry.trace", "set_span_in_context"),
    ("opentelemetry.trace", "use_span"),
    ("opentelemetry.trace", "get_current_span"),
    ("opentelemetry.trace", "Link"),
    ("opentelemetry.trace", "get_tracer"),
)


def forbid_otel_api(monkeypatch: pytest.MonkeyPatch, module) -> list[str]:
    """Replace the OTel API entry points (in the OTel modules and wherever the module
    under test bound them by name) with recorders. Returns the list of calls made."""
    import importlib

    calls: list[str] = []

    def make(qualname: str):
        def forbidden(*args, **kwargs):
            calls.append(qualname)
            raise AssertionError(f"{qualname} called while telemetry is off")

        return forbidden

    for mod_name, attr in FORBIDDEN_OTEL_API:
        mod = importlib.import_module(mod_name)
        original = getattr(mod, attr)
        replacement = make(f"{mod_name}.{attr}")
        monkeypatch.setattr(mod, attr, replacement)
        for name, value in list(vars(module).items()):
            if value is original:
                monkeypatch.setattr(module, name, replacement)
    return calls


# --------------------------------------------------------------------------------------
# Timestamps
# --------------------------------------------------------------------------------------


def launch_timestamps(now: float | None = None, **overrides: float | None) -> dict[str, float]:
    """A plausible, folded set of launch timestamps in epoch seconds, all in the past.
    ``overrides`` replace values; a value of None removes the key."""
    now = time.time() if now is None else now
    ts: dict[str, float | None] = {
        "slurm_job_start_time": now - 120.25,
        "launch_script_start": now - 60.5,
        "launch_script_presrun": now - 45.125,
        "program_start": now - 30.0625,
        "main_entry": now - 20.75,
        "pretrain_entry": now - 10.375,
    }
    ts.update(overrides)
    return {k: v for k, v in ts.items() if v is not None}


def is_folded(ts: Mapping[str, float]) -> bool:
    keys = ("launch_script_start", "launch_script_presrun", "program_start")
    if not all(k in ts for k in keys):
        return False
    return ts["launch_script_start"] <= ts["launch_script_presrun"] <= ts["program_start"]


def pre_startup_due(ts: Mapping[str, float]) -> bool:
    return (
        "slurm_job_start_time" in ts
        and "launch_script_start" in ts
        and ts["slurm_job_start_time"] < ts["launch_script_start"]
    )


# --------------------------------------------------------------------------------------
# Real subprocesses
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# Context isolation and lifecycle bookkeeping for in-process tests
# --------------------------------------------------------------------------------------


class Lifecycles:
    """Start every test from an empty OTel context and shut down any lifecycle a
    test left open, so nothing leaks into the next test."""

    def __init__(self) -> None:
        self.created: list[Any] = []
        self._token = None

    def __enter__(self) -> Lifecycles:
        self._token = _attach(_Context())
        return self

    def __exit__(self, *exc: object) -> None:
        for phases in reversed(self.created):
            try:
                if phases.state != "shutdown":
                    phases.shutdown()
            except Exception:  # noqa: BLE001 -- cleanup only; the test already reported
                pass
        _detach(self._token)

    def new(self, telemetry: Any, save_interval: int = 3, enabled: bool | None = None):
        from megatron.training.telemetry_spans import SpanPhases

        phases = SpanPhases(telemetry, save_interval=save_interval, enabled=enabled)
        self.created.append(phases)
        return phases
