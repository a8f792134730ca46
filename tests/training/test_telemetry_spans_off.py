"""Telemetry off: the machine still runs and rejects illegal orders, but no
OpenTelemetry API is touched.

"Off" is: no handle, a handle that is not exporting, the ``job`` span group off,
or ``enabled=False``. The tracer is a ForbiddenTracer whose every attribute access
fails the test, and the OTel context / trace entry points are replaced by
recorders that fail when called.
"""

from __future__ import annotations

import sys

import pytest
from fake_handles import FakeHandle, ForbiddenHandle, ForbiddenTracer, forbid_otel_api
from launch_times import launch_timestamps
from lifecycle_spec import STARTUP, TRAIN

import megatron.core.telemetry as core_telemetry
import megatron.training.telemetry_spans as telemetry_spans
from megatron.training.telemetry_spans import SpanPhaseError


def patch_job_group(monkeypatch, enabled: bool) -> None:
    """Make the base layer's ``is_span_group_enabled`` answer for the job group,
    wherever the module under test looks it up."""

    def fake(group):
        return enabled if group == "job" else False

    monkeypatch.setattr(core_telemetry, "is_span_group_enabled", fake, raising=False)
    for name, value in list(vars(telemetry_spans).items()):
        if getattr(value, "__name__", None) == "is_span_group_enabled" and callable(value):
            monkeypatch.setattr(telemetry_spans, name, fake)
    state = sys.modules.get("megatron.core.telemetry.state")
    if state is not None and hasattr(state, "is_span_group_enabled"):
        monkeypatch.setattr(state, "is_span_group_enabled", fake)


OFF_VARIANTS = ["no_handle", "not_exporting", "job_group_off", "enabled_false", "global_job_off"]


def make_off(variant, monkeypatch):
    """-> (handle, enabled)"""
    if variant == "no_handle":
        return None, None
    if variant == "not_exporting":
        return ForbiddenHandle(is_exporting=False), None
    if variant == "job_group_off":
        return ForbiddenHandle(is_exporting=True, span_groups=("step", "checkpoint")), None
    if variant == "enabled_false":
        return ForbiddenHandle(is_exporting=True), False
    if variant == "global_job_off":
        # No span_groups attribute: the base layer's global switch decides.
        patch_job_group(monkeypatch, False)
        return ForbiddenHandle(is_exporting=True, span_groups=None), None
    raise AssertionError(variant)


def expect_rejected(phases, trigger, *args):
    state = phases.state
    with pytest.raises(SpanPhaseError, match=rf"(?s)(?=.*\b{trigger}\b)(?=.*\b{state}\b)"):
        getattr(phases, trigger)(*args)
    assert phases.state == state


@pytest.mark.parametrize("variant", OFF_VARIANTS)
def test_off_lifecycle_touches_no_otel_api_and_still_checks_order(monkeypatch, lifecycles, variant):
    handle, enabled = make_off(variant, monkeypatch)
    phases = lifecycles.new(handle, save_interval=2, enabled=enabled)
    api_calls = forbid_otel_api(monkeypatch, telemetry_spans)

    expect_rejected(phases, "reroot")
    expect_rejected(phases, "step", 0)
    expect_rejected(phases, "start_train")
    phases.start_job(model_type="gpt", timestamps=launch_timestamps())
    expect_rejected(phases, "start_job")
    ts = launch_timestamps()
    phases.record_phase("megatron.startup.imports", ts["program_start"], ts["main_entry"])
    phases.record_phase("megatron.startup.skipped", None, ts["main_entry"])
    phases.flush()
    expect_rejected(phases, "end_train")
    phases.start_train()
    expect_rejected(phases, "record_phase", "late", 1.0, 2.0)
    expect_rejected(phases, "end_train")
    for iteration in range(1000, 1007):  # reroots at passes 0, 2, 4, 6
        phases.step(iteration)
        assert phases.state == "interval"
    phases.reroot()
    phases.end_train()
    phases.step(2000)
    assert phases.state == "interval"
    phases.flush()
    phases.shutdown()
    assert phases.state == "shutdown"
    for trigger in ("shutdown", "start_job", "start_train", "reroot", "end_train", "flush"):
        expect_rejected(phases, trigger)
    expect_rejected(phases, "step", 3000)
    expect_rejected(phases, "record_phase", "late", 1.0, 2.0)

    assert api_calls == []
    if handle is not None:
        assert handle.tracer.touches == []
        # Shutting the (non-span) handle down is allowed, but at most once.
        assert len(handle.shutdown_calls) <= 1


@pytest.mark.parametrize("variant", ["job_group_off", "enabled_false"])
def test_exporting_provider_with_lifecycle_off_records_no_span(lifecycles, variant):
    """A real SDK provider sees not a single span start when the lifecycle is off."""
    if variant == "job_group_off":
        handle, enabled = FakeHandle(span_groups=("step",)), None
    else:
        handle, enabled = FakeHandle(), False
    phases = lifecycles.new(handle, save_interval=1, enabled=enabled)
    phases.start_job(model_type="gpt", timestamps=launch_timestamps())
    phases.start_train()
    for iteration in range(3):
        phases.step(iteration)
    phases.end_train()
    phases.shutdown()
    assert handle.recorder.start_order == []
    assert len(handle.shutdown_calls) <= 1


def test_enabled_true_forces_spans_on(lifecycles):
    handle = FakeHandle(span_groups=())
    phases = lifecycles.new(handle, save_interval=1, enabled=True)
    phases.start_job(model_type="gpt", timestamps=None)
    phases.start_train()
    phases.step(0)
    phases.shutdown()
    assert [s.name for s in handle.spans()] == [STARTUP, TRAIN]


@pytest.mark.parametrize("job_on", [True, False])
def test_without_span_groups_attribute_the_global_job_group_decides(
    monkeypatch, lifecycles, job_on
):
    patch_job_group(monkeypatch, job_on)
    handle = FakeHandle(span_groups=None)
    assert not hasattr(handle, "span_groups")
    phases = lifecycles.new(handle, save_interval=1)
    phases.start_job(model_type="gpt", timestamps=None)
    phases.shutdown()
    assert [s.name for s in handle.spans()] == ([STARTUP] if job_on else [])


def test_span_groups_attribute_wins_over_the_global_switch(monkeypatch, lifecycles):
    patch_job_group(monkeypatch, False)
    handle = FakeHandle(span_groups=("job",))
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
