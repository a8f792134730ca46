"""Where each incarnation resumed: the report's ``resumed_from`` and its bounds.

An incarnation's own spans say where it resumed: its ``megatron.checkpoint.load``
(its ``megatron.iteration``), else its first iteration (a run that starts past
iteration 0 loaded a checkpoint there: Megatron-LM's own load spans carry no
iteration, the ``default`` groups record no load). ``null`` is a fresh start. Where the
files record no load though one may have happened (several incarnations and no load, or
none showing a first iteration: Megatron-LM's ``default`` groups), nothing says a run
without one started afresh: each is bounded as below, the first from 0.

One killed before its load span was exported (a SIGKILL during its startup, or in
its first steps before the batch processor's next export) shows neither, and
neither does one whose load the trace does not record. It still did not start
afresh: the launches of a job share their ``--load``, so each resumes from the
latest durable checkpoint. The files bound that: at least the latest checkpoint
the incarnations before it saved durably or resumed from, at most where the next
one that shows it resumed (checkpoints only grow) and at most its own first save.
Where the two meet the figure is exact; otherwise the figure is the lower bound
and the report's ``bounds`` holds ``incarnations.N.resumed_from``. Several ranks
live through the same restarts: each rank's bounds hold, so the job rank's are
narrowed by every other rank's incarnation of the same launch
(:func:`~megatron.trace.model.launches.same_launch`).
"""

from __future__ import annotations

from collections.abc import Iterable

from megatron.trace.analysis.reasons import Clause, Reason
from megatron.trace.model.incarnation import Incarnation
from megatron.trace.model.launches import same_launch
from megatron.trace_format.semconv import ITERATION

__all__ = ["Resumed", "figure", "job_resume_ranges", "resume_ranges", "resumed_bounds"]

#: (lower, upper) of the iteration an incarnation resumed from: 0 is a fresh start,
#: ``upper`` None unbounded; ``lower == upper``: exact.
Resumed = tuple[int, int | None]

_ENDS_UNSEEN = ("killed", "running")  # what such an incarnation did last is not in the file


def _shown(inc: Incarnation, loads_unrecorded: bool) -> int | None:
    """Where the incarnation's own spans say it resumed (0: afresh); None: they cannot say."""
    if inc.resumed_from is not None:
        return inc.resumed_from
    if inc.first_iteration is not None:
        return inc.first_iteration
    if inc.loads or loads_unrecorded or inc.ended in _ENDS_UNSEEN:
        return None  # it loaded something unnamed, or its load was lost or not recorded
    return 0  # it wrote all it did, loads are recorded, and it has none: a fresh start


def _no_load_recorded(incs: list[Incarnation]) -> bool:
    """Whether the files record no load though one may have happened: no incarnation shows
    a load or a first iteration, or several incarnations and not one load (Megatron-LM's
    ``default`` groups record none; then nothing says a run without one started afresh)."""
    if not any(inc.loads for inc in incs):
        return len(incs) > 1 or all(inc.first_iteration is None for inc in incs)
    return False


def _saved(inc: Incarnation) -> list[int]:
    return [
        save["attributes"][ITERATION]
        for save in inc.saves
        if isinstance(save["attributes"].get(ITERATION), int)
    ]


def resume_ranges(incs: list[Incarnation]) -> list[Resumed]:
    """Per incarnation of one rank (in time order), the range the files put its resume
    point in (module doc): worked out once per rank, kept on its incarnations
    (:attr:`Incarnation.resume_range`) for the sightings, the bounds and the report alike."""
    if incs and all(inc.resume_range is not None for inc in incs):
        return [inc.resume_range for inc in incs]  # type: ignore[misc]
    ranges = _work_ranges(incs)
    for inc, found in zip(incs, ranges, strict=True):
        inc.resume_range = found
    return ranges


def _work_ranges(incs: list[Incarnation]) -> list[Resumed]:
    loads_unrecorded = _no_load_recorded(incs) or any(
        not inc.loads and (inc.first_iteration or 0) > 0 for inc in incs
    )
    shown = [_shown(inc, loads_unrecorded) for inc in incs]
    ranges: list[Resumed] = []
    latest = 0  # the latest checkpoint the incarnations so far resumed from or saved
    for position, inc in enumerate(incs):
        if shown[position] is not None:
            lower = upper = shown[position]
            latest = lower  # a run may restart from an older checkpoint, or afresh
        else:
            later = [point for point in shown[position + 1 :] if point is not None]
            ceilings = later[:1] + _saved(inc)
            lower, upper = latest, min(ceilings) if ceilings else None
            if upper is not None and upper < lower:
                lower, upper = 0, None  # the files contradict the rule: no bound holds
        ranges.append((lower, upper))
        latest = max([latest, *inc.durable_saves()])
    return ranges


def _narrowed(ranges: Iterable[Resumed]) -> Resumed:
    """The intersection of several ranks' ranges for the same incarnation."""
    pairs = list(ranges)
    lower = max(low for low, _ in pairs)
    uppers = [up for _, up in pairs if up is not None]
    upper = min(uppers) if uppers else None
    if upper is not None and upper < lower:  # the ranks disagree: say only what all allow
        return min(low for low, _ in pairs), None
    return lower, upper


def job_resume_ranges(per_rank: list[list[Incarnation]]) -> list[Resumed]:
    """The job rank's (the first of ``per_rank``) ranges, each narrowed by the other ranks'
    incarnations of the same launch (:func:`~megatron.trace.model.launches.same_launch`)."""
    job = per_rank[0]
    columns: list[list[Resumed]] = [[] for _ in job]
    for incs in per_rank:
        ranges = resume_ranges(incs)
        for column, inc in zip(columns, same_launch(job, incs), strict=True):
            if inc is not None:
                column.append(ranges[inc.index])
    return [_narrowed(column) for column in columns]


def figure(resumed: Resumed) -> int | None:
    """The report's ``resumed_from``: None for a fresh start, else the (lower bound of
    the) iteration."""
    lower, upper = resumed
    return None if lower == upper == 0 else lower


def resumed_bounds(incs: list[Incarnation], ranges: list[Resumed]) -> dict[str, dict]:
    """The ``bounds`` entries of the job rank's incarnations whose resume point the files
    only bound."""
    bounds = {}
    unrecorded = _no_load_recorded(incs)
    for inc, (lower, upper) in zip(incs, ranges, strict=True):
        if lower == upper:
            continue
        if unrecorded:
            why = (
                "shows no checkpoint load and no iteration of its own, and the file records "
                "no load (Megatron-LM's default span groups)"
            )
        else:
            why = {
                "killed": "was SIGKILLed before its checkpoint load and first iteration were "
                "exported",
                "running": "is running, its checkpoint load and first iteration not exported yet",
            }.get(
                inc.ended, "shows no checkpoint load with an iteration and no iteration of its own"
            )
        said = (
            f"incarnation {inc.index} {why}: it resumed from the latest durable checkpoint, at "
            "least the last one the incarnations before it saved or resumed from and at most "
            "the one the next resumed from (0: afresh)"
        )
        bounds[f"incarnations.{inc.index}.resumed_from"] = {
            "lower": lower,
            "upper": upper,
            "reason": Reason((Clause(said, incarnation=inc.index),)),
        }
    return bounds
