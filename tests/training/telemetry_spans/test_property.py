"""Random trigger sequences against a small reference model of the table.

Whatever the order (legal or not), the lifecycle raises SpanPhaseError exactly
when the model says the trigger is illegal, its state always equals the model's,
at most one structural root (megatron.startup / megatron.train) is ever open, and
once shutdown has run every span started has been ended exactly once and the
handle was shut down exactly once.
"""

from __future__ import annotations

import re
from typing import ClassVar

import pytest
from fake_handles import FakeHandle
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from launch_times import launch_timestamps
from lifecycle_spec import FULL_TABLE, STARTUP, TRAIN
from lifecycles import Lifecycles
from properties import examples

from megatron.training.telemetry_spans import SpanPhaseError


class ReferenceModel:
    """The documented transition table, as plain Python, and the pass counter.

    ``step`` counts a pass: a boundary every ``save_interval`` passes from the first
    (with none, the first alone), where it fires ``reroot`` (legal where ``reroot``
    is: from train it always opens an interval, in interval it stays there); off a
    boundary it does nothing. A boundary that opens no interval leaves the next pass a
    boundary too."""

    TABLE: ClassVar[dict[tuple[str, str], str]] = FULL_TABLE

    def __init__(self, save_interval: int) -> None:
        self.state = "job"
        self.period = save_interval if save_interval > 0 else float("inf")
        self.left = 1

    def next_state(self, trigger: str) -> str | None:
        return self.TABLE.get((self.state, trigger))

    def boundary(self) -> bool:
        """Count a pass: whether the table is asked."""
        self.left -= 1
        return self.left <= 0


# What must be open in each state: the structural roots the state owns.
OPEN_ROOTS_IN = {
    "job": [],
    "startup": [STARTUP],
    "train": [],
    "interval": [TRAIN],
    "ended": [],
    "shutdown": [],
    "terminated": [],
}


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.lifecycles = Lifecycles().__enter__()
        self.model = ReferenceModel(0)
        self.handle = FakeHandle()
        self.phases = None
        self.iteration = 0

    @initialize(
        save_interval=st.sampled_from([-1, 0, 1, 2, 3]),
        first_iteration=st.sampled_from([0, 1, 1000]),
    )
    def create(self, save_interval, first_iteration):
        self.phases = self.lifecycles.new(self.handle, save_interval=save_interval)
        self.model = ReferenceModel(save_interval)
        self.iteration = first_iteration

    def fire(self, trigger: str, *args, **kwargs) -> None:
        before = self.model.state
        expected = self.model.next_state(trigger)
        if expected is None:
            with pytest.raises(SpanPhaseError) as caught:
                getattr(self.phases, trigger)(*args, **kwargs)
            message = str(caught.value)
            assert re.search(rf"\b{trigger}\b", message), message
            assert re.search(rf"\b{before}\b", message), message
            assert self.phases.state == before
        else:
            getattr(self.phases, trigger)(*args, **kwargs)
            self.model.state = expected

    @rule(
        timestamps=st.sampled_from(
            [
                None,
                "folded",
                "unfolded",
            ]
        )
    )
    def start_job(self, timestamps):
        ts = None
        if timestamps == "folded":
            ts = launch_timestamps()
        elif timestamps == "unfolded":
            ts = launch_timestamps(launch_script_presrun=None)
        self.fire("start_job", model_type="gpt", timestamps=ts)

    @rule(
        start=st.one_of(st.none(), st.floats(min_value=1.6e9, max_value=1.7e9)),
        duration=st.one_of(st.none(), st.floats(min_value=0.0, max_value=100.0)),
    )
    def record_phase(self, start, duration):
        end = None if start is None or duration is None else start + duration
        self.fire("record_phase", "megatron.startup.phase", start, end)

    @rule()
    def start_train(self):
        self.fire("start_train")

    @rule()
    def end_train(self):
        self.fire("end_train")

    @rule()
    def flush(self):
        self.fire("flush")

    @rule()
    def shutdown(self):
        self.fire("shutdown")

    @rule(signum=st.sampled_from([None, 15]))
    def terminate(self, signum):
        """An exit path (a hard signal's hook, the atexit fallback), at any moment."""
        self.fire("terminate", signum)

    @rule(with_iteration=st.booleans())
    def step(self, with_iteration):
        iteration = self.iteration if with_iteration else None
        self.iteration += 1
        if not self.model.boundary():
            self.phases.step(iteration)  # a pass counted, nothing asked of the table
            return
        opens = self.model.next_state("step") == "interval"
        self.model.left = 1  # unless it opens an interval, the next pass is a boundary too
        self.fire("step", iteration)
        if opens:
            self.model.left = self.model.period

    @rule()
    def work(self):
        """Work done inside the current phase, through ordinary context propagation."""
        with self.handle.tracer.start_as_current_span("work"):
            pass

    @invariant()
    def state_matches_model(self):
        if self.phases is not None:
            assert self.phases.state == self.model.state

    @invariant()
    def at_most_one_structural_root_open(self):
        recorder = self.handle.recorder
        assert recorder.max_open_roots <= 1
        assert sorted(recorder.open_roots.values()) == OPEN_ROOTS_IN[self.model.state]

    @invariant()
    def everything_ended_once_after_shutdown(self):
        if self.model.state in ("shutdown", "terminated"):
            self.handle.recorder.assert_all_ended_exactly_once()
            assert len(self.handle.shutdown_calls) == 1

    def teardown(self):
        try:
            if self.phases is not None and self.phases.state not in ("shutdown", "terminated"):
                self.phases.shutdown()
                self.handle.recorder.assert_all_ended_exactly_once()
                assert len(self.handle.shutdown_calls) == 1
        finally:
            self.lifecycles.__exit__(None, None, None)


LifecycleMachine.TestCase.settings = settings(
    max_examples=examples(150),
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLifecycleAgainstReferenceModel = LifecycleMachine.TestCase


def test_long_deterministic_walk_through_the_same_rules():
    """The rules and invariants above, driven by hand along the trainer's usual path."""
    machine = LifecycleMachine()
    machine.create(save_interval=2, first_iteration=0)
    machine.start_job("folded")
    machine.record_phase(1.65e9, 2.0)
    machine.work()
    machine.start_train()
    for _ in range(50):
        machine.step(True)
        machine.work()
        machine.state_matches_model()
        machine.at_most_one_structural_root_open()
    machine.end_train()
    machine.shutdown()
    machine.everything_ended_once_after_shutdown()
    assert machine.handle.recorder.start_order.count(TRAIN) == 25
    machine.teardown()
