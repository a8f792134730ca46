"""Our OTLP/JSON encoder writes what the official one writes.

The reference is ``opentelemetry-exporter-otlp-json-common`` (a test-only
dependency): its ``to_dict`` is what the official file exporter dumps. Both
encoders follow the protobuf JSON mapping, in which a field holding its
default value (``""``, ``0``, ``[]``, an unset ``optional``) is omitted and a
reader treats "omitted" and "default" alike. We do not lean on that
equivalence: the dicts must be equal key for key and in the same order, so
the two lines are the same bytes when dumped alike. (Our file writer keeps
non-ASCII characters unescaped where the official one escapes them; both are
the same JSON string, which the decoded comparison below also checks.)

Every input is built through the SDK, as a user's program would produce it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The reference requires the newest SDK, so `tox -e mindeps` (the lowest SDK we
# declare) runs without it and skips this module; every other env has it.
pytest.importorskip(
    "opentelemetry.exporter.otlp.json.common",
    reason="the official OTLP/JSON encoder (test extra) requires the newest SDK",
)

from opentelemetry import trace
from opentelemetry.exporter.otlp.json.common.metrics_encoder import (
    encode_metrics as official_encode_metrics,
)
from opentelemetry.exporter.otlp.json.common.trace_encoder import (
    encode_spans as official_encode_spans,
)
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import AlwaysOnExemplarFilter, Counter, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    InMemoryMetricReader,
    MetricsData,
)
from opentelemetry.sdk.metrics.view import (
    ExplicitBucketHistogramAggregation,
    ExponentialBucketHistogramAggregation,
    View,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from megatron.core.telemetry._otlp_json import encode_metrics, encode_spans
from megatron.core.telemetry.jsonl import JsonlFile

# Every attribute type the SDK keeps, with the values at the edges of each.
ATTRIBUTES: dict[str, Any] = {
    "str": "héllo ☃",
    "str.empty": "",
    "bool.true": True,
    "bool.false": False,
    "int.zero": 0,
    "int.negative": -7,
    "int.max": 2**63 - 1,
    "float.zero": 0.0,
    "float": -1.25,
    "float.tiny": 5e-324,
    "float.nan": math.nan,
    "float.inf": math.inf,
    "float.-inf": -math.inf,
    "seq.str": ("a", ""),
    "seq.bool": [True, False],
    "seq.int": [0, -1, 2**40],
    "seq.float": [1.5, math.nan, math.inf, -math.inf],
    "seq.empty": (),
}

REMOTE = SpanContext(
    trace_id=0x0AF7651916CD43DD8448EB211C80319C,
    span_id=0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
    trace_state=TraceState([("vendor", "value"), ("other", "x")]),
)
LOCAL_LINKED = SpanContext(
    trace_id=0x1, span_id=0x2, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)
)


def dump(request: dict[str, Any]) -> str:
    """The official file exporter's serialisation (compact, ASCII-escaped)."""
    return json.dumps(request, separators=(",", ":"))


def assert_same_request(ours: dict[str, Any], official: dict[str, Any]) -> None:
    assert dump(ours) == dump(official)  # same keys, same order, same values
    assert json.loads(dump(ours)) == json.loads(dump(official))


class _Providers:
    """Tracer providers with their spans collected in one list, in end order."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.providers: list[TracerProvider] = []

    def provider(self, resource: Resource, limits: SpanLimits | None = None) -> TracerProvider:
        provider = TracerProvider(resource=resource, span_limits=limits)
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.providers.append(provider)
        return provider

    def spans(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()

    def shutdown(self) -> None:
        for provider in self.providers:
            provider.shutdown()


@pytest.fixture
def providers() -> Iterator[_Providers]:
    made = _Providers()
    yield made
    made.shutdown()


def rich_batch(providers: _Providers) -> tuple[ReadableSpan, ...]:
    """Spans of three resources (two of them equal but distinct objects) and four
    scopes, interleaved, covering every field either encoder writes."""
    job = Resource.create({"service.name": "megatron", "megatron.run_id": "r1"}, "https://s/1")
    same_job = Resource.create({"service.name": "megatron", "megatron.run_id": "r1"}, "https://s/1")
    other = Resource({"service.name": "other", "rank": 3})
    limits = SpanLimits(
        max_span_attributes=20,
        max_events=2,
        max_links=1,
        max_event_attributes=1,
        max_link_attributes=1,
    )
    main = providers.provider(job, limits)
    twin = providers.provider(same_job)
    second = providers.provider(other)
    tracer = main.get_tracer("megatron", "1.2.3", "https://scope/1", {"scope.attr": 1})
    bare = main.get_tracer("bare")
    twin_tracer = twin.get_tracer("megatron", "1.2.3", "https://scope/1", {"scope.attr": 1})
    other_tracer = second.get_tracer("other.scope", "0.1")

    with tracer.start_as_current_span("root", attributes=ATTRIBUTES) as root:
        root.add_event("no attributes")
        root.add_event("attributes", {"iteration": 10, "dropped": "by the limit"})
        root.add_event("over the event limit")
        root.set_status(Status(StatusCode.OK))
        for kind in SpanKind:
            with bare.start_as_current_span(f"kind {kind.name}", kind=kind):
                pass
        with other_tracer.start_as_current_span("other resource"):
            pass
        with twin_tracer.start_as_current_span("equal resource, other object"):
            pass
    failed = tracer.start_span(
        "failed",
        links=[Link(root.get_span_context(), {"why": "previous", "dropped": 1})],
    )
    failed.record_exception(ValueError("bad batch"))
    failed.set_status(Status(StatusCode.ERROR, "ValueError: bad batch"))
    for index in range(25):  # five over the attribute limit
        failed.set_attribute(f"a{index}", index)
    failed.end()
    remote_child = tracer.start_span(
        "remote parent",
        context=trace.set_span_in_context(NonRecordingSpan(REMOTE)),
        links=[Link(LOCAL_LINKED), Link(REMOTE, {"remote": True})],  # the first is dropped
        start_time=1_700_000_000_000_000_000,
    )
    remote_child.end(end_time=1_700_000_000_500_000_000)
    bare.start_span(
        "no attributes, nothing else", context=trace.set_span_in_context(trace.INVALID_SPAN)
    ).end()
    return providers.spans()


def test_spans_encode_as_the_official_encoder(providers: _Providers) -> None:
    spans = rich_batch(providers)
    ours = encode_spans(spans)
    assert_same_request(ours, official_encode_spans(spans).to_dict())

    # The batch does exercise what it claims to: guard against a vacuous pass.
    text = dump(ours)
    for field in (
        '"droppedAttributesCount":5',  # the span's
        '"droppedAttributesCount":1',  # an event's and a link's
        '"droppedEventsCount":1',
        '"droppedLinksCount":1',
        '"traceState":"vendor=value,other=x"',
        '"flags":768',
        '"flags":256',
        '"doubleValue":"NaN"',
        '"doubleValue":"-Infinity"',
        '"arrayValue":{}',
        '"schemaUrl":"https://s/1"',
        '"message":"ValueError: bad batch"',
    ):
        assert field in text, field
    resources = ours["resourceSpans"]
    assert len(resources) == 2  # equal resources share one entry, as in the official encoder
    assert len(resources[0]["scopeSpans"]) == 2
    assert {span["kind"] for r in resources for s in r["scopeSpans"] for span in s["spans"]} == {
        1,
        2,
        3,
        4,
        5,
    }


def test_each_span_alone_encodes_as_the_official_encoder(providers: _Providers) -> None:
    for span in rich_batch(providers):
        assert_same_request(encode_spans([span]), official_encode_spans([span]).to_dict())


def test_an_empty_batch_encodes_as_the_official_encoder() -> None:
    assert_same_request(encode_spans([]), official_encode_spans([]).to_dict())


def test_the_written_line_decodes_to_the_official_request(
    providers: _Providers, tmp_path: Path
) -> None:
    spans = rich_batch(providers)
    path = tmp_path / "traces.jsonl"
    file = JsonlFile.open(path)
    file.write_lines([encode_spans(spans)])
    file.close()
    (line,) = path.read_text(encoding="utf-8").splitlines()
    assert json.loads(line) == json.loads(dump(official_encode_spans(spans).to_dict()))


def _collect_metrics(resource: Resource, temporality: AggregationTemporality) -> MetricsData:
    reader = InMemoryMetricReader(preferred_temporality={Counter: temporality})
    provider = MeterProvider(
        metric_readers=[reader],
        resource=resource,
        exemplar_filter=AlwaysOnExemplarFilter(),
        views=[
            View(instrument_name="*.exp", aggregation=ExponentialBucketHistogramAggregation()),
            View(
                instrument_name="int.bounds",
                aggregation=ExplicitBucketHistogramAggregation(boundaries=(0, 10, 100)),
            ),
            View(instrument_name="*"),
        ],
    )
    meter = provider.get_meter("megatron", "1.0", "https://scope/m", {"meter.attr": "x"})
    plain_meter = provider.get_meter("plain")
    tracer_provider = TracerProvider()
    tracer = tracer_provider.get_tracer("t")

    counter = meter.create_counter("int.counter", unit="1", description="an int sum")
    float_counter = plain_meter.create_counter("float.counter")
    updown = meter.create_up_down_counter("updown")
    gauge = meter.create_gauge("gauge", unit="GB")
    histogram = meter.create_histogram("histogram", unit="ms")
    int_bounds = meter.create_histogram("int.bounds")
    exponential = meter.create_histogram("latency.exp")
    meter.create_observable_gauge(
        "observed",
        callbacks=[lambda options: [Observation(2.5, {"core": 0})]],
    )
    # Histograms refuse negative values; an up-down counter's do not.
    signed = meter.create_up_down_counter("signed.exp")

    with tracer.start_as_current_span("sampled"):  # exemplars with trace and span ids
        counter.add(3, {"rank": 0})
        histogram.record(12.5, ATTRIBUTES)
        exponential.record(0.004, {"phase": "fwd"})
    counter.add(2, {"rank": 1})  # exemplar without ids
    float_counter.add(0.5)
    updown.add(-4)
    gauge.set(0.75, {"device": "cpu"})
    gauge.set(3)
    histogram.record(250)
    overflow = meter.create_histogram("overflow")  # the SDK refuses non-finite values, but
    overflow.record(1e308)  # a sum can still overflow to infinity
    overflow.record(1e308)
    int_bounds.record(7)
    for value in (0, 0.5, 1e6):
        exponential.record(value, {"phase": "bwd"})
    for value in (-3.0, -0.25, 0, 2.0):
        signed.add(value)
    data = reader.get_metrics_data()
    provider.shutdown()
    tracer_provider.shutdown()
    assert data is not None
    return data


def test_metrics_encode_as_the_official_encoder() -> None:
    first = _collect_metrics(
        Resource.create({"service.name": "megatron"}), AggregationTemporality.CUMULATIVE
    )
    second = _collect_metrics(
        Resource({"service.name": "other"}, "https://s/2"), AggregationTemporality.DELTA
    )
    data = MetricsData(resource_metrics=[*first.resource_metrics, *second.resource_metrics])
    ours = encode_metrics(data)
    assert_same_request(ours, official_encode_metrics(data).to_dict())

    text = dump(ours)
    for field in (
        '"gauge"',
        '"sum"',
        '"histogram"',
        '"exponentialHistogram"',
        '"negative"',
        '"zeroCount"',
        '"exemplars"',
        '"traceId"',
        '"doubleValue":"NaN"',
        '"sum":"Infinity"',
        '"isMonotonic":true',
        '"aggregationTemporality":1',
        '"aggregationTemporality":2',
        '"schemaUrl":"https://s/2"',
    ):
        assert field in text, field
    assert len(ours["resourceMetrics"]) == 2
