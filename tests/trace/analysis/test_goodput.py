"""``megatron-trace report``: the accounting on hand-built files with known answers."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
import tracegen as g
from report_checks import assert_accounted, nonzero

from megatron.trace.analysis.goodput import report_files
from megatron.trace.analysis.iteration_stats import ANOMALY_RULE
from megatron.trace.cli.main import main
from megatron.trace.render.json.report import report_json
from megatron.trace_format.semconv import BADPUT_CATEGORIES


def report_of(tmp_path: Path, *incarnations: list[dict]) -> dict:
    report = report_json(report_files([g.write(tmp_path / "t.jsonl", *incarnations)]))
    assert_accounted(report)
    return report


def test_clean_run(tmp_path: Path) -> None:
    report = report_of(tmp_path, g.lifecycle(0))
    assert report["wall_s"] == 8.75
    assert report["goodput_s"] == 6.0
    assert report["goodput_fraction"] == round(6 / 8.75, 6)
    assert nonzero(report) == {"startup": 2.0, "checkpoint_save": 0.75}
    assert report["wasted_iterations"] == 0
    (inc,) = report["incarnations"]
    assert inc | {"start_s": 0} == {
        "rank": 0,
        "index": 0,
        "ended": "shutdown",
        "error_type": None,
        "pid": 100,
        "cycle": None,
        "restart_gap_s": None,
        "first_iteration": 0,
        "last_iteration": 5,
        "resumed_from": None,
        "startup_s": 2.0,
        "intervals": 3,
        "start_s": 0,
        "duration_s": 8.75,
        "wasted_iterations": 0,
        "wasted_s": 0.0,
        "as_of": None,
        "in_flight_s": 0.0,
    }
    assert (report["running"], report["as_of"]) == (False, None)
    assert report["iterations"]["count"] == 6
    assert report["iterations"]["median_ms"] == 1000.0
    # one rank: nothing to compare it with
    assert report["not_computed"] == [
        "stragglers: the files hold one rank (export every rank: "
        "MEGATRON_OTEL_RANK_STRATEGY=all_ranks)"
    ]
    assert (report["stragglers"], report["straggler_s"]) == (None, None)
    assert (report["hangs"], report["recovered_stalls"]) == ([], [])


def test_killed_then_resumed(tmp_path: Path) -> None:
    report = report_of(tmp_path, g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6))
    assert report["wall_s"] == 28.75
    assert report["goodput_s"] == 12.0
    assert nonzero(report) == {
        "startup": 3.5,
        "checkpoint_load": 0.5,
        "checkpoint_save": 1.5,
        "wasted_progress": 1.5,  # iteration 6 and the in-flight half second
        "restart_gap": 9.75,
    }
    assert report["wasted_iterations"] == 1
    assert [i["ended"] for i in report["incarnations"]] == ["killed", "shutdown"]
    assert report["incarnations"][1]["resumed_from"] == 6


def test_final_incarnation_killed_and_never_resumed(tmp_path: Path) -> None:
    report = report_of(tmp_path, g.lifecycle(0, kill_after=1))
    assert report["wasted_iterations"] == 1  # past the last save (iteration 6)
    assert report["badput_s"]["wasted_progress"] == 1.5
    assert report["wall_s"] == 10.25


def test_killed_during_startup_then_started_again(tmp_path: Path) -> None:
    doomed = [s for s in g.lifecycle(0, intervals=0) if s["name"] != "megatron.startup"]
    report = report_of(tmp_path, doomed, g.lifecycle(10))
    assert [i["ended"] for i in report["incarnations"]] == ["killed", "shutdown"]
    assert report["incarnations"][0]["startup_s"] is None
    assert report["wall_s"] == 18.75  # from the killed startup's first phase
    assert nonzero(report) == {
        "startup": 2.5,  # the killed startup's finished phase (0.5 s) is startup too
        "checkpoint_save": 0.75,
        "restart_gap": 9.5,
    }
    assert report["wasted_iterations"] == 0


def test_without_save_a_restart_wastes_everything_before_it(tmp_path: Path) -> None:
    report = report_of(
        tmp_path, g.lifecycle(0, save=False, kill_after=1), g.lifecycle(20, save=False)
    )
    assert report["wasted_iterations"] == 7
    assert nonzero(report) == {"startup": 4.0, "wasted_progress": 7.5, "restart_gap": 10.5}
    assert report["goodput_s"] == 6.0


def test_without_save_a_clean_end_is_all_goodput(tmp_path: Path) -> None:
    report = report_of(tmp_path, g.lifecycle(0, save=False))
    assert (report["goodput_s"], report["wasted_iterations"]) == (6.0, 0)


def test_cut_short_final_incarnation(tmp_path: Path) -> None:
    report = report_of(tmp_path, g.lifecycle(0, cut_short_after=1))
    assert report["incarnations"][0]["ended"] == "cut_short"
    assert report["wasted_iterations"] == 1  # iteration 6; the cut-short 7th never finished
    assert report["badput_s"]["wasted_progress"] == 1.5
    assert report["iterations"]["count"] == 7


@pytest.mark.parametrize(
    ("reason", "error_type", "ended"),
    [("exception", "RuntimeError", "failed"), ("interrupt", "KeyboardInterrupt", "interrupted")],
)
def test_failed_or_interrupted_final_incarnation_wastes_what_it_did_not_save(
    tmp_path: Path, reason: str, error_type: str, ended: str
) -> None:
    """How the lifecycle's shutdown said it ended is read back, and waste counts as for a kill."""
    report = report_of(tmp_path, g.lifecycle(0, fail_after=2, reason=reason, error_type=error_type))
    (inc,) = report["incarnations"]
    assert (inc["ended"], inc["error_type"]) == (ended, error_type)
    # iterations 6 and 7 finished after the last save (6); the 8th raised: not finished
    assert report["wasted_iterations"] == inc["wasted_iterations"] == 2
    assert report["badput_s"]["wasted_progress"] == 2.5
    assert report["iterations"]["count"] == 8


def test_failed_then_resumed(tmp_path: Path) -> None:
    report = report_of(tmp_path, g.lifecycle(0, fail_after=1), g.lifecycle(20, first=6, load=6))
    assert [(i["ended"], i["error_type"]) for i in report["incarnations"]] == [
        ("failed", "RuntimeError"),
        ("shutdown", None),
    ]
    assert report["wasted_iterations"] == 1


def test_text_report_names_how_each_incarnation_ended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = g.write(
        tmp_path / "t.jsonl",
        g.lifecycle(0, fail_after=1),
        g.lifecycle(20, first=6, load=6, fail_after=0, reason="interrupt",
                    error_type="KeyboardInterrupt"),
    )  # fmt: skip
    assert main(["report", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("  0: failed (RuntimeError) iterations 0..7  ") for line in lines)
    assert any(
        line.startswith("  1: interrupted (KeyboardInterrupt) iterations 6..") for line in lines
    ), lines


def test_default_groups_say_what_they_cannot_compute(tmp_path: Path) -> None:
    report = report_of(
        tmp_path,
        g.lifecycle(0, iterations=False, kill_after=1),
        g.lifecycle(20, first=6, load=6, iterations=False),
    )
    assert report["iterations"] is None
    assert report["goodput_s"] == 12.0
    assert report["badput_s"]["wasted_progress"] == 1.5
    assert len(report["not_computed"]) == 2
    assert report["not_computed"][0].startswith("iterations:")
    assert report["not_computed"][1].startswith("stragglers:")
    # the killed incarnation's in-flight interval is missing: its count is a lower bound
    bound = report["bounds"]["wasted_iterations"]
    assert bound["lower"] == report["wasted_iterations"] and bound["upper"] is None
    assert "SIGKILLed" in bound["reason"]


def test_a_resume_without_load_spans_says_checkpoint_load_is_not_computed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default groups have no load_checkpoint: the load's time is in startup, not zero."""
    resumed = [
        s for s in g.lifecycle(20, first=6, load=6) if s["name"] != "megatron.checkpoint.load"
    ]
    path = g.write(tmp_path / "t.jsonl", g.lifecycle(0), resumed)
    report = report_files([path])
    assert_accounted(report)
    assert report["badput_s"]["checkpoint_load"] is None
    assert report["accounting_ns"]["checkpoint_load"] == 0
    (reason,) = [r for r in report["not_computed"] if r.startswith("checkpoint_load:")]
    assert "load_checkpoint" in reason and "startup" in reason
    assert main(["report", str(path)]) == 0
    (line,) = [
        x for x in capsys.readouterr().out.splitlines() if "checkpoint_load" in x.split()[:1]
    ]
    assert line == "  checkpoint_load  not computed (see below)"
    # with the load span (per_step groups) it is a figure again
    (tmp_path / "m").mkdir()
    measured = report_of(tmp_path / "m", g.lifecycle(0), g.lifecycle(20, first=6, load=6))
    assert measured["badput_s"]["checkpoint_load"] == 0.5
    assert not [r for r in measured["not_computed"] if r.startswith("checkpoint_load")]


def test_precedence_where_spans_overlap(tmp_path: Path) -> None:
    spans = g.lifecycle(0, intervals=1, per=4, save=False)
    interval = next(s for s in spans if s["name"] == "megatron.train")
    pre = g.span("pre_startup", -5, -1)
    startup = next(s for s in spans if s["name"] == "megatron.startup")
    launch = g.span("megatron.startup.launch_script", 0, 0.5, parent=startup)
    save = g.span("megatron.checkpoint.save", 3, 4, parent=interval)
    evaluate = g.span("megatron.evaluate", 3.5, 5, parent=interval)
    report = report_of(tmp_path, [pre, launch, save, evaluate, *spans])
    assert report["wall_s"] == 11.0  # -5 .. 6
    assert nonzero(report) == {
        "queue": 4.0,
        "launch": 0.5,
        "startup": 1.5,
        "checkpoint_save": 1.0,
        "evaluation": 1.0,  # 4 .. 5: the save wins 3.5 .. 4
        "other": 1.0,  # -1 .. 0: nothing recorded
    }
    assert report["goodput_s"] == 2.0


def test_ours_without_checkpointing_is_one_interval(tmp_path: Path) -> None:
    """``save_interval`` 0: this project's lifecycle opens exactly one interval for the loop."""
    report = report_of(tmp_path, g.lifecycle(0, intervals=1, per=6, save=False))
    assert (report["wall_s"], report["goodput_s"]) == (8.0, 6.0)
    assert nonzero(report) == {"startup": 2.0}
    assert report["incarnations"][0]["intervals"] == 1
    assert main(["check", str(tmp_path / "t.jsonl")]) == 0


def _without_interval(save_at: int | None = None, killed_in: int | None = None) -> list[dict]:
    """Megatron-LM without checkpointing: startup 0..2, then root iterations of 1 s (no
    interval), a root checkpoint save of 0.25 s before iteration ``save_at``, and a SIGKILL
    half a second into iteration ``killed_in`` (its finished child is written, it is not)."""
    spans = [g.span("megatron.startup", 0, 2, is_goodput_span=True)]
    now = 2.0
    for number in range(killed_in if killed_in is not None else 4):
        if number == save_at:
            spans.append(g.span("megatron.checkpoint.save", now, now + 0.25,
                                **{"megatron.iteration": number}))  # fmt: skip
            now += 0.25
        spans.append(g.span("megatron.train.iteration", now, now + 1,
                            **{"megatron.iteration": number, "is_goodput_span": True}))  # fmt: skip
        now += 1
    if killed_in is not None:
        if killed_in == save_at:
            spans.append(g.span("megatron.checkpoint.save", now, now + 0.25,
                                **{"megatron.iteration": killed_in}))  # fmt: skip
            now += 0.25
        doomed = g.span("megatron.train.iteration", now, now + 1)
        spans.append(g.span("megatron.train.get_batch", now, now + 0.5, parent=doomed))
    return spans


def test_iterations_without_an_interval_are_goodput(tmp_path: Path) -> None:
    report = report_of(tmp_path, _without_interval())
    assert (report["wall_s"], report["goodput_s"]) == (6.0, 4.0)
    assert nonzero(report) == {"startup": 2.0}
    assert report["iterations"]["count"] == 4
    assert report["not_computed"] == [
        "stragglers: the files hold one rank (export every rank: "
        "MEGATRON_OTEL_RANK_STRATEGY=all_ranks)"
    ]


def test_without_an_interval_a_kill_wastes_what_the_last_save_did_not_keep(
    tmp_path: Path,
) -> None:
    """Saved at 3, killed in iteration 3: iterations 0..2 survive, only the pass in flight
    (from where iteration 2 ended, the save winning its own time) is wasted."""
    report = report_of(tmp_path, _without_interval(save_at=3, killed_in=3))
    assert [i["ended"] for i in report["incarnations"]] == ["killed"]
    assert report["wasted_iterations"] == 0
    assert report["goodput_s"] == 3.0
    assert nonzero(report) == {"startup": 2.0, "checkpoint_save": 0.25, "wasted_progress": 0.5}
    # never saved: all three iterations, from the first one's start, are lost
    (tmp_path / "never").mkdir()
    lost = report_of(tmp_path / "never", _without_interval(killed_in=3))
    assert lost["wasted_iterations"] == 3
    assert (lost["goodput_s"], lost["badput_s"]["wasted_progress"]) == (0.0, 3.5)


def _jittered(planted: set[int]) -> list[dict]:
    """200 iterations of 0.9 s with a steady jitter of up to 5 % (a clean run's spread),
    the ``planted`` ones (by position) slowed down 1.5 x."""
    spans = g.lifecycle(0, intervals=10, per=20)
    jitter = random.Random(16)
    iterations = [s for s in spans if s["name"] == "megatron.train.iteration"]
    for position, iteration in enumerate(iterations):
        factor = 1.5 if position in planted else 1 + jitter.uniform(-0.05, 0.05)
        start = int(iteration["startTimeUnixNano"])
        iteration["endTimeUnixNano"] = str(start + round(0.9 * g.SECOND * factor))
    return spans


def test_anomalies_find_a_planted_moderate_slowdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 1.5 x slowdown of 5 % of the iterations: median + 3 MAD finds exactly them
    (3 x median, the rule this replaced, found none of them)."""
    planted = set(random.Random(5).sample(range(200), 10))
    stats = report_of(tmp_path, _jittered(planted))["iterations"]
    anomalous = stats["anomalous"]
    assert anomalous["rule"] == ANOMALY_RULE
    assert anomalous["rule"].startswith("duration > median + 3 x MAD")
    assert anomalous["count"] == len(planted)
    assert sorted(a["iteration"] for a in anomalous["slowest"]) == sorted(planted)
    assert all(a["duration_ms"] == 1350.0 for a in anomalous["slowest"])
    assert stats["median_ms"] * 1.05 < anomalous["threshold_ms"] < 1350.0 < 3 * stats["median_ms"]
    # the rule and the slowest are in the text too
    assert main(["report", str(tmp_path / "t.jsonl")]) == 0
    out = capsys.readouterr().out
    assert f"  anomaly rule: {ANOMALY_RULE}\n" in out
    assert "anomalous: 10 over " in out
    slowest = next(line for line in out.splitlines() if line.startswith("  slowest: "))
    assert slowest.count("(1350.0 ms)") == 5


def test_anomalies_flag_nothing_in_a_clean_run(tmp_path: Path) -> None:
    stats = report_of(tmp_path, _jittered(set()))["iterations"]
    assert stats["anomalous"]["count"] == 0
    assert stats["anomalous"]["slowest"] == []
    assert 1.04 * 900 < stats["max_ms"] <= 1.05 * 900  # the jitter is there, and is not flagged


def test_anomalies_of_identical_durations_use_the_mad_floor(tmp_path: Path) -> None:
    """Every iteration 1 s but one 1 ms longer: a MAD of 0 would flag it; the floor does not."""
    spans = g.lifecycle(0)
    longer = [s for s in spans if s["name"] == "megatron.train.iteration"][2]
    longer["endTimeUnixNano"] = str(int(longer["endTimeUnixNano"]) + 1_000_000)
    slow = [s for s in spans if s["name"] == "megatron.train.iteration"][3]
    slow["endTimeUnixNano"] = str(int(slow["startTimeUnixNano"]) + 1_500_000_000)
    stats = report_of(tmp_path, spans)["iterations"]
    assert stats["anomalous"]["mad_ms"] == 150.0  # 15 % of the 1000 ms median
    assert stats["anomalous"]["threshold_ms"] == 1450.0
    assert stats["anomalous"]["slowest"] == [
        {"incarnation": 0, "iteration": 3, "duration_ms": 1500.0}
    ]
    assert (stats["max_ms"], stats["p90_ms"]) == (1500.0, 1500.0)


def _with_durations(base_ms: float, factors: list[float]) -> list[dict]:
    """A clean run of ``len(factors)`` iterations (a multiple of 20, at most 10 s apart),
    iteration i lasting ``base_ms`` x ``factors[i]``."""
    spans = g.lifecycle(0, intervals=len(factors) // 20, per=20)
    iterations = [s for s in spans if s["name"] == "megatron.train.iteration"]
    for iteration, factor in zip(iterations, factors, strict=True):
        start = int(iteration["startTimeUnixNano"])
        iteration["endTimeUnixNano"] = str(start + round(base_ms * 1e6 * factor))
    return spans


def test_anomalies_flag_nothing_in_a_steady_run_under_load(tmp_path: Path) -> None:
    """60 iterations of 0.9 s with a lognormal jitter of sigma 0.1 (95 % within 20 % of the
    median, as on a busy machine): nothing is anomalous. The 1 % MAD floor flagged three of
    them (and some in most such runs); the 15 % floor flags one in about a hundred runs."""
    jitter = random.Random(3)
    factors = [math.exp(jitter.gauss(0, 0.1)) for _ in range(60)]
    stats = report_of(tmp_path, _with_durations(900, factors))["iterations"]
    assert 1.2 < stats["max_ms"] / stats["median_ms"] < 1.45  # the jitter is there
    assert stats["anomalous"]["count"] == 0
    assert stats["anomalous"]["slowest"] == []
    assert stats["anomalous"]["threshold_ms"] == round(1.45 * stats["median_ms"], 3)


#: Iteration times of a real 60-iteration run (``python -m megatron.training --mock-data
#: --num-layers 2 --hidden-size 32 ... --train-iters 60 --otel-span-groups per_step``) on a
#: 2-core machine shared with other jobs, as multiples of their median (130 ms): they vary
#: ninety-fold, MAD 70 % of the median; the rule flagged 9 of them.
_LOADED_MACHINE = [
    1.3, 3.8, 1.9, 0.6, 0.6, 2.2, 0.4, 1.7, 0.6, 1.4, 0.6, 2.3, 2.7, 0.5, 0.2, 2.9, 1.5, 6.2,
    5.3, 2.4, 0.3, 0.1, 1.4, 0.4, 0.9, 0.7, 0.3, 0.3, 2.3, 0.4, 0.6, 0.2, 1.0, 0.5, 0.5, 0.1,
    1.0, 0.6, 1.5, 2.3, 4.6, 2.3, 0.2, 0.2, 0.1, 1.2, 9.1, 6.2, 1.2, 6.4, 1.7, 0.6, 6.7, 0.1,
    3.4, 0.9, 1.7, 0.4, 1.8, 0.3,
]  # fmt: skip


def test_anomalies_are_not_computed_where_many_iterations_are_slow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Over a tenth of the iterations over the threshold are the run's spread, not
    anomalies: the count is not computed, and the report says why."""
    report = report_of(tmp_path, _with_durations(100, _LOADED_MACHINE))
    anomalous = report["iterations"]["anomalous"]
    assert (anomalous["count"], anomalous["slowest"]) == (None, [])
    (reason,) = [r for r in report["not_computed"] if r.startswith("anomalous iterations:")]
    assert "over 10 % of the iterations" in reason
    assert main(["report", str(tmp_path / "t.jsonl")]) == 0
    assert "  anomalous: ? over " in capsys.readouterr().out


def test_several_ranks(tmp_path: Path) -> None:
    zero = g.write(tmp_path / "r0.jsonl", g.lifecycle(0), rank=0)
    one = g.write(tmp_path / "r1.jsonl", g.lifecycle(0, kill_after=1), rank=1)
    report = report_files([one, zero])
    assert_accounted(report)
    assert report["rank"] == 0
    assert report["wall_s"] == 8.75
    assert [(r["rank"], r["wasted_iterations"]) for r in report["ranks"]] == [(0, 0), (1, 1)]


def test_cli_json_is_the_last_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = g.write(tmp_path / "t.jsonl", g.lifecycle(0))
    assert main(["report", str(path), "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    report = json.loads(lines[-1])
    assert_accounted(report)
    assert lines[0].startswith("wall clock")
    assert main(["report", str(path)]) == 0
    assert not capsys.readouterr().out.splitlines()[-1].startswith("{")


def test_cli_empty_file_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    assert main(["report", str(path)]) == 2
    assert capsys.readouterr().err == f"megatron-trace report: error: no spans in {path}\n"
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_text_report_says_when_an_incarnation_trained_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resumed run with nothing left to train: no iteration range to print, but where it
    resumed (a fresh start says nothing)."""
    path = g.write(
        tmp_path / "t.jsonl", g.lifecycle(0, intervals=2), g.lifecycle(20, intervals=0, load=4)
    )
    assert main(["report", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("  0: shutdown  iterations 0..3  ") for line in lines), lines
    assert any(line.startswith("  1: shutdown  no iterations, resumed from 4  ") for line in lines)


@pytest.mark.parametrize("radix", [False, True])
@pytest.mark.parametrize("count", [1, 2, 7, 1000, 1001])
def test_iteration_statistics_are_those_of_a_sort(
    count: int, radix: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The figures selected over the columns are those a plain sort of every duration
    gives, to the bit, and so are the anomalies (odd and even counts, ties, outliers,
    several incarnations), with the values partitioned in memory and selected digit by
    digit over parts of a few rows (as a week's are)."""
    from megatron.trace._store import columns, selection
    from megatron.trace.analysis.iteration_stats import iteration_stats as _iteration_stats
    from megatron.trace.model.incarnation import Incarnation

    if radix:
        monkeypatch.setattr(selection, "IN_MEMORY", 0)
        monkeypatch.setattr(columns, "SPILL_ROWS", 7)

    rng = random.Random(count)
    incs = [Incarnation("0", index, ("0",)) for index in range(3)]
    clock = 1_796_000_000_000_000_000
    for number in range(count):
        inc = incs[number * len(incs) // count]
        duration = rng.choice([20_000_000, 20_000_001, rng.randrange(19_000_000, 21_000_000)])
        if rng.random() < 0.02:
            duration *= 3  # an outlier
        inc.iterations.append(number, clock, clock + duration)
        clock += duration + rng.randrange(1000)
    incs = [inc for inc in incs if inc.iterations]
    stats = _iteration_stats(incs)
    assert stats is not None and stats["count"] == count
    assert stats == _sorted_reference(incs)


def _sorted_reference(incs: list) -> dict:
    """The iteration figures by the definition: sort every duration (ms), take the middle."""
    from megatron.trace.analysis.iteration_stats import (
        ANOMALY_MAD_FACTOR,
        ANOMALY_MAD_FLOOR,
        ANOMALY_MAX_SHARE,
        ANOMALY_RULE,
    )

    def median(values: list[float]) -> float:
        middle = len(values) // 2
        return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2

    each = [
        ((end - start) / 1e6, inc.index, number)
        for inc in incs
        for number, start, end in zip(
            inc.iterations.numbers, inc.iterations.starts, inc.iterations.ends, strict=True
        )
    ]
    durations = sorted(duration for duration, _, _ in each)
    mid = median(durations)
    mad = max(median(sorted(abs(d - mid) for d in durations)), ANOMALY_MAD_FLOOR * mid)
    threshold = mid + ANOMALY_MAD_FACTOR * mad
    slow = sorted((entry for entry in each if entry[0] > threshold), reverse=True)
    steady = len(slow) <= max(1, ANOMALY_MAX_SHARE * len(durations))
    return {
        "count": len(durations),
        "median_ms": round(mid, 3),
        "p90_ms": round(durations[max(0, math.ceil(0.9 * len(durations)) - 1)], 3),
        "max_ms": round(durations[-1], 3),
        "anomalous": {
            "rule": ANOMALY_RULE,
            "mad_ms": round(mad, 3),
            "threshold_ms": round(threshold, 3),
            "count": len(slow) if steady else None,
            "slowest": [
                {"incarnation": index, "iteration": number, "duration_ms": round(d, 3)}
                for d, index, number in slow[:20]
            ]
            if steady
            else [],
        },
    }


_ACCOUNTING_LINE = re.compile(r"^(?P<name>\S.*?|  \S+)  +(?P<s>\d+\.\d{3}) s +\d+\.\d %")


@pytest.mark.parametrize("factor", [1, 1_000_000, 1_000_000_000])
def test_the_text_s_columns_stay_apart_at_large_figures(tmp_path: Path, capsys, factor) -> None:
    """A week-long job's saves sum to six figures of seconds (issue 40 item 8:
    ``checkpoint_save141880.366 s``): every line of the accounting still reads as a name,
    two spaces at least, its seconds, its share; and the seconds end in one column."""
    path = g.write(tmp_path / "t.jsonl", g.slowed(g.lifecycle(0), factor, since=0))
    assert main(["report", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("badput:")
    block = [*lines[:start], *lines[start + 1 : start + 1 + len(BADPUT_CATEGORIES)]]
    names, ends = [], set()
    for line in block:
        found = _ACCOUNTING_LINE.match(line)
        assert found, line
        names.append(found["name"].strip())
        ends.add(found.end("s"))
    assert names == ["wall clock", "goodput", *BADPUT_CATEGORIES]
    assert len(ends) == 1, block
    assert report_files([path])["badput_s"]["checkpoint_save"] == pytest.approx(0.75 * factor)


def test_text_report_prints_a_bound_as_a_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ranks SIGKILLed at iteration 36 with the SDK's export delays, then resumed: the
    redone iterations read `≥ N` (the most any rank's file shows), the figures the lost
    seconds could belong to a range, and each bound's reason once."""
    import ground_truth as gt

    history = gt.History(
        (gt.Plan(36, "killed", into=0.5, victim=1, gap_s=40), gt.Plan(13)),
        ranks=2,
        export_delay_s=(5.0, 3.0),
    )
    paths = gt.write(gt.simulate(history), tmp_path / "traces.jsonl")
    assert main(["report", "--json", *map(str, paths)]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    wasted = report["bounds"]["wasted_iterations"]
    furthest = max(r["wasted_iterations"] for r in report["ranks"])
    assert wasted["lower"] == furthest == report["wasted_iterations"]
    assert wasted["upper"] is None and "SIGKILLed" in wasted["reason"]
    assert main(["report", *map(str, paths)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"wasted iterations: ≥ {furthest}" in lines
    save = report["bounds"]["badput_s.checkpoint_save"]
    (line,) = [line for line in lines if line.startswith("  checkpoint_save ")]
    assert f"{save['lower']:.3f}–{save['upper']:.3f} s" in line
    # resumed from the save of 30 the files show: nothing the lost seconds did survived
    assert "goodput_s" not in report["bounds"]
    (line,) = [line for line in lines if line.startswith("goodput ")]
    assert f"{report['goodput_s']:.3f} s" in line and "–" not in line
    (first,) = [line for line in lines if line.startswith("  0: killed ")]
    assert f"wasted ≥ {furthest} it / " in first
    bounded = [line for line in lines if line.startswith("bounded: ")]
    assert len(bounded) == len(set(bounded)) and any("SIGKILLed" in b for b in bounded)
