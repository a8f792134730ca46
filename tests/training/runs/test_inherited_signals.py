"""The signal dispositions a run inherits: the test suite's, and the trainer's own.

A non-interactive shell starts a background job with SIGINT and SIGQUIT
ignored (``bash -c 'tox -e py & wait'``), ``nohup`` starts its command with
SIGHUP ignored, and an ignored signal stays ignored in every child. The suite
must pass all the same: the harness gives every child it starts the default
action of the signals the tests send (``processes.give_children_default_signals``).
The trainer itself, started with SIGINT ignored, honours that, as any Unix
program started in the background does: a Ctrl-C meant for the shell's
foreground job does not end it.
"""

from __future__ import annotations

import signal
import sys
import time

import pytest
from processes import REPO_ROOT, TELEMETRY_ON, TINY, Process, ignoring, subprocess_env

from megatron.trace.otlp.reader import read_spans
from megatron.training.training_log import parse_log_losses

#: What ``bash -c 'tox &'`` and ``nohup`` leave ignored, together.
BACKGROUND_AND_NOHUP = ("SIGINT", "SIGQUIT", "SIGHUP")

#: The existing tests that send a trainer SIGINT and SIGHUP and expect it to die by them.
SIGNALLING_TESTS = (
    "tests/training/runs/test_reliability.py"
    "::test_sigint_ends_with_one_line_status_130_and_a_complete_trace",
    "tests/training/runs/test_reliability.py::test_sighup_ends_spans_and_dies_by_the_signal",
)


@pytest.mark.slow
def test_a_suite_started_with_sigint_and_sighup_ignored_still_interrupts_its_trainers(tmp_path):
    """The issue's case, end to end: pytest itself inherits SIGINT and SIGHUP ignored,
    and its trainers still end on them the documented way (death by the signal: one
    line, status -2 / 130, a complete trace; and -1 / 129 for SIGHUP)."""
    pytest_argv = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "--basetemp", str(tmp_path / "inner"),
        *(str(REPO_ROOT / test) for test in SIGNALLING_TESTS),
    ]  # fmt: skip
    suite = Process(ignoring(BACKGROUND_AND_NOHUP, pytest_argv), cwd=tmp_path, env=subprocess_env())
    assert suite.wait(timeout=300) == 0, suite.describe()
    assert f"{len(SIGNALLING_TESTS)} passed" in suite.stdout, suite.describe()


@pytest.mark.slow
@pytest.mark.parametrize("telemetry", [TELEMETRY_ON, ()], ids=["telemetry-on", "telemetry-off"])
def test_a_trainer_started_with_sigint_ignored_keeps_ignoring_it(tmp_path, telemetry):
    """No KeyboardInterrupt handler and no telemetry hook over an inherited SIG_IGN:
    Ctrl-Cs mid-run change nothing, and the run ends as if none had come."""
    iterations = 12
    argv = [
        sys.executable, "-m", "megatron.training", *TINY, *telemetry,
        "--train-iters", str(iterations), "--otel-trace-file", "traces.jsonl",
    ]  # fmt: skip
    trainer = Process(
        ignoring(["SIGINT"], argv),
        cwd=tmp_path,
        env=subprocess_env({"MEGATRON_TEST_ITERATION_SLEEP": "0.2"}),
    )
    trainer.wait_until(lambda: len(parse_log_losses(trainer.stdout)) >= 3)
    for _ in range(3):
        trainer.signal(signal.SIGINT)
        time.sleep(0.1)
    assert trainer.wait() == 0, trainer.describe()
    assert "interrupted" not in trainer.stderr and "Traceback" not in trainer.stderr
    assert sorted(parse_log_losses(trainer.stdout)) == list(range(1, iterations + 1))
    if telemetry:
        spans = list(read_spans(tmp_path / "traces.jsonl"))
        assert [s for s in spans if s["status_code"] == "ERROR"] == []
        done = [s for s in spans if s["name"] == "megatron.train.iteration"]
        assert sorted(s["attributes"]["megatron.iteration"] for s in done) == list(
            range(iterations)
        )
