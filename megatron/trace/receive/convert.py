"""Export requests, as the wire carries them, into the OTLP/JSON the files hold.

Protobuf bodies (gRPC, and OTLP/HTTP's ``application/x-protobuf``) are parsed
with the OTLP protos and turned into protobuf's canonical JSON mapping, with
the two changes the OTLP/JSON encoding makes to it: enums as their numbers (a
span's ``kind``, a status ``code``) and trace and span ids as hex strings,
where the mapping gives bytes fields as base64. The mapping is protobuf's own
``json_format.MessageToDict``'s, field for field (the fields set, by their
JSON names; 64-bit integers as strings; non-finite doubles as ``"NaN"``,
``"Infinity"``); walked here over ``ListFields()`` with what each field
needs worked out once per field (:func:`to_json`), since ``MessageToDict``'s
generality cost three quarters of the receiver's CPU per span. A message type
with a field this walk does not map as ``MessageToDict`` would (a ``float``,
a map, a well-known type) goes through ``MessageToDict`` itself. OTLP/HTTP JSON bodies
(``application/json``) are already in that encoding: they are decoded and
checked for the request's one field, not rewritten.
"""

from __future__ import annotations

import base64
import json
import threading
from typing import Any

from megatron.trace.receive.files import KINDS
from megatron.trace_format.errors import MissingExtraError, TraceInputError

__all__ = [
    "ID_FIELDS",
    "from_json",
    "from_protobuf",
    "reference_json",
    "request_types",
    "to_json",
]

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


def reference_json(message: Any) -> dict[str, Any]:
    """A parsed export request as OTLP/JSON through ``json_format.MessageToDict``: what
    :func:`to_json` gives, more slowly (and where it cannot)."""
    from google.protobuf import json_format

    return _hex_ids(json_format.MessageToDict(message, use_integers_for_enums=True))


def to_json(message: Any) -> dict[str, Any]:
    """A parsed export request as OTLP/JSON (camelCase names, enums as numbers, hex ids)."""
    descriptor = message.DESCRIPTOR
    ready = _READY.get(descriptor)
    if ready is None:  # the first request of this type: its fields' ways, once, in one thread
        with _PREPARING:
            ready = _READY[descriptor] = _walkable(descriptor)
    return _walk(message) if ready else reference_json(message)


#: Request type -> whether it is walked; set only once all its fields' ways are known (the
#: servers convert from several threads at once).
_READY: dict[Any, bool] = {}
_PREPARING = threading.Lock()
_WALKABLE: dict[Any, bool] = {}
#: FieldDescriptor -> (JSON name, how its value converts: one of the _AS_* below, repeated)
_FIELDS: dict[Any, tuple[str, int, bool]] = {}
_AS_IS, _AS_STRING, _AS_DOUBLE, _AS_BASE64, _AS_HEX, _AS_MESSAGE = range(6)


def _walkable(descriptor: Any) -> bool:
    """Whether every field of ``descriptor`` (and of the messages within) maps as
    ``MessageToDict`` maps it in :func:`_walk`; each field's way, worked out once."""
    known = _WALKABLE.get(descriptor)
    if known is not None:
        return known
    from google.protobuf.descriptor import FieldDescriptor as F

    _WALKABLE[descriptor] = True  # (a recursive type: assumed, then checked below)
    walkable = True
    for field in descriptor.fields:
        repeated = (
            field.is_repeated  # (protobuf 6.32 on; its label attribute is gone in 7)
            if hasattr(field, "is_repeated")
            else field.label == F.LABEL_REPEATED
        )
        if field.type == F.TYPE_MESSAGE:
            nested = field.message_type
            if nested.GetOptions().map_entry or nested.full_name.startswith("google.protobuf."):
                walkable = False
                break
            walkable = _walkable(nested)
            way = _AS_MESSAGE
        elif field.type in (F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64,
                            F.TYPE_SINT64):  # fmt: skip
            way = _AS_STRING
        elif field.type == F.TYPE_DOUBLE:
            way = _AS_DOUBLE
        elif field.type == F.TYPE_BYTES:
            way = _AS_HEX if field.json_name in ID_FIELDS else _AS_BASE64
        elif field.type == F.TYPE_FLOAT or field.type == F.TYPE_GROUP:
            walkable = False
        else:  # strings, bools, 32-bit integers, enums (as their numbers)
            way = _AS_IS
        if not walkable:
            break
        _FIELDS[field] = (field.json_name, way, repeated)
    _WALKABLE[descriptor] = walkable
    return walkable


def _double(value: float) -> float | str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _walk(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    fields = _FIELDS
    for field, value in message.ListFields():
        name, way, repeated = fields[field]
        if way == _AS_MESSAGE:
            out[name] = [_walk(v) for v in value] if repeated else _walk(value)
        elif way == _AS_IS:
            out[name] = list(value) if repeated else value
        elif way == _AS_STRING:
            out[name] = [str(v) for v in value] if repeated else str(value)
        elif way == _AS_HEX:
            out[name] = [v.hex() for v in value] if repeated else value.hex()
        elif way == _AS_DOUBLE:
            out[name] = [_double(v) for v in value] if repeated else _double(value)
        else:
            encode = base64.b64encode
            out[name] = [encode(v).decode() for v in value] if repeated else encode(value).decode()
    return out


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
