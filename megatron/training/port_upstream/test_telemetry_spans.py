"""Unit tests for ``megatron.training.telemetry_spans``: the job-level span lifecycle.

The lifecycle is driven here with a fake tracer rather than the OpenTelemetry
SDK, so these tests need only ``opentelemetry-api`` (which Megatron-LM's ``dev``
extra brings) and ``transitions``; they run the same with the SDK installed.
The fake records every span it starts: name, parent, trace, links, start and
end times, attributes and status, so each test asserts the spans a trace
backend would receive.

What they cover: the startup trace (its backdated phases, the ``pre_startup``
trace of the time in the scheduler queue, the launch window folded into it),
one ``megatron.train`` trace per checkpoint interval linked to the one before,
the causes recorded when a run fails or is signalled, the orders the
transition table rejects, the exit paths (``flush``, ``terminate``, the
atexit and signal hooks), which never raise, and telemetry off.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import signal
import sys
import time

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode
from transitions import MachineError

from megatron.training import telemetry_spans
from megatron.training.telemetry_spans import (
    ExitHooks,
    SpanPhaseError,
    SpanPhases,
    in_packages,
    install_exit_hooks,
    mark_goodput,
)

_ids = itertools.count(1)


class FakeSpan(trace.Span):
    """A span as a backend sees it once ended (a ``trace.Span``, so contexts hold it)."""

    def __init__(self, tracer, name, parent, links, attributes, start_time):
        self.tracer = tracer
        self.name = name
        self.parent = parent
        trace_id = parent.context.trace_id if parent is not None else next(_ids)
        self.context = trace.SpanContext(trace_id, next(_ids), is_remote=False)
        self.links = [link.context for link in links or ()]
        self.attributes = dict(attributes or {})
        self.start_time = start_time
        self.end_time = None
        self.status = None
        self.exceptions = []
        self.ends = 0

    def get_span_context(self):
        return self.context

    def set_attribute(self, key, value):
        self.attributes[key] = value

    def set_attributes(self, attributes):
        self.attributes.update(attributes)

    def set_status(self, status, description=None):
        self.status = status

    def record_exception(self, exception, attributes=None, timestamp=None, escaped=False):
        self.exceptions.append(exception)

    def add_event(self, name, attributes=None, timestamp=None):
        pass

    def update_name(self, name):
        self.name = name

    def is_recording(self):
        return self.end_time is None

    def end(self, end_time=None):
        self.ends += 1
        self.end_time = end_time if end_time is not None else "now"
        self.tracer.finished.append(self)


class FakeTracer:
    """Starts FakeSpans; the parent is the span in the context it is given."""

    def __init__(self):
        self.finished = []

    def start_span(self, name, context=None, links=None, attributes=None, start_time=None, **_):
        parent = trace.get_current_span(context)
        parent = parent if isinstance(parent, FakeSpan) else None
        return FakeSpan(self, name, parent, links, attributes, start_time)


class FakeTelemetry:
    """A telemetry handle as the lifecycle needs one: tracer, is_exporting, flush, shutdown."""

    def __init__(self, exporting=True):
        self.tracer = FakeTracer()
        self.is_exporting = exporting
        self.flushes = 0
        self.shutdowns = 0

    def force_flush(self, timeout_ms=5000):
        self.flushes += 1

    def shutdown(self, timeout_ms=5000):
        self.shutdowns += 1

    def spans(self, name=None):
        """Finished spans (of ``name``), in the order they ended."""
        return [s for s in self.tracer.finished if name in (None, s.name)]


def only(telemetry, name):
    (span,) = telemetry.spans(name)
    return span


def job_on(group):
    return group == "job"


def seconds(ns):
    return ns / 1e9


@pytest.fixture(autouse=True)
def no_lifecycle_left_behind(monkeypatch):
    """Each test starts with no latest lifecycle and leaves none behind."""
    monkeypatch.setattr(SpanPhases, "_latest", None)


@pytest.fixture
def telemetry():
    return FakeTelemetry()


def lifecycle(telemetry, save_interval=0, gate=job_on):
    return SpanPhases(telemetry, save_interval=save_interval, is_span_group_enabled=gate)


def run_loop(phases, iterations):
    phases.start_train()
    for iteration in iterations:
        phases.step(iteration)
    phases.end_train()


# -- the startup trace ---------------------------------------------------------------


def test_startup_opens_at_program_start_holds_its_phases_and_closes_at_start_train(telemetry):
    phases = lifecycle(telemetry)
    phases.start_job("ModelType.encoder_or_decoder", {"program_start": 100.0})
    phases.record_phase("megatron.startup.imports", 100.0, 101.5)
    phases.record_phase("megatron.startup.unknown_end", 101.5, None)  # skipped, not faked
    assert telemetry.spans("megatron.startup") == []  # open until training starts
    phases.start_train()
    startup = only(telemetry, "megatron.startup")
    assert startup.parent is None and startup.links == []
    assert seconds(startup.start_time) == 100.0
    assert startup.attributes == {
        "is_goodput_span": True,
        "megatron.model_type": "ModelType.encoder_or_decoder",
    }
    imports = only(telemetry, "megatron.startup.imports")
    assert imports.parent is startup
    assert (seconds(imports.start_time), seconds(imports.end_time)) == (100.0, 101.5)
    assert imports.attributes == {"is_goodput_span": True}
    assert telemetry.spans("megatron.startup.unknown_end") == []
    phases.shutdown()
    assert startup.ends == 1 and telemetry.shutdowns == 1


@pytest.mark.parametrize(
    ("slurm", "launch", "due"),
    [(50.0, 60.0, True), (60.0, 60.0, False), (70.0, 60.0, False), (None, 60.0, False)],
    ids=["queued", "no_wait", "clock_skew", "not_under_slurm"],
)
def test_pre_startup_is_a_backdated_root_only_when_the_job_waited(telemetry, slurm, launch, due):
    phases = lifecycle(telemetry)
    timestamps = {"slurm_job_start_time": slurm, "launch_script_start": launch}
    phases.start_job(timestamps={**timestamps, "program_start": 100.0})
    phases.start_train()
    pre = telemetry.spans("pre_startup")
    startup = only(telemetry, "megatron.startup")
    if not due:
        assert pre == []
        return
    (pre,) = pre
    assert pre.parent is None
    assert pre.context.trace_id != startup.context.trace_id  # a trace of its own
    assert (seconds(pre.start_time), seconds(pre.end_time)) == (slurm, launch)
    assert pre.attributes == {"is_goodput_span": True}


def test_the_launch_window_folds_into_startup_when_its_times_are_in_order(telemetry):
    phases = lifecycle(telemetry)
    phases.start_job(
        timestamps={
            "launch_script_start": 90.0,
            "launch_script_presrun": 94.0,
            "program_start": 100.0,
        }
    )
    phases.start_train()
    startup = only(telemetry, "megatron.startup")
    assert seconds(startup.start_time) == 90.0  # opened at launch_script_start
    launch = only(telemetry, "megatron.startup.launch_script")
    container = only(telemetry, "megatron.startup.container_load")
    assert launch.parent is startup and container.parent is startup
    assert (seconds(launch.start_time), seconds(launch.end_time)) == (90.0, 94.0)
    assert (seconds(container.start_time), seconds(container.end_time)) == (94.0, 100.0)


@pytest.mark.parametrize(
    "timestamps",
    [
        {"launch_script_start": 90.0, "launch_script_presrun": 101.0, "program_start": 100.0},
        {"launch_script_start": 95.0, "launch_script_presrun": 94.0, "program_start": 100.0},
        {"launch_script_start": 90.0, "program_start": 100.0},
    ],
    ids=["presrun_after_program", "presrun_before_start", "no_presrun"],
)
def test_the_launch_window_stays_out_of_order_or_unknown(telemetry, timestamps):
    phases = lifecycle(telemetry)
    phases.start_job(timestamps=timestamps)
    phases.start_train()
    startup = only(telemetry, "megatron.startup")
    assert seconds(startup.start_time) == 100.0  # opened at program_start
    assert telemetry.spans("megatron.startup.launch_script") == []
    assert telemetry.spans("megatron.startup.container_load") == []


# -- one trace per checkpoint interval ---------------------------------------------


def test_an_interval_per_save_interval_each_a_trace_linked_to_the_one_before(telemetry):
    phases = lifecycle(telemetry, save_interval=3)
    phases.start_job(timestamps={"program_start": 100.0})
    # A resumed run: the passes counted, not the iteration numbers, place the boundaries.
    run_loop(phases, range(100, 107))
    phases.shutdown()
    startup = only(telemetry, "megatron.startup")
    intervals = telemetry.spans("megatron.train")
    attributes = [
        (
            s.attributes["megatron.interval.index"],
            s.attributes["megatron.interval.first_iteration"],
            s.attributes["megatron.interval.last_iteration"],
            s.attributes["megatron.interval.rerooted"],
        )
        for s in intervals
    ]
    assert attributes == [(0, 100, 102, True), (1, 103, 105, True), (2, 106, 106, False)]
    assert all(s.parent is None and s.attributes["is_goodput_span"] for s in intervals)
    traces = {s.context.trace_id for s in [startup, *intervals]}
    assert len(traces) == 4
    # C0 links to the startup trace, each Ck to C(k-1).
    assert [s.links for s in intervals] == [
        [startup.context],
        [intervals[0].context],
        [intervals[1].context],
    ]
    assert all(s.ends == 1 for s in intervals)


@pytest.mark.parametrize("save_interval", [0, -1, None])
def test_without_a_save_interval_one_interval_covers_the_loop(telemetry, save_interval):
    phases = lifecycle(telemetry, save_interval=save_interval)
    phases.start_job()
    run_loop(phases, range(50))
    phases.shutdown()
    (interval,) = telemetry.spans("megatron.train")
    assert interval.attributes["megatron.interval.first_iteration"] == 0
    assert interval.attributes["megatron.interval.last_iteration"] == 49


def test_the_loop_with_no_pass_opens_no_interval(telemetry):
    """A resume with nothing left to train: end_train right after start_train is legal."""
    phases = lifecycle(telemetry, save_interval=2)
    phases.start_job()
    phases.start_train()
    phases.end_train()
    phases.shutdown()
    assert telemetry.spans("megatron.train") == []
    assert len(telemetry.spans("megatron.startup")) == 1
    assert telemetry.shutdowns == 1


# -- why a run ended ---------------------------------------------------------------


def test_an_exception_is_recorded_on_the_interval_it_ends(telemetry):
    phases = lifecycle(telemetry, save_interval=2)
    phases.start_job()
    phases.start_train()
    phases.step(0)
    error = RuntimeError("boom")
    phases.shutdown(cause=error)
    interval = only(telemetry, "megatron.train")
    assert interval.status.status_code is StatusCode.ERROR
    assert interval.attributes["megatron.shutdown.reason"] == "exception"
    assert interval.attributes["error.type"] == "RuntimeError"
    assert interval.exceptions == [error]
    assert only(telemetry, "megatron.startup").status is None
    assert telemetry.shutdowns == 1


def test_a_failed_start_is_recorded_on_startup(telemetry):
    phases = lifecycle(telemetry)
    phases.start_job()
    phases.shutdown(cause=ValueError("bad flag"))
    startup = only(telemetry, "megatron.startup")
    assert startup.status.status_code is StatusCode.ERROR
    assert startup.attributes["error.type"] == "ValueError"


def test_a_signal_is_recorded_by_name(telemetry):
    phases = lifecycle(telemetry, save_interval=2)
    phases.start_job()
    phases.start_train()
    phases.step(0)
    phases.shutdown(cause=signal.SIGTERM)
    interval = only(telemetry, "megatron.train")
    assert interval.status.status_code is StatusCode.ERROR
    assert interval.attributes["megatron.shutdown.reason"] == "signal"
    assert interval.attributes["error.type"] == "SIGTERM"


# -- the orders the table rejects --------------------------------------------------


def _in_state(state, telemetry):
    """A lifecycle brought to ``state`` by the trainer's own triggers."""
    phases = lifecycle(telemetry, save_interval=2)
    steps = {
        "job": [],
        "startup": [phases.start_job],
        "train": [phases.start_job, phases.start_train],
        "interval": [phases.start_job, phases.start_train, lambda: phases.step(0)],
        "ended": [phases.start_job, phases.start_train, lambda: phases.step(0), phases.end_train],
        "shutdown": [phases.start_job, phases.shutdown],
    }[state]
    for fire in steps:
        fire()
    return phases


ILLEGAL = [
    ("startup", "start_job", lambda p: p.start_job()),
    ("job", "step", lambda p: p.step(0)),
    ("startup", "step", lambda p: p.step(0)),
    ("ended", "end_train", lambda p: p.end_train()),
    ("ended", "step", lambda p: p.step(5)),
    ("job", "record_phase", lambda p: p.record_phase("megatron.startup.x", 1.0, 2.0)),
    ("train", "record_phase", lambda p: p.record_phase("megatron.startup.x", 1.0, 2.0)),
    ("interval", "record_phase", lambda p: p.record_phase("megatron.startup.x", 1.0, 2.0)),
    ("shutdown", "shutdown", lambda p: p.shutdown()),
    ("shutdown", "start_job", lambda p: p.start_job()),
    ("shutdown", "start_train", lambda p: p.start_train()),
    ("shutdown", "step", lambda p: p.step(0)),
    ("shutdown", "end_train", lambda p: p.end_train()),
    ("shutdown", "record_phase", lambda p: p.record_phase("megatron.startup.x", 1.0, 2.0)),
]


@pytest.mark.parametrize("exporting", [True, False], ids=["telemetry_on", "telemetry_off"])
@pytest.mark.parametrize(
    ("state", "trigger", "fire"), ILLEGAL, ids=[f"{t}_in_{s}" for s, t, _ in ILLEGAL]
)
def test_an_illegal_order_raises_naming_trigger_and_state(state, trigger, fire, exporting):
    telemetry = FakeTelemetry(exporting=exporting)
    phases = _in_state(state, telemetry)
    finished = list(telemetry.spans())
    message = f"Can't trigger '{trigger}' in state '{state}'"
    with pytest.raises(SpanPhaseError, match=re.escape(message)) as caught:
        fire(phases)
    assert (caught.value.trigger, caught.value.state) == (trigger, state)
    assert phases.state == state  # the rejected trigger changed nothing
    assert telemetry.spans() == finished
    assert telemetry.shutdowns == (1 if state == "shutdown" else 0)


def test_span_phase_error_is_a_machine_error_with_its_trigger_and_state(telemetry):
    phases = _in_state("ended", telemetry)
    with pytest.raises(MachineError) as caught:
        phases.end_train()
    assert isinstance(caught.value, SpanPhaseError)
    assert (caught.value.trigger, caught.value.state) == ("end_train", "ended")


# -- the exit paths never raise ------------------------------------------------------


@pytest.mark.parametrize("state", ["job", "startup", "train", "interval", "ended", "shutdown"])
def test_flush_never_raises_and_changes_nothing(telemetry, state):
    phases = _in_state(state, telemetry)
    flushes = telemetry.flushes
    phases.flush()
    assert phases.state == state
    assert telemetry.flushes == flushes + (0 if state == "shutdown" else 1)


def test_terminate_ends_what_is_open_then_every_trainer_trigger_records_nothing(telemetry):
    phases = _in_state("interval", telemetry)
    phases.terminate(cause=signal.SIGTERM)
    assert phases.state == "terminated"
    interval = only(telemetry, "megatron.train")
    assert interval.attributes["error.type"] == "SIGTERM"
    assert telemetry.shutdowns == 1
    # The process outlived the signal: the loop goes on, nothing is recorded or raised.
    phases.step(1)
    phases.step(2)
    phases.end_train()
    phases.record_phase("megatron.startup.x", 1.0, 2.0)
    phases.start_train()
    phases.start_job()
    phases.shutdown()
    phases.flush()
    phases.terminate()
    assert phases.state == "terminated"
    assert telemetry.spans() == [only(telemetry, "megatron.startup"), interval]
    assert telemetry.shutdowns == 1


def test_terminate_after_the_trainers_shutdown_does_nothing(telemetry):
    """The atexit fallback after pretrain() shut down: no second shutdown, no error."""
    phases = _in_state("shutdown", telemetry)
    phases.terminate()
    assert phases.state == "shutdown"
    assert telemetry.shutdowns == 1


# -- the atexit and signal hooks ----------------------------------------------------


@pytest.fixture
def exit_hooks(monkeypatch):
    """``install_exit_hooks`` on hooks of this test's own (the process-wide ones are
    installed once per process), atexit registrations recorded rather than made, and
    the SIGTERM disposition put back afterwards."""
    registered = []
    monkeypatch.setattr(telemetry_spans.atexit, "register", registered.append)
    monkeypatch.setattr(telemetry_spans, "EXIT_HOOKS", ExitHooks())
    previous = signal.getsignal(signal.SIGTERM)

    def install(phases, graceful=False, previous_handler=signal.SIG_DFL):
        signal.signal(signal.SIGTERM, previous_handler)
        hooks = install_exit_hooks(phases, graceful=graceful, signals=(signal.SIGTERM,))
        assert hooks is telemetry_spans.EXIT_HOOKS
        return hooks, registered

    yield install
    signal.signal(signal.SIGTERM, previous)


def _sigterm():
    os.kill(os.getpid(), signal.SIGTERM)


def test_a_hard_sigterm_ends_the_spans_then_passes_the_signal_on(telemetry, exit_hooks):
    passed_on = []
    phases = _in_state("interval", telemetry)
    exit_hooks(phases, previous_handler=lambda signum, frame: passed_on.append(signum))
    _sigterm()
    assert passed_on == [signal.SIGTERM]
    assert phases.state == "terminated"
    assert only(telemetry, "megatron.train").attributes["error.type"] == "SIGTERM"
    assert telemetry.shutdowns == 1
    _sigterm()  # a later one is only passed on
    assert passed_on == [signal.SIGTERM, signal.SIGTERM]
    assert telemetry.shutdowns == 1


def test_a_process_that_ignores_sigterm_trains_on_recording_nothing(telemetry, exit_hooks):
    phases = _in_state("interval", telemetry)
    exit_hooks(phases, previous_handler=signal.SIG_IGN)
    _sigterm()
    assert phases.state == "terminated"
    phases.step(1)
    phases.step(2)
    phases.end_train()
    phases.shutdown()  # pretrain()'s own shutdown, after the loop
    assert len(telemetry.spans("megatron.train")) == 1
    assert telemetry.shutdowns == 1


def test_a_graceful_sigterm_flushes_once_and_leaves_the_spans_open(telemetry, exit_hooks):
    """--exit-signal-handler: the trainer drains and shuts down itself."""
    drained = []
    phases = _in_state("interval", telemetry)
    exit_hooks(phases, graceful=True, previous_handler=lambda s, f: drained.append(s))
    _sigterm()
    _sigterm()
    assert drained == [signal.SIGTERM, signal.SIGTERM]
    assert telemetry.flushes == 1  # the first signal flushes, later ones only chain
    assert phases.state == "interval"
    assert telemetry.spans("megatron.train") == []
    phases.end_train()
    phases.shutdown()
    assert len(telemetry.spans("megatron.train")) == 1
    assert telemetry.shutdowns == 1


def _called_through(*modules, then):
    """``then(frame)`` at the innermost of nested calls through functions of ``modules``
    (outermost first), as if a signal landed there."""
    call = then
    for depth, module in enumerate(reversed(modules)):
        namespace = {"__name__": module, "sys": sys}
        body = "return inner(sys._getframe())" if depth == 0 else "return inner()"
        exec(f"def level(inner):\n    {body}", namespace)
        call = functools.partial(namespace["level"], call)
    return call()


@pytest.mark.parametrize(
    ("modules", "inside"),
    [
        (("opentelemetry.sdk.trace",), True),
        (("nemo.lens.providers",), True),  # Megatron-LM's telemetry base layer
        (("megatron.training.telemetry_spans",), True),
        # the standard library called under a telemetry lock: still inside
        (("opentelemetry.sdk.metrics._internal", "collections", "threading"), True),
        # a function a telemetry decorator wraps: its body is the trainer's
        (("opentelemetry.util._decorator", "megatron.training.training"), False),
        (("nemo.lensing",), False),
        (("collections",), False),  # called from this test
    ],
)
def test_a_signal_lands_inside_telemetry_where_its_code_runs(modules, inside):
    packages = ExitHooks.TELEMETRY_PACKAGES
    assert _called_through(*modules, then=lambda f: in_packages(f, packages)) is inside


def test_a_sigterm_inside_telemetry_code_is_acted_on_once_it_is_left(telemetry, exit_hooks):
    """Telemetry code may hold a lock the exit path needs (a span processor's, the SDK's
    around a metric): the handler waits until the main thread is out, then acts."""
    passed_on = []
    phases = _in_state("interval", telemetry)
    hooks, _ = exit_hooks(phases, previous_handler=lambda signum, frame: passed_on.append(frame))
    _called_through(
        "opentelemetry.sdk.trace", then=lambda frame: hooks.handle_sigterm(signal.SIGTERM, frame)
    )
    assert (phases.state, passed_on) == ("interval", [])  # nothing done in there
    deadline = time.monotonic() + 60  # only ends a wait that never ends
    while not passed_on:  # the signal comes back to this test's code
        assert time.monotonic() < deadline, "the signal was not delivered again"
        time.sleep(0.01)
    assert phases.state == "terminated"
    assert only(telemetry, "megatron.train").attributes["error.type"] == "SIGTERM"
    assert passed_on[0].f_globals["__name__"] == __name__
    assert telemetry.shutdowns == 1


def test_a_main_thread_stuck_in_telemetry_code_is_acted_on_after_the_timeout(telemetry, exit_hooks):
    passed_on = []
    phases = _in_state("interval", telemetry)
    phases.timeout_ms = 0  # what a flush may take: stuck there longer, not busy
    hooks, _ = exit_hooks(phases, previous_handler=lambda signum, frame: passed_on.append(signum))
    _called_through(
        "opentelemetry.sdk.trace", then=lambda frame: hooks.handle_sigterm(signal.SIGTERM, frame)
    )
    assert (phases.state, passed_on) == ("terminated", [signal.SIGTERM])


def test_the_atexit_fallback_terminates_and_is_harmless_after_shutdown(telemetry, exit_hooks):
    phases = _in_state("interval", telemetry)
    _, registered = exit_hooks(phases)
    assert len(registered) >= 1
    for hook in registered:
        hook()
    assert phases.state == "terminated"
    assert telemetry.shutdowns == 1
    finished = _in_state("shutdown", FakeTelemetry())
    _, registered = exit_hooks(finished)
    for hook in registered:
        hook()
    assert finished.state == "shutdown"
    assert finished.telemetry.shutdowns == 1


def test_hooks_are_installed_once_and_act_on_the_latest_lifecycle(telemetry, exit_hooks):
    first = _in_state("shutdown", telemetry)
    hooks, registered = exit_hooks(first)
    assert signal.getsignal(signal.SIGTERM) == hooks.handle_sigterm
    second_telemetry = FakeTelemetry()
    second = _in_state("interval", second_telemetry)
    install_exit_hooks(second, signals=(signal.SIGTERM,))
    assert len(registered) == 1 and hooks.target is second
    registered[0]()
    assert second.state == "terminated" and first.state == "shutdown"
    assert (telemetry.shutdowns, second_telemetry.shutdowns) == (1, 1)


def test_no_hook_for_a_lifecycle_whose_telemetry_does_not_export(exit_hooks):
    phases = _in_state("startup", FakeTelemetry(exporting=False))
    _, registered = exit_hooks(phases)
    assert registered == []
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.parametrize("error", [ValueError("not the main thread"), OSError("no signals")])
def test_installing_where_signals_cannot_be_hooked_does_not_raise(
    telemetry, exit_hooks, monkeypatch, error
):
    def refuse(*_):
        raise error

    phases = _in_state("interval", telemetry)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with monkeypatch.context() as patch:
        patch.setattr(telemetry_spans.signal, "signal", refuse)
        install_exit_hooks(phases, signals=(signal.SIGTERM,))
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    # The atexit fallback remains.
    telemetry_spans.EXIT_HOOKS.process_exit()
    assert phases.state == "terminated"


# -- telemetry off, and a train() without pretrain() --------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: (FakeTelemetry(exporting=False), job_on),
        lambda: (FakeTelemetry(), lambda group: False),
    ],
    ids=["not_exporting", "job_group_off"],
)
def test_telemetry_off_records_nothing(make):
    telemetry, gate = make()
    phases = lifecycle(telemetry, save_interval=1, gate=gate)
    phases.start_job(timestamps={"slurm_job_start_time": 1.0, "launch_script_start": 2.0})
    phases.record_phase("megatron.startup.imports", 2.0, 3.0)
    run_loop(phases, range(3))
    phases.shutdown()
    assert telemetry.spans() == []


def test_train_without_pretrain_gets_a_lifecycle_in_startup():
    """Megatron-LM's train() asks SpanPhases.current(); with no pretrain() before it,
    it gets a telemetry-off lifecycle already in startup, and trains."""
    phases = SpanPhases.current()
    assert phases is not None and phases.state == "startup"
    run_loop(phases, range(4))
    phases.shutdown()
    assert phases.state == "shutdown"


def test_train_finds_the_lifecycle_of_the_latest_pretrain(telemetry):
    first = lifecycle(telemetry)
    first.start_job()
    assert SpanPhases.current() is first
    second = lifecycle(FakeTelemetry())
    second.start_job()
    assert SpanPhases.current() is second
    second.start_train()
    # train() called again after its loop: a telemetry-off lifecycle of its own.
    again = SpanPhases.current()
    assert again is not second and again.state == "startup" and not again.enabled


def test_a_failing_tracer_never_breaks_training(telemetry):
    def broken(*_, **__):
        raise RuntimeError("exporter gone")

    telemetry.tracer.start_span = broken
    phases = lifecycle(telemetry, save_interval=1)
    phases.start_job(timestamps={"program_start": 1.0})
    phases.record_phase("megatron.startup.imports", 1.0, 2.0)
    run_loop(phases, range(3))
    phases.shutdown()
    assert phases.state == "shutdown"
    assert telemetry.shutdowns == 1


def test_mark_goodput_marks_a_span_and_never_raises(telemetry):
    span = telemetry.tracer.start_span("megatron.checkpoint.save")
    mark_goodput(span)
    assert span.attributes == {"is_goodput_span": True}
    mark_goodput(None)

    class Broken:
        def set_attribute(self, *_):
            raise RuntimeError("ended")

    mark_goodput(Broken())
