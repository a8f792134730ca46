"""Which job each incarnation belongs to, when the files hold more than one.

The OpenTelemetry Collector's file exporter writes every job into one file unless its
``group_by`` is set, and a folder may hold several jobs' files: read as one, two jobs
would be one job of their incarnations, and every figure wrong. So the job rank's
incarnations, in time order, are cut into jobs (:func:`jobs_in`): a launch starts another
job where its process names another job (:func:`~megatron.trace_format.jobs.job_of`: the
receiver's folders follow the same rule) **and** it does not resume from the earlier
job's checkpoints: it started afresh, or from a checkpoint past every iteration the
earlier job reached. A resumed job stays one job also when its launches carry different
run ids (this trainer's do, without ``MEGATRON_OTEL_RUN_ID`` or Slurm, under torchrun's
default rendezvous). A launch whose files do not show where it resumed (killed in its
startup) goes with the launches after it of the same id, and where none shows it, with
the job before. The other ranks' incarnations go with the job of the job rank's incarnation
of the same launch, and one of a launch the job rank's file does not show with the job its
start falls in.

:func:`one_job` is what the commands read: the trace when it holds one job; the job
``--job`` names; else :class:`SeveralJobsError`, one line naming them (:func:`several_jobs`:
``watch``, which reads on, says it as a warning). The job's spans are its processes'.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from megatron.trace.model.identity import PROCESS_KEYS
from megatron.trace.model.incarnation import Incarnation, Trace
from megatron.trace.model.launches import same_launch
from megatron.trace.model.restarts import resource_of
from megatron.trace_format.errors import TraceInputError
from megatron.trace_format.jobs import job_of
from megatron.trace_format.words import counted

__all__ = [
    "Job",
    "SeveralJobsError",
    "job_named",
    "job_trace",
    "jobs_in",
    "one_job",
    "several_jobs",
]


class SeveralJobsError(TraceInputError):
    """The files hold several jobs and none was chosen (``--job``)."""


@dataclass(frozen=True)
class Job:
    """One job of the files: its name (the id its first launch carries, numbered ``a#2``
    where two jobs' first launches carry one), every id its launches carry, when it
    started (its first incarnation on the job rank), and the job rank's incarnations
    (positions, in time order) that are its."""

    name: str
    ids: tuple[str, ...]
    start_ns: int
    positions: tuple[int, ...]


def _job_id(inc: Incarnation) -> str:
    """The job the incarnation's process names (else the process itself)."""
    resource = resource_of(inc)
    found = None if resource is None else job_of(resource)
    if found is not None:
        return found
    keys: Mapping[str, Any] = dict(zip(PROCESS_KEYS, inc.process[1:], strict=False))
    return job_of(keys) or f"process {inc.process}"


def _shown_start(inc: Incarnation) -> int | None:
    """Where the incarnation's spans show it started (0: afresh; None: they do not)."""
    if inc.resumed_from is not None:
        return inc.resumed_from
    return inc.first_iteration


def _reached(inc: Incarnation) -> int:
    """How far the incarnation got, as its files show: its durable saves, where it started
    and its last iteration (the most of them; 0 for none)."""
    points = [0, *inc.durable_saves()]
    start = _shown_start(inc)
    points += [] if start is None else [start]
    points += [] if inc.last_iteration is None else [inc.last_iteration + 1]
    return max(points)


def jobs_in(trace: Trace) -> list[Job]:
    """The jobs of ``trace``, in time order (module doc): one, unless the files show more."""
    if not trace.ranks:
        return []
    incs = next(iter(trace.ranks.values()))
    ids = [_job_id(inc) for inc in incs]
    groups: list[list[int]] = []
    # the ids the last group's launches carry, and how far its first `folded` got (kept as
    # it grows, and worked out only where another id asks: watch asks at every scrape)
    carried: set[str] = set()
    reached = folded = 0
    for position, same in enumerate(ids):
        if groups and same not in carried:
            # another id: another job unless it resumed from this one's checkpoints; its
            # start is the first its run of the same id shows. How far the job got is
            # unknown when its last launch was killed: it may have gone further
            run = itertools.takewhile(
                lambda p, same=same: ids[p] == same, range(position, len(ids))
            )
            shown = next((s for p in run if (s := _shown_start(incs[p])) is not None), None)
            group = groups[-1]
            reached = max([reached, *(_reached(incs[p]) for p in group[folded:])])
            folded = len(group)
            reach = None if incs[group[-1]].ended == "killed" else reached
            if shown == 0 or (shown is not None and reach is not None and shown > reach):
                groups.append([])
                carried, reached, folded = set(), 0, 0
        if not groups:
            groups.append([])
        groups[-1].append(position)
        carried.add(same)
    names = [ids[group[0]] for group in groups]
    return [
        Job(
            name if names.count(name) == 1 else f"{name}#{names[:number].count(name) + 1}",
            tuple(dict.fromkeys(ids[p] for p in group)),
            incs[group[0]].start_ns,
            tuple(group),
        )
        for number, (name, group) in enumerate(zip(names, groups, strict=True))
    ]


def several_jobs(jobs: Sequence[Job], where: str = "the files") -> str:
    """The line that names ``jobs`` (two or more) of ``where``: each job's name, its
    incarnations and when it started (what to do about it is the caller's to add)."""
    listed = "; ".join(
        f"{found.name} ({counted(len(found.positions), 'incarnation')} from {_utc(found.start_ns)})"
        for found in jobs
    )
    return (
        f"{where} hold {len(jobs)} jobs, the later not resumed from the earlier's "
        f"checkpoints: {listed}"
    )


def job_named(jobs: Sequence[Job], job: str) -> int | None:
    """The position in ``jobs`` of the one ``job`` names (its name, or any id its launches
    carry: the first such); None when none is."""
    return next(
        (index for index, found in enumerate(jobs) if job == found.name or job in found.ids),
        None,
    )


def job_trace(trace: Trace, jobs: Sequence[Job], index: int) -> Trace:
    """The incarnations of ``trace`` that are ``jobs[index]``'s (``jobs``: :func:`jobs_in`'s
    of ``trace``), numbered from 0 on each rank (module doc)."""
    ranks = {}
    for rank, incs in trace.ranks.items():
        kept = [
            inc
            for inc, owner in zip(incs, _owners(trace, jobs, incs), strict=True)
            if owner == index
        ]
        for number, inc in enumerate(kept):
            inc.index = number
        if kept:
            ranks[rank] = kept
    chosen = {id(inc) for incs in ranks.values() for inc in incs}
    processes = {
        key: (boundaries, incs)
        for key, (boundaries, incs) in trace.processes.items()
        if any(id(inc) in chosen for inc in incs)
    }
    # the job's spans: its processes' (all of the files', where no count is kept per process)
    spans = {key: count for key, count in trace.process_spans.items() if key in processes}
    span_count = sum(spans.values()) if trace.process_spans else trace.span_count
    return Trace(ranks, trace.stats, span_count, processes, spans)


def _owners(trace: Trace, jobs: Sequence[Job], incs: list[Incarnation]) -> list[int]:
    """The job (its position in ``jobs``) of each of one rank's incarnations ``incs``: on
    the job rank, the job that holds it; on another, the job of the job rank's incarnation
    of the same launch (:func:`~megatron.trace.model.launches.same_launch`: ranks start a
    launch in any order, so a start time alone could give one rank's start to the job
    before), else (a launch the job rank's file does not show) the job its start falls in."""
    by_position = {p: number for number, found in enumerate(jobs) for p in found.positions}
    job_rank = next(iter(trace.ranks.values()))
    if incs is job_rank:
        return [by_position[p] for p in range(len(incs))]
    launch = {
        id(other): by_position[p]
        for p, other in enumerate(same_launch(job_rank, incs))
        if other is not None
    }
    starts = [found.start_ns for found in jobs]
    return [
        launch.get(id(inc), max(0, bisect.bisect_right(starts, inc.start_ns) - 1)) for inc in incs
    ]


def one_job(trace: Trace, job: str | None = None, where: str = "the files") -> Trace:
    """``trace`` when it holds one job; with ``job`` (a name :class:`SeveralJobsError`
    gives, or any id its launches carry), that job's incarnations alone, numbered from 0;
    several jobs and no ``job``: :class:`SeveralJobsError`."""
    jobs = jobs_in(trace)
    if job is None:
        if len(jobs) <= 1:
            return trace
        raise SeveralJobsError(f"{several_jobs(jobs, where)}; name one with --job {jobs[0].name}")
    index = job_named(jobs, job)
    if index is None:
        valid = ", ".join(found.name for found in jobs) or "none"
        raise TraceInputError(f"--job {job}: {where} hold no such job; valid are {valid}")
    return job_trace(trace, jobs, index)


def _utc(ns: int) -> str:
    import datetime

    moment = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
