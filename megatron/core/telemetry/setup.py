"""Turning a :class:`TelemetryConfig` into running telemetry: the wiring.

The parts live beside this module: the handle and its bounded shutdown in
:mod:`.handle`, the resource in :mod:`.resources`, the exporters and sinks
in :mod:`.sinks`. :func:`setup_telemetry` builds a private
``TracerProvider``/``MeterProvider`` pair per call and returns a
:class:`TelemetryHandle` that owns them. Nothing is registered globally
(``set_tracer_provider`` works once per process), so a second ``pretrain()``
in the same process, or a test, gets its own working pipeline.

Every check that can fail runs before anything is started: a bad setting
raises :class:`TelemetryConfigError` and leaves no thread, file or directory
behind. A rank that does not export gets no-op tracer and meter and starts
nothing at all. Which ranks export is the rank strategy's decision
(:mod:`.sampling`); on an exporting rank each signal (traces, metrics, logs)
is built only when enabled, so a disabled one has no provider, thread or file.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

if TYPE_CHECKING:
    from opentelemetry.sdk._logs.export import LogRecordExporter

from megatron.core.telemetry import state
from megatron.core.telemetry._signals import signals_blocked
from megatron.core.telemetry.config import (
    ENV_EXPORT_RANK,
    TelemetryConfig,
    TelemetryConfigError,
)
from megatron.core.telemetry.handle import TelemetryHandle
from megatron.core.telemetry.heartbeat import register_heartbeat
from megatron.core.telemetry.jsonl import ExportFailures
from megatron.core.telemetry.processors import OpenSpanTracker
from megatron.core.telemetry.resources import SLURM_RESOURCE_ATTRIBUTES, build_resource
from megatron.core.telemetry.sampling import RankAwareSampler, local_rank_from_env, rank_exports
from megatron.core.telemetry.sinks import (
    JSONL_METRIC_EXPORT_INTERVAL_MILLIS,
    prepare_sinks,
    start_processing,
)
from megatron.core.telemetry.tally import SpanTally

# The names below the handle were defined here before the module was split;
# they stay importable from here.
__all__ = [
    "JSONL_METRIC_EXPORT_INTERVAL_MILLIS",
    "SCOPE_NAME",
    "SLURM_RESOURCE_ATTRIBUTES",
    "TelemetryHandle",
    "setup_telemetry",
]

#: Instrumentation scope of Megatron's own spans and metrics.
SCOPE_NAME = "megatron"


def _package_version() -> str:
    try:
        return metadata.version("megatron-telemetry-spans")
    except metadata.PackageNotFoundError:
        return ""


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

    resource = build_resource(config, rank, world_size, resource_attributes)
    # Everything that may start a thread (ours, the SDK's, grpc's native
    # ones) runs with asynchronous signals blocked, and the threads inherit
    # that mask, so none of them takes a SIGTERM meant for the main thread;
    # see _signals.
    with signals_blocked():
        sinks = prepare_sinks(config, span_exporter, metric_reader, log_exporter)
        processors, readers, log_processors = start_processing(sinks, metric_reader)

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
    if meter_provider is not None:
        register_heartbeat(meter, lambda: not handle.is_shut_down)
    # The providers do not register their own (unbounded) exit hooks; this
    # bounded one exports what a caller forgot to shut down.
    atexit.register(handle._shutdown_at_exit)
    state._activate(handle, handle.tracer, handle.span_groups)
    if log_bridge is not None:
        log_bridge.install()
    return handle
