"""End-to-end: every way a run can die still leaves a readable, complete trace.

The exception, hard SIGTERM, graceful SIGTERM and SIGKILL paths of
``megatron/training/README.md``, "Exit paths and the exit-hook machine", each on
a real trainer process.
"""

from __future__ import annotations

import signal

import pytest
from trace_helpers import incarnations

from megatron.trace.otlp.reader import read_spans

pytestmark = pytest.mark.slow

TRACE = "traces.jsonl"
# Slow iterations so a signal lands inside one, and intervals of two
# iterations so the first finished interval is on disk within a second or two.
# No --save unless a test needs it: the interval is still cut every
# --save-interval passes, and no checkpoint write competes with the iteration
# for the moment the signal lands.
SLOW = {"MEGATRON_TEST_ITERATION_SLEEP": "0.3"}


def _long_run(cli, *extra: str) -> tuple[str, ...]:
    return (
        *cli.TINY,
        *cli.TELEMETRY_ON,
        "--otel-trace-file", TRACE,
        "--train-iters", "1000",
        "--save-interval", "2",
        *extra,
    )  # fmt: skip


def _spans_on_disk(cli):
    path = cli.cwd / TRACE
    return read_spans(path) if path.exists() else []


def _finished_intervals(cli) -> int:
    return sum(1 for s in _spans_on_disk(cli) if s["name"] == "megatron.train")


def _assert_chain_complete(spans) -> dict:
    """One incarnation: a startup and intervals 0..n-1 chained to it (checked by incarnations)."""
    (run,) = incarnations(spans)
    assert run["startup"] is not None
    indexes = [c["attributes"]["megatron.interval.index"] for c in run["intervals"]]
    assert indexes == list(range(len(indexes))) and indexes
    return run


def _cut_short(spans):
    return [s for s in spans if s["attributes"].get("megatron.span.cut_short")]


def test_exception_in_a_training_step_shuts_down_and_keeps_the_traceback(training_cli):
    cli = training_cli
    result = cli.run(
        *cli.TINY,
        *cli.TELEMETRY_ON,
        "--otel-trace-file", TRACE,
        "--train-iters", "9",
        "--save-interval", "3",
        "--save", "ckpt",
        env={"MEGATRON_TEST_FAULT_AT_ITERATION": "4"},
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.rstrip().endswith("RuntimeError: injected fault at iteration 4")
    assert "before_forward" in result.stderr  # raised where it happened, not re-wrapped
    spans = read_spans(cli.cwd / TRACE)
    run = _assert_chain_complete(spans)
    assert len(run["intervals"]) == 2  # 0..2, then 3..4 (where the fault hit)
    (failed,) = [
        s
        for s in spans
        if s["name"] == "megatron.train.iteration" and s["attributes"]["megatron.iteration"] == 4
    ]
    assert failed["status_code"] == "ERROR"
    assert "injected fault at iteration 4" in failed["status_message"]
    assert failed["trace_id"] == run["intervals"][1]["trace_id"]
    assert not _cut_short(spans)  # everything was ended by its own code


def test_hard_sigterm_dies_by_the_signal_with_every_interval_exported(training_cli):
    cli = training_cli
    trainer = cli.start(*_long_run(cli), env=SLOW)
    trainer.wait_until(lambda: _finished_intervals(cli) >= 1)
    trainer.signal(signal.SIGTERM)
    assert trainer.wait() == -signal.SIGTERM
    spans = read_spans(cli.cwd / TRACE)
    run = _assert_chain_complete(spans)
    assert len(run["intervals"]) >= 2  # the finished ones and the one in flight
    in_flight = [s for s in _cut_short(spans) if s["name"] == "megatron.train.iteration"]
    assert len(in_flight) == 1
    assert in_flight[0]["trace_id"] == run["intervals"][-1]["trace_id"]
    # The structural spans were ended by the lifecycle, not cut short.
    assert not [s for s in _cut_short(spans) if s["name"] in ("megatron.startup", "megatron.train")]


def test_graceful_sigterm_finishes_the_iteration_saves_and_exits_zero(training_cli):
    cli = training_cli
    trainer = cli.start(*_long_run(cli, "--exit-signal-handler", "--save", "ckpt"), env=SLOW)
    trainer.wait_until(lambda: " iteration        3/" in trainer.stdout)
    trainer.signal(signal.SIGTERM)
    assert trainer.wait() == 0, trainer.stderr
    assert "exiting program at iteration" in trainer.stdout
    saved = int((cli.cwd / "ckpt" / "latest_checkpointed_iteration.txt").read_text())
    assert saved >= 3
    assert (cli.cwd / "ckpt" / f"iter_{saved:07d}" / "model_optim_rng.pt").is_file()
    spans = read_spans(cli.cwd / TRACE)
    run = _assert_chain_complete(spans)
    assert not _cut_short(spans)
    iterations = [s for s in spans if s["name"] == "megatron.train.iteration"]
    assert len(iterations) == saved  # the iteration in flight was finished, not cut
    saves = [s for s in spans if s["name"] == "megatron.checkpoint.save"]
    assert saves[-1]["attributes"]["megatron.iteration"] == saved
    assert saves[-1]["trace_id"] == run["intervals"][-1]["trace_id"]


def test_sigkill_leaves_a_readable_file_with_every_finished_interval(training_cli):
    cli = training_cli
    trainer = cli.start(*_long_run(cli), env=SLOW)
    trainer.wait_until(lambda: _finished_intervals(cli) >= 2)
    finished_before_kill = _finished_intervals(cli)
    trainer.kill()
    assert trainer.process.returncode == -signal.SIGKILL
    spans = read_spans(cli.cwd / TRACE)  # a torn last line would be skipped, not fatal
    run = _assert_chain_complete(spans)
    assert len(run["intervals"]) >= finished_before_kill
