"""How often to checkpoint: Young's and Daly's optimum interval from the trace's own figures.

Saving costs time every interval; a failure loses the progress made since the
last save, and the restart. With ``C`` the time a save costs training and
``M`` the mean time between failures, the interval of training between saves
that loses the least is, to first order, Young's (1974)::

    tau_young = sqrt(2 C M)

and, to higher order, Daly's (2006)::

    tau_daly = sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C    (C < 2M; else M)

The figures, all from the job rank's spans:

* ``save_s`` (C): the median duration of its ``megatron.checkpoint.save``
  spans, the time a save blocks training (an async save's span only
  dispatches the write), plus, where Megatron-LM's other checkpoint spans
  cover time (a finalize, an exposed save), that time spread evenly over the
  saves.
* ``failures``: the incarnations that ended ``killed``, ``failed`` or
  ``cut_short``, or hung (a Ctrl-C, ``interrupted``, is no failure); ``mtbf_s``
  (M) is the time the incarnations ran (the sum of their durations) over
  that count, from :data:`MIN_FAILURES` failures on, else ``--mtbf`` (which
  wins whenever given), else not computed.
* ``restart_s`` (R): what a restart cost, as measured: the mean over the
  restarts of the gap before the incarnation and its startup (the checkpoint
  load in it); with no restart in the trace, the first startup.
* ``iteration_ms``: the median iteration time, to turn an interval into
  iterations; ``now``: the interval the job used (the median step between the
  iterations it saved at, times ``iteration_ms``).

Each choice (``now``, ``young``, ``daly``) carries the badput per day it is
expected to cost, by Young's first-order model: a save every ``tau`` of
training, and per failure half an interval of progress lost on average and a
restart::

    badput_per_day = 86400 * (C / tau + (tau / 2 + R) / M)

(Young's interval is the one that minimises it.)
"""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

from megatron.trace.analysis.hangs import find_hang
from megatron.trace.analysis.report import CheckpointAdvice, IntervalChoice
from megatron.trace.model.incarnation import Incarnation
from megatron.trace_format.semconv import ITERATION

__all__ = [
    "ADVICE_RULE",
    "FAILED_ENDINGS",
    "MIN_FAILURES",
    "badput_per_day",
    "checkpoint_advice",
    "daly",
    "young",
]

#: How an incarnation ended that counts as a failure (and a hang, whatever the ending).
FAILED_ENDINGS = frozenset({"killed", "failed", "cut_short"})
#: Fewer failures than this say little of the time between them: ``--mtbf`` then.
MIN_FAILURES = 2
_DAY_S = 86400.0
ADVICE_RULE = (
    "young = sqrt(2 C M); daly = sqrt(2 C M) (1 + sqrt(C/2M)/3 + (C/2M)/9) - C (C < 2M, else M); "
    "badput per day = 86400 (C/tau + (tau/2 + R)/M); C the save cost, M the mean time between "
    "failures, R the restart cost, tau the interval of training between saves"
)


def young(save_s: float, mtbf_s: float) -> float:
    """Young's optimum interval (s) between saves."""
    return math.sqrt(2 * save_s * mtbf_s)


def daly(save_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum interval (s) between saves."""
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - save_s


def badput_per_day(interval_s: float, save_s: float, mtbf_s: float, restart_s: float) -> float:
    """The seconds a day saves every ``interval_s``, the progress failures lose and the
    restarts cost, by Young's first-order model."""
    return _DAY_S * (save_s / interval_s + (interval_s / 2 + restart_s) / mtbf_s)


def _save_cost(incs: list[Incarnation]) -> tuple[float | None, int]:
    """(C in s, the number of saves)."""
    durations = [s["end_ns"] - s["start_ns"] for inc in incs for s in inc.saves]
    if not durations:
        return None, 0
    other_ns = sum(end - start for inc in incs for start, end in inc.checkpoint_time)
    return (statistics.median(durations) + other_ns / len(durations)) / 1e9, len(durations)


def _save_step(incs: list[Incarnation]) -> int | None:
    """The median step between the iterations the job saved at."""
    saved = sorted(
        {
            s["attributes"][ITERATION]
            for inc in incs
            for s in inc.saves
            if isinstance(s["attributes"].get(ITERATION), int)
        }
    )
    steps = [b - a for a, b in itertools.pairwise(saved)]
    return int(statistics.median_low(steps)) if steps else None


def _restart_cost(entries: list[dict[str, Any]]) -> float | None:
    """The mean gap-plus-startup of the restarts (the first startup when none)."""
    costs = [
        (after["start_s"] - (before["start_s"] + before["duration_s"])) + (after["startup_s"] or 0)
        for before, after in itertools.pairwise(entries)
    ]
    if costs:
        return sum(costs) / len(costs)
    return entries[0]["startup_s"] if entries else None


def _choice(
    interval_s: float, iterations: int | None, c: float, m: float | None, r: float | None
) -> IntervalChoice:
    per_day = (
        round(badput_per_day(interval_s, c, m, r), 3)
        if m is not None and r is not None and interval_s > 0
        else None
    )
    return {
        "interval_s": round(interval_s, 3),
        "iterations": iterations,
        "badput_per_day_s": per_day,
    }


def checkpoint_advice(
    incs: list[Incarnation],
    entries: list[dict[str, Any]],
    iteration_ms: float | None,
    mtbf_s: float | None = None,
) -> CheckpointAdvice:
    """The advice for the job rank's incarnations ``incs`` (``entries``: the report's
    incarnation entries of them; ``iteration_ms``: the median iteration time; ``mtbf_s``:
    ``--mtbf``); its ``not_computed`` says why a figure is None (kept there, not in the
    report's, so a run without failures does not read as one missing figures)."""
    not_computed: list[str] = []
    save_s, saves = _save_cost(incs)
    failures = sum(1 for inc in incs if inc.ended in FAILED_ENDINGS or find_hang(inc))
    run_s = sum(entry["duration_s"] for entry in entries)
    source = "option" if mtbf_s is not None else None
    if mtbf_s is None and failures >= MIN_FAILURES:
        mtbf_s, source = run_s / failures, "observed"
    restart_s = _restart_cost(entries)
    step = _save_step(incs)
    iteration_s = iteration_ms / 1000 if iteration_ms else None
    # the figures as the JSON gives them, so the formulas redone from it give the same
    save_s, mtbf_s, restart_s = (
        None if x is None else round(x, 6) for x in (save_s, mtbf_s, restart_s)
    )
    if save_s is None:
        not_computed.append(
            "no megatron.checkpoint.save spans (the load_checkpoint span "
            "group off, or no --save): the save cost is not measured"
        )
    if mtbf_s is None:
        not_computed.append(
            f"{failures} failure{'s' if failures != 1 else ''} (kills, "
            f"crashes, hangs) in {run_s:.3f} s of running, under the {MIN_FAILURES} a mean "
            "time between failures needs: give it with --mtbf DURATION"
        )
    if step is None or iteration_s is None:
        not_computed.append(
            "the interval now: "
            + ("fewer than two saves" if step is None else "no megatron.train.iteration spans")
        )
    now = young_choice = daly_choice = None
    if save_s is not None and step is not None and iteration_s is not None:
        now = _choice(step * iteration_s, step, save_s, mtbf_s, restart_s)
    if save_s is not None and mtbf_s is not None:
        chosen = []
        for tau in (young(save_s, mtbf_s), daly(save_s, mtbf_s)):
            count = max(1, round(tau / iteration_s)) if iteration_s else None
            chosen.append(_choice(tau, count, save_s, mtbf_s, restart_s))
        young_choice, daly_choice = chosen
    advice: CheckpointAdvice = {
        "rule": ADVICE_RULE,
        "save_s": save_s,
        "saves": saves,
        "failures": failures,
        "run_s": round(run_s, 6),
        "mtbf_s": mtbf_s,
        "mtbf_source": source,
        "restart_s": restart_s,
        "iteration_ms": iteration_ms,
        "save_every": step,
        "now": now,
        "young": young_choice,
        "daly": daly_choice,
        "not_computed": not_computed,
    }
    return advice
