"""The OpenTelemetry log bridge: Python ``logging`` records, correlated with spans.

With ``MEGATRON_OTEL_LOGS_ENABLED`` on, an exporting rank gets a
``LoggerProvider`` and an SDK ``LoggingHandler`` on the root logger for as
long as its telemetry is up. The handler stamps each record with the trace
and span id current when it was emitted, so in a backend a log line opens
the span it was written under (an iteration's log line opens that
iteration). Records go to ``logs.jsonl`` beside the trace file (one OTLP/JSON
``ExportLogsServiceRequest`` per line) with the ``jsonl`` exporter, over OTLP
with ``otlp``, and to stdout with ``console``.

The trainer's console lines (iteration, validation, checkpoint) are
``print``-ed as Megatron prints them and also logged to
:data:`CONSOLE_LOGGER_NAME`. That logger does not propagate, so a user's own
root handlers never show those lines twice; the bridge attaches to it too,
and opens it to ``INFO`` while installed.

Bridged: ``INFO`` and above (as lens bridges), except records of the
OpenTelemetry SDK's own loggers, which would feed an exporter's complaint
about a failed export back into the exporter.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    ConsoleLogRecordExporter,
    LogRecordExporter,
    LogRecordExportResult,
)

from megatron.core.telemetry._otlp_json import encode_logs
from megatron.core.telemetry.jsonl import ExportFailures, JsonlFile

__all__ = [
    "CONSOLE_LOGGER_NAME",
    "JsonlLogExporter",
    "LogBridge",
    "console_logger",
    "logs_file_for",
    "print_lines",
]


#: Where the trainer logs the lines it prints (see the module docstring).
CONSOLE_LOGGER_NAME = "megatron.console"

#: Lowest level bridged.
BRIDGE_LEVEL = logging.INFO

_SDK_LOGGER_PREFIX = "opentelemetry"


def print_lines(text: str, file: TextIO | None = None) -> None:
    """``print(text, file=file, flush=True)``, but each line with its newline in one write.

    The ranks of a job write to one console: torchrun's workers inherit its
    stdout and stderr, and a job's log is often read with ``PYTHONUNBUFFERED``
    set. Unbuffered, ``print`` writes its text and then its newline as two
    writes, so another rank's line can land between them: rank 0's last line
    runs on into rank 1's, and no line of the log begins with rank 1's words.
    Every line a rank prints for a user goes through here; a line written whole
    (well under the pipe's atomic ``PIPE_BUF``) stays whole however the ranks'
    writes interleave; a summary written in one long write would not be, as a
    pipe may split a write longer than ``PIPE_BUF`` around another's.
    (``logging``'s stream handler already writes a record and its newline in
    one call.)
    """
    stream = sys.stdout if file is None else file
    for line in text.split("\n"):
        stream.write(line + "\n")
        stream.flush()  # buffered too, each write one line: a long write to a pipe can be split


def console_logger() -> logging.Logger:
    """The logger of printed console lines: silent unless a bridge is installed."""
    logger = logging.getLogger(CONSOLE_LOGGER_NAME)
    if logger.propagate:
        logger.propagate = False
        logger.addHandler(logging.NullHandler())
    return logger


def logs_file_for(trace_file: Path) -> Path:
    """Where log records go for a given trace file: ``logs.jsonl`` beside it."""
    candidate = trace_file.with_name("logs.jsonl")
    if candidate == trace_file:
        candidate = trace_file.with_name("logs.logs.jsonl")
    return candidate


class JsonlLogExporter(LogRecordExporter):
    """Writes each batch of log records as one OTLP/JSON line."""

    def __init__(self, file: JsonlFile) -> None:
        self._file = file
        self.failures = ExportFailures("log record")

    @property
    def path(self) -> Path:
        return self._file.path

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        if not batch:
            return LogRecordExportResult.SUCCESS
        try:
            self._file.write_lines([encode_logs(batch)])
        except (OSError, ValueError, TypeError) as exc:
            # Logged once with its cause, then only counted: a broken file must
            # not flood the very log stream it is part of.
            self.failures.record(self._file.path, len(batch), exc)
            return LogRecordExportResult.FAILURE
        return LogRecordExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # every export is one unbuffered write

    def shutdown(self) -> None:
        self._file.close()


def console_log_exporter() -> LogRecordExporter:
    """The ``console`` exporter's log sink: one compact JSON object per line."""
    return ConsoleLogRecordExporter(
        out=sys.stdout, formatter=lambda record: record.to_json(indent=None) + os.linesep
    )


def _not_feedback(record: logging.LogRecord) -> bool:
    name = record.name
    return not (name.startswith(_SDK_LOGGER_PREFIX) or name == __name__)


class LogBridge:
    """The bridge's handler, attached while telemetry is up and removed at shutdown."""

    def __init__(self, provider: LoggerProvider) -> None:
        with warnings.catch_warnings():
            # The SDK handler is marked deprecated in favour of a separate
            # instrumentation package; it is the one the SDK itself ships.
            warnings.simplefilter("ignore", DeprecationWarning)
            self.handler = LoggingHandler(level=BRIDGE_LEVEL, logger_provider=provider)
        self.handler.addFilter(_not_feedback)
        self._console_level: int | None = None
        self._installed = False

    def install(self) -> None:
        if self._installed:
            return
        self._installed = True
        logging.getLogger().addHandler(self.handler)
        console = console_logger()
        console.addHandler(self.handler)
        self._console_level = console.level
        console.setLevel(BRIDGE_LEVEL)

    def remove(self) -> None:
        if not self._installed:
            return
        self._installed = False
        logging.getLogger().removeHandler(self.handler)
        console = logging.getLogger(CONSOLE_LOGGER_NAME)
        console.removeHandler(self.handler)
        if self._console_level is not None:
            console.setLevel(self._console_level)
