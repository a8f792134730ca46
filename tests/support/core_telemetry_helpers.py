"""Test helpers: a list exporter, and the shared reader's spans keyed by name."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from megatron.trace.otlp.reader import iter_spans


def spans_by_name(path: Path) -> dict[str, dict[str, Any]]:
    """The file's spans (as the shared reader flattens them), keyed by name."""
    return {span["name"]: span for span in iter_spans(path)}


class ListExporter(SpanExporter):
    """Collects exported span names batch by batch; signals each export."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.exported = threading.Event()
        self.shut_down = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches.append([span.name for span in spans])
        self.exported.set()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut_down = True

    @property
    def names(self) -> list[str]:
        return [name for batch in self.batches for name in batch]
