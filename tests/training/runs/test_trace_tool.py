"""``megatron-trace`` on real runs: a clean run, and a SIGKILL mid-interval then a resume."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from megatron.trace.otlp.reader import read_spans
from megatron.trace_format.semconv import BADPUT_CATEGORIES

pytestmark = pytest.mark.slow

TRACE = "ckpt/telemetry/traces.jsonl"


def _trace_tool(cli, *args: str) -> subprocess.CompletedProcess[str]:
    return cli.run(*args, module=("-m", "megatron.trace"))


def _report(cli) -> dict:
    result = _trace_tool(cli, "report", TRACE, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    exact = report["accounting_ns"]
    assert exact["goodput"] + sum(exact[c] for c in BADPUT_CATEGORIES) == exact["wall"]
    return report


def _iterations_by_process(cli) -> list[set[int]]:
    """Finished iteration numbers per writing process, in file order of the processes."""
    found: dict[int, set[int]] = {}
    for span in read_spans(cli.cwd / TRACE):
        if span["name"] == "megatron.train.iteration":
            numbers = found.setdefault(span["resource"]["process.pid"], set())
            numbers.add(span["attributes"]["megatron.iteration"])
    return list(found.values())


def test_clean_run_checks_and_wastes_nothing(training_cli):
    cli = training_cli
    run = cli.run(
        *cli.TINY, *cli.TELEMETRY_ON,
        "--train-iters", "12", "--save", "ckpt", "--save-interval", "4", "--eval-interval", "6",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "  goodput: " in run.stdout  # the end-of-run summary's goodput line

    check = _trace_tool(cli, "check", TRACE)
    assert check.returncode == 0, check.stdout + check.stderr
    (line,) = check.stdout.splitlines()  # nothing killed, nothing torn
    assert line.startswith("ok: ") and line.endswith(" 1 incarnation on 1 rank, 0 violations")

    report = _report(cli)
    assert report["wasted_iterations"] == 0
    assert report["badput_s"]["wasted_progress"] == 0
    assert report["badput_s"]["restart_gap"] == 0
    assert report["badput_s"]["checkpoint_save"] > 0 and report["badput_s"]["evaluation"] > 0
    assert 0 < report["goodput_fraction"] < 1
    (inc,) = report["incarnations"]
    assert (inc["ended"], inc["first_iteration"], inc["last_iteration"]) == ("shutdown", 0, 11)
    assert inc["intervals"] == 3
    assert report["iterations"]["count"] == 12


def test_killed_mid_interval_then_resumed(training_cli):
    cli = training_cli
    # Eight iterations (1.6 s) between the wait's iteration 12 and the next save at 20: the
    # kill lands inside the second interval even when polling on a loaded machine is slow
    # (with saves every 5 it could land just after the save at 15, redoing nothing).
    # (killed once iteration 12, a few iterations into the second interval, is on disk)
    args = (*cli.TINY, *cli.TELEMETRY_ON, "--save", "ckpt", "--save-interval", "10")
    resumed = cli.killed_then_resumed(args, cli.cwd / TRACE, load="ckpt", resume_iters=30)
    assert resumed.returncode == 0, resumed.stderr

    check = _trace_tool(cli, "check", TRACE)
    assert check.returncode == 0, check.stdout + check.stderr
    killed = [line for line in check.stdout.splitlines() if line.startswith("killed:")]
    assert (
        killed == [killed[0].split(";")[0] + ";" + killed[0].split(";")[1]]
        and "rank 0 incarnation 0: its in-flight interval is missing" in killed[0]
    )

    first, second = _iterations_by_process(cli)
    redone = first & second
    report = _report(cli)
    resumed_from = report["incarnations"][1]["resumed_from"]
    assert resumed_from == 10  # the last save before the kill
    assert redone and min(second) == min(redone) == resumed_from
    assert report["wasted_iterations"] == len(redone)
    assert report["badput_s"]["wasted_progress"] > 0
    assert report["badput_s"]["restart_gap"] > 0
    assert [i["ended"] for i in report["incarnations"]] == ["killed", "shutdown"]


def _finished_iterations(cli) -> list[int]:
    """Iteration numbers whose span ended without ERROR (read independently of the model)."""
    return sorted(
        s["attributes"]["megatron.iteration"]
        for s in read_spans(cli.cwd / TRACE)
        if s["name"] == "megatron.train.iteration" and s["status_code"] != "ERROR"
    )


def test_crashed_run_reads_failed_and_wastes_what_it_did_not_save(training_cli):
    cli = training_cli
    run = cli.run(
        *cli.TINY, *cli.TELEMETRY_ON,
        "--train-iters", "20", "--save", "ckpt", "--save-interval", "5",
        env={"MEGATRON_TEST_FAULT_AT_ITERATION": "13"},
    )  # fmt: skip
    assert run.returncode == 1 and "injected fault at iteration 13" in run.stderr

    assert _finished_iterations(cli) == list(range(13))
    report = _report(cli)
    (inc,) = report["incarnations"]
    assert (inc["ended"], inc["error_type"]) == ("failed", "RuntimeError")
    assert report["wasted_iterations"] == inc["wasted_iterations"] == 3  # 10, 11, 12
    assert report["badput_s"]["wasted_progress"] > 0
    assert report["iterations"]["count"] == 13  # the failing 13th did not finish
    text = _trace_tool(cli, "report", TRACE).stdout
    assert "  0: failed (RuntimeError) iterations 0..13  " in text
    check = _trace_tool(cli, "check", TRACE)
    assert check.returncode == 0, check.stdout


def test_interrupted_run_reads_interrupted_and_wastes_what_it_did_not_save(training_cli):
    cli = training_cli
    args = (*cli.TINY, *cli.TELEMETRY_ON, "--save", "ckpt", "--save-interval", "5")
    trainer = cli.start(*args, "--train-iters", "100", env={"MEGATRON_TEST_ITERATION_SLEEP": "0.1"})
    trainer.wait_until(lambda: "iteration        8/" in trainer.stdout)
    trainer.signal(signal.SIGINT)
    assert trainer.wait() == -signal.SIGINT
    assert trainer.stderr.count("interrupted (SIGINT)") == 1

    finished = _finished_iterations(cli)
    saved = max(
        s["attributes"]["megatron.iteration"]
        for s in read_spans(cli.cwd / TRACE)
        if s["name"] == "megatron.checkpoint.save" and s["status_code"] != "ERROR"
    )
    assert saved >= 5 and max(finished) >= saved  # interrupted after a save, past it
    report = _report(cli)
    (inc,) = report["incarnations"]
    assert (inc["ended"], inc["error_type"]) == ("interrupted", "KeyboardInterrupt")
    assert report["wasted_iterations"] == len([i for i in finished if i >= saved])
    assert report["iterations"]["count"] == len(finished)
