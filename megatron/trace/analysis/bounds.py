"""The figures a file can only bound, and their bounds: the report's ``bounds``.

A SIGKILL loses what the rank's batch span processor had queued since its last
export (up to ``OTEL_BSP_SCHEDULE_DELAY``, 5 s by default) and every span still
open: the file of a killed incarnation ends at its last exported span, before the
process really died. So:

* the iterations it redid are at least those the file shows past the horizon
  (:mod:`~megatron.trace.analysis.wasted`): a lower bound. The job's figure is the
  largest any rank gives (the rank whose export got furthest), per incarnation and
  in all; it is exact only when no rank's incarnation was killed;
* the time from its last exported span to the next incarnation's first is
  *unattributed*: no span says what it was. The sweep books it as ``restart_gap``
  (so the categories still sum exactly to the wall clock), and the report says it
  is a bound: ``restart_gap`` is at most its figure and at least that less the
  unattributed time; each category whose spans a kill can take with it
  (:data:`HIDDEN`) at least its figure and at most that plus the unattributed time
  (and any ``other`` of the rank: a lost span's time the file shows no cover for);
  but only the unattributed time the category may hold (:func:`_may_hold`): goodput
  not when the successor resumed from the last checkpoint the files show, or afresh;
  startup and checkpoint load not once the incarnation's startup is in the file;
* a final killed incarnation (no successor) ended some unknown time after its last
  span: the wall clock is a lower bound, and those categories have no upper bound;
* ``report --window``: a window holding unattributed time, or the last window when
  the last incarnation was killed, is bounded as the whole is (its goodput, share
  and ``restart_gap``, under ``windows.entries.N.``).

A killed incarnation's own metric points (:mod:`~megatron.trace.analysis.sightings`)
narrow these: the time they show it alive is not restart gap (a final one's wall clock
runs to its newest point), the iterations they show finished raise the wasted iterations'
and ``iterations.count``'s lower bounds, and the stretch they show redone is booked as
wasted progress (less what may be a save in flight, taken off its lower bound); such a
bound also says its ``source`` (``the last metric export of incarnation 2, 8.0 s after
its last exported span and at most 31.5 s before the kill``: the successor's start bounds
the kill's time, which no file holds).

Each bound is ``{"lower": x or null, "upper": y or null, "reason": text}`` under the
figure's path in the report (``wall_s``, ``badput_s.wasted_progress``,
``ranks.1.goodput_s``, ``incarnations.0.wasted_iterations``...), in the figure's
unit; a figure with no entry is exact. The shape is stated once, by
:class:`~megatron.trace.analysis.report.Bound` and ``report.schema.json``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

from megatron.trace.analysis.accounting import seconds
from megatron.trace.analysis.resumed import resume_ranges
from megatron.trace.analysis.sightings import completed, finished_shown, unseen_from
from megatron.trace.model.identity import rank_value
from megatron.trace.model.incarnation import Incarnation
from megatron.trace_format.semconv import Category
from megatron.trace_format.words import counted

__all__ = ["HIDDEN", "furthest_waste", "reasons_once", "report_bounds", "window_bounds"]

#: The categories whose spans a kill can lose (their time then unattributed).
HIDDEN = (
    Category.GOODPUT,
    Category.WASTED_PROGRESS,
    Category.CHECKPOINT_SAVE,
    Category.EVALUATION,
    Category.STARTUP,
    Category.CHECKPOINT_LOAD,
)

_SHOWN = "; their metric points show more: "

_LOWER_COUNT = (
    "a lower bound: incarnations {killed} were SIGKILLed, and the spans of their last "
    "iterations (those the batch processor had not exported yet) never reached the file"
)


def _killed(incs: list[Incarnation]) -> list[int]:
    return [inc.index for inc in incs if inc.ended == "killed"]


def furthest_waste(ranks: dict[str, tuple[list[Incarnation], dict[str, Any]]]) -> dict[str, Any]:
    """The job's wasted iterations over all ranks: per incarnation of the job rank (the
    first), the most any rank's incarnation of that index shows, with its lower bound
    and whether it is exact; and their sums, the job's.

    A killed incarnation followed by another lost at least what the file shows past the
    iteration its successor resumed from. One killed last (no successor yet) may have
    finished and saved a checkpoint after its last exported span: its lower bound is 0.
    Without iteration spans, an interval closed at an exception or a signal says its last
    iteration from the passes begun, the one in flight too: one fewer is its lower bound.
    """
    per_rank = list(ranks.values())
    job_incs, _ = per_rank[0]
    figures: list[int | None] = []
    lowers: list[int | None] = []
    exact: list[bool] = []
    for position in range(len(job_incs)):
        counts, low, known = [], [], True
        for incs, acc in per_rank:
            entries = acc["per_incarnation"]
            if position < len(entries) and entries[position]["wasted_iterations"] is not None:
                counts.append(entries[position]["wasted_iterations"])
                low.append(_lower(incs, position, entries[position]))
                known = known and entries[position]["wasted_exact"]
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
    if inc.ended == "killed":
        return 0 if position == len(incs) - 1 else count
    if inc.ended in ("failed", "interrupted", "cut_short") and not inc.iterations:
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
    """A killed incarnation followed by another, and its unattributed time: from its last
    span (or the end of what its metric points show redone) to the successor nothing says
    what the time was (:func:`~megatron.trace.analysis.sightings.unseen_from`)."""

    inc: Incarnation
    start: int  # where its unattributed time begins
    seen: int  # until when its metric points show it alive
    successor: int  # its successor's start
    doubt: int  # the ns of what its metric points show redone that may be a save in flight
    #: the categories that time may hold (:func:`_may_hold`)
    hidden: frozenset[str]


def _unseen(incs: list[Incarnation], accounting: dict[str, Any]) -> list[_Unseen]:
    """Each killed incarnation's unattributed time (:class:`_Unseen`), in order."""
    found = []
    resumed = resume_ranges(incs)
    for position, inc in enumerate(incs[:-1]):
        if inc.ended != "killed":
            continue
        successor = incs[position + 1].start_ns
        horizon = accounting["per_incarnation"][position]["placed_horizon"]
        start, seen, doubt = unseen_from(inc, horizon, successor)
        hidden = _may_hold(inc, resumed[position][0], horizon)
        found.append(
            _Unseen(inc, min(start, successor), min(seen, successor), successor, doubt, hidden)
        )
    return found


def _may_hold(inc: Incarnation, resumed: int, horizon: int | None) -> frozenset[str]:
    """The categories of :data:`HIDDEN` a killed incarnation's unattributed time (after its
    last record, before its successor) may hold.

    Training redone, a save and an evaluation, always. Its startup and checkpoint load
    (which runs in the startup) only if the file lacks its ``megatron.startup``: once
    that ended, every later record is past it. Goodput only if progress made in that
    time may have survived: the successor resumed (at ``horizon``) from a checkpoint saved
    in it, past every iteration the files show durable before it, its durable saves and
    where it resumed itself (at least ``resumed``). A successor that resumed from one of
    those (saved 200, killed, resumed from 200; or killed before its first save and
    restarted afresh) kept nothing of that time; where the files do not place the
    successor's resume point (``horizon`` None), it may have. (An incarnation that left
    nothing in the files, killed before its first export, is not seen at all.)"""
    hidden = {Category.WASTED_PROGRESS, Category.CHECKPOINT_SAVE, Category.EVALUATION}
    if inc.startup is None:
        hidden |= {Category.STARTUP, Category.CHECKPOINT_LOAD}
    if horizon is None or horizon > max([*inc.durable_saves(), resumed]):
        hidden.add(Category.GOODPUT)
    return frozenset(hidden)


class _Tail(NamedTuple):
    """What a rank's killed incarnations leave unattributed, in ns."""

    gap: int  # between their last records and their successors' starts
    alive: int  # the part of it their metric points show them alive
    doubt: int  # booked as wasted progress from their metric points: a save in flight?
    spare: int  # what a category may hold beyond its figure, at most
    #: per category of :data:`HIDDEN`, what it may hold beyond its figure (:func:`_may_hold`)
    spare_of: dict[str, int]
    open_end: bool  # whether the last incarnation was killed
    unseen: list[_Unseen]  # each killed incarnation's, that these sum


def _rank_tail(incs: list[Incarnation], accounting: dict[str, Any]) -> _Tail:
    """The rank's :class:`_Tail`."""
    unseen = _unseen(incs, accounting)
    gap = sum(u.successor - u.start for u in unseen)
    alive = sum(u.seen - u.start for u in unseen)
    doubt = sum(u.doubt for u in unseen)
    killed = any(inc.ended == "killed" for inc in incs)
    other = accounting["totals_ns"][Category.OTHER] if killed else 0
    spare_of = {
        category: other
        + sum(u.successor - u.start + u.doubt for u in unseen if category in u.hidden)
        for category in HIDDEN
    }
    open_end = bool(incs) and incs[-1].ended == "killed"
    return _Tail(gap, alive, doubt, gap + doubt + other, spare_of, open_end, unseen)


def _guessed(incs: list[Incarnation], accounting: dict[str, Any]) -> tuple[int, list[int]]:
    """(the wasted progress booked for killed incarnations, but the last, whose horizon the
    files do not place (its ``placed_horizon`` None: 0 is a guess), which ones): it may
    instead have been kept. The last one's is bounded as a final kill's."""
    total, which = 0, []
    for inc, entry in zip(incs[:-1], accounting["per_incarnation"], strict=False):
        guessed = entry["horizon"] is not None and entry["placed_horizon"] is None
        if inc.ended == "killed" and guessed:
            total += entry["wasted_progress_ns"]
            which.append(inc.index)
    return total, which


def _alive_text(incs: list[Incarnation], alive: int, open_end: bool) -> str:
    """What the killed incarnations' metric points said of their lives, for a reason."""
    text = ""
    if alive:
        text += (
            f"; their metric points show them alive {seconds(alive):.3f} s of it (so not "
            "restart gap)"
        )
    last = incs[-1] if incs else None
    if open_end and last is not None:
        if _seen_beyond_spans(last):
            text += (
                f"; the last one was alive at its last metric export, {_ago(last)}, and "
                "ended some unknown time after"
            )
        else:
            text += "; the last one ended some unknown time after its last span"
    return text


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


class _Shown(NamedTuple):
    """A killed incarnation whose metric points show more progress than its spans: the
    source of a wasted-iterations lower bound."""

    incarnation: int
    text: str  # as a person reads it (naming the rank where the job has several)
    export: str  # "its metric export 3.0 s after ...": when that export was


def _shown(
    incs: list[Incarnation],
    accounting: dict[str, Any],
    positions: Iterable[int],
    rank: str | None = None,
) -> list[_Shown]:
    """Per killed incarnation at ``positions`` whose metric points show more progress than
    its spans: where its wasted iterations' lower bound comes from (naming its ``rank``,
    where given: the job has several)."""
    on = "" if rank is None else f" on rank {rank_value(rank)}"
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
        export = f"its metric export {_ago(inc, incs[position + 1].start_ns, at)}"
        text = (
            f"incarnation {inc.index}{on}: ≥ {top - horizon} ({export}: {name} "
            f"says {counted(top, 'iteration')} completed, its successor resumed from {horizon})"
        )
        found.append(_Shown(inc.index, text, export))
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

    def bound(path: str, lower: Any, upper: Any, reason: str, source: str | None = None) -> None:
        bounds[path] = {"lower": lower, "upper": upper, "reason": reason}
        if source:
            bounds[path]["source"] = source

    for rank, (incs, acc) in ranks.items():
        killed = _killed(incs)
        if not killed:
            continue
        gap, alive, doubt, spare, spare_of, open_end, unseen_list = _rank_tail(incs, acc)
        kept = spare_of[Category.GOODPUT]
        guessed, unplaced = _guessed(incs, acc)
        totals, wall = acc["totals_ns"], acc["wall_ns"]
        where = f"rank {rank_value(rank)}: incarnations {killed} were SIGKILLed"
        unattributed = (
            f"{where}; {seconds(gap):.3f} s between their last records and the restart "
            "is unattributed (booked as restart_gap)"
        ) + _alive_text(incs, alive, open_end)
        if unplaced:
            unattributed += (
                f"; incarnations {unplaced} show no checkpoint saved or resumed from: "
                f"the {seconds(guessed):.3f} s booked as their wasted progress may have been "
                "kept (goodput)"
            )
        seen = _seen_source(incs, alive, open_end)
        prefixes = [f"ranks.{rank_value(rank)}."]
        if rank == job_rank:
            prefixes.append("")
        goodput = totals[Category.GOODPUT]
        for prefix in prefixes:
            if open_end:
                last = incs[-1]
                narrows = _seen_beyond_spans(last)
                source = f"its last metric export, {_ago(last)}" if narrows else None
                bound(f"{prefix}wall_s", seconds(wall), None, unattributed, source)
                bound(f"{prefix}goodput_fraction", None, None, unattributed)
            elif (kept or guessed) and wall:
                bound(f"{prefix}goodput_fraction", _floor6(goodput / wall),
                      _ceil6((goodput + kept + guessed) / wall), unattributed)  # fmt: skip
            if kept or open_end or guessed:
                upper = None if open_end else seconds(goodput + kept + guessed)
                bound(f"{prefix}goodput_s", seconds(goodput), upper, unattributed)
        if rank != job_rank:
            continue
        for category in (*HIDDEN[1:], Category.RESTART_GAP, Category.OTHER):
            if category in not_computed:
                continue
            figure = totals[category]
            path = f"badput_s.{category}"
            if category == Category.RESTART_GAP:
                if gap:
                    bound(path, seconds(max(0, figure - gap)), seconds(max(0, figure - alive)),
                          unattributed, seen)  # fmt: skip
            elif category == Category.OTHER:
                if figure:
                    bound(
                        path,
                        0.0,
                        seconds(figure),
                        f"{where}: time nothing in the file covers may be a span the kill lost",
                    )
            elif spare_of[category] or open_end or guessed:
                # (a guessed stretch may have held a save or an evaluation the kill lost)
                upper = None if open_end else seconds(figure + spare_of[category] + guessed)
                lower = figure
                if category == Category.WASTED_PROGRESS:
                    # what the metric points show redone may end in a save in flight, and
                    # what was booked past a guessed horizon may have been kept
                    lower -= doubt + guessed
                    upper = None if open_end else seconds(figure + spare_of[category] - doubt)
                if open_end and category == Category.WASTED_PROGRESS:
                    # the last one may have saved after its last exported span
                    lower -= acc["per_incarnation"][-1]["wasted_progress_ns"]
                bound(path, seconds(lower), upper, unattributed)
        unseen = {id(u.inc): u for u in unseen_list}
        for inc, entry in zip(incs, acc["per_incarnation"], strict=True):
            if inc.ended != "killed":
                continue
            after = unseen.get(id(inc))
            rest = None if after is None else after.successor - after.start
            wasted = entry["wasted_progress_ns"]
            # what its metric points show redone may end in a save in flight (the job's
            # lower bound takes the same off)
            shown = 0 if after is None else after.doubt
            bound(
                f"incarnations.{inc.index}.wasted_s",
                seconds(wasted - shown) if rest is not None and inc.index not in unplaced else 0.0,
                None if rest is None else seconds(wasted + rest + spare - gap),
                f"incarnation {inc.index} was SIGKILLed: what it did after its last exported "
                "span is unknown",
            )

    job_killed = sorted({i for incs, _ in ranks.values() for i in _killed(incs)})

    def named(rank: str) -> str | None:
        return rank if len(ranks) > 1 else None

    def shown(positions: Iterable[int]) -> list[_Shown]:
        return [
            one
            for rank, (incs, acc) in ranks.items()
            for one in _shown(incs, acc, positions, named(rank))
        ]

    for position, exact in enumerate(furthest["incarnations_exact"]):
        lower = furthest["incarnations_lower"][position]
        if not exact:
            texts = shown([position])
            bound(f"incarnations.{position}.wasted_iterations", lower, None,
                  _wasted_reason(job_killed, texts), _exports_source(texts))  # fmt: skip
    positions = range(len(furthest["incarnations_exact"]))
    if not furthest["job_exact"]:
        texts = shown(positions)
        bound("wasted_iterations", furthest["job_lower"], None,
              _wasted_reason(job_killed, texts), _exports_source(texts))  # fmt: skip
    for rank, (incs, acc) in ranks.items():
        if not acc["wasted_exact"]:
            texts = _shown(incs, acc, range(len(incs)), named(rank))
            bound(f"ranks.{rank_value(rank)}.wasted_iterations", _rank_lower(incs, acc), None,
                  _wasted_reason(_killed(incs), texts), _exports_source(texts))  # fmt: skip
    job_incs = ranks[job_rank][0]
    beyond, seen_by = _finished_beyond_spans(job_incs)
    more = (
        f"; their metric points show {beyond} more finished (incarnations {seen_by})"
        if beyond
        else ""
    )
    source = None
    if len(seen_by) == 1:
        source = f"the last metric export of incarnation {seen_by[0]}"
    elif seen_by:
        source = f"the last metric exports of {_several(seen_by)}"
    if report.get("iterations") is None and job_killed:
        bound("iterations.count", beyond + _clean_counts(job_incs) if beyond else 0, None,
              "no megatron.train.iteration span was exported before the kill (or the "
              "per_step span groups are off)" + more, source)  # fmt: skip
    if report.get("iterations") and _killed(job_incs):
        bound("iterations.count", report["iterations"]["count"] + beyond, None,
              _LOWER_COUNT.format(killed=_killed(job_incs)) + more, source)  # fmt: skip
    if report.get("stragglers") is not None and job_killed:
        reason = "a lower bound: the iterations a kill kept from the file are not compared"
        bound("straggler_s", report["straggler_s"], None, reason)
    return bounds


def window_bounds(
    entries: list[dict[str, Any]], incs: list[Incarnation], accounting: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """The bounds of the job rank's ``report --window`` entries (module doc)."""
    killed = _killed(incs)
    if not killed:
        return {}
    stretches = [
        (u.start, u.successor, Category.GOODPUT in u.hidden) for u in _unseen(incs, accounting)
    ]
    open_end = incs[-1].ended == "killed"
    reason = (
        f"incarnations {killed} were SIGKILLed: this window holds time between a killed "
        "incarnation's last exported span and the restart, booked as restart_gap"
    )
    bounds: dict[str, dict[str, Any]] = {}
    first = accounting["start_ns"]
    for entry in entries:
        lo = first + round(entry["start_s"] * 1e9)
        hi = first + round(entry["end_s"] * 1e9)
        overlaps = [(max(0, min(hi, end) - max(lo, start)), kept) for start, end, kept in stretches]
        unknown = sum(overlap for overlap, _ in overlaps)
        open_here = open_end and entry is entries[-1]
        if not unknown and not open_here:
            continue
        why = reason if not open_here else f"{reason}; the last one ended after this window"
        totals = entry["accounting_ns"]
        good, wall = totals[Category.GOODPUT], totals["wall"]
        # goodput holds only the unknown time whose progress may have survived
        spare = sum(overlap for overlap, kept in overlaps if kept) + totals[Category.OTHER]
        at = f"windows.entries.{entry['index']}."

        def bound(path: str, lower: Any, upper: Any, at: str = at, why: str = why) -> None:
            bounds[at + path] = {"lower": lower, "upper": upper, "reason": why}

        if spare or open_here:
            bound("goodput_s", seconds(good), None if open_here else seconds(good + spare))
        if open_here:
            bound("goodput_fraction", None, None)
        elif wall and spare:
            bound("goodput_fraction", _floor6(good / wall), _ceil6((good + spare) / wall))
        if unknown:
            gap = totals[Category.RESTART_GAP]
            bound("badput_s.restart_gap", seconds(max(0, gap - unknown)), seconds(gap))
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


def _exports_source(shown: list[_Shown]) -> str | None:
    """Where a wasted-iterations bound comes from, short: the metric export of the one
    incarnation whose points showed more than its spans, or of several."""
    shown = list(dict.fromkeys(shown))
    if not shown:
        return None
    if len(shown) == 1:
        return shown[0].export.replace("its metric export", "the last metric export", 1)
    which = {one.incarnation for one in shown}
    if len(which) == 1:
        return f"the last metric exports of incarnation {which.pop()} on {len(shown)} ranks"
    return f"the last metric exports of {len(which)} killed incarnations"


def _seen_source(incs: list[Incarnation], alive: int, open_end: bool) -> str | None:
    """Where a bound narrowed by the killed incarnations' metric points comes from, short."""
    seen = [inc for inc in incs[:-1] if inc.ended == "killed" and _seen_beyond_spans(inc)]
    if open_end and _seen_beyond_spans(incs[-1]):
        seen.append(incs[-1])
    if not seen:
        return None
    if len(seen) == 1:
        inc = seen[0]
        after = incs[inc.index + 1].start_ns if inc.index + 1 < len(incs) else None
        return f"the last metric export of incarnation {inc.index}, {_ago(inc, after)}"
    return f"the last metric exports of {_several([inc.index for inc in seen])}"


def _several(indices: list[int]) -> str:
    """Some killed incarnations, for a bound's source (a line of the text report): named
    while they are few, counted when a long history has many (its reasons name them)."""
    if len(indices) <= 4:
        return f"incarnations {indices}"
    return f"{len(indices)} killed incarnations"


def _wasted_reason(killed: list[int], shown: Iterable[_Shown] = ()) -> str:
    if killed:
        text = _LOWER_COUNT.format(killed=killed)
        if shown:
            text += _SHOWN + "; ".join(dict.fromkeys(one.text for one in shown))
        return text
    return (
        "a lower bound: an interval closed at an exception or signal counts the iteration in "
        "flight (which may not have finished), or an interval's iteration range is not known "
        "(no per-iteration spans or interval attributes to derive it from)"
    )


def reasons_once(bounds: dict[str, dict[str, Any]]) -> list[str]:
    """The bounds' reasons as a reader wants them: each once, in order, less one that
    another says whole. A rank's (or an incarnation's) wasted-iterations reason names the
    metric exports of some of the kills the job's reason names, and would repeat them."""

    def parts(reason: str) -> tuple[str, set[str]]:
        head, said, shown = reason.partition(_SHOWN)
        return head, set(shown.split("; ")) if said else set()

    reasons = list(dict.fromkeys(bound["reason"] for bound in bounds.values()))
    split = [parts(reason) for reason in reasons]
    return [
        reason
        for reason, (head, shown) in zip(reasons, split, strict=True)
        if not shown
        or not any(
            other != reason and other_head == head and shown <= other_shown
            for other, (other_head, other_shown) in zip(reasons, split, strict=True)
        )
    ]
