"""What every ``megatron-trace`` subcommand shares: its parser, the FILE arguments, the clock,
and where the files are read (``--jobs`` local processes, or ``--scheduler``: a Dask cluster)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, Executor
from pathlib import Path
from typing import Any

from megatron.trace.analysis.liveness import Clock
from megatron.trace.model.window import parse_duration
from megatron.trace_format.errors import MissingExtraError, TraceError, TraceOutputError
from megatron.trace_format.semconv import STALE_AFTER_S

__all__ = [
    "CONNECT_TIMEOUT_S",
    "add_command",
    "answer",
    "clock",
    "duration",
    "exit_statuses",
    "percent",
    "reading_on",
    "writing",
]

#: How long ``--scheduler tcp://...`` waits for the scheduler before giving up (exit 2).
CONNECT_TIMEOUT_S = 10.0


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"--jobs must be a whole number of processes, 1 or more: {text!r}"
        )
    return value


def _scheduler(text: str) -> str:
    if text.startswith("local:"):
        workers = text.removeprefix("local:")
        if not (workers.isdigit() and int(workers) >= 1):
            raise argparse.ArgumentTypeError(
                f"--scheduler local:N needs N worker processes, 1 or more: {text!r}"
            )
    elif not text:
        raise argparse.ArgumentTypeError("--scheduler needs an address, e.g. tcp://host:8786")
    return text


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def percent(text: str) -> float:
    """A bound in per cent (``--fail-under-goodput 80``, ``--fail-if-slower 5``): 0 or more."""
    try:
        value = float(text.removesuffix("%"))
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a percentage, 0 or more, got {text!r}")
    return value


def duration(text: str) -> int:
    """A duration (``--window 1h``): ``90s``, ``30m``, ``1.5h``, ``2d``, ``500ms``; in ns."""
    ns = parse_duration(text)
    if ns is None:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 90s, 30m, 1.5h or 2d (units ms s m h d), got {text!r}"
        )
    return ns


def say(command: str, text: str) -> None:
    """One line on stderr as every long-running command words its news:
    ``megatron-trace COMMAND: TEXT`` (a warning's text begins ``warning:``)."""
    print(f"megatron-trace {command}: {text}", file=sys.stderr, flush=True)


def answer(command: str, text: str, payload: Any, as_json: bool, gate: str | None) -> int:
    """Print a gated command's answer: its text, then with ``--json`` the JSON object as
    the last line of stdout; then the gate's verdict as the exit status: 1 with its one
    line (on stderr, after the output) when it was crossed, else 0."""
    print(text)
    if as_json:
        print(json.dumps(payload, sort_keys=True))
    if gate is None:
        return 0
    print(f"megatron-trace {command}: {gate}", file=sys.stderr)
    return 1


def _epoch_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected seconds since the epoch, got {text!r}")
    return value


def add_command(
    subparsers: Any,
    name: str,
    help: str,
    description: str,
    run: Callable[[argparse.Namespace], int],
    *,
    finding: str | None = None,
    gate: bool = False,
    files: bool = True,
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` taking ``FILE...`` (trace files); ``run`` gives the exit status.

    Every command also takes ``--jobs``, ``--scheduler`` and the liveness options
    (``--stale-after``, ``--now``): they all say whether the job is still
    running. ``files=False`` leaves the ``FILE...`` arguments to the command (``diff``
    reads two sets). ``finding`` says when the command exits 1 (None: it never does),
    ``gate`` that it is a gate's (a CI bound);
    the help's epilog lists every exit status. Returns the parser, for the
    subcommand's own options.
    """
    parser = subparsers.add_parser(
        name, help=help, description=description, epilog=exit_statuses(finding, gate)
    )
    if files:
        parser.add_argument(
            "files",
            nargs="+",
            type=Path,
            metavar="FILE",
            help="trace files, or folders receive wrote (a job's, or a receiver's holding one job)",
        )
    parser.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N",
        help="read the files in N parallel processes (default: one per file, up to the cores); "
        "with --scheduler, plan for N worker threads (default: the cluster's): the files cut "
        "into pieces as for N processes, handed out in about 2N runs",
    )
    parser.add_argument(
        "--scheduler",
        type=_scheduler,
        default=None,
        metavar="ADDRESS",
        help="read the files on a Dask cluster instead: its scheduler's address "
        "(tcp://host:8786), or local:N for a cluster of N worker processes started here for "
        "this command; every worker must see the files at the same paths (needs the "
        "'cluster' extra)",
    )
    parser.add_argument(
        "--stale-after",
        type=_positive_seconds,
        default=STALE_AFTER_S,
        metavar="SECONDS",
        help="a job not seen to end is running while its newest record is at most this old "
        f"(default {STALE_AFTER_S:g}: three heartbeat periods)",
    )
    parser.add_argument(
        "--now",
        type=_epoch_seconds,
        default=None,
        metavar="EPOCH_SECONDS",
        help="judge that against this time instead of the clock",
    )
    parser.set_defaults(func=run)
    return parser


def add_job_option(parser: argparse.ArgumentParser, live: bool = False) -> None:
    """``--job NAME``: read one job of files that hold several
    (:func:`~megatron.trace.model.jobs.one_job`); ``live``: ``watch``'s, which reads on
    where the others stop (:class:`~megatron.trace.live.job.LiveJob`)."""
    several = (
        "when the files hold several jobs (two launches appended to one file, the later not "
        "resumed from the earlier's checkpoints), "
    )
    if live:
        what = (
            "figure the one NAME names alone (a name the warning naming them gives, or any run "
            "id its launches carry), its series labelled run_id=NAME unless --run-id; no "
            "figures until it is in the files. Without it: the job of the first record read, "
            "and one warning naming the jobs"
        )
    else:
        what = (
            "read the one NAME names: a name the error line gives, or any run id its launches carry"
        )
    parser.add_argument("--job", default=None, metavar="NAME", help=several + what)


def exit_statuses(finding: str | None, gate: bool = False) -> str:
    """The help's epilog: every exit status a command can end with (``finding``: its 1;
    ``gate``: it has a gate, which cannot judge a figure not computed)."""
    one = f"1 {finding}; " if finding else ""
    ungated = ", a gate on a figure not computed" if gate else ""
    return (
        f"exit status: 0 success; {one}2 bad input (a file missing, unreadable or damaged, "
        "no spans, a bad option, a missing optional package, an output that cannot be "
        f"written{ungated}); 141 the output pipe was closed"
    )


def clock(args: argparse.Namespace) -> Clock:
    """The clock ``--now`` and ``--stale-after`` give."""
    return Clock.at(getattr(args, "now", None), getattr(args, "stale_after", None))


@contextlib.contextmanager
def writing(output: Path) -> Iterator[None]:
    """Name ``output`` in what goes wrong writing it: the readers raise their own errors
    (:class:`~megatron.trace_format.errors.TraceInputError`), so an ``OSError`` here is
    the output's. A folder that is not there is said first, naming ``-o``, before any
    reading."""
    if not output.parent.is_dir():
        raise TraceOutputError(
            f"-o {output}: no folder {output.parent} (create it first, or name a file in "
            "an existing folder)"
        )
    try:
        yield
    except OSError as error:
        raise TraceOutputError(f"cannot write {output}: {error.strerror or error}") from error


def _local_cluster(workers: int) -> Any:
    """``--scheduler local:N``: N single-threaded worker processes, with glibc's own
    allocator settings, as the local pool's processes have.

    Dask starts its workers with ``MALLOC_TRIM_THRESHOLD_`` set (its config
    ``distributed.nanny.pre-spawn-environ``), so that a long-lived worker hands freed
    memory back; that also fixes glibc's mmap threshold at 128 KB, and every line of a
    trace file longer (a per-step line of 500 spans: 160 KB) is mapped and unmapped
    again, the heap trimmed after it: reading took a tenth longer. A cluster that lives
    for one command has nothing to hand back for long. (A value set in this process's
    environment still reaches the workers: they inherit it.)
    """
    import dask.config
    import distributed

    unset = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}
    with dask.config.set(unset):  # read as the workers' nannies are made, here
        return distributed.LocalCluster(
            n_workers=workers,
            processes=True,
            threads_per_worker=1,
            dashboard_address=":0",  # (None still takes 8787: two clusters would clash)
            silence_logs=logging.ERROR,
        )


@contextlib.contextmanager
def reading_on(args: argparse.Namespace) -> Iterator[tuple[int | None, Executor | None]]:
    """Where the command reads its files: ``(jobs, executor)`` for the library's calls.

    Without ``--scheduler``: ``--jobs`` local processes, no executor. With it: the Dask
    cluster's executor, and as many jobs as its workers have threads (or ``--jobs``);
    a ``local:N`` cluster lives as long as this block. A scheduler that cannot be
    reached, or a cluster that loses the work beyond Dask's own retries (a worker that
    dies is replaced, its pieces run again), is one :class:`TraceError` (exit 2) raised
    before anything is printed: the commands print once the whole answer is in.
    """
    address = getattr(args, "scheduler", None)
    jobs = getattr(args, "jobs", None)
    if address is None:
        yield jobs, None
        return
    try:
        import distributed
        from distributed.comm.core import CommClosedError
    except ImportError:
        raise MissingExtraError("--scheduler", "dask.distributed", "cluster") from None
    with contextlib.ExitStack() as stack:
        try:
            if address.startswith("local:"):
                cluster = stack.enter_context(_local_cluster(int(address.removeprefix("local:"))))
                client = stack.enter_context(distributed.Client(cluster))
            else:
                client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S)
                stack.enter_context(client)
        except (OSError, TimeoutError) as error:
            raise TraceError(f"cannot reach the Dask scheduler at {address}: {error}") from None
        if jobs is None:
            jobs = max(1, sum(client.nthreads().values()))
        try:
            yield jobs, client.get_executor(pure=False)
        except (distributed.KilledWorker, CommClosedError, CancelledError) as error:
            raise TraceError(
                f"the Dask cluster at {address} lost the work "
                f"({type(error).__name__}: {error or 'cancelled'}); no answer"
            ) from None
