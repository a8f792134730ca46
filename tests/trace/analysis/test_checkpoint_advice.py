"""``report``'s checkpoint-interval advice: Young's and Daly's optimum from the report's own
figures, redone here by hand; ``--mtbf``; what it cannot compute, and why."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import tracegen as g
from report_checks import assert_accounted

from megatron.trace.analysis.checkpoint_advice import (
    availability,
    availability_optimum,
    daly,
    exponential_badput_per_day,
    young,
)
from megatron.trace.cli.main import main


def _report(tmp_path: Path, capsys, *incarnations: list[dict], argv: tuple[str, ...] = ()) -> dict:
    path = g.write(tmp_path / "t.jsonl", *incarnations)
    assert main(["report", str(path), *argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert_accounted(report)
    return report


def _killed_three_times() -> list[list[dict]]:
    """Saves every 2 iterations (one each interval); killed one iteration into the 31st
    interval three times (71 s into the incarnation), each restart resuming from the last
    save a second later: restarts of 3 s, small against the ~71 s between failures."""
    return [
        g.lifecycle(72 * k, first=60 * k, load=60 * k if k else None, intervals=30,
                    kill_after=1 if k < 3 else None)
        for k in range(4)
    ]  # fmt: skip


def test_killed_three_times_the_optimum_is_the_formula_s_from_the_report_s_figures(
    tmp_path: Path, capsys
) -> None:
    report = _report(tmp_path, capsys, *_killed_three_times())
    advice = report["checkpoint_advice"]
    incarnations = report["incarnations"]
    assert advice["failures"] == 3 and advice["mtbf_source"] == "observed"
    assert advice["saves"] == 120 and advice["save_s"] == 0.25  # every save takes 0.25 s
    run_s = sum(inc["duration_s"] for inc in incarnations)
    assert advice["run_s"] == pytest.approx(run_s)
    assert advice["mtbf_s"] == round(run_s / 3, 6)
    restarts = [
        after["start_s"] - (before["start_s"] + before["duration_s"]) + after["startup_s"]
        for before, after in itertools.pairwise(incarnations)
    ]
    assert advice["restart_s"] == round(sum(restarts) / 3, 6)
    assert advice["iteration_ms"] == report["iterations"]["median_ms"] == 1000.0
    assert advice["save_every"] == 2
    c, m, r = advice["save_s"], advice["mtbf_s"], advice["restart_s"]
    tau_young = math.sqrt(2 * c * m)
    ratio = c / (2 * m)
    tau_daly = math.sqrt(2 * c * m) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - c
    for name, tau in (("young", tau_young), ("daly", tau_daly), ("now", 2.0)):
        choice = advice[name]
        assert choice["interval_s"] == round(tau, 3), name
        assert choice["iterations"] == max(1, round(tau / 1.0)), name
        per_day = 86400 * (c / tau + (tau / 2 + r) / m)
        assert choice["badput_per_day_s"] == round(per_day, 3), name
    # Young's interval is the one that loses the least, by its own model
    assert advice["young"]["badput_per_day_s"] <= advice["now"]["badput_per_day_s"]
    assert advice["badput_model"] == "young"
    assert advice["not_computed"] == []


def test_a_run_started_while_the_old_one_still_wrote_costs_its_startup_not_less(
    tmp_path: Path, capsys
) -> None:
    """Ranks of a killed run that outlived its launcher write on while the next run starts
    (seen with torchrun's workers in a process group of their own): the restart had no
    gap, not a negative one, and the time run counts each moment once."""
    killed = g.lifecycle(0, intervals=30, kill_after=1)  # ends at 70.0 s
    overlapping = g.lifecycle(60, first=60, load=60, intervals=30, kill_after=1)
    last = g.lifecycle(140, first=120, load=120, intervals=30)
    report = _report(tmp_path, capsys, killed, overlapping, last)
    advice = report["checkpoint_advice"]
    first, second, third = report["incarnations"]
    assert second["start_s"] < first["start_s"] + first["duration_s"]  # they overlap
    assert advice["restart_s"] == round(
        (second["startup_s"] + (third["start_s"] - second["start_s"] - second["duration_s"])
         + third["startup_s"]) / 2, 6,
    )  # fmt: skip
    # the first two as one stretch (from the first's start to the second's end), the third
    ran = second["start_s"] + second["duration_s"] - first["start_s"] + third["duration_s"]
    assert advice["run_s"] == pytest.approx(ran)
    assert advice["failures"] == 2 and advice["mtbf_s"] == round(advice["run_s"] / 2, 6)
    for name in ("now", "young", "daly", "availability"):
        if advice[name] is not None:
            assert advice[name]["badput_per_day_s"] >= 0, name


def test_the_text_says_one_save_and_one_failure_in_the_singular(tmp_path: Path, capsys) -> None:
    # one save, in the first incarnation's one interval; the second saves nothing
    killed = g.lifecycle(0, intervals=1, kill_after=1)
    resumed = g.lifecycle(20, first=2, load=2, save=False)
    path = g.write(tmp_path / "t.jsonl", killed, resumed)
    assert main(["report", str(path)]) == 0
    (line,) = [
        x for x in capsys.readouterr().out.splitlines() if x.startswith("checkpoint interval:")
    ]
    assert " s (1 save), ≥ 1 failure in " in line, line  # a restart between: at least


def test_the_text_says_the_figures_and_each_interval(tmp_path: Path, capsys) -> None:
    path = g.write(tmp_path / "t.jsonl", *_killed_three_times())
    assert main(["report", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("checkpoint interval:"))
    # restarts between the incarnations may hide more failures: the figures the files show
    # are bounds (at least 3 failures, the mean time between them at most what they say)
    assert "save 0.250 s (120 saves), ≥ 3 failures in" in lines[head]
    assert "mean time between failures ≤ " in lines[head] and "(observed)" in lines[head]
    assert [line.split()[0] for line in lines[head + 1 : head + 5]] == [
        "now",
        "young",
        "daly",
        "availability",
    ]
    assert lines[head + 5] == "  badput a day by Young's first-order model"
    assert "every 2 iterations (2.000 s of training): badput" in lines[head + 1]


def test_too_few_failures_is_not_computed_unless_mtbf_is_given(tmp_path: Path, capsys) -> None:
    report = _report(
        tmp_path, capsys, g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6)
    )
    advice = report["checkpoint_advice"]
    assert (advice["failures"], advice["mtbf_s"], advice["mtbf_source"]) == (1, None, None)
    assert advice["young"] is None and advice["daly"] is None
    assert advice["now"]["iterations"] == 2 and advice["now"]["badput_per_day_s"] is None
    (reason,) = advice["not_computed"]
    assert "1 failure (kills, crashes, hangs)" in reason and "--mtbf DURATION" in reason
    (tmp_path / "given").mkdir()
    given = _report(
        tmp_path / "given", capsys, g.lifecycle(0, kill_after=1), argv=("--mtbf", "1h")
    )["checkpoint_advice"]
    assert (given["mtbf_s"], given["mtbf_source"]) == (3600.0, "option")
    assert given["young"]["interval_s"] == round(young(0.25, 3600), 3)
    assert given["daly"]["interval_s"] == round(daly(0.25, 3600), 3)
    assert given["young"]["iterations"] == round(young(0.25, 3600))


def test_without_saves_the_save_cost_is_not_measured(tmp_path: Path, capsys) -> None:
    report = _report(tmp_path, capsys, g.lifecycle(0, save=False), argv=("--mtbf", "2h"))
    advice = report["checkpoint_advice"]
    assert (advice["save_s"], advice["saves"]) == (None, 0)
    assert advice["now"] is advice["young"] is advice["daly"] is None
    reasons = advice["not_computed"]
    assert any("no megatron.checkpoint.save spans" in r for r in reasons)
    assert any("the interval now: fewer than two saves" in r for r in reasons)


def test_daly_is_young_less_the_save_to_first_order_and_mtbf_past_2c() -> None:
    assert daly(1, 1e6) == pytest.approx(young(1, 1e6) - 1, rel=1e-3)
    assert daly(10, 4) == 4  # a save longer than twice the MTBF: save every MTBF


def _restarts_longer_than_the_runs() -> list[list[dict]]:
    """Killed three times ~10 s in, each restart ~12 s: the restart is about the mean
    time between failures (issue 40's case: restart 25 s, MTBF 23 s)."""
    return [
        g.lifecycle(0, kill_after=1),
        g.lifecycle(20, first=6, load=6, kill_after=1),
        g.lifecycle(40, first=12, load=12, kill_after=1),
        g.lifecycle(60, first=18, load=18),
    ]


def test_no_young_or_daly_when_the_restart_is_not_small_against_the_mtbf(
    tmp_path: Path, capsys
) -> None:
    """Young's and Daly's models assume a restart is short against the time between failures:
    past a tenth of it they are not given, and the reason names the restart with its figures;
    the availability optimum, which holds at any restart cost, is; no choice's badput a day
    is over a day."""
    report = _report(tmp_path, capsys, *_restarts_longer_than_the_runs())
    advice = report["checkpoint_advice"]
    c, m, r = advice["save_s"], advice["mtbf_s"], advice["restart_s"]
    assert m / 10 < r  # the case the models do not cover
    assert advice["young"] is None and advice["daly"] is None
    (reason,) = advice["not_computed"]
    assert reason.startswith("young, daly: the restart (")
    assert f"{r:.3f} s" in reason and f"({m:.3f} s)" in reason and "save cost" not in reason
    assert advice["badput_model"] == "exponential"
    best = advice["availability"]
    assert best["interval_s"] == round(availability_optimum(c, m), 3)
    for choice in (advice["now"], best):
        assert 0 < choice["badput_per_day_s"] < 86400
    tau = advice["now"]["interval_s"]
    expected = 86400 * (1 - tau / (m * math.exp(r / m) * math.expm1((tau + c) / m)))
    assert advice["now"]["badput_per_day_s"] == pytest.approx(expected, abs=1e-3)
    assert best["badput_per_day_s"] <= advice["now"]["badput_per_day_s"]
    path = g.write(tmp_path / "text.jsonl", *_restarts_longer_than_the_runs())
    assert main(["report", str(path)]) == 0
    text = capsys.readouterr().out
    assert "  young        ?" in text and "  daly         ?" in text
    assert "the exact model of random failures (Young's does not hold here)" in text
    for line in text.splitlines():
        if " s a day" in line and "?" not in line:
            assert float(line.split("badput ")[1].split(" s a day")[0]) < 86400, line


def test_a_save_cost_not_small_against_the_mtbf_is_named_too(tmp_path: Path, capsys) -> None:
    report = _report(tmp_path, capsys, g.lifecycle(0, kill_after=1), argv=("--mtbf", "2s"))
    advice = report["checkpoint_advice"]
    assert advice["young"] is None and advice["daly"] is None
    (reason,) = advice["not_computed"]
    assert "the save cost (0.250 s) and the restart (2.000 s) are not small" in reason
    assert "(2.000 s)" in reason


def test_the_availability_optimum_is_the_best_interval_and_young_s_to_first_order() -> None:
    for c, m, r in ((30.0, 86400.0, 600.0), (0.25, 12.0, 25.0), (5.0, 23.0, 25.0), (1, 1e7, 0)):
        tau = availability_optimum(c, m)
        best = availability(tau, c, m, r)
        for factor in (0.5, 0.9, 0.99, 1.01, 1.1, 2.0):
            assert availability(tau * factor, c, m, r) < best
        assert 0 < exponential_badput_per_day(tau, c, m, r) < 86400
    # costs of thousands of MTBFs (a short observed MTBF): no overflow, and at most the day
    for c, m, r in ((2000.0, 0.5, 30.0), (0.1, 0.5, 5000.0)):
        tau = availability_optimum(c, m)
        assert 0 < tau <= m
        assert exponential_badput_per_day(tau, c, m, r) == pytest.approx(86400)
        assert exponential_badput_per_day(tau, c, m, r) <= 86400
    assert availability_optimum(1, 1e7) == pytest.approx(young(1, 1e7), rel=1e-3)
    assert availability_optimum(30, 86400) == pytest.approx(daly(30, 86400), rel=1e-3)


def test_the_interval_now_is_the_step_the_job_saved_at_not_the_short_one_at_the_end() -> None:
    """Saves every 50 and, as Megatron-LM does, once more where training ends (120): the
    interval the job used is 50, not the 20 the median of two steps would take."""
    from types import SimpleNamespace

    from megatron.trace.analysis.checkpoint_advice import save_step
    from megatron.trace_format.semconv import ITERATION

    def saved_at(*iterations: int) -> SimpleNamespace:
        return SimpleNamespace(saves=[{"attributes": {ITERATION: i}} for i in iterations])

    assert save_step([saved_at(50, 100, 120)]) == 50
    # a resumed job: the killed run saved at 50, the resumed one at 100 and at its end
    assert save_step([saved_at(50), saved_at(50, 100, 120)]) == 50
    assert save_step([saved_at(10, 20, 25, 35, 45)]) == 10
    assert save_step([saved_at(50)]) is None
