"""Iteration columns on disk: the same rows, the same reports, and no file for a small trace.

:mod:`megatron.trace._store.columns` writes a column set's rows to a temporary file
once it holds :data:`~megatron.trace._store.columns.SPILL_ROWS` of them. Here the
bound is a handful of rows, so every path (the hot loop's appends, a merge
of pieces, the split into incarnations, a pickle across a pipe, forked
workers reading the parent's blocks) runs on blocks, and what the readers
make of them is held to what they make of columns in memory.
"""

from __future__ import annotations

import pickle
import random
import weakref
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import pytest
import synthetic

from megatron.trace._store import columns, spill
from megatron.trace._store.columns import Iterations
from megatron.trace.analysis import check
from megatron.trace.analysis.liveness import Clock
from megatron.trace.cli.report import build_report
from megatron.trace.model import builder as model
from megatron.trace.otlp.spans import span_source
from megatron.trace.render.export import write as export
from megatron.trace.render.timeline import data as timeline_data
from megatron.trace.render.timeline.page import render_html


def _rows(its: Iterations) -> list[tuple[int, int, int]]:
    return list(its.rows())


@pytest.fixture
def tiny_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columns, "SPILL_ROWS", 3)


@pytest.mark.parametrize("seed", range(10))
def test_spilled_columns_hold_the_rows_in_order(seed: int, tiny_blocks: None) -> None:
    """Appends (one by one and through the hot loop's arrays), extends, slices, the first
    and last number and a pickle: as a list of rows would have them."""
    rng = random.Random(seed)

    def row() -> tuple[int, int, int]:
        return rng.randrange(99), rng.randrange(9**9), rng.randrange(9**9)

    its, expected = Iterations(), []
    for _ in range(rng.randrange(0, 40)):
        if rng.random() < 0.3:  # a piece merged in (in memory, or itself spilled)
            other, rows = Iterations(), [row() for _ in range(rng.randrange(6))]
            for one in rows:
                other.append(*one)
            its.extend(other)
            expected += rows
        elif rng.random() < 0.5:
            expected.append(row())
            its.append(*expected[-1])
        else:
            numbers, starts, ends = its.arrays()
            for _ in range(rng.randrange(3)):
                number, start, end = row()
                numbers.append(number)
                starts.append(start)
                ends.append(end)
                expected.append((number, start, end))
    assert len(its) == len(expected)
    assert _rows(its) == expected
    assert its.first_number() == (expected[0][0] if expected else None)
    assert its.last_number() == (expected[-1][0] if expected else None)
    lo = rng.randrange(len(expected) + 1)
    hi = rng.randrange(lo, len(expected) + 1)
    assert _rows(its.slice(lo, hi)) == expected[lo:hi]
    assert _rows(pickle.loads(pickle.dumps(its))) == expected
    # what the readers ask of a whole column set, read a part (of SPILL_ROWS) at a time
    starts = [start for _, start, _ in expected]
    assert its.min_start() == min(starts, default=None)
    assert its.max_start() == max(starts, default=None)
    assert its.max_end() == max((end for _, _, end in expected), default=None)
    assert its.durations().tolist() == [end - start for _, start, end in expected]
    assert its.in_start_order() == (starts == sorted(starts))
    ordered = Iterations()
    for number, start, end in sorted(expected, key=lambda row: row[1]):
        ordered.append(number, start, end)
    assert ordered.in_start_order()
    number = rng.randrange(99)
    later = [row for row in expected if row[0] >= number]
    assert its.start_of(number) == min((start for _, start, _ in later), default=None)
    assert its.count_from(number) == len(later)


@pytest.mark.parametrize("seed", range(6))
def test_the_scan_asked_as_rows_come_sees_every_row(seed: int, tiny_blocks: None) -> None:
    """The earliest and latest start, the latest end and whether the rows are in start
    order, asked after every few rows (as watch's scrapes ask a growing column set, which
    reads only the rows added since): each time as of every row so far."""
    rng = random.Random(seed)
    its, starts, ends = Iterations(), [], []
    at = 0
    for _ in range(40):
        for _ in range(rng.randrange(4)):
            at += rng.randrange(-1, 12)  # now and then one that starts before the last
            end = at + rng.randrange(30)
            its.append(len(starts), at, end)
            starts.append(at)
            ends.append(end)
        assert its.min_start() == min(starts, default=None)
        assert its.max_start() == max(starts, default=None)
        assert its.max_end() == max(ends, default=None)
        assert its.in_start_order() == (starts == sorted(starts))


def test_a_block_another_process_wrote_is_read_not_shared(tiny_blocks: None) -> None:
    """A forked worker's merge reads the parent's blocks into its own memory (and file)."""
    parent = Iterations()
    for number in range(7):
        parent.append(number, number * 10, number * 10 + 5)
    for block in parent.blocks:
        block.store = _Elsewhere(block.store)
    mine = Iterations()
    mine.extend(parent)
    assert _rows(mine) == [(n, n * 10, n * 10 + 5) for n in range(7)]
    assert all(block.store.pid == spill.store().pid for block in mine.blocks)


class _Elsewhere:
    """A store seen from a process that did not write it."""

    def __init__(self, store: object) -> None:
        self._store, self.pid = store, -1

    def read(self, *args: object) -> bytes:
        return self._store.read(*args)  # type: ignore[attr-defined]


def test_a_small_trace_writes_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill, "_STORE", None)
    shape = synthetic.Shape(spans=4000, ranks=2, incarnations=2, save_interval=9)
    (path,) = synthetic.write_per_step(tmp_path / "t.jsonl", shape)
    build_report(model.load_trace([path], jobs=1))
    assert spill._STORE is None


def _figures(path: Path, jobs: int, executor: Executor | None) -> tuple:
    clock = Clock(now_ns=2**62)
    trace = model.load_trace([path], jobs=jobs, executor=executor)
    found = check.check_files([path], clock, jobs, executor)
    page = render_html(timeline_data.collect(span_source([path]), [str(path)], clock, jobs))
    return (
        build_report(trace),
        found.violations,
        found.notes,
        [(inc.label, list(inc.iterations.rows())) for inc in trace.incarnations],
        [(inc.label, list(inc.waits.rows())) for inc in trace.incarnations],
        page,
    )


@pytest.mark.needs_extras  # the report is compared with the timeline drawn (plotly)
@pytest.mark.parametrize("how", ["here", "forked", "threads"])
def test_reports_on_spilled_columns_equal_those_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Two ranks, a kill and a resume each, the gradient waits too: report, check, the
    iterations each incarnation holds and both exports, read in this process, by forked
    workers (which read this process's blocks) and on a thread pool (one store, shared)."""
    monkeypatch.setattr("megatron.trace.otlp.parallel.MIN_PIECE_BYTES", 1)
    shape = synthetic.Shape(spans=6000, ranks=2, incarnations=2, save_interval=7, per_line=20)
    (path,) = synthetic.write_per_step(tmp_path / "t.jsonl", synthetic.Shape(**{
        **shape.__dict__, "communication": True}))  # fmt: skip
    jobs = 1 if how == "here" else 4
    pool = ThreadPoolExecutor(4) if how == "threads" else None
    try:
        in_memory = _figures(path, jobs, pool)
        exports = {}
        for fmt in export.FORMATS:
            out = tmp_path / f"memory.{fmt}"
            export.export_files([path], out, fmt, jobs=jobs, executor=pool)
            exports[fmt] = out.read_bytes()
        monkeypatch.setattr(columns, "SPILL_ROWS", 7)
        assert _figures(path, jobs, pool) == in_memory
        for fmt in export.FORMATS:
            out = tmp_path / f"spilled.{fmt}"
            export.export_files([path], out, fmt, jobs=jobs, executor=pool)
            assert out.read_bytes() == exports[fmt], fmt
    finally:
        if pool is not None:
            pool.shutdown()


def test_without_room_for_a_temporary_file_the_columns_stay_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_blocks: None
) -> None:
    """TMPDIR read-only (or full): the same rows, in memory, and the read goes on."""

    def refuse() -> None:
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr(spill, "_UNWRITABLE", [])
    monkeypatch.setattr(spill, "store", refuse)
    its = Iterations()
    for number in range(10):
        its.append(number, number, number + 1)
    other = Iterations()
    other.extend(its)
    assert _rows(other) == [(n, n, n + 1) for n in range(10)]
    assert not its.spilled and not other.spilled
    assert len(spill._UNWRITABLE) == 1  # tried once, not at every row


def test_a_read_whose_columns_are_dropped_frees_its_file(tiny_blocks: None) -> None:
    """A long-lived process reading trace after trace does not pile their columns up on
    disk: the file goes with the last block of it."""
    its = Iterations()
    for number in range(10):
        its.append(number, number, number + 1)
    store = weakref.ref(its.blocks[0].store)
    assert spill.store() is store()
    del its
    assert store() is None  # closed: the next read starts a file of its own
