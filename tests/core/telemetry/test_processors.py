from __future__ import annotations

import logging
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
    BatchSettings,
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
    assert processor.export_thread is not None and not processor.export_thread.is_alive()
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
    with pytest.raises(ValueError):
        RootFlushingBatchSpanProcessor(ListExporter(), max_queue_size=2, max_export_batch_size=3)


# -- the SDK's OTEL_BSP_* variables -------------------------------------------

BSP_VARIABLES = (
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "OTEL_BSP_EXPORT_TIMEOUT",
)


@pytest.fixture
def bsp_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in BSP_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_unset_variables_keep_our_defaults(bsp_env: pytest.MonkeyPatch) -> None:
    processor = RootFlushingBatchSpanProcessor(ListExporter())
    try:
        assert processor.settings == BatchSettings(
            schedule_delay_millis=1000,
            max_queue_size=16384,
            max_export_batch_size=512,
            export_timeout_millis=30000,
        )
    finally:
        processor.shutdown()


def test_variables_set_every_setting_and_arguments_win(bsp_env: pytest.MonkeyPatch) -> None:
    env = {
        "OTEL_BSP_SCHEDULE_DELAY": "250",
        "OTEL_BSP_MAX_QUEUE_SIZE": "100",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": " 10 ",  # int() accepts surrounding blanks, as in the SDK
        "OTEL_BSP_EXPORT_TIMEOUT": "700",
    }
    for name, value in env.items():
        bsp_env.setenv(name, value)
    processor = RootFlushingBatchSpanProcessor(ListExporter())
    explicit = RootFlushingBatchSpanProcessor(
        ListExporter(), max_queue_size=50, schedule_delay_millis=LONG_DELAY_MS
    )
    try:
        assert processor.settings == BatchSettings(250, 100, 10, 700)
        assert explicit.settings == BatchSettings(LONG_DELAY_MS, 50, 10, 700)
    finally:
        processor.shutdown()
        explicit.shutdown()


PROCESSORS_LOGGER = "megatron.core.telemetry.processors"


def ours(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The records of the processors' logger: caplog also holds what a thread another
    test left behind logs meanwhile (an OTLP exporter's retry, ended by its shutdown)."""
    return [record for record in caplog.records if record.name == PROCESSORS_LOGGER]


@pytest.mark.parametrize("raw", ["abc", "1.5", "0", "-3", "1e3"])
@pytest.mark.parametrize("name", BSP_VARIABLES)
def test_invalid_values_fall_back_with_a_warning(
    name: str, raw: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger=PROCESSORS_LOGGER):
        settings = BatchSettings.from_env({name: raw})
    assert settings == BatchSettings()
    (record,) = ours(caplog)
    assert name in record.getMessage()
    assert repr(raw) in record.getMessage()
    assert "positive integer" in record.getMessage()


def test_empty_values_count_as_unset(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger=PROCESSORS_LOGGER):
        settings = BatchSettings.from_env({name: "" for name in BSP_VARIABLES})
    assert settings == BatchSettings()
    assert ours(caplog) == []


def test_batch_larger_than_queue_is_lowered_to_the_queue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger=PROCESSORS_LOGGER):
        asked = BatchSettings.from_env(
            {"OTEL_BSP_MAX_QUEUE_SIZE": "64", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "128"}
        )
    assert (asked.max_queue_size, asked.max_export_batch_size) == (64, 64)
    (record,) = ours(caplog)
    assert "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=128" in record.getMessage()
    caplog.clear()
    with caplog.at_level("WARNING", logger=PROCESSORS_LOGGER):
        small_queue = BatchSettings.from_env({"OTEL_BSP_MAX_QUEUE_SIZE": "100"})
    # The default batch (512) simply does not fit: lowered without a warning.
    assert (small_queue.max_queue_size, small_queue.max_export_batch_size) == (100, 100)
    assert ours(caplog) == []


def test_batch_size_variable_sets_when_a_full_batch_wakes_the_worker(
    bsp_env: pytest.MonkeyPatch, provider: TracerProvider
) -> None:
    bsp_env.setenv("OTEL_BSP_SCHEDULE_DELAY", str(LONG_DELAY_MS))
    bsp_env.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2")
    exporter = ListExporter()
    provider.add_span_processor(RootFlushingBatchSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    root = tracer.start_span("root")
    child_of(tracer, root, "c0").end()
    assert not exporter.exported.wait(0.3)
    child_of(tracer, root, "c1").end()
    assert exporter.exported.wait(10)
    assert exporter.batches[0] == ["c0", "c1"]
    root.end()


def test_schedule_delay_variable_exports_without_a_wake_up(
    bsp_env: pytest.MonkeyPatch, provider: TracerProvider
) -> None:
    bsp_env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    exporter = ListExporter()
    provider.add_span_processor(RootFlushingBatchSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    root = tracer.start_span("root")
    child_of(tracer, root, "child").end()  # neither a root nor a full batch: only the timer
    assert exporter.exported.wait(10)
    assert exporter.names == ["child"]
    root.end()


class _HeldExporter(ListExporter):
    """A list exporter whose first export blocks until released, so the queue fills."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait(10)
        return super().export(spans)


def test_queue_size_variable_bounds_the_queue(
    bsp_env: pytest.MonkeyPatch, provider: TracerProvider
) -> None:
    bsp_env.setenv("OTEL_BSP_SCHEDULE_DELAY", str(LONG_DELAY_MS))
    bsp_env.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "3")
    exporter = _HeldExporter()
    processor = RootFlushingBatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    tracer.start_span("first-root").end()  # wakes the worker, which then waits in export
    assert exporter.entered.wait(10)
    root = tracer.start_span("root")
    for index in range(5):  # nothing drains the queue meanwhile: 3 fit, 2 are dropped
        child_of(tracer, root, f"c{index}").end()
    assert processor.dropped_spans == 2
    exporter.release.set()
    processor.shutdown()
    assert exporter.names == ["first-root", "c0", "c1", "c2"]


def test_export_timeout_variable_bounds_the_wait_at_shutdown(
    bsp_env: pytest.MonkeyPatch, provider: TracerProvider
) -> None:
    bsp_env.setenv("OTEL_BSP_EXPORT_TIMEOUT", "100")
    started = threading.Event()
    release = threading.Event()

    class Stuck(ListExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            started.set()
            release.wait(60)
            return super().export(spans)

    exporter = Stuck()
    processor = RootFlushingBatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    provider.get_tracer("t").start_span("root").end()
    assert started.wait(10)
    try:
        processor.shutdown()  # returns although the export is still running
        assert not release.is_set() and exporter.names == []
        assert exporter.shut_down
    finally:
        release.set()
