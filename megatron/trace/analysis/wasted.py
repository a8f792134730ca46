"""Wasted progress: the iterations an incarnation ran whose progress did not survive it.

An incarnation's progress survives up to its *horizon*, the iteration the next
incarnation of the rank resumed from (its checkpoint load, else its first
iteration); a final one that was killed, cut short, failed or interrupted keeps only
what its last durable checkpoint save recorded (the rule in full:
:mod:`megatron.trace.analysis.accounting`). :func:`waste_of` gives an incarnation's
horizon, the start of its wasted window and the wasted iterations.
"""

from __future__ import annotations

from megatron.trace.analysis.sightings import completed
from megatron.trace.model.incarnation import Incarnation

__all__ = ["Waste", "resumed_at", "waste_of", "window_start"]


def resumed_at(later: list[Incarnation]) -> int | None:
    """The iteration the first of the ``later`` incarnations that shows one resumed from
    (its checkpoint load, else its first iteration); None: none shows one."""
    for successor in later:
        resumed = successor.resumed_from
        if resumed is None:
            resumed = successor.first_iteration
        if resumed is not None:
            return resumed
    return None


def _horizon(inc: Incarnation, later: list[Incarnation]) -> int | None:
    """The first iteration whose progress this incarnation lost (None: nothing lost).

    The iteration the next one resumed from, but where that is past every iteration this
    one reached, and its spans are whole (it failed, was interrupted or cut short: its
    end was written): then a restart between them that left no record saved the
    checkpoint, resumed from this one's last durable save, which is the horizon."""
    resumed = resumed_at(later)
    last = inc.last_iteration
    if resumed is not None and inc.ended in _WHOLE and last is not None and resumed > last + 1:
        return max([*inc.durable_saves(), _started(inc)])
    if resumed is not None:
        return resumed
    if inc.ended in ("shutdown", "running"):
        return None
    saved = inc.durable_saves()
    if saved:
        return max(saved)
    return inc.first_iteration if inc.first_iteration is not None else 0


#: How an incarnation ended whose spans were all written (but the loss past its last save).
_WHOLE = ("failed", "interrupted", "cut_short")


def _started(inc: Incarnation) -> int:
    """The iteration it started at, as its spans show (0: afresh, or not shown)."""
    if inc.resumed_from is not None:
        return inc.resumed_from
    return inc.first_iteration or 0


def window_start(inc: Incarnation, horizon: int) -> int | None:
    """Where the wasted window of ``inc`` would start were its horizon ``horizon``: where that
    iteration began, as far as its spans place it (None: they cannot)."""
    return _wasted(inc, horizon, None)[0]


def _placed(inc: Incarnation, later: list[Incarnation], horizon: int | None) -> int | None:
    """``horizon`` where the files place it (a successor shows where it resumed, or the
    incarnation its durable saves or its first iteration), else None: then 0 is only a
    guess (Megatron-LM's ``default`` groups record neither a load's iteration nor an
    iteration, and a kill within the export delay of a save loses that save's spans), and
    what a killed incarnation's metric points show past it would count iterations that
    survived. A killed one followed by incarnations none of which shows where it resumed
    (killed before its load was exported; Megatron-LM's ``default`` groups) has only a guess
    too: its last save or start the files show is the least its successor resumed from, and
    a save its kill kept from the file, of iterations past them, may be where it did. Where
    a later one trained (an interval or a save) without showing where it resumed, the spans
    record no resume point (Megatron-LM's ``default`` groups, whose save spans carry no
    iteration either): there the kill is assumed to have kept no save from the file, as the
    trace README says."""
    if resumed_at(later) is not None:
        return horizon
    if inc.ended == "killed" and later and not any(s.intervals or s.saves for s in later):
        return None
    if inc.durable_saves() or inc.first_iteration is not None:
        return horizon
    return None


def _wasted(
    inc: Incarnation, horizon: int | None, shown_past: int | None
) -> tuple[int | None, int | None, bool]:
    """(window start ns, wasted iterations, exact?) for one incarnation; its metric points
    count past ``shown_past`` (:func:`_placed`; None: they do not count)."""
    if horizon is None:  # nothing lost, as far as its spans show (a guessed clean end: a guess)
        return None, 0, not inc.ending_unsure
    start = inc.iterations.start_of(horizon) if inc.iterations else None
    if start is None:
        # the interval boundary where iteration `horizon` began (or would have)
        before = [
            r["end_ns"]
            for r, facts in zip(inc.intervals, inc.interval_facts, strict=True)
            if facts.last_iteration is not None and facts.last_iteration < horizon
        ]
        if before:
            start = max(before)
        elif inc.intervals:
            start = inc.intervals[0]["start_ns"]
        elif inc.iterations and inc.iterations.end_before(horizon) is not None:
            # no interval (Megatron-LM without checkpointing): where the last iteration
            # before the horizon ended
            start = inc.iterations.end_before(horizon)
        elif inc.startup is not None:
            start = inc.startup["end_ns"]
        if inc.iterations:
            # iterations before the horizon were written, the horizon's was not (a kill lost
            # its span): the window starts past them, whatever interval boundary held them
            done = inc.iterations.end_before(horizon)
            if done is not None:
                start = done if start is None else max(start, done)
    # a killed one's metric points may show it got further than its spans
    shown = completed(inc) if inc.ended == "killed" and shown_past is not None else None
    beyond = max(0, shown[0] - shown_past) if shown is not None and shown_past is not None else 0
    if inc.iterations:
        # a kill loses the spans exported since the last batch: a lower bound then
        exact = inc.ended != "killed" and not inc.ending_unsure
        return start, max(beyond, inc.iterations.count_from(horizon)), exact
    last = inc.last_iteration
    first = inc.first_iteration if inc.first_iteration is not None else horizon
    count = max(0, (last if last is not None else horizon - 1) + 1 - max(horizon, first))
    # without per-iteration spans a killed in-flight interval's iterations are unknown,
    # and so is any range the intervals could not give (see megatron.trace.model.intervals)
    known = last is not None and all(
        f.first_iteration is not None and f.last_iteration is not None for f in inc.interval_facts
    )
    # an interval the lifecycle closed at an exception or signal counted the pass in flight
    # (megatron/training/telemetry_spans.py: its last iteration is from the passes begun),
    # which may not have finished: one too many, perhaps
    closed_mid_pass = inc.ended in ("failed", "interrupted", "cut_short", "restarted")
    exact = inc.ended != "killed" and not inc.ending_unsure and known and not closed_mid_pass
    return start, max(count, beyond), exact


# What waste_of gives of one incarnation: its horizon, _wasted's (window start, wasted
# iterations, exact?) at that horizon, and the horizon where the files place it (None:
# a guess, past which its metric points show nothing; _placed).
Waste = tuple[int | None, tuple[int | None, int | None, bool], int | None]


def waste_of(inc: Incarnation, later: list[Incarnation]) -> Waste:
    """The progress ``inc`` lost: its horizon (the incarnations ``later`` of its rank tell
    where the next resumed), what :func:`_wasted` makes of it, and that horizon where
    the files place it (:func:`_placed`)."""
    horizon = _horizon(inc, later)
    shown_past = _placed(inc, later, horizon)
    return horizon, _wasted(inc, horizon, shown_past), shown_past
