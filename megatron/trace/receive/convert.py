"""Export requests, as the wire carries them, into the OTLP/JSON the files hold.

Protobuf bodies (gRPC, and OTLP/HTTP's ``application/x-protobuf``) are parsed
with the OTLP protos and turned into JSON by protobuf's own
``json_format``, with the two changes the OTLP/JSON encoding makes to
protobuf's canonical JSON mapping: enums as their numbers (a span's ``kind``,
a status ``code``) and trace and span ids as hex strings, where
``json_format`` gives bytes fields as base64. OTLP/HTTP JSON bodies
(``application/json``) are already in that encoding: they are decoded and
checked for the request's one field, not rewritten.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from megatron.trace.receive.files import KINDS
from megatron.trace_format.errors import MissingExtraError, TraceInputError

__all__ = ["ID_FIELDS", "from_json", "from_protobuf", "request_types", "to_json"]

#: The bytes fields of the OTLP messages that OTLP/JSON writes as hex.
ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId"})


def request_types() -> dict[str, Any]:
    """Signal -> (request class, response class), from opentelemetry-proto."""
    try:
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    except ImportError:
        raise MissingExtraError("receive", "opentelemetry-proto", "receive") from None
    return {
        "traces": (
            trace_service_pb2.ExportTraceServiceRequest,
            trace_service_pb2.ExportTraceServiceResponse,
        ),
        "metrics": (
            metrics_service_pb2.ExportMetricsServiceRequest,
            metrics_service_pb2.ExportMetricsServiceResponse,
        ),
        "logs": (
            logs_service_pb2.ExportLogsServiceRequest,
            logs_service_pb2.ExportLogsServiceResponse,
        ),
    }


def _hex_ids(value: Any) -> Any:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ID_FIELDS and isinstance(item, str):
                value[key] = base64.b64decode(item).hex()
            elif isinstance(item, (dict, list)):
                _hex_ids(item)
    elif isinstance(value, list):
        for item in value:
            _hex_ids(item)
    return value


def to_json(message: Any) -> dict[str, Any]:
    """A parsed export request as OTLP/JSON (camelCase names, enums as numbers, hex ids)."""
    from google.protobuf import json_format

    return _hex_ids(json_format.MessageToDict(message, use_integers_for_enums=True))


def from_protobuf(kind: str, body: bytes) -> dict[str, Any]:
    """An OTLP/HTTP protobuf body of ``kind`` (a key of :data:`KINDS`) as OTLP/JSON."""
    from google.protobuf.message import DecodeError

    request = request_types()[kind][0]()
    try:
        request.ParseFromString(body)
    except DecodeError as error:
        raise TraceInputError(f"not an OTLP {kind} export request (protobuf): {error}") from None
    return to_json(request)


def from_json(kind: str, body: bytes) -> dict[str, Any]:
    """An OTLP/HTTP JSON body of ``kind``, checked to be an export request of that signal."""
    key = KINDS[kind][0]
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TraceInputError(f"not an OTLP {kind} export request (JSON): {error}") from None
    if not isinstance(request, dict) or not isinstance(request.get(key, []), list):
        raise TraceInputError(f"not an OTLP {kind} export request (JSON): no {key!r} list")
    return request
