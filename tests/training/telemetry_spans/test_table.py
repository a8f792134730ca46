"""The transition table, pair by pair (``megatron/training/README.md``, "The span-phase
machine").

Legality comes from the documented table written out in lifecycle_spec.SPEC_TABLE, not
from the module's TRANSITIONS; a separate test then checks that the module's
table is that table.
"""

from __future__ import annotations

import logging
import re

import pytest
import transitions
from fake_handles import FakeHandle, ForbiddenHandle
from launch_times import launch_timestamps
from lifecycle_spec import FULL_TABLE, PATH_TO_STATE, SPEC_TABLE, STATES, TRAIN, TRIGGERS

import megatron.training.telemetry_spans as telemetry_spans
from megatron.training.telemetry_spans import ExitHooks, SpanPhaseError, SpanPhases

TRIGGER_ARGS = {
    "start_job": ((), {"model_type": "gpt", "timestamps": launch_timestamps()}),
    "record_phase": (("megatron.startup.imports", 1.0e9, 1.0e9 + 1.5), {}),
    "step": ((7,), {}),
}


def fire(phases, trigger):
    """Fire ``trigger`` through the typed entry point that fires it: ``reroot`` has
    none of its own, it is what ``step()`` fires on a boundary (every pass of the
    ``save_interval=1`` lifecycles here)."""
    if trigger == "reroot":
        trigger = "step"
    args, kwargs = TRIGGER_ARGS.get(trigger, ((), {}))
    getattr(phases, trigger)(*args, **kwargs)


def named(trigger: str) -> str:
    """The trigger an error names: a rejected reroot is the step that fired it."""
    return "step" if trigger == "reroot" else trigger


def assert_names(err: BaseException, trigger: str, state: str) -> None:
    message = str(err)
    assert re.search(rf"\b{re.escape(trigger)}\b", message), f"{message!r} lacks {trigger!r}"
    assert re.search(rf"\b{re.escape(state)}\b", message), f"{message!r} lacks {state!r}"


def make_handle(kind):
    if kind == "on":
        return FakeHandle()
    return ForbiddenHandle(is_exporting=False)


@pytest.mark.parametrize("telemetry", ["on", "off"])
@pytest.mark.parametrize("trigger", TRIGGERS)
@pytest.mark.parametrize("state", STATES)
def test_every_state_trigger_pair(lifecycles, state, trigger, telemetry, tracer_provider):
    handle = make_handle(telemetry)
    phases = lifecycles.new(handle, save_interval=1)
    for step in PATH_TO_STATE[state]:
        fire(phases, step)
    assert phases.state == state

    recorder = getattr(handle, "recorder", None)
    started_before = list(recorder.start_order) if recorder else []
    ended_before = list(recorder.end_order) if recorder else []
    shutdowns_before = len(handle.shutdown_calls)
    flushes_before = len(tracer_provider.flushes)

    expected = FULL_TABLE.get((state, trigger))
    if expected is None:
        with pytest.raises(SpanPhaseError) as caught:
            fire(phases, trigger)
        assert isinstance(caught.value, transitions.MachineError)
        assert_names(caught.value, named(trigger), state)
        assert phases.state == state, "an illegal trigger changed the state"
        if recorder:
            assert recorder.start_order == started_before, "illegal trigger started a span"
            assert recorder.end_order == ended_before, "illegal trigger ended a span"
        assert len(handle.shutdown_calls) == shutdowns_before
        assert len(tracer_provider.flushes) == flushes_before
        return

    fire(phases, trigger)
    assert phases.state == expected
    if state in ("shutdown", "terminated"):
        # Ended: the exit paths' triggers (and, after terminate, every trigger)
        # record nothing.
        if recorder:
            assert recorder.start_order == started_before, "a span started after the end"
            assert recorder.end_order == ended_before
        assert len(handle.shutdown_calls) == shutdowns_before
        assert len(tracer_provider.flushes) == flushes_before
    elif trigger in ("shutdown", "terminate"):
        assert len(handle.shutdown_calls) == 1
        if recorder:
            recorder.assert_all_ended_exactly_once()
    elif trigger == "flush":
        # Whatever the span groups and the handle: a graceful SIGTERM's drain.
        assert len(tracer_provider.flushes) == flushes_before + 1
        if recorder:
            assert recorder.end_order == ended_before, "flush must not end spans"
    else:
        assert len(handle.shutdown_calls) == 0


@pytest.mark.parametrize(
    ("path", "trigger", "state"),
    [
        (("start_job",), "start_job", "startup"),
        ((), "step", "job"),
        (("start_job",), "step", "startup"),
        (("shutdown",), "start_job", "shutdown"),
        (("start_job", "start_train", "reroot", "shutdown"), "start_job", "shutdown"),
        (("start_job", "start_train"), "record_phase", "train"),
        (("start_job", "start_train", "reroot"), "record_phase", "interval"),
        (("start_job", "start_train"), "start_train", "train"),
        # a double close
        (("start_job", "start_train", "reroot", "end_train"), "end_train", "ended"),
        (("start_job", "start_train", "end_train"), "end_train", "ended"),
        (("start_job", "shutdown"), "shutdown", "shutdown"),
        (("start_job", "start_train", "reroot", "shutdown"), "shutdown", "shutdown"),
        # a step after the loop ended, or after the trainer's own shutdown
        (("start_job", "start_train", "reroot", "end_train"), "step", "ended"),
        (("start_job", "start_train", "reroot", "shutdown"), "step", "shutdown"),
        (("start_job", "start_train", "shutdown"), "end_train", "shutdown"),
        (("start_job", "shutdown"), "start_train", "shutdown"),
        (("start_job", "shutdown"), "record_phase", "shutdown"),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, tuple) else v,
)
def test_the_classic_mistakes_raise(lifecycles, path, trigger, state):
    """The classic misorderings of the training path (a double close, a step out of
    order, anything after its own shutdown), each clearly named."""
    phases = lifecycles.new(FakeHandle(), save_interval=1)
    for step in path:
        fire(phases, step)
    with pytest.raises(SpanPhaseError) as caught:
        fire(phases, trigger)
    assert_names(caught.value, trigger, state)
    assert phases.state == state


def test_step_rejected_repeatedly_keeps_rejecting(lifecycles):
    """A rejected step must not consume the boundary: the next one is rejected too,
    and after start_train the first step still opens C0."""
    handle = FakeHandle()
    phases = lifecycles.new(handle, save_interval=2)
    for _ in range(3):
        with pytest.raises(SpanPhaseError):
            phases.step()
    phases.start_job()
    for _ in range(3):
        with pytest.raises(SpanPhaseError):
            phases.step()
    phases.start_train()
    phases.step(0)
    assert phases.state == "interval"
    phases.shutdown()
    assert len(handle.named(TRAIN)) == 1


def _state_name(state) -> str:
    if isinstance(state, str):
        return state
    if isinstance(state, dict):
        return state["name"]
    return state.name


def _normalize(transitions_data, state_names):
    rows = set()
    for t in transitions_data:
        sources = t["source"]
        if sources == "*":
            sources = state_names
        elif isinstance(sources, str):
            sources = [sources]
        for source in sources:
            dest = t.get("dest")
            if dest is None or dest == "=":
                dest = source
            rows.add((source, t["trigger"], dest))
    return rows


def test_module_table_is_the_spec_table():
    state_names = [_state_name(s) for s in SpanPhases.STATES]
    assert sorted(state_names) == sorted(STATES)
    module_rows = _normalize(SpanPhases.TRANSITIONS, state_names)
    spec_rows = {(state, trigger, dest) for (state, trigger), dest in SPEC_TABLE.items()}
    # step is a method that fires reroot on a boundary, not a row of its own.
    assert {row for row in module_rows if row[1] != "step"} == spec_rows


def test_live_machine_offers_exactly_the_spec_triggers(lifecycles):
    """No auto transitions (to_shutdown() ...) or other edges dodge the table."""
    phases = lifecycles.new(None)
    assert isinstance(phases.machine, transitions.Machine)
    for state in STATES:
        offered = set(phases.machine.get_triggers(state)) - {"step"}
        spec = {trigger for (s, trigger) in SPEC_TABLE if s == state}
        assert offered == spec, f"state {state!r}"
    assert phases.state == "job"


def test_typed_trigger_methods_are_kept_with_public_api_only(lifecycles, caplog):
    """SpanPhases' own documented trigger methods stay, silently, with no private hook.

    The machine's model is a plain object of the module's, so the trigger,
    ``is_*`` and ``may_*`` methods ``transitions`` adds land there and cannot
    collide with SpanPhases' methods; SpanPhases offers the helpers through it.
    """
    caplog.set_level(logging.DEBUG, logger="transitions")
    phases = lifecycles.new(None)
    hooks = ExitHooks()
    typed = ("start_job", "record_phase", "start_train", "step", "end_train", "shutdown")
    for trigger in (*typed, "flush", "terminate"):
        assert getattr(phases, trigger).__func__ is getattr(SpanPhases, trigger)
    assert not hasattr(phases, "reroot"), "reroot is fired by step(), nothing else"
    assert callable(hooks.install)  # ExitHooks has no trigger methods of its own
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert phases.state == "job"
    assert type(phases.machine) is transitions.Machine
    assert not hasattr(telemetry_spans, "_Machine")


def test_transitions_info_lines_stay_out_of_the_log(lifecycles, caplog):
    """A whole lifecycle, exit hooks included, logs nothing below WARNING through
    ``transitions``: its logger is kept to its warnings (lines per checkpoint interval
    and rank otherwise), as Megatron-LM keeps other noisy loggers."""
    caplog.set_level(logging.DEBUG)
    handle = FakeHandle()
    phases = lifecycles.new(handle, save_interval=1)
    hooks = ExitHooks()
    hooks.machine.set_state("installed")
    phases.start_job()
    phases.record_phase("megatron.startup.imports", 1.0, 2.0)
    phases.start_train()
    for iteration in range(3):
        phases.step(iteration)
    phases.end_train()
    phases.flush()
    hooks.process_exit()
    phases.terminate()
    ours = [r for r in caplog.records if r.name.startswith("transitions")]
    assert ours == []
    assert logging.getLogger("transitions.core").level == logging.WARNING


@pytest.mark.parametrize("pair", sorted(SPEC_TABLE), ids=lambda pair: "-".join(pair))
def test_every_row_fires_through_the_librarys_own_event(lifecycles, monkeypatch, pair):
    """Each legal (state, trigger) goes through ``transitions``' ``Event.trigger``:
    the library runs the table; nothing of the module replaces its dispatch."""
    state, trigger = pair
    fired: list[str] = []
    original = transitions.core.Event.trigger

    def recording(self, model, *args, **kwargs):
        fired.append(self.name)
        return original(self, model, *args, **kwargs)

    monkeypatch.setattr(transitions.core.Event, "trigger", recording)
    phases = lifecycles.new(FakeHandle(), save_interval=1)
    for step in PATH_TO_STATE[state]:
        fire(phases, step)
    del fired[:]
    fire(phases, trigger)  # the typed entry point that fires it
    assert fired == [trigger]
    assert phases.state == SPEC_TABLE[pair]
