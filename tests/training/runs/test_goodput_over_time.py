"""Issue 33 on real runs: ``diff`` of a run against itself and against a slowed run,
``--fail-if-slower`` at its exact bound, ``report --window`` showing where a run slowed,
and the checkpoint-interval advice of a job killed three times.

The runs are the real trainer's (``python -m megatron.training``), slowed with
``MEGATRON_TEST_ITERATION_SLEEP``. A run "slowed in its second half" is a run
of 20 iterations that saves at 10 and 20, resumed to 40 with the sleep on:
the second incarnation's iterations are the slow ones.
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
from processes import finished_iteration

from megatron.trace.analysis.checkpoint_advice import availability_optimum
from megatron.trace.cli.main import main as trace_main

pytestmark = pytest.mark.slow

SLEEP_S = 0.06
ENV = {"OMP_NUM_THREADS": "1"}


def _train(cli, where: str, iterations: int, sleep_s: float = 0.0, *extra: str) -> Path:
    env = dict(ENV, MEGATRON_TEST_ITERATION_SLEEP=str(sleep_s)) if sleep_s else ENV
    result = cli.run(
        *cli.TINY,
        *cli.TELEMETRY_ON,
        "--train-iters",
        str(iterations),
        "--save-interval",
        "10",
        "--save",
        where,
        *extra,
        env=env,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return cli.cwd / where / "telemetry" / "traces.jsonl"


def _json(capsys, *argv: str, status: int = 0) -> dict:
    capsys.readouterr()
    assert trace_main([*argv, "--json"]) == status
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def test_diff_of_real_runs_against_themselves_and_a_slowed_one(training_cli, capsys) -> None:
    cli = training_cli
    normal = _train(cli, "normal", 20)
    slowed = _train(cli, "slowed", 20, SLEEP_S)

    same = _json(capsys, "diff", str(normal), str(normal))
    assert same["wall_s"]["delta"] == 0 and same["iterations"]["median_ms"]["delta"] == 0
    for share in (same["goodput"], *same["badput"].values()):
        assert all(value in (0, None) for value in share["delta"].values())
    assert all(fig["delta"] == 0 for fig in same["startup_phases"].values())

    result = _json(capsys, "diff", str(normal), str(slowed))
    median = result["iterations"]["median_ms"]
    # B sleeps SLEEP_S before each forward step: its median is about that much longer
    assert 0.7 * 1000 * SLEEP_S < median["delta"] < 2 * 1000 * SLEEP_S + median["a"]
    # (the wall clocks differ by the sleeps and by two startups' noise: not compared)
    # B's sleeps are goodput: a floor no load can lower (A's iterations, stretched by a
    # loaded machine, can take most of the difference: 0.039 s of 0.06 once in CI)
    goodput = result["goodput"]
    assert goodput["b"]["per_iteration_s"] >= 0.9 * SLEEP_S
    assert goodput["delta"]["per_iteration_s"] == pytest.approx(
        goodput["b"]["per_iteration_s"] - goodput["a"]["per_iteration_s"], abs=1e-8
    )
    assert result["progress_iterations"] == {"a": 20, "b": 20, "delta": 0, "delta_pct": 0.0}

    # the gate, either side of the diff's own figure (exactly: B * 100 > A * (100 + PCT))
    slower = 100 * (median["b"] - median["a"]) / median["a"]
    for bound in (slower - 0.01, slower, slower + 0.01):
        text = f"{bound:.6f}"
        crossed = median["b"] * 100 > median["a"] * (100 + float(text))
        assert trace_main(["diff", str(normal), str(slowed), "--fail-if-slower", text]) == crossed
        err = capsys.readouterr().err
        assert (f"over --fail-if-slower {float(text):g} %" in err) == crossed
    assert trace_main(["diff", str(slowed), str(normal), "--fail-if-slower", "0"]) == 0

    # the goodput gate on a real report, either side of its figure
    report = _json(capsys, "report", str(normal))
    percent = 100 * report["accounting_ns"]["goodput"] / report["accounting_ns"]["wall"]
    assert trace_main(["report", str(normal), "--fail-under-goodput", f"{percent + 0.01}"]) == 1
    assert "is under --fail-under-goodput" in capsys.readouterr().err
    assert trace_main(["report", str(normal), "--fail-under-goodput", f"{percent - 0.01}"]) == 0


def test_a_run_slowed_in_its_second_half_shows_it_in_the_later_windows(
    training_cli, capsys
) -> None:
    cli = training_cli
    trace = _train(cli, "ckpt", 20)
    _train(cli, "ckpt", 40, 3 * SLEEP_S, "--load", "ckpt")
    whole = _json(capsys, "report", str(trace))
    assert [inc["ended"] for inc in whole["incarnations"]] == ["shutdown", "shutdown"]
    # windows shorter than the second startup: none holds iterations of both incarnations
    window_ms = max(1, int(whole["incarnations"][1]["startup_s"] * 1000 / 2))
    report = _json(capsys, "report", str(trace), "--window", f"{window_ms}ms")
    entries = report["windows"]["entries"]
    exact = report["accounting_ns"]
    for key in exact:
        assert sum(entry["accounting_ns"][key] for entry in entries) == exact[key]
    assert sum(entry["iterations"] for entry in entries) == report["iterations"]["count"]
    # where the second incarnation trained, iterations are slower than where the first did
    second_start = whole["incarnations"][1]["start_s"]
    first_half = [
        e["iteration_mean_ms"] for e in entries if e["iterations"] and e["start_s"] < second_start
    ]
    second_half = [
        e["iteration_mean_ms"] for e in entries if e["iterations"] and e["start_s"] >= second_start
    ]
    assert first_half and second_half
    assert min(second_half) > 0.7 * 3000 * SLEEP_S  # each iteration sleeps 3 x SLEEP_S
    assert max(first_half) < min(second_half)


def test_a_job_killed_three_times_gets_the_formula_s_optimum(training_cli, capsys) -> None:
    """Saves every 10 iterations; SIGKILLed three times once an iteration past 12, 22, 32
    is on disk (the per_step spans reach the file as their interval ends, so each kill
    lands just after a save), each time resumed from the last save; the last run
    finishes at 60."""
    cli = training_cli
    args = (*cli.TINY, *cli.TELEMETRY_ON, "--save", "ckpt", "--save-interval", "10")
    trace = cli.cwd / "ckpt" / "telemetry" / "traces.jsonl"
    slow = dict(ENV, MEGATRON_TEST_ITERATION_SLEEP="0.05")
    for kill_after in (12, 22, 32):
        load = ("--load", "ckpt") if kill_after > 12 else ()
        trainer = cli.start(*args, *load, "--train-iters", "100", env=slow)
        trainer.wait_until(lambda n=kill_after: finished_iteration(trace, n), timeout=120)
        trainer.kill()
        assert trainer.process.returncode == -signal.SIGKILL
    last = cli.run(*args, "--load", "ckpt", "--train-iters", "60", env=ENV, timeout=240)
    assert last.returncode == 0, last.stderr[-3000:]

    report = _json(capsys, "report", str(trace))
    ended = [inc["ended"] for inc in report["incarnations"]]
    assert ended == ["killed", "killed", "killed", "shutdown"]
    advice = report["checkpoint_advice"]
    assert (advice["failures"], advice["mtbf_source"], advice["save_every"]) == (3, "observed", 10)
    run_s = sum(inc["duration_s"] for inc in report["incarnations"])
    assert advice["mtbf_s"] == round(run_s / 3, 6)
    c, m, r = advice["save_s"], advice["mtbf_s"], advice["restart_s"]
    assert 0 < c < m
    # a restart (a new Python process importing torch) is not small against runs of
    # seconds: Young's and Daly's models do not hold, and the advice says so
    assert r > m / 10
    assert advice["young"] is advice["daly"] is None
    (reason,) = advice["not_computed"]
    assert reason.startswith("young, daly: ") and f"the restart ({r:.3f} s)" in reason
    assert advice["availability"]["interval_s"] == round(availability_optimum(c, m), 3)
    assert advice["badput_model"] == "exponential"
    assert 0 < advice["now"]["badput_per_day_s"] < 86400
    # with a mean time between failures of a day, the formula by hand from the same figures
    advice = _json(capsys, "report", str(trace), "--mtbf", "1d")["checkpoint_advice"]
    assert advice["not_computed"] == [] and advice["badput_model"] == "young"
    c, m, r = advice["save_s"], 86400.0, advice["restart_s"]
    iteration_s = report["iterations"]["median_ms"] / 1000
    tau = math.sqrt(2 * c * m)
    assert advice["young"]["interval_s"] == round(tau, 3)
    assert advice["young"]["iterations"] == max(1, round(tau / iteration_s))
    assert advice["young"]["badput_per_day_s"] == round(86400 * (c / tau + (tau / 2 + r) / m), 3)
    ratio = c / (2 * m)
    assert advice["daly"]["interval_s"] == round(
        tau * (1 + math.sqrt(ratio) / 3 + ratio / 9) - c, 3
    )
    assert advice["now"]["iterations"] == 10
    assert advice["now"]["interval_s"] == round(10 * iteration_s, 3)
