"""``megatron-trace export --format chrome`` on hand-built trace files.

The Chrome trace-event JSON must be what Perfetto and chrome://tracing read:
metadata names for processes (incarnations) and threads (ranks), ids no
importer reinterprets, one complete event per span nested by time within its
thread at its exact nanoseconds, one flow per link bound to the link's two
spans. (tests/browser loads such files into the real Perfetto.)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import chrome_helpers
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

from megatron.trace.render.export import write as export


def chrome(tmp_path: Path, *traces: Path) -> dict[str, Any]:
    out = tmp_path / "trace.json"
    assert run_command(export, [*map(str, traces), "--format", "chrome", "-o", str(out)]) == 0
    return chrome_helpers.load(out)


complete_events = chrome_helpers.complete_events


def assert_nested_by_time(events: list[dict[str, Any]]) -> None:
    """Within each thread, any two complete events are disjoint or one contains the other."""
    by_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        by_thread[(event["pid"], event["tid"])].append(event)
    for thread, thread_events in by_thread.items():
        stack: list[Decimal] = []  # end times of the open events
        for event in sorted(thread_events, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= event["ts"]:
                stack.pop()
            end = event["ts"] + event["dur"]
            assert not stack or end <= stack[-1], f"{event['name']} overlaps in {thread}"
            stack.append(end)


def assert_ids_no_importer_reinterprets(document: dict[str, Any]) -> None:
    """No pid or tid 0, no tid equal to any pid, no tid shared by two processes."""
    threads = chrome_helpers.names(document, "thread_name")
    pids = {pid for pid, _ in chrome_helpers.names(document, "process_name")}
    tids = [tid for _, tid in threads]
    assert 0 not in pids and 0 not in tids
    assert not set(tids) & pids
    assert len(tids) == len(set(tids))
    for event in complete_events(document):
        assert (event["pid"], event["tid"]) in threads


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
    threads = chrome_helpers.assert_rank_0_twice(document)
    assert_ids_no_importer_reinterprets(document)
    tid_of = {pid: tid for pid, tid in threads}
    events = complete_events(document)
    assert len(events) == len(first) + len(second)
    by_id = {event["args"]["span_id"]: event for event in events}
    for pid, spans in ((1, first), (2, second)):
        for span in spans:
            event = by_id[span.span_id]
            assert (event["name"], event["pid"], event["tid"]) == (span.name, pid, tid_of[pid])
            assert chrome_helpers.start_ns(document, event) == T0 + round(span.start * S)
            assert chrome_helpers.end_ns(document, event) == T0 + round(span.end * S)
            assert event["args"]["trace_id"] == span.trace_id
            for key, value in span.attributes.items():
                assert event["args"][key] == value
            if span.parent is not None:
                assert event["args"]["parent_id"] == span.parent.span_id
    assert_nested_by_time(events)


def test_time_counts_from_a_stated_whole_second_origin(tmp_path: Path) -> None:
    path, first, _ = two_incarnations(tmp_path)
    document = chrome(tmp_path, path)
    earliest = T0 + round(min(span.start for span in first) * S)  # the queue, 5 s before
    assert chrome_helpers.origin_ns(document) == earliest - earliest % S
    assert document["otherData"]["time_origin_utc"].endswith("Z")
    assert min(event["ts"] for event in complete_events(document)) >= 0


def test_phases_that_tile_in_nanoseconds_still_tile(tmp_path: Path) -> None:
    # As the trainer backdates them: each phase ends in the nanosecond the next starts.
    # Epoch microseconds as doubles made imports end 0.2 us after arg_parse began.
    at = 0.123456789
    startup = Span("megatron.startup", at, at + 1.000000003)
    phases = [
        startup.child("megatron.startup.imports", at, at + 0.500000001),
        startup.child("megatron.startup.arg_parse", at + 0.500000001, at + 0.700000002),
        startup.child("megatron.startup.model_init", at + 0.700000002, at + 1.000000003),
    ]
    path = write_trace(tmp_path / "t.jsonl", [(resource("job", 0, 1), [*phases, startup])])
    document = chrome(tmp_path, path)
    by_name = {event["name"]: event for event in complete_events(document)}
    ends = [chrome_helpers.end_ns(document, by_name[p.name]) for p in phases]
    starts = [chrome_helpers.start_ns(document, by_name[p.name]) for p in phases]
    assert ends[:-1] == starts[1:]
    assert ends[-1] == chrome_helpers.end_ns(document, by_name["megatron.startup"])
    assert_nested_by_time(complete_events(document))


def test_links_are_flows_bound_to_the_linked_and_the_linking_span(tmp_path: Path) -> None:
    path, first, second = two_incarnations(tmp_path)
    document = chrome(tmp_path, path)
    links = [(target.span_id, span.span_id) for span in first + second for target in span.links]
    assert len(links) == 3  # C0 -> startup, C1 -> C0; and C0 -> startup in the second
    assert sorted(chrome_helpers.arrows(document)) == sorted(links)
    # A chain is drawn with flow attributes on the slices themselves: exact binding.
    assert [e for e in document["traceEvents"] if e["ph"] in ("s", "f")] == []


def test_a_span_linked_to_twice_draws_both_links(tmp_path: Path) -> None:
    # Not the lifecycle's chain: the links fall back to flow-event pairs.
    target = Span("megatron.startup", 0, 1)
    a = Span("megatron.train", 1, 2, links=[target])
    b = Span("megatron.train", 2, 3, links=[target, a])
    path = write_trace(tmp_path / "t.jsonl", [(resource("job", 0, 1), [target, a, b])])
    document = chrome(tmp_path, path)
    expected = [(target.span_id, a.span_id), (target.span_id, b.span_id), (a.span_id, b.span_id)]
    assert sorted(chrome_helpers.arrows(document)) == sorted(expected)


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
    threads = chrome_helpers.names(document, "thread_name")
    assert sorted((pid, name) for (pid, _), name in threads.items()) == [
        (1, "rank 0"), (1, "rank 1"), (2, "rank 0"), (2, "rank 1")]  # fmt: skip
    assert_ids_no_importer_reinterprets(document)
    lane = {key: (key[0], name) for key, name in threads.items()}
    lanes = Counter(lane[(e["pid"], e["tid"])] for e in complete_events(document))
    per_process = len(processes[0][1])
    assert lanes == {
        (1, "rank 0"): per_process,
        (1, "rank 1"): per_process,
        (2, "rank 0"): len(processes[2][1]),
        (2, "rank 1"): len(processes[3][1]),
    }
    sort_index = {
        (e["pid"], e["tid"]): e["args"]["sort_index"]
        for e in document["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_sort_index"
    }
    assert {threads[key]: index for key, index in sort_index.items()} == {"rank 0": 0, "rank 1": 1}
    assert_nested_by_time(complete_events(document))


def test_a_link_to_a_span_not_in_the_file_draws_no_arrow(tmp_path: Path) -> None:
    lost = Span("megatron.train", 0, 1)
    kept = Span("megatron.train", 1, 2, links=[lost])
    path = write_trace(tmp_path / "t.jsonl", [(resource("job", 0, 1), [kept])])
    document = chrome(tmp_path, path)
    assert [e["ph"] for e in document["traceEvents"] if e["ph"] in "sf"] == []
    assert chrome_helpers.arrows(document) == []


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
        f"megatron-trace export: error: no spans in {empty}"
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


@pytest.mark.parametrize("command", ["export", "timeline"])
def test_an_output_in_a_missing_folder_is_an_error_naming_o_and_creates_nothing(
    tmp_path, capsys, command
) -> None:
    from megatron.trace.render.timeline import write as timeline

    trace = write_trace(tmp_path / "t.jsonl", [(resource("job", 0, 1), incarnation(0, 0, 1))])
    out = tmp_path / "nonexistent" / "dir" / "x.json"
    module = export if command == "export" else timeline
    assert run_command(module, [str(trace), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"megatron-trace {command}: error: -o {out}: no folder {out.parent} (create it first, "
        "or name a file in an existing folder)"
    ]
    assert not (tmp_path / "nonexistent").exists()


def test_the_api_refuses_a_missing_folder_too(tmp_path) -> None:
    from megatron.trace.render.output import replacing
    from megatron.trace_format.errors import TraceOutputError

    with pytest.raises(TraceOutputError, match="no folder"), replacing(tmp_path / "a" / "b.json"):
        pass
    assert not (tmp_path / "a").exists()


def test_an_iteration_window_on_a_restarted_job_covers_those_iterations_not_the_gap(
    tmp_path: Path,
) -> None:
    """Killed after iteration 12, resumed from the save at 4: iterations 5..7 ran twice.
    The window is both runs of them (issue 40 item 9), not everything from the first
    run's 5 to the second run's 7: not the killed run's 8..12, nor the restart's startup."""
    import tracegen as g

    path = g.write(
        tmp_path / "t.jsonl",
        g.lifecycle(0, intervals=6, per=2, kill_after=1),  # iterations 0..12
        g.lifecycle(50, first=4, load=4, intervals=3, per=2),  # 4..9
    )
    out = tmp_path / "cut.json"
    argv = [str(path), "--format", "chrome", "-o", str(out)]
    assert run_command(export, [*argv, "--since", "iteration:5", "--until", "iteration:7"]) == 0
    events = complete_events(chrome_helpers.load(out))
    iterations = sorted(
        (e["pid"], e["args"]["megatron.iteration"])
        for e in events
        if e["name"] == "megatron.train.iteration"
    )
    first, second = sorted({pid for pid, _ in iterations})
    # each run's 5..7, and 4, which ends where 5 starts (8 starts after the save at 8)
    assert [n for pid, n in iterations if pid == first] == [4, 5, 6, 7]
    assert [n for pid, n in iterations if pid == second] == [4, 5, 6, 7]
    names = {e["name"] for e in events}
    assert not {"megatron.startup", "megatron.checkpoint.load"} & names
