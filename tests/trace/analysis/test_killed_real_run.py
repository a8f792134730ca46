"""A real run of this project's trainer, ``default`` span groups, SIGKILLed and resumed:
the report's bounds are narrowed by the metrics it exported and still hold the truth.

With the ``default`` groups nothing is written while an interval is open, so the kill
(past the save at iteration 100, before the next) loses its whole interval; the
iteration gauge the trainer exports every 10 s to ``metrics.jsonl`` says how far it got.
The truth is the trainer's own log (``--log-interval 1``, unbuffered): the last
iteration it printed before the kill.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import TINY_MODEL, subprocess_env
from report_checks import assert_accounted

from megatron.trace.cli.main import main

# the save the resumed run loads: every 100 (iterations of about 0.17 s, metric exports
# every 10 s: the first export past it shows under 170, the kill comes before the second)
SAVED = 100


def _gauge(metrics: Path) -> int:
    """The newest ``megatron.training.iteration`` value in ``metrics`` (0: none yet)."""
    if not metrics.exists():
        return 0
    values = re.findall(
        r'"megatron\.training\.iteration".*?"asInt":\s*"?(\d+)', metrics.read_text()
    )
    return int(values[-1]) if values else 0


@pytest.mark.slow
def test_a_killed_default_groups_run_is_bounded_by_its_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = (
        "-m", "megatron.training", *TINY_MODEL, "--log-interval", "1",
        "--otel-enabled", "--otel-span-groups", "default",
        "--save", "ck", "--save-interval", str(SAVED),
    )  # fmt: skip
    env = subprocess_env({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    metrics = tmp_path / "ck" / "telemetry" / "metrics.jsonl"
    log = tmp_path / "killed.log"
    with log.open("w") as out:
        trainer = subprocess.Popen(
            [sys.executable, *args, "--train-iters", "1000"], cwd=tmp_path, stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "MEGATRON_TEST_ITERATION_SLEEP": "0.15"},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        # past the save in an export, then a few seconds more: between two exports
        while (seen := _gauge(metrics)) <= SAVED + 2:
            assert trainer.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no metric export past the save"
            time.sleep(0.2)
        time.sleep(3)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    printed = [int(n) for n in re.findall(r" iteration\s+(\d+)/", log.read_text())]
    assert printed and printed[-1] < 2 * SAVED, "the kill came after the second save"
    resumed = subprocess.run(
        [sys.executable, *args, "--train-iters", str(printed[-1] + 3), "--load", "ck"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    trace = tmp_path / "ck" / "telemetry" / "traces.jsonl"
    assert main(["report", "--json", str(trace)]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("\n{") + 1 :] if not out.startswith("{") else out)
    assert_accounted(report)
    assert [inc["ended"] for inc in report["incarnations"]] == ["killed", "shutdown"]
    bound = report["bounds"]["wasted_iterations"]
    # the truth: the iterations it finished past the save it was resumed from (the log
    # prints each as it completes; one more may have completed before its line)
    truth = printed[-1] - SAVED
    assert seen - SAVED <= bound["lower"] <= truth + 1, (seen, bound, printed[-1])
    assert bound["source"].startswith("the last metric export")
    assert report["bounds"]["badput_s.wasted_progress"]["upper"] > 0
