"""The hang watchdog: when it exists, when it fires, what it writes, written at once."""

from __future__ import annotations

import io
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from megatron.core.telemetry import TelemetryConfig, managed_span
from megatron.core.telemetry.watchdog import (
    DEFAULT_FACTOR,
    DEFAULT_FLOOR_S,
    NO_WATCHDOG,
    HangWatchdog,
    hang_watchdog,
)
from megatron.trace.otlp.reader import decode_attributes, iter_logs, iter_spans


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def config(tmp_path: Path, **overrides: Any) -> TelemetryConfig:
    settings: dict[str, Any] = {
        "enabled": True,
        "exporter": "jsonl",
        "trace_file": tmp_path / "traces.jsonl",
        "span_groups_spec": "per_step",
        "metrics_enabled": False,
        "run_id": "watchdog",
    }
    return TelemetryConfig(**{**settings, **overrides})


@pytest.fixture
def memory_handle(make_handle, tmp_path):
    exporter = InMemorySpanExporter()
    handle = make_handle(config(tmp_path), span_exporter=exporter, rank=3, world_size=4)
    return handle, exporter


class Stuck:
    """A 'training thread' that arms the watchdog, then blocks in :meth:`stuck_here`."""

    def __init__(self, watchdog: HangWatchdog, setup: Callable[[], Any] | None = None) -> None:
        self.watchdog = watchdog
        self.armed = threading.Event()
        self.release = threading.Event()
        self.progress_next = threading.Event()
        self.setup = setup
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Stuck:
        self.thread.start()
        assert self.armed.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(5)

    def _run(self) -> None:
        with (
            managed_span("step", "megatron.train.iteration", **{"megatron.iteration": 7}),
            managed_span("forward_backward", "megatron.train.forward_backward"),
        ):
            self.watchdog.arm(7)
            self.armed.set()
            self.stuck_here()

    def stuck_here(self) -> None:
        deadline = time.monotonic() + 10
        while not self.release.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)


def spans_named(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_no_watchdog_without_exporting_telemetry_or_with_timeout_zero(make_handle, tmp_path):
    before = threading.active_count()
    off = make_handle(TelemetryConfig(enabled=False))
    assert hang_watchdog(off, None) is NO_WATCHDOG
    assert hang_watchdog(None, 5.0) is NO_WATCHDOG
    on = make_handle(config(tmp_path), span_exporter=InMemorySpanExporter())
    assert hang_watchdog(on, 0) is NO_WATCHDOG
    with NO_WATCHDOG.watching(0) as idle:
        idle.progress(0)
    assert threading.active_count() == before
    assert isinstance(hang_watchdog(on, None), HangWatchdog)


def test_default_timeout_is_a_multiple_of_the_median_pass_with_a_floor(memory_handle):
    handle, _ = memory_handle
    clock = FakeClock()
    watchdog = HangWatchdog(handle, None, clock=clock)
    assert watchdog.current_timeout() == DEFAULT_FLOOR_S  # nothing measured yet
    watchdog.arm(0)
    for iteration, seconds in enumerate([1, 50, 40, 45]):
        clock.now += seconds
        watchdog.progress(iteration)
    assert watchdog.current_timeout() == DEFAULT_FACTOR * 42.5
    assert HangWatchdog(handle, 2.5, clock=clock).current_timeout() == 2.5


def test_a_stall_is_reported_once_with_where_and_how_long(memory_handle):
    handle, exporter = memory_handle
    clock, out = FakeClock(), io.StringIO()
    watchdog = HangWatchdog(handle, 30.0, clock=clock, out=out)
    with Stuck(watchdog) as stuck:
        clock.now += 29.9
        assert not watchdog.check()
        clock.now += 0.6
        assert watchdog.check()
        assert not watchdog.check()  # once per stall
        clock.now += 100
        assert not watchdog.check()
    (hang,) = spans_named(exporter, "megatron.hang")
    (open_fb,) = spans_named(exporter, "megatron.train.forward_backward")
    assert hang.parent.span_id == open_fb.context.span_id  # under the span it stalled in
    attributes = dict(hang.attributes)
    assert attributes["megatron.iteration"] == 7
    assert "megatron.hang.last_iteration" not in attributes  # nothing finished yet
    assert attributes["megatron.hang.stalled_s"] == 30.5
    assert attributes["megatron.hang.timeout_s"] == 30.0
    assert attributes["megatron.hang.span"] == "megatron.train.forward_backward"
    assert attributes["megatron.hang.span_id"] == f"{open_fb.context.span_id:016x}"
    assert re.search(r"/test_watchdog.py:\d+ in stuck_here$", attributes["megatron.hang.frame"])
    assert attributes["megatron.hang.waiting"] is False
    assert hang.start_time - attributes["megatron.hang.last_progress_unix_nano"] == 30_500_000_000
    stacks = attributes["megatron.hang.stacks"]
    assert f"Thread {stuck.thread.ident} ({stuck.thread.name}, the training thread)" in stacks
    assert "in stuck_here" in stacks and "MainThread" in stacks
    (line,) = out.getvalue().splitlines()
    assert line.startswith("telemetry: rank 3 stalled: no iteration finished for 30.5 s ")
    assert "iteration 7 in flight in megatron.train.forward_backward" in line


def test_progress_after_a_stall_is_recorded_and_rearms(memory_handle):
    handle, exporter = memory_handle
    clock, out = FakeClock(), io.StringIO()
    watchdog = HangWatchdog(handle, 10.0, clock=clock, out=out)
    watchdog.arm(0)
    clock.now += 11
    assert watchdog.check()
    clock.now += 4
    watchdog.progress(0)  # recovered, 15 s after the last progress
    (recovered,) = spans_named(exporter, "megatron.hang.recovered")
    assert dict(recovered.attributes) == {"megatron.hang.stalled_s": 15.0, "megatron.iteration": 0}
    assert "progressing again: iteration 0 finished after 15.0 s" in out.getvalue()
    clock.now += 9
    watchdog.progress(1)
    assert not watchdog.check()
    clock.now += 10
    assert watchdog.check()  # a new stall: reported again
    hangs = spans_named(exporter, "megatron.hang")
    assert [dict(h.attributes)["megatron.iteration"] for h in hangs] == [0, 2]
    assert dict(hangs[1].attributes)["megatron.hang.last_iteration"] == 1
    assert len(spans_named(exporter, "megatron.hang.recovered")) == 1


def test_waiting_for_the_others(memory_handle):
    handle, exporter = memory_handle
    clock = FakeClock()
    # The open span says so (the gradient all-reduce's wait).
    watchdog = HangWatchdog(
        handle, 1.0, clock=clock, wait_spans=frozenset({"megatron.train.forward_backward"})
    )
    with Stuck(watchdog):
        clock.now += 2
        assert watchdog.check()
    # A frame in torch.autograd counts only where DDP waits there unobserved.
    for autograd_waits in (False, True):
        watchdog = HangWatchdog(handle, 1.0, clock=clock, autograd_waits=autograd_waits)
        stuck = Stuck(watchdog)
        stuck.stuck_here = _in_fake_autograd(stuck.release)  # type: ignore[method-assign]
        with stuck:
            clock.now += 2
            assert watchdog.check()
    waiting = [
        dict(h.attributes)["megatron.hang.waiting"] for h in spans_named(exporter, "megatron.hang")
    ]
    assert waiting == [True, False, True]


def _in_fake_autograd(release: threading.Event) -> Callable[[], None]:
    source = (
        "import time\n"
        "def _engine_run_backward(release):\n"
        "    while not release.is_set():\n"
        "        time.sleep(0.005)\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, "/venv/site-packages/torch/autograd/graph.py", "exec"), namespace)
    return lambda: namespace["_engine_run_backward"](release)


def test_the_record_is_in_the_files_at_once(make_handle, tmp_path, monkeypatch):
    # A batch delay far longer than the test: only the watchdog's flush can write.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
    handle = make_handle(config(tmp_path, logs_enabled=True), rank=1, world_size=2)
    clock = FakeClock()
    watchdog = HangWatchdog(handle, 5.0, clock=clock, out=io.StringIO())
    with Stuck(watchdog):
        clock.now += 6
        assert watchdog.check()
        spans = [s for s in iter_spans(tmp_path / "traces.jsonl") if s["name"] == "megatron.hang"]
        logs = list(iter_logs(tmp_path / "logs.jsonl"))
    (hang,) = spans
    assert hang["attributes"]["megatron.iteration"] == 7
    assert "in stuck_here" in hang["attributes"]["megatron.hang.stacks"]
    (record,) = [r["data"] for r in logs if "stalled" in json.dumps(r)]
    assert record["severityText"] == "WARN"
    assert record["body"]["stringValue"].startswith("telemetry: rank 1 stalled: ")
    assert (record["spanId"], record["traceId"]) == (hang["span_id"], hang["trace_id"])
    attributes = decode_attributes(record["attributes"])
    assert attributes["megatron.hang.waiting"] is False
    assert "in stuck_here" in attributes["megatron.hang.stacks"]


def test_the_thread_watches_and_stops(memory_handle):
    handle, exporter = memory_handle
    before = {t.name for t in threading.enumerate()}
    watchdog = HangWatchdog(handle, 0.2, out=io.StringIO())
    with watchdog.watching(0):
        assert "megatron-telemetry-hang-watchdog" in {t.name for t in threading.enumerate()}
        deadline = time.monotonic() + 60  # a stall of 0.2 s; 60 s only ends a hang
        while not spans_named(exporter, "megatron.hang") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a further look must not report the same stall again
    assert len(spans_named(exporter, "megatron.hang")) == 1
    # none left running (a thread another test left may have ended meanwhile)
    assert {t.name for t in threading.enumerate()} - before == set()


def test_no_record_after_telemetry_shut_down(memory_handle):
    handle, exporter = memory_handle
    clock = FakeClock()
    watchdog = HangWatchdog(handle, 1.0, clock=clock, out=io.StringIO())
    watchdog.arm(0)
    handle.shutdown()
    clock.now += 5
    assert not watchdog.check()
    assert not spans_named(exporter, "megatron.hang")


@pytest.fixture(autouse=True)
def _no_stray_threads() -> Iterator[None]:
    yield
    assert "megatron-telemetry-hang-watchdog" not in {t.name for t in threading.enumerate()}
