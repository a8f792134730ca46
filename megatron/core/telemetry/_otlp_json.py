"""Encoding SDK spans and metrics as OTLP/JSON, with the standard library only.

The OpenTelemetry file exporter writes one ``ExportTraceServiceRequest`` (or
``ExportMetricsServiceRequest``) per line in the protobuf JSON mapping that
OTLP/HTTP+JSON uses: camelCase field names, 64-bit integers as decimal
strings, trace and span ids as lowercase hex, enums as integers. Collectors
(``otlpjsonfile`` receiver) and other OTLP tools read it as is.

Written by hand rather than through ``opentelemetry-exporter-otlp`` because
that package (and protobuf with it) is an optional extra, while the jsonl file
is the default sink and must always work.
"""

from __future__ import annotations

import math
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

__all__ = ["encode_metrics", "encode_spans"]

_Json = dict[str, Any]


def _trace_id(value: int) -> str:
    return format(value, "032x")


def _span_id(value: int) -> str:
    return format(value, "016x")


def _double(value: float) -> float | str:
    """A JSON-safe double: the protobuf JSON mapping spells non-finite values."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _any_value(value: Any) -> _Json:
    # bool before int: bool is an int subclass.
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": _double(value)}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bytes):
        return {"stringValue": value.decode("utf-8", "replace")}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [_any_value(item) for item in value]}}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": _key_values(value)}}
    return {"stringValue": str(value)}


def _key_values(attributes: Mapping[str, Any] | None) -> list[_Json]:
    if not attributes:
        return []
    return [{"key": str(key), "value": _any_value(value)} for key, value in attributes.items()]


def _resource(resource: Resource) -> _Json:
    return {"attributes": _key_values(resource.attributes)}


def _scope(scope: InstrumentationScope | None) -> _Json:
    if scope is None:
        return {"name": ""}
    encoded: _Json = {"name": scope.name, "version": scope.version or ""}
    attributes = getattr(scope, "attributes", None)
    if attributes:
        encoded["attributes"] = _key_values(attributes)
    return encoded


def _span(span: ReadableSpan) -> _Json:
    context = span.context
    parent = span.parent
    encoded: _Json = {
        "traceId": _trace_id(context.trace_id),
        "spanId": _span_id(context.span_id),
        "parentSpanId": _span_id(parent.span_id) if parent is not None else "",
        "name": span.name,
        # The SDK's SpanKind starts at INTERNAL=0; OTLP reserves 0 for
        # UNSPECIFIED, so every kind is one higher on the wire.
        "kind": span.kind.value + 1,
        "startTimeUnixNano": str(span.start_time or 0),
        "endTimeUnixNano": str(span.end_time or 0),
        "attributes": _key_values(span.attributes),
        "events": [
            {
                "timeUnixNano": str(event.timestamp),
                "name": event.name,
                "attributes": _key_values(event.attributes),
            }
            for event in span.events
        ],
        "links": [
            {
                "traceId": _trace_id(link.context.trace_id),
                "spanId": _span_id(link.context.span_id),
                "attributes": _key_values(link.attributes),
            }
            for link in span.links
        ],
        "status": _status(span),
    }
    trace_state = context.trace_state.to_header() if context.trace_state else ""
    if trace_state:
        encoded["traceState"] = trace_state
    for field, count in (
        ("droppedAttributesCount", span.dropped_attributes),
        ("droppedEventsCount", span.dropped_events),
        ("droppedLinksCount", span.dropped_links),
    ):
        if count:
            encoded[field] = count
    return encoded


def _status(span: ReadableSpan) -> _Json:
    status = span.status
    # SDK StatusCode values (UNSET=0, OK=1, ERROR=2) equal OTLP's.
    encoded: _Json = {"code": status.status_code.value}
    if status.description:
        encoded["message"] = status.description
    return encoded


def encode_spans(spans: Iterable[ReadableSpan]) -> _Json:
    """One ``ExportTraceServiceRequest``: spans grouped by resource, then scope."""
    # Keyed by identity: every span of one provider shares one Resource object.
    by_resource: dict[int, tuple[Resource, dict[Any, list[_Json]]]] = {}
    for span in spans:
        _, scopes = by_resource.setdefault(id(span.resource), (span.resource, {}))
        scopes.setdefault(span.instrumentation_scope, []).append(_span(span))
    resource_spans = []
    for resource, scopes in by_resource.values():
        scope_spans = []
        for scope, encoded in scopes.items():
            entry: _Json = {"scope": _scope(scope), "spans": encoded}
            if scope is not None and scope.schema_url:
                entry["schemaUrl"] = scope.schema_url
            scope_spans.append(entry)
        resource_entry: _Json = {"resource": _resource(resource), "scopeSpans": scope_spans}
        if resource.schema_url:
            resource_entry["schemaUrl"] = resource.schema_url
        resource_spans.append(resource_entry)
    return {"resourceSpans": resource_spans}


def _number_point(point: Any) -> _Json:
    encoded = _point_common(point)
    if isinstance(point.value, int) and not isinstance(point.value, bool):
        encoded["asInt"] = str(point.value)
    else:
        encoded["asDouble"] = _double(float(point.value))
    return encoded


def _point_common(point: Any) -> _Json:
    encoded: _Json = {
        "attributes": _key_values(point.attributes),
        "startTimeUnixNano": str(point.start_time_unix_nano or 0),
        "timeUnixNano": str(point.time_unix_nano),
    }
    exemplars = getattr(point, "exemplars", None)
    if exemplars:
        encoded["exemplars"] = [_exemplar(exemplar) for exemplar in exemplars]
    return encoded


def _exemplar(exemplar: Any) -> _Json:
    encoded: _Json = {
        "filteredAttributes": _key_values(exemplar.filtered_attributes),
        "timeUnixNano": str(exemplar.time_unix_nano),
    }
    if isinstance(exemplar.value, int) and not isinstance(exemplar.value, bool):
        encoded["asInt"] = str(exemplar.value)
    else:
        encoded["asDouble"] = _double(float(exemplar.value))
    if exemplar.span_id:
        encoded["spanId"] = _span_id(exemplar.span_id)
    if exemplar.trace_id:
        encoded["traceId"] = _trace_id(exemplar.trace_id)
    return encoded


def _histogram_point(point: Any) -> _Json:
    encoded = _point_common(point)
    encoded["count"] = str(point.count)
    encoded["sum"] = _double(float(point.sum))
    encoded["bucketCounts"] = [str(count) for count in point.bucket_counts]
    encoded["explicitBounds"] = [_double(float(bound)) for bound in point.explicit_bounds]
    if point.count:
        encoded["min"] = _double(float(point.min))
        encoded["max"] = _double(float(point.max))
    return encoded


def _exponential_point(point: Any) -> _Json:
    encoded = _point_common(point)
    encoded.update(
        {
            "count": str(point.count),
            "sum": _double(float(point.sum)),
            "scale": point.scale,
            "zeroCount": str(point.zero_count),
            "positive": {
                "offset": point.positive.offset,
                "bucketCounts": [str(count) for count in point.positive.bucket_counts],
            },
            "negative": {
                "offset": point.negative.offset,
                "bucketCounts": [str(count) for count in point.negative.bucket_counts],
            },
        }
    )
    if point.flags:
        encoded["flags"] = point.flags
    if point.count:
        encoded["min"] = _double(float(point.min))
        encoded["max"] = _double(float(point.max))
    return encoded


def _metric(metric: Any) -> _Json | None:
    data = metric.data
    encoded: _Json = {
        "name": metric.name,
        "description": metric.description or "",
        "unit": metric.unit or "",
    }
    if isinstance(data, Gauge):
        encoded["gauge"] = {"dataPoints": [_number_point(p) for p in data.data_points]}
    elif isinstance(data, Sum):
        encoded["sum"] = {
            "dataPoints": [_number_point(p) for p in data.data_points],
            "aggregationTemporality": data.aggregation_temporality.value,
            "isMonotonic": data.is_monotonic,
        }
    elif isinstance(data, Histogram):
        encoded["histogram"] = {
            "dataPoints": [_histogram_point(p) for p in data.data_points],
            "aggregationTemporality": data.aggregation_temporality.value,
        }
    elif isinstance(data, ExponentialHistogram):
        encoded["exponentialHistogram"] = {
            "dataPoints": [_exponential_point(p) for p in data.data_points],
            "aggregationTemporality": data.aggregation_temporality.value,
        }
    else:
        return None
    if not data.data_points:
        return None
    return encoded


def encode_metrics(metrics_data: MetricsData) -> _Json:
    """One ``ExportMetricsServiceRequest``; metrics without points are left out."""
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
    return {"resourceMetrics": resource_metrics}


# ---------------------------------------------------------------------------
# Logs: ExportLogsServiceRequest, for the log bridge's logs.jsonl.
#
# Spelled exactly as the official opentelemetry-exporter-otlp-json-common
# encoder spells it (a conformance test compares the two): fields holding
# their protobuf default (0, "", empty list) are left out, message fields
# (resource, scope, body) are always present, bytes are base64, and a value
# of a type OTLP cannot carry is stringified rather than failing the batch.
# Kept apart from the span/metric helpers above, which spell defaults out.
# ---------------------------------------------------------------------------

__all__.append("encode_logs")


def _log_value(value: Any) -> _Json:
    # bool before int (a subclass); str and bytes before Sequence.
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
        import base64

        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Sequence):
        return {"arrayValue": _without_defaults({"values": [_log_value(v) for v in value]})}
    if isinstance(value, Mapping):
        return {"kvlistValue": _without_defaults({"values": _log_key_values(value)})}
    return {"stringValue": str(value)}


def _log_key_values(attributes: Mapping[str, Any] | None) -> list[_Json]:
    return [
        _without_defaults({"key": str(key)}) | {"value": _log_value(value)}
        for key, value in (attributes or {}).items()
    ]


def _without_defaults(fields: _Json) -> _Json:
    """Drop fields at their protobuf default, as the protobuf JSON mapping does."""
    return {key: value for key, value in fields.items() if value not in (None, 0, "", [])}


def _log_scope(scope: InstrumentationScope | None) -> _Json:
    if scope is None:
        return {}
    return _without_defaults(
        {
            "name": scope.name,
            "version": scope.version,
            "attributes": _log_key_values(getattr(scope, "attributes", None)),
        }
    )


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
            "attributes": _log_key_values(record.attributes),
            "droppedAttributesCount": readable.dropped_attributes,
            "flags": int(record.trace_flags) if record.trace_flags else None,
            "traceId": _trace_id(record.trace_id) if record.trace_id else None,
            "spanId": _span_id(record.span_id) if record.span_id else None,
            "eventName": getattr(record, "event_name", None),
        }
    )
    encoded["body"] = _log_value(record.body)
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
            entry = {"scope": _log_scope(scope)}
            entry |= _without_defaults(
                {"logRecords": encoded, "schemaUrl": scope.schema_url if scope else None}
            )
            scope_logs.append(entry)
        entry = {
            "resource": _without_defaults({"attributes": _log_key_values(resource.attributes)})
        }
        entry |= _without_defaults({"scopeLogs": scope_logs, "schemaUrl": resource.schema_url})
        resource_logs.append(entry)
    return _without_defaults({"resourceLogs": resource_logs})
