"""Telemetry must never break training:
an exception from the SDK or an exporter inside a callback is caught and logged
once, at warning; the lifecycle advances normally; only illegal transitions raise.
"""

from __future__ import annotations

import logging

import pytest
from fake_handles import FakeHandle, RaisingProcessor, RaisingTracerHandle, span_id
from launch_times import launch_timestamps
from lifecycle_spec import TRAIN
from opentelemetry import trace as otel_trace

from megatron.training.telemetry_spans import SpanPhaseError


def megatron_warnings(caplog):
    return [
        r for r in caplog.records if r.name.startswith("megatron") and r.levelno >= logging.WARNING
    ]


def full_lifecycle(phases):
    """Drive a whole incarnation, checking each state as it goes."""
    ts = launch_timestamps()
    phases.start_job(model_type="gpt", timestamps=ts)
    assert phases.state == "startup"
    phases.record_phase("megatron.startup.imports", ts["program_start"], ts["main_entry"])
    phases.flush()
    assert phases.state == "startup"
    phases.start_train()
    assert phases.state == "train"
    for iteration in range(5):
        phases.step(iteration)
        assert phases.state == "interval"
    phases.flush()
    assert phases.state == "interval"
    phases.end_train()
    assert phases.state == "ended"
    phases.shutdown()
    assert phases.state == "shutdown"


def assert_exactly_one_warning(caplog):
    found = megatron_warnings(caplog)
    assert len(found) == 1, [r.getMessage() for r in found]
    assert found[0].levelno == logging.WARNING


def test_tracer_that_raises_everywhere(lifecycles, caplog):
    caplog.set_level(logging.WARNING)
    handle = RaisingTracerHandle()
    phases = lifecycles.new(handle, save_interval=2)
    full_lifecycle(phases)
    assert handle.tracer.calls >= 2, "the failing tracer was never exercised"
    assert len(handle.shutdown_calls) == 1
    assert_exactly_one_warning(caplog)


def test_exporter_path_that_raises_on_every_span_end(lifecycles, caplog):
    caplog.set_level(logging.WARNING)
    raising = RaisingProcessor()
    handle = FakeHandle(extra_processors=[raising])
    phases = lifecycles.new(handle, save_interval=2)
    full_lifecycle(phases)
    assert raising.calls >= 3
    # Whatever was started was still ended exactly once, and the exporter in front of
    # the failing processor got every one of those spans.
    handle.recorder.assert_all_ended_exactly_once()
    assert sorted(span_id(s) for s in handle.spans()) == sorted(handle.recorder.started)
    assert TRAIN in handle.recorder.started.values()
    assert otel_trace.get_current_span() is otel_trace.INVALID_SPAN, "a context was left attached"
    assert len(handle.shutdown_calls) == 1
    assert_exactly_one_warning(caplog)


def test_handle_whose_flush_and_shutdown_raise(lifecycles, caplog, tracer_provider):
    caplog.set_level(logging.WARNING)
    handle = FakeHandle(shutdown_raises=True)
    tracer_provider.raises = True  # the shared lifecycle flushes the global provider
    phases = lifecycles.new(handle, save_interval=2)
    full_lifecycle(phases)
    assert len(tracer_provider.flushes) == 2
    assert len(handle.shutdown_calls) == 1
    assert_exactly_one_warning(caplog)
    # The spans themselves were all ended before the handle was shut down.
    handle.recorder.assert_all_ended_exactly_once()


def test_failing_telemetry_does_not_hide_illegal_orders(lifecycles, caplog):
    caplog.set_level(logging.WARNING)
    phases = lifecycles.new(RaisingTracerHandle(), save_interval=2)
    with pytest.raises(SpanPhaseError):
        phases.step()
    phases.start_job()
    with pytest.raises(SpanPhaseError):
        phases.start_job()
    phases.shutdown()
    with pytest.raises(SpanPhaseError):
        phases.start_job()
    assert phases.state == "shutdown"
    assert_exactly_one_warning(caplog)


def test_healthy_lifecycle_logs_no_warning(lifecycles, caplog):
    caplog.set_level(logging.WARNING)
    handle = FakeHandle()
    full_lifecycle(lifecycles.new(handle, save_interval=2))
    assert megatron_warnings(caplog) == []
    handle.recorder.assert_all_ended_exactly_once()
