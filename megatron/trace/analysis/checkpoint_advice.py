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
  (M) is the time the incarnations ran (the sum of their durations, a moment
  two of them overlap counted once) over that count, from :data:`MIN_FAILURES`
  failures on, else ``--mtbf`` (which wins whenever given), else not computed.
* ``restart_s`` (R): what a restart cost, as measured: the mean over the
  restarts of the gap before the incarnation (none when it began before the one
  before it ended) and its startup (the checkpoint load in it); with no restart in
  the trace, the first startup.
* ``iteration_ms``: the median iteration time, to turn an interval into
  iterations; ``now``: the interval the job used (the most common step between
  the iterations it saved at, times ``iteration_ms``).

Each choice (``now``, ``young``, ``daly``) carries the badput per day it is
expected to cost, by Young's first-order model: a save every ``tau`` of
training, and per failure half an interval of progress lost on average and a
restart::

    badput_per_day = 86400 * (C / tau + (tau / 2 + R) / M)

(Young's interval is the one that minimises it.)

Both models assume what a failure costs is small against the time between
failures: the save, the restart, and the interval itself (no failure strikes
during a restart or a save). Where the measured save cost or restart is more
than :data:`SMALL` (a tenth) of ``M``, Young's and Daly's intervals are not
given, and the reason names which figure is not small. What holds at any
ratio is the exact model of the same job under failures that come at random
(a Poisson process of rate ``1/M``, striking during saves and restarts too):
a stretch of ``tau`` training and its save survives with probability
``exp(-(tau + C)/M)``, and the expected wall time per second of training is::

    M exp(R/M) (exp((tau + C)/M) - 1) / tau

so the *availability* (training per wall second) is its inverse, and the
interval that maximises it, whatever the restart costs, is::

    tau_availability = M (1 + W0(-exp(-1 - C/M)))

(``W0`` the principal branch of Lambert's W; Daly's "perfect restart"
optimum, which is Young's to first order in ``C/M``). Every choice's badput
a day is then ``86400 (1 - availability)``: under a day whatever the figures,
where Young's first-order figure can exceed the day it is a share of
(``badput_model`` says which model the advice's badput figures come from:
``young`` while save, restart and every interval are small against ``M``,
else ``exponential``).
"""

from __future__ import annotations

import collections
import itertools
import math
import statistics
from typing import Any

from megatron.trace._store.stretches import Stretches
from megatron.trace.analysis.hangs import find_hang
from megatron.trace.analysis.report import CheckpointAdvice, IntervalChoice
from megatron.trace.model.incarnation import Incarnation
from megatron.trace_format.semconv import ITERATION
from megatron.trace_format.words import counted

__all__ = [
    "ADVICE_RULE",
    "FAILED_ENDINGS",
    "MIN_FAILURES",
    "SMALL",
    "availability",
    "availability_optimum",
    "badput_per_day",
    "checkpoint_advice",
    "daly",
    "exponential_badput_per_day",
    "save_step",
    "young",
]

#: How an incarnation ended that counts as a failure (and a hang, whatever the ending).
FAILED_ENDINGS = frozenset({"killed", "failed", "cut_short", "restarted"})
#: Fewer failures than this say little of the time between them: ``--mtbf`` then.
MIN_FAILURES = 2
#: Young's and Daly's models hold while the save cost and the restart are at most this
#: share of the mean time between failures (and the interval at most the MTBF itself).
SMALL = 0.1
_DAY_S = 86400.0
ADVICE_RULE = (
    "young = sqrt(2 C M); daly = sqrt(2 C M) (1 + sqrt(C/2M)/3 + (C/2M)/9) - C (C < 2M, else M), "
    "only while C and R are at most M/10; availability = M (1 + W0(-exp(-1 - C/M))), the "
    "interval that maximises tau / (M exp(R/M) (exp((tau + C)/M) - 1)) under random failures; "
    "badput per day = 86400 (C/tau + (tau/2 + R)/M) (young) while C, R are at most M/10 and "
    "tau at most M, else 86400 (1 - availability at tau) (exponential); C the save cost, M the "
    "mean time between failures, R the restart cost, tau the interval of training between saves"
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


def availability(interval_s: float, save_s: float, mtbf_s: float, restart_s: float) -> float:
    """The share of wall time that is training, saving every ``interval_s``, under
    failures at random (rate ``1/mtbf_s``) that strike during saves and restarts too."""
    x = (interval_s + save_s) / mtbf_s
    # in logarithms: costs of many MTBFs overflow exp() (the availability is then ~0)
    log_expm1 = x + math.log1p(-math.exp(-x)) if x > 30 else math.log(math.expm1(x))
    return math.exp(math.log(interval_s / mtbf_s) - restart_s / mtbf_s - log_expm1)


def exponential_badput_per_day(
    interval_s: float, save_s: float, mtbf_s: float, restart_s: float
) -> float:
    """The seconds a day that are not training, by the exact model: under a day."""
    return _DAY_S * (1 - availability(interval_s, save_s, mtbf_s, restart_s))


def availability_optimum(save_s: float, mtbf_s: float) -> float:
    """The interval (s) that maximises :func:`availability`: ``M (1 + W0(-exp(-1 - C/M)))``.

    It does not depend on the restart cost (the restart scales the expected time, not
    where its minimum is)."""
    return mtbf_s * (1 + _lambert_w0(-math.exp(-1 - save_s / mtbf_s)))


def _lambert_w0(z: float) -> float:
    """The principal branch of Lambert's W on ``(-1/e, 0)``: the ``w`` in ``(-1, 0)`` with
    ``w exp(w) = z``, by Halley's iteration from the branch point's series."""
    p = math.sqrt(max(0.0, 2 * (1 + math.e * z)))
    w = -1 + p - p * p / 3 + 11 / 72 * p**3
    for _ in range(50):
        e = math.exp(w)
        f = w * e - z
        if f == 0:
            break
        step = f / (e * (w + 1) - (w + 2) * f / (2 * w + 2))
        w -= step
        if abs(step) <= 1e-15 * (1 + abs(w)):
            break
    return w


def _save_cost(incs: list[Incarnation]) -> tuple[float | None, int]:
    """(C in s, the number of saves)."""
    durations = [s["end_ns"] - s["start_ns"] for inc in incs for s in inc.saves]
    if not durations:
        return None, 0
    other_ns = sum(end - start for inc in incs for start, end in inc.checkpoint_time)
    return (statistics.median(durations) + other_ns / len(durations)) / 1e9, len(durations)


def save_step(incs: list[Incarnation]) -> int | None:
    """The step the job saved at, in iterations (the advice's ``now``; None: fewer than two
    saves): the most common step between the iterations it saved at (ties: the longest), so
    the save at the end of training, after a shorter step, is not taken for the interval
    (saves at 50, 100 and a final 120: every 50)."""
    saved = sorted(
        {
            s["attributes"][ITERATION]
            for inc in incs
            for s in inc.saves
            if isinstance(s["attributes"].get(ITERATION), int)
        }
    )
    steps = collections.Counter(b - a for a, b in itertools.pairwise(saved))
    return max(steps, key=lambda step: (steps[step], step)) if steps else None


def _running_s(incs: list[Incarnation]) -> float:
    """The time the incarnations ran, each moment once (they may overlap: a new run
    started while ranks of the old one still wrote)."""
    ran = Stretches()
    for inc in incs:
        ran.add(inc.start_ns, inc.end_ns)
    return ran.covered() / 1e9


def _restart_cost(entries: list[dict[str, Any]]) -> float | None:
    """The mean gap-plus-startup of the restarts (the first startup when none). An
    incarnation that started before the one before it ended (ranks of the old run still
    writing) had no gap: its restart cost its startup."""
    costs = [
        max(0.0, after["start_s"] - (before["start_s"] + before["duration_s"]))
        + (after["startup_s"] or 0)
        for before, after in itertools.pairwise(entries)
    ]
    if costs:
        return sum(costs) / len(costs)
    return entries[0]["startup_s"] if entries else None


def _choice(
    interval_s: float,
    iterations: int | None,
    c: float,
    m: float | None,
    r: float | None,
    model: str | None,
) -> IntervalChoice:
    per_day = None
    if m is not None and r is not None and interval_s > 0:
        formula = badput_per_day if model == "young" else exponential_badput_per_day
        per_day = round(formula(interval_s, c, m, r), 3)
    return {
        "interval_s": round(interval_s, 3),
        "iterations": iterations,
        "badput_per_day_s": per_day,
    }


def _not_small(c: float, m: float, r: float | None) -> list[str]:
    """The figures that are not small against the mean time between failures, said."""
    said = []
    if c > SMALL * m:
        said.append(f"the save cost ({c:.3f} s)")
    if r is not None and r > SMALL * m:
        said.append(f"the restart ({r:.3f} s)")
    return said


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
    run_s = _running_s(incs)
    source = "option" if mtbf_s is not None else None
    if mtbf_s is None and failures >= MIN_FAILURES:
        mtbf_s, source = run_s / failures, "observed"
    restart_s = _restart_cost(entries)
    step = save_step(incs)
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
            f"{counted(failures, 'failure')} (kills, "
            f"crashes, hangs) in {run_s:.3f} s of running, under the {MIN_FAILURES} a mean "
            "time between failures needs: give it with --mtbf DURATION"
        )
    if step is None or iteration_s is None:
        not_computed.append(
            "the interval now: "
            + ("fewer than two saves" if step is None else "no megatron.train.iteration spans")
        )
    now = young_choice = daly_choice = best = None
    model = None
    now_s = step * iteration_s if step is not None and iteration_s is not None else None
    if save_s is not None and mtbf_s is not None and mtbf_s > 0:
        not_small = _not_small(save_s, mtbf_s, restart_s)
        taus = {"young": young(save_s, mtbf_s), "daly": daly(save_s, mtbf_s)}
        if not_small:
            not_computed.append(
                "young, daly: "
                + " and ".join(not_small)
                + f" {'is' if len(not_small) == 1 else 'are'} not small against the mean "
                f"time between failures ({mtbf_s:.3f} s): over {SMALL:g} of it, where "
                "Young's and Daly's models do not hold (see the availability optimum)"
            )
            taus = {}
        intervals = [*taus.values(), *([now_s] if now_s is not None else [])]
        model = (
            "young"
            if not not_small and restart_s is not None and all(t <= mtbf_s for t in intervals)
            else "exponential"
        )

        def chosen(tau: float) -> IntervalChoice:
            count = max(1, round(tau / iteration_s)) if iteration_s else None
            return _choice(tau, count, save_s, mtbf_s, restart_s, model)

        if taus:
            young_choice, daly_choice = chosen(taus["young"]), chosen(taus["daly"])
        best = chosen(availability_optimum(save_s, mtbf_s))
    if save_s is not None and now_s is not None:
        now = _choice(now_s, step, save_s, mtbf_s, restart_s, model)
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
        "availability": best,
        "badput_model": model,
        "not_computed": not_computed,
    }
    return advice
