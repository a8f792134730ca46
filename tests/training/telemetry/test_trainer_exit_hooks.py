"""The exit hooks (``megatron/training/README.md``, "Exit paths and the exit-hook
machine"), in process, with the process faked.

``atexit.register``, ``signal.signal``, ``signal.getsignal``, ``os.kill`` and
``signal.raise_signal`` are replaced by recorders, so installing and chaining can
be counted without touching the test process. The real-signal behaviour is in
test_signals.py.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import pytest
from fake_handles import FakeHandle, ForbiddenHandle
from fake_process import PreviousHandler
from lifecycle_spec import PATH_TO_STATE, TRAIN

from megatron.training.telemetry.lifecycle import (
    TRAINER_EXIT_HOOKS,
    TrainerExitHooks,
    TrainerSpanPhases,
    install_exit_hooks,
)


@pytest.fixture
def lifecycles(lifecycles):
    """The trainer's lifecycles: a graceful signal flushes through the handle."""
    lifecycles.cls = TrainerSpanPhases
    return lifecycles


def in_interval(lifecycles, handle, save_interval=2):
    phases = lifecycles.new(handle, save_interval=save_interval)
    phases.start_job(model_type="gpt", timestamps=None)
    phases.start_train()
    phases.step(0)
    assert phases.state == "interval"
    return phases


def megatron_warnings(caplog):
    return [
        r for r in caplog.records if r.name.startswith("megatron") and r.levelno >= logging.WARNING
    ]


def test_hooks_machine_states():
    hooks = TrainerExitHooks()
    assert hooks.state == "uninstalled"
    assert isinstance(TRAINER_EXIT_HOOKS, TrainerExitHooks)


def test_installed_exactly_once_across_repeated_lifecycles(fake_process, lifecycles):
    hooks = TrainerExitHooks()
    handles = []
    for round_ in range(4):
        handle = FakeHandle()
        handles.append(handle)
        phases = lifecycles.new(handle, save_interval=2)
        hooks.attach(phases, graceful=bool(round_ % 2))
        assert hooks.state == "installed"
        phases.start_job(model_type="gpt", timestamps=None)
        phases.start_train()
        for iteration in range(3):
            phases.step(iteration)
        phases.end_train()
        phases.shutdown()

    assert fake_process.atexit_calls == [hooks.process_exit]
    assert [h for _, h in fake_process.signal_calls] == [hooks.handle_sigterm] * 3
    # Each run's own handle was shut down exactly once, by its own lifecycle.
    assert [len(h.shutdown_calls) for h in handles] == [1, 1, 1, 1]
    # The atexit fallback after the last run finds nothing to do.
    hooks.process_exit()
    assert [len(h.shutdown_calls) for h in handles] == [1, 1, 1, 1]


OFF_VARIANTS = {
    "no_handle": lambda: (None, None),
    "not_exporting": lambda: (ForbiddenHandle(is_exporting=False), None),
}


@pytest.mark.parametrize("variant", sorted(OFF_VARIANTS))
def test_not_installed_when_telemetry_is_off(fake_process, lifecycles, variant):
    handle, enabled = OFF_VARIANTS[variant]()
    hooks = TrainerExitHooks()
    for _ in range(2):
        phases = lifecycles.new(handle, save_interval=2, enabled=enabled)
        hooks.attach(phases)
        hooks.attach(phases, graceful=True)
        phases.start_job()
        assert hooks.state == "uninstalled"
    assert fake_process.atexit_calls == []
    assert fake_process.signal_calls == []
    # Nothing was registered with atexit: the lifecycle is the trainer's alone.
    assert phases.state == "startup"


@pytest.mark.parametrize("span_groups", [(), ("step",)], ids=["traces_off", "job_group_off"])
def test_installed_when_the_handle_exports_without_the_job_group(
    fake_process, lifecycles, span_groups
):
    """Metrics, logs and per-step spans still need flushing at a SIGTERM."""
    handle = FakeHandle(span_groups=span_groups)
    hooks = TrainerExitHooks()
    phases = lifecycles.new(
        handle, save_interval=2, is_span_group_enabled=lambda group: group in span_groups
    )
    hooks.attach(phases)
    assert hooks.state == "installed"  # the hooks are there...
    phases.start_job()
    assert handle.recorder.start_order == []  # ...but no job-level spans
    hooks.process_exit()
    assert phases.state == "terminated"
    assert len(handle.shutdown_calls) == 1


def test_the_hooks_act_on_the_latest_lifecycle_whatever_its_telemetry(fake_process, lifecycles):
    """As Megatron-LM's module globals did: the latest lifecycle made is the one the
    hooks end (one with telemetry off has nothing to end)."""
    hooks = TrainerExitHooks()
    handle = FakeHandle()
    on = in_interval(lifecycles, handle)
    hooks.attach(on)
    off = lifecycles.new(None, save_interval=2)
    hooks.attach(off)
    hooks.process_exit()
    assert (on.state, off.state) == ("interval", "terminated")
    assert handle.shutdown_calls == []


def test_hooks_act_on_the_newest_lifecycle(fake_process, lifecycles):
    hooks = TrainerExitHooks()
    first_handle, second_handle = FakeHandle(), FakeHandle()
    first = in_interval(lifecycles, first_handle)
    hooks.attach(first)
    second = in_interval(lifecycles, second_handle)
    hooks.attach(second)

    hooks.process_exit()
    assert second.state == "terminated"
    assert len(second_handle.shutdown_calls) == 1
    assert first.state == "interval", "the hooks shut down an older lifecycle"
    assert first_handle.shutdown_calls == []
    assert len(second_handle.named(TRAIN)) == 1
    assert fake_process.atexit_calls == [hooks.process_exit]


def test_process_exit_after_shutdown_does_nothing(fake_process, lifecycles, caplog):
    caplog.set_level(logging.WARNING)
    hooks = TrainerExitHooks()
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    hooks.attach(phases)
    phases.end_train()
    phases.shutdown()
    spans_before = handle.spans()

    hooks.process_exit()
    hooks.process_exit()
    assert phases.state == "shutdown"
    assert len(handle.shutdown_calls) == 1
    assert handle.spans() == spans_before
    assert megatron_warnings(caplog) == []


@pytest.mark.parametrize("state", ["job", "startup", "train", "interval", "ended"])
def test_process_exit_terminates_from_any_live_state(fake_process, lifecycles, state):
    hooks = TrainerExitHooks()
    handle = FakeHandle()
    phases = lifecycles.new(handle, save_interval=2)
    for trigger in PATH_TO_STATE[state]:
        getattr(phases, "step" if trigger == "reroot" else trigger)()
    hooks.attach(phases)
    hooks.process_exit()
    assert phases.state == "terminated"
    assert len(handle.shutdown_calls) == 1
    handle.recorder.assert_all_ended_exactly_once()


def test_hard_sigterm_shuts_down_then_calls_previous_handler(fake_process, lifecycles):
    hooks = TrainerExitHooks()
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    previous = PreviousHandler(lambda: phases)
    fake_process.previous = previous
    hooks.attach(phases)

    hooks.handle_sigterm(signal.SIGTERM, None)
    assert hooks.state == "terminating"
    assert phases.state == "terminated"
    assert len(handle.shutdown_calls) == 1
    # Chained after the shutdown: the previous handler saw the final state.
    assert previous.calls == [(signal.SIGTERM, None, "terminated")]
    assert fake_process.resends() == []
    handle.recorder.assert_all_ended_exactly_once()
    assert len(handle.named(TRAIN)) == 1

    # A second SIGTERM while terminating does not shut down again.
    hooks.handle_sigterm(signal.SIGTERM, None)
    assert hooks.state == "terminating"
    assert len(handle.shutdown_calls) == 1
    # ... and so does the atexit fallback that follows.
    hooks.process_exit()
    assert len(handle.shutdown_calls) == 1


def test_hard_sigterm_with_default_disposition_resends_the_signal(fake_process, lifecycles):
    hooks = TrainerExitHooks()
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    fake_process.previous = signal.SIG_DFL
    hooks.attach(phases)
    fake_process.events.clear()

    hooks.handle_sigterm(signal.SIGTERM, None)
    assert phases.state == "terminated"
    assert len(handle.shutdown_calls) == 1
    # SIG_DFL is restored first, then SIGTERM is re-sent to this very process.
    assert fake_process.events == [
        ("signal", signal.SIGTERM, signal.SIG_DFL),
        ("kill", os.getpid(), signal.SIGTERM),
    ]


def test_hard_sigterm_with_ignored_disposition_does_nothing_more(fake_process, lifecycles):
    hooks = TrainerExitHooks()
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    fake_process.previous = signal.SIG_IGN
    hooks.attach(phases)
    fake_process.events.clear()

    hooks.handle_sigterm(signal.SIGTERM, None)
    assert phases.state == "terminated"
    assert len(handle.shutdown_calls) == 1
    assert fake_process.events == []


def test_graceful_sigterm_only_flushes_and_chains(fake_process, lifecycles):
    hooks = TrainerExitHooks()
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    previous = PreviousHandler(lambda: phases)
    fake_process.previous = previous
    hooks.attach(phases, graceful=True)

    hooks.handle_sigterm(signal.SIGTERM, None)
    assert hooks.state == "installed"
    assert phases.state == "interval"
    assert len(handle.flush_calls) == 1
    assert handle.shutdown_calls == []
    assert handle.named(TRAIN) == [], "graceful drain must keep the interval open"
    assert previous.calls == [(signal.SIGTERM, None, "interval")]

    # The trainer then drains and takes the normal exit path.
    phases.step(1)
    phases.end_train()
    phases.shutdown()
    assert len(handle.shutdown_calls) == 1
    hooks.process_exit()
    assert len(handle.shutdown_calls) == 1


def test_graceful_mode_is_decided_by_the_first_attach(fake_process, lifecycles):
    """As Megatron-LM's installer did: the pretrain() that installs the hooks says
    whether a SIGTERM only flushes, for the process."""
    hooks = TrainerExitHooks()
    fake_process.previous = signal.SIG_IGN

    first = in_interval(lifecycles, FakeHandle())
    hooks.attach(first, graceful=True)
    second_handle = FakeHandle()
    second = in_interval(lifecycles, second_handle)
    hooks.attach(second, graceful=False)
    hooks.handle_sigterm(signal.SIGTERM, None)
    assert (first.state, second.state) == ("interval", "interval")
    assert len(second_handle.flush_calls) == 1  # the latest's, flushed

    hooks = TrainerExitHooks()
    third = in_interval(lifecycles, FakeHandle())
    hooks.attach(third, graceful=False)
    fourth = in_interval(lifecycles, FakeHandle())
    hooks.attach(fourth, graceful=True)
    hooks.handle_sigterm(signal.SIGTERM, None)
    assert (third.state, fourth.state) == ("interval", "terminated")


def test_process_wide_hooks_untouched_by_an_off_lifecycle(fake_process, lifecycles):
    state_before = TRAINER_EXIT_HOOKS.state
    phases = lifecycles.new(None)
    assert install_exit_hooks(phases) is TRAINER_EXIT_HOOKS
    assert install_exit_hooks(phases, graceful=True) is TRAINER_EXIT_HOOKS
    assert TRAINER_EXIT_HOOKS.state == state_before
    assert fake_process.atexit_calls == []
    assert fake_process.signal_calls == []


class CallbackTracer:
    """Wraps a real tracer; runs ``on_train`` while megatron.train is being started,
    i.e. from inside the reroot transition's callback, like a signal would."""

    def __init__(self, tracer, on_train) -> None:
        self._tracer = tracer
        self._on_train = on_train
        self.fired = 0

    def start_span(self, name, *args, **kwargs):
        if name == TRAIN and not self.fired:
            self.fired += 1
            self._on_train()
        return self._tracer.start_span(name, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tracer, name)


@pytest.mark.parametrize("graceful", [False, True], ids=["hard", "graceful"])
def test_sigterm_inside_a_transition_waits_for_it_to_complete(fake_process, lifecycles, graceful):
    hooks = TrainerExitHooks()
    handle = FakeHandle()
    seen_during_callback = []

    def sigterm_now():
        # As the interpreter calls it: with the frame it interrupted, in the callback.
        hooks.handle_sigterm(signal.SIGTERM, sys._getframe())
        seen_during_callback.append((phases.state, len(handle.shutdown_calls)))

    handle.tracer = CallbackTracer(handle.tracer, sigterm_now)
    phases = lifecycles.new(handle, save_interval=2)
    previous = PreviousHandler(lambda: phases)
    fake_process.previous = previous
    hooks.attach(phases, graceful=graceful)
    hooks.redelivery.send = lambda thread, signum: None  # this test delivers it again
    phases.start_job(model_type="gpt", timestamps=None)
    phases.start_train()

    phases.step(0)  # the reroot whose callback "receives" SIGTERM
    assert handle.tracer.fired == 1
    # Nothing happened inside the transition; everything once it comes back outside.
    assert seen_during_callback == [("interval", 0)]
    assert previous.calls == [] and phases.state == "interval"
    hooks.handle_sigterm(signal.SIGTERM, sys._getframe())
    hooks.redelivery.thread.join(60)
    assert len(previous.calls) == 1
    if graceful:
        assert phases.state == "interval"
        assert [(signum, state) for signum, _, state in previous.calls] == [
            (signal.SIGTERM, "interval")
        ]
        assert len(handle.flush_calls) == 1
        assert handle.shutdown_calls == []
        phases.shutdown()
    else:
        assert phases.state == "terminated"
        assert [(signum, state) for signum, _, state in previous.calls] == [
            (signal.SIGTERM, "terminated")
        ]
        assert hooks.state == "terminating"
        assert len(handle.shutdown_calls) == 1
    # The interval being opened when the signal came exists and was ended once.
    (interval,) = handle.named(TRAIN)
    assert interval.attributes["megatron.interval.index"] == 0
    handle.recorder.assert_all_ended_exactly_once()


def test_hard_sigterm_after_normal_shutdown_only_chains(fake_process, lifecycles, caplog):
    caplog.set_level(logging.WARNING)
    hooks = TrainerExitHooks()
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    previous = PreviousHandler(lambda: phases)
    fake_process.previous = previous
    hooks.attach(phases)
    phases.end_train()
    phases.shutdown()

    hooks.handle_sigterm(signal.SIGTERM, None)
    assert len(handle.shutdown_calls) == 1
    assert previous.calls == [(signal.SIGTERM, None, "shutdown")]
    assert megatron_warnings(caplog) == []


def test_install_exit_hooks_attaches_to_the_process_wide_instance(
    fake_process, lifecycles, monkeypatch
):
    import megatron.training.telemetry.lifecycle as telemetry_spans

    fresh = TrainerExitHooks()
    monkeypatch.setattr(telemetry_spans, "TRAINER_EXIT_HOOKS", fresh)
    trainer_calls = []
    fake_process.previous = lambda signum, frame: trainer_calls.append(signum)
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    assert telemetry_spans.install_exit_hooks(phases) is fresh
    assert fresh.state == "installed"
    assert fake_process.atexit_calls == [fresh.process_exit]
    newer_handle = FakeHandle()
    newer = in_interval(lifecycles, newer_handle)
    assert telemetry_spans.install_exit_hooks(newer, graceful=True) is fresh
    assert len(fake_process.atexit_calls) == 1
    fresh.handle_sigterm(signal.SIGTERM, None)  # hard, as the first attach said
    assert (phases.state, newer.state) == ("interval", "terminated")  # the newest ended
    assert newer_handle.flush_calls == [] and len(newer_handle.shutdown_calls) == 1
    assert trainer_calls == [signal.SIGTERM]


def test_graceful_mode_without_a_handler_to_drain_is_a_hard_stop(fake_process, lifecycles):
    """With SIGTERM's default action next, a flush alone would lose the open spans."""
    hooks = TrainerExitHooks()
    fake_process.previous = signal.SIG_DFL
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    hooks.attach(phases, graceful=True)
    hooks.handle_sigterm(signal.SIGTERM, None)
    assert phases.state == "terminated"
    assert hooks.state == "terminating"
    assert len(handle.shutdown_calls) == 1
    assert ("kill", os.getpid(), signal.SIGTERM) in fake_process.events


# -- SIGHUP and SIGINT -----------------------------------------------------------


def test_sighup_and_sigint_are_hooked_beside_sigterm(fake_process, lifecycles):
    hooks = TrainerExitHooks()
    fake_process.previous = signal.SIG_DFL
    hooks.attach(in_interval(lifecycles, FakeHandle()))
    hooked = {signum for signum, handler in fake_process.signal_calls}
    assert hooked == {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
    assert {handler for _, handler in fake_process.signal_calls} == {hooks.handle_sigterm}


def test_an_ignored_sighup_or_sigint_stays_ignored_and_unhooked(fake_process, lifecycles):
    # nohup ignores SIGHUP: a dropped ssh session must not stop telemetry.
    hooks = TrainerExitHooks()
    fake_process.previous = signal.SIG_IGN
    hooks.attach(in_interval(lifecycles, FakeHandle()))
    assert [signum for signum, _ in fake_process.signal_calls] == [signal.SIGTERM]


def test_hard_sighup_shuts_down_and_dies_by_sighup(fake_process, lifecycles):
    hooks = TrainerExitHooks()
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    fake_process.previous = signal.SIG_DFL
    hooks.attach(phases, graceful=True)  # --exit-signal-handler is about SIGTERM only
    fake_process.events.clear()

    hooks.handle_sigterm(signal.SIGHUP, None)
    assert phases.state == "terminated" and hooks.state == "terminating"
    assert len(handle.shutdown_calls) == 1
    assert fake_process.events == [
        ("signal", signal.SIGHUP, signal.SIG_DFL),
        ("kill", os.getpid(), signal.SIGHUP),
    ]


def test_sigint_with_python_handler_flushes_and_lets_the_interrupt_unwind(fake_process, lifecycles):
    # Python's default SIGINT handler raises KeyboardInterrupt: the run's own
    # exception path then ends the in-flight spans with ERROR and shuts down.
    hooks = TrainerExitHooks()
    handle = FakeHandle()
    phases = in_interval(lifecycles, handle)
    previous = PreviousHandler(lambda: phases)
    fake_process.previous = previous
    hooks.attach(phases)

    hooks.handle_sigterm(signal.SIGINT, None)
    assert hooks.state == "installed" and phases.state == "interval"
    assert handle.shutdown_calls == [] and len(handle.flush_calls) == 1
    assert previous.calls == [(signal.SIGINT, None, "interval")]
