"""An incarnation's revision tells the same incarnation across a growing trace's finishes
(while its process is not split anew) and changes whenever what it holds does."""

from __future__ import annotations

import random
from pathlib import Path

import tracegen as g

from megatron.trace.live.growing import GrowingTrace
from megatron.trace.live.revision import Rows
from megatron.trace.otlp.reader import decode_line


def _grown(*batches: list[str]) -> list:
    """The finishes of a growing trace given each batch of lines in turn."""
    growing, finishes, number = GrowingTrace(), [], 0
    for lines in batches:
        for text in lines:
            number += 1
            line = decode_line(Path("t.jsonl"), number, text.encode(), growing.builder.stats)
            growing.add_line(line)
        finishes.append(growing.finish())
    return finishes


def _lines(spans: list[dict], per_line: int = 3, pid: int = 100) -> list[str]:
    return [g.line(spans[i : i + per_line], pid=pid) for i in range(0, len(spans), per_line)]


def _revisions(finish) -> list:
    return [finish.revisions.of(inc) for inc in finish.trace.incarnations]


def test_the_same_incarnation_across_finishes_and_a_new_revision_when_it_grows() -> None:
    lines = _lines(g.lifecycle(0, intervals=4))
    first, second, again = _grown(lines[:5], lines[5:], [])
    (before,), (after,), (unchanged,) = map(_revisions, (first, second, again))
    assert before.incarnation == after.incarnation == unchanged.incarnation
    assert before != after and after == unchanged
    assert before.records < after.records
    assert after.iterations == Rows(count=8, first=0)
    assert after.waits == Rows(count=0, first=0) and after.rows_grow()


def test_a_new_startup_in_the_process_makes_new_incarnations() -> None:
    """pretrain() called again in the process: its records are placed anew, so nothing kept
    of the one incarnation before may stand for either of the two after."""
    killed = _lines(g.lifecycle(0, intervals=2, kill_after=1))
    first, second = _grown(killed, _lines(g.lifecycle(20, load=4, first=4)))
    (alone,) = _revisions(first)
    earlier, later = _revisions(second)
    assert alone.incarnation not in (earlier.incarnation, later.incarnation)
    assert (earlier.slot, later.slot) == (0, 1)
    # the process's iterations in start order: consecutive rows, one slice each
    assert earlier.iterations == Rows(count=5, first=0)
    assert later.iterations == Rows(count=6, first=5)


def test_iterations_out_of_start_order_say_their_rows_are_sorted_anew() -> None:
    spans = g.lifecycle(0, intervals=3)
    iterations = [s for s in spans if s["name"] == "megatron.train.iteration"]
    random.Random(3).shuffle(iterations)
    others = [s for s in spans if s["name"] != "megatron.train.iteration"]
    (finish,) = _grown(_lines(iterations + others))
    (revision,) = _revisions(finish)
    assert revision.iterations == Rows(count=6, first=None)
    assert not revision.rows_grow()


def test_an_incarnation_of_another_finish_has_none() -> None:
    first, second = _grown(_lines(g.lifecycle(0, intervals=1)), [])
    (inc,) = first.trace.incarnations
    assert second.revisions.of(inc) is None
