"""``megatron-trace diff``: a run against itself is all zeros, against a slowed run the
right sign and size; the two ways to name a side; ``--fail-if-slower``; the JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import tracegen as g
from report_checks import typed_and_schema_keys

from megatron.trace.analysis import diff as types
from megatron.trace.analysis.diff import schema
from megatron.trace.cli.main import main
from megatron.trace_format.semconv import BADPUT_CATEGORIES


def _diff(capsys, *argv: str, status: int = 0) -> tuple[dict, str]:
    assert main(["diff", *argv, "--json"]) == status
    captured = capsys.readouterr()
    *text, last = captured.out.splitlines()
    result = json.loads(last)
    jsonschema.validate(result, schema())
    return result, "\n".join(text)


def _figures(node: object) -> list[dict]:
    """Every ``{"a", "b", "delta", ...}`` in the diff."""
    if isinstance(node, dict):
        if "delta" in node and "a" in node:
            return [node, *_figures(node["a"]), *_figures(node["b"]), *_figures(node["delta"])]
        return [f for value in node.values() for f in _figures(value)]
    return []


def test_a_run_against_itself_shows_zero_deltas(tmp_path: Path, capsys) -> None:
    path = g.write(
        tmp_path / "t.jsonl", g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6)
    )
    result, text = _diff(capsys, str(path), str(path))
    figures = _figures(result)
    assert len(figures) == 18  # wall, progress, 11 categories, 2 iteration, 2 phases, 1
    for fig in figures:
        delta = fig["delta"]
        if isinstance(delta, dict):  # a category: each of its figures
            assert all(v in (0, None) for v in delta.values()), fig
            assert [v is None for v in delta.values()] == [v is None for v in fig["a"].values()]
        else:
            assert delta == (None if fig["a"] is None else 0), fig
            assert fig["a"] == fig["b"]
    assert result["a"]["files"] == result["b"]["files"] == [str(path)]
    assert result["wall_s"]["a"] > 0 and result["badput"]["wasted_progress"]["a"]["s"] > 0
    assert result["startup_phases"]  # imports, model_init
    assert "wall clock" in text and "+0.000 s" in text
    # the gate at 0 %: not slower, so it passes
    assert main(["diff", str(path), str(path), "--fail-if-slower", "0"]) == 0


def test_a_slowed_run_shows_the_right_sign_and_size(tmp_path: Path, capsys) -> None:
    """Everything after the startup 1.5 x slower: iterations take 1.5 s instead of 1 s."""
    normal = g.lifecycle(0)
    a = g.write(tmp_path / "a.jsonl", normal)
    b = g.write(tmp_path / "b.jsonl", g.slowed(normal, 1.5, since=2))
    result, text = _diff(capsys, str(a), str(b))
    assert result["iterations"]["median_ms"] == {
        "a": 1000.0,
        "b": 1500.0,
        "delta": 500.0,
        "delta_pct": 50.0,
    }
    assert result["iterations"]["p90_ms"]["delta"] == 500.0
    # 2 s startup, then 6.75 s of intervals, 1.5 x: 8.75 -> 12.125 s
    assert result["wall_s"] == {"a": 8.75, "b": 12.125, "delta": 3.375, "delta_pct": 38.571}
    goodput = result["goodput"]
    assert (goodput["a"]["s"], goodput["b"]["s"], goodput["delta"]["s"]) == (6.0, 9.0, 3.0)
    assert goodput["delta"]["per_iteration_s"] == 0.5  # 1 s -> 1.5 s of goodput per iteration
    save = result["badput"]["checkpoint_save"]
    assert (save["a"]["s"], save["b"]["s"], save["delta"]["s"]) == (0.75, 1.125, 0.375)
    startup = result["badput"]["startup"]
    assert startup["delta"]["s"] == 0.0 and startup["delta"]["pct"] < 0  # a smaller share
    assert result["progress_iterations"]["delta"] == 0
    assert "+500.0 ms  +50.0 %" in text


@pytest.mark.parametrize(("bound", "status"), [("0", 1), ("49.9", 1), ("50", 0), ("80", 0)])
def test_fail_if_slower_exits_1_exactly_over_the_bound(
    tmp_path: Path, capsys, bound: str, status: int
) -> None:
    normal = g.lifecycle(0)
    a = g.write(tmp_path / "a.jsonl", normal)
    b = g.write(tmp_path / "b.jsonl", g.slowed(normal, 1.5, since=2))
    assert main(["diff", str(a), str(b), "--fail-if-slower", bound]) == status
    captured = capsys.readouterr()
    assert captured.out.startswith("A: ")
    if status:
        assert captured.err == (
            "megatron-trace diff: median iteration time 1500 ms (B) is 50.0 % above "
            f"1000 ms (A), over --fail-if-slower {float(bound):g} %\n"
        )
    else:
        assert captured.err == ""
    # faster is never slower
    assert main(["diff", str(b), str(a), "--fail-if-slower", "0"]) == 0


def test_the_gate_on_runs_without_iteration_spans_is_not_a_pass(tmp_path: Path, capsys) -> None:
    a = g.write(tmp_path / "a.jsonl", g.lifecycle(0, iterations=False))
    assert main(["diff", str(a), str(a)]) == 0
    capsys.readouterr()
    assert main(["diff", str(a), str(a), "--fail-if-slower", "5"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "megatron-trace diff: error: --fail-if-slower cannot judge: the median iteration time "
        "of A and B is not computed (no megatron.train.iteration spans: enable the per_step "
        "span groups)\n"
    )


def test_runs_of_different_lengths_compare_per_iteration(tmp_path: Path, capsys) -> None:
    a = g.write(tmp_path / "a.jsonl", g.lifecycle(0, intervals=2))
    b = g.write(tmp_path / "b.jsonl", g.lifecycle(0, intervals=8))
    result, text = _diff(capsys, str(a), str(b))
    assert result["progress_iterations"] == {"a": 4, "b": 16, "delta": 12, "delta_pct": 300.0}
    assert f"A: {a}  (rank 0, 1 incarnation, 4 iterations, " in text  # one, in the singular
    for share in (result["goodput"], result["badput"]["checkpoint_save"]):
        assert share["delta"]["per_iteration_s"] == 0  # the same rate
        assert share["delta"]["s"] > 0  # a longer run
    # the fixed startup weighs less per hour of a longer run
    assert result["badput"]["startup"]["delta"]["per_hour_s"] < 0


def test_sets_of_rank_files_and_the_stragglers(tmp_path: Path, capsys) -> None:
    steady = g.lifecycle(0, intervals=4, per=3)
    a0 = g.write(tmp_path / "a0.jsonl", g.with_waits(steady, 0.0), rank=0)
    a1 = g.write(tmp_path / "a1.jsonl", g.with_waits(steady, 0.0), rank=1)
    b0 = g.write(tmp_path / "b0.jsonl", g.with_waits(steady, 0.5), rank=0)
    b1 = g.write(tmp_path / "b1.jsonl", g.with_waits(steady, 0.0), rank=1)
    result, text = _diff(capsys, "--a", str(a0), "--a", str(a1), "--b", str(b0), "--b", str(b1))
    assert result["a"]["files"] == [str(a0), str(a1)]
    assert result["b"]["files"] == [str(b0), str(b1)]
    assert result["stragglers"]["a"] == []
    assert result["stragglers"]["b"] == [1]
    assert result["stragglers"]["straggler_s"]["delta"] > 0
    assert "stragglers: A none; B rank 1" in text
    # the forms mix: A one file, B a set
    mixed, _ = _diff(capsys, str(a0), "--b", str(b0), "--b", str(b1))
    assert mixed["a"]["files"] == [str(a0)] and mixed["b"]["files"] == [str(b0), str(b1)]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["one"], "got too few files"),
        (["one", "two", "three"], "got more: three"),
        (["--a", "x", "one", "two"], "got more: two"),
        ([], "got too few files"),
    ],
)
def test_naming_the_runs_wrongly_is_one_line(tmp_path: Path, capsys, argv, says) -> None:
    assert main(["diff", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1
    assert captured.err.startswith("megatron-trace diff: error: diff compares two runs: A B")
    assert says in captured.err


def test_a_side_with_no_spans_names_its_files(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    a = g.write(tmp_path / "a.jsonl", g.lifecycle(0))
    assert main(["diff", str(a), str(empty)]) == 2
    assert capsys.readouterr().err == f"megatron-trace diff: error: no spans in {empty}\n"


@pytest.mark.parametrize(
    ("typed", "path"),
    [
        (types.Diff, ()),
        (types.SideEntry, ("$defs", "side")),
        (types.Figure, ("$defs", "figure")),
        (types.Amount, ("$defs", "amount")),
        (types.Share, ("$defs", "share")),
        (types.IterationFigures, ("properties", "iterations")),
        (types.StragglerFigures, ("properties", "stragglers")),
    ],
)
def test_the_schema_names_the_typed_fields(typed: type, path: tuple[str, ...]) -> None:
    jsonschema.Draft202012Validator.check_schema(schema())
    node = schema()
    for key in path:
        node = node[key]
    typed_keys, schema_keys = typed_and_schema_keys(typed, node)
    assert schema_keys == typed_keys


def test_the_schema_s_categories_are_the_vocabulary_s() -> None:
    assert schema()["properties"]["badput"]["required"] == sorted(BADPUT_CATEGORIES)


def test_every_figure_stands_in_its_column_whatever_a_name_s_length() -> None:
    from megatron.trace.render.text.diff import format_diff

    def figure(value: float) -> dict:
        return {"a": value, "b": value, "delta": 0.0, "delta_pct": 0.0}

    def share(value: float) -> dict:
        amount = {"s": value, "pct": 1.0, "per_iteration_s": 0.1}
        return {"a": amount, "b": amount, "delta": {"s": 0.0, "pct": 0.0, "per_iteration_s": 0.0}}

    side = {"files": ["a"], "rank": "0", "incarnations": 1, "iterations": 10, "spans": 5,
            "running": False}  # fmt: skip
    diff = {
        "a": side, "b": side, "wall_s": figure(100.0), "progress_iterations": figure(10),
        "goodput": share(50.0), "badput": {c: share(1.0) for c in BADPUT_CATEGORIES},
        "iterations": {"median_ms": figure(5.0), "p90_ms": figure(6.0)},
        "startup_phases": {"megatron.startup.initialize_megatron": figure(2.0),
                           "megatron.startup.imports": figure(1.0)},
        "stragglers": {"a": [], "b": [], "straggler_s": figure(0.0)}, "bounded": [],
        "not_computed": [],
    }  # fmt: skip
    lines = format_diff(diff).splitlines()
    figures = [line for line in lines if line.rstrip().endswith(("s  +0.0 %", "ms  +0.0 %"))]
    assert any("initialize_megatron" in line for line in figures)
    # the A column's unit: at the same place on every line of one figure
    ends = {line.index(" s ") if " s " in line else line.index(" ms ") for line in figures}
    assert len(ends) == 1, "\n".join(figures)
    shares = [line for line in lines if line.endswith("+0.000   +0.0   +0.000")]
    assert len(shares) == 1 + len(BADPUT_CATEGORIES)
    assert len({len(line) for line in shares}) == 1, "\n".join(shares)
    # the names' column holds the longest name and a space
    assert lines[2].startswith(" " * len("  initialize_megatron "))


def test_a_run_a_sigkill_cut_says_its_figures_are_its_report_s_bookings(
    tmp_path: Path, capsys
) -> None:
    """A killed-and-resumed run against a clean one: only the killed side's report has
    bounds, and the diff says so (naming them) instead of passing its bookings as exact."""
    killed = g.write(
        tmp_path / "a.jsonl", g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6)
    )
    clean = g.write(tmp_path / "b.jsonl", g.lifecycle(0, intervals=6))
    result, text = _diff(capsys, str(killed), str(clean))
    assert main(["report", str(killed), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["bounds"]
    (line,) = result["bounded"]
    assert line.startswith(f"A: {', '.join(sorted(report['bounds']))} can only be bounded")
    assert f"bounded: {line}" in text.splitlines()
    result, _ = _diff(capsys, str(clean), str(clean))
    assert result["bounded"] == []
