"""A job's figures while it runs, from its files as they grow (``megatron-trace watch``).

:class:`LiveJob` takes the new lines of the trace files (from
:class:`~megatron.trace.live.follow.Follower`), decodes each once into the
same :class:`~megatron.trace.model.builder.TraceBuilder` ``report`` fills
(:class:`~megatron.trace.live.growing.GrowingTrace`), and keeps it: what it
holds is the model's compact summary (structural spans, three integer columns
per iteration), never the lines. :meth:`LiveJob.snapshot`
finishes that summary into a :class:`~megatron.trace.model.incarnation.Trace` and
computes the figures with ``report``'s own code, per rank: the accounting
(:func:`~megatron.trace.analysis.accounting.rank_accounting`), the liveness rule
(:func:`~megatron.trace.analysis.liveness.judge`), the stragglers and the
watchdog's hangs.

A week-long job must not make the scrapes slower: each costs what changed
since the last one, not the job's history. The builder's finish places only
the records added since (:meth:`~megatron.trace.model.builder.TraceBuilder.finish`);
each rank's accounting keeps the time that can no longer change and sweeps
only what came after it (:class:`~megatron.trace.live.accounting.LiveAccounting`);
each rank's median work for the straggler scores is followed as its
iterations come (:class:`~megatron.trace.live.stragglers.LiveStragglers`);
the rolling median reads only the last iterations. Whatever is kept, the
figures are the ones a fresh read of the same lines gives (``report``'s).

The job's **state** per rank (its last incarnation):

* ``running``: ``report``'s liveness rule says so;
* ``finished``: its spans show it ended (shut down, failed, interrupted or cut short);
* ``stalled``: not running, and its spans show no ending (``report`` says
  ``killed``: its in-flight work never reached the file), for less than
  ``killed_after`` since its newest record (span end or metric point): a job
  that stopped writing, dead or stuck;
* ``killed``: the same, for ``killed_after`` or longer.

A **hang is suspected** on a running rank whose iterations stopped: its
newest finished iteration ended more than ``max(floor, factor × median)``
ago, the median over its last :data:`ROLLING_ITERATIONS` iterations (the
hang watchdog's own bound, 10 × at least 300 s, by default); or when the
watchdog recorded a stall it did not recover from. Without iteration spans
or loop passes and without a watchdog record, it is not computed (``None``).

The **iteration time** is that rolling median, else the newest intervals' time
over the iterations they covered (:func:`_iteration_time`), with its source.

The **run id** every series is labelled with is fixed by the first record
read and never changes after (two sets of series for one job, or two jobs
starting together under one name, are what a later choice would give): the
one given (``--run-id``), else the job named (``--job``), else the first span
batch's resource attributes (:data:`RUN_ID_KEYS`, in order, then
``service.instance.id`` less its ``-rank<N>``), else the first trace file's folder
(the one above a ``rank<N>`` folder).

**One job's figures**, never two jobs' mixed, when the files hold several
(:mod:`megatron.trace.model.jobs`: the collector's file exporter appends every job to one
file): the one named (``--job``: until it is in the files, none), else the job of the
first record read, the one the run id names. :attr:`LiveJob.jobs_note` says which, naming
the jobs.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron.trace.analysis.hangs import find_hang
from megatron.trace.analysis.liveness import Beat, Clock, judge, newest_beats
from megatron.trace.live.accounting import LiveAccounting
from megatron.trace.live.facts import FactsCaches
from megatron.trace.live.growing import GrowingTrace
from megatron.trace.live.stragglers import LiveStragglers
from megatron.trace.model.builder import TraceBuilder, refuse_spans_read_twice
from megatron.trace.model.incarnation import Incarnation, Trace
from megatron.trace.model.jobs import job_named, job_trace, jobs_in, several_jobs
from megatron.trace.otlp.reader import decode_line
from megatron.trace_format.errors import TraceFileDamaged
from megatron.trace_format.jobs import job_of
from megatron.trace_format.semconv import (
    BADPUT_CATEGORIES,
    ITERATION_TIME_SOURCES,
    NEMO_LENS_RUN_UUID,
    NEMO_RUN_ID,
    RUN_ID,
    SERVICE_INSTANCE_ID,
    SLURM_JOB_ID,
    Category,
)

__all__ = [
    "HANG_FACTOR",
    "HANG_FLOOR_S",
    "ROLLING_ITERATIONS",
    "RUN_ID_KEYS",
    "STATES",
    "LiveJob",
    "RankFigures",
    "Snapshot",
    "snapshots",
]

_logger = logging.getLogger(__name__)

#: The iterations the rolling median iteration time is taken over.
ROLLING_ITERATIONS = 20
#: A hang is suspected past ``max(HANG_FLOOR_S, HANG_FACTOR × rolling median)``.
HANG_FACTOR = 10.0
HANG_FLOOR_S = 300.0
#: A job that stopped without an ending reads stalled for this long, then killed.
KILLED_AFTER_S = 300.0
STATES = ("running", "finished", "stalled", "killed")
_FINISHED = frozenset({"shutdown", "failed", "interrupted", "cut_short"})
#: The resource attributes that name a run, the same on each of its ranks, in the order
#: they are tried.
RUN_ID_KEYS = (RUN_ID, NEMO_RUN_ID, NEMO_LENS_RUN_UUID, SLURM_JOB_ID)
_RANK_SUFFIX = re.compile(r"-rank\d+$")


@dataclass(frozen=True)
class RankFigures:
    """One rank's live figures (seconds; ``None``: not computed)."""

    rank: str
    state: str
    ended: str
    wall_s: float
    goodput_s: float
    badput_s: dict[str, float]
    iteration: int | None
    iteration_time_s: float | None
    hang_suspected: bool | None
    hang_s: float | None
    straggler_score: float | None
    #: what ``iteration_time_s`` was taken from (one of ``ITERATION_TIME_SOURCES``)
    iteration_time_source: str | None = None
    #: whether report's straggler rule names the rank (``None``: scores not computed)
    straggler: bool | None = None


@dataclass(frozen=True)
class Snapshot:
    """The job's figures at ``now_ns``; ``ranks`` in rank order, the job's rank first."""

    run_id: str
    now_ns: int
    ranks: list[RankFigures]
    spans: int
    lines: int
    corrupt_lines: int
    torn_lines: int

    @property
    def job_state(self) -> str:
        return self.ranks[0].state if self.ranks else "running"


@dataclass
class LiveJob:
    """The accumulated summary of a job's trace files, and its figures on demand."""

    trace_files: Sequence[Path]
    run_id: str | None = None
    hang_factor: float = HANG_FACTOR
    hang_floor_s: float = HANG_FLOOR_S
    killed_after_s: float = KILLED_AFTER_S
    #: the job to figure when the files hold several (a name :attr:`jobs_note` gives, or
    #: any run id its launches carry); None: the job of the first record read
    job: str | None = None
    growing: GrowingTrace = field(default_factory=GrowingTrace)
    corrupt_lines: int = 0
    lines: int = 0
    #: what the last snapshot found of the jobs the files hold, in one line (None: one job,
    #: the one figured): several, and which is figured; or the job named not among them
    jobs_note: str | None = None
    _first_job: str | None = field(default=None, repr=False)  # the first record's job
    # what the scrapes keep between them: each rank's accounting, and the ranks' work
    # (so a scrape costs what changed since the last one)
    _accounting: dict[str, LiveAccounting] = field(default_factory=dict, repr=False)
    _stragglers: LiveStragglers = field(default_factory=LiveStragglers, repr=False)
    _facts: FactsCaches = field(default_factory=FactsCaches, repr=False)

    def __post_init__(self) -> None:
        if self.run_id is None:
            self.run_id = self.job

    @property
    def builder(self) -> TraceBuilder:
        """The model's builder, holding every span added so far."""
        return self.growing.builder

    def add_lines(self, lines: Iterable[tuple[Path, int, bytes]]) -> int:
        """Decode and add each line; a damaged one is counted, warned about and skipped.
        Returns how many lines were added."""
        added = 0
        growing = self.growing
        for path, number, raw in lines:
            self.lines += 1
            try:
                line = decode_line(path, number, raw, growing.builder.stats)
                if line is not None:
                    if self._first_job is None:  # the first record: its run id and its job
                        resource = line.batches[0].resource if line.batches else {}
                        self._first_job = job_of(resource) or ""
                        if self.run_id is None:
                            self.run_id = _run_id(resource)
                            self.run_id = self.run_id or _folder_run_id(self.trace_files or [path])
                    growing.add_line(line)
            except TraceFileDamaged as error:
                self.corrupt_lines += 1
                _logger.warning("skipped a damaged line: %s", error)
                continue
            added += 1
        return added

    def snapshot(self, clock: Clock) -> Snapshot | None:
        """The figures as of ``clock``; ``None`` before the first span. Raises
        :class:`~megatron.trace_format.errors.SpansReadTwiceError` once the files hold one
        span twice (every figure would count it twice), and from then on."""
        if not self.builder.span_count:
            return None
        finish = self.growing.finish()
        refuse_spans_read_twice(self.builder)
        self._facts.attach(finish)
        trace = self._one_job(finish.trace)
        if trace is None:
            return None
        finish = dataclasses.replace(finish, trace=trace)
        liveness = judge(trace, list(self.trace_files), clock)
        scores = self._stragglers(finish)
        last_records = _newest_records(trace, liveness.metrics_files)
        ranks = []
        for rank, incs in trace.ranks.items():
            accounting = self._accounting.setdefault(rank, LiveAccounting())(incs, finish)
            totals = accounting["totals_ns"]
            last = incs[-1]
            median, since = _rolling(last, clock.now_ns)
            suspected, hang_s = self._hang(last, median, since, clock.now_ns)
            time_s, source = _iteration_time(last, median)
            ranks.append(
                RankFigures(
                    rank=rank,
                    state=self._state(last, last_records, clock),
                    ended=last.ended,
                    wall_s=accounting["wall_ns"] / 1e9,
                    goodput_s=totals[Category.GOODPUT] / 1e9,
                    badput_s={c: totals[c] / 1e9 for c in BADPUT_CATEGORIES},
                    iteration=_iteration(last),
                    iteration_time_s=time_s,
                    iteration_time_source=source,
                    hang_suspected=suspected,
                    hang_s=hang_s,
                    straggler_score=scores.get(rank),
                    straggler=self._stragglers.flagged.get(rank),
                )
            )
        return Snapshot(
            run_id=self.run_id or _folder_run_id(self.trace_files),
            now_ns=clock.now_ns,
            ranks=ranks,
            spans=trace.span_count,
            lines=self.lines,
            corrupt_lines=self.corrupt_lines,
            torn_lines=len(trace.stats.torn),
        )

    def _one_job(self, trace: Trace) -> Trace | None:
        """The trace of the job to figure (class doc), and :attr:`jobs_note` said of it;
        None while the job named is not in the files."""
        jobs = jobs_in(trace)
        names = ", ".join(job.name for job in jobs)
        self.jobs_note = None
        if self.job is not None:
            index = job_named(jobs, self.job)
            if index is None:
                self.jobs_note = (
                    f"--job {self.job}: the files hold no such job yet (they hold {names}); no "
                    "figures until they do"
                )
                return None
        elif len(jobs) > 1:
            index = job_named(jobs, self._first_job or "") or 0
            others = [job.name for position, job in enumerate(jobs) if position != index]
            self.jobs_note = (
                f"{several_jobs(jobs)}; the figures are {jobs[index].name}'s alone (the job of "
                f"the first record read): watch another with --job {others[-1]}"
            )
        else:
            return trace
        return trace if len(jobs) == 1 else job_trace(trace, jobs, index)

    def _state(self, inc: Incarnation, newest: dict[Any, Beat], clock: Clock) -> str:
        if inc.ended == "running":
            return "running"
        if inc.ended in _FINISHED:
            return "finished"
        beat = newest.get(inc.process)
        quiet_ns = clock.now_ns - max(inc.end_ns, beat.time_ns if beat is not None else 0)
        # a cycle of an in-process restart ended: NVRx is bringing up the next one in the
        # same process, whose telemetry is still up (its newest heartbeat not 0)
        restarting = inc.ended == "restarted" and (beat is None or beat.running is not False)
        if restarting and quiet_ns <= clock.stale_after_ns:
            return "running"
        return "killed" if quiet_ns / 1e9 >= self.killed_after_s else "stalled"

    def _hang(
        self, inc: Incarnation, median: float | None, since_s: float | None, now_ns: int
    ) -> tuple[bool | None, float | None]:
        if inc.ended != "running":
            return (False, 0.0) if median is not None or inc.hangs else (None, None)
        hang = find_hang(inc)
        if hang is not None:
            return True, max(0.0, (now_ns - hang.start_ns) / 1e9)
        if median is None or since_s is None:
            return None, None
        bound = max(self.hang_floor_s, self.hang_factor * median)
        if since_s > bound:
            return True, since_s
        return False, 0.0


def snapshots(found: Snapshot | Sequence[Snapshot] | None) -> list[Snapshot]:
    """What a ``snapshot()`` callable returned, as a list: one job's figures (or ``None``
    before its first span), or several jobs' (``watch --receive``: one per job)."""
    if found is None:
        return []
    if isinstance(found, Snapshot):
        return [found]
    return list(found)


def _rolling(inc: Incarnation, now_ns: int) -> tuple[float | None, float | None]:
    """The median of the incarnation's last loop passes (s) and the seconds since its newest
    sign of progress (``None``, ``None`` when it shows no passes).

    A pass is an iteration span (the ``per_step`` groups), from its start to its end; the
    progress, the newest one's end. Without iteration spans (the ``default`` groups),
    Megatron-LM still opens ``megatron.checkpoint.save.finalize`` at the top of every loop
    pass (the ``checkpoint`` group): a pass is then the time from one finalize's start to
    the next, and the progress, the newest one's start.
    """
    count = len(inc.iterations)
    if count:
        tail = inc.iterations.slice(max(0, count - ROLLING_ITERATIONS), count)
        starts, ends = tail.starts, tail.ends
        median = statistics.median(end - start for start, end in zip(starts, ends, strict=True))
        return median / 1e9, max(0, now_ns - max(ends)) / 1e9
    # read order is nearly time order: the newest passes are among the last written
    finalizes = sorted(inc.finalize_starts[-2 * ROLLING_ITERATIONS :])
    if len(finalizes) < 3:
        return None, None
    recent = finalizes[-(ROLLING_ITERATIONS + 1) :]
    median = statistics.median(b - a for a, b in itertools.pairwise(recent))
    return median / 1e9, max(0, now_ns - recent[-1]) / 1e9


def _iteration_time(inc: Incarnation, median: float | None) -> tuple[float | None, str | None]:
    """The incarnation's recent time per iteration (s) and its source
    (:data:`~megatron.trace_format.semconv.ITERATION_TIME_SOURCES`): ``median``, the rolling
    median of its iteration spans or loop passes (:func:`_rolling`); else its newest
    finished intervals whose iteration range is known, back until they cover
    :data:`ROLLING_ITERATIONS` iterations, their time over the iterations they covered
    (what a job without iteration spans or finalizes, this trainer's ``default`` groups,
    still shows); ``None`` before an interval has finished."""
    if median is not None:
        return median, ITERATION_TIME_SOURCES[0 if len(inc.iterations) else 1]
    intervals, facts = inc.intervals, inc.interval_facts
    took = covered = 0
    for position in range(len(intervals) - 1, -1, -1):
        first, last = facts[position].first_iteration, facts[position].last_iteration
        if first is None or last is None or last < first:
            continue
        interval = intervals[position]
        took += interval["end_ns"] - interval["start_ns"]
        covered += last - first + 1
        if covered >= ROLLING_ITERATIONS:
            break
    if not covered:
        return None, None
    return took / covered / 1e9, ITERATION_TIME_SOURCES[2]


def _iteration(inc: Incarnation) -> int | None:
    """Iterations completed so far: the next one's number (the in-process gauge's)."""
    last = inc.last_iteration
    return None if last is None else last + 1


def _newest_records(trace: Trace, metrics_files: list[Path]) -> dict[Any, Beat]:
    """The newest metric point of each process whose last incarnation may be stalled, or
    restarting in process (a cycle ended, the next one not written yet)."""
    wanted = {
        incs[-1].process: incs[-1].start_ns
        for incs in trace.ranks.values()
        if incs[-1].ended in ("killed", "restarted")
    }
    return newest_beats(metrics_files, wanted)


def _run_id(resource: dict[str, Any]) -> str | None:
    """The run id the resource attributes carry, or ``None``."""
    for key in RUN_ID_KEYS:
        value = resource.get(key)
        if value not in (None, ""):
            return str(value)
    instance = resource.get(SERVICE_INSTANCE_ID)
    if instance not in (None, ""):
        return _RANK_SUFFIX.sub("", str(instance))
    return None


def _folder_run_id(files: Sequence[Path]) -> str:
    """The first trace file's folder, or the one above it when that is ``rank<N>``."""
    if not files:
        return "unknown"
    folder = Path(files[0]).resolve().parent
    if re.fullmatch(r"rank\d+", folder.name) and folder.parent.name:
        folder = folder.parent
    return folder.name or "unknown"
