"""Test helpers: reading the OTLP/JSON lines the jsonl sink writes, a list exporter."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def any_value(value: dict[str, Any]) -> Any:
    """Decode one OTLP/JSON ``AnyValue`` back into Python."""
    ((kind, raw),) = value.items()
    if kind == "stringValue":
        return raw
    if kind == "boolValue":
        return raw
    if kind == "intValue":
        assert isinstance(raw, str), "int64 values must be JSON strings"
        return int(raw)
    if kind == "doubleValue":
        return float(raw)
    if kind == "arrayValue":
        return [any_value(item) for item in raw["values"]]
    raise AssertionError(f"unexpected AnyValue kind {kind}")


def attributes(key_values: list[dict[str, Any]]) -> dict[str, Any]:
    return {kv["key"]: any_value(kv["value"]) for kv in key_values}


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Parse every line; fails the test on any line that is not JSON."""
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def spans_of(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """All spans of some ExportTraceServiceRequests, each with its resource."""
    spans = []
    for request in requests:
        for resource_spans in request["resourceSpans"]:
            resource = attributes(resource_spans["resource"]["attributes"])
            for scope_spans in resource_spans["scopeSpans"]:
                for span in scope_spans["spans"]:
                    spans.append({**span, "_resource": resource, "_scope": scope_spans["scope"]})
    return spans


def spans_by_name(path: Path) -> dict[str, dict[str, Any]]:
    return {span["name"]: span for span in spans_of(read_lines(path))}


def metrics_of(requests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Metric name -> its last OTLP/JSON metric object."""
    found = {}
    for request in requests:
        for resource_metrics in request["resourceMetrics"]:
            for scope_metrics in resource_metrics["scopeMetrics"]:
                for metric in scope_metrics["metrics"]:
                    found[metric["name"]] = metric
    return found


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
