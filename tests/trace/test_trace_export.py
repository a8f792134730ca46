"""``megatron-trace export --format chrome`` on hand-built trace files.

The Chrome trace-event JSON must be what Perfetto and chrome://tracing read:
metadata names for processes (incarnations) and threads (ranks), one complete
event per span nested by time within its thread, flow start/finish pairs for
the links.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from pictures_helpers import (
    T0,
    S,
    Span,
    incarnation,
    resource,
    run_command,
    write_trace,
)

from megatron.trace import export


def chrome(tmp_path: Path, *traces: Path) -> dict[str, Any]:
    out = tmp_path / "trace.json"
    assert run_command(export, [*map(str, traces), "--format", "chrome", "-o", str(out)]) == 0
    return json.loads(out.read_text())


def complete_events(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [event for event in document["traceEvents"] if event["ph"] == "X"]


def metadata(document: dict[str, Any], name: str) -> dict[tuple[int, int], str]:
    return {
        (event["pid"], event["tid"]): event["args"]["name"]
        for event in document["traceEvents"]
        if event["ph"] == "M" and event["name"] == name
    }


def assert_nested_by_time(events: list[dict[str, Any]]) -> None:
    """Within each thread, any two complete events are disjoint or one contains the other."""
    by_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        by_thread[(event["pid"], event["tid"])].append(event)
    for thread, thread_events in by_thread.items():
        stack: list[float] = []  # end times of the open events
        for event in sorted(thread_events, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= event["ts"] + 1e-3:
                stack.pop()
            end = event["ts"] + event["dur"]
            assert not stack or end <= stack[-1] + 1e-3, f"{event['name']} overlaps in {thread}"
            stack.append(end)


def two_incarnations(tmp_path: Path) -> tuple[Path, list[Span], list[Span]]:
    first = incarnation(0, 0, 2, queue=5)
    second = incarnation(30, 8, 1)
    path = write_trace(
        tmp_path / "traces.jsonl",
        [(resource("job", 0, 100), first), (resource("job", 0, 200), second)],
    )
    return path, first, second


def test_a_process_per_incarnation_and_a_complete_event_per_span(tmp_path: Path) -> None:
    path, first, second = two_incarnations(tmp_path)
    document = chrome(tmp_path, path)
    assert metadata(document, "process_name") == {(1, 0): "incarnation 0", (2, 0): "incarnation 1"}
    assert metadata(document, "thread_name") == {(1, 0): "rank 0", (2, 0): "rank 0"}
    events = complete_events(document)
    assert len(events) == len(first) + len(second)
    by_id = {event["args"]["span_id"]: event for event in events}
    for pid, spans in ((1, first), (2, second)):
        for span in spans:
            event = by_id[span.span_id]
            assert (event["name"], event["pid"], event["tid"]) == (span.name, pid, 0)
            assert event["ts"] == pytest.approx((T0 + span.start * S) / 1000)
            assert event["dur"] == pytest.approx((span.end - span.start) * 1e6)
            assert event["args"]["trace_id"] == span.trace_id
            for key, value in span.attributes.items():
                assert event["args"][key] == value
            if span.parent is not None:
                assert event["args"]["parent_id"] == span.parent.span_id
    assert_nested_by_time(events)


def test_links_are_flow_pairs_from_the_linked_span_to_the_linking_one(tmp_path: Path) -> None:
    path, first, second = two_incarnations(tmp_path)
    document = chrome(tmp_path, path)
    starts = {e["id"]: e for e in document["traceEvents"] if e["ph"] == "s"}
    finishes = {e["id"]: e for e in document["traceEvents"] if e["ph"] == "f"}
    links = [(span, target) for span in first + second for target in span.links]
    assert len(links) == 3  # C0 -> startup, C1 -> C0; and C0 -> startup in the second
    assert set(starts) == set(finishes) and len(starts) == len(links)
    for flow_id, start in starts.items():
        finish = finishes[flow_id]
        assert finish["bp"] == "e"
        assert (start["name"], start["cat"]) == (finish["name"], finish["cat"])
    # Each arrow runs from 1 µs before the linked span ends to where the linking one starts.
    pid = {span.span_id: 1 for span in first} | {span.span_id: 2 for span in second}

    def at(seconds: float, span: Span) -> tuple[float, int]:
        return (T0 + seconds * S) / 1000, pid[span.span_id]

    arrows = {
        ((s["ts"], s["pid"]), (finishes[i]["ts"], finishes[i]["pid"])) for i, s in starts.items()
    }
    expected = {(at(t.end - 1e-6, t), at(span.start, span)) for span, t in links}
    assert arrows == expected


def test_a_thread_per_rank(tmp_path: Path) -> None:
    processes = [
        (resource("job", rank, 100 + rank), incarnation(0.1 * rank, 0, 1)) for rank in (0, 1)
    ]
    processes += [
        (resource("job", rank, 200 + rank), incarnation(20 + 0.1 * rank, 4, 1)) for rank in (0, 1)
    ]
    # Each rank writes its own file, as with MEGATRON_OTEL_RANK_STRATEGY=all_ranks.
    files = []
    for rank in (0, 1):
        files.append(write_trace(tmp_path / f"rank{rank}.jsonl",
                                 [p for p in processes if p[0]["dl.rank"] == rank]))  # fmt: skip
    document = chrome(tmp_path, *files)
    assert metadata(document, "thread_name") == {
        (1, 0): "rank 0", (1, 1): "rank 1", (2, 0): "rank 0", (2, 1): "rank 1"}  # fmt: skip
    lanes = Counter((e["pid"], e["tid"]) for e in complete_events(document))
    per_process = len(processes[0][1])
    assert lanes == {(1, 0): per_process, (1, 1): per_process,
                     (2, 0): len(processes[2][1]), (2, 1): len(processes[3][1])}  # fmt: skip
    assert_nested_by_time(complete_events(document))


def test_a_link_to_a_span_not_in_the_file_draws_no_arrow(tmp_path: Path) -> None:
    lost = Span("megatron.train", 0, 1)
    kept = Span("megatron.train", 1, 2, links=[lost])
    path = write_trace(tmp_path / "t.jsonl", [(resource("job", 0, 1), [kept])])
    document = chrome(tmp_path, path)
    assert [e["ph"] for e in document["traceEvents"] if e["ph"] in "sf"] == []


def test_a_missing_file_is_one_error_line_and_exit_2(tmp_path: Path, capsys) -> None:
    out = tmp_path / "trace.json"
    out.write_text("keep me")
    assert run_command(export, [str(tmp_path / "nope.jsonl"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.jsonl" in err[0]
    assert out.read_text() == "keep me"


def test_a_damaged_line_leaves_the_previous_output_untouched(tmp_path: Path, capsys) -> None:
    path, _, _ = two_incarnations(tmp_path)
    lines = path.read_text().splitlines()
    lines.insert(2, '{"resourceSpans": 7}')  # damage: whole JSON, but no export request
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "trace.json"
    out.write_text("keep me")
    assert run_command(export, [str(path), "-o", str(out)]) == 2
    assert "line 3" in capsys.readouterr().err
    assert out.read_text() == "keep me"
    assert list(tmp_path.glob(".*.tmp")) == []


def test_a_torn_write_is_skipped_and_the_rest_exported(tmp_path: Path) -> None:
    path, first, second = two_incarnations(tmp_path)
    lines = path.read_text().splitlines()
    lines.insert(3, lines[3][:50])  # a killed process's half line, then the next writes
    path.write_text("\n".join(lines) + "\n")
    document = chrome(tmp_path, path)
    assert len(complete_events(document)) == len(first) + len(second)


def test_a_file_without_spans_is_one_error_line_and_exit_2(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "traces.jsonl"
    empty.write_text("\n")
    out = tmp_path / "trace.json"
    assert run_command(export, [str(empty), "-o", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"megatron-trace export: error: {empty}: no spans in the trace files"
    ]
    assert not out.exists()


def test_an_output_that_cannot_be_written_is_one_error_line_and_exit_2(tmp_path, capsys) -> None:
    trace = write_trace(tmp_path / "t.jsonl", [(resource("job", 0, 1), incarnation(0, 0, 1))])
    out = tmp_path / "trace.json"
    out.mkdir()  # a directory where the file should go
    assert run_command(export, [str(trace), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"megatron-trace export: error: cannot write {out}")
    assert out.is_dir() and list(tmp_path.glob(".*.tmp")) == []
