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

One file, one core or ``jobs=1``: everything runs in this process, no pool.
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

__all__ = ["default_jobs", "map_files", "map_reduce"]

R = TypeVar("R")


def default_jobs(files: int) -> int:
    """One process per file, at most one per core this process may use."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(files, cores))


def _context() -> Any:
    # fork is cheapest (the workers inherit the imports), but forking a process
    # that runs other threads can copy a lock some thread holds; then start clean.
    if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def map_files(
    function: Callable[[Path], R],
    paths: Sequence[Path | str],
    jobs: int | None = None,
    executor: Executor | None = None,
) -> list[R]:
    """``function(path)`` for every path, in order; in parallel processes when it pays.

    ``function`` must be a module-level function (it is pickled to the
    workers) and its result picklable. ``executor``, when given, runs the
    calls instead of a local pool (and ``jobs`` is ignored).
    """
    files = [Path(path) for path in paths]
    if executor is not None:
        return list(executor.map(function, files))
    jobs = default_jobs(len(files)) if jobs is None else max(1, jobs)
    if jobs == 1 or len(files) < 2:
        return [function(path) for path in files]
    with ProcessPoolExecutor(max_workers=min(jobs, len(files)), mp_context=_context()) as pool:
        return list(pool.map(function, files))


def map_reduce(
    function: Callable[[Path], R],
    merge: Callable[[R, R], R],
    paths: Iterable[Path | str],
    jobs: int | None = None,
    executor: Executor | None = None,
) -> R:
    """:func:`map_files`, then fold the results with the associative ``merge``, in file order."""
    results = map_files(function, list(paths), jobs, executor)
    if not results:
        raise ValueError("no trace files")
    return functools.reduce(merge, results)
