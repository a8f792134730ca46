"""Trace A (pre_startup) and trace B (megatron.startup): opened once, closed once.

B is a root in an empty context, opened at the launch
script start when the launch window is folded, else at program start, else now;
it closes at start_train (or shutdown); its backdated children carry exact
nanosecond times; pre_startup exists only when due.
"""

from __future__ import annotations

import enum
import time

import pytest
from fake_handles import FakeHandle, parent_id, span_id, trace_id
from launch_times import is_folded, launch_timestamps, ns, pre_startup_due
from lifecycle_spec import CONTAINER_LOAD, LAUNCH_SCRIPT, PRE_STARTUP, STARTUP, TRAIN
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace


class ModelType(enum.Enum):
    encoder_or_decoder = 1


def test_startup_opens_once_and_closes_once_at_start_train(lifecycles):
    handle = FakeHandle()
    phases = lifecycles.new(handle, save_interval=2)
    ts = launch_timestamps()

    phases.start_job(model_type=ModelType.encoder_or_decoder, timestamps=ts)
    assert phases.state == "startup"
    assert handle.recorder.start_order.count(STARTUP) == 1
    assert handle.named(STARTUP) == [], "megatron.startup must stay open until start_train"

    before = time.time_ns()
    phases.start_train()
    after = time.time_ns()
    assert phases.state == "train"

    startup = handle.one(STARTUP)
    assert before <= startup.end_time <= after, "startup must end at start_train"
    assert startup.start_time == ns(ts["launch_script_start"])
    assert startup.parent is None
    assert startup.attributes["is_goodput_span"] is True
    assert startup.attributes["megatron.model_type"] == str(ModelType.encoder_or_decoder)

    # The rest of the lifecycle never touches B again.
    for iteration in range(5):
        phases.step(iteration)
    phases.end_train()
    phases.shutdown()

    assert handle.recorder.start_order.count(STARTUP) == 1
    assert len(handle.named(STARTUP)) == 1
    assert handle.recorder.end_calls[span_id(startup)] == 1, "startup end() called twice"
    handle.recorder.assert_all_ended_exactly_once()
    # B is the only span in its trace apart from its own children.
    others = [s for s in handle.in_trace(trace_id(startup)) if s is not startup]
    assert all(parent_id(s) == span_id(startup) for s in others)
    assert all(trace_id(c) != trace_id(startup) for c in handle.named(TRAIN))


def test_startup_is_a_new_trace_even_under_an_ambient_span(lifecycles):
    handle = FakeHandle()
    ambient = handle.tracer.start_span("ambient")
    token = otel_context.attach(otel_trace.set_span_in_context(ambient))
    try:
        phases = lifecycles.new(handle, save_interval=1)
        phases.start_job(model_type="gpt", timestamps=launch_timestamps())
        phases.start_train()
        # B is detached before it ends: the ambient span is current again.
        assert otel_trace.get_current_span() is ambient
        phases.step(0)
        phases.step(1)
        phases.end_train()
        assert otel_trace.get_current_span() is ambient
        phases.shutdown()
        assert otel_trace.get_current_span() is ambient
    finally:
        otel_context.detach(token)
        ambient.end()

    ambient_trace = ambient.context.trace_id
    for name in (STARTUP, TRAIN, PRE_STARTUP):
        for span in handle.named(name):
            assert span.parent is None, f"{name} inherited the ambient span"
            assert trace_id(span) != ambient_trace, f"{name} joined the ambient trace"
    assert len({trace_id(s) for s in handle.named(TRAIN)}) == 2


def test_work_during_startup_nests_under_startup(lifecycles):
    handle = FakeHandle()
    phases = lifecycles.new(handle)
    phases.start_job(model_type="gpt", timestamps=None)
    with (
        handle.tracer.start_as_current_span("model_init"),
        handle.tracer.start_as_current_span("build_layers"),
    ):
        pass
    loose = handle.tracer.start_span("load_checkpoint")
    loose.end()
    phases.start_train()
    with handle.tracer.start_as_current_span("between_start_train_and_first_step"):
        pass
    phases.shutdown()

    startup = handle.one(STARTUP)
    assert parent_id(handle.one("model_init")) == span_id(startup)
    assert parent_id(handle.one("load_checkpoint")) == span_id(startup)
    assert parent_id(handle.one("build_layers")) == span_id(handle.one("model_init"))
    assert trace_id(handle.one("build_layers")) == trace_id(startup)
    # Once B has ended it is no longer current.
    assert handle.one("between_start_train_and_first_step").parent is None


FOLDED_CASES = {
    "strictly_ordered": {},
    "presrun_equals_launch": {"launch_script_presrun": "launch_script_start"},
    "program_equals_presrun": {"program_start": "launch_script_presrun"},
}


@pytest.mark.parametrize("case", sorted(FOLDED_CASES))
def test_folded_launch_window_gives_two_backdated_children(lifecycles, case):
    handle = FakeHandle()
    ts = launch_timestamps()
    for key, same_as in FOLDED_CASES[case].items():
        ts[key] = ts[same_as]
    assert is_folded(ts)

    phases = lifecycles.new(handle)
    phases.start_job(model_type="gpt", timestamps=ts)
    # The children are finished at once: visible before B itself ends.
    launch, container = handle.one(LAUNCH_SCRIPT), handle.one(CONTAINER_LOAD)
    phases.start_train()
    startup = handle.one(STARTUP)

    assert startup.start_time == ns(ts["launch_script_start"])
    assert (launch.start_time, launch.end_time) == (
        ns(ts["launch_script_start"]),
        ns(ts["launch_script_presrun"]),
    )
    assert (container.start_time, container.end_time) == (
        ns(ts["launch_script_presrun"]),
        ns(ts["program_start"]),
    )
    for child in (launch, container):
        assert parent_id(child) == span_id(startup)
        assert trace_id(child) == trace_id(startup)
        assert child.attributes.get("is_goodput_span") is True


UNFOLDED_CASES = {
    "no_presrun": {"launch_script_presrun": None},
    "no_launch_start": {"launch_script_start": None},
    "no_program_start": {"program_start": None},
    "presrun_before_launch": {"launch_script_presrun": "-70"},
    "program_before_presrun": {"program_start": "-50"},
    "only_program_start": {
        "launch_script_start": None,
        "launch_script_presrun": None,
        "slurm_job_start_time": None,
    },
}


@pytest.mark.parametrize("case", sorted(UNFOLDED_CASES))
def test_unfolded_launch_window_has_no_launch_children(lifecycles, case):
    now = time.time()
    handle = FakeHandle()
    overrides = {
        k: (None if v is None else now + float(v)) for k, v in UNFOLDED_CASES[case].items()
    }
    ts = launch_timestamps(now, **overrides)
    assert not is_folded(ts)

    phases = lifecycles.new(handle)
    before = time.time_ns()
    phases.start_job(model_type="gpt", timestamps=ts)
    after = time.time_ns()
    phases.start_train()

    assert handle.named(LAUNCH_SCRIPT) == []
    assert handle.named(CONTAINER_LOAD) == []
    startup = handle.one(STARTUP)
    if "program_start" in ts:
        assert startup.start_time == ns(ts["program_start"])
    else:
        assert before <= startup.start_time <= after


@pytest.mark.parametrize("timestamps", [None, {}], ids=["none", "empty"])
def test_startup_without_timestamps_opens_now(lifecycles, timestamps):
    handle = FakeHandle()
    phases = lifecycles.new(handle)
    before = time.time_ns()
    phases.start_job(model_type=None, timestamps=timestamps)
    after = time.time_ns()
    phases.shutdown()
    startup = handle.one(STARTUP)
    assert before <= startup.start_time <= after
    assert handle.named(PRE_STARTUP) == []
    assert {s.name for s in handle.spans()} == {STARTUP}


PRE_STARTUP_CASES = {
    "due": ({}, True),
    "slurm_later_than_launch": ({"slurm_job_start_time": "-10"}, False),
    "slurm_equals_launch": ({"slurm_job_start_time": "launch"}, False),
    "slurm_missing": ({"slurm_job_start_time": None}, False),
    "launch_missing": ({"launch_script_start": None}, False),
    "both_missing": ({"launch_script_start": None, "slurm_job_start_time": None}, False),
}


@pytest.mark.parametrize("case", sorted(PRE_STARTUP_CASES))
def test_pre_startup_only_when_due(lifecycles, case):
    now = time.time()
    raw, due = PRE_STARTUP_CASES[case]
    ts = launch_timestamps(now)
    for key, value in raw.items():
        if value is None:
            ts.pop(key)
        elif value == "launch":
            ts[key] = ts["launch_script_start"]
        else:
            ts[key] = now + float(value)
    assert pre_startup_due(ts) is due

    handle = FakeHandle()
    phases = lifecycles.new(handle)
    phases.start_job(model_type="gpt", timestamps=ts)
    phases.shutdown()

    found = handle.named(PRE_STARTUP)
    if not due:
        assert found == []
        return
    assert len(found) == 1
    pre = found[0]
    assert pre.parent is None
    assert trace_id(pre) != trace_id(handle.one(STARTUP)), "pre_startup needs its own trace"
    assert handle.in_trace(trace_id(pre)) == [pre]
    assert pre.start_time == ns(ts["slurm_job_start_time"])
    assert pre.end_time == ns(ts["launch_script_start"])
    assert pre.attributes.get("is_goodput_span") is True


def test_start_job_emits_nothing_else(lifecycles):
    handle = FakeHandle()
    phases = lifecycles.new(handle)
    phases.start_job(model_type="gpt", timestamps=launch_timestamps())
    # main_entry / pretrain_entry are known, but imports / arg_parse are the
    # trainer's record_phase calls, not start_job's.
    assert sorted(s.name for s in handle.spans()) == sorted(
        [PRE_STARTUP, LAUNCH_SCRIPT, CONTAINER_LOAD]
    )
    assert sorted(handle.recorder.start_order) == sorted(
        [PRE_STARTUP, STARTUP, LAUNCH_SCRIPT, CONTAINER_LOAD]
    )
    assert list(handle.recorder.open_spans().values()) == [STARTUP]


def test_record_phase_makes_exact_backdated_children(lifecycles):
    handle = FakeHandle()
    ts = launch_timestamps()
    phases = lifecycles.new(handle)
    phases.start_job(model_type="gpt", timestamps=ts)
    phases.record_phase("megatron.startup.imports", ts["program_start"], ts["main_entry"])
    phases.record_phase("megatron.startup.arg_parse", ts["main_entry"], ts["pretrain_entry"])
    assert phases.state == "startup"
    phases.start_train()

    startup = handle.one(STARTUP)
    imports = handle.one("megatron.startup.imports")
    arg_parse = handle.one("megatron.startup.arg_parse")
    assert (imports.start_time, imports.end_time) == (
        ns(ts["program_start"]),
        ns(ts["main_entry"]),
    )
    assert (arg_parse.start_time, arg_parse.end_time) == (
        ns(ts["main_entry"]),
        ns(ts["pretrain_entry"]),
    )
    for child in (imports, arg_parse):
        assert parent_id(child) == span_id(startup)
        assert trace_id(child) == trace_id(startup)


@pytest.mark.parametrize(
    ("start", "end"), [(None, 5.0), (5.0, None), (None, None)], ids=["no_start", "no_end", "none"]
)
def test_record_phase_with_unknown_time_is_skipped(lifecycles, start, end):
    handle = FakeHandle()
    phases = lifecycles.new(handle)
    phases.start_job(model_type="gpt", timestamps=None)
    phases.record_phase("megatron.startup.imports", start, end)
    assert phases.state == "startup"
    phases.start_train()
    assert "megatron.startup.imports" not in handle.recorder.start_order
    assert [s.name for s in handle.spans()] == [STARTUP]


def test_shutdown_during_startup_ends_it_once(lifecycles):
    handle = FakeHandle()
    phases = lifecycles.new(handle)
    phases.start_job(model_type="gpt", timestamps=launch_timestamps())
    before = time.time_ns()
    phases.shutdown()
    after = time.time_ns()
    assert phases.state == "shutdown"
    startup = handle.one(STARTUP)
    assert before <= startup.end_time <= after
    assert otel_trace.get_current_span() is otel_trace.INVALID_SPAN, "startup left attached"
    assert len(handle.shutdown_calls) == 1
    handle.recorder.assert_all_ended_exactly_once()
