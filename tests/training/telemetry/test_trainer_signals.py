"""SIGTERM exit paths in real subprocesses (``megatron/training/README.md``, "Exit
paths and the exit-hook machine", paths 4 and 5, and a signal that interrupts a
transition).

Each test writes a small driver script that builds a real TelemetryHandle with
the JSONL exporter, drives SpanPhases + install_exit_hooks, prints a marker and
blocks inside an iteration span; the test then signals it and reads the trace
file back with megatron.trace.otlp.reader.read_spans.
"""

from __future__ import annotations

import itertools
import json
import signal
from pathlib import Path

import pytest
from lifecycle_spec import STARTUP, TRAIN
from processes import REPO_ROOT, ScriptRun, named

ITERATION = "megatron.train.iteration"
CUT_SHORT = "megatron.span.cut_short"

# Ten passes from iteration 1000 with save_interval 2: C0 = {1000, 1001},
# C1 = {1002, ...}. The driver blocks inside iteration 1002.
LOOP = """
from megatron.core.telemetry import managed_span


def run_loop(phases, tracer, block_at=1002, on_block=None):
    phases.start_job(model_type="gpt", timestamps={"program_start": time.time() - 1.0})
    phases.start_train()
    for iteration in range(1000, 1010):
        phases.step(iteration)
        with managed_span("step", "megatron.train.iteration", tracer=tracer, iteration=iteration):
            if iteration == block_at:
                say("READY", os.getpid())
                if on_block is None:
                    time.sleep(60)
                else:
                    on_block()
"""


def assert_unique_ids(spans):
    ids = [s["span_id"] for s in spans]
    assert len(ids) == len(set(ids)), "a span was exported twice"


def assert_complete_structure(spans, n_intervals):
    """B once, C0..C(n-1) once each, every root in its own trace, linked as a chain."""
    assert_unique_ids(spans)
    (startup,) = named(spans, STARTUP)
    intervals = sorted(
        named(spans, TRAIN), key=lambda s: s["attributes"]["megatron.interval.index"]
    )
    assert [c["attributes"]["megatron.interval.index"] for c in intervals] == list(
        range(n_intervals)
    )
    roots = [startup, *intervals]
    assert all(r["parent_id"] is None for r in roots)
    assert len({r["trace_id"] for r in roots}) == len(roots)
    assert intervals[0]["links"] == [(startup["trace_id"], startup["span_id"])]
    for prev, cur in itertools.pairwise(intervals):
        assert cur["links"] == [(prev["trace_id"], prev["span_id"])]
    for r in roots:
        assert r["end_ns"] >= r["start_ns"]
        assert not r["attributes"].get(CUT_SHORT), f"{r['name']} was left to the base layer"
    return startup, intervals


def iterations_by_number(spans):
    return {s["attributes"]["iteration"]: s for s in named(spans, ITERATION)}


HARD = (
    LOOP
    + """
signal.signal(signal.SIGTERM, signal.SIG_DFL)
handle = make_handle()
phases = SpanPhases(handle, save_interval=2)
install_exit_hooks(phases)
run_loop(phases, handle.tracer)
say("NOT_KILLED")
"""
)


def test_hard_sigterm_dies_by_the_signal_after_the_trace_is_on_disk(tmp_path):
    run = ScriptRun(tmp_path, HARD)
    run.wait_for("READY")
    run.signal(signal.SIGTERM)
    returncode = run.wait()
    assert returncode == -15, run.describe()
    assert run.lines_starting("NOT_KILLED") == []

    spans = run.read_spans()
    _, intervals = assert_complete_structure(spans, n_intervals=2)
    iterations = iterations_by_number(spans)
    assert sorted(iterations) == [1000, 1001, 1002]
    in_flight = iterations[1002]
    assert in_flight["attributes"].get(CUT_SHORT) is True
    assert in_flight["parent_id"] == intervals[1]["span_id"]
    for done in (1000, 1001):
        assert not iterations[done]["attributes"].get(CUT_SHORT)
        assert iterations[done]["parent_id"] == intervals[0]["span_id"]
    assert intervals[1]["attributes"]["megatron.interval.first_iteration"] == 1002


GRACEFUL = (
    LOOP
    + """
from megatron.trace.otlp.reader import read_spans

previous_calls = []


def previous(signum, frame):
    previous_calls.append((signum, phases.state))
    say("PREVIOUS_CALLED", signum, phases.state)


def wait_for_drain_signal():
    deadline = time.monotonic() + 30
    while not previous_calls and time.monotonic() < deadline:
        time.sleep(0.02)
    names = [s["name"] for s in read_spans(TRACE_FILE)] if os.path.exists(TRACE_FILE) else []
    say("AFTER_SIGTERM", json.dumps({
        "state": phases.state,
        "hooks": EXIT_HOOKS.state,
        "previous_calls": previous_calls,
        "names": names,
    }))


signal.signal(signal.SIGTERM, previous)
handle = make_handle()
phases = SpanPhases(handle, save_interval=2)
install_exit_hooks(phases, graceful=True)
run_loop(phases, handle.tracer, on_block=wait_for_drain_signal)
phases.end_train()
phases.shutdown()
say("DONE", phases.state, EXIT_HOOKS.state)
"""
)


def test_graceful_sigterm_only_flushes_and_keeps_the_lifecycle(tmp_path):
    run = ScriptRun(tmp_path, GRACEFUL)
    run.wait_for("READY")
    run.signal(signal.SIGTERM)
    after = json.loads(run.wait_for("AFTER_SIGTERM").split(" ", 1)[1])
    returncode = run.wait()
    assert returncode == 0, run.describe()

    assert after["state"] == "interval"
    assert after["hooks"] == "installed"
    assert after["previous_calls"] == [[15, "interval"]], "previous handler not chained once"
    # The flush put everything finished so far on disk: B, C0 and its two iterations.
    assert sorted(after["names"]) == sorted([STARTUP, TRAIN, ITERATION, ITERATION])

    assert run.lines_starting("DONE") == ["DONE shutdown installed"]
    spans = run.read_spans()
    assert_complete_structure(spans, n_intervals=5)
    iterations = iterations_by_number(spans)
    assert sorted(iterations) == list(range(1000, 1010))
    assert not any(s["attributes"].get(CUT_SHORT) for s in spans)


CHAINED = (
    LOOP
    + """
from megatron.trace.otlp.reader import read_spans


def previous(signum, frame):
    names = [s["name"] for s in read_spans(TRACE_FILE)]
    say("PREVIOUS", json.dumps({
        "signum": signum,
        "state": phases.state,
        "hooks": EXIT_HOOKS.state,
        "shutdown_calls": proxy.shutdown_calls,
        "names": names,
    }))
    os._exit(7)


signal.signal(signal.SIGTERM, previous)
handle = make_handle()
proxy = Proxy(handle)
phases = SpanPhases(proxy, save_interval=2)
install_exit_hooks(phases)
run_loop(phases, handle.tracer)
say("NOT_KILLED")
"""
)


def test_hard_sigterm_chains_to_a_previous_python_handler_after_shutdown(tmp_path):
    run = ScriptRun(tmp_path, CHAINED)
    run.wait_for("READY")
    run.signal(signal.SIGTERM)
    seen = json.loads(run.wait_for("PREVIOUS").split(" ", 1)[1])
    returncode = run.wait()
    assert returncode == 7, run.describe()
    assert seen["signum"] == 15
    assert seen["state"] == "terminated", "previous handler ran before the shutdown"
    assert seen["hooks"] == "terminating"
    assert seen["shutdown_calls"] == 1
    # Everything was on disk already when the previous handler ran (it then
    # left with os._exit, so no atexit hook could have written anything later).
    assert sorted(seen["names"]) == sorted([STARTUP, TRAIN, TRAIN] + [ITERATION] * 3)
    spans = run.read_spans()
    assert_complete_structure(spans, n_intervals=2)
    assert iterations_by_number(spans)[1002]["attributes"].get(CUT_SHORT) is True


SECOND_SIGTERM = (
    LOOP
    + """
from megatron.trace.otlp.reader import read_spans

MODE = sys.argv[2]
previous_calls = []


ResendingProxy = telemetry_code(
    '''
class ResendingProxy(Proxy):
    "The handle, whose shutdown sends this process a second SIGTERM (in one mode)."

    def shutdown(self, *args, **kwargs):
        self.shutdown_calls += 1
        say("SHUTDOWN_CALL", self.shutdown_calls)
        if MODE == "during_shutdown" and self.shutdown_calls == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)  # give a second handler every chance to run in here
        return self._handle.shutdown(*args, **kwargs)
''',
    Proxy=Proxy,
    MODE=MODE,
    os=os,
    signal=signal,
    time=time,
    say=say,
)["ResendingProxy"]


def previous(signum, frame):
    previous_calls.append(phases.state)
    if len(previous_calls) > 1:
        return  # chained again for the second signal: the first call reports
    if MODE == "during_previous":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
    names = [s["name"] for s in read_spans(TRACE_FILE)]
    say("PREVIOUS", json.dumps({
        "shutdown_calls": proxy.shutdown_calls,
        "previous_calls": previous_calls,
        "hooks": EXIT_HOOKS.state,
        "names": names,
    }))
    os._exit(9)


signal.signal(signal.SIGTERM, previous)
handle = make_handle()
proxy = ResendingProxy(handle)
phases = SpanPhases(proxy, save_interval=2)
install_exit_hooks(phases)
run_loop(phases, handle.tracer)
say("NOT_KILLED")
"""
)


@pytest.mark.parametrize("mode", ["during_shutdown", "during_previous"])
def test_second_sigterm_does_not_reenter_shutdown(tmp_path, mode):
    run = ScriptRun(tmp_path, SECOND_SIGTERM, extra_args=[mode])
    run.wait_for("READY")
    run.signal(signal.SIGTERM)
    returncode = run.wait()
    assert returncode == 9, run.describe()
    (line,) = run.lines_starting("PREVIOUS")
    seen = json.loads(line.split(" ", 1)[1])
    assert seen["shutdown_calls"] == 1, "shutdown re-entered by the second SIGTERM"
    assert seen["hooks"] == "terminating"
    assert seen["previous_calls"][0] == "terminated"
    assert len(run.lines_starting("SHUTDOWN_CALL")) == 1
    # The first SIGTERM's shutdown finished and exported before anything moved on.
    assert sorted(seen["names"]) == sorted([STARTUP, TRAIN, TRAIN] + [ITERATION] * 3)
    spans = run.read_spans()
    assert_complete_structure(spans, n_intervals=2)


IN_CALLBACK = """
KillingTracer = telemetry_code(
    '''
class KillingTracer:
    "Sends SIGTERM to this process from inside the reroot callback, as megatron.train starts."

    def __init__(self, tracer):
        self._tracer = tracer
        self.fired = False

    def start_span(self, name, *args, **kwargs):
        if name == "megatron.train" and not self.fired:
            self.fired = True
            say("KILLING")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)  # a handler that is not held off would run right here
        return self._tracer.start_span(name, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tracer, name)
''',
    os=os,
    signal=signal,
    time=time,
    say=say,
)["KillingTracer"]


signal.signal(signal.SIGTERM, signal.SIG_DFL)
handle = make_handle()
phases = SpanPhases(Proxy(handle, tracer=KillingTracer(handle.tracer)), save_interval=2)
install_exit_hooks(phases)
phases.start_job(model_type="gpt", timestamps={"program_start": time.time() - 1.0})
phases.start_train()
phases.step(1000)
say("AFTER_STEP", phases.state)
with handle.tracer.start_as_current_span("megatron.train.iteration"):
    time.sleep(30)
say("NOT_KILLED")
"""


def test_sigterm_raised_inside_a_transition_callback_leaves_a_complete_trace(tmp_path):
    run = ScriptRun(tmp_path, IN_CALLBACK)
    run.wait_for("KILLING")
    returncode = run.wait()
    assert returncode == -15, run.describe()
    assert run.lines_starting("NOT_KILLED") == []
    spans = run.read_spans()
    # The reroot that was running completed (C0 exists, linked to B) and the
    # shutdown that followed ended it: each structural span exactly once.
    assert_complete_structure(spans, n_intervals=1)
    assert all(s["end_ns"] >= s["start_ns"] for s in spans)
    assert {s["name"] for s in spans} <= {STARTUP, TRAIN, ITERATION}


def test_driver_scripts_use_the_repo_checkout(tmp_path):
    """The subprocesses import this very checkout (PYTHONPATH = repo root)."""
    run = ScriptRun(
        tmp_path,
        """
import megatron.training.telemetry_spans as m
say("MODULE", m.__file__)
""",
    )
    assert run.wait() == 0, run.describe()
    (line,) = run.lines_starting("MODULE")
    assert Path(line.split(" ", 1)[1]).resolve() == (
        REPO_ROOT / "megatron" / "training" / "telemetry_spans.py"
    )
