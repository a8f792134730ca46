"""Turning a :class:`TelemetryConfig` into running telemetry, and stopping it.

:func:`setup_telemetry` builds a private ``TracerProvider``/``MeterProvider``
pair per call and returns a :class:`TelemetryHandle` that owns them. Nothing
is registered globally (``set_tracer_provider`` works once per process), so a
second ``pretrain()`` in the same process, or a test, gets its own working
pipeline.

Every check that can fail runs before anything is started: a bad setting
raises :class:`TelemetryConfigError` and leaves no thread, file or directory
behind. A rank that does not export gets no-op tracer and meter and starts
nothing at all. Which ranks export is the rank strategy's decision
(:mod:`.sampling`); on an exporting rank each signal (traces, metrics, logs)
is built only when enabled, so a disabled one has no provider, thread or file.
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
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import LogRecordExporter

    from megatron.core.telemetry.logs import LogBridge

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
    ExportFailures,
    JsonlFile,
    JsonlMetricExporter,
    JsonlSpanExporter,
    metrics_file_for,
)
from megatron.core.telemetry.processors import OpenSpanTracker, RootFlushingBatchSpanProcessor
from megatron.core.telemetry.sampling import RankAwareSampler, local_rank_from_env, rank_exports
from megatron.core.telemetry.tally import SpanTally

__all__ = ["TelemetryHandle", "setup_telemetry"]

_logger = logging.getLogger(__name__)

#: Instrumentation scope of Megatron's own spans and metrics.
SCOPE_NAME = "megatron"

#: How often the jsonl sink appends a metrics line. Metrics are also
#: collected once more at shutdown.
JSONL_METRIC_EXPORT_INTERVAL_MILLIS = 10_000

_OTLP_PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_OTLP_LOGS_PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")

#: SLURM job metadata on the resource, named as nemo-lens's resource detection
#: names it; present only inside a SLURM job (``SLURM_JOB_ID`` set).
SLURM_RESOURCE_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "slurm.job.id": ("SLURM_JOB_ID",),
    "slurm.job.name": ("SLURM_JOB_NAME",),
    "slurm.nodelist": ("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "slurm.nnodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
    "slurm.ntasks": ("SLURM_NTASKS",),
    "slurm.partition": ("SLURM_JOB_PARTITION",),
    "slurm.cluster.name": ("SLURM_CLUSTER_NAME",),
}
_SLURM_INT_ATTRIBUTES = frozenset({"slurm.nnodes", "slurm.ntasks"})
_OTLP_EXTRA_HINT = "pip install 'megatron-telemetry-spans[otlp]'"


def _package_version() -> str:
    try:
        return metadata.version("megatron-telemetry-spans")
    except metadata.PackageNotFoundError:
        return ""


class TelemetryHandle:
    """One rank's telemetry: a tracer, a meter, and the means to stop them.

    Attributes:
        tracer: where spans are started (a no-op tracer when not exporting,
            or with traces off).
        meter: where metrics are recorded (a no-op meter when not exporting,
            or with metrics off).
        is_exporting: whether this rank records and exports anything.
        span_groups: the span groups this handle enabled (empty when not
            exporting, or with traces off).
        trace_file: the span file of the ``jsonl`` sink, else ``None``.
        logs_file: the log-record file of the ``jsonl`` sink with the log
            bridge on, else ``None``.
        rank: the rank the handle was set up for.
        export_failures: per kind (``span``, ``metric``, ``log record``), the
            exports of the ``jsonl`` sink that failed and what they lost
            (reported at shutdown and in the summary; see
            :meth:`failure_reports`).
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
        logger_provider: LoggerProvider | None = None,
        log_bridge: LogBridge | None = None,
        logs_file: Path | None = None,
        export_failures: Mapping[str, ExportFailures] | None = None,
        tally: SpanTally | None = None,
    ) -> None:
        self.tracer = tracer
        self.export_failures = dict(export_failures or {})
        self.meter = meter
        self.rank = rank
        self.span_groups = frozenset(span_groups)
        self.trace_file = trace_file
        self.logs_file = logs_file
        self.is_exporting = any(
            provider is not None for provider in (tracer_provider, meter_provider, logger_provider)
        )
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._tracker = tracker
        self._logger_provider = logger_provider
        self._log_bridge = log_bridge
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
        return self.is_exporting and os.getpid() == self._pid

    def _providers(self) -> dict[str, Any]:
        providers = {
            "span": self._tracer_provider,
            "metric": self._meter_provider,
            "log": self._logger_provider,
        }
        return {name: provider for name, provider in providers.items() if provider is not None}

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        """Export everything recorded so far; ``False`` if that took too long.

        Bounded by ``timeout_ms`` even when the backend does not answer: the
        work runs on a helper thread that is abandoned at the deadline.
        """
        if not self._owns_pipeline() or self._is_shut_down:
            return True
        return _run_bounded(
            {
                f"{name}-flush": lambda provider=provider: provider.force_flush(timeout_ms)
                for name, provider in self._providers().items()
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
        if self._log_bridge is not None:
            # Records logged from here on go only where they went before.
            self._log_bridge.remove()
        tracer_provider, meter_provider = self._tracer_provider, self._meter_provider
        logger_provider, tracker = self._logger_provider, self._tracker
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

        tasks: dict[str, Callable[[], Any]] = {}
        if tracer_provider is not None:
            tasks["span-shutdown"] = stop_tracing
        if meter_provider is not None:
            tasks["metric-shutdown"] = stop_metrics
        if logger_provider is not None:
            # Flushes the queued records, then stops the batch thread.
            tasks["log-shutdown"] = logger_provider.shutdown
        finished = _run_bounded(tasks, timeout_ms / 1000)
        # Let go of the pipeline; a thread stuck on a dead backend keeps only
        # what it needs alive.
        self._tracer_provider = self._meter_provider = self._tracker = None
        self._logger_provider = self._log_bridge = None
        for report in self.failure_reports():
            _logger.warning("Telemetry: %s", report)
        return finished

    def failure_reports(self) -> list[str]:
        """One line per kind of ``jsonl`` export that failed; empty when none did."""
        return [report for f in self.export_failures.values() if (report := f.report())]

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


def _is_exporting(config: TelemetryConfig, rank: int, world_size: int) -> bool:
    if not config.enabled:
        return False
    if not (config.traces_enabled or config.metrics_enabled or config.logs_enabled):
        return False
    local_rank = 0
    if config.rank_strategy == "first_rank_per_node":
        try:
            local_rank = local_rank_from_env(os.environ)
        except ValueError:
            raise TelemetryConfigError(
                f"LOCAL_RANK={os.environ.get('LOCAL_RANK')!r} is not valid for "
                "MEGATRON_OTEL_RANK_STRATEGY=first_rank_per_node; expected an integer"
            ) from None
    return rank_exports(
        config.rank_strategy,
        rank,
        world_size,
        export_rank=config.export_rank,
        sample_rate=config.export_sample_rate,
        local_rank=local_rank,
    )


def _build_resource(
    config: TelemetryConfig,
    rank: int,
    world_size: int,
    resource_attributes: Mapping[str, Any] | None,
) -> Resource:
    attributes = sanitize_attributes(resource_attributes or {})
    attributes.update(_slurm_attributes(os.environ))
    # Identity attributes come last so a caller cannot overwrite them.
    attributes.update(
        {
            "service.name": config.service_name,
            "nemo.run.id": config.run_id,
            # The name this project used first; readers of older files use it.
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


def _slurm_attributes(env: Mapping[str, str]) -> dict[str, Any]:
    """``slurm.*`` attributes from the job's environment; none outside SLURM."""
    if not env.get("SLURM_JOB_ID", "").strip():
        return {}
    found: dict[str, Any] = {}
    for attribute, variables in SLURM_RESOURCE_ATTRIBUTES.items():
        value = next((env[v].strip() for v in variables if env.get(v, "").strip()), None)
        if value is None:
            continue
        if attribute in _SLURM_INT_ATTRIBUTES:
            try:
                found[attribute] = int(value)
            except ValueError:
                continue
        else:
            found[attribute] = value
    return found


def _otlp_protocol(variables: tuple[str, ...]) -> tuple[str, str]:
    """The requested OTLP protocol (default ``grpc``) and the variable that asked."""
    for name in variables:
        value = os.environ.get(name, "").strip()
        if value:
            return value.lower(), name
    return "grpc", variables[-1]


def _unsupported_protocol(variable: str, protocol: str) -> TelemetryConfigError:
    return TelemetryConfigError(
        f"{variable}={protocol!r} is not supported; expected one of: grpc, http/protobuf"
    )


def _missing_otlp_extra(exc: ImportError) -> TelemetryConfigError:
    return TelemetryConfigError(
        f"the otlp exporter (--otel-exporter / MEGATRON_OTEL_EXPORTER) needs the optional "
        f"OTLP packages ({exc.name or exc}); install them with: {_OTLP_EXTRA_HINT}"
    )


def _otlp_log_exporter() -> LogRecordExporter:
    protocol, variable = _otlp_protocol(_OTLP_LOGS_PROTOCOL_VARS)
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        elif protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        else:
            raise _unsupported_protocol(variable, protocol)
    except ImportError as exc:
        raise _missing_otlp_extra(exc) from None
    return OTLPLogExporter()


def _otlp_exporters() -> tuple[SpanExporter, MetricExporter]:
    """The OTLP exporters for the protocol the standard variables ask for.

    Endpoint, headers, timeout and TLS settings are left to the exporters,
    which read the standard ``OTEL_EXPORTER_OTLP_*`` variables themselves.
    """
    protocol, variable = _otlp_protocol(_OTLP_PROTOCOL_VARS)
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
            raise _unsupported_protocol(variable, protocol)
    except ImportError as exc:
        raise _missing_otlp_extra(exc) from None
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
        self.log_exporter: LogRecordExporter | None = None
        self.batch_logs = True
        self.trace_file: Path | None = None
        self.logs_file: Path | None = None
        self.files: list[JsonlFile] = []

    def discard(self) -> None:
        for file in self.files:
            file.discard()


def _prepare_sinks(
    config: TelemetryConfig,
    span_exporter: SpanExporter | None,
    metric_reader: MetricReader | None,
    log_exporter: LogRecordExporter | None = None,
) -> _Sinks:
    sinks = _Sinks()
    if span_exporter is not None and config.traces_enabled:
        # Injected exporters (tests, benchmarks) see spans synchronously.
        sinks.span_exporter, sinks.batch_spans = span_exporter, False
    if log_exporter is not None and config.logs_enabled:
        sinks.log_exporter, sinks.batch_logs = log_exporter, False
    want_spans = span_exporter is None and config.traces_enabled
    want_metrics = metric_reader is None and config.metrics_enabled
    want_logs = log_exporter is None and config.logs_enabled
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
            if want_logs:
                from megatron.core.telemetry.logs import JsonlLogExporter, logs_file_for

                logs_file = logs_file_for(trace_file)
                file = _open_sink(logs_file)
                sinks.files.append(file)
                sinks.log_exporter = JsonlLogExporter(file)
                sinks.logs_file = logs_file
        elif config.exporter == "otlp" and (want_spans or want_metrics or want_logs):
            if want_spans or want_metrics:
                otlp_spans, otlp_metrics = _otlp_exporters()
                if want_spans:
                    sinks.span_exporter = otlp_spans
                if want_metrics:
                    sinks.metric_exporter = otlp_metrics
            if want_logs:
                sinks.log_exporter = _otlp_log_exporter()
        elif config.exporter == "console":
            # The stream is looked up now, not at SDK import, so redirections
            # of sys.stdout made before setup are respected.
            if want_spans:
                sinks.span_exporter = ConsoleSpanExporter(
                    service_name=config.service_name, out=sys.stdout
                )
            if want_metrics:
                sinks.metric_exporter = ConsoleMetricExporter(out=sys.stdout)
            if want_logs:
                from megatron.core.telemetry.logs import console_log_exporter

                sinks.log_exporter = console_log_exporter()
    except BaseException:
        sinks.discard()
        raise
    return sinks


def _start_processing(
    sinks: _Sinks, metric_reader: MetricReader | None
) -> tuple[list[SpanProcessor], list[MetricReader], list[Any]]:
    """Create the span and log processors and the metric reader; these start threads.

    On failure, whatever was started is stopped and the sinks are discarded.
    """
    processors: list[SpanProcessor] = []
    readers: list[MetricReader] = []
    log_processors: list[Any] = []
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
        if sinks.log_exporter is not None:
            from opentelemetry.sdk._logs.export import (
                BatchLogRecordProcessor,
                SimpleLogRecordProcessor,
            )

            log_processors.append(
                BatchLogRecordProcessor(sinks.log_exporter)
                if sinks.batch_logs
                else SimpleLogRecordProcessor(sinks.log_exporter)
            )
    except BaseException:
        for processor in [*processors, *log_processors]:
            processor.shutdown()
        sinks.discard()
        raise
    return processors, readers, log_processors


def setup_telemetry(
    config: TelemetryConfig,
    rank: int = 0,
    world_size: int = 1,
    resource_attributes: Mapping[str, Any] | None = None,
    span_exporter: SpanExporter | None = None,
    metric_reader: MetricReader | None = None,
    log_exporter: LogRecordExporter | None = None,
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
        log_exporter: replaces the configured log-record sink of the log
            bridge (records are then exported synchronously).

    Which ranks export is ``config.rank_strategy``'s call (see
    :mod:`.sampling`). An exporting handle becomes the process's active one:
    its tracer and span groups are what
    :func:`~megatron.core.telemetry.helpers.managed_span` uses; with traces
    off that is the no-op tracer and no group, so call sites record nothing
    while metrics (and logs) still export. ``OTEL_TRACES_SAMPLER`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` are honoured through the SDK; the
    ``rank_aware`` sampling strategy wraps the former. With logs on, the
    log bridge is attached to the root logger until shutdown.

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
        sinks = _prepare_sinks(config, span_exporter, metric_reader, log_exporter)
        processors, readers, log_processors = _start_processing(sinks, metric_reader)

    version = _package_version()
    tracer: trace.Tracer = trace.NoOpTracer()
    tracer_provider = tracker = tally = None
    if config.traces_enabled:
        tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        if config.sampling_strategy == "rank_aware":
            # Set before the tracer exists: tracers take the sampler when made.
            tracer_provider.sampler = RankAwareSampler(
                rank, config.export_sample_rate, delegate=tracer_provider.sampler
            )
        tracker = OpenSpanTracker()
        # The tracker goes first: at shutdown it ends open spans, and the
        # exporting processors registered after it must still be alive to get them.
        tracer_provider.add_span_processor(tracker)
        trace_sink = next((f for f in sinks.files if f.path == sinks.trace_file), None)
        tally = SpanTally(trace_sink)
        for processor in (*processors, tally):
            tracer_provider.add_span_processor(processor)
        tracer = tracer_provider.get_tracer(SCOPE_NAME, version)
    meter: metrics.Meter = metrics.NoOpMeter(SCOPE_NAME)
    meter_provider = None
    if config.metrics_enabled:
        meter_provider = MeterProvider(
            metric_readers=readers, resource=resource, shutdown_on_exit=False
        )
        meter = meter_provider.get_meter(SCOPE_NAME, version)
    logger_provider = log_bridge = None
    if config.logs_enabled:
        from opentelemetry.sdk._logs import LoggerProvider

        from megatron.core.telemetry.logs import LogBridge

        logger_provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
        for log_processor in log_processors:
            logger_provider.add_log_record_processor(log_processor)
        log_bridge = LogBridge(logger_provider)
    handle = TelemetryHandle(
        tracer=tracer,
        meter=meter,
        rank=rank,
        span_groups=config.span_groups if config.traces_enabled else frozenset(),
        trace_file=sinks.trace_file,
        export_failures={
            exporter.failures.kind: exporter.failures
            for exporter in (sinks.span_exporter, sinks.metric_exporter, sinks.log_exporter)
            if isinstance(getattr(exporter, "failures", None), ExportFailures)
        },
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        tracker=tracker,
        logger_provider=logger_provider,
        log_bridge=log_bridge,
        logs_file=sinks.logs_file,
        tally=tally,
    )
    # The providers do not register their own (unbounded) exit hooks; this
    # bounded one exports what a caller forgot to shut down.
    atexit.register(handle._shutdown_at_exit)
    state._activate(handle, handle.tracer, handle.span_groups)
    if log_bridge is not None:
        log_bridge.install()
    return handle
