"""Forked children (dataloader workers) and telemetry.

Python's ``random`` module reseeds itself in a forked child
(``os.register_at_fork`` in ``random.py``), so the SDK's RandomIdGenerator,
which draws from it, does not replay the parent's ids. These tests pin that
down, and that a child neither exports the parent's queued spans nor its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from core_telemetry_helpers import ListExporter, spans_by_name
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from megatron.core.telemetry import TelemetryConfig, TelemetryHandle, managed_span
from megatron.core.telemetry.processors import OpenSpanTracker, RootFlushingBatchSpanProcessor

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

Make = Callable[..., TelemetryHandle]
SPANS_PER_SIDE = 50


def _ids(handle: TelemetryHandle, prefix: str) -> list[list[str]]:
    ids = []
    for i in range(SPANS_PER_SIDE):
        span = handle.tracer.start_span(f"{prefix}-{i}")
        context = span.get_span_context()
        ids.append([format(context.trace_id, "032x"), format(context.span_id, "016x")])
        span.end()
    return ids


def test_forked_child_generates_its_own_ids_and_exports_nothing(
    make_handle: Make, tmp_path: Path
) -> None:
    path = tmp_path / "traces.jsonl"
    config = TelemetryConfig(enabled=True, exporter="jsonl", trace_file=path, run_id="fork")
    handle = make_handle(config)
    with managed_span("job", "before-fork"):
        pass
    # queued in the parent at fork time: the child must not export it again
    queued_root = handle.tracer.start_span("queued-at-fork")
    queued_root.end()

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        status = 1
        try:
            os.close(read_end)
            payload = {"ids": _ids(handle, "child")}
            with managed_span("job", "child-root"):
                pass
            payload["flushed"] = handle.force_flush(timeout_ms=1000)
            handle.shutdown(timeout_ms=1000)
            with os.fdopen(write_end, "w") as pipe:
                json.dump(payload, pipe)
            status = 0
        finally:
            os._exit(status)

    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        payload = json.load(pipe)
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0

    parent_ids = _ids(handle, "parent")
    child_ids = payload["ids"]
    assert len(child_ids) == SPANS_PER_SIDE
    child_traces = {trace_id for trace_id, _ in child_ids}
    child_spans = {span_id for _, span_id in child_ids}
    assert child_traces.isdisjoint(trace_id for trace_id, _ in parent_ids)
    assert child_spans.isdisjoint(span_id for _, span_id in parent_ids)
    assert len(child_spans) == SPANS_PER_SIDE

    handle.shutdown()
    spans = spans_by_name(path)
    assert "before-fork" in spans and "parent-0" in spans
    assert not any(name.startswith("child") for name in spans)
    written = [
        json.loads(line) for line in path.read_text().splitlines() if "queued-at-fork" in line
    ]
    assert len(written) == 1, "the span queued at fork time was exported exactly once"


def test_processors_reset_in_a_forked_child() -> None:
    exporter = ListExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    tracker = OpenSpanTracker()
    processor = RootFlushingBatchSpanProcessor(exporter, schedule_delay_millis=60_000)
    provider.add_span_processor(tracker)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    parent_open = tracer.start_span("open-in-parent")
    # a finished child span waits in the queue (not a root: no wake-up)
    tracer.start_span("queued", context=trace.set_span_in_context(parent_open)).end()

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_end)
            report = {
                "open_after_fork": tracker.open_span_count,
                "queued_after_fork": len(processor._queue),
            }
            tracer.start_span("child-root").end()
            report["queued_after_child_span"] = len(processor._queue)
            report["flushed"] = processor.force_flush(timeout_millis=1000)
            report["exported"] = exporter.names
            with os.fdopen(write_end, "w") as pipe:
                json.dump(report, pipe)
            status = 0
        finally:
            os._exit(status)

    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        report = json.load(pipe)
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    assert report == {
        "open_after_fork": 0,
        "queued_after_fork": 0,
        "queued_after_child_span": 0,
        "flushed": True,
        "exported": [],
    }
    # the parent still owns and exports its spans
    parent_open.end()
    provider.shutdown()
    assert sorted(exporter.names) == ["open-in-parent", "queued"]
