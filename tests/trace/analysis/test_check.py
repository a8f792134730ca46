"""``megatron-trace check``: every rule detected, every killed/cut-short/torn case tolerated."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import tracegen as g

from megatron.trace.cli.main import main

Spans = list[dict]


def run_check(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, list[str]]:
    status = main(["check", *map(str, paths)])
    out = capsys.readouterr()
    return status, (out.out + out.err).splitlines()


def named(spans: Spans, name: str) -> list[dict]:
    return [s for s in spans if s["name"] == name]


def test_clean_file_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = g.write(tmp_path / "t.jsonl", g.lifecycle(0))
    status, lines = run_check(capsys, path)
    assert status == 0
    assert lines == ["ok: 14 spans, 1 incarnation on 1 rank, 0 violations"]


def _break_index(spans: Spans) -> None:
    g.attr(named(spans, "megatron.train")[1], "megatron.interval.index", 2)


def _break_range(spans: Spans) -> None:
    g.attr(named(spans, "megatron.train")[2], "megatron.interval.first_iteration", 5)


def _break_first_link(spans: Spans) -> None:
    named(spans, "megatron.train")[0]["links"] = []


def _break_chain_link(spans: Spans) -> None:
    first, _, third = named(spans, "megatron.train")
    third["links"] = [{"traceId": first["traceId"], "spanId": first["spanId"]}]


def _duplicate_id(spans: Spans) -> None:
    first, second = named(spans, "megatron.train.iteration")[:2]
    second["spanId"] = first["spanId"]


def _drop_parent(spans: Spans) -> None:
    spans.remove(named(spans, "megatron.startup")[0])


def _end_before_start(spans: Spans) -> None:
    save = named(spans, "megatron.checkpoint.save")[0]
    save["endTimeUnixNano"] = str(int(save["startTimeUnixNano"]) - 1)


def _cut_short_in_the_middle(spans: Spans) -> None:
    g.attr(named(spans, "megatron.train.iteration")[0], "megatron.span.cut_short", True)


def _no_startup(spans: Spans) -> None:
    startup = named(spans, "megatron.startup")[0]
    for span in spans:
        if span["parentSpanId"] == startup["spanId"]:
            span["parentSpanId"] = ""
    spans.remove(startup)


@pytest.mark.parametrize(
    ("breaker", "rule", "span_name"),
    [
        (_break_index, "interval-index", "megatron.train"),
        (_break_range, "iteration-range", "megatron.train"),
        (_break_first_link, "interval-link", "megatron.train"),
        (_break_chain_link, "interval-link", "megatron.train"),
        (_duplicate_id, "duplicate-span-id", "megatron.train.iteration"),
        (_drop_parent, "missing-parent", "megatron.startup.imports"),
        (_end_before_start, "end-before-start", "megatron.checkpoint.save"),
        (_cut_short_in_the_middle, "cut-short", "megatron.train.iteration"),
        (_no_startup, "startup", "megatron.train"),
    ],
)
def test_each_violation_is_one_line_naming_span_trace_incarnation(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    breaker: Callable[[Spans], None],
    rule: str,
    span_name: str,
) -> None:
    spans = g.lifecycle(0)
    breaker(spans)
    path = g.write(tmp_path / "t.jsonl", spans)
    status, lines = run_check(capsys, path)
    assert status == 1
    violations = [line for line in lines if line.startswith(f"{rule}:")]
    assert len(violations) == 1, lines
    assert f"span {span_name} " in violations[0]
    assert " trace " in violations[0] and "in rank 0 incarnation 0" in violations[0]
    assert lines[-1].startswith("FAILED:")


def test_resume_from_an_iteration_no_save_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = g.write(
        tmp_path / "t.jsonl", g.lifecycle(0, kill_after=1), g.lifecycle(20, first=5, load=5)
    )
    status, lines = run_check(capsys, path)
    assert status == 1
    (violation,) = [line for line in lines if line.startswith("resume:")]
    assert "starts at iteration 5" in violation and "rank 0 incarnation 1" in violation
    assert "span megatron.checkpoint.load" in violation


def test_killed_then_resumed_is_reported_not_a_violation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = g.write(
        tmp_path / "t.jsonl", g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6)
    )
    status, lines = run_check(capsys, path)
    assert status == 0
    assert lines[0] == (
        "killed: rank 0 incarnation 0: its in-flight interval is missing (SIGKILL); "
        "2 finished spans have no parent in the file (an export that failed, e.g. on a full "
        "disk, looks the same)"
    )
    assert lines[-1] == "ok: 32 spans, 2 incarnations on 1 rank, 0 violations"


def test_killed_right_after_a_reroot_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing of the in-flight interval reached the file: the last interval's
    ``megatron.interval.rerooted`` says another one followed, so it was lost."""
    spans = [s for s in g.lifecycle(0, kill_after=0) if s["name"] != "megatron.train.get_batch"]
    path = g.write(tmp_path / "t.jsonl", spans)
    status, lines = run_check(capsys, path)
    assert status == 0
    assert lines[0].startswith("killed: rank 0 incarnation 0: its in-flight interval is missing")


def test_killed_without_an_interval_names_the_iteration_in_flight(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Megatron-LM without checkpointing opens no interval: each iteration is a root. A kill
    in iteration 3 loses that iteration, whose finished child has no parent in the file: a
    fact about the kill, and no rule is broken by the missing interval."""
    spans = [g.span("megatron.startup", 0, 2, is_goodput_span=True)]
    for number in range(3):
        spans.append(g.span("megatron.train.iteration", 2 + number, 3 + number,
                            **{"megatron.iteration": number, "is_goodput_span": True}))  # fmt: skip
    doomed = g.span("megatron.train.iteration", 5, 6, **{"megatron.iteration": 3})
    spans.append(g.span("megatron.train.get_batch", 5, 5.5, parent=doomed))
    status, lines = run_check(capsys, g.write(tmp_path / "t.jsonl", spans))
    assert status == 0, lines
    assert lines[0].startswith(
        "killed: rank 0 incarnation 0: its in-flight iteration is missing (SIGKILL); 1 finished"
    )
    assert lines[-1] == "ok: 5 spans, 1 incarnation on 1 rank, 0 violations"


def test_killed_during_startup_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spans = g.lifecycle(0, intervals=0)
    spans.remove(named(spans, "megatron.startup")[0])
    path = g.write(tmp_path / "t.jsonl", spans)
    status, lines = run_check(capsys, path)
    assert status == 0
    assert lines[0].startswith("killed: rank 0 incarnation 0: its startup is missing")


def test_missing_parent_before_the_kill_is_still_a_violation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spans = g.lifecycle(0, kill_after=1)
    spans.remove(named(spans, "megatron.train")[0])  # a finished interval lost: not the kill
    path = g.write(tmp_path / "t.jsonl", spans)
    status, lines = run_check(capsys, path)
    assert status == 1
    assert any(line.startswith("killed:") for line in lines)
    missing = [line for line in lines if line.startswith("missing-parent:")]
    assert len(missing) == 3  # C0's two iterations and its save


def test_cut_short_at_the_end_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = g.write(tmp_path / "t.jsonl", g.lifecycle(0, cut_short_after=1))
    status, lines = run_check(capsys, path)
    assert status == 0, lines


def test_torn_write_is_reported_with_its_line_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.jsonl"
    first = g.lifecycle(0, kill_after=1)
    torn = g.line(first[-2:], pid=99)[:-40]
    path.write_text(
        "\n".join(g.line(first[i : i + 3], pid=99) for i in range(0, len(first) - 2, 3))
        + "\n"
        + torn
        + "\n"
    )
    torn_line = len(path.read_text().splitlines())
    g.write(path, g.lifecycle(20, first=6, load=6))
    status, lines = run_check(capsys, path)
    assert status == 0, lines
    assert (
        f"torn write: {path}:{torn_line} (a write cut short: a killed process, or a failed "
        "write such as on a full disk), skipped"
    ) in lines


def test_with_the_job_group_off_check_says_what_it_cannot_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No startup, no interval, nothing killed: a note, not a startup violation."""
    spans = [s for s in g.lifecycle(0) if s["name"] not in ("megatron.startup", "megatron.train")]
    for span in spans:
        span["parentSpanId"] = ""  # their parents were never recorded
    path = g.write(tmp_path / "t.jsonl", spans)
    status, lines = run_check(capsys, path)
    assert status == 0, lines
    assert lines[0] == (
        "not checked: rank 0 incarnation 0 has no megatron.startup or megatron.train span "
        "(the job span group was off), so the startup, interval and resume rules do not apply"
    )
    assert lines[-1].startswith("ok: ")


@pytest.mark.parametrize("content", ["", "\n\n", '{"resourceSpans": []}\n', '{"resourceSp'])
def test_a_file_without_spans_is_not_a_whole_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    """As for report: exit 2 and one line, never 'ok: 0 spans'."""
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    assert main(["check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"megatron-trace check: error: no spans in {path}\n"
    assert "ok:" not in captured.out


def test_damage_exits_2_naming_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = g.write(tmp_path / "t.jsonl", g.lifecycle(0))
    with path.open("a") as file:
        file.write('{"resourceSpans": [] oops}\n')
    g.write(path, g.lifecycle(20, first=6, load=6))
    status, lines = run_check(capsys, path)
    assert status == 2
    assert len(lines) == 1
    assert lines[0].startswith(f"megatron-trace check: error: {path}: line 6 is damaged")


def test_several_ranks_each_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    zero = g.write(tmp_path / "r0.jsonl", g.lifecycle(0), rank=0)
    spans = g.lifecycle(0)
    _break_index(spans)
    one = g.write(tmp_path / "r1.jsonl", spans, rank=1)
    status, lines = run_check(capsys, zero, one)
    assert status == 1
    (violation,) = [line for line in lines if line.startswith("interval-index:")]
    assert "rank 1 incarnation 0" in violation and str(one) in violation
    assert lines[-1] == "FAILED: 28 spans, 2 incarnations on 2 ranks, 1 violation"
