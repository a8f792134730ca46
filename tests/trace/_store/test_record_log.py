"""Structural records on disk: the same records, in order, and the same reports.

:mod:`megatron.trace._store.record_log` keeps each record as its pickle and writes
them to the read's temporary file once a log holds
:data:`~megatron.trace._store.record_log.SPILL_RECORDS`. Here the bound is a handful
of records, so appends, merges of pieces (in memory, spilled, another
process's), views and pickles across a pipe all run on blocks.
"""

from __future__ import annotations

import pickle
import random
from array import array
from pathlib import Path

import pytest
import synthetic

from megatron.trace._store import record_log, spill
from megatron.trace._store.record_log import RecordLog
from megatron.trace.cli.report import build_report
from megatron.trace.model import builder as model
from megatron.trace.model.incarnation import RECORD_LISTS
from megatron.trace_format.records import SpanFields, SpanRecord, is_cut_short, span_record


@pytest.fixture
def tiny_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_log, "SPILL_RECORDS", 3)


_RESOURCES = [{"dl.rank": 0, "process.pid": 7}, {"dl.rank": 1, "process.pid": 8}]
_FILES = [Path("/traces/a.jsonl"), None]


def _record(rng: random.Random) -> SpanRecord:
    links = [(f"{rng.randrange(9):032x}", f"{rng.randrange(9):016x}")] if rng.random() < 0.5 else []
    fields = SpanFields(
        rng.choice(["megatron.train", "megatron.checkpoint.save", "megatron.hang"]),
        f"{rng.randrange(99):032x}",
        f"{rng.randrange(9**9):016x}",
        None if rng.random() < 0.3 else f"{rng.randrange(9**9):016x}",
        rng.randrange(2**62),
        rng.randrange(2**62),
        rng.choice(
            [
                {},
                {"megatron.iteration": rng.randrange(99), "x": [1.5, "y", True]},
                {"megatron.span.cut_short": True},
                {"megatron.span.cut_short": False, "megatron.iteration": 3},
            ]
        ),
        links,
        [{"k": 1}] * len(links),
        [{"name": "e", "time_ns": 5, "attributes": {}}] if rng.random() < 0.2 else [],
        rng.choice(["UNSET", "OK", "ERROR"]),
        rng.choice(["", "boom"]),
        rng.choice([1, None]),
    )
    # an equal copy of a resource, as every line decodes its own
    resource = dict(rng.choice(_RESOURCES))
    return span_record(fields, resource, rng.choice(_FILES), rng.randrange(1, 999))


@pytest.mark.parametrize("seed", range(12))
def test_a_log_gives_back_the_records_in_order(seed: int, tiny_blocks: None) -> None:
    """Appends, merges of logs (themselves spilled or not), a block another process wrote,
    reads by position, views and a pickle: as a list of the records would have them."""
    rng = random.Random(seed)
    log, expected = RecordLog(), []
    for _ in range(rng.randrange(0, 30)):
        if rng.random() < 0.3:  # a piece merged in
            other = RecordLog()
            records = [_record(rng) for _ in range(rng.randrange(7))]
            for record in records:
                other.append(record)
            if rng.random() < 0.3:
                for block in other.blocks:  # as a worker's summary would be
                    block.store = _Elsewhere(block.store)
            log.extend(other)
            expected += records
        else:
            expected.append(_record(rng))
            log.append(expected[-1])
    assert len(log) == len(expected)
    assert list(log) == expected
    assert list(log.starts) == [r["start_ns"] for r in expected]
    assert [log.name(i) for i in range(len(log))] == [r["name"] for r in expected]
    if expected:
        at = rng.randrange(len(expected))
        assert log[at] == expected[at]
    positions = array("q", rng.sample(range(len(expected)), rng.randrange(len(expected) + 1)))
    view = log.view(positions)
    assert view == [expected[i] for i in positions] and len(view) == len(positions)
    assert view[1:3] == [expected[i] for i in positions[1:3]]
    # what placing and accounting read without decoding: times, names, the cut-short mark
    picked = [expected[i] for i in positions]
    assert list(record_log.extents(view)) == list(record_log.extents(picked))
    assert record_log.latest(view) == record_log.latest(picked)
    assert [log.cut_short(i) for i in range(len(log))] == [is_cut_short(r) for r in expected]
    assert list(pickle.loads(pickle.dumps(log))) == expected
    assert list(pickle.loads(pickle.dumps(view))) == [expected[i] for i in positions]
    # the records of one resource and file share one dict of the resource, however many
    # copies were added
    assert len({id(r["resource"]) for r in log}) <= len(_RESOURCES) * len(_FILES)


class _Elsewhere:
    """A store seen from a process that did not write it."""

    def __init__(self, store: object) -> None:
        self._store, self.pid = store, -1

    def read(self, *args: object) -> bytes:
        return self._store.read(*args)  # type: ignore[attr-defined]


def test_a_position_past_the_end_is_an_index_error(tiny_blocks: None) -> None:
    log = RecordLog()
    log.append(_record(random.Random(1)))
    with pytest.raises(IndexError):
        log[1]


def test_without_room_for_a_temporary_file_the_records_stay_in_memory(
    monkeypatch: pytest.MonkeyPatch, tiny_blocks: None
) -> None:
    def refuse() -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spill, "_UNWRITABLE", [])
    monkeypatch.setattr(spill, "store", refuse)
    rng = random.Random(3)
    expected = [_record(rng) for _ in range(10)]
    log = RecordLog()
    for record in expected:
        log.append(record)
    assert list(log) == expected and not log.spilled


def test_a_trace_read_with_its_records_spilled_reports_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks, a kill and a resume each, intervals every few iterations, read whole and
    in pieces by forked workers: the incarnations hold the same records, the report is
    the same, when every few records go to disk."""
    monkeypatch.setattr("megatron.trace.otlp.parallel.MIN_PIECE_BYTES", 1)
    shape = synthetic.Shape(spans=5000, ranks=2, incarnations=2, save_interval=3, per_line=20)
    (path,) = synthetic.write_per_step(tmp_path / "t.jsonl", shape)

    def read(jobs: int) -> tuple:
        trace = model.load_trace([path], jobs=jobs)
        lists = [
            (inc.label, name, list(getattr(inc, name)))
            for inc in trace.incarnations
            for name in RECORD_LISTS
        ]
        spilled = any(inc.intervals.log.spilled for inc in trace.incarnations)  # type: ignore[attr-defined]
        return build_report(trace), lists, [inc.startup for inc in trace.incarnations], spilled

    *in_memory, spilled = read(1)
    assert sum(len(records) for _, _, records in in_memory[1]) > 500 and not spilled
    monkeypatch.setattr(record_log, "SPILL_RECORDS", 5)
    for jobs in (1, 3):
        *figures, spilled = read(jobs)
        assert figures == in_memory and spilled, jobs
