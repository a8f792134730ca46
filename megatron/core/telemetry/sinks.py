"""Where telemetry goes: the exporters each ``--otel-exporter`` value stands for.

The sinks are gathered (files opened, exporters made) before anything
starts, so a bad setting fails with nothing to undo; then the processors
and readers that run them are started.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import (
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

if TYPE_CHECKING:
    from opentelemetry.sdk._logs.export import LogRecordExporter

from megatron.core.telemetry.config import ENV_TRACE_FILE, TelemetryConfig, TelemetryConfigError
from megatron.core.telemetry.heartbeat import HEARTBEAT_PERIOD_S
from megatron.core.telemetry.jsonl import (
    JsonlFile,
    JsonlMetricExporter,
    JsonlSpanExporter,
    metrics_file_for,
)
from megatron.core.telemetry.processors import RootFlushingBatchSpanProcessor

__all__ = ["JSONL_METRIC_EXPORT_INTERVAL_MILLIS", "Sinks", "prepare_sinks", "start_processing"]

#: How often the jsonl sink appends a metrics line (each one carries the
#: heartbeat, see :mod:`.heartbeat`). Metrics are also collected once more at
#: shutdown.
JSONL_METRIC_EXPORT_INTERVAL_MILLIS = int(HEARTBEAT_PERIOD_S * 1000)

_OTLP_PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_OTLP_LOGS_PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_OTLP_EXTRA_HINT = "pip install 'megatron-telemetry-spans[otlp]'"


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


class Sinks:
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


def prepare_sinks(
    config: TelemetryConfig,
    span_exporter: SpanExporter | None,
    metric_reader: MetricReader | None,
    log_exporter: LogRecordExporter | None = None,
) -> Sinks:
    """Open the files and make the exporters ``config.exporter`` names; start nothing.

    An injected exporter or reader (tests, benchmarks) replaces the
    configured one for its signal. Raises :class:`TelemetryConfigError` for a
    file that cannot be written or a missing otlp extra, after closing what
    it had opened and removing the files it created.
    """
    sinks = Sinks()
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


def start_processing(
    sinks: Sinks, metric_reader: MetricReader | None
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
