"""Telemetry off: the machine still runs and rejects illegal orders, but no
OpenTelemetry API is touched.

"Off" is: no handle, a handle that is not exporting, the ``job`` span group off,
or ``enabled=False``. The tracer is a ForbiddenTracer whose every attribute access
fails the test, and the OTel context / trace entry points are replaced by
recorders that fail when called.
"""

from __future__ import annotations

import pytest
from fake_handles import FakeHandle, ForbiddenHandle, ForbiddenTracer, forbid_otel_api
from launch_times import launch_timestamps
from lifecycle_spec import STARTUP

import megatron.training.telemetry_spans as telemetry_spans
from megatron.training.telemetry_spans import SpanPhaseError


def job_gate(enabled: bool):
    """An ``is_span_group_enabled`` that answers ``enabled`` for the job group, and
    records what it was asked."""

    def gate(group):
        gate.asked.append(group)
        return enabled if group == "job" else False

    gate.asked = []
    return gate


OFF_VARIANTS = ["no_handle", "not_exporting", "job_group_off"]


def make_off(variant):
    """-> (handle, enabled, gate)"""
    if variant == "no_handle":
        return None, None, None
    if variant == "not_exporting":
        return ForbiddenHandle(is_exporting=False), None, None
    if variant == "job_group_off":
        # The is_span_group_enabled the call sites use decides, and says no.
        return ForbiddenHandle(is_exporting=True, span_groups=None), None, job_gate(False)
    raise AssertionError(variant)


def expect_rejected(phases, trigger, *args):
    state = phases.state
    with pytest.raises(SpanPhaseError, match=rf"(?s)(?=.*\b{trigger}\b)(?=.*\b{state}\b)"):
        getattr(phases, trigger)(*args)
    assert phases.state == state


@pytest.mark.parametrize("variant", OFF_VARIANTS)
def test_off_lifecycle_touches_no_otel_api_and_still_checks_order(monkeypatch, lifecycles, variant):
    handle, enabled, gate = make_off(variant)
    phases = lifecycles.new(handle, save_interval=2, enabled=enabled, is_span_group_enabled=gate)
    api_calls = forbid_otel_api(monkeypatch, telemetry_spans)

    expect_rejected(phases, "step", 0)
    expect_rejected(phases, "end_train")
    phases.start_job(model_type="gpt", timestamps=launch_timestamps())
    expect_rejected(phases, "start_job")
    ts = launch_timestamps()
    phases.record_phase("megatron.startup.imports", ts["program_start"], ts["main_entry"])
    phases.record_phase("megatron.startup.skipped", None, ts["main_entry"])
    phases.flush()
    expect_rejected(phases, "end_train")
    phases.start_train()
    expect_rejected(phases, "record_phase", "late", 1.0, 2.0)
    expect_rejected(phases, "start_train")
    for iteration in range(1000, 1007):  # reroots at passes 0, 2, 4, 6
        phases.step(iteration)
        assert phases.state == "interval"
    phases.flush()
    phases.end_train()
    expect_rejected(phases, "end_train")
    phases.step(2000)  # not a boundary: the table is asked at the next one
    expect_rejected(phases, "step", 2001)
    phases.shutdown()
    assert phases.state == "shutdown"
    # After the training path's own shutdown, it may fire nothing more...
    for trigger in ("start_job", "shutdown", "start_train", "end_train"):
        expect_rejected(phases, trigger)
    expect_rejected(phases, "step", 3000)
    expect_rejected(phases, "record_phase", "late", 1.0, 2.0)
    # ...while the exit paths' triggers are no-ops there.
    phases.flush()
    phases.terminate()
    assert phases.state == "shutdown"

    assert api_calls == []
    if handle is not None:
        assert handle.tracer.touches == []
        # Shutting the (non-span) handle down is allowed, but at most once.
        assert len(handle.shutdown_calls) <= 1


def test_exporting_provider_with_lifecycle_off_records_no_span(lifecycles):
    """A real SDK provider sees not a single span start when the job group is off."""
    handle = FakeHandle(span_groups=("step",))
    gate = job_gate(False)
    phases = lifecycles.new(handle, save_interval=1, is_span_group_enabled=gate)
    phases.start_job(model_type="gpt", timestamps=launch_timestamps())
    phases.start_train()
    for iteration in range(3):
        phases.step(iteration)
    phases.end_train()
    phases.shutdown()
    assert handle.recorder.start_order == []
    assert len(handle.shutdown_calls) <= 1


@pytest.mark.parametrize("job_on", [True, False])
def test_the_gate_the_trainer_passes_decides(lifecycles, job_on):
    """The ``is_span_group_enabled`` the call sites use is asked about the job group."""
    gate = job_gate(job_on)
    handle = FakeHandle(span_groups=None)
    assert not hasattr(handle, "span_groups")
    phases = lifecycles.new(handle, save_interval=1, is_span_group_enabled=gate)
    assert gate.asked == ["job"]
    phases.start_job(model_type="gpt", timestamps=None)
    phases.shutdown()
    assert [s.name for s in handle.spans()] == ([STARTUP] if job_on else [])


def test_without_a_gate_every_group_is_on(lifecycles):
    """No ``is_span_group_enabled``: the lifecycle records whenever the handle exports
    (the handle's own ``span_groups`` are not asked: the call sites' gate is the one)."""
    handle = FakeHandle(span_groups=())
    phases = lifecycles.new(handle)
    phases.start_job()
    phases.shutdown()
    assert [s.name for s in handle.spans()] == [STARTUP]


class RealOffHandle:
    """A real TelemetryHandle from setup_telemetry with telemetry disabled, its
    tracer swapped for a ForbiddenTracer; flush / shutdown reach the real handle."""

    def __init__(self, env) -> None:
        from megatron.core.telemetry import TelemetryConfig, setup_telemetry

        self.real = setup_telemetry(TelemetryConfig.from_env(env=env), rank=0, world_size=1)
        self.tracer = ForbiddenTracer()
        self.is_exporting = self.real.is_exporting
        self.span_groups = self.real.span_groups
        self.shutdown_calls: list = []

    def force_flush(self, timeout_ms=None):
        return self.real.force_flush(timeout_ms=timeout_ms or 1000)

    def shutdown(self, timeout_ms=None):
        self.shutdown_calls.append(timeout_ms)
        return self.real.shutdown(timeout_ms=timeout_ms or 1000)


@pytest.mark.parametrize(
    "env",
    [{}, {"MEGATRON_OTEL_ENABLED": "0"}],
    ids=["unset", "disabled"],
)
def test_real_non_exporting_handle_is_off(monkeypatch, lifecycles, tmp_path, env):
    monkeypatch.chdir(tmp_path)
    handle = RealOffHandle(env)
    assert handle.is_exporting is False
    phases = lifecycles.new(handle, save_interval=1)
    api_calls = forbid_otel_api(monkeypatch, telemetry_spans)
    phases.start_job(model_type="gpt", timestamps=launch_timestamps())
    phases.start_train()
    for iteration in range(3):
        phases.step(iteration)
    phases.end_train()
    phases.flush()
    phases.shutdown()
    assert phases.state == "shutdown"
    assert api_calls == []
    assert handle.tracer.touches == []
    # Shutting a non-exporting handle down is allowed (at most once); it wrote nothing.
    assert len(handle.shutdown_calls) <= 1
    assert list(tmp_path.iterdir()) == []
