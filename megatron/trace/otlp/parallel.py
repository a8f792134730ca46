"""Read several trace files at once: map each file in its own process, merge in file order.

A job of many ranks writes a file per rank, and reading is CPU-bound JSON
decoding, so ``megatron-trace`` maps each file to a small summary (the trace
model's per-process aggregates; for ``check`` also the file's span ids) in a
pool of processes and merges the summaries in file order. Every summary type
has an associative ``merge``, so the grouping does not matter: the same map
function can run on any ``concurrent.futures.Executor`` — a local process
pool here, or a cluster's (Dask's ``Client.get_executor()``, Ray's, an MPI
pool) — and the merge is a fold (:func:`functools.reduce`) wherever the
results land. ``megatron/trace/README.md``, "On a cluster", says how. On such an
executor the pieces go out in runs, about two per job (:func:`run_sizes`), and with a
merge each worker merges its run's summaries before sending one back: a call costs a
cluster's scheduler and workers a few milliseconds, one per file was dear.

A big plain file is cut into pieces at line ends (:func:`pieces`), each
piece mapped like a file of its own, so one ``all_ranks`` file of many
gigabytes uses every core too; a piece reports the line numbers of its whole
file, and pieces merge like files (in order). Compressed files stay whole.

One piece, one core or ``jobs=1``: everything runs in this process, no pool.
With no more pieces than jobs this process reads the first piece itself while
the workers read the others.
"""

from __future__ import annotations

import collections
import functools
import itertools
import multiprocessing
import os
import pickle
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from megatron.trace.otlp.reader import paused_gc
from megatron.trace_format.errors import TraceInputError
from megatron.trace_format.files import FilePiece, numbered, split_file

__all__ = [
    "MAX_PIECE_BYTES",
    "MIN_PIECE_BYTES",
    "FilePiece",
    "default_jobs",
    "imap_files",
    "map_files",
    "map_reduce",
    "pieces",
]

#: A file is cut only into pieces of at least this size: below it a worker
#: process costs more than it saves.
MIN_PIECE_BYTES = 32 * 2**20
#: ... and, read in parallel, into pieces of at most this size, however big the
#: file (a 3 GB file: 96 pieces): a piece's summary crosses a pipe to the merging
#: process whole, and while a few are in flight their size is what the merging
#: process holds beyond the merged model. So the same size whatever the file's,
#: and a read's peak does not grow with the file (the bench's growth keys); merging
#: costs the same per piece whatever their count.
MAX_PIECE_BYTES = 32 * 2**20

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
    paths: Sequence[Path | str],
    jobs: int | None = None,
    min_bytes: int | None = None,
    count_lines: bool = True,
) -> list[FilePiece]:
    """The files cut into about ``jobs`` (default: the cores) pieces of work, in file order.

    Each file gets a share of the pieces by its size; no piece is smaller than
    ``min_bytes`` (default :data:`MIN_PIECE_BYTES`), nor bigger than
    :data:`MAX_PIECE_BYTES` where a bigger one would be; with one job every
    file is one piece (it is read in this process, nothing crosses a pipe).
    ``count_lines=False`` leaves the pieces' first line numbers to be counted as
    :func:`imap_files` hands them out (see :func:`numbered`), where the counting
    of a big file runs while its first pieces are read instead of before.
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
        if jobs > 1:
            small = -(-size // MAX_PIECE_BYTES)
            small = -(-small // jobs) * jobs  # a multiple of the jobs: none idles at the end
            share = max(share, small)
        count = min(share, size // max(min_bytes, 1))
        cut = split_file(path, count, count_lines) if count > 1 else [FilePiece(path)]
        result.extend(cut)
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
    return list(imap_files(function, paths, jobs, executor))


def imap_files(
    function: Callable[[Any], R],
    paths: Sequence[Path | str | FilePiece],
    jobs: int | None = None,
    executor: Executor | None = None,
    merge: Callable[[R, R], R] | None = None,
) -> Iterator[R]:
    """:func:`map_files`, each result given as soon as it and those before it are in: a
    fold over it holds the results it has not merged yet, not all of them.

    On an ``executor`` each call reads a run of consecutive pieces (:func:`run_sizes`),
    and with ``merge`` (associative) gives their results merged in order: then a result
    comes for each run, not each piece, and a fold over them with ``merge`` is the same.
    (Here and in a local pool ``merge`` is not used: a result comes for each piece.)"""
    files = [path if isinstance(path, FilePiece) else Path(path) for path in paths]
    # a piece of :func:`pieces` is given its first line number just before it is handed
    # out: the counting overlaps the reading of the pieces handed out before
    work = _numbered(files)
    if executor is not None:
        yield from _on_executor(executor, function, work, len(files), jobs, merge)
        return
    jobs = default_jobs(len(files)) if jobs is None else max(1, jobs)
    if jobs == 1 or len(files) < 2:
        for path in work:
            yield function(path)
        return
    context = _context()
    forked = context.get_start_method() == "fork"
    global _inherited
    if forked:
        # Forked workers inherit the function: only the paths cross the pipe. (An
        # export's function carries the whole trace model, which pickling per task
        # cost more than the parallel read saved.)
        _inherited = function
    try:
        # The results are unpickled here: with the collector paused, as when they were
        # read (millions of small containers, no cycles; collecting doubled the time).
        # One piece per job: this process reads the first itself, while the workers read
        # the rest (one process fewer to fork, one summary fewer to pickle and take in).
        local = [next(work)] if len(files) <= jobs else []
        workers = min(jobs, len(files)) - len(local)
        with (
            paused_gc(),
            ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool,
        ):
            # one piece waits for the first worker to be free, so none idles
            later = _in_order(pool, _call_inherited if forked else function, work, workers + 1)
            for path in local:
                yield function(path)
            yield from later
        _give_back_free_memory()  # the caller has folded every result in by now
    finally:
        if forked:
            _inherited = None


def _on_executor(
    executor: Executor,
    function: Callable[[Any], R],
    work: Iterator[Any],
    count: int,
    jobs: int | None,
    merge: Callable[[R, R], R] | None,
) -> Iterator[R]:
    """The calls on a caller's executor: the pieces in runs (:func:`run_sizes`), each run
    submitted as its pieces are numbered (not ``executor.map`` over the generator, which
    Dask refuses), the results taken in order: one per piece, or with ``merge`` one per run.

    Nothing is inherited there: ``function`` travels with every call (so it must
    pickle), wrapped so that a file a worker cannot open is named with the worker."""
    remote = _Remote(function, merge)
    sizes = run_sizes(count, jobs)
    runs = (list(itertools.islice(work, size)) for size in sizes)
    try:
        for result in _in_order(executor, remote, runs, len(sizes)):
            if merge is None:
                yield from result
            else:
                yield result
    finally:  # an executor in this process (threads) unpickled it here
        _unpickled.pop(remote.key, None)


#: Calls per job on a caller's executor. Each call costs the cluster's scheduler, the
#: worker and this process a fixed overhead, on cores the reading needs, of the order of
#: reading a rank file: so a call reads a run of consecutive pieces, not one file. Two
#: runs per job, not one, leave a run for a worker that is done first to take (Dask
#: steals queued work). The benchmarks' ``cluster`` section measures the choice.
RUNS_PER_JOB = 2


def run_sizes(count: int, jobs: int | None) -> list[int]:
    """How many consecutive pieces each call on an executor takes, in order: ``count``
    pieces in :data:`RUNS_PER_JOB` runs per job (no more runs than pieces), the runs'
    sizes differing by one at most, the longer first. Without ``jobs`` (how many the
    executor runs at once is not known) one piece a call."""
    if jobs is None:
        return [1] * count
    runs = min(count, RUNS_PER_JOB * max(1, jobs))
    if runs == 0:
        return []
    size, longer = divmod(count, runs)
    return [size + 1] * longer + [size] * (runs - longer)


class _Remote:
    """``function`` as a call on some other process or machine (picklable), over a run of
    consecutive items: their results (a list), or with ``merge`` (associative) those
    merged in order, so one summary crosses back for the run. An ``OSError`` there (a
    file that worker cannot see) becomes a :class:`TraceInputError` naming the file and
    the worker, which crosses back intact.

    ``function`` and ``merge`` are pickled once, here, and each call carries those
    bytes: a worker unpickles them on its first call and keeps them for the calls after
    (:data:`_unpickled`). An export's function holds the trace's lanes, whose pickling
    per call cost more than reading the pieces; bytes are copied, not pickled again.
    """

    def __init__(
        self, function: Callable[[Any], Any], merge: Callable[[Any, Any], Any] | None = None
    ) -> None:
        self.key = uuid.uuid4().hex
        # what Dask names the tasks by (scan_file-…), in its dashboard and logs
        self.__name__ = getattr(function, "__name__", type(function).__name__)
        try:  # cloudpickle (Dask's) also carries a function of a script's __main__
            from cloudpickle import dumps
        except ImportError:
            dumps = pickle.dumps
        try:
            self.functions: Any = dumps((function, merge), pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, AttributeError, TypeError):  # the executor's own
            self.functions = (function, merge)  # serializer may manage it

    def __call__(self, items: list[Any]) -> Any:
        functions = self.functions
        if isinstance(functions, bytes):
            functions = _unpickled.get(self.key)
            if functions is None:
                functions = pickle.loads(self.functions)
                while len(_unpickled) >= 2:  # a long-lived worker keeps the newest ones only
                    _unpickled.pop(next(iter(_unpickled)), None)
                _unpickled[self.key] = functions
        function, merge = functions
        results = (self._one(function, item) for item in items)
        return list(results) if merge is None else functools.reduce(merge, results)

    @staticmethod
    def _one(function: Callable[[Any], Any], item: Any) -> Any:
        try:
            return function(item)
        except OSError as error:
            raise _unreadable(item, error) from None
        except TraceInputError as error:
            if isinstance(error.__cause__, OSError):  # the reader's own wording, from reading()
                raise _unreadable(item, error.__cause__) from None
            raise


def _unreadable(item: Any, error: OSError) -> TraceInputError:
    name = error.filename or (item.path if isinstance(item, FilePiece) else item)
    return TraceInputError(
        f"{name}: {error.strerror or error} on the worker at {_worker()} (every worker must "
        "see the trace files, and an export's output directory, at the same paths)"
    )


def _worker() -> str:
    """This worker's address: Dask's, when this is a Dask worker; else host and pid."""
    distributed = sys.modules.get("distributed")
    if distributed is not None:
        try:
            return str(distributed.get_worker().address)
        except ValueError:  # not in a Dask worker
            pass
    return f"{socket.gethostname()} (pid {os.getpid()})"


def _give_back_free_memory() -> None:
    """Hand the pages the results' transfer left free back to the system.

    Each result arrives as one pickle of several MB, unpickled into objects
    that live on beside the freed buffer; glibc's allocator keeps such holes
    (a third of the merged model's size at ten million spans) until told to
    release them. ``malloc_trim`` does (Dask's workers call it for the same
    reason); elsewhere than glibc there is none, and nothing is done.
    """
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def _in_order(
    pool: Executor, function: Callable[[Any], R], work: Iterator[Any], ahead: int
) -> Iterator[R]:
    """``pool.map(function, work)`` with at most ``ahead`` calls handed out and not taken
    back: the next piece is numbered (its file's lines counted) and handed out as each
    result is taken, so finished summaries do not pile up here meanwhile.

    The first ``ahead`` are handed out now, before the first result is asked for (the
    caller may read a piece of its own meanwhile)."""
    pending = collections.deque(
        pool.submit(function, item) for item in itertools.islice(work, ahead)
    )
    return _results(pool, function, work, pending)


def _results(
    pool: Executor,
    function: Callable[[Any], R],
    work: Iterator[Any],
    pending: collections.deque[Future[R]],
) -> Iterator[R]:
    try:
        while pending:
            future = pending.popleft()
            pending.extend(pool.submit(function, item) for item in itertools.islice(work, 1))
            yield future.result()
            del future  # (its result is the caller's now)
    finally:  # an error, or a caller that stopped early: the rest need not run
        for future in pending:
            future.cancel()


def _numbered(files: list[Path | FilePiece]) -> Iterator[Path | FilePiece]:
    """The files and pieces in order, each piece numbered (:func:`numbered`)."""
    pieces = (item for item in files if isinstance(item, FilePiece))
    numbering = numbered(pieces)
    for item in files:
        yield next(numbering) if isinstance(item, FilePiece) else item


#: The functions a worker of a caller's executor has unpickled, by the call they belong
#: to (:class:`_Remote`): filled from the calls' own arguments, never inherited.
_unpickled: dict[str, Callable[[Any], Any]] = {}

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
    """:func:`map_files`, then fold the results with the associative ``merge``, in file
    order, each as it comes in (so the fold holds little more than its result). On an
    ``executor`` each worker merges the results of its run first (:func:`imap_files`):
    one summary crosses back a run, and this process merges a run's, not a piece's."""
    results = imap_files(function, list(paths), jobs, executor, merge)
    first = next(results, _NOTHING)
    if first is _NOTHING:
        raise ValueError("no trace files")
    return functools.reduce(merge, results, first)


_NOTHING: Any = object()
