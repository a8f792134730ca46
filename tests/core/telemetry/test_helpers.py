from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from megatron.core.telemetry import (
    is_span_group_enabled,
    managed_span,
    safe_set_span_attributes,
    set_enabled_span_groups,
    span_cm,
    state,
    trace_fn,
)


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    owner = object()
    state._activate(owner, provider.get_tracer("test"), frozenset({"step", "layer"}))
    yield exporter
    provider.shutdown()


class _ForbiddenTracer(trace.Tracer):
    """A tracer that fails the test if anything asks it for a span."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        self.calls.append("start_span")
        pytest.fail("start_span called for a disabled group")

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("start_as_current_span")
        pytest.fail("start_as_current_span called for a disabled group")


def test_disabled_group_creates_no_span(exporter: InMemorySpanExporter) -> None:
    tracer = _ForbiddenTracer()
    ran = []
    with managed_span("microbatch", "mb", tracer=tracer, a=1) as span:
        ran.append(True)
        assert span is None
        assert trace.get_current_span() is trace.INVALID_SPAN
    assert ran == [True]
    assert tracer.calls == []
    assert exporter.get_finished_spans() == ()


def test_disabled_group_still_propagates_exceptions() -> None:
    error = ValueError("x")
    with pytest.raises(ValueError) as info, managed_span("job", "j", tracer=_ForbiddenTracer()):
        raise error
    assert info.value is error


def test_enabled_group_records_span_with_attributes(exporter: InMemorySpanExporter) -> None:
    with managed_span("step", "iteration", iteration=3, note=None, obj=object()) as span:
        assert span is not None
        assert trace.get_current_span() is span
    (finished,) = exporter.get_finished_spans()
    assert finished.name == "iteration"
    assert dict(finished.attributes) == {"iteration": 3}
    assert finished.end_time is not None
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_exception_is_recorded_and_the_same_object_propagates(
    exporter: InMemorySpanExporter,
) -> None:
    error = RuntimeError("out of memory")
    with pytest.raises(RuntimeError) as info, managed_span("step", "iteration"):
        raise error
    assert info.value is error
    (finished,) = exporter.get_finished_spans()
    assert finished.end_time is not None
    assert finished.status.status_code is StatusCode.ERROR
    assert "out of memory" in finished.status.description
    (event,) = finished.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "RuntimeError"
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_clean_sys_exit_is_not_an_error(exporter: InMemorySpanExporter) -> None:
    with pytest.raises(SystemExit), managed_span("step", "iteration"):
        sys.exit(0)
    (finished,) = exporter.get_finished_spans()
    assert finished.status.status_code is StatusCode.UNSET
    assert finished.events == ()


def test_nested_managed_spans_are_parent_and_child(exporter: InMemorySpanExporter) -> None:
    with managed_span("step", "outer") as outer, managed_span("layer", "inner") as inner:
        assert inner.parent.span_id == outer.get_span_context().span_id
    inner_span, outer_span = exporter.get_finished_spans()
    assert inner_span.name == "inner"
    assert inner_span.parent.span_id == outer_span.context.span_id
    assert inner_span.context.trace_id == outer_span.context.trace_id
    assert outer_span.parent is None


def test_disabled_inner_span_leaves_outer_current(exporter: InMemorySpanExporter) -> None:
    with managed_span("step", "outer") as outer:
        with managed_span("microbatch", "mb") as inner:
            assert inner is None
            assert trace.get_current_span() is outer
        with managed_span("layer", "layer") as layer:
            assert layer.parent.span_id == outer.get_span_context().span_id


def test_trace_fn_checks_the_group_at_call_time(exporter: InMemorySpanExporter) -> None:
    set_enabled_span_groups(set())

    @trace_fn("step", "decorated")
    def work(x: int) -> int:
        """Docstring kept."""
        return x * 2

    assert work.__name__ == "work"
    assert work.__doc__ == "Docstring kept."
    assert work.__wrapped__(2) == 4

    assert work(1) == 2
    assert exporter.get_finished_spans() == ()
    set_enabled_span_groups({"step"})
    assert work(2) == 4
    assert [s.name for s in exporter.get_finished_spans()] == ["decorated"]
    set_enabled_span_groups(set())
    assert work(3) == 6
    assert len(exporter.get_finished_spans()) == 1


def test_trace_fn_records_exceptions(exporter: InMemorySpanExporter) -> None:
    error = ZeroDivisionError("x")

    @trace_fn("step", "failing")
    def fail() -> None:
        raise error

    with pytest.raises(ZeroDivisionError) as info:
        fail()
    assert info.value is error
    (finished,) = exporter.get_finished_spans()
    assert finished.status.status_code is StatusCode.ERROR


def test_span_cm_is_not_gated(exporter: InMemorySpanExporter) -> None:
    set_enabled_span_groups(set())
    with span_cm("ungated", kind_of="root") as span:
        assert span is not None
    (finished,) = exporter.get_finished_spans()
    assert dict(finished.attributes) == {"kind_of": "root"}


def test_span_cm_without_exception_recording(exporter: InMemorySpanExporter) -> None:
    with pytest.raises(KeyError), span_cm("quiet", record_exception=False):
        raise KeyError("k")
    (finished,) = exporter.get_finished_spans()
    assert finished.status.status_code is StatusCode.UNSET
    assert finished.events == ()


def test_a_broken_tracer_does_not_break_the_body(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(trace.Tracer):
        def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
            raise RuntimeError("sdk bug")

        def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("sdk bug")

    set_enabled_span_groups({"step"})
    with managed_span("step", "s", tracer=Broken()) as span:
        assert span is None
    assert "Could not start span 's'" in caplog.text


def test_is_span_group_enabled_follows_state() -> None:
    assert not is_span_group_enabled("step")
    set_enabled_span_groups(["step"])
    assert is_span_group_enabled("step")
    assert not is_span_group_enabled("layer")


class _RecordingSpan:
    def __init__(self) -> None:
        self.attributes: dict[str, Any] = {}

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        self.attributes.update(attributes)


def test_safe_set_span_attributes_filters_values() -> None:
    span = _RecordingSpan()
    safe_set_span_attributes(
        span,
        {
            "none": None,
            "text": "x",
            "flag": True,
            "count": 3,
            "ratio": 0.5,
            "ints": [1, 2],
            "names": ("a", "b"),
            "mixed": [1, "a"],
            "bools_and_ints": [True, 1],
            "nested": [[1]],
            "dict": {"a": 1},
            "obj": object(),
            "": "empty key",
        },
    )
    assert span.attributes == {
        "text": "x",
        "flag": True,
        "count": 3,
        "ratio": 0.5,
        "ints": (1, 2),
        "names": ("a", "b"),
    }


def test_safe_set_span_attributes_redacts_sensitive_strings() -> None:
    span = _RecordingSpan()
    safe_set_span_attributes(
        span,
        {
            "db.password": "hunter2",
            "hf_token": "hf_abc",
            "api_key": "k",
            "accessToken": "t",
            "client_secret": "s",
            "aws.credentials": ["a", "b"],
            "num_tokens": 128,
            "tokenizer_type": "GPT2BPETokenizer",
            "custom_field": "visible",
        },
    )
    assert span.attributes["db.password"] == "[REDACTED]"
    assert span.attributes["hf_token"] == "[REDACTED]"
    assert span.attributes["api_key"] == "[REDACTED]"
    assert span.attributes["accessToken"] == "[REDACTED]"
    assert span.attributes["client_secret"] == "[REDACTED]"
    assert span.attributes["aws.credentials"] == "[REDACTED]"
    # numbers under sensitive-looking keys are not secrets
    assert span.attributes["num_tokens"] == 128
    # whole words only: the tokenizer's name is not a token
    assert span.attributes["tokenizer_type"] == "GPT2BPETokenizer"
    assert span.attributes["custom_field"] == "visible"

    extra = _RecordingSpan()
    safe_set_span_attributes(extra, {"custom_field": "hidden", "password": "p"}, ["custom_field"])
    assert extra.attributes == {"custom_field": "[REDACTED]", "password": "[REDACTED]"}


def test_safe_set_span_attributes_never_raises() -> None:
    safe_set_span_attributes(None, {"a": 1})

    class Exploding:
        def set_attributes(self, attributes: Any) -> None:
            raise RuntimeError("ended span")

    safe_set_span_attributes(Exploding(), {"a": 1})

    class BadMapping(dict):
        def items(self) -> Any:
            raise RuntimeError("bad mapping")

    span = _RecordingSpan()
    safe_set_span_attributes(span, BadMapping(a=1))
    assert span.attributes == {}


def test_managed_span_attributes_are_redacted(exporter: InMemorySpanExporter) -> None:
    with managed_span("step", "s", password="p", rank=0):
        pass
    (finished,) = exporter.get_finished_spans()
    assert dict(finished.attributes) == {"password": "[REDACTED]", "rank": 0}


def test_an_exception_through_nested_spans_is_recorded_once_on_the_innermost(
    exporter: InMemorySpanExporter,
) -> None:
    """Its traceback once, where it was raised; every span it ended says ERROR."""
    error = RuntimeError("injected fault")
    with pytest.raises(RuntimeError), managed_span("step", "outer"), managed_span("layer", "inner"):
        raise error
    inner, outer = exporter.get_finished_spans()
    assert [event.name for event in inner.events] == ["exception"]
    assert outer.events == ()
    assert inner.status.status_code is outer.status.status_code is StatusCode.ERROR
    assert outer.status.description == "RuntimeError: injected fault"
    # a second exception object is a fault of its own, recorded again
    with pytest.raises(RuntimeError), managed_span("step", "again"):
        raise RuntimeError("injected fault")
    assert [event.name for event in exporter.get_finished_spans()[-1].events] == ["exception"]
