"""The receiver's protobuf-to-OTLP/JSON walk gives what ``json_format.MessageToDict`` gives.

Requests of all three signals, as the SDK's own OTLP encoders build them from
real SDK objects, with every kind of value OTLP carries (each attribute type,
arrays, key-value lists, bytes, events, links, statuses, histograms, a
non-finite double, a log body of each kind): :func:`to_json` must equal
:func:`reference_json` (``MessageToDict`` with the OTLP/JSON changes) exactly.
"""

from __future__ import annotations

import math

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from megatron.trace.receive.convert import reference_json, to_json

RESOURCE = Resource.create({"dl.rank": 3, "nemo.run.id": "job-7", "flag": True, "x": 1.5})
ATTRIBUTES = {
    "s": "text",
    "empty": "",
    "i": -(2**40),
    "zero": 0,
    "f": 0.1,
    "whole": 5.0,
    "b": False,
    "strings": ["a", "b"],
    "ints": [1, 2, 3],
    "floats": [1.5, float("nan")],
    "bools": [True, False],
}


def _spans() -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("scope", "1.0", schema_url="https://x/schema")
    with tracer.start_as_current_span("root", kind=SpanKind.SERVER, attributes=ATTRIBUTES) as root:
        root.add_event("an event", {"k": 1, "inf": float("inf")})
        root.add_event("bare")
        with tracer.start_as_current_span("child", links=[Link(root.get_span_context(), {"l": 2})]):
            pass
        failed = tracer.start_span("failed", kind=SpanKind.CLIENT)
        failed.set_status(Status(StatusCode.ERROR, "it broke"))
        failed.end()
        ok = tracer.start_span("ok")
        ok.set_status(Status(StatusCode.OK))
        ok.end()
    return list(memory.get_finished_spans())


def _metrics():
    reader = InMemoryMetricReader()
    meter = MeterProvider(resource=RESOURCE, metric_readers=[reader]).get_meter("m", "2")
    meter.create_counter("c", unit="1").add(3, {"a": "b"})
    meter.create_up_down_counter("u").add(-2)
    meter.create_histogram("h", unit="s").record(0.25, {"k": 1})
    meter.create_gauge("g").set(float("nan"))
    meter.create_gauge("g2").set(7)
    return reader.get_metrics_data()


def _logs():
    """A logs request built from the protos (the SDK's logs API is still experimental):
    a record of each body kind, with trace context, severity and attributes."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
    from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ProtoResource

    span = _spans()[0]
    bodies = [
        AnyValue(string_value="a line"),
        AnyValue(kvlist_value=KeyValueList(values=[_any_values()])),
        AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue()])),
        AnyValue(bytes_value=b"\x00\xffbytes"),
        AnyValue(double_value=math.nan),
        AnyValue(),
    ]
    records = [
        LogRecord(
            time_unix_nano=1_700_000_000_000_000_000 + n,
            observed_time_unix_nano=1_700_000_000_000_000_001,
            severity_number=9 + n,
            severity_text="INFO",
            body=body,
            attributes=[KeyValue(key="n", value=AnyValue(int_value=n))],
            flags=1,
            trace_id=span.context.trace_id.to_bytes(16, "big"),
            span_id=span.context.span_id.to_bytes(8, "big"),
        )
        for n, body in enumerate(bodies)
    ]
    resource = ProtoResource(attributes=[KeyValue(key="dl.rank", value=AnyValue(int_value=3))])
    scope = InstrumentationScope(name="logs", version="3")
    logs = ScopeLogs(scope=scope, log_records=records, schema_url="https://x")
    return ExportLogsServiceRequest(
        resource_logs=[ResourceLogs(resource=resource, scope_logs=[logs])]
    )


def _any_values() -> KeyValue:
    """An attribute holding every AnyValue kind, nested, and oneof members at defaults."""
    nested = KeyValueList(
        values=[
            KeyValue(key="zero", value=AnyValue(int_value=0)),
            KeyValue(key="false", value=AnyValue(bool_value=False)),
            KeyValue(key="empty", value=AnyValue(string_value="")),
            KeyValue(key="bytes", value=AnyValue(bytes_value=b"\x00\x01")),
            KeyValue(key="double", value=AnyValue(double_value=-math.inf)),
            KeyValue(key="unset", value=AnyValue()),
            KeyValue(key="list", value=AnyValue(array_value=ArrayValue(values=[AnyValue()]))),
        ]
    )
    return KeyValue(key="everything", value=AnyValue(kvlist_value=nested))


@pytest.mark.parametrize("signal", ["traces", "metrics", "logs"])
def test_the_walk_gives_message_to_dict_s_json(signal: str) -> None:
    if signal == "traces":
        request = encode_spans(_spans())
        request.resource_spans[0].resource.attributes.append(_any_values())
    elif signal == "metrics":
        request = encode_metrics(_metrics())
    else:
        request = _logs()
    again = type(request)()
    again.ParseFromString(request.SerializeToString())  # as the receiver has it: parsed
    got, want = to_json(again), reference_json(again)
    assert got == want or repr(got) == repr(want)  # (a NaN equals itself only in repr)
    assert repr(got) == repr(want)


def test_ids_are_hex_and_64_bit_integers_strings() -> None:
    got = to_json(encode_spans(_spans()))
    span = got["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert len(span["traceId"]) == 32 and int(span["traceId"], 16) >= 0
    assert isinstance(span["startTimeUnixNano"], str) and isinstance(span["kind"], int)
