"""Read back the JSONL trace file a run wrote, and summarize it.

Why this lives in the package rather than in the tests: the trainer prints a
summary of the telemetry it just wrote at the end of every run, and the tests
(ours and the lifecycle tests) need the very same reading of the file. One
reader means the end-of-run print and the test assertions can never disagree
about what is on disk.

The file holds one OTLP/JSON ``ExportTraceServiceRequest`` per line (the
OpenTelemetry file-exporter format). That nesting (resource -> scope -> spans,
attributes as typed ``KeyValue`` lists, integers as decimal strings) is right
for interchange and awkward for assertions, so ``read_spans`` flattens it into
one plain dict per span.

A process killed by SIGKILL can leave its last line half written; that line is
skipped rather than treated as an error, because everything before it is still
valid and is exactly what a reader wants after a crash.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from megatron.core.telemetry.jsonl import metrics_file_for

__all__ = ["ancestor_names", "decode_any_value", "incarnations", "read_spans", "summarize"]

# OTLP status codes, as integers (protobuf JSON mapping) or enum names.
_STATUS_NAMES = {0: "UNSET", 1: "OK", 2: "ERROR"}


def decode_any_value(value: dict[str, Any] | None) -> Any:
    """Decode one OTLP ``AnyValue`` object into a plain Python value."""
    if not value:
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return [decode_any_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return _decode_attributes(value["kvlistValue"].get("values", []))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def _decode_attributes(key_values: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {kv["key"]: decode_any_value(kv.get("value")) for kv in key_values or []}


def _status_code(status: dict[str, Any] | None) -> str:
    code = (status or {}).get("code", 0)
    if isinstance(code, int):
        return _STATUS_NAMES.get(code, str(code))
    return str(code).removeprefix("STATUS_CODE_")


def _flatten_request(request: dict[str, Any]) -> list[dict[str, Any]]:
    spans = []
    for resource_spans in request.get("resourceSpans", []):
        resource = _decode_attributes(resource_spans.get("resource", {}).get("attributes"))
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                status = span.get("status") or {}
                spans.append(
                    {
                        "name": span["name"],
                        "trace_id": span["traceId"],
                        "span_id": span["spanId"],
                        "parent_id": span.get("parentSpanId") or None,
                        "start_ns": int(span["startTimeUnixNano"]),
                        "end_ns": int(span["endTimeUnixNano"]),
                        "attributes": _decode_attributes(span.get("attributes")),
                        "links": [
                            (link["traceId"], link["spanId"]) for link in span.get("links", [])
                        ],
                        "status_code": _status_code(status),
                        "status_message": status.get("message", ""),
                        "kind": span.get("kind"),
                        "resource": resource,
                    }
                )
    return spans


def read_spans(path: str | Path) -> list[dict[str, Any]]:
    """Every span in the JSONL trace file at ``path``, in file order, as flat dicts.

    Keys: ``name``, ``trace_id`` (32 hex), ``span_id`` (16 hex), ``parent_id``
    (16 hex, ``None`` for a root), ``start_ns`` / ``end_ns`` (ints),
    ``attributes`` (plain dict), ``links`` (list of ``(trace_id, span_id)``),
    ``status_code`` (``"UNSET"``, ``"OK"`` or ``"ERROR"``), ``status_message``,
    ``kind`` and ``resource`` (plain dict of the resource attributes).

    Blank lines are skipped, and so is a line that is not valid JSON when it is
    the last one (a write cut short by SIGKILL); a bad line anywhere else means
    the file is damaged and raises ``ValueError`` naming the line.
    """
    lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    spans: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break  # truncated final write
            raise ValueError(f"{path}: line {number} is not valid JSON: {exc}") from exc
        spans.extend(_flatten_request(request))
    return spans


def incarnations(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group spans by ``pretrain()`` call: each startup span and the intervals chained to it.

    Returns ``[{"startup": span or None, "intervals": [C0, C1, ...]}]``, one
    entry per ``megatron.startup`` in file order, following the links
    (C0 -> startup, C(k) -> C(k-1)). Intervals whose chain does not reach a
    startup in the file (its trace lost, or the ``job`` span group was off at
    startup) form entries of their own with ``startup`` None.
    """
    entries: list[dict[str, Any]] = []
    owner: dict[str, dict[str, Any]] = {}  # span id -> its entry
    for span in spans:
        if span["name"] == "megatron.startup":
            entry = {"startup": span, "intervals": []}
            owner[span["span_id"]] = entry
            entries.append(entry)
    intervals = [span for span in spans if span["name"] == "megatron.train"]
    linked_to = {
        span["span_id"]: span["links"][0][1] if span["links"] else None for span in intervals
    }
    # In start-time order every interval comes after the span it links to.
    for interval in sorted(intervals, key=lambda span: span["start_ns"]):
        entry = owner.get(linked_to[interval["span_id"]])
        if entry is None:
            entry = {"startup": None, "intervals": []}
            entries.append(entry)
        entry["intervals"].append(interval)
        owner[interval["span_id"]] = entry
    return entries


def ancestor_names(span: dict[str, Any], spans: list[dict[str, Any]]) -> list[str]:
    """Names of ``span``'s parent, grandparent, ... up to its trace's root."""
    by_id = {s["span_id"]: s for s in spans}
    names = []
    while span["parent_id"] is not None and span["parent_id"] in by_id:
        span = by_id[span["parent_id"]]
        names.append(span["name"])
    return names


def summarize(path: str | Path) -> str:
    """A few human-readable lines about the trace file: traces, spans by name, intervals."""
    spans = read_spans(path)
    by_name = Counter(span["name"] for span in spans)
    traces = {span["trace_id"] for span in spans}
    cut_short = sum(1 for span in spans if span["attributes"].get("megatron.span.cut_short"))
    errors = sum(1 for span in spans if span["status_code"] == "ERROR")
    width = max((len(name) for name in by_name), default=0)
    lines = [
        f"telemetry written to {path}",
        f"  runs (pretrain calls): {len(incarnations(spans))}   traces: {len(traces)}   "
        f"spans: {len(spans)}   intervals (megatron.train): {by_name.get('megatron.train', 0)}",
    ]
    metrics = metrics_file_for(Path(path))
    if metrics.exists():
        lines.append(f"  metrics: {metrics}")
    if cut_short or errors:
        lines.append(f"  spans cut short: {cut_short}   spans with ERROR status: {errors}")
    lines.append("  spans by name:")
    lines.extend(f"    {name:<{width}}  {count:>6}" for name, count in sorted(by_name.items()))
    return "\n".join(lines)
