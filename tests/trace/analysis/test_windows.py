"""``report --window DURATION``: the accounting per window of the wall clock.

The windows tile the wall clock from its start and their accounting adds up
to the whole's exactly, in integer nanoseconds, whatever the cut; a run that
slowed down in its second half shows it in the later windows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tracegen as g
from report_checks import assert_accounted

from megatron.trace.analysis.accounting import MAX_WINDOWS
from megatron.trace.analysis.goodput import build_report
from megatron.trace.cli.main import main
from megatron.trace.model.builder import load_trace
from megatron.trace.render.json.report import report_json
from megatron.trace_format.semconv import BADPUT_CATEGORIES

NS = 1_000_000_000

RUNS = {
    "clean": lambda: [g.lifecycle(0)],
    "killed and resumed": lambda: [g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6)],
    "cut short": lambda: [g.lifecycle(0, cut_short_after=1)],
    "failed": lambda: [g.lifecycle(0, fail_after=1)],
    "no iteration spans": lambda: [g.lifecycle(0, iterations=False)],
}


def _windowed(tmp_path: Path, incarnations: list[list[dict]], window_s: float) -> dict:
    path = g.write(tmp_path / "t.jsonl", *incarnations)
    report = report_json(build_report(load_trace([path]), window_ns=round(window_s * NS)))
    assert_accounted(report)
    return report


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("window_s", [0.3, 1, 2.5, 7, 1000])
def test_the_windows_tile_the_wall_clock_and_add_up_to_the_whole(
    tmp_path: Path, run: str, window_s: float
) -> None:
    report = _windowed(tmp_path, RUNS[run](), window_s)
    windows = report["windows"]
    assert windows["window_s"] == window_s
    entries = windows["entries"]
    whole = report["accounting_ns"]
    for key in whole:
        assert sum(entry["accounting_ns"][key] for entry in entries) == whole[key], key
    for position, entry in enumerate(entries):
        exact = entry["accounting_ns"]
        assert exact["goodput"] + sum(exact[c] for c in BADPUT_CATEGORIES) == exact["wall"]
        assert entry["index"] == position
        assert entry["start_s"] == (entries[position - 1]["end_s"] if position else 0.0)
        last = position == len(entries) - 1
        assert exact["wall"] == (
            whole["wall"] - round(window_s * NS) * position if last else round(window_s * NS)
        )
        top = entry["top_badput"]
        assert [exact[c] for c in top] == sorted((exact[c] for c in top), reverse=True)
        assert all(exact[c] > 0 for c in top) and len(top) <= 3
    assert entries[-1]["end_s"] == report["wall_s"]
    assert len(entries) == max(1, -(-round(report["wall_s"] * NS) // round(window_s * NS)))
    # the iterations that ended in each window are every finished iteration, once
    if report["iterations"] is None:
        assert all(entry["iterations"] is None for entry in entries)
    else:
        assert sum(entry["iterations"] for entry in entries) == report["iterations"]["count"]


def test_a_category_is_cut_where_the_window_ends(tmp_path: Path) -> None:
    """2 s of startup, then iterations of 1 s and saves of 0.25 s, in 1.5 s windows."""
    entries = _windowed(tmp_path, [g.lifecycle(0)], 1.5)["windows"]["entries"]
    first, second, third = entries[:3]
    assert first["badput_s"]["startup"] == 1.5 and first["goodput_s"] == 0.0
    assert first["top_badput"] == ["startup"] and first["iterations"] == 0
    assert first["iteration_mean_ms"] is None
    assert (second["badput_s"]["startup"], second["goodput_s"]) == (0.5, 1.0)
    assert second["iterations"] == 1 and second["iteration_mean_ms"] == 1000.0
    assert second["goodput_fraction"] == round(1 / 1.5, 6)
    # 3.0 .. 4.5: the second iteration, its save at 4.0 .. 4.25, the third iteration begun
    assert (third["goodput_s"], third["badput_s"]["checkpoint_save"]) == (1.25, 0.25)


def test_a_run_slowed_in_its_second_half_shows_it_in_the_later_windows(tmp_path: Path) -> None:
    """Iterations of 1 s, then of 2 s from 9.5 s on (the middle of its intervals)."""
    slowed = g.slowed(g.lifecycle(0, intervals=6), 2, since=9.5)
    report = _windowed(tmp_path, [slowed], 5)
    entries = report["windows"]["entries"]
    means = [entry["iteration_mean_ms"] for entry in entries]
    counts = [entry["iterations"] for entry in entries]
    assert means == [1000.0, 1050.0, 2000.0, 2000.0, 2000.0]
    assert counts == [2, 5, 2, 2, 1]  # fewer iterations a window once it slowed
    # the slower iterations are still goodput: the time shares do not hide the drop
    assert entries[1]["goodput_fraction"] == entries[2]["goodput_fraction"] == 0.9


def test_the_command_line_prints_the_windows_in_text_and_json(tmp_path: Path, capsys) -> None:
    path = g.write(tmp_path / "t.jsonl", g.slowed(g.lifecycle(0, intervals=6), 2, since=9.5))
    assert main(["report", str(path), "--window", "5s", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    report = json.loads(out[-1])
    assert_accounted(report)
    assert len(report["windows"]["entries"]) == 5
    text = "\n".join(out[:-1])
    assert "per window of 5s from the wall clock's start" in text
    assert "+10s" in text and "2 it, mean   2000.0 ms" in text
    assert "startup 40.0 %, checkpoint_save 5.0 %" in text
    # without --window: no windows, in text or JSON
    assert main(["report", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    assert "windows" not in json.loads(out.splitlines()[-1]) and "per window" not in out


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("1.5h", 5400), ("2d", 172800), ("500ms", 0.5)],
)
def test_durations(tmp_path: Path, capsys, text: str, seconds: float) -> None:
    path = g.write(tmp_path / "t.jsonl", g.lifecycle(0))
    assert main(["report", str(path), "--window", text, "--json"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["windows"]["window_s"] == seconds


@pytest.mark.parametrize("bad", ["1", "h", "-1h", "0s", "1 week", "1hour"])
def test_a_window_that_is_no_duration_is_a_bad_option(tmp_path: Path, capsys, bad: str) -> None:
    path = g.write(tmp_path / "t.jsonl", g.lifecycle(0))
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(path), f"--window={bad}"])
    assert exit_info.value.code == 2
    assert "expected a duration such as 90s" in capsys.readouterr().err


def test_too_many_windows_is_one_line(tmp_path: Path, capsys) -> None:
    path = g.write(tmp_path / "t.jsonl", g.lifecycle(0))  # 8.75 s
    assert main(["report", str(path), "--window", "1ms"]) == 0  # 8750 windows
    capsys.readouterr()
    assert MAX_WINDOWS < 8.75 / 1e-5  # 10 us windows
    assert main(["report", str(path), "--window", "0.01ms"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("megatron-trace report: error: --window 1e-05 s cuts")
    assert "choose a longer window" in captured.err


@pytest.mark.parametrize(
    ("seconds", "label"),
    [(0, "0s"), (0.25, "250ms"), (30, "30s"), (59.5, "59.5s"), (70, "1m10s"), (120, "2m"),
     (5400, "1h30m"), (90061, "1d1h1m1s")],
)  # fmt: skip
def test_window_labels_are_whole_units_never_a_fraction_of_a_minute(
    seconds: float, label: str
) -> None:
    from megatron.trace.render.text.report import duration_label

    assert duration_label(seconds) == label


@pytest.mark.parametrize("resumed_from", [6, 8], ids=["its_last_save", "a_save_the_kill_lost"])
@pytest.mark.parametrize("window_s", [0.3, 1, 2.5, 7, 1000])
def test_a_window_holding_what_a_kill_left_unattributed_is_bounded_as_the_whole(
    tmp_path: Path, window_s: float, resumed_from: int
) -> None:
    """Killed and resumed: the windows over the time between the killed run's last
    exported span and the restart say their restart_gap is a bound, and their goodput
    too where the lost seconds may have made progress that survived (resumed from a save
    the kill lost, not from the last one the file shows), each bound holding the booked
    figure; the windows before and after it are exact; the last window of a job whose
    last run was killed has no upper bound."""
    runs = [g.lifecycle(0, kill_after=1), g.lifecycle(20, first=resumed_from, load=resumed_from)]
    report = _windowed(tmp_path, runs, window_s)
    bounds, entries = report["bounds"], report["windows"]["entries"]
    incs = report["incarnations"]
    gap_start = incs[0]["start_s"] + incs[0]["duration_s"]
    gap_end = incs[1]["start_s"]
    assert gap_end > gap_start
    kept = resumed_from > 6  # the killed run's last save the file shows: 6
    assert ("goodput_s" in bounds) is kept
    for entry in entries:
        at = f"windows.entries.{entry['index']}."
        holds_gap = entry["start_s"] < gap_end and entry["end_s"] > gap_start
        assert (at + "badput_s.restart_gap" in bounds) is holds_gap, entry
        # where the lost seconds may have made progress, so may the killed run's training
        # booked as goodput since its last save the file shows (of 6, ending 8.75 s in: a
        # startup of 2 s, three intervals of 2.25 s) have been redone: its windows too
        booked_until = gap_start - incs[0]["wasted_s"]  # where its wasted window begins
        redone = entry["end_s"] > 8.75 and entry["start_s"] < booked_until
        assert (at + "goodput_s" in bounds) is (kept and (holds_gap or redone)), entry
        if not holds_gap:
            continue
        gap = bounds[at + "badput_s.restart_gap"]
        assert gap["lower"] < gap["upper"] == entry["badput_s"]["restart_gap"]
        assert "SIGKILLed" in gap["reason"]
        if kept:
            good = bounds[at + "goodput_s"]
            assert good["lower"] <= entry["goodput_s"] < good["upper"] <= entry["wall_s"]
    (tmp_path / "clean").mkdir()
    clean = _windowed(tmp_path / "clean", RUNS["clean"](), window_s)
    assert not [path for path in clean["bounds"] if path.startswith("windows.")]
    (tmp_path / "open").mkdir()
    still_dead = _windowed(tmp_path / "open", [g.lifecycle(0, kill_after=1)], window_s)
    last = f"windows.entries.{still_dead['windows']['entries'][-1]['index']}."
    assert still_dead["bounds"][last + "goodput_s"]["upper"] is None
    assert still_dead["bounds"][last + "goodput_fraction"] == {
        "lower": None, "upper": None, "reason": still_dead["bounds"][last + "goodput_s"]["reason"]
    }  # fmt: skip


def test_the_text_prints_a_bounded_window_as_a_range_in_its_columns(tmp_path: Path, capsys):
    # resumed from a save the kill lost: the lost seconds' goodput is a range
    runs = [g.lifecycle(0, kill_after=1), g.lifecycle(20, first=8, load=8)]
    path = g.write(tmp_path / "t.jsonl", *runs)
    assert main(["report", str(path), "--window", "2s"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("  ") and "goodput" in line and "+" in line]
    assert any("–" in row.split("goodput")[1].split("%")[0] for row in rows), rows
    # every row's "s of" stands in one column, ranges or not
    assert len({row.index(" s of ") for row in rows}) == 1, rows
