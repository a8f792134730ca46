from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from core_telemetry_helpers import ListExporter, spans_by_name
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import StatusCode

from megatron.core.telemetry.jsonl import JsonlFile, JsonlSpanExporter
from megatron.core.telemetry.processors import (
    CUT_SHORT_ATTRIBUTE,
    OpenSpanTracker,
    RootFlushingBatchSpanProcessor,
)

LONG_DELAY_MS = 60_000  # far longer than any wait below: only a wake-up exports


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    provider = TracerProvider(shutdown_on_exit=False)
    yield provider
    provider.shutdown()


def child_of(tracer: trace.Tracer, parent: trace.Span, name: str) -> trace.Span:
    return tracer.start_span(name, context=trace.set_span_in_context(parent))


def test_tracker_ends_open_spans_innermost_first(provider: TracerProvider) -> None:
    tracker = OpenSpanTracker()
    provider.add_span_processor(tracker)
    tracer = provider.get_tracer("t")
    outer = tracer.start_span("outer")
    inner = child_of(tracer, outer, "inner")
    done = tracer.start_span("done")
    done.end()
    assert tracker.open_span_count == 2

    assert tracker.end_open_spans() == 2
    assert tracker.open_span_count == 0
    for span in (outer, inner):
        assert span.attributes[CUT_SHORT_ATTRIBUTE] is True
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "span still open at telemetry shutdown"
    assert inner.end_time <= outer.end_time
    assert CUT_SHORT_ATTRIBUTE not in done.attributes
    assert tracker.end_open_spans() == 0


def test_tracker_shutdown_hands_spans_to_later_processors(
    provider: TracerProvider,
) -> None:
    exporter = ListExporter()
    provider.add_span_processor(OpenSpanTracker())
    provider.add_span_processor(RootFlushingBatchSpanProcessor(exporter))
    provider.get_tracer("t").start_span("left-open")
    provider.shutdown()
    assert exporter.names == ["left-open"]
    assert exporter.shut_down


def test_root_end_wakes_the_worker(provider: TracerProvider) -> None:
    exporter = ListExporter()
    processor = RootFlushingBatchSpanProcessor(exporter, schedule_delay_millis=LONG_DELAY_MS)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    root = tracer.start_span("interval")
    child_of(tracer, root, "iteration").end()
    # a child ending alone waits for the batch
    assert not exporter.exported.wait(0.3)
    root.end()
    assert exporter.exported.wait(10), "the root span's end did not trigger an export"
    assert exporter.names == ["iteration", "interval"]


def test_root_end_reaches_the_jsonl_file_promptly(provider: TracerProvider, tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    processor = RootFlushingBatchSpanProcessor(
        JsonlSpanExporter(JsonlFile.open(path)), schedule_delay_millis=LONG_DELAY_MS
    )
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    root = tracer.start_span("megatron.train")
    child_of(tracer, root, "iteration").end()
    root.end()
    started = time.monotonic()
    deadline = started + 10
    while path.stat().st_size == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert time.monotonic() - started < 10 < LONG_DELAY_MS / 1000
    assert set(spans_by_name(path)) == {"megatron.train", "iteration"}


def test_full_batch_wakes_the_worker(provider: TracerProvider) -> None:
    exporter = ListExporter()
    processor = RootFlushingBatchSpanProcessor(
        exporter, schedule_delay_millis=LONG_DELAY_MS, max_export_batch_size=3
    )
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    root = tracer.start_span("root")
    for i in range(3):
        child_of(tracer, root, f"c{i}").end()
    assert exporter.exported.wait(10)
    assert exporter.batches[0] == ["c0", "c1", "c2"]
    root.end()


def test_force_flush_and_shutdown_drain_the_queue(provider: TracerProvider) -> None:
    exporter = ListExporter()
    processor = RootFlushingBatchSpanProcessor(exporter, schedule_delay_millis=LONG_DELAY_MS)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    root = tracer.start_span("root")
    child_of(tracer, root, "a").end()
    assert processor.force_flush(timeout_millis=10_000) is True
    assert exporter.names == ["a"]
    child_of(tracer, root, "b").end()
    processor.shutdown()
    assert exporter.names == ["a", "b"]
    assert exporter.shut_down
    # after shutdown, spans are dropped and no thread is left
    root.end()
    assert exporter.names == ["a", "b"]
    assert processor._worker is not None and not processor._worker.is_alive()
    processor.shutdown()  # second call is a no-op


def test_full_queue_drops_new_spans(provider: TracerProvider) -> None:
    blocked = threading.Event()
    release = threading.Event()

    class Blocking(ListExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            blocked.set()
            release.wait(10)
            return super().export(spans)

    exporter = Blocking()
    processor = RootFlushingBatchSpanProcessor(
        exporter, schedule_delay_millis=LONG_DELAY_MS, max_queue_size=2, max_export_batch_size=1
    )
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    tracer.start_span("first").end()  # a root: wakes the worker, which blocks on it
    assert blocked.wait(10)
    for name in ("q1", "q2", "dropped1", "dropped2"):
        root = tracer.start_span("parent")
        child_of(tracer, root, name).end()
    assert processor.dropped_spans == 2
    release.set()
    processor.shutdown()
    assert exporter.names == ["first", "q1", "q2"]


def test_record_only_spans_are_not_exported() -> None:
    class RecordOnly(Sampler):
        def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
            return SamplingResult(Decision.RECORD_ONLY)

        def get_description(self) -> str:
            return "RecordOnly"

    exporter = ListExporter()
    recording = TracerProvider(sampler=RecordOnly(), shutdown_on_exit=False)
    recording.add_span_processor(RootFlushingBatchSpanProcessor(exporter))
    span = recording.get_tracer("t").start_span("recorded-not-sampled")
    assert span.is_recording()
    span.end()
    recording.shutdown()
    assert exporter.names == []


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        RootFlushingBatchSpanProcessor(ListExporter(), schedule_delay_millis=0)
    with pytest.raises(ValueError):
        RootFlushingBatchSpanProcessor(ListExporter(), max_queue_size=0)
