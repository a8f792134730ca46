"""The figures a file can only bound, and their bounds: the report's ``bounds``.

A SIGKILL loses what the rank's batch span processor had queued since its last
export (up to ``OTEL_BSP_SCHEDULE_DELAY``, 5 s by default) and every span still
open: the file of a killed incarnation ends at its last exported span, before the
process really died. A restart killed before its first export (in its startup, as
often happens when a node fails again while the job restarts on it) leaves nothing in
any file. So:

* the iterations it redid are at least those the file shows past the horizon
  (:mod:`~megatron.trace.analysis.wasted`): a lower bound. The job's figure is the
  largest any rank gives for the same launch (the rank whose export got furthest), per
  incarnation and in all; it is exact only when no rank's incarnation was killed and
  no restart may hide between records;
* the time between an incarnation's last record and the next one's start is
  *unattributed*: no span says what it was (a killed one's last work, the restart, or a
  restart that left no record). The sweep books it as ``restart_gap`` (so the categories
  still sum exactly to the wall clock), and the report says it is a bound:
  ``restart_gap`` is at most its figure and at least that less the unattributed time;
  each category whose spans a kill can take with it or an unseen restart may have spent
  (:data:`HIDDEN`) at least its figure and at most that plus the unattributed time (and
  any ``other`` of a rank with a kill: a lost span's time the file shows no cover for);
  but only the unattributed time the category may hold (:func:`_may_hold`): goodput not
  when the successor resumed from the last checkpoint the files show, or afresh. The
  counts (iterations, wasted iterations, the failures, the stragglers' cost) are then
  lower bounds: what an unseen restart did is counted nowhere;
* a final killed incarnation (no successor) ended some unknown time after its last
  span: the wall clock is a lower bound, and those categories (``restart_gap`` too: it
  may have been restarted since) have no upper bound. So does a final one whose clean
  end is a guess (it wrote its startup and no loop, resumed where a clean end left off);
* ``report --window``: a window holding unattributed time, or the last window when
  the last incarnation's end is unknown, is bounded as the whole is (its goodput, share
  and ``restart_gap``, under ``windows.entries.N.``).

A killed incarnation's own metric points (:mod:`~megatron.trace.analysis.sightings`)
narrow these: the time they show it alive is not restart gap (a final one's wall clock
runs to its newest point), the iterations they show finished raise the wasted iterations'
and ``iterations.count``'s lower bounds, and the stretch they show redone is booked as
wasted progress (less what may be a save in flight, taken off its lower bounds, the job's
and the incarnation's); such a bound also says its ``source`` (``the last metric export of
incarnation 2, 8.0 s after its last exported span and at most 31.5 s before the kill``:
the successor's start bounds the kill's time, which no file holds).

Each bound is ``{"lower": x or None, "upper": y or None, "reason": Reason}`` under the
figure's path in the report (``wall_s``, ``badput_s.wasted_progress``,
``ranks.1.goodput_s``, ``incarnations.0.wasted_iterations``...), in the figure's unit,
its reason (and ``source``) data the renderers put in words
(:mod:`~megatron.trace.analysis.reasons`); a figure with no entry is exact. The shape is
stated once, by :class:`~megatron.trace.analysis.report.Bound` and ``report.schema.json``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

from megatron.trace.analysis.accounting import seconds
from megatron.trace.analysis.reasons import Clause, Reason, Shown, Source, source_of_shown
from megatron.trace.analysis.resumed import resume_ranges
from megatron.trace.analysis.sightings import completed, finished_shown, unseen_from
from megatron.trace.analysis.wasted import window_start
from megatron.trace.model.identity import rank_value
from megatron.trace.model.incarnation import Incarnation
from megatron.trace.model.launches import same_launch
from megatron.trace.model.restarts import next_launch
from megatron.trace_format.semconv import Category

__all__ = [
    "HIDDEN",
    "advice_bounds",
    "furthest_waste",
    "report_bounds",
    "restart_gap_bounds",
    "window_bounds",
]

#: The categories whose spans a kill can lose (their time then unattributed).
HIDDEN = (
    Category.GOODPUT,
    Category.WASTED_PROGRESS,
    Category.CHECKPOINT_SAVE,
    Category.EVALUATION,
    Category.STARTUP,
    Category.CHECKPOINT_LOAD,
)

# Why a count is a lower bound only because a restart may hide between incarnations.
_UNSEEN_LOWER = Clause(
    "a lower bound: a restart killed before its first export leaves no record, and the time "
    "between incarnations may hold one: what it did is not counted"
)
# Why a count is a lower bound where a restart may hide between incarnations.
_UNSEEN_RESTART = Clause(
    "a restart killed before its first export leaves no record, and the time between "
    "incarnations may hold one: what it did is not counted"
)


def _lower_count(killed: list[int]) -> Clause:
    return Clause(
        f"a lower bound: incarnations {killed} were SIGKILLed, and the spans of their last "
        "iterations (those the batch processor had not exported yet) never reached the file"
    )


def _killed(incs: list[Incarnation]) -> list[int]:
    return [inc.index for inc in incs if inc.ended == "killed"]


def furthest_waste(ranks: dict[str, tuple[list[Incarnation], dict[str, Any]]]) -> dict[str, Any]:
    """The job's wasted iterations over all ranks: per incarnation of the job rank (the
    first), the most any rank's incarnation of that launch shows (:func:`same_launch`),
    with its lower bound and whether it is exact; and their sums, the job's.

    A killed incarnation followed by another lost at least what the file shows past the
    iteration its successor resumed from. One killed last (no successor yet) may have
    finished and saved a checkpoint after its last exported span: its lower bound is 0; so
    is one whose successors do not show where they resumed (its horizon not placed: they
    may have resumed from such a save).
    Without iteration spans, an interval closed at an exception or a signal says its last
    iteration from the passes begun, the one in flight too: one fewer is its lower bound.
    """
    per_rank = list(ranks.values())
    job_incs, _ = per_rank[0]
    matched = [same_launch(job_incs, incs) for incs, _ in per_rank]
    figures: list[int | None] = []
    lowers: list[int | None] = []
    exact: list[bool] = []
    for position in range(len(job_incs)):
        counts, low, known = [], [], True
        for (incs, acc), launch in zip(per_rank, matched, strict=True):
            inc = launch[position]
            entry = None if inc is None else acc["per_incarnation"][inc.index]
            if entry is not None and entry["wasted_iterations"] is not None:
                counts.append(entry["wasted_iterations"])
                low.append(_lower(incs, inc.index, entry))
                known = known and entry["wasted_exact"]
        figures.append(max(counts) if counts else None)
        lowers.append(max(low) if low else None)
        exact.append(known)
    return {
        "job": sum(f for f in figures if f is not None),
        "job_lower": sum(low for low in lowers if low is not None),
        "job_exact": all(exact),
        "incarnations": figures,
        "incarnations_lower": lowers,
        "incarnations_exact": exact,
    }


def _lower(incs: list[Incarnation], position: int, entry: dict[str, Any]) -> int:
    """The lower bound of one incarnation's wasted iterations (:func:`furthest_waste`)."""
    inc, count = incs[position], entry["wasted_iterations"] or 0
    if entry["wasted_exact"]:
        return count
    if inc.ended == "killed" or inc.ending_unsure:
        unplaced = inc.ended == "killed" and entry["placed_horizon"] is None
        return 0 if position == len(incs) - 1 or unplaced else count
    if inc.ended in ("failed", "interrupted", "cut_short", "restarted") and not inc.iterations:
        return max(0, count - 1)  # its last interval may have counted the pass in flight
    return count


def _rank_lower(incs: list[Incarnation], accounting: dict[str, Any]) -> int:
    """A rank's wasted iterations' lower bound (:func:`furthest_waste`'s rule, one rank)."""
    entries = accounting["per_incarnation"]
    return sum(_lower(incs, position, entry) for position, entry in enumerate(entries))


def _floor6(value: float) -> float:
    return math.floor(value * 1e6) / 1e6


def _ceil6(value: float) -> float:
    return min(1.0, math.ceil(value * 1e6) / 1e6)


class _Unseen(NamedTuple):
    """A stretch between two incarnations of a rank that no record covers: from the
    earlier one's last record (a killed one's: its last span, or the end of what its
    metric points show redone; :func:`~megatron.trace.analysis.sightings.unseen_from`)
    to the next one's start. Nothing says what the time was: a killed incarnation's last
    work, the restart, or a launch killed before its first export (which leaves nothing
    in any file), unless the launchers' restart counters rule such a launch out
    (:func:`~megatron.trace.model.restarts.next_launch`: ``ruled_out``). Then the stretch
    holds the killed one's last work until its kill, and the restart after it; and where
    its metric points show its export period (:attr:`Sighting.export_period_ns`), the kill
    came at most two periods after the newest of them (:func:`_killed_by`, ``dead_by``):
    from there (``until``) to the next start it is all restart gap. Where they do not, the
    incarnation's own restart gap (its kill to the next start the files show) still began
    by ``dead_by``; the job's may not have, an unseen launch's life taking some of it."""

    inc: Incarnation  # the incarnation before the stretch
    start: int  # where its unattributed time begins
    seen: int  # until when its metric points show it alive
    successor: int  # its successor's start
    doubt: int  # the ns of what its metric points show redone that may be a save in flight
    #: the categories that time may hold (:func:`_may_hold`)
    hidden: frozenset[str]
    #: the ns of goodput booked in a killed incarnation that may have been redone instead
    #: (:func:`_redone`), and where (start, end)
    redone: tuple[int, int] = (0, 0)
    #: whether the restart counters rule out a launch between it and the next one
    ruled_out: bool = False
    #: where what the stretch may hold besides the restart ends: the successor's start, or
    #: the latest the kill can have come (``ruled_out``, its metric points read)
    until: int = 0
    #: the latest its kill can have come (:func:`_killed_by`; the successor's start where
    #: its metric points do not say): ``until`` too where the counters rule out a launch
    dead_by: int = 0


def _killed_by(inc: Incarnation) -> int | None:
    """The latest a killed incarnation's kill can have come, from its metric points: two
    export periods after its newest (None: they do not show its period). The SDK's reader
    collects, exports, then waits its interval, so the export after the newest was
    collected at most a period later and written before the next collection, at most a
    period after that; a kill before that write leaves the newest in the file. A period is
    the longest spacing between its newest four exports, so it holds while at most one of
    them was a flush (a SIGTERM's, a hang's) and the reader's interval is the same
    throughout."""
    sighting = inc.sighting
    if sighting is None or sighting.export_period_ns is None:
        return None
    return sighting.seen_ns + 2 * sighting.export_period_ns


def _unseen(incs: list[Incarnation], accounting: dict[str, Any]) -> list[_Unseen]:
    """Each stretch between a rank's incarnations that no record covers (:class:`_Unseen`),
    in order."""
    found = []
    resumed = resume_ranges(incs)
    for position, inc in enumerate(incs[:-1]):
        following = incs[position + 1]
        if _cycle_restarted_in_process(inc, following):
            continue  # its process lived on into the next cycle: no launch between them
        ruled_out = next_launch(inc, following)
        if ruled_out and inc.ended != "killed" and not inc.ending_unsure:
            continue  # it ended as its spans say, and the next launch came next: a restart
        successor = following.start_ns
        horizon = accounting["per_incarnation"][position]["placed_horizon"]
        if inc.ended == "killed":
            start, seen, doubt = unseen_from(inc, horizon, successor)
        else:
            start, seen, doubt = inc.end_ns, inc.end_ns, 0
        if successor <= start:
            continue  # the next one began before this one's last record: no restart between
        seen = min(seen, successor)
        dead_by = successor
        killed_by = _killed_by(inc) if inc.ended == "killed" else None
        if killed_by is not None:
            dead_by = max(seen, min(successor, killed_by))
        until = dead_by if ruled_out else successor
        hidden = _may_hold(inc, resumed[position][0], horizon, ruled_out)
        entry = accounting["per_incarnation"][position]
        redone = (0, 0) if ruled_out else _redone(inc, resumed[position][0], horizon, entry)
        found.append(
            _Unseen(inc, start, seen, successor, doubt, hidden, redone, ruled_out, until, dead_by)
        )
    return found


def _redone(
    inc: Incarnation, resumed: int, horizon: int | None, entry: dict[str, Any]
) -> tuple[int, int]:
    """Where a killed incarnation's booked goodput may have been redone: its successor
    resumed (at ``horizon``) past every checkpoint the files show durable before it, so
    that checkpoint was saved in the time no record covers, by it (its spans lost at the
    kill: the goodput booked stands) or by a restart killed before its first export,
    resumed from its last durable save (then its training from there was redone). (start,
    end) of that training as booked, from where its last durable checkpoint's iteration
    began to where its wasted window begins; (0, 0): none."""
    if inc.ended != "killed" or horizon is None:
        return (0, 0)
    durable = max([*inc.durable_saves(), resumed])
    if horizon <= durable:
        return (0, 0)
    begun = window_start(inc, durable)
    if begun is None:
        begun = inc.startup["end_ns"] if inc.startup is not None else inc.start_ns
    booked_until = inc.end_ns - entry["wasted_window_ns"]
    return (begun, booked_until) if booked_until > begun else (0, 0)


def _may_hold(
    inc: Incarnation, resumed: int, horizon: int | None, ruled_out: bool = False
) -> frozenset[str]:
    """The categories of :data:`HIDDEN` the stretch after an incarnation (from its last
    record to the next one's start) may hold.

    Startup and checkpoint load: a launch in between killed before its first export left
    no record (Slurm or torchrun restarting a job whose node failed again in its startup),
    unless the restart counters rule one out (``ruled_out``), and then only when the
    incarnation itself was killed in its startup (its ``megatron.startup`` not in the
    file). The same launch, or the incarnation itself when it was killed, may have
    trained (work later redone), saved and evaluated. Goodput only if progress made in
    that time may have survived: the next incarnation resumed (at ``horizon``) from a
    checkpoint saved in it, past every iteration the files show durable before it, its
    durable saves and where it resumed itself (at least ``resumed``). One that resumed
    from one of those (saved 200, killed, resumed from 200; or killed before its first
    save and restarted afresh) kept nothing of that time; where the files do not place the
    next one's resume point (``horizon`` None), it may have."""
    hidden = set(HIDDEN) - {Category.GOODPUT}
    if ruled_out and inc.startup is not None:
        hidden -= {Category.STARTUP, Category.CHECKPOINT_LOAD}
    if horizon is None or horizon > max([*inc.durable_saves(), resumed]):
        hidden.add(Category.GOODPUT)
    return frozenset(hidden)


class _Tail(NamedTuple):
    """What the stretches between a rank's incarnations leave unattributed, in ns."""

    gap: int  # between the incarnations' last records and their successors' starts
    #: the part of it that may be other than restart gap (each stretch to its ``until``)
    unknown: int
    alive: int  # the part of it their metric points show them alive
    doubt: int  # booked as wasted progress from their metric points: a save in flight?
    spare: int  # what a category may hold beyond its figure and the stretches, at most
    #: per category of :data:`HIDDEN`, what it may hold beyond its figure (:func:`_may_hold`)
    spare_of: dict[str, int]
    open_end: bool  # whether the last incarnation's end is unknown (:func:`_ends_open`)
    unseen: list[_Unseen]  # each stretch between incarnations, that these sum
    redone: int  # the goodput booked that may have been redone (:func:`_redone`)


def _rank_tail(incs: list[Incarnation], accounting: dict[str, Any]) -> _Tail:
    """The rank's :class:`_Tail`."""
    unseen = _unseen(incs, accounting)
    gap = sum(u.successor - u.start for u in unseen)
    unknown = sum(u.until - u.start for u in unseen)
    alive = sum(u.seen - u.start for u in unseen)
    doubt = sum(u.doubt for u in unseen)
    killed = any(inc.ended == "killed" for inc in incs)
    other = accounting["totals_ns"][Category.OTHER] if killed else 0
    spare_of = {
        category: other
        + sum(u.until - _from(u, category) + u.doubt for u in unseen if category in u.hidden)
        for category in HIDDEN
    }
    open_end = bool(incs) and _ends_open(incs[-1])
    redone = sum(u.redone[1] - u.redone[0] for u in unseen)
    return _Tail(gap, unknown, alive, doubt, doubt + other, spare_of, open_end, unseen, redone)


def _from(unseen: _Unseen, category: str) -> int:
    """Where the stretch may begin to hold ``category``. Until the incarnation before it
    was last seen alive (its metric points), the stretch is its own: past its startup when
    the file holds its ``megatron.startup`` (its startup and load were over), still in it
    when neither that nor its metric points show it training. A restart that left no
    record came after, and may hold anything."""
    inc = unseen.inc
    own = category in (Category.STARTUP, Category.CHECKPOINT_LOAD)
    in_startup = inc.startup is None and (inc.sighting is None or completed(inc) is None)
    if (own and inc.startup is not None) or (not own and in_startup):
        return unseen.seen
    return unseen.start


def _guessed(incs: list[Incarnation], accounting: dict[str, Any]) -> tuple[int, list[int]]:
    """(the wasted progress booked for killed incarnations, but the last, whose horizon the
    files do not place (its ``placed_horizon`` None: 0, or the last save the files show, is
    a guess), which ones): it may instead have been kept. The last one's is bounded as a
    final kill's."""
    total, which = 0, []
    for inc, entry in zip(incs[:-1], accounting["per_incarnation"], strict=False):
        guessed = entry["horizon"] is not None and entry["placed_horizon"] is None
        if inc.ended == "killed" and guessed:
            total += entry["wasted_progress_ns"]
            which.append(inc.index)
    return total, which


def _unattributed(rank: str, killed: list[int], gap: int, unseen: list[_Unseen]) -> list[Clause]:
    """Why the stretches between a rank's incarnations make figures bounds."""
    on = rank_value(rank)
    clauses = [Clause(f"rank {on}: incarnations {killed} were SIGKILLed", on)] if killed else []
    ruled = [u.inc.index for u in unseen if u.ruled_out]
    if gap:
        may_hide = len(ruled) < len(unseen)
        clauses.append(
            Clause(
                ("" if killed else f"rank {on}: ")
                + f"{seconds(gap):.3f} s between incarnations (from each one's last "
                "record to the next one's start) is unattributed, booked as restart_gap"
                + (": it holds what the kills kept from the files" if killed else "")
                + (
                    (", and " if killed else ": ")
                    + "a restart killed before its first export leaves no record, so it may "
                    "hold that restart's startup and checkpoint load"
                    if may_hide
                    else ""
                ),
                on,
            )
        )
    if ruled:
        bounded = [u.inc.index for u in unseen if u.ruled_out and u.until < u.successor]
        text = (
            f"after incarnations {ruled} the launchers' restart counters rule out a restart "
            "killed before its first export (the same torchrun agent, of every rank, its count "
            "one more)"
        )
        if bounded:
            text += (
                f", and the kills of {bounded} came at most two export periods (the longest "
                "spacing of their newest metric points) after their last one: the time since "
                "is restart gap"
            )
        clauses.append(Clause(text, on))
    return clauses


def _ends_open(last: Incarnation) -> bool:
    """Whether a rank's last incarnation ended some unknown time after its last record: it
    was killed, or it may have been (:attr:`Incarnation.ending_unsure`)."""
    return last.ended == "killed" or last.ending_unsure


def _alive_clauses(rank: str, incs: list[Incarnation], alive: int, open_end: bool) -> list[Clause]:
    """What the killed incarnations' metric points said of their lives, and how the last
    one ended, for a reason."""
    on = rank_value(rank)
    clauses = []
    if alive:
        clauses.append(
            Clause(
                f"their metric points show them alive {seconds(alive):.3f} s of it (so not "
                "restart gap)",
                on,
            )
        )
    last = incs[-1] if incs else None
    if open_end and last is not None:
        if last.ending_unsure:
            text = (
                f"incarnation {last.index} wrote its startup and nothing of a training loop, "
                "resumed where a clean end left off: it had nothing left to train, or a SIGKILL "
                "in its first iteration lost its interval, and its end is unknown"
            )
        elif _seen_beyond_spans(last):
            text = (
                f"the last one was alive at its last metric export, {_ago(last)}, and ended "
                "some unknown time after"
            )
        else:
            text = "the last one ended some unknown time after its last span"
        clauses.append(Clause(text, on, last.index))
    return clauses


def _last_span_end(inc: Incarnation) -> int:
    """The end of the newest span a killed incarnation exported (its ``end_ns`` may have
    moved to its newest metric point since)."""
    worked = inc.sighting.worked if inc.sighting is not None else {}
    if "last_span_end" not in worked:
        ends = [end for _, end, _ in inc.extents()]
        worked["last_span_end"] = max([*ends, inc.iterations.max_end() or 0, inc.start_ns])
    return worked["last_span_end"]


def _seen_beyond_spans(inc: Incarnation) -> bool:
    """Whether a killed incarnation's newest metric point is newer than its last exported
    span (an older one says nothing the spans do not)."""
    return inc.sighting is not None and inc.sighting.seen_ns > _last_span_end(inc)


def _ago(inc: Incarnation, successor_ns: int | None = None, at: int | None = None) -> str:
    """When a killed incarnation's newest metric point (or the one ``at``) was, said against
    its last span and, where a successor started at ``successor_ns``, against the kill: the
    kill came before that start, so at most that long after the point."""
    assert inc.sighting is not None
    at = inc.sighting.seen_ns if at is None else at
    text = f"{(at - _last_span_end(inc)) / 1e9:.1f} s after its last exported span"
    if successor_ns is not None and successor_ns >= at:
        text += f" and at most {(successor_ns - at) / 1e9:.1f} s before the kill"
    return text


def _shown(
    incs: list[Incarnation],
    accounting: dict[str, Any],
    positions: Iterable[int],
    rank: str | None = None,
) -> list[Shown]:
    """Per killed incarnation at ``positions`` whose metric points show more progress than
    its spans: where its wasted iterations' lower bound comes from (naming its ``rank``,
    where given: the job has several)."""
    found = []
    for position in positions:
        # the last one may have saved after its points (its lower bound is 0), and a point
        # older than the spans shows nothing they do not
        if position >= len(incs) - 1 or incs[position].ended != "killed":
            continue
        inc = incs[position]
        if not _seen_beyond_spans(inc):
            continue
        shown = completed(inc)
        horizon = accounting["per_incarnation"][position]["placed_horizon"]
        if shown is None or horizon is None or shown[0] <= horizon:
            continue
        top, at, name = shown
        export = _ago(inc, incs[position + 1].start_ns, at)
        named = None if rank is None else rank_value(rank)
        found.append(Shown(inc.index, named, top - horizon, export, name, top, horizon))
    return found


def report_bounds(
    report: dict[str, Any],
    ranks: dict[str, tuple[list[Incarnation], dict[str, Any]]],
    job_rank: str,
    furthest: dict[str, Any],
    not_computed: set[str],
) -> dict[str, dict[str, Any]]:
    """The report's ``bounds`` (module doc), from the ranks' incarnations and accounting."""
    bounds: dict[str, dict[str, Any]] = {}

    def bound(path: str, lower: Any, upper: Any, reason: Reason, source: Source | None = None):
        bounds[path] = {"lower": lower, "upper": upper, "reason": reason}
        if source is not None:
            bounds[path]["source"] = source

    stretches: dict[str, bool] = {}  # per rank: whether a restart may hide between records
    for rank, (incs, acc) in ranks.items():
        killed = _killed(incs)
        tail = _rank_tail(incs, acc)
        gap, unknown, alive, doubt, spare, spare_of, open_end, unseen_list, redone = tail
        stretches[rank] = any(not u.ruled_out for u in unseen_list)
        if not killed and not unseen_list and not open_end:
            continue
        kept = spare_of[Category.GOODPUT]
        guessed, unplaced = _guessed(incs, acc)
        totals, wall = acc["totals_ns"], acc["wall_ns"]
        clauses = _unattributed(rank, killed, gap, unseen_list)
        clauses += _alive_clauses(rank, incs, alive, open_end)
        if unplaced:
            clauses.append(
                Clause(
                    f"incarnations {unplaced}: no file shows where the next one resumed, past "
                    "any checkpoint they show saved or resumed from (it may be one their kill "
                    f"kept from the file): the {seconds(guessed):.3f} s booked as their wasted "
                    "progress may have been kept (goodput)",
                    rank_value(rank),
                )
            )
        unattributed = Reason(tuple(clauses))
        seen = _seen_source(incs, alive, open_end)
        prefixes = [f"ranks.{rank_value(rank)}."]
        if rank == job_rank:
            prefixes.append("")
        goodput = totals[Category.GOODPUT]
        for prefix in prefixes:
            if open_end:
                last = incs[-1]
                narrows = _seen_beyond_spans(last)
                source = Source((last.index,), export=_ago(last), own=True) if narrows else None
                bound(f"{prefix}wall_s", seconds(wall), None, unattributed, source)
                bound(f"{prefix}goodput_fraction", None, None, unattributed)
            elif (kept or guessed) and wall:
                bound(f"{prefix}goodput_fraction", _floor6((goodput - redone) / wall),
                      _ceil6((goodput + kept + guessed) / wall), unattributed)  # fmt: skip
            if kept or open_end or guessed:
                upper = None if open_end else seconds(goodput + kept + guessed)
                bound(f"{prefix}goodput_s", seconds(goodput - redone), upper, unattributed)
        if rank != job_rank:
            continue
        for category in (*HIDDEN[1:], Category.RESTART_GAP, Category.OTHER):
            if category in not_computed:
                continue
            figure = totals[category]
            path = f"badput_s.{category}"
            if category == Category.RESTART_GAP:
                if gap or open_end:
                    # after a final kill the job may have restarted unseen: no upper bound
                    upper = None if open_end else seconds(max(0, figure - alive))
                    bound(path, seconds(max(0, figure - unknown)), upper, unattributed, seen)
            elif category == Category.OTHER:
                if figure and killed:
                    lost = Clause(
                        f"rank {rank_value(rank)}: incarnations {killed} were SIGKILLed: time "
                        "nothing in the file covers may be a span the kill lost",
                        rank_value(rank),
                    )
                    bound(path, 0.0, seconds(figure), Reason((lost,)))
            elif spare_of[category] or open_end or guessed:
                # (a guessed stretch may have held a save or an evaluation the kill lost)
                upper = None if open_end else seconds(figure + spare_of[category] + guessed)
                lower = figure
                if category == Category.WASTED_PROGRESS:
                    # what the metric points show redone may end in a save in flight, and
                    # what was booked past a guessed horizon may have been kept; goodput
                    # booked may have been redone
                    lower -= doubt + guessed
                    upper = None if open_end else seconds(figure + spare_of[category] - doubt
                                                           + redone)  # fmt: skip
                if open_end and category == Category.WASTED_PROGRESS:
                    # the last one may have saved after its last exported span
                    lower -= acc["per_incarnation"][-1]["wasted_progress_ns"]
                bound(path, seconds(lower), upper, unattributed)
        unseen = {id(u.inc): u for u in unseen_list}
        for inc, entry in zip(incs, acc["per_incarnation"], strict=True):
            after = unseen.get(id(inc))
            if after is None and not (inc.ended == "killed" or (inc is incs[-1] and open_end)):
                continue
            rest = None if after is None else after.until - after.start
            wasted = entry["wasted_progress_ns"]
            # what its metric points show redone may end in a save in flight (the job's
            # lower bound takes the same off)
            shown = 0 if after is None else after.doubt
            placed = rest is not None and inc.index not in unplaced
            maybe = 0 if after is None else after.redone[1] - after.redone[0]
            bound(
                f"incarnations.{inc.index}.wasted_s",
                seconds(wasted - shown) if placed else 0.0,
                None if rest is None else seconds(wasted + rest + spare + maybe),
                Reason((_after_its_records(inc, after is not None and after.ruled_out),)),
            )

    _count_bounds(report, ranks, job_rank, furthest, stretches, bound)
    return bounds


def _after_its_records(inc: Incarnation, ruled_out: bool = False) -> Clause:
    """Why an incarnation's wasted time is a bound: the time after its last record (a
    restart after it ruled out or not)."""
    if inc.ended == "killed":
        text = "was SIGKILLed: what it did after its last exported span is unknown"
    elif ruled_out:
        text = (
            "may have ended later than its last record: the time after it until the next "
            "one's start is unknown"
        )
    else:
        text = (
            "may have ended later than its last record, or be followed by a restart killed "
            "before its first export: the time after it until the next one's start is unknown"
        )
    return Clause(f"incarnation {inc.index} {text}", incarnation=inc.index)


def _count_bounds(
    report: dict[str, Any],
    ranks: dict[str, tuple[list[Incarnation], dict[str, Any]]],
    job_rank: str,
    furthest: dict[str, Any],
    stretches: dict[str, bool],
    bound: Any,
) -> None:
    """The bounds of the counts (wasted iterations, iterations, the stragglers' cost): lower
    bounds after a kill, or where a restart may hide between a rank's records."""
    job_killed = sorted({i for incs, _ in ranks.values() for i in _killed(incs)})
    hidden_anywhere = any(stretches.values())

    def named(rank: str) -> str | None:
        return rank if len(ranks) > 1 else None

    def shown(positions: Iterable[int]) -> list[Shown]:
        return [
            one
            for rank, (incs, acc) in ranks.items()
            for one in _shown(incs, acc, positions, named(rank))
        ]

    for position, exact in enumerate(furthest["incarnations_exact"]):
        lower = furthest["incarnations_lower"][position]
        if not exact:
            found = shown([position])
            bound(f"incarnations.{position}.wasted_iterations", lower, None,
                  _wasted_reason(job_killed, found), source_of_shown(found))  # fmt: skip
    positions = range(len(furthest["incarnations_exact"]))
    if not furthest["job_exact"] or hidden_anywhere:
        found = shown(positions)
        bound("wasted_iterations", furthest["job_lower"], None,
              _wasted_reason(job_killed, found, hidden_anywhere),
              source_of_shown(found))  # fmt: skip
    for rank, (incs, acc) in ranks.items():
        if not acc["wasted_exact"] or stretches[rank]:
            found = _shown(incs, acc, range(len(incs)), named(rank))
            bound(f"ranks.{rank_value(rank)}.wasted_iterations", _rank_lower(incs, acc), None,
                  _wasted_reason(_killed(incs), found, stretches[rank]),
                  source_of_shown(found))  # fmt: skip
    job_incs = ranks[job_rank][0]
    hidden = stretches[job_rank]  # a restart may hide between the job rank's records
    beyond, seen_by = _finished_beyond_spans(job_incs)
    more = (
        [Clause(f"their metric points show {beyond} more finished (incarnations {seen_by})")]
        if beyond
        else []
    )
    source = Source(tuple(seen_by)) if seen_by else None
    unseen = [_UNSEEN_RESTART] if hidden else []
    if report.get("iterations") is None and (job_killed or hidden):
        why = Clause(
            "no megatron.train.iteration span was exported before the kill (or the per_step "
            "span groups are off)"
        )
        bound("iterations.count", beyond + _clean_counts(job_incs) if beyond else 0, None,
              Reason((why, *more)), source)  # fmt: skip
    if report.get("iterations") and (_killed(job_incs) or hidden):
        killed = [_lower_count(_killed(job_incs))] if _killed(job_incs) else []
        bound("iterations.count", report["iterations"]["count"] + beyond, None,
              Reason((*killed, *unseen, *more)), source)  # fmt: skip
    if report.get("stragglers") is not None and (job_killed or hidden):
        why = Clause("a lower bound: the iterations a kill kept from the file are not compared")
        bound("straggler_s", report["straggler_s"], None,
              Reason((why if job_killed else _UNSEEN_LOWER,)))  # fmt: skip


def _cycle_restarted_in_process(inc: Incarnation, successor: Incarnation) -> bool:
    """Whether ``successor`` is the next cycle of ``inc``'s process, which NVRx restarted in
    process: the process lived from one to the other, its telemetry up, so no restart can
    hide between them."""
    return inc.ended == "restarted" and successor.process == inc.process


_KILL_MOMENT = "it was SIGKILLed, and when, after its last record, is in no file"
_HIDDEN_RESTART = Clause(
    "a restart killed before its first export may lie between it and the next incarnation, "
    "which is then the later of two restarts"
)


def restart_gap_bounds(
    entries: list[Any],
    incs: list[Incarnation],
    accounting: dict[str, Any],
) -> dict[str, Any]:
    """The bounds of the incarnations' ``restart_gap_s`` (``entries``, the report's, of the
    job rank's ``incs``): from its end (a kill's moment) to the next one's start.

    Exact where nothing can hide after it: a cycle NVRx restarted in process, or an end its
    spans say (not a kill) followed by the launch the restart counters show came next.
    After a kill, at most the time from its newest record (a metric point shows it alive)
    to the next start; at least the time from two export periods after its newest metric
    point (:func:`_killed_by`), where its points show their period, else 0, since the kill
    may have come just before that start. Where the counters do not rule one out, the
    stretch may hold a restart killed before its first export, and the next start is then
    the later of two restarts'."""
    bounds = {}
    for u in _unseen(incs, accounting):
        entry = entries[incs.index(u.inc)]
        clauses = []
        if u.inc.ended == "killed":
            clauses.append(Clause(_KILL_MOMENT, incarnation=u.inc.index))
        period = u.inc.sighting.export_period_ns if u.inc.sighting is not None else None
        if u.dead_by < u.successor and period is not None:
            clauses.append(
                Clause(
                    f"its kill came at most two export periods (2 × {period / 1e9:g} s, the "
                    "longest spacing of its newest metric points) after its last one",
                    incarnation=u.inc.index,
                )
            )
        if u.ruled_out:
            clauses.append(
                Clause(
                    "the launchers' restart counters rule out a restart between it and the "
                    "next incarnation (the same torchrun agent, of every rank, its count one "
                    "more)",
                    incarnation=u.inc.index,
                )
            )
        else:
            clauses.append(_HIDDEN_RESTART)
        bounds[f"incarnations.{entry['index']}.restart_gap_s"] = {
            "lower": seconds(u.successor - u.dead_by),
            "upper": seconds(u.successor - u.seen),
            "reason": Reason(tuple(clauses)),
        }
    return bounds


def advice_bounds(
    advice: dict[str, Any],
    incs: list[Incarnation],
    accounting: dict[str, Any],
):
    """The checkpoint advice's measured figures where a restart killed before its first
    export may hide between the job rank's incarnations: its failure (at least the
    failures the files show), its life (the time run, at most the unattributed time more),
    and so the mean time between failures (at most the larger of what the files show and
    that time over one failure more) and the mean restart (at most what the files show: the
    same restart time over more restarts). None where the restart counters rule one out.
    An incarnation read as a clean end that may have been a kill in its first iteration
    (:attr:`Incarnation.ending_unsure`) may be one failure more; and after a last one that
    ended some unknown time after its last record (killed, or maybe: such an incarnation is
    always followed by another or last), launches killed before their first export may have
    followed: the failures and the time run are at least what the files show."""
    unseen = [u for u in _unseen(incs, accounting) if not u.ruled_out]
    unsure = [inc.index for inc in incs if inc.ending_unsure and inc.ended != "killed"]
    open_end = bool(incs) and _ends_open(incs[-1])
    if not unseen and not unsure and not open_end:
        return {}
    said = []
    if unseen:
        said.append(
            "the failures and the time run are at least, the mean time between failures and "
            "the restart at most what the files show: a restart killed before its first "
            "export leaves no record, and the time between incarnations may hold one, with "
            "its failure, the time it ran and its restart"
        )
    if unsure:
        said.append(
            f"incarnations {unsure}, read as clean ends, may have been SIGKILLed in their "
            "first iteration: one failure more each"
        )
    if open_end:
        said.append(
            f"incarnation {incs[-1].index}, the last, ended some unknown time after its last "
            "record: restarts after it killed before their first export leave no record, "
            "each a failure more"
        )
    reason = Reason.of(*said)
    found: dict[str, tuple[Any, Any]] = {"failures": (advice["failures"], None)}
    if unseen:
        gap = sum(u.successor - u.start for u in unseen)
        found["run_s"] = (advice["run_s"], seconds(round(advice["run_s"] * 1e9) + gap))
    elif open_end:
        found["run_s"] = (advice["run_s"], None)
    if advice["mtbf_source"] == "observed" and advice["mtbf_s"] is not None and (unseen or unsure):
        upper = advice["mtbf_s"]
        if unseen:
            more = (advice["run_s"] + gap / 1e9) / (advice["failures"] + 1)
            upper = max(upper, math.ceil(more * 1e6) / 1e6)
        found["mtbf_s"] = (None, upper)
    if advice["restart_s"] is not None and unseen:
        found["restart_s"] = (None, advice["restart_s"])
    return {
        f"checkpoint_advice.{key}": {"lower": lower, "upper": upper, "reason": reason}
        for key, (lower, upper) in found.items()
    }


def window_bounds(
    entries: list[dict[str, Any]],
    incs: list[Incarnation],
    accounting: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """The bounds of the job rank's ``report --window`` entries (module doc)."""
    unseen = _unseen(incs, accounting)
    open_end = _ends_open(incs[-1])
    if not unseen and not open_end:
        return {}
    # (the time from a stretch's ``until`` to the next start is restart gap)
    stretches = [(u.start, u.until, Category.GOODPUT in u.hidden) for u in unseen]
    redone = [u.redone for u in unseen if u.redone[1] > u.redone[0]]
    killed = _killed(incs)
    said = [f"incarnations {killed} were SIGKILLed"] if killed else []
    hiding = any(not u.ruled_out for u in unseen)
    said.append(
        "this window holds time between an incarnation's last record and the next one's "
        "start (a kill's lost work"
        + (", or a restart killed before its first export" if hiding else "")
        + "), booked as restart_gap"
    )
    bounds: dict[str, dict[str, Any]] = {}
    first = accounting["start_ns"]
    for entry in entries:
        lo = first + round(entry["start_s"] * 1e9)
        hi = first + round(entry["end_s"] * 1e9)
        overlaps = [(max(0, min(hi, end) - max(lo, start)), kept) for start, end, kept in stretches]
        unknown = sum(overlap for overlap, _ in overlaps)
        # goodput booked here that may have been redone
        maybe = sum(max(0, min(hi, end) - max(lo, start)) for start, end in redone)
        open_here = open_end and entry is entries[-1]
        if not unknown and not open_here and not maybe:
            continue
        why = Reason.of(*said, *(["the last one ended after this window"] if open_here else []))
        totals = entry["accounting_ns"]
        good, wall = totals[Category.GOODPUT], totals["wall"]
        # goodput holds only the unknown time whose progress may have survived
        spare = sum(overlap for overlap, kept in overlaps if kept) + totals[Category.OTHER]
        at = f"windows.entries.{entry['index']}."

        def bound(path: str, lower: Any, upper: Any, at: str = at, why: Reason = why) -> None:
            bounds[at + path] = {"lower": lower, "upper": upper, "reason": why}

        if spare or open_here or maybe:
            upper = None if open_here else seconds(good + spare)
            bound("goodput_s", seconds(good - maybe), upper)
        if open_here:
            bound("goodput_fraction", None, None)
        elif wall and (spare or maybe):
            bound("goodput_fraction", _floor6((good - maybe) / wall), _ceil6((good + spare) / wall))
        if unknown or open_here:
            gap = totals[Category.RESTART_GAP]
            upper = None if open_here else seconds(gap)
            bound("badput_s.restart_gap", seconds(max(0, gap - unknown)), upper)
    return bounds


def _finished_beyond_spans(incs: list[Incarnation]) -> tuple[int, list[int]]:
    """(how many more iterations the killed incarnations' metric points show finished than
    their iteration spans, which incarnations)."""
    beyond, which = 0, []
    for inc in incs:
        if inc.ended != "killed":
            continue
        shown = finished_shown(inc)
        if shown is not None and shown > len(inc.iterations):
            beyond += shown - len(inc.iterations)
            which.append(inc.index)
    return beyond, which


def _clean_counts(incs: list[Incarnation]) -> int:
    """The iterations the incarnations that shut down cleanly finished, from their intervals'
    ranges (where known): without iteration spans, the rest of a lower bound of the count."""
    total = 0
    for inc in incs:
        first, last = inc.first_iteration, inc.last_iteration
        if inc.ended == "shutdown" and first is not None and last is not None:
            total += max(0, last + 1 - first)
    return total


def _seen_source(incs: list[Incarnation], alive: int, open_end: bool) -> Source | None:
    """Where a bound narrowed by the killed incarnations' metric points comes from."""
    seen = [inc for inc in incs[:-1] if inc.ended == "killed" and _seen_beyond_spans(inc)]
    if open_end and incs[-1].ended == "killed" and _seen_beyond_spans(incs[-1]):
        seen.append(incs[-1])
    if not seen:
        return None
    if len(seen) == 1:
        inc = seen[0]
        after = incs[inc.index + 1].start_ns if inc.index + 1 < len(incs) else None
        return Source((inc.index,), export=_ago(inc, after))
    return Source(tuple(inc.index for inc in seen))


def _wasted_reason(killed: list[int], shown: Iterable[Shown] = (), hidden: bool = False) -> Reason:
    """Why a wasted-iterations figure is a lower bound: kills (and what the killed
    incarnations' metric points show), a restart that may hide between records
    (``hidden``), or an interval closed mid-pass."""
    if killed:
        return Reason((_lower_count(killed), *[_UNSEEN_RESTART] * hidden), tuple(shown))
    if hidden:
        return Reason((_UNSEEN_LOWER,))
    return Reason.of(
        "a lower bound: an interval closed at an exception or signal counts the iteration in "
        "flight (which may not have finished), or an interval's iteration range is not known "
        "(no per-iteration spans or interval attributes to derive it from)"
    )
