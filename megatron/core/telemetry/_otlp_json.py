"""Encoding SDK spans and metrics as OTLP/JSON, with the standard library only.

The OpenTelemetry file exporter writes one ``ExportTraceServiceRequest`` (or
``ExportMetricsServiceRequest``) per line in the protobuf JSON mapping that
OTLP/HTTP+JSON uses: camelCase field names, 64-bit integers as decimal
strings, trace and span ids as lowercase hex, enums as integers, and fields
that hold their default value (empty string, zero, empty list, unset
``optional``) left out.

The output is the same dict, key for key and in the same order, as the
official encoder (``opentelemetry-exporter-otlp-json-common``, whose
``to_dict`` the official file exporter dumps), so our lines and theirs are
interchangeable byte for byte up to JSON string escaping;
``tests/core/telemetry/test_otlp_json.py`` checks that on every field
either side writes. Where that encoder makes a choice the OTLP spec leaves
open, we make the same one, and say so at the spot.

Written by hand rather than taken from that package because it is a beta
(0.x) that pins the SDK to one minor version, and because this one is
faster (``encode_ratio_vs_official`` in ``tests/benchmarks``): the jsonl
file is the default sink and must always work, cheaply.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import (
    ExponentialHistogram,
    Gauge,
    Histogram,
    MetricsData,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext

__all__ = ["encode_metrics", "encode_spans"]

_Json = dict[str, Any]

# Span and link ``flags``: bit 8 says bit 9 is meaningful, bit 9 says the
# parent (or linked) context is remote. The low byte may carry W3C trace
# flags; the official encoder leaves it zero, and so do we.
_FLAGS_HAS_IS_REMOTE = 0x100
_FLAGS_IS_REMOTE = 0x200


def _trace_id(value: int) -> str:
    return format(value, "032x")


def _span_id(value: int) -> str:
    return format(value, "016x")


def _double(value: float) -> float | str:
    """A JSON-safe double: the protobuf JSON mapping spells non-finite values.

    An ``int`` passes through unchanged (as a JSON integer), as in the
    official encoder: the two parse to the same double.
    """
    if value - value == 0:  # finite: inf - inf and nan - nan are nan
        return value
    if value != value:
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _any_value(value: Any) -> _Json:
    # Exact types first (what the SDK stores), then the official encoder's
    # isinstance order: bool before int, because bool is an int subclass.
    kind = type(value)
    if kind is str:
        return {"stringValue": value}
    if kind is int:
        return {"intValue": str(value)}
    if kind is float:
        return {"doubleValue": _double(value)}
    if kind is bool:
        return {"boolValue": value}
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": _double(value)}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Sequence):
        if not value:
            return {"arrayValue": {}}
        return {"arrayValue": {"values": [_any_value(item) for item in value]}}
    if isinstance(value, Mapping):
        if not value:
            return {"kvlistValue": {}}
        return {"kvlistValue": {"values": _key_values(value)}}
    return {"stringValue": str(value)}


def _key_values(attributes: Mapping[str, Any] | None) -> list[_Json]:
    if not attributes:
        return []
    encoded = []
    append = encoded.append
    for key, value in attributes.items():
        # The common scalar types inline: this loop is most of the encoding time.
        kind = type(value)
        if kind is str:
            any_value: _Json = {"stringValue": value}
        elif kind is int:
            any_value = {"intValue": str(value)}
        elif kind is bool:
            any_value = {"boolValue": value}
        elif kind is float:
            any_value = {"doubleValue": value if value - value == 0 else _double(value)}
        else:
            any_value = _any_value(value)
        # An empty key is a default value too (the SDK never stores one).
        append({"key": key, "value": any_value} if key else {"value": any_value})
    return encoded


def _resource(resource: Resource) -> _Json:
    attributes = resource.attributes
    return {"attributes": _key_values(attributes)} if attributes else {}


def _scope(scope: InstrumentationScope | None) -> _Json:
    encoded: _Json = {}
    if scope is None:
        return encoded
    if scope.name:
        encoded["name"] = scope.name
    if scope.version:
        encoded["version"] = scope.version
    attributes = scope.attributes
    if attributes:
        encoded["attributes"] = _key_values(attributes)
    return encoded


def _flags(context: SpanContext | None) -> int:
    if context is not None and context.is_remote:
        return _FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE
    return _FLAGS_HAS_IS_REMOTE


def _span(span: ReadableSpan) -> _Json:
    context = span.context
    encoded: _Json = {
        "traceId": format(context.trace_id, "032x"),
        "spanId": format(context.span_id, "016x"),
    }
    trace_state = context.trace_state
    if trace_state:
        encoded["traceState"] = trace_state.to_header()
    parent = span.parent
    if parent is None:
        encoded["flags"] = _FLAGS_HAS_IS_REMOTE
    else:
        encoded["parentSpanId"] = format(parent.span_id, "016x")
        encoded["flags"] = _flags(parent)
    if span.name:
        encoded["name"] = span.name
    # The SDK's SpanKind starts at INTERNAL=0; OTLP reserves 0 for
    # UNSPECIFIED, so every kind is one higher on the wire (and never omitted).
    encoded["kind"] = span.kind.value + 1
    if span.start_time:
        encoded["startTimeUnixNano"] = str(span.start_time)
    if span.end_time:
        encoded["endTimeUnixNano"] = str(span.end_time)
    attributes = span.attributes
    if attributes:
        encoded["attributes"] = _key_values(attributes)
    if span.dropped_attributes:
        encoded["droppedAttributesCount"] = span.dropped_attributes
    events = span.events
    if events:
        encoded["events"] = [_event(event) for event in events]
    if span.dropped_events:
        encoded["droppedEventsCount"] = span.dropped_events
    links = span.links
    if links:
        encoded["links"] = [_link(link) for link in links]
    if span.dropped_links:
        encoded["droppedLinksCount"] = span.dropped_links
    encoded["status"] = _status(span)
    return encoded


def _event(event: Any) -> _Json:
    encoded: _Json = {}
    if event.timestamp:
        encoded["timeUnixNano"] = str(event.timestamp)
    if event.name:
        encoded["name"] = event.name
    if event.attributes:
        encoded["attributes"] = _key_values(event.attributes)
    if event.dropped_attributes:
        encoded["droppedAttributesCount"] = event.dropped_attributes
    return encoded


def _link(link: Any) -> _Json:
    # The linked context's trace state is not written: the official encoder
    # leaves it out, and a reader cannot tell the difference.
    context = link.context
    encoded: _Json = {
        "traceId": format(context.trace_id, "032x"),
        "spanId": format(context.span_id, "016x"),
    }
    if link.attributes:
        encoded["attributes"] = _key_values(link.attributes)
    if link.dropped_attributes:
        encoded["droppedAttributesCount"] = link.dropped_attributes
    encoded["flags"] = _flags(context)
    return encoded


def _status(span: ReadableSpan) -> _Json:
    # ``{}`` for UNSET without a message: both fields are defaults. SDK
    # StatusCode values (UNSET=0, OK=1, ERROR=2) equal OTLP's.
    status = span.status
    encoded: _Json = {}
    if status.description:
        encoded["message"] = status.description
    code = status.status_code.value
    if code:
        encoded["code"] = code
    return encoded


def _canonical(value: Any, seen: dict[int, tuple[Any, Any]], distinct: list[Any]) -> Any:
    """The first object equal to ``value`` met in this request.

    Spans of one resource (or scope) are grouped by equality, as the
    official encoder does, but its ``Resource.__hash__`` serialises every
    attribute, per span. Here each distinct object is compared once; the
    SDK hands every span of a provider the same object, so that is one
    dict lookup per span.
    """
    entry = seen.get(id(value))
    if entry is not None:
        return entry[1]
    for candidate in distinct:
        if candidate == value:
            break
    else:
        candidate = value
        distinct.append(value)
    # ``value`` is kept with its id, so the id cannot be reused by another
    # object during this call even if the caller's iterable lets spans go.
    seen[id(value)] = (value, candidate)
    return candidate


def encode_spans(spans: Iterable[ReadableSpan]) -> _Json:
    """One ``ExportTraceServiceRequest``: spans grouped by resource, then scope.

    Groups come in the order their first span does, as in the official encoder.
    """
    resources: dict[int, tuple[Any, Any]] = {}
    scopes: dict[int, tuple[Any, Any]] = {}
    distinct_resources: list[Resource] = []
    distinct_scopes: list[InstrumentationScope | None] = []
    # Keyed by the canonical objects' ids; each value keeps its object alive
    # for the duration of the call, so ids cannot be reused meanwhile.
    groups: dict[int, tuple[Resource, dict[int, tuple[Any, list[_Json]]]]] = {}
    for span in spans:
        resource = _canonical(span.resource, resources, distinct_resources)
        scope = span.instrumentation_scope
        scope = _canonical(scope, scopes, distinct_scopes) if scope is not None else None
        group = groups.get(id(resource))
        if group is None:
            group = groups[id(resource)] = (resource, {})
        scope_group = group[1].get(id(scope))
        if scope_group is None:
            scope_group = group[1][id(scope)] = (scope, [])
        scope_group[1].append(_span(span))
    resource_spans = []
    for resource, scope_groups in groups.values():
        scope_spans = []
        for scope, encoded in scope_groups.values():
            entry: _Json = {"scope": _scope(scope), "spans": encoded}
            if scope is not None and scope.schema_url:
                entry["schemaUrl"] = scope.schema_url
            scope_spans.append(entry)
        resource_entry: _Json = {"resource": _resource(resource), "scopeSpans": scope_spans}
        if resource.schema_url:
            resource_entry["schemaUrl"] = resource.schema_url
        resource_spans.append(resource_entry)
    if not resource_spans:
        return {}
    return {"resourceSpans": resource_spans}


def _number_value(encoded: _Json, value: int | float) -> None:
    # As the official encoder: any int (a bool included) is ``asInt``.
    if isinstance(value, int):
        encoded["asInt"] = str(value)
    else:
        encoded["asDouble"] = _double(value)


def _point_head(point: Any, with_start: bool = True) -> _Json:
    encoded: _Json = {}
    if point.attributes:
        encoded["attributes"] = _key_values(point.attributes)
    if with_start and point.start_time_unix_nano:
        encoded["startTimeUnixNano"] = str(point.start_time_unix_nano)
    if point.time_unix_nano:
        encoded["timeUnixNano"] = str(point.time_unix_nano)
    return encoded


def _exemplars(exemplars: Sequence[Any] | None) -> list[_Json]:
    encoded = []
    for exemplar in exemplars or ():
        entry: _Json = {}
        if exemplar.filtered_attributes:
            entry["filteredAttributes"] = _key_values(exemplar.filtered_attributes)
        if exemplar.time_unix_nano:
            entry["timeUnixNano"] = str(exemplar.time_unix_nano)
        # Both ids or neither, as the official encoder writes them.
        if exemplar.span_id is not None and exemplar.trace_id is not None:
            entry["spanId"] = _span_id(exemplar.span_id)
            entry["traceId"] = _trace_id(exemplar.trace_id)
        value = exemplar.value
        if isinstance(value, float):
            entry["asDouble"] = _double(value)
        else:
            entry["asInt"] = str(value)
        encoded.append(entry)
    return encoded


def _number_point(point: Any, with_start: bool) -> _Json:
    # Gauge points carry no start time in the official encoder (the OTLP
    # data model makes it optional for gauges); sums do.
    encoded = _point_head(point, with_start)
    exemplars = _exemplars(point.exemplars)
    if exemplars:
        encoded["exemplars"] = exemplars
    _number_value(encoded, point.value)
    return encoded


def _histogram_point(point: Any) -> _Json:
    encoded = _point_head(point)
    if point.count:
        encoded["count"] = str(point.count)
    if point.sum is not None:
        encoded["sum"] = _double(point.sum)
    if point.bucket_counts:
        encoded["bucketCounts"] = [str(count) for count in point.bucket_counts]
    if point.explicit_bounds:
        encoded["explicitBounds"] = [_double(bound) for bound in point.explicit_bounds]
    exemplars = _exemplars(point.exemplars)
    if exemplars:
        encoded["exemplars"] = exemplars
    if point.min is not None:
        encoded["min"] = _double(point.min)
    if point.max is not None:
        encoded["max"] = _double(point.max)
    return encoded


def _buckets(buckets: Any) -> _Json:
    encoded: _Json = {}
    if buckets.offset:
        encoded["offset"] = buckets.offset
    encoded["bucketCounts"] = [str(count) for count in buckets.bucket_counts]
    return encoded


def _exponential_point(point: Any) -> _Json:
    encoded = _point_head(point)
    if point.count:
        encoded["count"] = str(point.count)
    if point.sum is not None:
        encoded["sum"] = _double(point.sum)
    if point.scale:
        encoded["scale"] = point.scale
    if point.zero_count:
        encoded["zeroCount"] = str(point.zero_count)
    # A side without buckets is left out, offset and all: nothing lies there.
    if point.positive.bucket_counts:
        encoded["positive"] = _buckets(point.positive)
    if point.negative.bucket_counts:
        encoded["negative"] = _buckets(point.negative)
    if point.flags:
        encoded["flags"] = point.flags
    exemplars = _exemplars(point.exemplars)
    if exemplars:
        encoded["exemplars"] = exemplars
    if point.min is not None:
        encoded["min"] = _double(point.min)
    if point.max is not None:
        encoded["max"] = _double(point.max)
    return encoded


def _metric(metric: Any) -> _Json | None:
    data = metric.data
    if not data.data_points:
        return None
    encoded: _Json = {}
    if metric.name:
        encoded["name"] = metric.name
    if metric.description:
        encoded["description"] = metric.description
    if metric.unit:
        encoded["unit"] = metric.unit
    if isinstance(data, Gauge):
        encoded["gauge"] = {"dataPoints": [_number_point(p, False) for p in data.data_points]}
    elif isinstance(data, Sum):
        body: _Json = {"dataPoints": [_number_point(p, True) for p in data.data_points]}
        if data.aggregation_temporality:
            body["aggregationTemporality"] = data.aggregation_temporality.value
        if data.is_monotonic:
            body["isMonotonic"] = True
        encoded["sum"] = body
    elif isinstance(data, Histogram):
        body = {"dataPoints": [_histogram_point(p) for p in data.data_points]}
        if data.aggregation_temporality:
            body["aggregationTemporality"] = data.aggregation_temporality.value
        encoded["histogram"] = body
    elif isinstance(data, ExponentialHistogram):
        body = {"dataPoints": [_exponential_point(p) for p in data.data_points]}
        if data.aggregation_temporality:
            body["aggregationTemporality"] = data.aggregation_temporality.value
        encoded["exponentialHistogram"] = body
    else:
        return None
    return encoded


def encode_metrics(metrics_data: MetricsData) -> _Json:
    """One ``ExportMetricsServiceRequest``; ``{}`` when there is nothing to write.

    Metrics without points, and scopes and resources left empty by that, are
    left out; the official encoder would write them empty, but the SDK's
    readers never hand an exporter such a metric, so the two agree on
    everything a reader produces.
    """
    resource_metrics = []
    for rm in metrics_data.resource_metrics:
        scope_metrics = []
        for sm in rm.scope_metrics:
            encoded = [m for m in (_metric(metric) for metric in sm.metrics) if m is not None]
            if not encoded:
                continue
            entry: _Json = {"scope": _scope(sm.scope), "metrics": encoded}
            if sm.schema_url:
                entry["schemaUrl"] = sm.schema_url
            scope_metrics.append(entry)
        if not scope_metrics:
            continue
        entry = {"resource": _resource(rm.resource), "scopeMetrics": scope_metrics}
        if rm.schema_url:
            entry["schemaUrl"] = rm.schema_url
        resource_metrics.append(entry)
    if not resource_metrics:
        return {}
    return {"resourceMetrics": resource_metrics}


# ---------------------------------------------------------------------------
# Logs: ExportLogsServiceRequest, for the log bridge's logs.jsonl.
#
# Spelled exactly as the official opentelemetry-exporter-otlp-json-common
# encoder spells it (a conformance test compares the two): fields holding
# their protobuf default (0, "", empty list) are left out, message fields
# (resource, scope, body) are always present, bytes are base64, and a value
# of a type OTLP cannot carry is stringified rather than failing the batch;
# values, attributes, scopes and resources share the span encoder's helpers.
# ---------------------------------------------------------------------------

__all__.append("encode_logs")


def _without_defaults(fields: _Json) -> _Json:
    """Drop fields at their protobuf default, as the protobuf JSON mapping does."""
    return {key: value for key, value in fields.items() if value not in (None, 0, "", [])}


def _log_record(readable: Any) -> _Json:
    record = readable.log_record
    severity = record.severity_number
    encoded = _without_defaults(
        {
            "timeUnixNano": str(record.timestamp) if record.timestamp else None,
            "observedTimeUnixNano": (
                str(record.observed_timestamp) if record.observed_timestamp else None
            ),
            "severityNumber": severity.value if severity is not None else None,
            "severityText": record.severity_text,
            "attributes": _key_values(record.attributes),
            "droppedAttributesCount": readable.dropped_attributes,
            "flags": int(record.trace_flags) if record.trace_flags else None,
            "traceId": _trace_id(record.trace_id) if record.trace_id else None,
            "spanId": _span_id(record.span_id) if record.span_id else None,
            "eventName": getattr(record, "event_name", None),
        }
    )
    encoded["body"] = _any_value(record.body)
    return encoded


def encode_logs(records: Iterable[Any]) -> _Json:
    """One ``ExportLogsServiceRequest``: SDK ``ReadableLogRecord``s by resource, then scope."""
    by_resource: dict[Resource, dict[InstrumentationScope | None, list[_Json]]] = {}
    for readable in records:
        scopes = by_resource.setdefault(readable.resource, {})
        scope = readable.instrumentation_scope or None
        scopes.setdefault(scope, []).append(_log_record(readable))
    resource_logs = []
    for resource, scopes in by_resource.items():
        scope_logs = []
        for scope, encoded in scopes.items():
            entry = {"scope": _scope(scope)}
            entry |= _without_defaults(
                {"logRecords": encoded, "schemaUrl": scope.schema_url if scope else None}
            )
            scope_logs.append(entry)
        entry = {"resource": _resource(resource)}
        entry |= _without_defaults({"scopeLogs": scope_logs, "schemaUrl": resource.schema_url})
        resource_logs.append(entry)
    return _without_defaults({"resourceLogs": resource_logs})
