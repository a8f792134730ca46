"""Read several trace files at once: map each file in its own process, merge in file order.

A job of many ranks writes a file per rank, and reading is CPU-bound JSON
decoding, so ``megatron-trace`` maps each file to a small summary (the trace
model's per-process aggregates; for ``check`` also the file's span ids) in a
pool of processes and merges the summaries in file order. Every summary type
has an associative ``merge``, so the grouping does not matter: the same map
function can run on any ``concurrent.futures.Executor`` — a local process
pool here, or a cluster's (Dask's ``Client.get_executor()``, Ray's, an MPI
pool) — and the merge is a fold (:func:`functools.reduce`) wherever the
results land. The README says how.

A big plain file is cut into pieces at line ends (:func:`pieces`), each
piece mapped like a file of its own, so one ``all_ranks`` file of many
gigabytes uses every core too; a piece reports the line numbers of its whole
file, and pieces merge like files (in order). Compressed files stay whole.

One piece, one core or ``jobs=1``: everything runs in this process, no pool.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from megatron.core.telemetry.reader import paused_gc
from megatron.core.telemetry.trace_files import FilePiece, split_file

__all__ = ["MIN_PIECE_BYTES", "FilePiece", "default_jobs", "map_files", "map_reduce", "pieces"]

#: A file is cut only into pieces of at least this size: below it a worker
#: process costs more than it saves.
MIN_PIECE_BYTES = 32 * 2**20

R = TypeVar("R")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_jobs(files: int) -> int:
    """One process per file (or piece), at most one per core this process may use."""
    return max(1, min(files, _cores()))


def pieces(
    paths: Sequence[Path | str], jobs: int | None = None, min_bytes: int | None = None
) -> list[FilePiece]:
    """The files cut into about ``jobs`` (default: the cores) pieces of work, in file order.

    Each file gets a share of the pieces by its size, and no piece is smaller
    than ``min_bytes`` (default :data:`MIN_PIECE_BYTES`); with one job every file
    is one piece.
    """
    min_bytes = MIN_PIECE_BYTES if min_bytes is None else min_bytes
    files = [Path(path) for path in paths]
    jobs = _cores() if jobs is None else max(1, jobs)
    sizes = []
    for path in files:
        try:
            sizes.append(path.stat().st_size)
        except OSError:
            sizes.append(0)  # the reader names the file and the error
    total = sum(sizes)
    result: list[FilePiece] = []
    for path, size in zip(files, sizes, strict=True):
        share = -(-jobs * size // total) if jobs > 1 and total else 1
        count = min(share, size // max(min_bytes, 1))
        result.extend(split_file(path, count) if count > 1 else [FilePiece(path)])
    return result


def _context() -> Any:
    # fork is cheapest (the workers inherit the imports), but forking a process
    # that runs other threads can copy a lock some thread holds; then start clean.
    if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def map_files(
    function: Callable[[Any], R],
    paths: Sequence[Path | str | FilePiece],
    jobs: int | None = None,
    executor: Executor | None = None,
) -> list[R]:
    """``function(path)`` for every path (or piece), in order; in parallel processes when
    it pays.

    ``function`` must be a module-level function (it is pickled to the
    workers) and its result picklable. ``executor``, when given, runs the
    calls instead of a local pool (and ``jobs`` is ignored).
    """
    files = [path if isinstance(path, FilePiece) else Path(path) for path in paths]
    if executor is not None:
        return list(executor.map(function, files))
    jobs = default_jobs(len(files)) if jobs is None else max(1, jobs)
    if jobs == 1 or len(files) < 2:
        return [function(path) for path in files]
    context = _context()
    # The results are unpickled here: with the collector paused, as when they were read
    # (millions of small containers, no cycles; collecting would double the unpickling).
    if context.get_start_method() != "fork":
        with (
            paused_gc(),
            ProcessPoolExecutor(max_workers=min(jobs, len(files)), mp_context=context) as pool,
        ):
            return list(pool.map(function, files))
    # Forked workers inherit the function: only the paths cross the pipe. (An export's
    # function carries the whole trace model, which pickling per task cost more than
    # the parallel read saved.)
    global _inherited
    _inherited = function
    try:
        with (
            paused_gc(),
            ProcessPoolExecutor(max_workers=min(jobs, len(files)), mp_context=context) as pool,
        ):
            return list(pool.map(_call_inherited, files))
    finally:
        _inherited = None


#: The function forked workers of :func:`map_files` call (set before they fork).
_inherited: Callable[[Any], Any] | None = None


def _call_inherited(path: Any) -> Any:
    if _inherited is None:  # only map_files forks these workers, after setting it
        raise RuntimeError("map_files: a worker that was not forked by map_files")
    return _inherited(path)


def map_reduce(
    function: Callable[[Any], R],
    merge: Callable[[R, R], R],
    paths: Iterable[Path | str | FilePiece],
    jobs: int | None = None,
    executor: Executor | None = None,
) -> R:
    """:func:`map_files`, then fold the results with the associative ``merge``, in file order."""
    results = map_files(function, list(paths), jobs, executor)
    if not results:
        raise ValueError("no trace files")
    return functools.reduce(merge, results)
