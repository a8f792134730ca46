"""Turning a :class:`TelemetryConfig` into running telemetry, and stopping it.

:func:`setup_telemetry` builds a private ``TracerProvider``/``MeterProvider``
pair per call and returns a :class:`TelemetryHandle` that owns them. Nothing
is registered globally (``set_tracer_provider`` works once per process), so a
second ``pretrain()`` in the same process, or a test, gets its own working
pipeline.

Every check that can fail runs before anything is started: a bad setting
raises :class:`TelemetryConfigError` and leaves no thread, file or directory
behind. A rank that does not export gets no-op tracer and meter and starts
nothing at all.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

from megatron.core.telemetry import state
from megatron.core.telemetry._attributes import sanitize_attributes
from megatron.core.telemetry._signals import signals_blocked, start_daemon_thread
from megatron.core.telemetry.config import (
    ENV_EXPORT_RANK,
    ENV_TRACE_FILE,
    TelemetryConfig,
    TelemetryConfigError,
)
from megatron.core.telemetry.jsonl import (
    JsonlFile,
    JsonlMetricExporter,
    JsonlSpanExporter,
    metrics_file_for,
)
from megatron.core.telemetry.processors import OpenSpanTracker, RootFlushingBatchSpanProcessor
from megatron.core.telemetry.tally import SpanTally

__all__ = ["TelemetryHandle", "setup_telemetry"]

_logger = logging.getLogger(__name__)

#: Instrumentation scope of Megatron's own spans and metrics.
SCOPE_NAME = "megatron"

#: How often the jsonl sink appends a metrics line. Metrics are also
#: collected once more at shutdown.
JSONL_METRIC_EXPORT_INTERVAL_MILLIS = 10_000

_OTLP_PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_OTLP_EXTRA_HINT = "pip install 'megatron-telemetry-spans[otlp]'"


def _package_version() -> str:
    try:
        return metadata.version("megatron-telemetry-spans")
    except metadata.PackageNotFoundError:
        return ""


class TelemetryHandle:
    """One rank's telemetry: a tracer, a meter, and the means to stop them.

    Attributes:
        tracer: where spans are started (a no-op tracer when not exporting).
        meter: where metrics are recorded (a no-op meter when not exporting).
        is_exporting: whether this rank records and exports anything.
        span_groups: the span groups this handle enabled (empty when not
            exporting).
        trace_file: the span file of the ``jsonl`` sink, else ``None``.
        rank: the rank the handle was set up for.
        tally: what this handle's spans were, counted as they ended (for
            the end-of-run summary), or ``None`` when not exporting.
    """

    def __init__(
        self,
        *,
        tracer: trace.Tracer,
        meter: metrics.Meter,
        rank: int,
        span_groups: frozenset[str] = frozenset(),
        trace_file: Path | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        tracker: OpenSpanTracker | None = None,
        tally: SpanTally | None = None,
    ) -> None:
        self.tracer = tracer
        self.meter = meter
        self.rank = rank
        self.span_groups = frozenset(span_groups)
        self.trace_file = trace_file
        self.is_exporting = tracer_provider is not None
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._tracker = tracker
        self.tally = tally
        self._pid = os.getpid()
        # Re-entrant: a SIGTERM handler may call shutdown() while the main
        # thread is inside it; the nested call then sees the flag and returns.
        self._lock = threading.RLock()
        self._is_shut_down = False

    def __repr__(self) -> str:
        return (
            f"TelemetryHandle(rank={self.rank}, is_exporting={self.is_exporting}, "
            f"span_groups={sorted(self.span_groups)}, trace_file={self.trace_file})"
        )

    def _owns_pipeline(self) -> bool:
        # A forked child inherits the handle but not the right to export:
        # its parent flushes and shuts down the shared sinks.
        return self._tracer_provider is not None and os.getpid() == self._pid

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        """Export everything recorded so far; ``False`` if that took too long.

        Bounded by ``timeout_ms`` even when the backend does not answer: the
        work runs on a helper thread that is abandoned at the deadline.
        """
        if not self._owns_pipeline() or self._is_shut_down:
            return True
        tracer_provider, meter_provider = self._tracer_provider, self._meter_provider
        return _run_bounded(
            {
                "span-flush": lambda: tracer_provider.force_flush(timeout_ms),
                "metric-flush": lambda: meter_provider.force_flush(timeout_ms),
            },
            timeout_ms / 1000,
        )

    def shutdown(self, timeout_ms: int = 5000) -> bool:
        """End open spans, flush, and shut both providers down, at most once.

        Spans still open are ended first, marked with
        :data:`~megatron.core.telemetry.processors.CUT_SHORT_ATTRIBUTE`, so
        they are exported too. Returns within about ``timeout_ms`` however
        unreachable the backend is, and returns whether everything finished
        in time. If this handle is still the active one, the process-wide
        span groups are switched off. A second call does nothing.
        """
        with self._lock:
            if self._is_shut_down or not self._owns_pipeline():
                return True
            self._is_shut_down = True
        state._deactivate(self)
        atexit.unregister(self._shutdown_at_exit)
        tracer_provider, meter_provider = self._tracer_provider, self._meter_provider
        tracker = self._tracker
        deadline = time.monotonic() + timeout_ms / 1000

        def remaining_ms() -> int:
            return max(0, int((deadline - time.monotonic()) * 1000))

        def stop_tracing() -> None:
            # End, then flush, then shut down: the ended spans must be in the
            # queue before the final flush drains it.
            tracker.end_open_spans()
            tracer_provider.force_flush(remaining_ms())
            tracer_provider.shutdown()

        def stop_metrics() -> None:
            # Shutting a periodic reader down collects and exports once more.
            meter_provider.shutdown(timeout_millis=remaining_ms())

        finished = _run_bounded(
            {"span-shutdown": stop_tracing, "metric-shutdown": stop_metrics},
            timeout_ms / 1000,
        )
        # Let go of the pipeline; a thread stuck on a dead backend keeps only
        # what it needs alive.
        self._tracer_provider = self._meter_provider = self._tracker = None
        return finished

    def _shutdown_at_exit(self) -> None:
        self.shutdown()


def _run_bounded(tasks: Mapping[str, Callable[[], Any]], timeout_s: float) -> bool:
    """Run ``tasks`` concurrently on daemon threads; wait at most ``timeout_s``.

    Returns ``True`` if all finished in time. A task still running at the
    deadline is abandoned (its thread is a daemon and cannot hold up exit).
    During interpreter shutdown, when new threads may be refused, tasks run
    inline instead.
    """
    deadline = time.monotonic() + timeout_s
    threads = []
    for name, task in tasks.items():

        def target(task: Callable[[], Any] = task, name: str = name) -> None:
            try:
                task()
            except Exception:
                _logger.warning("Telemetry %s failed", name, exc_info=True)

        try:
            thread = start_daemon_thread(target, f"megatron-telemetry-{name}")
        except RuntimeError:
            target()
            continue
        threads.append((name, thread))
    finished = True
    for name, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            finished = False
            _logger.warning(
                "Telemetry %s did not finish within %.1f s; continuing without it",
                name,
                timeout_s,
            )
    return finished


def _export_rank(config: TelemetryConfig, world_size: int) -> int:
    return config.export_rank if config.export_rank >= 0 else world_size - 1


def _is_exporting(config: TelemetryConfig, rank: int, world_size: int) -> bool:
    if not config.enabled:
        return False
    if config.rank_strategy == "all_ranks":
        return True
    return rank == _export_rank(config, world_size)


def _build_resource(
    config: TelemetryConfig,
    rank: int,
    world_size: int,
    resource_attributes: Mapping[str, Any] | None,
) -> Resource:
    attributes = sanitize_attributes(resource_attributes or {})
    # Identity attributes come last so a caller cannot overwrite them.
    attributes.update(
        {
            "service.name": config.service_name,
            "megatron.run_id": config.run_id,
            "service.instance.id": f"{config.run_id}-rank{rank}",
            "host.name": socket.gethostname(),
            "process.pid": os.getpid(),
            "dl.rank": rank,
            "dl.world_size": world_size,
        }
    )
    # Resource.create also merges OTEL_RESOURCE_ATTRIBUTES and the SDK's
    # telemetry.sdk.* attributes; explicit attributes win.
    return Resource.create(attributes)


def _otlp_exporters() -> tuple[SpanExporter, MetricExporter]:
    """The OTLP exporters for the protocol the standard variables ask for.

    Endpoint, headers, timeout and TLS settings are left to the exporters,
    which read the standard ``OTEL_EXPORTER_OTLP_*`` variables themselves.
    """
    protocol, variable = "grpc", _OTLP_PROTOCOL_VARS[1]
    for name in _OTLP_PROTOCOL_VARS:
        value = os.environ.get(name, "").strip()
        if value:
            protocol, variable = value.lower(), name
            break
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter,
            )
        elif protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,
            )
        else:
            raise TelemetryConfigError(
                f"{variable}={protocol!r} is not supported; expected one of: grpc, http/protobuf"
            )
    except ImportError as exc:
        raise TelemetryConfigError(
            f"the otlp exporter (--otel-exporter / MEGATRON_OTEL_EXPORTER) needs the optional "
            f"OTLP packages ({exc.name or exc}); install them with: {_OTLP_EXTRA_HINT}"
        ) from None
    return OTLPSpanExporter(), OTLPMetricExporter()


def _open_sink(path: Path) -> JsonlFile:
    try:
        return JsonlFile.open(path)
    except OSError as exc:
        # Also used for metrics.jsonl, whose place follows the trace file.
        raise TelemetryConfigError(
            f"cannot write the telemetry file {str(path)!r} "
            f"(located by --otel-trace-file or {ENV_TRACE_FILE}; "
            f"default <save>/telemetry/traces.jsonl): {exc.strerror or exc}"
        ) from None


class _Sinks:
    """What the configured exporter needs, gathered before anything starts."""

    def __init__(self) -> None:
        self.span_exporter: SpanExporter | None = None
        self.batch_spans = True
        self.metric_exporter: MetricExporter | None = None
        self.metric_interval_millis: float | None = None
        self.trace_file: Path | None = None
        self.files: list[JsonlFile] = []

    def discard(self) -> None:
        for file in self.files:
            file.discard()


def _prepare_sinks(
    config: TelemetryConfig,
    span_exporter: SpanExporter | None,
    metric_reader: MetricReader | None,
) -> _Sinks:
    sinks = _Sinks()
    if span_exporter is not None:
        # Injected exporters (tests, benchmarks) see spans synchronously.
        sinks.span_exporter, sinks.batch_spans = span_exporter, False
    want_spans = span_exporter is None
    want_metrics = metric_reader is None
    try:
        if config.exporter == "jsonl":
            trace_file = config.trace_file
            if want_spans:
                file = _open_sink(trace_file)
                sinks.files.append(file)
                sinks.span_exporter = JsonlSpanExporter(file)
                sinks.trace_file = trace_file
            if want_metrics:
                file = _open_sink(metrics_file_for(trace_file))
                sinks.files.append(file)
                sinks.metric_exporter = JsonlMetricExporter(file)
                sinks.metric_interval_millis = JSONL_METRIC_EXPORT_INTERVAL_MILLIS
        elif config.exporter == "otlp" and (want_spans or want_metrics):
            otlp_spans, otlp_metrics = _otlp_exporters()
            if want_spans:
                sinks.span_exporter = otlp_spans
            if want_metrics:
                sinks.metric_exporter = otlp_metrics
        elif config.exporter == "console":
            # The stream is looked up now, not at SDK import, so redirections
            # of sys.stdout made before setup are respected.
            if want_spans:
                sinks.span_exporter = ConsoleSpanExporter(
                    service_name=config.service_name, out=sys.stdout
                )
            if want_metrics:
                sinks.metric_exporter = ConsoleMetricExporter(out=sys.stdout)
    except BaseException:
        sinks.discard()
        raise
    return sinks


def _start_processing(
    sinks: _Sinks, metric_reader: MetricReader | None
) -> tuple[list[SpanProcessor], list[MetricReader]]:
    """Create the span processor and metric reader; these start threads.

    On failure, whatever was started is stopped and the sinks are discarded.
    """
    processors: list[SpanProcessor] = []
    readers: list[MetricReader] = []
    try:
        if sinks.span_exporter is not None:
            processors.append(
                RootFlushingBatchSpanProcessor(sinks.span_exporter)
                if sinks.batch_spans
                else SimpleSpanProcessor(sinks.span_exporter)
            )
        if metric_reader is not None:
            readers.append(metric_reader)
        elif sinks.metric_exporter is not None:
            readers.append(
                PeriodicExportingMetricReader(
                    sinks.metric_exporter, export_interval_millis=sinks.metric_interval_millis
                )
            )
    except BaseException:
        for processor in processors:
            processor.shutdown()
        sinks.discard()
        raise
    return processors, readers


def setup_telemetry(
    config: TelemetryConfig,
    rank: int = 0,
    world_size: int = 1,
    resource_attributes: Mapping[str, Any] | None = None,
    span_exporter: SpanExporter | None = None,
    metric_reader: MetricReader | None = None,
) -> TelemetryHandle:
    """Start telemetry for this rank as ``config`` says, and return its handle.

    Args:
        config: the resolved settings.
        rank, world_size: this process's place in the job. Under
            ``single_rank`` only ``export_rank`` (default: the last rank,
            which sees the final loss) exports.
        resource_attributes: extra resource attributes describing the run
            (parallel sizes, model shape...); ``None`` values are skipped.
        span_exporter: replaces the configured span sink (spans are then
            exported synchronously, for tests and benchmarks).
        metric_reader: replaces the configured metric sink.

    An exporting handle becomes the process's active one: its tracer and
    span groups are what :func:`~megatron.core.telemetry.helpers.managed_span`
    uses. ``OTEL_TRACES_SAMPLER`` and ``OTEL_RESOURCE_ATTRIBUTES`` are
    honoured through the SDK.

    Raises:
        TelemetryConfigError: the export rank is outside the world, the trace
            file cannot be written, or the otlp extra is missing. Nothing has
            been started or created when it is raised.
    """
    if (
        config.enabled
        and config.rank_strategy == "single_rank"
        and config.export_rank >= world_size
    ):
        raise TelemetryConfigError(
            f"{ENV_EXPORT_RANK}={config.export_rank} is out of range for a world size of "
            f"{world_size}; expected 0..{world_size - 1}, or -1 for the last rank"
        )
    if not _is_exporting(config, rank, world_size):
        return TelemetryHandle(
            tracer=trace.NoOpTracer(), meter=metrics.NoOpMeter(SCOPE_NAME), rank=rank
        )

    resource = _build_resource(config, rank, world_size, resource_attributes)
    # Everything that may start a thread (ours, the SDK's, grpc's native
    # ones) runs with asynchronous signals blocked, and the threads inherit
    # that mask, so SIGTERM always reaches the main thread; see _signals.
    with signals_blocked():
        sinks = _prepare_sinks(config, span_exporter, metric_reader)
        processors, readers = _start_processing(sinks, metric_reader)

    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    tracker = OpenSpanTracker()
    # The tracker goes first: at shutdown it ends open spans, and the
    # exporting processors registered after it must still be alive to get them.
    tracer_provider.add_span_processor(tracker)
    trace_sink = next((f for f in sinks.files if f.path == sinks.trace_file), None)
    tally = SpanTally(trace_sink)
    for processor in (*processors, tally):
        tracer_provider.add_span_processor(processor)
    meter_provider = MeterProvider(
        metric_readers=readers, resource=resource, shutdown_on_exit=False
    )
    version = _package_version()
    handle = TelemetryHandle(
        tracer=tracer_provider.get_tracer(SCOPE_NAME, version),
        meter=meter_provider.get_meter(SCOPE_NAME, version),
        rank=rank,
        span_groups=config.span_groups,
        trace_file=sinks.trace_file,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        tracker=tracker,
        tally=tally,
    )
    # The providers do not register their own (unbounded) exit hooks; this
    # bounded one exports what a caller forgot to shut down.
    atexit.register(handle._shutdown_at_exit)
    state._activate(handle, handle.tracer, handle.span_groups)
    return handle
