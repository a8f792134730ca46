"""Live goodput metrics: the job's goodput accounting, exported at every metrics export.

``megatron-trace report`` answers "where did the time go" from the files;
a dashboard on an OTLP metrics backend (Prometheus, Mimir, Grafana) wants
the same figures while the job runs. So the job computes them in-process,
from what :class:`~megatron.core.telemetry.tally.SpanTally` kept of its
structural spans as they end, with ``watch``'s live accounting of one
process (:class:`~megatron.trace.live.process.LiveProcess`: ``report``'s
accounting, judged running as of the collection, so the interval in flight
counts up to that moment), and exports them as observable gauges. They are
observed by the metric reader's thread when it collects (every 10 s with
the ``jsonl`` sink, and once more at shutdown): the training loop does
nothing for them.

Metrics (all gauges; names in the ``megatron.training.*`` style):

* ``megatron.training.goodput_s``: time whose training progress survived.
* ``megatron.training.badput_s``, one series per ``megatron.badput.category``
  (``report``'s categories: ``queue``, ``launch``, ``startup``,
  ``checkpoint_load``, ``checkpoint_save``, ``evaluation``,
  ``wasted_progress``, ``restart_gap``, ``other``; plus
  ``wasted_or_restart_gap`` in a resumed incarnation, see below).
* ``megatron.training.wall_clock_s``: their sum.
* ``megatron.training.goodput_fraction``: goodput over wall clock.
* ``megatron.training.iteration``: iterations completed so far (the number
  of the next one, as Megatron counts).
* ``megatron.training.checkpoint_save_start_time``: when the checkpoint save
  in flight began, Unix seconds, 0 when none is (``time() - `` it is how long
  the save has run). After a SIGKILL the last export says whether a save was in
  flight, and since when, which the trace file cannot: ``megatron-trace report``
  books the time before it as wasted progress and the rest as the save.

The four goodput gauges carry ``megatron.goodput.scope``: ``job`` when they
cover the whole job so far, ``incarnation`` when they cover only this run.

**Resumed runs.** Each checkpoint save writes, beside the checkpoint, the
job's figures at that moment (``goodput_rank<R>.json``, by the exporting
rank ``R``); a run that resumes from that checkpoint starts from them, so
its figures stay the job's. What it cannot know is how the time between that
save and its own start splits between the previous run's wasted progress
(work after the save, lost) and the restart gap: that stretch is exported as
``wasted_or_restart_gap`` (``megatron-trace report`` on the files splits
it). A resumed run whose checkpoint has no such record (saved without
telemetry, or by another exporting rank) exports its own figures only, with
scope ``incarnation``.

A running incarnation loses nothing (``report`` says the same of a running
job); a save, evaluation or checkpoint load still in flight counts as the
interval (or startup) it runs in until it ends, as ``watch`` counts it. At
the export made at shutdown the figures are final, cut-short iterations
included, and agree with ``report`` on the files.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from megatron.trace.live.process import LiveProcess
from megatron.trace_format.semconv import (
    BADPUT_CATEGORIES,
    BADPUT_CATEGORY_ATTRIBUTE,
    GOODPUT_GAUGES,
    MEGATRON_TRAINING_BADPUT_S,
    MEGATRON_TRAINING_GOODPUT_FRACTION,
    MEGATRON_TRAINING_GOODPUT_S,
    MEGATRON_TRAINING_ITERATION,
    MEGATRON_TRAINING_WALL_CLOCK_S,
    SAVE_START_GAUGE,
    Category,
)
from megatron.training.checkpointing import sidecar_path

__all__ = [
    "CATEGORY_ATTRIBUTE",
    "MEGATRON_TRAINING_BADPUT_S",
    "MEGATRON_TRAINING_GOODPUT_FRACTION",
    "MEGATRON_TRAINING_GOODPUT_S",
    "MEGATRON_TRAINING_ITERATION",
    "MEGATRON_TRAINING_WALL_CLOCK_S",
    "SCOPE_ATTRIBUTE",
    "WASTED_OR_RESTART_GAP",
    "CarriedGoodput",
    "GoodputFigures",
    "LiveGoodput",
    "checkpoint_sidecar",
    "record_file_name",
    "saving",
    "start_live_goodput",
]

_logger = logging.getLogger(__name__)

CATEGORY_ATTRIBUTE = BADPUT_CATEGORY_ATTRIBUTE
SCOPE_ATTRIBUTE = "megatron.goodput.scope"
#: A resumed run's stretch from its checkpoint's save to its own start.
WASTED_OR_RESTART_GAP = "wasted_or_restart_gap"

_RECORD_FORMAT = "megatron.goodput/1"
# Gauges are observed one after the other in one collection: compute once for all.
_SNAPSHOT_REUSE_NS = 500_000_000


def record_file_name(rank: int) -> str:
    """The carry-forward record beside a checkpoint, one per exporting rank."""
    return f"goodput_rank{rank}.json"


@dataclass(frozen=True)
class CarriedGoodput:
    """The job's figures when a checkpoint was saved, as the run that saved it knew them."""

    wall_start_ns: int
    as_of_ns: int
    totals_ns: Mapping[str, int]  # category (goodput included) -> ns
    scope: str  # "job", or "incarnation" when the saver could not carry its own past
    iteration: int

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": _RECORD_FORMAT,
                "iteration": self.iteration,
                "scope": self.scope,
                "wall_start_unix_ns": self.wall_start_ns,
                "as_of_unix_ns": self.as_of_ns,
                "totals_ns": dict(self.totals_ns),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, payload: bytes) -> CarriedGoodput:
        """Parse :meth:`to_json`'s bytes; ``ValueError`` (or ``KeyError``...) when malformed."""
        data = json.loads(payload)
        if data.get("format") != _RECORD_FORMAT:
            raise ValueError(f"format {data.get('format')!r}")
        totals = {str(k): int(v) for k, v in data["totals_ns"].items()}
        if any(v < 0 for v in totals.values()):
            raise ValueError("negative totals")
        return cls(
            int(data["wall_start_unix_ns"]),
            int(data["as_of_unix_ns"]),
            totals,
            "job" if data.get("scope") == "job" else "incarnation",
            int(data["iteration"]),
        )

    @classmethod
    def read(cls, path: Path) -> CarriedGoodput | None:
        """The record at ``path``; None (with one warning) when missing or unreadable.

        A bad record never stops the job: the run then reports its own figures.
        """
        try:
            return cls.from_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            _logger.warning(
                "goodput record %s is unreadable (%s); this run's goodput metrics cover it alone",
                path,
                exc,
            )
            return None


@dataclass(frozen=True)
class GoodputFigures:
    """One snapshot of the accounting, in ns."""

    wall_start_ns: int
    wall_ns: int
    totals_ns: Mapping[str, int]  # every badput category and "goodput"
    scope: str

    @property
    def goodput_fraction(self) -> float:
        return self.totals_ns[Category.GOODPUT] / self.wall_ns if self.wall_ns > 0 else 0.0


class LiveGoodput:
    """This run's goodput accounting at any moment, and the gauges that export it.

    ``tally`` is the handle's span tally; ``is_shut_down`` says whether the
    handle has begun shutting down (the export then made is the final one);
    ``carried`` the record of the checkpoint this run resumed from; and
    ``resumed`` whether it resumed at all (a resumed run without ``carried``
    reports scope ``incarnation``). ``rank`` names the record saved beside a
    checkpoint. ``clock`` gives epoch nanoseconds (tests pass their own).
    """

    def __init__(
        self,
        tally: Any,
        *,
        is_shut_down: Callable[[], bool] = lambda: False,
        carried: CarriedGoodput | None = None,
        resumed: bool = False,
        rank: int = 0,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self._tally = tally
        self.rank = rank
        self._is_shut_down = is_shut_down
        self.carried = carried
        self.scope = carried.scope if carried is not None else ("incarnation" if resumed else "job")
        self._clock = clock
        self._iteration: Callable[[], int] | None = None
        self._lock = threading.Lock()
        self._process = LiveProcess()
        self._added = 0  # how many of the tally's ended spans were added to it
        self._cached: tuple[int, bool, GoodputFigures] | None = None
        self._warned = False
        self._save_started_ns = 0  # 0: no save in flight

    # -- what the trainer calls ------------------------------------------------

    def follow_iteration(self, source: Callable[[], int]) -> None:
        """Where ``megatron.training.iteration`` reads the completed-iteration count."""
        self._iteration = source

    def stop_following(self) -> None:
        """Read the completed-iteration count a last time and keep the number, not its
        source. The gauges outlive ``pretrain()`` (the meter provider exports once more when
        it shuts down, at exit), and a source reading the trainer's state would keep that
        state alive until then: its model, its optimizer, and the process group its DDP
        wrapper holds, destroyed only as the interpreter finalizes."""
        source = self._iteration
        if source is None:
            return
        try:
            last = int(source())
        except Exception:  # noqa: BLE001 -- a gauge never breaks training
            self._iteration = None
            return
        self._iteration = lambda: last

    def register(self, meter: Any) -> None:
        """Create the observable gauges on ``meter`` (never raises)."""
        callbacks = {
            MEGATRON_TRAINING_GOODPUT_S: self._observe_goodput,
            MEGATRON_TRAINING_BADPUT_S: self._observe_badput,
            MEGATRON_TRAINING_WALL_CLOCK_S: self._observe_wall,
            MEGATRON_TRAINING_GOODPUT_FRACTION: self._observe_fraction,
            MEGATRON_TRAINING_ITERATION: self._observe_iteration,
        }
        gauges = [(gauge, callbacks[name]) for name, gauge in GOODPUT_GAUGES.items()]
        gauges.append((SAVE_START_GAUGE, self._observe_save_start))
        try:
            for gauge, callback in gauges:
                meter.create_observable_gauge(
                    gauge.name,
                    callbacks=[callback],
                    unit=gauge.unit,
                    description=gauge.description,
                )
        except Exception:
            _logger.warning("Could not create the goodput metric instruments", exc_info=True)

    @contextmanager
    def saving(self) -> Iterator[None]:
        """A checkpoint save in flight, for ``megatron.training.checkpoint_save_start_time``."""
        self._save_started_ns = self._clock()
        try:
            yield
        finally:
            self._save_started_ns = 0

    def checkpoint_record(self, iteration: int) -> CarriedGoodput | None:
        """The figures now, for the checkpoint of ``iteration`` about to be saved."""
        figures = self._safe_figures()
        if figures is None:
            return None
        return CarriedGoodput(
            figures.wall_start_ns,
            figures.wall_start_ns + figures.wall_ns,
            dict(figures.totals_ns),
            figures.scope,
            iteration,
        )

    # -- the accounting ----------------------------------------------------------

    def figures(self) -> GoodputFigures | None:
        """The accounting as of now (None before any structural span ended)."""
        now, final = self._clock(), self._is_shut_down()
        with self._lock:
            cached = self._cached
            if (
                cached is not None
                and cached[1] == final
                and 0 <= now - cached[0] < _SNAPSHOT_REUSE_NS
            ):
                return cached[2]
            ended, _ = self._tally.structural_snapshot(self._added)
            self._added += len(ended)
            self._process.add(ended)
            # once shut down, the spans say how the run ended, as the file does
            accounting = self._process.accounting(now, running=not final)
            figures = None if accounting is None else self._figures(accounting)
            if figures is not None:
                self._cached = (now, final, figures)
        return figures

    def _figures(self, accounting: dict[str, Any]) -> GoodputFigures:
        """This run's accounting, carried forward from the checkpoint it resumed from."""
        totals = {category: accounting["totals_ns"][category] for category in BADPUT_CATEGORIES}
        totals[Category.GOODPUT] = accounting["totals_ns"][Category.GOODPUT]
        start, wall = accounting["start_ns"], accounting["wall_ns"]
        carried = self.carried
        if carried is None:
            return GoodputFigures(start, wall, totals, self.scope)
        gap = max(0, start - carried.as_of_ns)
        for category, ns in carried.totals_ns.items():
            totals[category] = totals.get(category, 0) + ns
        totals[WASTED_OR_RESTART_GAP] = totals.get(WASTED_OR_RESTART_GAP, 0) + gap
        carried_wall = carried.as_of_ns - carried.wall_start_ns
        return GoodputFigures(carried.wall_start_ns, carried_wall + gap + wall, totals, self.scope)

    def _safe_figures(self) -> GoodputFigures | None:
        try:
            return self.figures()
        except Exception:
            if not self._warned:
                self._warned = True
                _logger.warning("Could not compute the live goodput figures", exc_info=True)
            return None

    # -- the gauges' callbacks ----------------------------------------------------

    def _scoped(self, value: float, **attributes: str) -> Observation:
        return Observation(value, {SCOPE_ATTRIBUTE: self.scope, **attributes})

    def _observe_goodput(self, _options: CallbackOptions) -> Iterable[Observation]:
        figures = self._safe_figures()
        return [self._scoped(figures.totals_ns[Category.GOODPUT] / 1e9)] if figures else []

    def _observe_badput(self, _options: CallbackOptions) -> Iterable[Observation]:
        figures = self._safe_figures()
        if figures is None:
            return []
        return [
            self._scoped(ns / 1e9, **{CATEGORY_ATTRIBUTE: str(category)})
            for category, ns in figures.totals_ns.items()
            if category != Category.GOODPUT
        ]

    def _observe_wall(self, _options: CallbackOptions) -> Iterable[Observation]:
        figures = self._safe_figures()
        return [self._scoped(figures.wall_ns / 1e9)] if figures else []

    def _observe_fraction(self, _options: CallbackOptions) -> Iterable[Observation]:
        figures = self._safe_figures()
        return [self._scoped(figures.goodput_fraction)] if figures else []

    def _observe_save_start(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self._save_started_ns / 1e9)]

    def _observe_iteration(self, _options: CallbackOptions) -> Iterable[Observation]:
        source = self._iteration
        if source is None:
            return []
        try:
            return [Observation(int(source()))]
        except Exception:  # noqa: BLE001 -- a gauge must never raise into the SDK
            return []


def start_live_goodput(
    telemetry: Any, load_dir: str | None, resumed_iteration: int
) -> LiveGoodput | None:
    """The live goodput metrics of this run, registered on the handle's meter.

    None when the handle does not record both spans and metrics (nothing to
    count from, or nowhere to export to). ``resumed_iteration`` is where the
    checkpoint load put the run (0: it started afresh); the checkpoint's
    goodput record of this rank, if any, is carried forward.
    """
    tally = getattr(telemetry, "tally", None)
    meter = getattr(telemetry, "meter", None)
    if not getattr(telemetry, "is_exporting", False) or tally is None or _is_no_op(meter):
        return None
    carried = None
    resumed = bool(load_dir) and resumed_iteration > 0
    if resumed:
        record = sidecar_path(load_dir, resumed_iteration, record_file_name(telemetry.rank))
        carried = CarriedGoodput.read(record)
    live = LiveGoodput(
        tally,
        is_shut_down=lambda: telemetry.is_shut_down,
        carried=carried,
        resumed=resumed,
        rank=telemetry.rank,
    )
    live.register(meter)
    return live


def saving(live: LiveGoodput | None) -> AbstractContextManager[None]:
    """Around a checkpoint save: ``live``'s save-start gauge says it is in flight."""
    return nullcontext() if live is None else live.saving()


def checkpoint_sidecar(live: LiveGoodput | None, iteration: int) -> tuple[str, bytes] | None:
    """What :func:`~megatron.training.checkpointing.save_checkpoint` writes for ``live``."""
    if live is None:
        return None
    record = live.checkpoint_record(iteration)
    return (record_file_name(live.rank), record.to_json()) if record is not None else None


def _is_no_op(meter: Any) -> bool:
    if meter is None:
        return True
    try:
        from opentelemetry.metrics import NoOpMeter
    except ImportError:  # pragma: no cover
        return True
    return isinstance(meter, NoOpMeter)
