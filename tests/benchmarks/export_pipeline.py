"""Writing spans: our OTLP/JSON encoder against the official one, and the whole
span path against the SDK's batch processor and file exporter (sections
``encode`` and ``pipeline``)."""

from __future__ import annotations

import gc
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness import InMemoryTelemetry, Run, interleaved
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.exporter.otlp.json.common.trace_encoder import (
    encode_spans as official_encode_spans,
)
from opentelemetry.exporter.otlp.json.file import FileSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link

from megatron.core.telemetry import TelemetryConfig, managed_span, setup_telemetry
from megatron.core.telemetry._otlp_json import encode_spans
from megatron.core.telemetry.processors import BatchSettings
from megatron.core.telemetry.span_groups import SpanGroup
from megatron.trace.otlp.reader import read_spans

# -- OTLP/JSON encoding: ours against the official encoder ---------------------


def _interval_batch(iterations: int = 128) -> list[ReadableSpan]:
    """One export batch of a ``per_step`` run: an interval root and, per
    iteration, the iteration span and its forward/backward, batch and
    optimizer children (``4 * iterations + 1`` spans)."""
    telemetry = InMemoryTelemetry()
    tracer = telemetry.tracer
    startup = tracer.start_span("megatron.startup", context=otel_context.Context())
    startup.end()
    interval = tracer.start_span(
        "megatron.train",
        context=otel_context.Context(),
        links=[Link(startup.get_span_context())],
        attributes={"is_goodput_span": True, "megatron.interval.index": 0},
    )
    in_interval = otel_trace.set_span_in_context(interval)
    for i in range(iterations):
        iteration = tracer.start_span(
            "megatron.train.iteration", in_interval, attributes={"megatron.iteration": i}
        )
        in_iteration = otel_trace.set_span_in_context(iteration)
        forward = tracer.start_span("megatron.train.forward_backward", in_iteration)
        tracer.start_span("megatron.train.get_batch", otel_trace.set_span_in_context(forward)).end()
        forward.end()
        tracer.start_span("megatron.train.optimizer", in_iteration).end()
        iteration.end()
    interval.set_attributes(
        {"megatron.interval.first_iteration": 0, "megatron.interval.last_iteration": iterations}
    )
    interval.end()
    spans = [s for s in telemetry.exporter.get_finished_spans() if s.name != "megatron.startup"]
    telemetry.shutdown()
    return spans


def bench_encode(repeats: int, rounds: int = 20):
    """CPU seconds per span to turn one batch into the line each file exporter writes.

    Ours: ``encode_spans`` dumped as ``JsonlFile.write_lines`` dumps it. The
    official: ``encode_spans(...).to_dict()`` dumped as its ``FileSpanExporter``
    does. Both produce the same request (``tests/core/telemetry/test_otlp_json.py``).
    """
    batch = _interval_batch()

    # This thread's CPU time: on a shared machine, wall time would also count
    # the moments another process held the core.
    def ours() -> float:
        start = time.thread_time()
        for _ in range(rounds):
            json.dumps(encode_spans(batch), separators=(",", ":"), ensure_ascii=False)
        return (time.thread_time() - start) / (rounds * len(batch))

    def official() -> float:
        start = time.thread_time()
        for _ in range(rounds):
            json.dumps(official_encode_spans(batch).to_dict(), separators=(",", ":"))
        return (time.thread_time() - start) / (rounds * len(batch))

    return interleaved(ours, official, repeats)


# -- the whole span path, CPU per exported span -------------------------------


def _cpu_per_span(emit: Callable[[], Path], expected: int) -> float:
    """Process CPU seconds (every thread) per span for ``emit``, which creates
    the spans and shuts its pipeline down; it returns the file written, whose
    span count is checked so neither side can win by dropping spans."""
    gc.collect()
    start = time.process_time()
    path = emit()
    elapsed = time.process_time() - start
    written = len(read_spans(path))
    if written != expected:
        raise RuntimeError(f"{path.name}: {written} spans written, expected {expected}")
    return elapsed / expected


def bench_pipeline(repeats: int, spans: int = 10_000):
    """CPU per exported span: ``managed_span`` through our processor into our
    JSONL file, against raw SDK spans through the SDK's ``BatchSpanProcessor``
    into the official ``FileSpanExporter``.

    Same spans (names, attributes, nesting, resource and scope), same count.
    The SDK processor gets our batch settings: at its default queue (2048)
    it would drop most of a 10,000-span burst, doing less work. Setup and
    file opening are outside the measured window; the final flush and
    shutdown are inside it.
    """
    settings = BatchSettings.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        counter = [0]

        def fresh(name: str) -> Path:
            counter[0] += 1
            return Path(tmp) / f"{name}-{counter[0]}.jsonl"

        def ours() -> float:
            path = fresh("ours")
            handle = setup_telemetry(
                TelemetryConfig(
                    enabled=True, exporter="jsonl", trace_file=path, span_groups_spec="per_step"
                )
            )

            def emit() -> Path:
                with managed_span(SpanGroup.JOB, "megatron.train", is_goodput_span=True):
                    for i in range(spans):
                        with managed_span(
                            SpanGroup.STEP, "megatron.train.iteration", **{"megatron.iteration": i}
                        ):
                            pass
                handle.shutdown()
                return path

            return _cpu_per_span(emit, spans + 1)

        # The baseline uses our handle's resource and scope, so both files hold
        # the same bytes per span.
        probe = setup_telemetry(
            TelemetryConfig(enabled=True, exporter="none", span_groups_spec="per_step")
        )
        with managed_span(SpanGroup.JOB, "probe") as span:
            resource, scope = span.resource, span.instrumentation_scope
        probe.shutdown()

        def official() -> float:
            path = fresh("official")
            provider = TracerProvider(resource=resource, shutdown_on_exit=False)
            provider.add_span_processor(
                BatchSpanProcessor(
                    FileSpanExporter(path),
                    max_queue_size=settings.max_queue_size,
                    schedule_delay_millis=settings.schedule_delay_millis,
                    max_export_batch_size=settings.max_export_batch_size,
                )
            )
            tracer = provider.get_tracer(scope.name, scope.version)

            def emit() -> Path:
                with tracer.start_as_current_span(
                    "megatron.train", attributes={"is_goodput_span": True}
                ):
                    for i in range(spans):
                        with tracer.start_as_current_span(
                            "megatron.train.iteration", attributes={"megatron.iteration": i}
                        ):
                            pass
                provider.shutdown()
                return path

            return _cpu_per_span(emit, spans + 1)

        return interleaved(ours, official, repeats)


def section_encode(run: Run) -> None:
    ratio, ours, base = bench_encode(run.reps)
    run.record(
        "encode_ratio_vs_official",
        ratio,
        f"{ours * 1e6:.2f} us/span",
        f"{base * 1e6:.2f} us/span (otlp-json-common)",
    )


def section_pipeline(run: Run) -> None:
    ratio, ours, base = bench_pipeline(5 if run.quick else 11)
    run.record(
        "pipeline_cpu_ratio",
        ratio,
        f"{ours * 1e6:.1f} us CPU/span",
        f"{base * 1e6:.1f} us CPU/span (SDK batch + FileSpanExporter)",
    )
