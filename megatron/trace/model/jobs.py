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
the job before. The other ranks' incarnations go with the job their time falls in.

:func:`one_job` is what the commands read: the trace when it holds one job; the job
``--job`` names; else :class:`SeveralJobsError`, one line naming them.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from megatron.trace.model.identity import PROCESS_KEYS
from megatron.trace.model.incarnation import RECORD_LISTS, Incarnation, Trace
from megatron.trace_format.errors import TraceInputError
from megatron.trace_format.jobs import job_of
from megatron.trace_format.words import counted

__all__ = ["Job", "SeveralJobsError", "jobs_in", "one_job"]


class SeveralJobsError(TraceInputError):
    """The files hold several jobs and none was chosen (``--job``)."""


@dataclass(frozen=True)
class Job:
    """One job of the files: its name (the id its first launch carries), every id its
    launches carry, when it started (its first incarnation on the job rank), and the job
    rank's incarnations (positions, in time order) that are its."""

    name: str
    ids: tuple[str, ...]
    start_ns: int
    positions: tuple[int, ...]


def _job_id(inc: Incarnation) -> str:
    """The job the incarnation's process names (else the process itself)."""
    for name in ("startup", *RECORD_LISTS):
        records = getattr(inc, name)
        record = records if name == "startup" else (records[0] if records else None)
        if record is not None:
            found = job_of(record["resource"])
            if found is not None:
                return found
    keys: Mapping[str, Any] = dict(zip(PROCESS_KEYS, inc.process[1:], strict=False))
    return job_of(keys) or f"process {inc.process}"


def _shown_start(inc: Incarnation) -> int | None:
    """Where the incarnation's spans show it started (0: afresh; None: they do not)."""
    if inc.resumed_from is not None:
        return inc.resumed_from
    return inc.first_iteration


def _reach(incs: Sequence[Incarnation]) -> int | None:
    """How far a job's incarnations got, as their files show (None: unknown, its last one
    killed after it may have gone further)."""
    if incs[-1].ended == "killed":
        return None
    points = [0]
    for inc in incs:
        points += inc.durable_saves()
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
    for position, same in enumerate(ids):
        if not groups or same in {ids[p] for p in groups[-1]}:
            if groups:
                groups[-1].append(position)
            else:
                groups.append([position])
            continue
        # another id: another job unless it resumed from this one's checkpoints; its
        # start is the first its run of the same id shows
        run = itertools.takewhile(lambda p, same=same: ids[p] == same, range(position, len(ids)))
        shown = next((s for p in run if (s := _shown_start(incs[p])) is not None), None)
        reach = _reach([incs[p] for p in groups[-1]])
        afresh = shown == 0 or (shown is not None and reach is not None and shown > reach)
        if afresh:
            groups.append([position])
        else:
            groups[-1].append(position)
    return [
        Job(
            ids[group[0]],
            tuple(dict.fromkeys(ids[p] for p in group)),
            incs[group[0]].start_ns,
            tuple(group),
        )
        for group in groups
    ]


def _named(jobs: list[Job]) -> list[str]:
    """Each job's name as the line gives it: its id, numbered where two share one."""
    names = [job.name for job in jobs]
    return [
        name if names.count(name) == 1 else f"{name}#{names[:index].count(name) + 1}"
        for index, name in enumerate(names)
    ]


def one_job(trace: Trace, job: str | None = None, where: str = "the files") -> Trace:
    """``trace`` when it holds one job; with ``job`` (a name :class:`SeveralJobsError`
    gives, or any id its launches carry), that job's incarnations alone, numbered from 0;
    several jobs and no ``job``: :class:`SeveralJobsError`."""
    jobs = jobs_in(trace)
    names = _named(jobs)
    if job is None:
        if len(jobs) <= 1:
            return trace
        listed = "; ".join(
            f"{name} ({counted(len(found.positions), 'incarnation')} from {_utc(found.start_ns)})"
            for name, found in zip(names, jobs, strict=True)
        )
        raise SeveralJobsError(
            f"{where} hold {len(jobs)} jobs, the later not resumed from the earlier's "
            f"checkpoints: {listed}; name one with --job {names[0]}"
        )
    chosen = [
        index
        for index, (name, found) in enumerate(zip(names, jobs, strict=True))
        if job == name or job in found.ids
    ]
    if not chosen:
        raise TraceInputError(
            f"--job {job}: {where} hold no such job; valid are {', '.join(names) or 'none'}"
        )
    index = chosen[0]
    start = jobs[index].start_ns
    end = jobs[index + 1].start_ns if index + 1 < len(jobs) else None
    return _within(trace, start, end)


def _within(trace: Trace, start: int, end: int | None) -> Trace:
    """The incarnations of ``trace`` that started in ``[start, end)``, renumbered."""
    ranks = {}
    for rank, incs in trace.ranks.items():
        starts = [inc.start_ns for inc in incs]
        lo = bisect.bisect_left(starts, start)
        hi = len(incs) if end is None else bisect.bisect_left(starts, end)
        kept = incs[lo:hi]
        for index, inc in enumerate(kept):
            inc.index = index
        if kept:
            ranks[rank] = kept
    chosen = {id(inc) for incs in ranks.values() for inc in incs}
    processes = {
        key: (boundaries, incs)
        for key, (boundaries, incs) in trace.processes.items()
        if any(id(inc) in chosen for inc in incs)
    }
    return Trace(ranks, trace.stats, trace.span_count, processes)


def _utc(ns: int) -> str:
    import datetime

    moment = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
