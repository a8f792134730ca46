"""Traces C0..Cn (megatron.train): rerooted at save_interval boundaries.

The pass counter restarts at 0 on start_train; the
first step() opens C0; a new C every save_interval passes; save_interval <= 0
gives exactly one C; each C is a root of its own trace, linked to the one before
(C0 to B), current while open, and carries its 0-based index and the first and
last iteration it covered.
"""

from __future__ import annotations

import itertools
import math
import time

import pytest
from fake_handles import FakeHandle, links, parent_id, ref, span_id, trace_id
from launch_times import launch_timestamps
from lifecycle_spec import STARTUP, TRAIN
from opentelemetry import trace as otel_trace

FIRST_ITERATION = "megatron.interval.first_iteration"
LAST_ITERATION = "megatron.interval.last_iteration"
INDEX = "megatron.interval.index"
REROOTED = "megatron.interval.rerooted"


def expected_interval_of_pass(save_interval: int, passes: int) -> list[int]:
    """Which interval each 0-based loop pass belongs to, as documented."""
    if save_interval <= 0:
        return [0] * passes
    return [p // save_interval for p in range(passes)]


def run_loop(lifecycles, save_interval: int, passes: int, first_iteration: int | None):
    """A whole incarnation: start_job, start_train, `passes` loop passes each doing
    some work in a span, end_train, shutdown. Returns the handle."""
    handle = FakeHandle()
    phases = lifecycles.new(handle, save_interval=save_interval)
    phases.start_job(model_type="gpt", timestamps=launch_timestamps())
    phases.start_train()
    for p in range(passes):
        iteration = None if first_iteration is None else first_iteration + p
        phases.step(iteration)
        assert phases.state == "interval"
        with (
            handle.tracer.start_as_current_span(f"pass.{p}"),
            handle.tracer.start_as_current_span(f"pass.{p}.forward"),
        ):
            pass
    phases.end_train()
    assert phases.state == "ended"
    assert otel_trace.get_current_span() is otel_trace.INVALID_SPAN, "an interval stayed current"
    phases.shutdown()
    handle.recorder.assert_all_ended_exactly_once()
    return handle


@pytest.mark.parametrize("first_iteration", [0, 1000], ids=["fresh", "resumed_at_1000"])
@pytest.mark.parametrize("passes", [1, 2, 3, 4, 7, 10])
@pytest.mark.parametrize("save_interval", [1, 3, 0, -1])
def test_reroot_at_save_interval_boundaries(lifecycles, save_interval, passes, first_iteration):
    handle = run_loop(lifecycles, save_interval, passes, first_iteration)
    owner = expected_interval_of_pass(save_interval, passes)
    n_intervals = math.ceil(passes / save_interval) if save_interval > 0 else 1
    assert max(owner) + 1 == n_intervals

    intervals = handle.intervals()
    assert len(intervals) == n_intervals
    assert [c.attributes[INDEX] for c in intervals] == list(range(n_intervals))
    startup = handle.one(STARTUP)

    # Each C is a root of its own trace.
    assert all(c.parent is None for c in intervals)
    traces = [trace_id(c) for c in intervals] + [trace_id(startup)]
    assert len(set(traces)) == len(traces), "intervals must not share a trace"
    for c in intervals:
        assert c.attributes["is_goodput_span"] is True

    # Links chain C0 -> B and C(k) -> C(k-1).
    assert links(intervals[0]) == [ref(startup)]
    for previous, current in itertools.pairwise(intervals):
        assert links(current) == [ref(previous)]
        assert previous.end_time <= current.start_time

    # Each pass's work is nested under the interval that was open during the pass.
    for p, k in enumerate(owner):
        work = handle.one(f"pass.{p}")
        assert parent_id(work) == span_id(intervals[k]), f"pass {p} not under C{k}"
        assert trace_id(work) == trace_id(intervals[k])
        inner = handle.one(f"pass.{p}.forward")
        assert parent_id(inner) == span_id(work)

    # First / last iteration of each interval.
    for k, c in enumerate(intervals):
        passes_in_k = [p for p, owner_k in enumerate(owner) if owner_k == k]
        assert c.attributes[FIRST_ITERATION] == first_iteration + passes_in_k[0]
        assert c.attributes[LAST_ITERATION] == first_iteration + passes_in_k[-1]

    # Every interval but the last was closed by a reroot; the last by end_train.
    assert [c.attributes[REROOTED] for c in intervals] == [True] * (n_intervals - 1) + [False]


def test_an_interval_ended_by_shutdown_was_not_rerooted(lifecycles):
    """A reader tells a killed run by a last interval that says a reroot followed."""
    handle = FakeHandle()
    phases = lifecycles.new(handle, save_interval=2)
    phases.start_job(model_type="gpt", timestamps=launch_timestamps())
    phases.start_train()
    for iteration in range(3):
        phases.step(iteration)
    phases.shutdown()  # C1 is open: SIGTERM's path
    intervals = handle.intervals()
    assert [c.attributes[REROOTED] for c in intervals] == [True, False]


def test_boundaries_do_not_depend_on_the_resume_offset(lifecycles):
    """Counting passes, not iterations: an offset that is not a multiple of the
    save interval (1000 % 3 == 1, 1001 % 3 == 2) gives the same boundaries."""

    def shape(first_iteration):
        handle = run_loop(lifecycles, save_interval=3, passes=8, first_iteration=first_iteration)
        intervals = handle.intervals()
        by_span = {span_id(c): c.attributes[INDEX] for c in intervals}
        return [by_span[parent_id(handle.one(f"pass.{p}"))] for p in range(8)], [
            (
                c.attributes[FIRST_ITERATION] - first_iteration,
                c.attributes[LAST_ITERATION] - first_iteration,
            )
            for c in intervals
        ]

    fresh = shape(0)
    assert fresh == ([0, 0, 0, 1, 1, 1, 2, 2], [(0, 2), (3, 5), (6, 7)])
    assert shape(1000) == fresh
    assert shape(1001) == fresh


def test_step_without_iteration_numbers_sets_no_iteration_attributes(lifecycles):
    handle = run_loop(lifecycles, save_interval=2, passes=5, first_iteration=None)
    intervals = handle.intervals()
    assert len(intervals) == 3
    for c in intervals:
        assert FIRST_ITERATION not in c.attributes
        assert LAST_ITERATION not in c.attributes


def test_counter_restarts_on_start_train_of_each_incarnation(lifecycles):
    """Two incarnations in one process, each with its own lifecycle and handle."""
    for _ in range(2):
        handle = run_loop(lifecycles, save_interval=2, passes=3, first_iteration=500)
        intervals = handle.intervals()
        assert [c.attributes[INDEX] for c in intervals] == [0, 1]
        assert [
            (c.attributes[FIRST_ITERATION], c.attributes[LAST_ITERATION]) for c in intervals
        ] == [
            (500, 501),
            (502, 502),
        ]
        assert len(handle.shutdown_calls) == 1


def test_a_boundary_cut_short_leaves_the_next_pass_a_boundary(lifecycles, monkeypatch):
    """A Ctrl-C landing in a boundary pass before its reroot ran: the pass counter
    does not run past the boundary, so the next pass reroots (and the one after
    counts normally)."""
    handle = FakeHandle()
    phases = lifecycles.new(handle, save_interval=2)
    phases.start_job()
    phases.start_train()
    phases.step(0)
    phases.step(1)

    def interrupted(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(phases, "_fire", interrupted)
    with pytest.raises(KeyboardInterrupt):
        phases.step(2)
    monkeypatch.undo()
    phases.step(3)  # the boundary again: C1 opens here
    phases.step(4)
    phases.step(5)  # C2
    phases.shutdown()
    assert [c.attributes[FIRST_ITERATION] for c in handle.intervals()] == [0, 3, 5]


def test_interval_is_current_and_ended_when_the_next_opens(lifecycles):
    handle = FakeHandle()
    phases = lifecycles.new(handle, save_interval=2)
    phases.start_job(model_type="gpt", timestamps=None)
    phases.start_train()
    assert otel_trace.get_current_span() is otel_trace.INVALID_SPAN

    phases.step(0)
    c0 = otel_trace.get_current_span()
    assert c0.name == TRAIN and c0.is_recording()
    phases.step(1)
    assert otel_trace.get_current_span() is c0, "non-boundary pass must not reroot"
    assert handle.named(TRAIN) == []

    before = time.time_ns()
    phases.step(2)
    after = time.time_ns()
    c1 = otel_trace.get_current_span()
    assert c1 is not c0 and c1.name == TRAIN
    (ended,) = handle.named(TRAIN)
    assert span_id(ended) == c0.get_span_context().span_id
    assert before <= ended.end_time <= after

    phases.shutdown()  # no end_train: shutdown ends the open interval
    assert phases.state == "shutdown"
    assert len(handle.named(TRAIN)) == 2
    assert otel_trace.get_current_span() is otel_trace.INVALID_SPAN
    assert len(handle.shutdown_calls) == 1
    handle.recorder.assert_all_ended_exactly_once()


def test_every_reroot_chains_intervals(lifecycles):
    handle = FakeHandle()
    phases = lifecycles.new(handle, save_interval=1)
    phases.start_job(model_type="gpt", timestamps=None)
    phases.start_train()
    phases.step()
    assert phases.state == "interval"
    phases.step()
    phases.step()
    assert phases.state == "interval"
    phases.end_train()
    phases.shutdown()

    startup = handle.one(STARTUP)
    intervals = handle.intervals()
    assert [c.attributes[INDEX] for c in intervals] == [0, 1, 2]
    assert links(intervals[0]) == [ref(startup)]
    assert links(intervals[1]) == [ref(intervals[0])]
    assert links(intervals[2]) == [ref(intervals[1])]
    handle.recorder.assert_all_ended_exactly_once()


def test_no_two_structural_roots_are_ever_open_together(lifecycles):
    handle = run_loop(lifecycles, save_interval=1, passes=6, first_iteration=0)
    assert handle.recorder.max_open_roots == 1
    assert handle.recorder.start_order.count(TRAIN) == 6
