"""Decode one OTLP/JSON trace line into span objects, at the speed of the JSON parser.

Reading a trace back is mostly JSON decoding: a ``per_step`` trace is about
300 bytes a span, millions of spans a day. The standard library's
``json.loads`` builds a dict for every span, attribute and value, and the
reader then walked those dicts again; that was most of the time of every
``megatron-trace`` command. So a line is decoded here with ``msgspec``
against a typed schema of the ``ExportTraceServiceRequest``: one C pass
straight into small slotted objects, skipping fields nobody reads, and
converting the decimal-string integers of the protobuf JSON mapping on the
way. ``msgspec`` was chosen over ``orjson``: ``orjson`` is a faster
``json.loads`` but still builds the dicts, while the typed decode avoids
them.

Without ``msgspec`` (it is an optional dependency: the ``trace`` extra) the
same objects are built from ``json.loads`` output by :func:`decode_python`;
every line ``msgspec`` rejects (a torn write, damage, or a value outside the
schema's exact types, such as a ``null`` where a string belongs) is decoded
that way too, so the result never depends on whether ``msgspec`` is
installed. The schema only uses types whose conversion both paths share:
strings, the integer rule below, and ``Any`` (the value as JSON gave it)
wherever the reader keeps a value as written.

Integers (timestamps, ``intValue``) follow the protobuf JSON mapping: a JSON
number or a string holding one, whose value is integral (``"1700000000"``,
``"1e3"``, ``"1.0"``); ``"1.5"`` is damage.

Consumers read spans through the attributes and methods of :class:`Span`
(``name``, ``trace_id``, ``span_id``, ``parent_span_id``,
``start_time_unix_nano``, ``end_time_unix_nano``, ``attribute_dict()``,
``attribute(key)``, ``link_pairs()`` ...), which both paths provide.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "FAST",
    "SpanBatch",
    "decode_any_value",
    "decode_attributes",
    "decode_fast",
    "decode_python",
    "otlp_int",
    "spans_with_links",
]

# OTLP status codes, as integers (protobuf JSON mapping) or enum names.
_STATUS_NAMES = {0: "UNSET", 1: "OK", 2: "ERROR"}


def decode_any_value(value: dict[str, Any] | None) -> Any:
    """Decode one OTLP ``AnyValue`` object (as JSON gave it) into a plain Python value."""
    if not value:
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return otlp_int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return [decode_any_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return decode_attributes(value["kvlistValue"].get("values", []))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def decode_attributes(key_values: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Decode an OTLP ``KeyValue`` list (as JSON gave it) into a plain dict."""
    return {kv["key"]: decode_any_value(kv.get("value")) for kv in key_values or []}


def otlp_int(value: Any) -> int:
    """An integer field of the protobuf JSON mapping: a number, or a string holding one.

    Accepts what ``msgspec`` accepts for an ``int`` field in its lax mode (a
    string in JSON number syntax whose value is integral), so both decoding
    paths agree; raises ``ValueError`` or ``TypeError`` otherwise.
    """
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                number = Decimal(value)
            except InvalidOperation:
                raise ValueError(f"not an integer: {value!r}") from None
            if not number.is_finite() or number != number.to_integral_value():
                raise ValueError(f"not an integer: {value!r}") from None
            return int(number)
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"not an integer: {value!r}")
    return int(value)


def _status_code(status: Any) -> str:
    code = (status or {}).get("code", 0)
    if isinstance(code, int):
        return _STATUS_NAMES.get(code, str(code))
    return str(code).removeprefix("STATUS_CODE_")


class SpanBatch:
    """The spans of one ``resourceSpans`` entry of a line, with its resource decoded once."""

    __slots__ = ("resource", "spans")

    def __init__(self, resource: dict[str, Any], spans: Sequence[Any]) -> None:
        self.resource = resource
        self.spans = spans


# -- the pure-Python path -----------------------------------------------------


class _PySpan:
    """A span of ``json.loads`` output, read like the ``msgspec`` one.

    Required fields are converted at once; attributes, links, events and
    status are kept as JSON gave them and decoded when asked for, as the
    ``msgspec`` path decodes values only when asked. So on a line both paths
    accept, both give the same values and raise at the same point.
    """

    __slots__ = (
        "_span",
        "end_time_unix_nano",
        "kind",
        "name",
        "parent_span_id",
        "span_id",
        "start_time_unix_nano",
        "status",
        "trace_id",
    )

    def __init__(self, span: dict[str, Any]) -> None:
        self._span = span
        self.name = span["name"]
        self.trace_id = span["traceId"]
        self.span_id = span["spanId"]
        self.parent_span_id = span.get("parentSpanId") or ""
        self.start_time_unix_nano = otlp_int(span["startTimeUnixNano"])
        self.end_time_unix_nano = otlp_int(span["endTimeUnixNano"])
        self.kind = span.get("kind")
        self.status = span.get("status")

    def attribute_dict(self) -> dict[str, Any]:
        return decode_attributes(self._span.get("attributes"))

    def attribute(self, key: str, default: Any = None) -> Any:
        found = default
        for kv in self._span.get("attributes") or []:
            if kv["key"] == key:
                found = decode_any_value(kv.get("value"))
        return found

    def has_attributes(self) -> bool:
        return bool(self._span.get("attributes"))

    def has_links(self) -> bool:
        return bool(self._span.get("links"))

    def link_pairs(self) -> list[tuple[str, str]]:
        return [(link["traceId"], link["spanId"]) for link in self._span.get("links") or []]

    def link_attribute_dicts(self) -> list[dict[str, Any]]:
        links = self._span.get("links") or []
        return [decode_attributes(link.get("attributes")) for link in links]

    def event_dicts(self) -> list[dict[str, Any]]:
        return [
            {
                "name": event.get("name", ""),
                "time_ns": otlp_int(event.get("timeUnixNano", 0)),
                "attributes": decode_attributes(event.get("attributes")),
            }
            for event in self._span.get("events") or []
        ]

    def status_code(self) -> str:
        return _status_code(self.status)

    def status_message(self) -> Any:
        return (self.status or {}).get("message", "")


def decode_python(request: Any) -> list[SpanBatch]:
    """The batches of one decoded request (``json.loads`` output).

    Raises ``KeyError``, ``TypeError``, ``ValueError`` or ``AttributeError``
    when the request is not an OTLP trace request.
    """
    batches = []
    for resource_spans in request["resourceSpans"]:
        resource = decode_attributes((resource_spans.get("resource") or {}).get("attributes"))
        spans = [
            _PySpan(span)
            for scope_spans in resource_spans.get("scopeSpans", [])
            for span in scope_spans.get("spans", [])
        ]
        batches.append(SpanBatch(resource, spans))
    return batches


# -- the msgspec path ---------------------------------------------------------

try:
    import msgspec
except ImportError:  # pragma: no cover - exercised by the fallback tests' environment
    msgspec = None  # type: ignore[assignment]

#: Whether the fast (``msgspec``) path is available.
FAST = msgspec is not None

if msgspec is not None:
    from msgspec import UNSET, Struct, UnsetType

    class _AnyValue(Struct, rename="camel", gc=False):
        # UNSET tells an absent field from a null one, as `in` does on the dict.
        string_value: Any = UNSET
        bool_value: Any = UNSET
        int_value: int | UnsetType = UNSET
        double_value: Any = UNSET
        array_value: Any = UNSET
        kvlist_value: Any = UNSET
        bytes_value: Any = UNSET

    class _KeyValue(Struct, gc=False):
        key: str
        value: _AnyValue | None = None

    def _value(value: _AnyValue | None) -> Any:
        if value is None:
            return None
        if value.string_value is not UNSET:
            return value.string_value
        if value.bool_value is not UNSET:
            return bool(value.bool_value)
        if value.int_value is not UNSET:
            return value.int_value
        if value.double_value is not UNSET:
            return float(value.double_value)
        if value.array_value is not UNSET:
            return [decode_any_value(v) for v in value.array_value.get("values", [])]
        if value.kvlist_value is not UNSET:
            return decode_attributes(value.kvlist_value.get("values", []))
        if value.bytes_value is not UNSET:
            return value.bytes_value
        return None

    def _attribute_dict(key_values: tuple[_KeyValue, ...]) -> dict[str, Any]:
        return {kv.key: _value(kv.value) for kv in key_values}

    # Sequences are tuples: an absent one is the shared empty tuple, and a
    # tuple of untracked objects leaves the cyclic GC nothing to scan.
    class _Link(Struct, rename="camel", gc=False):
        trace_id: str
        span_id: str
        attributes: tuple[_KeyValue, ...] = ()

    class _Event(Struct, rename="camel", gc=False):
        name: Any = ""
        time_unix_nano: int = 0
        attributes: tuple[_KeyValue, ...] = ()

    class Span(Struct, rename="camel", gc=False):
        """One OTLP/JSON span; the fields ``megatron-trace`` reads, the rest skipped."""

        trace_id: str
        span_id: str
        name: str
        start_time_unix_nano: int
        end_time_unix_nano: int
        parent_span_id: str = ""
        kind: Any = None
        attributes: tuple[_KeyValue, ...] = ()
        links: tuple[_Link, ...] = ()
        events: tuple[_Event, ...] = ()
        status: Any = None

        def attribute_dict(self) -> dict[str, Any]:
            return _attribute_dict(self.attributes)

        def attribute(self, key: str, default: Any = None) -> Any:
            # the last of duplicate keys wins, as in the dict
            found = default
            for kv in self.attributes:
                if kv.key == key:
                    found = _value(kv.value)
            return found

        def has_attributes(self) -> bool:
            return bool(self.attributes)

        def has_links(self) -> bool:
            return bool(self.links)

        def link_pairs(self) -> list[tuple[str, str]]:
            return [(link.trace_id, link.span_id) for link in self.links]

        def link_attribute_dicts(self) -> list[dict[str, Any]]:
            return [_attribute_dict(link.attributes) for link in self.links]

        def event_dicts(self) -> list[dict[str, Any]]:
            return [
                {
                    "name": event.name,
                    "time_ns": event.time_unix_nano,
                    "attributes": _attribute_dict(event.attributes),
                }
                for event in self.events
            ]

        def status_code(self) -> str:
            return _status_code(self.status)

        def status_message(self) -> Any:
            return (self.status or {}).get("message", "")

    class _Resource(Struct, gc=False):
        attributes: tuple[_KeyValue, ...] = ()

    class _ScopeSpans(Struct, gc=False):
        spans: tuple[Span, ...] = ()

    class _ResourceSpans(Struct, rename="camel", gc=False):
        resource: _Resource | None = None
        scope_spans: tuple[_ScopeSpans, ...] = ()

    class _Request(Struct, rename="camel", gc=False):
        resource_spans: tuple[_ResourceSpans, ...]

    _decode_request = msgspec.json.Decoder(_Request, strict=False).decode
    _DecodeError: type[Exception] = msgspec.DecodeError
    _Span: type | None = Span
else:  # pragma: no cover
    _decode_request = None
    _DecodeError = ValueError
    _Span = None


def spans_with_links(spans: Sequence[Any]) -> list[Any]:
    """The spans of a batch that have links (a hot filter: one attribute test per span)."""
    if spans and _Span is not None and type(spans[0]) is _Span:
        return [span for span in spans if span.links]
    return [span for span in spans if span.has_links()]


def decode_fast(raw: bytes) -> list[SpanBatch] | None:
    """The batches of one line via ``msgspec``; ``None`` when it cannot (use the slow path)."""
    if _decode_request is None:
        return None
    try:
        request = _decode_request(raw)
    except _DecodeError:
        return None
    batches = []
    for resource_spans in request.resource_spans:
        resource = resource_spans.resource
        attributes = _attribute_dict(resource.attributes) if resource is not None else {}
        scopes = resource_spans.scope_spans
        if len(scopes) == 1:
            spans = scopes[0].spans
        else:
            spans = [span for scope in scopes for span in scope.spans]
        batches.append(SpanBatch(attributes, spans))
    return batches


def loads(raw: bytes) -> Any:
    """``json.loads`` of one line's bytes, as the reader always decoded them."""
    return json.loads(raw.decode("utf-8", errors="replace"))
