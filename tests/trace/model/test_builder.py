"""Reading at scale: the fast per-line path, per-file summaries, their merge, parallel files.

``report`` and ``check`` read through :meth:`TraceBuilder.add_line` (no dict
per span) and, for several files, map each file to a summary in its own
process and merge the summaries in file order. Each of those steps must give
exactly what the plain span-by-span reading gives.
"""

from __future__ import annotations

import errno
import functools
import io
import json
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import synthetic
import tracegen as g

from megatron.trace._store import span_ids
from megatron.trace._store.span_ids import IdCollector, IdSet
from megatron.trace.analysis import check
from megatron.trace.cli.report import build_report
from megatron.trace.model import builder as model
from megatron.trace.model.builder import TraceBuilder
from megatron.trace.otlp.reader import iter_spans


def _slow_trace(paths: list[Path]) -> model.Trace:
    builder = TraceBuilder()
    for span in iter_spans(paths, builder.stats):
        builder.add(span)
    return builder.finish()


def _shape(trace: model.Trace) -> list[tuple]:
    """What the model learnt, incarnation by incarnation, in comparable form."""
    return [
        (
            inc.rank,
            inc.index,
            inc.process,
            inc.start_ns,
            inc.end_ns,
            inc.ended,
            inc.startup,
            inc.pre_startup,
            inc.launch,
            inc.intervals,
            inc.saves,
            inc.loads,
            inc.evaluations,
            inc.cut_short,
            inc.startup_phases,
            list(inc.iterations.numbers),
            list(inc.iterations.starts),
            list(inc.iterations.ends),
        )
        for inc in trace.incarnations
    ]


def test_each_incarnation_keeps_its_startup_phases(tmp_path: Path) -> None:
    """The timeline draws them from the model: each incarnation's, in start order, and
    none of them among the structural records the accounting sums."""
    trace = model.load_trace([_messy(tmp_path)])
    for inc in trace.incarnations:
        names = [phase["name"] for phase in inc.startup_phases]
        assert names and all(name.startswith("megatron.startup.") for name in names)
        starts = [phase["start_ns"] for phase in inc.startup_phases]
        assert starts == sorted(starts)
        assert inc.startup is not None
        assert all(inc.startup["start_ns"] <= start <= inc.startup["end_ns"] for start in starts)
        assert not any(record in list(inc.records) for record in inc.startup_phases)


def _messy(tmp_path: Path) -> Path:
    """Kills, a resume, a cut-short end, a torn line and two ranks in one file."""
    path = tmp_path / "t.jsonl"
    g.write(path, g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6, cut_short_after=1))
    with path.open("a") as file:
        file.write(g.line(g.lifecycle(50, intervals=1), rank=1)[:-30] + "\n")  # torn
    g.write(path, g.lifecycle(60), rank=1)
    return path


@pytest.mark.parametrize("kind", ["messy", "synthetic"])
def test_the_fast_path_builds_the_same_trace_as_span_by_span(tmp_path: Path, kind: str) -> None:
    if kind == "messy":
        paths = [_messy(tmp_path)]
    else:
        shape = synthetic.Shape(spans=4000, ranks=2, save_interval=7, incarnations=3)
        paths = synthetic.write_per_step(tmp_path / "t.jsonl", shape)
    fast = model.load_trace(paths)
    slow = _slow_trace(paths)
    assert _shape(fast) == _shape(slow)
    assert fast.span_count == slow.span_count and fast.stats == slow.stats
    assert build_report(fast) == build_report(slow)
    assert any(inc.ended == "killed" for inc in fast.incarnations)


def _split(path: Path, parts: int) -> list[Path]:
    lines = path.read_text().splitlines(keepends=True)
    size = -(-len(lines) // parts)
    out = []
    for index in range(parts):
        part = path.with_name(f"part{index}.jsonl")
        part.write_text("".join(lines[index * size : (index + 1) * size]))
        out.append(part)
    return out


def test_merging_file_summaries_is_associative(tmp_path: Path) -> None:
    shape = synthetic.Shape(spans=3000, ranks=2, save_interval=10, incarnations=2)
    (whole,) = synthetic.write_per_step(tmp_path / "t.jsonl", shape)
    a, b, c = _split(whole, 3)
    left = model.scan_file(a).merge(model.scan_file(b)).merge(model.scan_file(c))
    right = model.scan_file(a).merge(model.scan_file(b).merge(model.scan_file(c)))
    assert _shape(left.finish()) == _shape(right.finish())
    # the same figures as reading the one file (only the records' file:line differ)
    assert build_report(left.finish()) == build_report(model.load_trace([whole]))


def _ids(path: Path) -> IdSet:
    collector = IdCollector()
    with path.open() as file:
        for number, text in enumerate(file, 1):
            spans = [
                s
                for r in json.loads(text)["resourceSpans"]
                for sc in r["scopeSpans"]
                for s in sc["spans"]
            ]

            class _S:
                def __init__(self, s):
                    self.span_id, self.parent_span_id = s["spanId"], s.get("parentSpanId", "")

            collector.add(number, [_S(s) for s in spans])
    return collector.finish(path)


def _answers(merged: IdSet) -> tuple[list[str], dict[Path, dict[int, set[str]]]]:
    return span_ids.ids_hex(merged.dups), {p: merged.unresolved_lines(p) for p in merged.unresolved}


@pytest.mark.parametrize("spill_from", [None, 1, 7])
def test_id_sets_merge_associatively_and_find_cross_file_duplicates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spill_from: int | None
) -> None:
    """In memory, or spilled to disk (every id, or from the seventh on): the same answers."""
    spans = g.lifecycle(0, kill_after=1)
    spans[3]["spanId"] = spans[0]["spanId"]  # a duplicate, in the first part
    path = g.write(tmp_path / "t.jsonl", spans, per_line=2)
    extra = g.write(tmp_path / "x.jsonl", [dict(spans[-1], parentSpanId="")], per_line=1)
    a, b, c = _split(path, 3)
    parts = (a, b, c, extra)
    in_memory = _answers(functools.reduce(IdSet.merge, [_ids(p) for p in parts]))
    if spill_from is not None:
        monkeypatch.setattr(span_ids, "SPILL_FROM_IDS", spill_from)
    left = functools.reduce(IdSet.merge, [_ids(p) for p in parts])  # merge grows its left side
    sets = [_ids(p) for p in parts]
    right = sets[0].merge(sets[1].merge(sets[2].merge(sets[3])))
    assert left.spilled == (spill_from is not None)
    # a spilled set sent to another process takes its ids along, in memory
    sent = pickle.loads(pickle.dumps(functools.reduce(IdSet.merge, [_ids(p) for p in parts])))
    for merged in (left, right, sent):
        assert np.array_equal(merged.ids, left.ids)
        assert np.all(merged.ids[1:] > merged.ids[:-1])  # sorted, unique
        assert _answers(merged) == in_memory
    assert len(left.dups) == 2  # the planted one, and the span copied into extra
    # the killed interval's children miss their parent, wherever the parts were cut
    assert sum(len(lines) for lines in in_memory[1].values()) >= 1
    left.close()
    right.close()


def test_check_with_its_ids_on_disk_says_what_it_says_with_them_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A duplicate id, a missing parent and a kill, found the same way from spilled ids."""
    (path,) = synthetic.write_per_step(
        tmp_path / "t.jsonl", synthetic.Shape(spans=3000, ranks=2, incarnations=2)
    )
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines + lines[-1:]))  # the last line twice: its ids duplicated
    in_memory = check.check_files([path], jobs=2)
    monkeypatch.setattr(span_ids, "SPILL_FROM_IDS", 100)
    on_disk = check.check_files([path], jobs=2)
    assert (on_disk.violations, on_disk.notes) == (in_memory.violations, in_memory.notes)
    assert any(v.startswith("duplicate-span-id") for v in on_disk.violations)
    assert any(n.startswith("killed:") for n in on_disk.notes)


class _FullDisk(io.BytesIO):
    def write(self, data: bytes) -> int:  # type: ignore[override]
        raise OSError(errno.ENOSPC, "No space left on device")


def test_check_on_a_full_tmpdir_goes_on_in_memory_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one spill policy (``_store/spill.py``): the same answer, one warning line naming
    TMPDIR, not a traceback nor a refusal; the trace is not touched."""
    from megatron.trace._store import spill
    from megatron.trace.cli.main import main

    (path,) = synthetic.write_per_step(tmp_path / "t.jsonl", synthetic.Shape(spans=2000))
    before = path.read_bytes()
    assert main(["check", "--jobs", "1", str(path)]) == 0
    expected = capsys.readouterr().out
    monkeypatch.setattr(spill, "_UNWRITABLE", [])
    monkeypatch.setattr(span_ids, "SPILL_FROM_IDS", 100)
    monkeypatch.setattr(span_ids.tempfile, "TemporaryFile", lambda **_: _FullDisk())
    assert main(["check", "--jobs", "1", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == expected
    err = captured.err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("megatron-trace: warning: cannot write temporary files in ")
    assert "No space left on device" in err[0] and "set TMPDIR" in err[0]
    assert len(spill._UNWRITABLE) == 1  # tried once, then kept in memory
    assert path.read_bytes() == before


def test_spilled_ids_come_back_when_a_later_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ids spilled by earlier merges are read back into memory when a later write fails,
    none twice and none lost: the duplicates and missing parents are still exact."""
    from megatron.trace._store import spill

    (path,) = synthetic.write_per_step(tmp_path / "t.jsonl", synthetic.Shape(spans=6000))
    expected = check.check_files([path], jobs=1).violations
    monkeypatch.setattr(spill, "_UNWRITABLE", [])
    monkeypatch.setattr(span_ids, "SPILL_FROM_IDS", 100)
    real_add, calls = span_ids._Spill.add, []

    def add_then_fail(self, ids):
        calls.append(len(ids))
        if len(calls) == 3:  # after two whole writes, a write that fails half-way
            real_add(self, ids[: len(ids) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real_add(self, ids)

    monkeypatch.setattr(span_ids._Spill, "add", add_then_fail)
    assert check.check_files([path], jobs=1).violations == expected
    assert len(calls) == 3 and len(spill._UNWRITABLE) == 1


@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "out_of_order"])
def test_a_process_that_ran_pretrain_twice_gives_each_incarnation_its_iterations(
    tmp_path: Path, in_order: bool
) -> None:
    """Each incarnation gets the iterations that began at or after its own startup and
    before the next, in start order: one that began the very instant the second startup
    did is the second's; iterations written out of order land the same."""
    first, second = g.lifecycle(0), g.lifecycle(100, first=6)
    (startup,) = [s for s in second if s["name"] == "megatron.startup"]
    tie = g.span("megatron.train.iteration", 0, 0, **{"megatron.iteration": 99})
    tie["startTimeUnixNano"] = startup["startTimeUnixNano"]
    tie["endTimeUnixNano"] = str(int(startup["startTimeUnixNano"]) + 10)
    first.append(tie)
    if not in_order:  # the first incarnation's iterations in reverse
        at = [i for i, s in enumerate(first) if s["name"] == "megatron.train.iteration"]
        for i, j in zip(at, reversed(at), strict=True):
            if i < j:
                first[i], first[j] = first[j], first[i]
    path = g.write(tmp_path / "traces.jsonl", first, second, pid=100)  # one process

    def began(spans: list[dict]) -> list[tuple[int, int]]:
        return sorted(
            (int(s["startTimeUnixNano"]), int(s["attributes"][0]["value"]["intValue"]))
            for s in spans
            if s["name"] == "megatron.train.iteration"
        )

    trace = model.load_trace([path])
    (incs,) = trace.ranks.values()
    assert [inc.process for inc in incs] == [incs[0].process] * 2
    expected = began(first)
    assert expected[-1][1] == 99  # the tie: latest of the first's spans ...
    expected = [expected[:-1], [expected[-1], *began(second)]]  # ... the second's first
    got = [list(zip(inc.iterations.starts, inc.iterations.numbers, strict=True)) for inc in incs]
    assert got == expected
    assert _shape(trace) == _shape(_slow_trace([path]))


def test_several_files_read_in_parallel_give_what_one_process_gives(tmp_path: Path) -> None:
    shape = synthetic.Shape(
        spans=6000, ranks=3, save_interval=9, incarnations=2, per_rank_files=True
    )
    files = synthetic.write_per_step(tmp_path / "t.jsonl", shape)
    serial = model.load_trace(files, jobs=1)
    parallel = model.load_trace(files, jobs=3)
    assert _shape(parallel) == _shape(serial)
    assert build_report(parallel) == build_report(serial)
    assert [inc.rank for inc in parallel.incarnations] == ["0", "0", "1", "1", "2", "2"]
    one, many = check.check_files(files, jobs=1), check.check_files(files, jobs=3)
    assert (one.violations, one.notes) == (many.violations, many.notes)
    assert sum(note.startswith("killed:") for note in many.notes) == 3


def test_check_sees_ids_across_files(tmp_path: Path, capsys) -> None:
    """A parent in another file is no missing parent; an id in two files is a duplicate."""
    spans = g.lifecycle(0)
    startup = next(s for s in spans if s["name"] == "megatron.startup")
    rest = [s for s in spans if s is not startup]
    first = g.write(tmp_path / "a.jsonl", rest)
    second = g.write(tmp_path / "b.jsonl", [startup])
    result = check.check_files([first, second], jobs=2)
    assert result.violations == []
    imports = next(s for s in spans if s["name"] == "megatron.startup.imports")
    copy = g.write(tmp_path / "c.jsonl", [dict(imports)])
    result = check.check_files([first, second, copy], jobs=2)
    assert len(result.violations) == 1, result.violations
    assert result.violations[0].startswith("duplicate-span-id: span megatron.startup.imports ")
    assert f"({copy}:1)" in result.violations[0]  # the second occurrence, in read order


def test_this_process_reads_its_piece_while_the_workers_read_theirs(tmp_path: Path) -> None:
    """The first piece, read here, and the other, handed to a worker before it, are read
    at once: each read waits to see the other begin (a worker handed its piece only
    after this one's read would never be seen)."""
    from parallel_probes import meet

    from megatron.trace.otlp.parallel import map_files

    assert map_files(meet, [tmp_path / "a", tmp_path / "b"], jobs=2) == [True, True]


@pytest.mark.parametrize(("files", "jobs"), [(2, 2), (3, 3), (5, 2)])
def test_parallel_results_come_back_in_file_order(tmp_path: Path, files: int, jobs: int) -> None:
    """With one file per job this process reads the first itself and the workers the
    rest; with more files than jobs the workers read them all. Either way: in order."""
    import os

    from parallel_probes import reader_of

    from megatron.trace.otlp.parallel import map_files

    paths = [tmp_path / f"{n}.jsonl" for n in range(files)]
    results = map_files(reader_of, paths, jobs)
    assert [name for name, _ in results] == [path.name for path in paths]
    readers = [pid for _, pid in results]
    here = os.getpid()
    if files <= jobs:
        assert readers[0] == here and here not in readers[1:]
    else:
        assert here not in readers


@pytest.mark.parametrize(("count", "jobs"), [(64, 2), (9, 2), (3, 2), (1, 4), (0, 2), (100, 7)])
def test_an_executors_calls_take_runs_of_pieces_in_order(count: int, jobs: int) -> None:
    """About two runs a job, none empty, their sizes within one of each other, the longer
    first (a run waits least for the calls before it to be taken)."""
    from megatron.trace.otlp.parallel import run_sizes

    sizes = run_sizes(count, jobs)
    assert sum(sizes) == count and len(sizes) == min(count, 2 * jobs)
    assert all(size > 0 for size in sizes) and sizes == sorted(sizes, reverse=True)
    assert not sizes or sizes[0] - sizes[-1] <= 1
    assert run_sizes(count, None) == [1] * count  # how many run at once is not known
    assert run_sizes(64, 2) == [16, 16, 16, 16]


class _CountingPool(ThreadPoolExecutor):
    """A pool that counts the calls handed to it."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.calls = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return super().submit(*args, **kwargs)


def test_an_executor_reads_runs_of_files_and_gives_each_files_result_in_order(
    tmp_path: Path,
) -> None:
    from parallel_probes import name_of

    from megatron.trace.otlp.parallel import map_files

    paths = [tmp_path / f"{n}.jsonl" for n in range(9)]
    with _CountingPool(2) as pool:
        assert map_files(name_of, paths, 2, pool) == [[path.name] for path in paths]
    assert pool.calls == 4


def test_with_a_merge_an_executor_merges_each_runs_results_in_order_where_it_ran(
    tmp_path: Path,
) -> None:
    """One result crosses back a run, its files' merged in file order (``+`` of lists
    keeps it); the fold of those is the fold of every file's."""
    import operator

    from parallel_probes import name_of

    from megatron.trace.otlp.parallel import imap_files, map_reduce

    paths = [tmp_path / f"{n}.jsonl" for n in range(9)]
    with _CountingPool(2) as pool:
        runs = list(imap_files(name_of, paths, 2, pool, operator.add))
        assert map_reduce(name_of, operator.add, paths, 2, pool) == [p.name for p in paths]
    assert runs == [["0.jsonl", "1.jsonl", "2.jsonl"]] + [
        [f"{n}.jsonl", f"{n + 1}.jsonl"] for n in (3, 5, 7)
    ]
    assert pool.calls == 8
    assert list(imap_files(name_of, paths, 2, None, operator.add)) == [[p.name] for p in paths]
