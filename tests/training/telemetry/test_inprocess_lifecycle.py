"""The trainer's lifecycle under an in-process restart: the rows ``TrainerSpanPhases`` adds.

A cycle of NVRx's restart loop ends by a fault NVRx restarts from: its open spans
end with the fault as their error and ``megatron.shutdown.reason =
inprocess_restart``, they are exported, and the process's telemetry stays up for
the next cycle (state ``restarting``). NVRx's finalize fires ``restart``: it ends
what the way out of ``pretrain()`` left open and nothing more. At the cycle limit a
fault is an ordinary failure, and telemetry is shut down once. A fake cycle stands
for NVRx here (the real one runs in ``tests/inprocess/``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from fake_handles import FakeHandle
from launch_times import launch_timestamps
from lifecycle_spec import STARTUP
from opentelemetry.trace import StatusCode

from megatron.core.telemetry import managed_span, set_enabled_span_groups
from megatron.core.telemetry import state as telemetry_state
from megatron.training.telemetry.lifecycle import TrainerSpanPhases
from megatron.training.telemetry_spans import SpanPhaseError

REASON = "megatron.shutdown.reason"


class FakeCycle:
    """A cycle that restarts after an ``Exception`` while ``allows`` says another may run;
    ``interrupting`` stands for NVRx holding its atomic lock (interrupting the rank)."""

    def __init__(self, allows: bool = True, interrupting: bool = False) -> None:
        self.allows, self.interrupting = allows, interrupting
        self.held: list[bool] = []  # each transition's wait argument, as it asked

    def restarts_after(self, cause: object) -> bool:
        return isinstance(cause, Exception) and self.allows

    @contextlib.contextmanager
    def exclusive(self, wait: bool) -> Iterator[bool]:
        self.held.append(wait)
        yield not (self.interrupting and not wait)


def _in_interval(lifecycles, handle, cycle, passes: int = 6) -> TrainerSpanPhases:
    phases = lifecycles.new(handle, save_interval=4, cls=TrainerSpanPhases, cycle=cycle)
    phases.start_job(model_type="gpt", timestamps=launch_timestamps())
    phases.start_train()
    for iteration in range(passes):
        phases.step(iteration)
    return phases


def test_a_fault_a_restart_follows_ends_the_cycle_and_keeps_telemetry_up(lifecycles):
    handle, cycle = FakeHandle(), FakeCycle()
    phases = _in_interval(lifecycles, handle, cycle)
    flushes = len(handle.flush_calls)
    fault = RuntimeError("injected fault at iteration 5")
    phases.shutdown(fault)
    assert phases.state == "restarting"
    assert handle.shutdown_calls == []  # the next cycle writes through the same handle
    assert len(handle.flush_calls) == flushes + 1  # exported before NVRx goes on
    finished, failed = handle.intervals()
    assert REASON not in finished.attributes
    assert failed.attributes[REASON] == "inprocess_restart"
    assert failed.attributes["error.type"] == "RuntimeError"
    assert failed.attributes["megatron.interval.last_iteration"] == 5
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "RuntimeError: injected fault at iteration 5"
    (event,) = failed.events
    assert event.attributes["exception.message"] == "injected fault at iteration 5"
    handle.recorder.assert_all_ended_exactly_once()
    # NVRx's finalize comes next, and finds nothing left to end.
    phases.restart(cause=fault)
    assert phases.state == "restarting" and len(handle.named("megatron.train")) == 2
    assert len(failed.events) == 1 and handle.shutdown_calls == []


def test_a_fault_in_the_start_ends_the_startup_span_alone(lifecycles):
    handle = FakeHandle()
    phases = lifecycles.new(handle, cls=TrainerSpanPhases, cycle=FakeCycle())
    phases.start_job(model_type="gpt", timestamps=launch_timestamps())
    phases.shutdown(RuntimeError("injected fault at startup: dataloader"))
    startup = handle.one(STARTUP)
    assert startup.attributes[REASON] == "inprocess_restart"
    assert startup.status.status_code is StatusCode.ERROR
    assert handle.named("megatron.train") == [] and handle.shutdown_calls == []
    assert phases.state == "restarting"


def test_at_the_cycle_limit_a_fault_is_a_failure_and_telemetry_shuts_down_once(lifecycles):
    handle = FakeHandle()
    phases = _in_interval(lifecycles, handle, FakeCycle(allows=False))
    fault = RuntimeError("the last fault")
    phases.shutdown(fault)
    assert phases.state == "shutdown"
    assert handle.intervals()[-1].attributes[REASON] == "exception"
    # NVRx still finalizes the cycle, then gives up; the process ends its run.
    phases.restart(cause=fault)
    phases.terminate()
    assert len(handle.shutdown_calls) == 1


def test_a_ctrl_c_is_no_restart(lifecycles):
    handle = FakeHandle()
    phases = _in_interval(lifecycles, handle, FakeCycle())
    phases.shutdown(KeyboardInterrupt())
    assert phases.state == "shutdown"
    assert handle.intervals()[-1].attributes[REASON] == "interrupt"


def test_a_clean_end_of_the_last_cycle_shuts_down(lifecycles):
    handle = FakeHandle()
    phases = _in_interval(lifecycles, handle, FakeCycle())
    phases.end_train()
    phases.shutdown()
    assert phases.state == "shutdown" and len(handle.shutdown_calls) == 1
    assert REASON not in handle.intervals()[-1].attributes


def test_held_off_by_nvrx_the_way_out_leaves_the_cycle_to_the_finalize(lifecycles):
    """NVRx is interrupting the rank (it holds its lock): the way out of ``pretrain()``
    does not wait for it, and NVRx's finalize ends the spans with the fault."""
    handle, cycle = FakeHandle(), FakeCycle(interrupting=True)
    phases = _in_interval(lifecycles, handle, cycle)
    fault = RuntimeError("Connection closed by peer")
    phases.shutdown(fault)
    assert phases.state == "interval" and len(handle.named("megatron.train")) == 1
    assert cycle.held[-1] is False  # the way out asked without waiting
    cycle.interrupting = False
    phases.restart(cause=fault)
    assert phases.state == "restarting"
    failed = handle.intervals()[-1]
    assert failed.attributes[REASON] == "inprocess_restart"
    assert failed.attributes["error.type"] == "RuntimeError"
    handle.recorder.assert_all_ended_exactly_once()


def test_every_training_transition_holds_nvrx_off_and_the_exit_paths_never_wait(lifecycles):
    cycle = FakeCycle()
    phases = _in_interval(lifecycles, FakeHandle(), cycle, passes=5)
    # start_job, start_train, the reroots at passes 0 and 4: each held, waiting.
    assert cycle.held == [True, True, True, True]
    phases.flush()
    phases.terminate()
    assert cycle.held == [True] * 4  # a signal's handler waits for nothing


def test_a_signal_between_two_cycles_shuts_the_process_telemetry_down(lifecycles):
    handle = FakeHandle()
    phases = _in_interval(lifecycles, handle, FakeCycle())
    phases.shutdown(RuntimeError("fault"))
    phases.flush()
    assert handle.shutdown_calls == []
    phases.terminate(15)
    assert phases.state == "terminated" and len(handle.shutdown_calls) == 1
    phases.restart(cause=RuntimeError("fault"))  # NVRx's finalize, too late: nothing
    assert len(handle.shutdown_calls) == 1


def test_restarting_is_the_end_of_the_cycles_training_path(lifecycles):
    phases = _in_interval(lifecycles, FakeHandle(), FakeCycle())
    phases.shutdown(RuntimeError("fault"))
    for trigger in (phases.start_job, phases.start_train, phases.end_train, phases.shutdown):
        with pytest.raises(SpanPhaseError, match="restarting"):
            trigger()
    for iteration in (6, 7):  # off a boundary: passes counted, nothing fired
        phases.step(iteration)
    with pytest.raises(SpanPhaseError, match="step"):
        phases.step(8)  # the next boundary (save_interval 4): its reroot is refused


def test_without_a_cycle_a_fault_shuts_down_as_before(lifecycles):
    handle = FakeHandle()
    phases = _in_interval(lifecycles, handle, None)
    phases.shutdown(RuntimeError("fault"))
    assert phases.state == "shutdown" and len(handle.shutdown_calls) == 1
    assert handle.intervals()[-1].attributes[REASON] == "exception"


def test_a_fault_s_traceback_is_recorded_once_on_the_first_span_it_ended(lifecycles):
    """A fault in an iteration unwinds through the iteration span and ends the cycle's
    interval: one ``exception`` event (on the iteration), ERROR status on both."""
    handle = FakeHandle()
    phases = _in_interval(lifecycles, handle, FakeCycle(), passes=2)
    previous = telemetry_state._enabled_groups
    set_enabled_span_groups({"step"})
    try:
        with (
            pytest.raises(RuntimeError) as raised,
            managed_span("step", "megatron.train.iteration", tracer=handle.tracer),
        ):
            raise RuntimeError("injected fault at iteration 1")
    finally:
        set_enabled_span_groups(previous)
    phases.shutdown(raised.value)
    iteration = handle.one("megatron.train.iteration")
    interval = handle.intervals()[-1]
    assert [event.name for event in iteration.events] == ["exception"]
    assert interval.events == ()
    assert iteration.status.status_code is interval.status.status_code is StatusCode.ERROR
    assert interval.attributes[REASON] == "inprocess_restart"
