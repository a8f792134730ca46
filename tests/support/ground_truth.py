"""Job histories whose truth is known: the files the trainer would write, and the truth beside.

A :class:`History` is a plan: ranks, an iteration time, a save interval, and
a sequence of incarnations, each ending in a clean exit or a SIGKILL at a
chosen point (inside an iteration or a save, before the first checkpoint as
well as after), followed by a restart gap. :func:`simulate` runs the plan on
a clock of integer nanoseconds and returns, per rank, every span the job
produced (the ones it never got to export included) and a :class:`Truth`:
where every nanosecond of each rank's wall clock went, by the categories of
``megatron/trace/README.md`` applied to what really happened, the iterations
each incarnation redid, the failures, the stragglers. :func:`write` then
writes what the sink would have: spans in the order they ended, exported in
batches (``BatchSpanProcessor``: every ``export_delay_s`` of the rank, and
whenever 512 are queued) as OTLP/JSON lines, through :mod:`synthetic`'s line
builder; a SIGKILL loses whatever was queued since the rank's last export,
and the span in flight. Ranks share one file (``all_ranks``), their lines in
the order they were written, unless ``per_rank_files``.

How the job behaves, so the truth can be worked out without the reader:

* Data-parallel ranks step together: every rank's iteration lasts as long as
  the slowest rank's work plus the all-reduce (``sync_s``); a rank's
  ``megatron.grad_sync.finish`` span is what it waited, the rest its work.
* A SIGKILL strikes ``victim`` at a point of the phase in flight; the other
  ranks block in the collective of that phase and are SIGKILLed by the agent
  ``teardown_s`` later (they lose their own unexported tail too).
* A SIGKILL may also strike in the startup (its imports, the checkpoint
  load of a resumed one, the rest of the model's initialization): the other
  ranks block in that phase until the agent kills them. The startup's spans
  that ended before it are all it leaves; one killed before the rank's first
  export leaves nothing (:attr:`IncarnationTruth.exported`), an incarnation
  in the truth and in no file. A rank's truth covers its record
  (:class:`RankTruth`): from its first incarnation that exported anything.
* A save is durable once it ended before the kill; the next incarnation
  resumes from the latest durable save (a ``megatron.checkpoint.load`` in its
  startup), or from iteration 0 when there is none.
* A clean exit saves first (Megatron-LM's save at the end of training) unless
  it just saved.
* A hang: one rank stops in its own work, the others wait for it; the
  watchdog reports it on every rank, and a SIGTERM ends them all (everything
  exported, the spans in flight cut short). Its time from the last progress
  is ``hang``; the iterations past the last save are redone, as after a kill.
* An in-process restart (``restarted``): a fault (an exception) strikes
  ``victim`` in a step or a save, where a SIGKILL would; the other ranks'
  collective fails ``teardown_s`` later. Each rank's cycle ends there with its
  spans ended (the step in flight and the interval with ERROR status, the
  interval saying ``megatron.shutdown.reason = inprocess_restart``) and
  exported, nothing lost; NVRx calls ``pretrain()`` again in the same
  processes after the restart gap: the next incarnation is the next cycle of
  the same pid, its spans carrying ``nvrx.inprocess.iteration``. What the
  fault cost is booked as a kill's is (the step in flight wasted, a save in
  flight a save), and the files show all of it.

* The launchers' restart counters (``History.launcher``): torchrun starts each
  incarnation but the first again (``Plan.launch``), an unseen launch too; a requeue
  (Slurm's count one more) or a relaunch starts a new agent, counting from 0 again.
  One agent starts every rank (``History.agents`` ``one``: one node), or each rank
  has its own (``per_rank``: a node each). An agent counts a restart after its own
  workers failed; after a kill only the victim's agent does: the others restart
  their healthy workers uncounted, a membership change to torchrun (a node waiting:
  the victim's agent). The resource says the counts as this trainer writes them
  (strings), and the agent and how many workers it started unless ``agent_id`` is
  off (Megatron-LM's resource: the counts alone). Without a launcher (today's
  histories), none of them. A cycle NVRx restarted in process is no launch.

:func:`long_history` makes weeks of such a job (hundreds of kills, many
ranks) for the benchmarks.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from synthetic import LineWriter, bool_attribute, double_attribute, int_attribute, resource_json

__all__ = [
    "BATCH",
    "History",
    "Plan",
    "RankTruth",
    "Simulated",
    "Truth",
    "long_history",
    "simulate",
    "write",
]

NS = 1_000_000_000
BATCH = 512  # the batch processor's max_export_batch_size
T0_NS = 1_796_119_852_000_000_000
CATEGORIES = (
    "queue",
    "launch",
    "startup",
    "checkpoint_load",
    "checkpoint_save",
    "evaluation",
    "hang",
    "wasted_progress",
    "restart_gap",
    "other",
)


@dataclass(frozen=True)
class Plan:
    """One incarnation: ``iterations`` finished, then its ending.

    ``killed``: a SIGKILL ``into`` (0..1) of the way through the phase after
    them: the next iteration, or the save when ``in_save`` (only where a save
    falls due); or, with ``in_startup``, through that phase of the startup
    (``imports``, the ``load`` of a resumed one, the rest of ``model_init``),
    ``iterations`` then unused. A kill before the rank's first export leaves
    nothing in its file (:attr:`IncarnationTruth.exported`). ``hang``: rank
    ``victim`` stops in its own work in the next iteration, the others wait
    for it in the all-reduce; each rank's watchdog reports the stall
    ``hang_timeout_s`` after the last progress, and the operator's SIGTERM
    ends every rank ``hang_s`` after it (the spans in flight written cut
    short). ``restarted``: a fault where ``killed`` would strike in a step or a
    save (not in a startup), and NVRx restarts the cycle in the same process.
    ``shutdown``: a clean exit. ``gap_s``: the restart gap after it. ``launch``: how it
    was launched after the one before (where a launcher counts, ``History.launcher``):
    torchrun restarting its worker group, a requeue by Slurm, or a relaunch (a new torchrun
    agent: by hand, a script's retry loop).
    """

    iterations: int
    ending: Literal["shutdown", "killed", "hang", "restarted"] = "shutdown"
    into: float = 0.5
    in_save: bool = False
    in_startup: Literal["", "imports", "load", "model_init"] = ""
    victim: int = 0
    gap_s: float = 30.0
    hang_s: float = 60.0
    hang_timeout_s: float = 10.0
    launch: Literal["torchrun", "requeue", "relaunch"] = "torchrun"


@dataclass(frozen=True)
class History:
    """A job's plan: its ranks, how fast they are, how they save, export and restart."""

    incarnations: tuple[Plan, ...]
    ranks: int = 2
    work_s: float = 1.0  # a rank's work per iteration at factor 1
    sync_s: float = 0.05  # the all-reduce every rank waits for, even the slowest
    factors: tuple[float, ...] = ()  # per rank: its work is work_s * factor (default all 1)
    save_interval: int = 10
    save_s: float = 2.0
    startup_s: float = 20.0
    load_s: float = 3.0  # inside the startup of a resumed incarnation
    teardown_s: float = 0.5  # the agent kills the other ranks this long after the victim
    export_delay_s: tuple[float, ...] = ()  # per rank (default 5 s, the SDK's); 0: as each ends
    export_phase_s: tuple[float, ...] = ()  # per rank: the first export this long after start
    groups: Literal["per_step", "default"] = "per_step"
    per_rank_files: bool = False
    t0_ns: int = T0_NS
    # the metrics written beside the spans (metrics.jsonl): none, this project's trainer's
    # (the heartbeat and the iteration gauge beside the step-duration histogram, every
    # metric_period_s), or Megatron-LM's through nemo-lens (the step-duration histogram
    # and the loss gauge, recorded at each log interval, exported every metric_period_s)
    metrics: Literal["none", "trainer", "nemo_lens"] = "none"
    metric_period_s: float = 10.0
    metric_phase_s: tuple[float, ...] = ()  # per rank: its first export this long after start
    log_interval: int = 1  # the histogram is recorded when iteration (count) % this == 0
    log_interval_in_resource: bool = False  # the resource says megatron.log_interval
    # the launchers whose restart counters the resource carries: none (today's histories),
    # torchrun, or torchrun under Slurm (its requeue count too); agent_id: the resource
    # names the torchrun agent (this trainer's; Megatron-LM's does not)
    launcher: Literal["none", "torchrun", "slurm"] = "none"
    agent_id: bool = True
    # one torchrun agent starts every rank (one node), or each rank its own (a node each)
    agents: Literal["one", "per_rank"] = "one"

    def factor(self, rank: int) -> float:
        return self.factors[rank] if rank < len(self.factors) else 1.0

    def delay_ns(self, rank: int) -> int:
        delay = self.export_delay_s[rank] if rank < len(self.export_delay_s) else 5.0
        return round(delay * NS)

    def phase_ns(self, rank: int) -> int:
        phase = self.export_phase_s[rank] if rank < len(self.export_phase_s) else 0.0
        return round(phase * NS)

    def metric_phase_ns(self, rank: int) -> int:
        """When the rank's first metric export comes after its start (default: one period,
        as the SDK's periodic reader's first export does)."""
        if rank < len(self.metric_phase_s):
            return round(self.metric_phase_s[rank] * NS)
        return round(self.metric_period_s * NS)


@dataclass
class IncarnationTruth:
    index: int
    ended: str  # "shutdown", "killed", "cut_short" (a hang, ended by SIGTERM) or "restarted"
    start_ns: int
    end_ns: int  # when this rank's process really died (or exited)
    resumed_from: int  # the checkpoint it loaded (0: started afresh)
    first_iteration: int
    finished: int  # iterations it finished
    horizon: int | None  # iterations from this number on were redone (None: none were)
    wasted_iterations: int
    wasted_ns: int
    # whether the rank's file holds anything of it (a kill before the first export: nothing)
    exported: bool = True
    # its share of the rank's wall clock by category (the restart gap before it included)
    accounting_ns: dict[str, int] = field(default_factory=dict, repr=False)


@dataclass
class RankTruth:
    """One rank's truth over what its files can cover: from its first incarnation that
    exported anything to its end, or, when its last such incarnation ended cleanly (shut
    down, or a hang's SIGTERM: everything exported), to that one's end. Launches before
    the first record or after a clean last one that left nothing are outside every file;
    those between records are inside (``incarnations`` holds them all, ``exported`` says
    which the file shows)."""

    rank: int
    wall_ns: int
    accounting_ns: dict[str, int]  # "goodput" and every badput category
    incarnations: list[IncarnationTruth]  # those in the rank's record, in order
    iterations: int  # finished iterations, over the incarnations
    work_ns: int  # per iteration
    wait_ns: int

    @property
    def goodput_ns(self) -> int:
        return self.accounting_ns["goodput"]

    @property
    def wasted_iterations(self) -> int:
        return sum(inc.wasted_iterations for inc in self.incarnations)

    @property
    def seen(self) -> list[IncarnationTruth]:
        """The incarnations the rank's file shows, as the reader numbers them."""
        return [inc for inc in self.incarnations if inc.exported]


@dataclass
class Truth:
    """What really happened, per rank and for the job."""

    ranks: list[RankTruth]
    failures: int  # the job rank's incarnations ended by a kill or a hang (unseen ones too)
    restarts: int
    straggler_ranks: list[int]  # work over 1/0.9 times the fastest's (every iteration's alike)
    straggler_ns: int  # per counted iteration, slowest straggler's - slowest other's work
    counted_iterations: int  # iterations all ranks finished, past each incarnation's warm-up 2
    # (incarnation, the rank that stopped in its own work, ns from the last progress to the end)
    hangs: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def job(self) -> RankTruth:
        """The lowest rank: the one the report's job-level figures come from."""
        return self.ranks[0]

    @property
    def wasted_iterations(self) -> int:
        """The job's redone iterations: the most any rank finished past a horizon."""
        return max(r.wasted_iterations for r in self.ranks)


@dataclass
class _Span:
    """A span the job produced, in the words :class:`synthetic.LineWriter` takes."""

    name: str
    trace: str
    span_id: str
    parent: str
    start: int
    end: int
    attributes: str = ""
    links: str = ""
    depth: int = 0  # children end before (or with) their parents: written first
    status: str = "{}"  # OTLP/JSON status: {} is UNSET


@dataclass
class Simulated:
    history: History
    truth: Truth
    # per rank, per incarnation: (what makes the spans it produced, when it died or exited,
    # killed?); the spans are made as they are written, so a long history is never whole
    # in memory
    produced: list[list[tuple[Callable[[], list[_Span]], int, bool]]] = field(default_factory=list)
    # per incarnation: (its start, its startup's end, the checkpoint it resumed from, its
    # phases: (kind, start, end, iteration), every rank living through them alike, and the
    # start of the save a kill struck, if one did)
    timelines: list[tuple[int, int, int, list[tuple[str, int, int, int]], int | None]] = field(
        default_factory=list
    )
    # per rank, per incarnation: whether the rank's file holds anything of it
    exported: list[list[bool]] = field(default_factory=list)
    #: per incarnation: its process (incarnations of one process are cycles of an
    #: in-process restart) and its cycle there (NVRx's restart iteration)
    cycles: list[tuple[int, int]] = field(default_factory=list)
    #: per incarnation: the launchers' counters of its launch (Slurm's restart count, which
    #: torchrun agent, each rank's torchrun restart count: its agent's)
    launches: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)


class _Ids:
    def __init__(self) -> None:
        self._next = itertools.count(1)

    def span(self) -> str:
        return f"{next(self._next):016x}"

    def trace(self) -> str:
        return f"{next(self._next):032x}"


def simulate(history: History) -> Simulated:
    """Run the plan: every rank's spans (written or not) and the truth."""
    ids = _Ids()
    ranks = history.ranks
    works = [round(history.work_s * history.factor(r) * NS) for r in range(ranks)]
    step_ns = max(works) + round(history.sync_s * NS)
    save_ns, startup_ns, load_ns = (
        round(x * NS) for x in (history.save_s, history.startup_s, history.load_s)
    )
    teardown_ns = round(history.teardown_s * NS)
    per_step = history.groups == "per_step"
    incs: list[list[IncarnationTruth]] = [[] for _ in range(ranks)]
    produced: list[list[tuple[Callable[[], list[_Span]], int, bool]]] = [[] for _ in range(ranks)]
    durable = 0  # the latest durable checkpoint's iteration
    now = history.t0_ns
    ends = [now] * ranks  # where each rank's previous incarnation died
    hangs: list[tuple[int, int, int]] = []
    timelines: list[tuple[int, int, int, list[tuple[str, int, int, int]], int | None]] = []
    cycles: list[tuple[int, int]] = []
    process, cycle = 0, 0
    launches: list[tuple[int, int, tuple[int, ...]]] = []
    requeues, agent, counts = 0, 0, [0] * ranks

    for index, plan in enumerate(history.incarnations):
        if index:  # a new process, unless NVRx restarted the last cycle in process
            restarted = history.incarnations[index - 1].ending == "restarted"
            process, cycle = (process, cycle + 1) if restarted else (process + 1, 0)
            before = history.incarnations[index - 1]
            if restarted:
                pass  # no launch: the same process, its counters
            elif plan.launch == "torchrun":  # the agents whose workers failed count it
                for r in range(ranks):
                    own = history.agents == "one" or r == before.victim
                    counts[r] += before.ending != "killed" or own
            else:  # a new agent, counting from 0 again (a requeue: Slurm's count one more)
                requeues += plan.launch == "requeue"
                agent, counts = agent + 1, [0] * ranks
        cycles.append((process, cycle))
        launches.append((requeues, agent, tuple(counts)))
        start, resumed_from = now, durable
        # the timeline every rank lives through: (kind, start, end, iteration)
        phases: list[tuple[str, int, int, int]] = []
        t, iteration = start + startup_ns, resumed_from
        killed = plan.ending == "killed"
        faulted = plan.ending == "restarted"  # struck as a kill strikes; nothing lost
        hung = plan.ending == "hang"
        startup_kill = _startup_phase(plan, start, startup_ns, load_ns, resumed_from)
        for _ in range(plan.iterations if startup_kill is None else 0):
            phases.append(("iteration", t, t + step_ns, iteration))
            t += step_ns
            iteration += 1
            if iteration % history.save_interval == 0:
                phases.append(("save", t, t + save_ns, iteration))
                t += save_ns
        if plan.ending == "shutdown" and (not phases or phases[-1][0] != "save"):
            phases.append(("save", t, t + save_ns, iteration))  # the save at the end
            t += save_ns
        death = t
        if killed or faulted:
            if startup_kill is not None:
                kind, a, b = startup_kill
                at = iteration
            elif plan.in_save and phases and phases[-1][0] == "save":
                kind, a, b, at = phases.pop()  # the kill strikes during this save
            else:  # (in_save where no save falls due, resumed off the cadence: in the step)
                kind, a, b, at = "iteration", t, t + step_ns, iteration
            death = a + max(1, min(b - a - 1, round((b - a) * plan.into)))
            in_flight = (kind, a, at)
        if hung:  # stalls in the next iteration; SIGTERMed hang_s later
            in_flight = ("hang", t, iteration)
            death = t + round(plan.hang_s * NS)
            hangs.append((index, plan.victim, death - t))
        struck = in_flight[1] if (killed or faulted) and in_flight[0] == "save" else None
        timelines.append((start, start + startup_ns, resumed_from, phases, struck))
        saves_done = [p[3] for p in phases if p[0] == "save"]
        if saves_done:
            durable = saves_done[-1]
        final = index == len(history.incarnations) - 1
        # the horizon: iterations from here on were redone (or, after the last, lost)
        horizon = durable if killed or faulted or hung else None
        finished = plan.iterations if startup_kill is None else 0

        for r in range(ranks):
            dies = death + (teardown_ns if (killed or faulted) and r != plan.victim else 0)
            spans = functools.partial(
                _rank_spans, ids, history, r, index, start, phases, resumed_from, works[r],
                step_ns, in_flight if killed or faulted or hung else None, final,
                (plan, dies) if hung else None, (cycle, dies) if faulted else None,
                cycle if faulted or cycle else None,
            )  # fmt: skip
            acc = dict.fromkeys(("goodput", *CATEGORIES), 0)
            acc["restart_gap"] = start - ends[r] if index else 0
            # the startup as far as it got (the others block in the phase the victim died in)
            ready = min(start + startup_ns, dies) if startup_kill is None else startup_kill[1]
            loading = (start + startup_ns // 2, start + startup_ns // 2 + load_ns)
            loaded = max(0, min(ready, loading[1]) - loading[0]) if resumed_from else 0
            acc["startup"] += ready - start - loaded
            acc["checkpoint_load"] += loaded
            wasted = wasted_ns = 0
            for kind, a, b, at in phases:
                if kind == "save":
                    acc["checkpoint_save"] += b - a
                elif horizon is not None and at >= horizon:
                    acc["wasted_progress"] += b - a
                    wasted, wasted_ns = wasted + 1, wasted_ns + b - a
                else:
                    acc["goodput"] += b - a
            if killed or faulted:
                kind, a, _ = in_flight
                category = _IN_FLIGHT_CATEGORY[kind]
                acc[category] += dies - a
                if category == "wasted_progress":
                    wasted_ns += dies - a
            if hung:  # from the last progress to the end: the hang (it wins over the rest)
                acc["hang"] += dies - in_flight[1]
            ended = plan.ending if killed or faulted else "cut_short" if hung else "shutdown"
            exported = not killed or _exported_before(
                _first_span_end(start, startup_ns, startup_kill), start, dies,
                history.delay_ns(r), history.phase_ns(r),
            )  # fmt: skip
            incs[r].append(
                IncarnationTruth(
                    index, ended, start, dies, resumed_from, resumed_from, finished, horizon,
                    wasted, wasted_ns, exported, acc,
                )
            )  # fmt: skip
            produced[r].append((spans, dies, killed))
            ends[r] = dies
        now = max(ends) + round(plan.gap_s * NS)

    rank_truths = [_rank_truth(r, incs[r], works[r], step_ns - works[r]) for r in range(ranks)]
    job = rank_truths[0].incarnations
    fastest = min(works)
    # score under 0.9; every iteration of a rank works alike here, so a slower rank's
    # work always stands out of the (empty) spread of the fastest's
    stragglers = [r for r in range(ranks) if fastest / works[r] < 0.9] if ranks > 1 else []
    healthy = [works[r] for r in range(ranks) if r not in stragglers]
    # what the stragglers cost: their slowest work over the slowest healthy rank's
    lost = max(works) - max(healthy) if stragglers and per_step else 0
    counted = sum(max(0, inc.finished - 2) for inc in job)
    failures = sum(inc.ended != "shutdown" for inc in job)
    in_record = {inc.index for inc in job}
    truth = Truth(rank_truths, failures, len(job) - 1, stragglers, counted * lost, counted,
                  [hang for hang in hangs if hang[0] in in_record])  # fmt: skip
    exported = [[inc.exported for inc in rank] for rank in incs]
    return Simulated(history, truth, produced, timelines, exported, cycles, launches)


# The category of the time from where a kill's phase began to a rank's death.
_IN_FLIGHT_CATEGORY = {
    "iteration": "wasted_progress",
    "save": "checkpoint_save",
    "startup": "startup",
    "load": "checkpoint_load",
}


def _startup_phase(
    plan: Plan, start: int, startup_ns: int, load_ns: int, resumed_from: int
) -> tuple[str, int, int] | None:
    """(category, start, end) of the startup phase a kill strikes (None: it strikes later).
    A ``load`` kill in a run that starts afresh (no load) strikes ``model_init``."""
    if plan.ending != "killed" or not plan.in_startup:
        return None
    half = start + startup_ns // 2
    if plan.in_startup == "imports":
        return ("startup", start, half)
    if plan.in_startup == "load" and resumed_from:
        return ("load", half, half + load_ns)
    after_load = half + (load_ns if resumed_from else 0)
    return ("startup", after_load, start + startup_ns)


def _first_span_end(start: int, startup_ns: int, startup_kill: tuple | None) -> int | None:
    """When the incarnation's first span ended (its imports), None when the kill came first."""
    imports_end = start + startup_ns // 2
    if startup_kill is not None and startup_kill[1] < imports_end:
        return None
    return imports_end


def _exported_before(first_end: int | None, start: int, dies: int, delay: int, phase: int) -> bool:
    """Whether the batch processor exported a span before the rank died (:func:`_exports`'s
    ticks: every ``delay`` from ``phase`` after the start, each exporting what ended by it)."""
    if first_end is None:
        return False
    if delay == 0:
        return first_end <= dies
    tick = start + phase if phase else start + delay
    if tick < first_end:
        tick += -(-(first_end - tick) // delay) * delay
    return tick <= dies


def _rank_truth(rank: int, incs: list[IncarnationTruth], work_ns: int, wait_ns: int) -> RankTruth:
    """The rank's truth over its record (:class:`RankTruth`): from its first exported
    incarnation (the restart gap before it left out) to its end, or to its last exported
    one's end where that one ended cleanly."""
    shown = [position for position, inc in enumerate(incs) if inc.exported]
    first = shown[0] if shown else len(incs)
    last = len(incs) - 1
    if shown and incs[shown[-1]].ended != "killed":
        last = shown[-1]
    kept = incs[first : last + 1]
    totals = dict.fromkeys(("goodput", *CATEGORIES), 0)
    for position, inc in enumerate(kept):
        for key, ns in inc.accounting_ns.items():
            totals[key] += ns if key != "restart_gap" or position else 0
    wall = kept[-1].end_ns - kept[0].start_ns if kept else 0
    assert sum(totals.values()) == wall, (totals, wall)
    return RankTruth(rank, wall, totals, kept, sum(i.finished for i in kept), work_ns, wait_ns)


def _rank_spans(
    ids: _Ids,
    history: History,
    rank: int,
    index: int,
    start: int,
    phases: list[tuple[str, int, int, int]],
    resumed_from: int,
    work_ns: int,
    step_ns: int,
    in_flight: tuple[str, int, int] | None,
    final: bool,
    hang: tuple[Plan, int] | None = None,
    fault: tuple[int, int] | None = None,
    cycle: int | None = None,
) -> list[_Span]:
    """One rank's spans of one incarnation, as the lifecycle produces them (at a SIGKILL
    the in-flight interval and step never end, so they are not among them; at a hang's
    SIGTERM they are written cut short, the watchdog's stall record under the step; at an
    in-process restart's ``fault`` (its cycle, when it ended this rank's) they end with
    ERROR status, the interval saying why). ``cycle``: the incarnation's cycle of an
    in-process restart, on its startup and intervals (None: not under one)."""
    spans: list[_Span] = []
    trace, startup = ids.trace(), ids.span()
    startup_ns, load_ns = round(history.startup_s * NS), round(history.load_s * NS)
    half = startup_ns // 2
    imports, model_init = ids.span(), ids.span()
    spans.append(_Span("megatron.startup.imports", trace, imports, startup, start, start + half,
                       depth=1))  # fmt: skip
    if resumed_from:
        spans.append(_Span("megatron.checkpoint.load", trace, ids.span(), model_init,
                           start + half, start + half + load_ns,
                           int_attribute("megatron.iteration", resumed_from), depth=2))  # fmt: skip
    spans.append(_Span("megatron.startup.model_init", trace, model_init, startup, start + half,
                       start + startup_ns, depth=1))  # fmt: skip
    stamp = "" if cycle is None else "," + int_attribute("nvrx.inprocess.iteration", cycle)
    spans.append(_Span("megatron.startup", trace, startup, "", start, start + startup_ns,
                       bool_attribute("is_goodput_span", True) + stamp))  # fmt: skip
    if in_flight is not None and in_flight[0] in ("startup", "load"):
        # killed in its startup: what ended before the phase it died in, nothing after
        return [span for span in spans if span.end <= in_flight[1]]
    per_step = history.groups == "per_step"
    previous, previous_trace = startup, trace
    interval_index, interval_start = 0, start + startup_ns
    interval_trace, interval = ids.trace(), ids.span()
    first = resumed_from
    for kind, a, b, at in phases:
        if kind == "iteration":
            if per_step:
                it = ids.span()
                wait = step_ns - work_ns
                spans.append(
                    _Span(
                        "megatron.grad_sync.finish",
                        interval_trace,
                        ids.span(),
                        it,
                        b - wait,
                        b,
                        int_attribute("megatron.iteration", at),
                        depth=2,
                    )
                )
                spans.append(_Span("megatron.train.iteration", interval_trace, it, interval, a, b,
                                   int_attribute("megatron.iteration", at), depth=1))  # fmt: skip
            continue
        spans.append(_Span("megatron.checkpoint.save", interval_trace, ids.span(), interval, a, b,
                           int_attribute("megatron.iteration", at), depth=1))  # fmt: skip
        last_phase = (kind, a, b, at) == phases[-1]
        rerooted = not last_phase or in_flight is not None
        attributes = ",".join(
            (
                bool_attribute("is_goodput_span", True),
                int_attribute("megatron.interval.index", interval_index),
                bool_attribute("megatron.interval.rerooted", rerooted),
                int_attribute("megatron.interval.first_iteration", first),
                int_attribute("megatron.interval.last_iteration", at - 1),
            )
        )
        link = f'{{"traceId":"{previous_trace}","spanId":"{previous}","flags":256}}'
        spans.append(_Span("megatron.train", interval_trace, interval, "", interval_start, b,
                           attributes + stamp, link))  # fmt: skip
        previous, previous_trace = interval, interval_trace
        interval_index, interval_start, first = interval_index + 1, b, at
        interval_trace, interval = ids.trace(), ids.span()
    if fault is not None and in_flight is not None:
        _, end = fault
        kind, a, at = in_flight
        error = '{"code":2,"message":"RuntimeError: injected fault"}'
        name = "megatron.checkpoint.save" if kind == "save" else "megatron.train.iteration"
        if kind == "save" or per_step:
            spans.append(_Span(name, interval_trace, ids.span(), interval, a, end,
                               int_attribute("megatron.iteration", at), depth=1,
                               status=error))  # fmt: skip
        attributes = ",".join(
            (
                bool_attribute("is_goodput_span", True),
                int_attribute("megatron.interval.index", interval_index),
                bool_attribute("megatron.interval.rerooted", False),
                int_attribute("megatron.interval.first_iteration", first),
                # the lifecycle counts the pass in flight (telemetry_spans.py)
                int_attribute("megatron.interval.last_iteration", at if kind != "save" else at - 1),
                _str("megatron.shutdown.reason", "inprocess_restart"),
                _str("error.type", "RuntimeError"),
            )
        )
        link = f'{{"traceId":"{previous_trace}","spanId":"{previous}","flags":256}}'
        spans.append(_Span("megatron.train", interval_trace, interval, "", interval_start, end,
                           attributes + stamp, link, status=error))  # fmt: skip
    if hang is not None and in_flight is not None:
        plan, end = hang
        _, a, at = in_flight
        cut = bool_attribute("megatron.span.cut_short", True)
        step = ids.span()
        # the watchdog writes its record under the innermost open span, whatever the groups
        detected = a + round(plan.hang_timeout_s * NS)
        stalled_in = "megatron.train.iteration" if per_step else "megatron.train"
        record = ",".join(
            (
                int_attribute("megatron.iteration", at),
                double_attribute("megatron.hang.stalled_s", round(plan.hang_timeout_s, 3)),
                double_attribute("megatron.hang.timeout_s", plan.hang_timeout_s),
                int_attribute("megatron.hang.last_progress_unix_nano", a),
                _str("megatron.hang.span", stalled_in),
                _str("megatron.hang.frame", "train.py:1 in _own_work" if rank == plan.victim
                     else "torch/autograd/graph.py:979 in _engine_run_backward"),
                bool_attribute("megatron.hang.waiting", rank != plan.victim),
                *([int_attribute("megatron.hang.last_iteration", at - 1)] if at else []),
            )
        )  # fmt: skip
        spans.append(_Span("megatron.hang", interval_trace, ids.span(),
                           step if per_step else interval, detected, detected, record,
                           depth=2 if per_step else 1))  # fmt: skip
        if per_step:
            cut_iteration = int_attribute("megatron.iteration", at) + "," + cut
            spans.append(_Span("megatron.train.iteration", interval_trace, step, interval, a, end,
                               cut_iteration, depth=1))  # fmt: skip
        attributes = ",".join(
            (
                bool_attribute("is_goodput_span", True),
                int_attribute("megatron.interval.index", interval_index),
                bool_attribute("megatron.interval.rerooted", False),
                int_attribute("megatron.interval.first_iteration", first),
                cut,
            )
        )
        link = f'{{"traceId":"{previous_trace}","spanId":"{previous}","flags":256}}'
        spans.append(_Span("megatron.train", interval_trace, interval, "", interval_start, end,
                           attributes, link))  # fmt: skip
    return spans


def _str(key: str, value: str) -> str:
    return f'{{"key":"{key}","value":{{"stringValue":"{value}"}}}}'


def _exports(
    spans: list[_Span], start: int, dies: int, killed: bool, delay: int, phase: int
) -> Iterator[tuple[int, list[_Span]]]:
    """(when, batch): what the batch processor wrote of these spans, the batches in order."""
    ordered = sorted(spans, key=lambda s: (s.end, -s.depth))
    pending: list[_Span] = []
    tick = start + phase if phase else start + delay
    for span in ordered:
        if delay == 0:
            yield span.end, [span]
            continue
        while tick < span.end:
            if pending:
                yield tick, pending
                pending = []
            tick += delay
        pending.append(span)
        if len(pending) == BATCH:  # a full batch is exported at once
            yield span.end, pending
            pending = []
    if not pending:
        return
    if not killed:
        yield dies, pending  # the shutdown's flush
    elif tick <= dies:
        yield tick, pending  # exported at the last tick before the kill; after it, lost


def _pid(simulated: Simulated, rank: int, index: int) -> int:
    """The pid of the process that ran incarnation ``index`` of ``rank``: one per process,
    the cycles of an in-process restart sharing theirs."""
    return 10_000 + rank * 1_000 + simulated.cycles[index][0]


def _resource(simulated: Simulated, rank: int, index: int) -> str:
    """The resource of the process that ran incarnation ``index`` of ``rank``, with the
    launchers' counters where the history has a launcher (as this trainer writes them)."""
    history = simulated.history
    resource = resource_json(rank, history.ranks, _pid(simulated, rank, index), "truth")
    if history.launcher == "none":
        return resource
    requeues, agent, counts = simulated.launches[index]
    extra = [_str("slurm.torchelastic.restart_count", str(counts[rank]))]
    if history.agent_id:  # each agent pid 1 of its own container: its start time tells
        one = history.agents == "one"
        host = "b00t" if one else f"b00t-{rank}"
        extra.append(_str("torchelastic.agent.id", f"{host}/1/{1_000 + agent}"))
        workers = history.ranks if one else 1
        extra.append(int_attribute("torchelastic.agent.local_world_size", workers))
    if history.launcher == "slurm":
        extra += [_str("slurm.job.id", "4242"), _str("slurm.restart_count", str(requeues))]
    return resource[:-2] + "," + ",".join(extra) + "]}"


def write(simulated: Simulated, path: Path) -> list[Path]:
    """Write the files the job would have left; returns their paths (``path``, or one per
    rank beside it). Streams: one incarnation of each rank is in memory at a time."""
    history = simulated.history
    ids = itertools.count(1)

    def lines_of(rank: int) -> Iterator[tuple[int, int, int, str]]:
        """(when, rank, n, line) of the rank's lines, in the order it wrote them."""
        n = 0
        for index, (make, dies, killed) in enumerate(simulated.produced[rank]):
            writer = LineWriter(_resource(simulated, rank, index), ids, BATCH + 1)
            spans = make()
            start = min((s.start for s in spans), default=0)
            exported = False
            for when, batch in _exports(
                spans, start, dies, killed, history.delay_ns(rank), history.phase_ns(rank)
            ):
                exported = True
                for s in batch:
                    writer.span(s.name, s.trace, s.span_id, s.parent, s.start, s.end,
                                s.attributes, s.links, s.status)  # fmt: skip
                writer.flush()
                yield when, rank, n, writer.lines.pop()
                n += 1
            # the truth's account of what the file shows is what was written
            assert exported is simulated.exported[rank][index], (rank, index, exported)

    if history.metrics != "none":
        write_metrics(simulated, path.with_name("metrics.jsonl"))
    if history.per_rank_files:
        paths = []
        for rank in range(history.ranks):
            rank_path = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
            with rank_path.open("w") as file:
                file.writelines(text for *_, text in lines_of(rank))
            paths.append(rank_path)
        return paths
    with path.open("w") as file:  # the ranks' lines in the order they were appended
        merged = heapq.merge(*(lines_of(rank) for rank in range(history.ranks)))
        file.writelines(text for *_, text in merged)
    return [path]


#: The resource attribute a job may set to say its log interval (where the histogram of step
#: durations is recorded once every so many iterations).
LOG_INTERVAL_ATTRIBUTE = "megatron.log_interval"


def _metric_line(resource: str, metrics: list[str]) -> str:
    return (
        '{"resourceMetrics":[{"resource":' + resource + ',"scopeMetrics":[{"scope":'
        '{"name":"megatron","version":"0.1.0"},"metrics":[' + ",".join(metrics) + "]}]}]}\n"
    )


def _gauge(name: str, at: int, value: int | float) -> str:
    point = f'"asInt":"{value}"' if isinstance(value, int) else f'"asDouble":{value}'
    return f'{{"name":"{name}","gauge":{{"dataPoints":[{{"timeUnixNano":"{at}",{point}}}]}}}}'


def _histogram(name: str, since: int, at: int, count: int, total_ms: float) -> str:
    """A cumulative histogram point (aggregationTemporality 2, the SDK's default)."""
    point = (
        f'{{"startTimeUnixNano":"{since}","timeUnixNano":"{at}","count":"{count}",'
        f'"sum":{total_ms},"bucketCounts":["0","{count}"],"explicitBounds":[0.0]}}'
    )
    return f'{{"name":"{name}","histogram":{{"dataPoints":[{point}],"aggregationTemporality":2}}}}'


def _metric_lines(simulated: Simulated, rank: int) -> Iterator[tuple[int, int, str]]:
    """(when, rank, line) of the metric exports of one rank's processes, in time order:
    every ``metric_period_s`` from its first (``metric_phase_ns``) while it lives, and, but
    after a SIGKILL, once more as it ends (the shutdown's collection)."""
    history = simulated.history
    period = round(history.metric_period_s * NS)
    trainer = history.metrics == "trainer"
    for index, ((_, dies, killed), (start, ready, resumed, phases, struck)) in enumerate(
        zip(simulated.produced[rank], simulated.timelines, strict=True)
    ):
        resource = _resource(simulated, rank, index)
        # a cycle NVRx restarts in process goes on living: no shutdown's export of its own
        ends_process = history.incarnations[index].ending != "restarted"
        if history.log_interval_in_resource:
            value = f'{{"intValue":"{history.log_interval}"}}'
            extra = f'{{"key":"{LOG_INTERVAL_ATTRIBUTE}","value":{value}}}'
            resource = resource[:-2] + "," + extra + "]}"
        ends = [(b, at) for kind, _, b, at in phases if kind == "iteration" and b <= dies]
        step_ms = next(((b - a) / 1e6 for kind, a, b, _ in phases if kind == "iteration"), 1.0)
        times = [b for b, _ in ends]
        logs = list(
            itertools.accumulate((int((at + 1) % history.log_interval == 0) for _, at in ends),
                                 initial=0)
        )  # fmt: skip
        saves = [(a, b) for kind, a, b, _ in phases if kind == "save"]
        saves += [(struck, dies)] if struck is not None else []
        first = start + history.metric_phase_ns(rank)
        ticks = [(t, False) for t in range(first, dies, period)]
        for when, final in ticks + ([(dies, True)] if ends_process and not killed else []):
            finished = bisect.bisect_right(times, when)
            logged = logs[finished]
            metrics = []
            if trainer:
                metrics.append(_gauge("megatron.training.running", when, 0 if final else 1))
                if when >= ready:
                    completed = ends[finished - 1][1] + 1 if finished else resumed
                    metrics.append(_gauge("megatron.training.iteration", when, completed))
                # the save in flight then (its start, Unix seconds), as the trainer's gauge says
                began = next((a for a, b in saves if a <= when < b), 0)
                metrics.append(
                    _gauge("megatron.training.checkpoint_save_start_time", when, began / NS)
                )
            if logged:
                metrics.append(
                    _histogram(
                        "megatron.training.step_duration_ms", start, when, logged, logged * step_ms
                    )
                )
                if not trainer:
                    metrics.append(_gauge("megatron.training.loss", when, 2.5))
            if metrics:
                yield when, rank, _metric_line(resource, metrics)


def write_metrics(simulated: Simulated, path: Path) -> Path:
    """Write ``metrics.jsonl`` as the job's metric readers would have (all ranks' lines in
    the order they were appended); returns its path."""
    merged = heapq.merge(*(_metric_lines(simulated, r) for r in range(simulated.history.ranks)))
    with path.open("w") as file:
        file.writelines(line for *_, line in merged)
    return path


def long_history(
    *,
    days: float = 14,
    ranks: int = 8,
    kills: int = 300,
    iteration_s: float = 30.0,
    save_interval: int = 20,
    seed: int = 0,
) -> History:
    """Weeks of a job killed ``kills`` times at random points on random ranks (about
    ``days`` of training in all), with a slow rank and per-rank export delays."""
    rng = random.Random(seed)
    total = round(days * 86400 / iteration_s)
    cuts = sorted(rng.sample(range(1, total), kills))
    plans = []
    done = 0
    for cut in cuts:
        plans.append(
            Plan(
                max(0, cut - done),
                "killed",
                into=rng.uniform(0.05, 0.95),
                victim=rng.randrange(ranks),
                gap_s=rng.uniform(10, 600),
            )
        )
        done = cut
    plans.append(Plan(max(1, total - done)))
    return History(
        tuple(plans),
        ranks=ranks,
        work_s=iteration_s,
        sync_s=0.5,
        factors=tuple(1.4 if r == ranks - 1 else 1.0 for r in range(ranks)),
        save_interval=save_interval,
        save_s=20.0,
        startup_s=120.0,
        load_s=30.0,
        export_delay_s=tuple(5.0 + r % 3 for r in range(ranks)),
        export_phase_s=tuple(0.5 * r for r in range(ranks)),
    )
