"""One big file read as pieces in parallel: every command gives what reading it whole gives.

A piece is a run of whole lines of one plain file (``split_file``); each is
mapped like a file of its own and merged in order. Wherever the cuts fall,
line numbers (of torn writes, of damage, of violations) must be the whole
file's, ``report`` and ``check`` must say the same, the Chrome export must be
the same bytes, and the Perfetto export the same slices at the same depths:
a cut through a subtree, where timestamps tie, must still nest (the seams).
"""

from __future__ import annotations

import gzip
import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import synthetic
import tracegen
from perfetto_reading import Slice, read_slices
from pictures_helpers import incarnation, resource, write_trace

from megatron.trace.analysis import check
from megatron.trace.analysis.goodput import build_report
from megatron.trace.model.builder import load_trace
from megatron.trace.otlp import parallel
from megatron.trace.otlp.reader import TraceFileDamaged, iter_lines
from megatron.trace.render.export import write as export
from megatron.trace.render.text.report import format_report
from megatron.trace_format.files import FilePiece, numbered, split_file


@pytest.fixture
def tiny_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut files however small they are, so a test file of a few KB has many pieces."""
    monkeypatch.setattr(parallel, "MIN_PIECE_BYTES", 1)


def _lines(source: Path | FilePiece) -> list[tuple[int, bytes]]:
    return [(number, raw) for _, number, raw in iter_lines(source)]


def _tied_job(path: Path) -> Path:
    """Two ranks, two incarnations each, phases that tile and children that start at their
    parents' nanosecond: where a cut splits a subtree, only the right order nests."""
    processes = []
    for rank in (0, 1):
        processes += [
            (resource("job", rank, 100 + rank), incarnation(0, 0, 6, queue=5)),
            (resource("job", rank, 200 + rank), incarnation(60, 20, 3)),
        ]
    return write_trace(path, processes)


@pytest.mark.parametrize("count", [2, 3, 7, 40])
def test_the_pieces_hold_every_line_once_numbered_as_in_the_whole_file(
    tmp_path: Path, count: int
) -> None:
    path = _tied_job(tmp_path / "traces.jsonl")
    pieces = split_file(path, count)
    assert 1 < len(pieces) <= count
    assert [line for piece in pieces for line in _lines(piece)] == _lines(path)
    assert pieces[0].start == 0 and pieces[-1].stop is None
    assert all(a.stop == b.start for a, b in itertools.pairwise(pieces))


@pytest.mark.parametrize("count", [2, 7])
def test_pieces_numbered_as_they_are_handed_out_are_numbered_as_the_whole_files(
    tmp_path: Path, count: int
) -> None:
    """``pieces`` leaves the counting of lines to ``numbered`` (run as the pieces go to the
    workers): the same first lines, also for a piece handed out without its predecessor
    and for a file given twice; a reader refuses a piece not numbered yet."""
    path = _tied_job(tmp_path / "traces.jsonl")
    counted = split_file(path, count)
    uncounted = split_file(path, count, count_lines=False)
    assert [piece.first_line for piece in uncounted] == [1] + [0] * (len(counted) - 1)
    assert list(numbered(uncounted)) == counted
    assert list(numbered(uncounted * 2)) == counted * 2
    assert list(numbered(uncounted[-1:])) == counted[-1:]
    with pytest.raises(ValueError, match="not numbered"):
        _lines(uncounted[-1])


def test_a_compressed_or_small_file_stays_whole(tmp_path: Path) -> None:
    path = _tied_job(tmp_path / "traces.jsonl")
    packed = tmp_path / "traces.jsonl.1.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert split_file(packed, 4) == [FilePiece(packed)]
    assert parallel.pieces([path], jobs=4) == [FilePiece(path)]  # far under 32 MB
    assert parallel.pieces([path], jobs=1, min_bytes=1) == [FilePiece(path)]


def test_a_files_share_of_the_pieces_follows_its_size(tmp_path: Path, tiny_pieces: None) -> None:
    big = _tied_job(tmp_path / "big.jsonl")
    small = tmp_path / "small.jsonl"
    small.write_bytes(big.read_bytes()[: big.read_bytes().index(b"\n") + 1])
    work = parallel.pieces([big, small], jobs=4)
    assert [piece.path for piece in work].count(small) == 1
    assert [piece.path for piece in work].count(big) == 4


def test_report_and_check_say_the_same_of_pieces(tmp_path: Path, tiny_pieces: None) -> None:
    path = _tied_job(tmp_path / "traces.jsonl")
    text = path.read_text().splitlines(keepends=True)
    torn = tracegen.line([], rank=0, pid=100)[:-9]
    # a torn write in the middle, as a killed incarnation leaves it
    path.write_text("".join(text[:7]) + torn + "\n" + "".join(text[7:]))
    whole = check.check_files([path], jobs=1)
    with ThreadPoolExecutor(4) as pool:
        cut = check.check_files([path], jobs=5, executor=pool)
        report_cut = format_report(build_report(load_trace([path], jobs=5, executor=pool)))
    assert cut.violations == whole.violations
    assert cut.notes == whole.notes
    assert any(f"{path}:8 " in note for note in cut.notes)  # the whole file's line number
    assert report_cut == format_report(build_report(load_trace([path], jobs=1)))


def test_check_reads_again_only_the_pieces_that_hold_a_killed_incarnations_orphans(
    tmp_path: Path, tiny_pieces: None
) -> None:
    """A killed-and-resumed job's orphans (children of the interval the kill lost) are looked
    up in the piece they were read in, not in a second pass over the whole file; an id
    written twice, whose lines the ids do not say, still means every piece."""
    (path,) = synthetic.write_per_step(
        tmp_path / "traces.jsonl",
        synthetic.Shape(ranks=2, spans=4_000, incarnations=2, per_line=16),
    )
    whole = check.check_files([path], jobs=1)
    assert whole.reread == [FilePiece(path)]
    with ThreadPoolExecutor(4) as pool:
        cut = check.check_files([path], jobs=20, executor=pool)
    assert (cut.violations, cut.notes) == (whole.violations, whole.notes)
    assert any("killed" in note for note in cut.notes)
    assert 1 <= len(cut.reread) <= 2  # one piece per rank's orphans, at most
    assert len(cut.reread) < len(parallel.pieces([path], jobs=20))

    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines + lines[-1:]))  # the last line again: its ids twice
    with ThreadPoolExecutor(4) as pool:
        twice = check.check_files([path], jobs=20, executor=pool)
    assert len(twice.reread) == len(parallel.pieces([path], jobs=20))
    assert any(v.startswith("duplicate-span-id") for v in twice.violations)
    assert twice.violations == check.check_files([path], jobs=1).violations


def test_the_readmes_cluster_recipe_reports_what_one_process_does(
    tmp_path: Path, tiny_pieces: None
) -> None:
    """``megatron/trace/README.md``'s map and merge by hand, on any executor: ``pieces``
    numbers its pieces (only the commands leave that to the hand-out), so ``scan_file``
    reads them as is."""
    import functools

    from megatron.trace.model.builder import TraceBuilder, scan_file

    path = _tied_job(tmp_path / "traces.jsonl")
    work = parallel.pieces([path], jobs=6)
    assert len(work) > 2 and all(piece.first_line > 0 for piece in work)
    with ThreadPoolExecutor(3) as executor:
        summaries = executor.map(scan_file, work)
        report = build_report(functools.reduce(TraceBuilder.merge, summaries).finish())
    assert report == build_report(load_trace([path], jobs=1))


@pytest.mark.parametrize("where", ["executor", "processes"])
def test_damage_in_a_later_piece_names_the_whole_files_line(
    tmp_path: Path, tiny_pieces: None, where: str
) -> None:
    """On a cluster's executor or in this machine's worker processes (which number the
    pieces as they hand them out, and stop handing out at the error)."""
    path = _tied_job(tmp_path / "traces.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    lines[-3] = "not json at all\n"
    path.write_text("".join(lines))
    with pytest.raises(TraceFileDamaged) as raised:
        if where == "executor":
            with ThreadPoolExecutor(4) as pool:
                load_trace([path], jobs=4, executor=pool)
        else:
            load_trace([path], jobs=4)
    assert raised.value.line == len(lines) - 2


@pytest.mark.parametrize("count", [2, 3, 5, 8, 13])
def test_exports_of_pieces_equal_the_whole_files(
    tmp_path: Path, tiny_pieces: None, count: int
) -> None:
    path = _tied_job(tmp_path / "traces.jsonl")
    with ThreadPoolExecutor(4) as pool:
        for fmt, suffix in (("chrome", "json"), ("perfetto", "pftrace")):
            whole, cut = tmp_path / f"whole.{suffix}", tmp_path / f"cut.{suffix}"
            export.export_files([path], whole, fmt, jobs=1)
            written = export.export_files([path], cut, fmt, jobs=count, executor=pool)
            if fmt == "chrome":
                assert cut.read_bytes() == whole.read_bytes()
            else:
                slices = read_slices(cut)[0]
                assert sorted(map(_key, slices)) == sorted(map(_key, read_slices(whole)[0]))
                assert written.events == export.export_files([path], whole, fmt, jobs=1).events
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no part left


def _key(s: Slice) -> tuple[object, ...]:
    return (s.track, s.name, s.ts, s.dur, s.depth, s.parent.name if s.parent else None)


@pytest.mark.parametrize("count", [6, 40])
def test_a_synthetic_week_exports_the_same_slices_in_pieces(
    tmp_path: Path, tiny_pieces: None, count: int
) -> None:
    """40 pieces of 4 tracks: sequence ids pass 127 and 255, where their varints grow."""
    shape = synthetic.Shape(spans=6000, ranks=2, incarnations=2, save_interval=7, per_line=20)
    (path,) = synthetic.write_per_step(tmp_path / "t.jsonl", shape)
    whole, cut = tmp_path / "whole.pftrace", tmp_path / "cut.pftrace"
    export.export_files([path], whole, "perfetto", jobs=1)
    with ThreadPoolExecutor(4) as pool:
        export.export_files([path], cut, "perfetto", jobs=count, executor=pool)
    assert len(parallel.pieces([path], jobs=count)) == count
    assert sorted(map(_key, read_slices(cut)[0])) == sorted(map(_key, read_slices(whole)[0]))


def test_pieces_read_in_parallel_stay_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_pieces: None
) -> None:
    path = _tied_job(tmp_path / "traces.jsonl")
    size = path.stat().st_size
    monkeypatch.setattr(parallel, "MAX_PIECE_BYTES", size // 5)
    assert len(parallel.pieces([path], jobs=2)) == 6  # small, and a multiple of the jobs
    assert len(parallel.pieces([path], jobs=1)) == 1  # read here: nothing crosses a pipe


def test_a_big_file_is_cut_into_as_many_small_pieces_as_it_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_pieces: None
) -> None:
    """No cap on the count, which would make a big file's pieces (and what the merging
    process holds while taking one in) grow with the file."""
    shape = synthetic.Shape(spans=6000, ranks=2, per_line=20)  # 300 lines
    (path,) = synthetic.write_per_step(tmp_path / "t.jsonl", shape)
    size = path.stat().st_size
    monkeypatch.setattr(parallel, "MAX_PIECE_BYTES", size // 50)
    cut = parallel.pieces([path], jobs=2)
    assert len(cut) in (50, 52)  # a multiple of the jobs, each at most a line over the size
    assert max((piece.stop or size) - piece.start for piece in cut) < 2 * size // 50


def test_kept_records_of_a_process_share_one_resource(tmp_path: Path) -> None:
    """Every line decodes its own copy of the resource; the model keeps one."""
    path = _tied_job(tmp_path / "traces.jsonl")
    trace = load_trace([path], jobs=1)
    for inc in trace.incarnations:
        resources = {id(record["resource"]) for record in inc.records}
        assert len(resources) == 1, inc.label


@pytest.mark.parametrize("jobs", [1, 3])
def test_an_export_reads_the_lines_its_first_pass_read_while_a_job_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_pieces: None, jobs: int
) -> None:
    """A running job appends between the two passes (here: a restart, a process the model
    has never seen): the export is of what the first pass read, whole."""
    path = _tied_job(tmp_path / "traces.jsonl")
    before = tmp_path / "before.json"
    export.export_files([path], before, "chrome", jobs=1)
    window_of = export.resolve_window  # resolved between the two passes, from the first's trace

    def window_then_append(*args, **kwargs):
        window = window_of(*args, **kwargs)
        write_trace(path, [(resource("job", 0, 900), incarnation(200, 40, 2))])
        return window

    monkeypatch.setattr(export, "resolve_window", window_then_append)
    during = tmp_path / "during.json"
    with ThreadPoolExecutor(3) as pool:
        export.export_files(
            [path], during, "chrome", jobs=jobs, executor=pool if jobs > 1 else None
        )
    assert during.read_bytes() == before.read_bytes()


def test_a_piece_whose_sequence_ids_need_more_bytes_after_its_head_still_parses(
    tmp_path: Path, tiny_pieces: None
) -> None:
    """One track, 80 pieces: piece 63's head sequence is id 128 (two varint bytes) and its
    own is 127 (one). The packets after the head, in the same batch, must be framed with
    their own sequence's length."""
    shape = synthetic.Shape(spans=4000, ranks=1, save_interval=2, per_line=12)
    (path,) = synthetic.write_per_step(tmp_path / "t.jsonl", shape)
    whole, cut = tmp_path / "whole.pftrace", tmp_path / "cut.pftrace"
    export.export_files([path], whole, "perfetto", jobs=1)
    with ThreadPoolExecutor(4) as pool:
        export.export_files([path], cut, "perfetto", jobs=80, executor=pool)
    assert len(parallel.pieces([path], jobs=80)) == 80
    assert sorted(map(_key, read_slices(cut)[0])) == sorted(map(_key, read_slices(whole)[0]))
