"""Unit tests for ``megatron.training.telemetry_spans``: the job-level span lifecycle.

The lifecycle is driven here with a fake tracer rather than the OpenTelemetry
SDK, so these tests need only ``opentelemetry-api`` (which Megatron-LM's ``dev``
extra brings) and ``transitions``; they run the same with the SDK installed.
The fake records every span it starts: name, parent, trace, links, start and
end times, attributes and status, so each test asserts the spans a trace
backend would receive. No test sends a signal: the exit hooks' handler is
called as the interpreter would call it, and ``os.kill`` is recorded.

What they cover: the startup trace (its backdated phases, ``pre_startup``, the
launch window folded into it), one ``megatron.train`` trace per checkpoint
interval linked to the one before, the causes recorded when a run fails or is
signalled, the orders the transition table rejects
(raised where asked for, else logged once), the exit paths (``flush``,
``terminate``, the atexit and SIGTERM hooks, a signal landing inside telemetry
code), which never raise, telemetry off, and ``transitions`` not installed.
"""

import functools
import itertools
import logging
import re
import signal
import subprocess
import sys
import threading

import pytest
from opentelemetry import context, trace
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
_detach = context.detach  # the real one, whatever a test makes of context.detach


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
        self.tracer.on_end(self)


class FakeTracer:
    """Starts FakeSpans; the parent is the span in the context it is given (or the
    current one)."""

    def __init__(self):
        self.finished = []
        self.on_end = lambda span: None  # what a test makes happen as a span ends

    def start_span(self, name, context=None, links=None, attributes=None, start_time=None, **_):
        parent = trace.get_current_span(context)
        parent = parent if isinstance(parent, FakeSpan) else None
        return FakeSpan(self, name, parent, links, attributes, start_time)


class FakeTelemetry:
    """A telemetry handle as Megatron-LM's ``get_telemetry()`` returns one: a tracer,
    whether it exports, and ``shutdown()``."""

    def __init__(self, exporting=True):
        self.tracer = FakeTracer()
        self.is_exporting = exporting
        self.shutdowns = 0

    def shutdown(self, timeout_ms=5000):
        self.shutdowns += 1

    def spans(self, name=None):
        """Finished spans (of ``name``), in the order they ended."""
        return [s for s in self.tracer.finished if name in (None, s.name)]


class FakeProvider:
    """The global tracer provider nemo-lens installs; the lifecycle flushes it."""

    def __init__(self):
        self.flushes = []

    def force_flush(self, timeout_millis=30000):
        self.flushes.append(timeout_millis)
        return True


def only(telemetry, name):
    (span,) = telemetry.spans(name)
    return span


def job_on(group):
    return group == "job"


def seconds(ns):
    return ns / 1e9


def covered(interval):
    """What an interval says it covered: index, first and last iteration, and whether a
    reroot ended it."""
    keys = ("index", "first_iteration", "last_iteration", "rerooted")
    return tuple(interval.attributes[f"megatron.interval.{key}"] for key in keys)


@pytest.fixture(autouse=True)
def no_lifecycle_left_behind(monkeypatch):
    """Each test starts with no latest lifecycle, no exit hooks and no current span,
    and leaves none of them behind (a lifecycle a test leaves open keeps its span
    current)."""
    monkeypatch.setattr(SpanPhases, "_latest", None)
    monkeypatch.setattr(ExitHooks, "process", None)
    token = context.attach(context.Context())
    yield
    _detach(token)


@pytest.fixture
def telemetry():
    return FakeTelemetry()


@pytest.fixture
def provider(monkeypatch):
    """A fake global tracer provider, as ``trace.get_tracer_provider()`` returns it."""
    fake = FakeProvider()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: fake)
    return fake


def lifecycle(telemetry, save_interval=0, gate=job_on, strict=True):
    return SpanPhases(
        telemetry, save_interval=save_interval, is_span_group_enabled=gate, strict=strict
    )


def run_loop(phases, passes):
    phases.start_train()
    for _ in range(passes):
        phases.step()
    phases.end_train()


# -- the startup trace ---------------------------------------------------------------


def test_startup_opens_at_program_start_holds_its_phases_and_closes_at_start_train(telemetry):
    phases = lifecycle(telemetry)
    phases.start_job("ModelType.encoder_or_decoder", {"program_start": 100.0})
    phases.record_phase("megatron.startup.imports", 100.0, 101.5)
    phases.record_phase("megatron.startup.unknown_end", 101.5, None)  # skipped, not faked
    assert telemetry.spans("megatron.startup") == []  # open until training starts
    assert trace.get_current_span().name == "megatron.startup"  # what runs now nests in it
    phases.start_train()
    assert trace.get_current_span() is trace.INVALID_SPAN
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
        {},
    ],
    ids=["presrun_after_program", "presrun_before_start", "no_presrun", "nothing_known"],
)
def test_the_launch_window_stays_out_of_order_or_unknown(telemetry, timestamps):
    phases = lifecycle(telemetry)
    phases.start_job(timestamps=timestamps)
    phases.start_train()
    startup = only(telemetry, "megatron.startup")
    start = timestamps.get("program_start")
    assert startup.start_time == (None if start is None else int(start * 1e9))  # else: now
    assert telemetry.spans("megatron.startup.launch_script") == []
    assert telemetry.spans("megatron.startup.container_load") == []


def test_the_lifecycle_names_its_parents_whatever_is_current(telemetry):
    """A caller's span around pretrain() (or one left current): pre_startup and
    megatron.startup still root traces of their own, and the phases nest in startup."""
    outer = telemetry.tracer.start_span("the caller's own")
    token = context.attach(trace.set_span_in_context(outer))
    try:
        phases = lifecycle(telemetry)
        phases.start_job(
            timestamps={
                "slurm_job_start_time": 50.0,
                "launch_script_start": 60.0,
                "launch_script_presrun": 70.0,
                "program_start": 80.0,
            }
        )
        inner = telemetry.tracer.start_span("something current inside startup")
        inner_token = context.attach(trace.set_span_in_context(inner))
        phases.record_phase("megatron.startup.imports", 80.0, 90.0)
        context.detach(inner_token)
        phases.start_train()
    finally:
        context.detach(token)
    startup = only(telemetry, "megatron.startup")
    assert only(telemetry, "pre_startup").parent is None and startup.parent is None
    for name in ("launch_script", "container_load", "imports"):
        assert only(telemetry, f"megatron.startup.{name}").parent is startup


# -- one trace per checkpoint interval ---------------------------------------------


def test_an_interval_per_save_interval_each_a_trace_linked_to_the_one_before(telemetry):
    phases = lifecycle(telemetry, save_interval=3)
    phases.start_job(timestamps={"program_start": 100.0})
    phases.start_train()
    # A resumed run: the passes counted, not the iteration numbers, place the boundaries.
    for iteration in range(100, 107):
        phases.step(iteration)
        assert trace.get_current_span().name == "megatron.train"  # the pass nests in it
    phases.end_train()
    phases.shutdown()
    startup = only(telemetry, "megatron.startup")
    intervals = telemetry.spans("megatron.train")
    assert [covered(s) for s in intervals] == [
        (0, 100, 102, True),
        (1, 103, 105, True),
        (2, 106, 106, False),
    ]
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
    assert trace.get_current_span() is trace.INVALID_SPAN


@pytest.mark.parametrize("save_interval", [0, -1, None])
def test_without_a_save_interval_one_interval_covers_the_loop(telemetry, save_interval):
    """No checkpoints: the loop's spans nest in one megatron.train, linked to startup."""
    phases = lifecycle(telemetry, save_interval=save_interval)
    phases.start_job()
    phases.start_train()
    for iteration in range(50):
        phases.step(iteration)
    phases.end_train()
    phases.shutdown()
    (interval,) = telemetry.spans("megatron.train")
    assert covered(interval) == (0, 0, 49, False)
    assert interval.links == [only(telemetry, "megatron.startup").context]


@pytest.mark.parametrize("end", ["shutdown", "terminate"])
def test_an_interval_cut_short_covers_the_pass_in_flight(telemetry, end):
    phases = lifecycle(telemetry, save_interval=4)
    phases.start_job()
    phases.start_train()
    for iteration in range(10, 16):  # an exception, or a signal, in the pass of 15
        phases.step(iteration)
    getattr(phases, end)()
    intervals = telemetry.spans("megatron.train")
    assert [covered(s) for s in intervals] == [(0, 10, 13, True), (1, 14, 15, False)]


def test_without_iteration_numbers_an_interval_records_its_index_alone(telemetry):
    phases = _in_state("interval", telemetry)
    phases.end_train()
    (interval,) = telemetry.spans("megatron.train")
    assert interval.attributes == {
        "is_goodput_span": True,
        "megatron.interval.index": 0,
        "megatron.interval.rerooted": False,
    }


def test_an_interval_whose_attributes_fail_is_ended_all_the_same(telemetry):
    class Refusing(FakeSpan):
        def set_attribute(self, key, value):
            if key.startswith("megatron.interval."):
                raise RuntimeError("exporter gone")
            super().set_attribute(key, value)

    class Tracer(FakeTracer):
        def start_span(self, name, context=None, links=None, attributes=None, start_time=None, **_):
            parent = trace.get_current_span(context)
            parent = parent if isinstance(parent, FakeSpan) else None
            return Refusing(self, name, parent, links, attributes, start_time)

    telemetry.tracer = Tracer()
    phases = _in_state("interval", telemetry)
    phases.end_train()
    assert only(telemetry, "megatron.train").ends == 1
    assert trace.get_current_span() is trace.INVALID_SPAN


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
    phases = _in_state("interval", telemetry)
    error = RuntimeError("boom")
    phases.shutdown(cause=error)
    interval = only(telemetry, "megatron.train")
    assert interval.status.status_code is StatusCode.ERROR
    assert interval.status.description == "RuntimeError: boom"
    assert interval.attributes["megatron.shutdown.reason"] == "exception"
    assert interval.attributes["error.type"] == "RuntimeError"
    assert interval.exceptions == [error]
    assert only(telemetry, "megatron.startup").status is None
    assert telemetry.shutdowns == 1


def test_a_failed_start_is_recorded_on_startup(telemetry):
    class ConfigError(ValueError):
        pass

    phases = _in_state("startup", telemetry)
    phases.shutdown(cause=ConfigError("bad flag"))
    startup = only(telemetry, "megatron.startup")
    assert startup.status.status_code is StatusCode.ERROR
    assert startup.attributes["error.type"] == (
        f"{__name__}.test_a_failed_start_is_recorded_on_startup.<locals>.ConfigError"
    )


def test_a_signal_is_recorded_by_name_and_a_clean_end_records_nothing(telemetry):
    phases = _in_state("interval", telemetry)
    phases.terminate(cause=signal.SIGTERM)
    interval = only(telemetry, "megatron.train")
    assert interval.status.status_code is StatusCode.ERROR
    assert interval.attributes["megatron.shutdown.reason"] == "signal"
    assert interval.attributes["error.type"] == "SIGTERM"
    clean = FakeTelemetry()
    phases = _in_state("interval", clean)
    phases.shutdown()
    interval = only(clean, "megatron.train")
    assert interval.status is None and "megatron.shutdown.reason" not in interval.attributes


def test_the_ending_of_a_number_no_signal_has(telemetry):
    assert lifecycle(telemetry).ending(250) == ("signal", "signal 250")


# -- shutdown, and the exit paths' terminate ---------------------------------------------


@pytest.mark.parametrize("trigger", ["shutdown", "terminate"])
@pytest.mark.parametrize(
    ("state", "open_spans"),
    [
        ("job", []),
        ("startup", ["megatron.startup"]),
        ("train", []),
        ("interval", ["megatron.train"]),
        ("ended", []),
    ],
)
def test_the_end_ends_what_is_open_then_shuts_telemetry_down(telemetry, state, open_spans, trigger):
    phases = _in_state(state, telemetry)
    finished = list(telemetry.spans())
    getattr(phases, trigger)()
    assert [s.name for s in telemetry.spans()[len(finished) :]] == open_spans
    assert phases.state == {"shutdown": "shutdown", "terminate": "terminated"}[trigger]
    assert telemetry.shutdowns == 1
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_terminate_ends_what_is_open_then_every_trainer_trigger_records_nothing(telemetry):
    """A SIGTERM handler that returns: the loop goes on after the lifecycle ended."""
    phases = _in_state("interval", telemetry)
    phases.terminate()
    assert phases.state == "terminated"
    finished = list(telemetry.spans())
    for _ in range(4):
        phases.step()
    phases.end_train()
    phases.record_phase("megatron.startup.x", 1.0, 2.0)
    phases.start_train()
    phases.start_job()
    phases.shutdown()
    phases.flush()
    phases.terminate()
    assert phases.state == "terminated"
    assert telemetry.spans() == finished
    assert telemetry.shutdowns == 1


def test_terminate_after_the_trainers_shutdown_does_nothing(telemetry):
    """The atexit fallback after pretrain() shut down: no second shutdown, no error."""
    phases = _in_state("shutdown", telemetry)
    phases.terminate()
    assert phases.state == "shutdown"
    assert telemetry.shutdowns == 1


def test_each_pretrain_shuts_its_own_telemetry_down(telemetry):
    """A second pretrain() in the process (its own lifecycle) shuts its own handle down."""
    first = lifecycle(telemetry, save_interval=2)
    first.start_job()
    run_loop(first, 2)
    first.shutdown()
    second_telemetry = FakeTelemetry()
    second = lifecycle(second_telemetry, save_interval=2)
    second.start_job()
    run_loop(second, 2)
    second.shutdown()
    assert len(second_telemetry.spans("megatron.train")) == 1
    assert (telemetry.shutdowns, second_telemetry.shutdowns) == (1, 1)


# -- the orders the table rejects --------------------------------------------------


def _in_state(state, telemetry, strict=True, gate=job_on):
    """A lifecycle brought to ``state`` by the trainer's own triggers."""
    phases = lifecycle(telemetry, save_interval=2, gate=gate, strict=strict)
    steps = {
        "job": [],
        "startup": [phases.start_job],
        "train": [phases.start_job, phases.start_train],
        "interval": [phases.start_job, phases.start_train, phases.step],
        "ended": [phases.start_job, phases.start_train, phases.step, phases.end_train],
        "shutdown": [phases.start_job, phases.shutdown],
    }[state]
    for fire in steps:
        fire()
    return phases


ILLEGAL = [
    ("startup", "start_job", lambda p: p.start_job()),
    ("train", "start_job", lambda p: p.start_job()),
    ("interval", "start_train", lambda p: p.start_train()),
    ("job", "step", lambda p: p.step()),
    ("startup", "step", lambda p: p.step()),
    ("ended", "step", lambda p: (p.step(), p.step())),  # the next boundary
    ("job", "end_train", lambda p: p.end_train()),
    ("startup", "end_train", lambda p: p.end_train()),
    ("ended", "end_train", lambda p: p.end_train()),
    ("job", "record_phase", lambda p: p.record_phase("megatron.startup.x", 1.0, 2.0)),
    ("train", "record_phase", lambda p: p.record_phase("megatron.startup.x", 1.0, 2.0)),
    ("interval", "record_phase", lambda p: p.record_phase("megatron.startup.x", 1.0, 2.0)),
    ("shutdown", "shutdown", lambda p: p.shutdown()),
    ("shutdown", "start_job", lambda p: p.start_job()),
    ("shutdown", "start_train", lambda p: p.start_train()),
    ("shutdown", "step", lambda p: p.step()),
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


@pytest.mark.parametrize(
    ("state", "trigger", "fire"), ILLEGAL, ids=[f"{t}_in_{s}" for s, t, _ in ILLEGAL]
)
def test_an_illegal_order_never_ends_a_run_it_is_logged_once(state, trigger, fire, caplog):
    """Not strict (a training run): the table still rejects it, nothing changes, and
    one error names trigger and state, however often it happens."""
    telemetry = FakeTelemetry()
    phases = _in_state(state, telemetry, strict=False)
    finished = list(telemetry.spans())
    with caplog.at_level(logging.ERROR, logger=telemetry_spans.__name__):
        fire(phases)
        fire(phases)
    assert phases.state == state
    assert telemetry.spans() == finished
    ours = [r for r in caplog.records if r.name == telemetry_spans.__name__]
    assert [(r.levelno, r.getMessage()) for r in ours] == [
        (logging.ERROR, f"telemetry: '{trigger}' in state '{state}' ignored")
    ]


def test_span_phase_error_is_a_machine_error_with_its_trigger_and_state(telemetry):
    phases = _in_state("ended", telemetry)
    with pytest.raises(MachineError) as caught:
        phases.end_train()
    assert isinstance(caught.value, SpanPhaseError)
    assert (caught.value.trigger, caught.value.state) == ("end_train", "ended")


# -- flush -------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["job", "startup", "train", "interval", "ended", "shutdown"])
@pytest.mark.parametrize("gate", [job_on, lambda group: False], ids=["job_on", "job_off"])
def test_flush_flushes_the_tracer_provider_and_changes_nothing(provider, state, gate):
    """Whatever the span groups: other spans, metrics and logs need the flush too; once
    the lifecycle has shut telemetry down, there is nothing left to flush."""
    telemetry = FakeTelemetry()
    phases = _in_state(state, telemetry, gate=gate)
    finished = list(telemetry.spans())
    phases.flush()
    assert phases.state == state
    assert provider.flushes == ([] if state == "shutdown" else [5000])
    assert telemetry.spans() == finished


# -- the atexit and SIGTERM hooks ----------------------------------------------------


class Hooks:
    """What installing the exit hooks did: atexit registrations and ``os.kill`` calls,
    recorded rather than made."""

    def __init__(self):
        self.registered, self.killed = [], []

    def install(self, phases, graceful=False, previous_handler=signal.SIG_DFL):
        signal.signal(signal.SIGTERM, previous_handler)
        return install_exit_hooks(phases, graceful=graceful)


@pytest.fixture
def hooks(monkeypatch):
    """Exit hooks installed with atexit and ``os.kill`` recorded, and SIGTERM's
    disposition put back afterwards. No signal is sent: a test calls the installed
    handler as the interpreter would."""
    recorder = Hooks()
    monkeypatch.setattr(telemetry_spans.atexit, "register", recorder.registered.append)
    monkeypatch.setattr(
        telemetry_spans.os, "kill", lambda pid, signum: recorder.killed.append(signum)
    )
    previous = signal.getsignal(signal.SIGTERM)
    yield recorder
    signal.signal(signal.SIGTERM, previous)


def _sigterm(frame=None):
    """What the interpreter does when SIGTERM arrives: call its Python handler, with the
    frame the main thread was running (the caller's)."""
    signal.getsignal(signal.SIGTERM)(signal.SIGTERM, frame or sys._getframe(1))


def test_a_hard_sigterm_ends_the_spans_then_dies_of_the_signal(telemetry, hooks):
    phases = _in_state("interval", telemetry)
    hooks.install(phases)
    _sigterm()
    assert hooks.killed == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # so the process dies of it
    assert phases.state == "terminated"
    assert only(telemetry, "megatron.train").attributes["error.type"] == "SIGTERM"
    assert len(telemetry.spans("megatron.train")) == 1
    assert telemetry.shutdowns == 1


def test_a_hard_sigterm_is_passed_on_to_the_previous_handler(telemetry, hooks):
    passed_on = []
    phases = _in_state("interval", telemetry)
    hooks.install(phases, previous_handler=lambda signum, frame: passed_on.append(signum))
    _sigterm()
    assert passed_on == [signal.SIGTERM] and hooks.killed == []
    assert len(telemetry.spans("megatron.train")) == 1 and telemetry.shutdowns == 1
    _sigterm()  # a later one is only passed on
    assert passed_on == [signal.SIGTERM, signal.SIGTERM]
    assert telemetry.shutdowns == 1


def test_a_process_that_ignores_sigterm_trains_on_recording_nothing(telemetry, hooks):
    phases = _in_state("interval", telemetry)
    hooks.install(phases, previous_handler=signal.SIG_IGN)
    _sigterm()
    assert hooks.killed == [] and phases.state == "terminated"
    assert signal.getsignal(signal.SIGTERM) != signal.SIG_IGN  # the hook stays in place
    phases.step()
    phases.step()
    phases.end_train()
    phases.shutdown()  # pretrain()'s own shutdown, after the loop
    assert len(telemetry.spans("megatron.train")) == 1
    assert telemetry.shutdowns == 1


@pytest.mark.parametrize("gate", [job_on, lambda group: False], ids=["job_on", "job_off"])
def test_a_graceful_sigterm_flushes_once_and_leaves_the_spans_open(provider, hooks, gate):
    """--exit-signal-handler: the trainer drains and shuts down itself."""
    drained = []
    telemetry = FakeTelemetry()
    phases = _in_state("interval", telemetry, gate=gate)
    hooks.install(phases, graceful=True, previous_handler=lambda s, f: drained.append(s))
    _sigterm()
    _sigterm()
    assert drained == [signal.SIGTERM, signal.SIGTERM]
    assert provider.flushes == [5000]  # the first signal flushes, later ones only chain
    assert phases.state == "interval"
    assert telemetry.spans("megatron.train") == []
    phases.end_train()
    phases.shutdown()
    assert len(telemetry.spans("megatron.train")) == (1 if gate is job_on else 0)
    assert telemetry.shutdowns == 1


def test_the_atexit_fallback_terminates_and_is_harmless_after_shutdown(telemetry, hooks):
    phases = _in_state("interval", telemetry)
    hooks.install(phases)
    assert len(hooks.registered) == 1
    hooks.registered[0]()
    assert phases.state == "terminated" and telemetry.shutdowns == 1
    assert only(telemetry, "megatron.train").status is None  # no cause known
    finished = _in_state("shutdown", FakeTelemetry())
    hooks.registered[0]()
    assert finished.state == "shutdown" and finished.telemetry.shutdowns == 1


def test_hooks_are_installed_once_and_act_on_the_latest_lifecycle(telemetry, hooks):
    first = _in_state("ended", telemetry)
    installed = hooks.install(first)
    assert signal.getsignal(signal.SIGTERM) == installed.handle_sigterm
    second = _in_state("interval", FakeTelemetry())
    assert install_exit_hooks(second) is installed
    assert len(hooks.registered) == 1
    hooks.registered[0]()
    assert second.state == "terminated" and first.state == "ended"
    assert len(second.telemetry.spans("megatron.train")) == 1


def test_the_first_installation_says_whether_a_sigterm_is_graceful(telemetry, hooks):
    hooks.install(_in_state("startup", telemetry), graceful=True)
    assert install_exit_hooks(_in_state("startup", FakeTelemetry()), graceful=False).graceful


def test_no_hook_for_a_lifecycle_whose_telemetry_does_not_export(hooks):
    phases = _in_state("startup", FakeTelemetry(exporting=False))
    assert hooks.install(phases).state == "uninstalled" and hooks.registered == []
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.parametrize("error", [ValueError("not the main thread"), OSError("no signals")])
def test_installing_where_signals_cannot_be_hooked_does_not_raise(
    telemetry, hooks, monkeypatch, error
):
    def refuse(*_):
        raise error

    phases = _in_state("interval", telemetry)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with monkeypatch.context() as patch:
        patch.setattr(telemetry_spans.signal, "signal", refuse)
        install_exit_hooks(phases)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    hooks.registered[0]()  # the atexit fallback remains
    assert phases.state == "terminated"


def test_a_signal_during_a_transition_is_acted_on_once_it_is_done(telemetry, hooks):
    """Python runs a handler between two bytecodes: one interval ended, the next not yet
    open. A transition runs this module's code, so the signal comes back once the reroot
    is done, and the hook ends whole spans."""
    phases = _in_state("interval", telemetry)
    installed = hooks.install(phases, previous_handler=signal.SIG_IGN)
    installed.redelivery.send = lambda thread, signum: None  # the interpreter's, below
    signalled = []

    def signal_once(span):
        if not signalled:  # lands between the old interval's end and the next's start
            signalled.append(span.name)
            _sigterm()

    telemetry.tracer.on_end = signal_once
    phases.step()
    phases.step()  # save_interval 2: the boundary
    assert phases.state == "interval" and signalled  # nothing done inside
    _sigterm()  # delivered again, back in this test's code
    installed.redelivery.thread.join(60)
    assert phases.state == "terminated"
    assert [s.name for s in telemetry.spans("megatron.train")] == ["megatron.train"] * 2
    assert trace.get_current_span() is trace.INVALID_SPAN
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
        (("nemo.lens.providers",), True),  # the telemetry library's span processors
        (("megatron.core.telemetry.helpers",), True),
        (("megatron.training.telemetry_spans",), True),
        # the standard library called under a telemetry lock: still inside
        (("opentelemetry.sdk.metrics._internal", "collections", "threading"), True),
        # a function a telemetry decorator wraps: its body is the trainer's
        (("opentelemetry.util._decorator", "megatron.training.training"), False),
        # another library called from telemetry code (an exporter's client, transitions)
        (("opentelemetry.exporter.otlp.proto.grpc", "grpc._channel"), True),
        (("megatron.training.telemetry_spans", "transitions.core", "threading"), True),
        (("megatron.training.training", "torch.nn.modules"), False),
        (("nemo.lensing",), False),
        (("collections",), False),  # called from this test
    ],
)
def test_a_signal_lands_inside_telemetry_where_its_code_runs(modules, inside):
    packages = ExitHooks.TELEMETRY_PACKAGES
    assert _called_through(*modules, then=lambda f: in_packages(f, packages)) is inside


def test_a_sigterm_inside_telemetry_code_is_acted_on_once_it_is_left(telemetry, hooks):
    """Telemetry code may hold a lock the exit path needs (a span processor's): the
    handler returns at once, and a helper thread sends the signal to the main thread
    again until a handler acts on it, outside that code."""
    phases = _in_state("interval", telemetry)
    installed = hooks.install(phases, previous_handler=signal.SIG_IGN)
    sent = threading.Event()
    installed.redelivery.send = lambda thread, signum: sent.set()  # recorded, not sent
    _called_through("nemo.lens.providers", then=lambda frame: _sigterm(frame))
    assert phases.state == "interval"  # nothing done in there
    assert sent.wait(60), "the signal was not sent again"  # 60 s only ends a hang
    _sigterm()  # the interpreter delivers it again, back in this test's code
    assert phases.state == "terminated"
    assert telemetry.shutdowns == 1
    installed.redelivery.thread.join(60)
    assert not installed.redelivery.thread.is_alive()  # no signal after this test


def test_a_main_thread_stuck_in_telemetry_code_only_passes_the_signal_on(telemetry, hooks):
    """Past the bound the main thread is stuck in there: the signal is passed on (the
    process dies of it) without touching telemetry, whose lock it may hold."""
    phases = _in_state("interval", telemetry)
    installed = hooks.install(phases)
    installed.redelivery.give_up_s = 0
    _called_through("opentelemetry.sdk.trace", then=lambda frame: _sigterm(frame))
    assert hooks.killed == [signal.SIGTERM] and installed.redelivery.thread is None
    assert phases.state == "interval" and telemetry.shutdowns == 0


HANG = """
import importlib.util, os, signal, sys, threading, time
from opentelemetry import trace
spec = importlib.util.spec_from_file_location("telemetry_spans", {module!r})
module = importlib.util.module_from_spec(spec)
sys.modules["megatron.training.telemetry_spans"] = module  # its frames are telemetry's
spec.loader.exec_module(module)

# A span processor's code: it takes its lock (not reentrant) as each span ends, and
# around its own bookkeeping, where the signal lands.
processor = {{"__name__": "nemo.lens.providers", "lock": threading.Lock(), "os": os,
              "signal": signal, "sys": sys, "trace": trace}}
exec(compile(\"\"\"
class Span(trace.NonRecordingSpan):
    def __init__(self, name):
        super().__init__(trace.INVALID_SPAN_CONTEXT)
        self.name = name

    def end(self, end_time=None):
        with lock:
            sys.stdout.write("ended " + self.name + chr(10))
            sys.stdout.flush()

class Tracer:
    def start_span(self, name, **kwargs):
        return Span(name)

class Handle:
    tracer, is_exporting = Tracer(), True

    def shutdown(self):
        sys.stdout.write("shut down" + chr(10))
        sys.stdout.flush()

def bookkeeping():
    with lock:
        os.kill(os.getpid(), signal.SIGTERM)
\"\"\", "providers", "exec"), processor)

phases = module.SpanPhases(processor["Handle"](), save_interval=2)
module.install_exit_hooks(phases)
phases.start_job()
phases.start_train()
phases.step()
processor["bookkeeping"]()  # the signal lands here, under the processor's lock
while True:  # the training loop goes on, mostly out of telemetry code
    phases.step()
    time.sleep(0.001)  # an iteration's work, with the GIL released
"""


def test_a_sigterm_under_a_span_processors_lock_ends_the_spans_and_the_process(tmp_path):
    """A process (not this one) gets SIGTERM while its main thread holds the lock that
    ending a span takes: it ends its spans once out of there and dies of the signal,
    instead of waiting for that lock forever."""
    program = HANG.format(module=telemetry_spans.__file__)
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    startup, *intervals, shutdown = done.stdout.splitlines()
    assert startup == "ended megatron.startup"  # then the intervals, the last by the signal
    assert intervals and set(intervals) == {"ended megatron.train"}
    assert shutdown == "shut down"


# -- telemetry off ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: (FakeTelemetry(exporting=False), job_on),
        lambda: (FakeTelemetry(), lambda group: False),
        lambda: (None, job_on),
    ],
    ids=["not_exporting", "job_group_off", "no_telemetry"],
)
def test_telemetry_off_records_nothing(make):
    telemetry, gate = make()
    phases = lifecycle(telemetry, save_interval=1, gate=gate)
    phases.start_job(timestamps={"slurm_job_start_time": 1.0, "launch_script_start": 2.0})
    phases.record_phase("megatron.startup.imports", 2.0, 3.0)
    run_loop(phases, 3)
    phases.shutdown()
    assert phases.state == "shutdown"
    if telemetry is not None:
        assert telemetry.spans() == []
        assert telemetry.shutdowns == 1  # the handle is shut down all the same


def test_train_without_pretrain_records_on_the_telemetry_it_is_given(telemetry):
    """Megatron-LM's train() asks SpanPhases.current(); with no pretrain() before it,
    it gets a lifecycle of its own that records the loop's intervals."""
    phases = SpanPhases.current(telemetry, 2, is_span_group_enabled=job_on)
    assert phases.state == "job"
    run_loop(phases, 5)
    intervals = telemetry.spans("megatron.train")
    assert len(intervals) == 3 and intervals[0].links == []
    assert telemetry.spans("megatron.startup") == []


def test_train_finds_the_lifecycle_of_the_latest_pretrain(telemetry):
    first = lifecycle(telemetry)
    first.start_job()
    assert SpanPhases.current() is first
    second = lifecycle(telemetry, save_interval=2)
    second.start_job()
    assert SpanPhases.current() is second
    run_loop(second, 1)
    # train() called again after that loop: a lifecycle of its own, whose first
    # interval follows the same startup.
    again = SpanPhases.current(telemetry, 2, is_span_group_enabled=job_on)
    assert again is not second and again.state == "job"
    run_loop(again, 1)
    startup = telemetry.spans("megatron.startup")[-1]
    assert telemetry.spans("megatron.train")[-1].links == [startup.context]


def _broken(*_, **__):
    raise RuntimeError("exporter gone")


def test_spans_that_fail_to_end_or_to_open_an_interval_never_break_the_loop(telemetry):
    """Ending a span, or opening a megatron.train, may fail once the exporter is gone."""
    phases = _in_state("interval", telemetry)
    telemetry.tracer.on_end = _broken
    telemetry.tracer.start_span = _broken
    phases.step()
    phases.step()
    phases.end_train()
    telemetry.tracer.on_end = lambda span: None
    phases.shutdown()
    assert phases.state == "shutdown" and telemetry.shutdowns == 1


def test_a_link_that_fails_leaves_the_interval_without_it(telemetry, monkeypatch):
    phases = _in_state("train", telemetry)
    monkeypatch.setattr(trace, "Link", _broken)
    phases.step()
    phases.end_train()
    (interval,) = telemetry.spans("megatron.train")
    assert interval.links == []


def test_a_context_that_fails_to_detach_still_lets_its_span_end(telemetry, monkeypatch):
    phases = _in_state("startup", telemetry)
    monkeypatch.setattr(context, "detach", _broken)
    phases.start_train()
    assert only(telemetry, "megatron.startup").ends == 1


def test_a_startup_without_a_context_opens_its_first_interval_unlinked(telemetry):
    class NoContext(FakeTracer):
        def start_span(self, *args, **kwargs):
            span = super().start_span(*args, **kwargs)
            if span.name == "megatron.startup":
                span.get_span_context = _broken
            return span

    telemetry.tracer = NoContext()
    phases = _in_state("interval", telemetry)
    phases.end_train()
    assert only(telemetry, "megatron.train").links == []


def test_a_failing_tracer_never_breaks_training_it_is_logged_once(telemetry, caplog):
    """Opening or ending any span, or shutting the handle down, may fail (an exporter
    gone, an SDK error): training goes on, and one warning says so."""
    telemetry.tracer.start_span = _broken
    telemetry.shutdown = _broken
    phases = lifecycle(telemetry, save_interval=1)
    with caplog.at_level(logging.WARNING, logger=telemetry_spans.__name__):
        phases.start_job(timestamps={"slurm_job_start_time": 1.0, "launch_script_start": 2.0})
        phases.record_phase("megatron.startup.imports", 1.0, 2.0)
        run_loop(phases, 3)
        phases.shutdown()
    assert phases.state == "shutdown"
    ours = [r for r in caplog.records if r.name == telemetry_spans.__name__]
    assert [(r.levelno, r.getMessage()) for r in ours] == [
        (logging.WARNING, "telemetry failed; training goes on")
    ]
    assert "exporter gone" in ours[0].exc_text


def test_a_failing_model_type_costs_that_attribute_alone(telemetry):
    """The startup is still current (its phases nest in it) and linked from the first
    interval."""

    class Refusing(FakeTracer):
        def start_span(self, *args, **kwargs):
            span = super().start_span(*args, **kwargs)
            span.set_attribute = _broken
            return span

    telemetry.tracer = Refusing()
    phases = lifecycle(telemetry, save_interval=1)
    phases.start_job("ModelType.encoder_or_decoder", {"program_start": 100.0})
    assert trace.get_current_span().name == "megatron.startup"
    phases.record_phase("megatron.startup.imports", 100.0, 101.5)
    run_loop(phases, 1)
    startup = only(telemetry, "megatron.startup")
    assert only(telemetry, "megatron.startup.imports").parent is startup
    assert startup.attributes == {}
    assert only(telemetry, "megatron.train").links == [startup.context]


def test_a_handle_whose_shutdown_fails_is_not_tried_again(telemetry):
    """The lifecycle has ended once the handle's shutdown() was called; its error is
    logged, and the atexit fallback does not try again."""
    calls = []

    def fails(timeout_ms=5000):
        calls.append(timeout_ms)
        raise RuntimeError("exporter gone")

    telemetry.shutdown = fails
    phases = _in_state("interval", telemetry)
    phases.shutdown()
    phases.terminate()
    assert phases.state == "shutdown" and len(calls) == 1


def test_the_save_interval_train_passes_arms_the_loop(telemetry):
    """A checkpoint's arguments may change --save-interval after pretrain() started."""
    first = lifecycle(telemetry, save_interval=3)
    first.start_job()
    assert SpanPhases.current(telemetry, 2, is_span_group_enabled=job_on) is first
    run_loop(first, 6)
    assert len(telemetry.spans("megatron.train")) == 3  # passes 0-1, 2-3, 4-5


def test_a_span_not_recording_gets_no_model_type(telemetry):
    class NotRecording(FakeTracer):
        def start_span(self, *args, **kwargs):
            span = super().start_span(*args, **kwargs)
            span.is_recording = lambda: False
            return span

    telemetry.tracer = NotRecording()
    phases = _in_state("startup", telemetry)
    phases.start_train()
    assert only(telemetry, "megatron.startup").attributes == {"is_goodput_span": True}


def test_mark_goodput_marks_a_span_and_never_raises(telemetry):
    span = telemetry.tracer.start_span("megatron.checkpoint.save")
    mark_goodput(span)
    assert span.attributes == {"is_goodput_span": True}
    mark_goodput(None)

    class Broken:
        def set_attribute(self, *_):
            raise RuntimeError("ended")

    mark_goodput(Broken())


# -- without transitions --------------------------------------------------------------


def test_without_transitions_the_module_imports_and_the_lifecycle_does_nothing(tmp_path):
    """``transitions`` (and, while telemetry is off, OpenTelemetry) absent, as in a
    megatron-core install without the ``otel`` extra: the module imports, and a lifecycle
    takes every trigger and does nothing, says nothing and installs no hook (Megatron-LM
    sets telemetry up only where ``transitions`` is installed)."""
    program = f"""
import importlib.util, sys
sys.modules["transitions"] = None  # import fails, as when not installed
sys.modules["opentelemetry"] = None
spec = importlib.util.spec_from_file_location("telemetry_spans", {telemetry_spans.__file__!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)

class Handle:
    tracer, is_exporting = None, False
    def shutdown(self): print("shut down")

def run(telemetry):
    phases = module.SpanPhases(telemetry, 2)
    phases.start_job()
    phases.record_phase("megatron.startup.imports", 1.0, 2.0)
    phases.start_train()
    for _ in range(5):
        phases.step()
    phases.end_train()
    phases.shutdown()
    phases.flush()
    print(phases.state, module.install_exit_hooks(phases))

run(None)
run(Handle())
del sys.modules["opentelemetry"]  # telemetry that exports has it
Handle.is_exporting = True
run(Handle())
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["job None"] * 3
    assert done.stderr == ""
