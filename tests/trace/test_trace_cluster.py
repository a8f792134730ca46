"""The files read on a real Dask cluster, and on a ``spawn`` process pool: the same answers.

On a cluster nothing is inherited from this process: the map function and what it
needs travel with each piece, and a worker reads the files itself. So the
commands run here with ``--scheduler`` on a ``LocalCluster`` of two worker
processes (started once for the module), over 256 rank files and over one big
file cut into many pieces, and their output is compared with one process's:
``check`` and ``report --json`` byte for byte, the exports' bytes. The library
API does the same on a ``ProcessPoolExecutor`` that spawns its workers. Without
dask, ``--scheduler`` is one line naming the extra.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import synthetic
import tracegen as g

from megatron.trace import build_report, check_files, load_trace
from megatron.trace.otlp import parallel
from megatron.trace.render.export import export_files

RANKS = 256


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """The address of a LocalCluster of two single-threaded worker processes."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        dashboard_address=None,
        silence_logs=logging.ERROR,
    ) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="module")
def rank_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """256 ranks' files: every seventh rank killed and resumed, every eleventh still cut short."""
    folder = tmp_path_factory.mktemp("ranks")
    files = []
    for rank in range(RANKS):
        path = folder / f"rank{rank:03d}.jsonl"
        if rank % 7 == 0:
            g.write(path, g.lifecycle(0, kill_after=1), g.lifecycle(20, first=2, load=2), rank=rank)
        elif rank % 11 == 0:
            g.write(path, g.lifecycle(0, cut_short_after=1), rank=rank)
        else:
            g.write(path, g.lifecycle(0), rank=rank)
        files.append(path)
    return files


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file of two ranks, killed and resumed, of a few hundred lines."""
    shape = synthetic.Shape(ranks=2, spans=6_000, incarnations=2, save_interval=7, per_line=20)
    (path,) = synthetic.write_per_step(tmp_path_factory.mktemp("big") / "traces.jsonl", shape)
    return path


@pytest.fixture
def tiny_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut files however small they are. Only this process cuts: a worker is handed the
    piece's byte range and line number, so the patch need not reach the workers."""
    monkeypatch.setattr(parallel, "MIN_PIECE_BYTES", 1)


@pytest.mark.needs_extras  # dask
def test_the_library_api_on_a_dask_executor_gives_the_same_answers(
    tmp_path: Path, scheduler: str, rank_files: list[Path], big_file: Path, tiny_pieces: None
) -> None:
    """The README's recipe: ``Client(address).get_executor()`` handed to the library."""
    from distributed import Client

    files = [*rank_files[:64], big_file]
    report = build_report(load_trace(files, jobs=1))
    checked = check_files(files, jobs=1)
    export_files(files, tmp_path / "alone.json", jobs=1)
    with Client(scheduler) as client:
        executor = client.get_executor()
        assert build_report(load_trace(files, jobs=8, executor=executor)) == report
        spread = check_files(files, jobs=8, executor=executor)
        export_files(files, tmp_path / "spread.json", jobs=8, executor=executor)
    assert (spread.violations, spread.notes) == (checked.violations, checked.notes)
    assert (tmp_path / "spread.json").read_bytes() == (tmp_path / "alone.json").read_bytes()


@pytest.mark.needs_extras  # dask
def test_a_spawn_process_pool_through_the_library_gives_the_same_answers(
    tmp_path: Path, rank_files: list[Path], big_file: Path, tiny_pieces: None
) -> None:
    """Spawned workers inherit nothing: no function set before a fork, no patched module."""
    files = [*rank_files[:24], big_file]
    report = build_report(load_trace(files, jobs=1))
    checked = check_files(files, jobs=1)
    export_files(files, tmp_path / "alone.json", jobs=1)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=spawn) as pool:
        assert build_report(load_trace(files, jobs=8, executor=pool)) == report
        spread = check_files(files, jobs=8, executor=pool)
        export_files(files, tmp_path / "spread.json", jobs=8, executor=pool)
    assert (spread.violations, spread.notes) == (checked.violations, checked.notes)
    assert (tmp_path / "spread.json").read_bytes() == (tmp_path / "alone.json").read_bytes()
