"""A growing trace says, at each finish, which processes were given spans since the one
before and from when on: what the live caches keep before that time still holds."""

from __future__ import annotations

from pathlib import Path

import tracegen as g

from megatron.trace.live.growing import GrowingTrace
from megatron.trace.otlp.reader import decode_line, iter_spans

S = g.SECOND


def _add(growing: GrowingTrace, *lines: str) -> None:
    for number, text in enumerate(lines, 1):
        line = decode_line(Path("traces.jsonl"), number, text.encode(), growing.builder.stats)
        assert line is not None
        growing.add_line(line)


def _by_rank(touched) -> dict[str, int]:
    """``Finish.touched`` by the rank of each process (one process a rank here)."""
    return {process[0]: ns for process, ns in touched.items()}


def test_each_finish_names_the_processes_given_spans_since_and_their_earliest_start() -> None:
    growing = GrowingTrace()
    _add(
        growing,
        g.line([g.span("megatron.startup", 5, 7), g.span("megatron.train", 7, 9)], pid=1),
        g.line([g.span("megatron.startup", 3, 4)], rank=1, pid=2),
    )
    first = growing.finish()
    assert first.generation == 1
    assert _by_rank(first.touched) == {"0": 5 * S, "1": 3 * S}
    assert set(first.touched) == set(first.trace.processes)

    _add(growing, g.line([g.span("megatron.train", 9, 11), g.span("megatron.train", 8, 12)], pid=1))
    second = growing.finish()
    assert second.generation == 2
    assert _by_rank(second.touched) == {"0": 8 * S}  # the earliest of the new ones

    third = growing.finish()
    assert (third.generation, dict(third.touched)) == (3, {})
    assert third.trace.span_count == 5


def test_a_span_older_than_what_came_before_moves_the_time_back() -> None:
    growing = GrowingTrace()
    _add(growing, g.line([g.span("megatron.train", 20, 30)], pid=1))
    growing.finish()
    _add(
        growing,
        g.line([g.span("megatron.train", 30, 40)], pid=1),
        g.line([g.span("megatron.checkpoint.save", 12, 13)], pid=1),  # written late
    )
    assert _by_rank(growing.finish().touched) == {"0": 12 * S}


def test_flat_records_are_noted_as_lines_are(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_text(
        g.line([g.span("megatron.startup", 1, 2), g.span("megatron.train", 2, 4)], pid=7) + "\n"
    )
    records = list(iter_spans(path))
    growing = GrowingTrace()
    growing.add(records[1:])
    assert _by_rank(growing.finish().touched) == {"0": 2 * S}
    growing.add(records[:1])
    finish = growing.finish()
    assert _by_rank(finish.touched) == {"0": 1 * S}
    assert [inc.startup is not None for inc in finish.trace.incarnations] == [True]
