"""Trace files shaped as Megatron-LM's own lifecycle code writes them, for ``megatron-trace``.

Our users' files do not come from this project: they come from Megatron-LM's
``pretrain()`` / ``train()`` through nemo-lens's handle (or a collector's file
exporter). Those files carry none of this project's own attributes. This
module re-enacts that lifecycle from its documented facts, driving the real
OpenTelemetry SDK (``TracerProvider``, ``BatchSpanProcessor``) into
OpenTelemetry's official ``opentelemetry-exporter-otlp-json-file`` exporter,
so the bytes on disk are what that exporter writes:

* trace A ``pre_startup`` (when the queue wait is known), trace B
  ``megatron.startup`` (``is_goodput_span``, ``megatron.model_type``) with its
  backdated ``megatron.startup.*`` phases, which tile, and the live
  ``megatron.startup.model_init`` holding ``megatron.checkpoint.load`` (no
  iteration attribute upstream);
* one ``megatron.train`` per checkpoint interval, rerooted at the top of each
  loop pass whose per-loop counter is a multiple of ``save_interval``, each a
  new trace linked to the previous interval (the first to the startup), with
  no interval attributes at all;
* per pass: ``megatron.checkpoint.ft_heartbeat``,
  ``megatron.checkpoint.save.finalize`` (the non-blocking finalize of an
  earlier async save: long in the pass that completes one),
  ``megatron.train.iteration`` with ``megatron.iteration`` (``step`` group),
  ``megatron.train.gc_collect`` every ``gc_interval``, ``megatron.evaluate``
  with ``megatron.evaluate.step`` children (``megatron.eval_iteration``),
  and at each save ``megatron.checkpoint.exposed_save`` (``megatron.iteration``)
  around ``megatron.checkpoint.reclaim_memory``, ``megatron.checkpoint.save``
  (``megatron.iteration``) and ``megatron.checkpoint.timers_log``;
* ``megatron.checkpoint.exit_finalize`` after the loop, inside the last interval;
* the resource nemo-lens detects: ``service.name``, ``host.name``,
  ``process.pid``, ``dl.rank``, ``nemo.run.id``, and where a launcher sets
  them ``slurm.restart_count`` / ``nvrx.cycle``; no ``service.instance.id``.

Span groups follow nemo-lens's presets: ``default`` is ``job``,
``checkpoint``, ``evaluate``; ``per_step`` adds ``model_init``,
``load_checkpoint``, ``step`` (and forward/backward and optimizer groups,
whose spans are not re-enacted here).

Time is virtual (explicit start and end times on every span), so a test knows
every figure exactly: an iteration takes ``ITERATION_NS``. A SIGKILL is
re-enacted as what it leaves: spans that ended were exported, spans still
open never end, and nothing is shut down cleanly.
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, Span


def official_file_exporter() -> type:
    """OpenTelemetry's own OTLP/JSON ``FileSpanExporter``, or the calling test skipped.

    It requires the newest SDK, so ``tox -e mindeps`` (the lowest SDK we declare)
    has not got it: there a test that writes an upstream-shaped file is skipped,
    and the rest of its module still runs.
    """
    import pytest

    module = pytest.importorskip(
        "opentelemetry.exporter.otlp.json.file",
        reason="the official OTLP/JSON file exporter (test extra) requires the newest SDK",
    )
    return module.FileSpanExporter


MS = 1_000_000
SECOND = 1000 * MS
T0 = 1_796_000_000 * SECOND + 123_456_789  # an epoch origin with nanoseconds in it
ITERATION_NS = 100 * MS
DEFAULT_GROUPS = frozenset({"job", "checkpoint", "evaluate"})
PER_STEP_GROUPS = DEFAULT_GROUPS | {"model_init", "load_checkpoint", "step"}


class Killed(Exception):
    """Raised inside the re-enacted loop where the SIGKILL lands."""


@dataclass
class Kill:
    """Where the SIGKILL lands: in iteration ``iteration``'s step, or in the
    finalize at the top of that iteration's pass (``in_finalize``)."""

    iteration: int
    in_finalize: bool = False


@dataclass
class Process:
    """One OS process running Megatron-LM's ``pretrain()`` with nemo-lens exporting to ``path``."""

    path: Path
    pid: int
    host: str = "node-a"
    rank: int = 0
    run_id: str = "job-4711"
    extra_resource: dict[str, Any] = field(default_factory=dict)
    groups: frozenset[str] = PER_STEP_GROUPS
    clock: int = T0
    scopes: Sequence[str] = ("megatron.training",)
    instance_id: str | None = None  # nemo-lens with a run id sets "<run id>-rank<rank>"

    def __post_init__(self) -> None:
        attributes = {
            "service.name": "megatron",
            "host.name": self.host,
            "process.pid": self.pid,
            "dl.rank": self.rank,
            "nemo.run.id": self.run_id,
            **self.extra_resource,
        }
        # The SDK's defaults (telemetry.sdk.*), but no service.instance.id unless given: the
        # SDK's random one is made once per Python process, and here one Python process
        # re-enacts several OS processes, so it would claim they are one.
        detected = Resource.create(attributes).attributes
        resource = Resource(
            {k: v for k, v in detected.items() if k != "service.instance.id"}
            | ({"service.instance.id": self.instance_id} if self.instance_id else {})
        )
        self.provider = TracerProvider(resource=resource)
        self.processor = BatchSpanProcessor(official_file_exporter()(self.path))
        self.provider.add_span_processor(self.processor)
        self.tracers = [self.provider.get_tracer(name) for name in self.scopes]
        self._spans = 0

    # -- the metrics, as Megatron-LM records them at each log interval ----------------

    def export_metrics(self, exports: int = 1, path: Path | None = None) -> Path:
        """Megatron-LM's log-interval metric points, ``exports`` times, to ``metrics.jsonl``.

        Recorded with ``record_training_metrics`` (Megatron-LM's names) on a
        real ``MeterProvider`` with this process's resource, and written by
        the official ``FileMetricExporter`` beside the trace file, as a
        periodic reader's export does. The points carry the real clock (the
        SDK stamps each collection): a test judges them with ``--now`` near
        ``time.time()``. No heartbeat gauge: that is this project's. The
        provider is left as a SIGKILL leaves it, never shut down.
        """
        from opentelemetry.exporter.otlp.json.file.metric_exporter import FileMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        from megatron.core.telemetry.training_metrics import record_training_metrics

        target = path or self.path.with_name("metrics.jsonl")
        exporter = FileMetricExporter(target)
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=math.inf)
        provider = MeterProvider(
            resource=self.provider.resource, metric_readers=[reader], shutdown_on_exit=False
        )
        meter = provider.get_meter("megatron.training")
        for k in range(exports):
            record_training_metrics(
                meter,
                step_duration_ms=ITERATION_NS / MS,
                loss=2.0 / (k + 1),
                throughput_tflops=100.0,
                grad_norm=1.0,
                learning_rate=1e-4,
                tokens_per_sec=4096.0,
            )
            reader.force_flush()
        exporter.shutdown()
        return target

    # -- the SDK calls, on the virtual clock ------------------------------------------

    def _tracer(self) -> trace.Tracer:
        self._spans += 1  # several scopes: spans alternate between instrumentation scopes
        return self.tracers[self._spans % len(self.tracers)]

    def tick(self, ns: int) -> int:
        self.clock += ns
        return self.clock

    def start(self, name: str, parent: Span | None, links: Sequence[Link] = (), **attrs: Any):
        context = trace.set_span_in_context(parent) if parent is not None else Context()
        span = self._tracer().start_span(
            name, context=context, links=list(links), start_time=self.clock
        )
        span.set_attribute("is_goodput_span", True)
        for key, value in attrs.items():
            span.set_attribute(key, value)
        return span

    def end(self, span: Span) -> None:
        span.end(end_time=self.clock)

    @contextmanager
    def managed(self, group: str, name: str, parent: Span | None, ns: int = MS, **attrs: Any):
        """``managed_span(group, name)``: a span when its group is on, nothing otherwise."""
        if group not in self.groups:
            yield parent
            self.tick(ns)
            return
        span = self.start(name, parent, **attrs)
        yield span
        self.tick(ns)
        self.end(span)

    def backdated(self, name: str, parent: Span | None, start: int, end: int) -> None:
        if "job" not in self.groups:
            return
        span = self._tracer().start_span(
            name,
            context=trace.set_span_in_context(parent) if parent else Context(),
            start_time=start,
        )
        span.set_attribute("is_goodput_span", True)
        span.end(end_time=end)

    # -- pretrain() / train() ---------------------------------------------------------

    def pretrain(
        self,
        *,
        train_iters: int,
        save_interval: int,
        start_iteration: int = 0,
        load: bool = False,
        eval_interval: int = 0,
        gc_interval: int = 0,
        async_save: bool = False,
        queue_ns: int = 0,
        kill: Kill | None = None,
    ) -> None:
        """Run the lifecycle; returns after a clean shutdown or the re-enacted SIGKILL."""
        try:
            self._pretrain(
                train_iters, save_interval, start_iteration, load, eval_interval,
                gc_interval, async_save, queue_ns, kill,
            )  # fmt: skip
        except Killed:
            self.processor.force_flush()  # what the exporter had written before the kill
            self.processor.shutdown()  # stops the worker; open spans never ended, so never export
            return
        self.provider.shutdown()

    def _pretrain(
        self,
        train_iters: int,
        save_interval: int,
        iteration: int,
        load: bool,
        eval_interval: int,
        gc_interval: int,
        async_save: bool,
        queue_ns: int,
        kill: Kill | None,
    ) -> None:
        if queue_ns and "job" in self.groups:
            self.backdated("pre_startup", None, self.clock - queue_ns, self.clock)
        program_start = self.clock
        startup = None
        if "job" in self.groups:
            startup = self.start("megatron.startup", None, **{"megatron.model_type": "GPT"})
        phases = ("imports", "arg_parse", "inprocess_setup", "in_job_setup",
                  "initialize_megatron", "jit_fusion_options")  # fmt: skip
        edge = program_start
        for phase, ms in zip(phases, (900, 40, 3, 5, 700, 2), strict=True):
            self.backdated(f"megatron.startup.{phase}", startup, edge, edge + ms * MS)
            edge += ms * MS
        self.clock = edge
        with self.managed("model_init", "megatron.startup.model_init", startup, 300 * MS) as init:
            if load:
                with self.managed("load_checkpoint", "megatron.checkpoint.load", init, 200 * MS):
                    pass
        self.tick(5 * MS)
        if startup is not None:
            self.end(startup)
        previous: Span | None = startup
        interval: Span | None = None
        step = 0
        pending: int | None = None  # an async save not yet finalized
        while iteration < train_iters:
            if save_interval > 0 and step % save_interval == 0 and "job" in self.groups:
                links = [Link(previous.get_span_context())] if previous is not None else []
                if interval is not None:
                    self.end(interval)
                interval = self.start("megatron.train", None, links)
                previous = interval
            with self.managed("checkpoint", "megatron.checkpoint.ft_heartbeat", interval,
                              MS // 10):  # fmt: skip
                pass
            finalizing = pending is not None
            with self.managed("checkpoint", "megatron.checkpoint.save.finalize", interval,
                              50 * MS if finalizing else MS // 20):  # fmt: skip
                if kill is not None and kill.in_finalize and kill.iteration == iteration:
                    raise Killed
            pending = None
            with self.managed("step", "megatron.train.iteration", interval, ITERATION_NS,
                              **{"megatron.iteration": iteration}):  # fmt: skip
                if kill is not None and not kill.in_finalize and kill.iteration == iteration:
                    self.tick(ITERATION_NS // 2)
                    raise Killed
            iteration += 1
            if gc_interval and iteration % gc_interval == 0:
                with self.managed("step", "megatron.train.gc_collect", interval, 20 * MS):
                    pass
            if eval_interval and iteration % eval_interval == 0:
                with self.managed("evaluate", "megatron.evaluate", interval, MS) as ev:
                    for k in range(2):
                        with self.managed("evaluate", "megatron.evaluate.step", ev, 30 * MS,
                                          **{"megatron.eval_iteration": k + 1}):  # fmt: skip
                            pass
            if save_interval and iteration % save_interval == 0:
                self._save(interval, iteration, async_save)
                pending = iteration if async_save else None
            step += 1
        with self.managed("checkpoint", "megatron.checkpoint.exit_finalize", interval,
                          50 * MS if pending is not None else MS):  # fmt: skip
            pass
        if interval is not None:
            self.end(interval)

    def _save(self, interval: Span | None, iteration: int, async_save: bool) -> None:
        at = {"megatron.iteration": iteration}
        with self.managed("checkpoint", "megatron.checkpoint.exposed_save", interval, MS,
                          **at) as exposed:  # fmt: skip
            with self.managed("checkpoint", "megatron.checkpoint.reclaim_memory", exposed, MS):
                pass
            ns = 20 * MS if async_save else 150 * MS  # an async save only dispatches here
            with self.managed("checkpoint", "megatron.checkpoint.save", exposed, ns, **at):
                pass
            with self.managed("step", "megatron.checkpoint.timers_log", exposed, 2 * MS):
                pass


# -- the shapes the tests use ------------------------------------------------------------


def clean_run(path: Path, *, groups: frozenset[str] = PER_STEP_GROUPS, **kw: Any) -> Path:
    """One incarnation: 0 -> 30, a checkpoint and an evaluation every 10."""
    Process(path, pid=4242, groups=groups, **kw).pretrain(
        train_iters=30, save_interval=10, eval_interval=10, gc_interval=7, queue_ns=30 * SECOND
    )
    return path


def killed_and_resumed(
    path: Path,
    *,
    groups: frozenset[str] = PER_STEP_GROUPS,
    second_path: Path | None = None,
    second: dict[str, Any] | None = None,
    **kw: Any,
) -> Path:
    """Incarnation 0 trains from 0, saves at 10 and 20, is SIGKILLed in iteration 25;
    incarnation 1 (a new process, 60 s later) loads the checkpoint at 20 and trains to 40."""
    first = Process(path, pid=4242, groups=groups, **kw)
    first.pretrain(train_iters=100, save_interval=10, kill=Kill(25))
    options = {"pid": 5151, "groups": groups, **kw, **(second or {})}
    Process(second_path or path, clock=first.clock + 60 * SECOND, **options).pretrain(
        train_iters=40, save_interval=10, start_iteration=20, load=True
    )
    return path


def without_checkpointing(
    path: Path, *, groups: frozenset[str] = PER_STEP_GROUPS, **kw: Any
) -> Path:
    """``save_interval`` 0 (or unset): the loop never reroots, so there is no
    ``megatron.train`` at all; each loop pass's spans (the iteration, the heartbeat and
    finalize, the garbage collection, the evaluation) are roots of traces of their own.
    One incarnation: 0 -> 30, an evaluation every 10."""
    Process(path, pid=4242, groups=groups, **kw).pretrain(
        train_iters=30, save_interval=0, eval_interval=10, gc_interval=7, queue_ns=30 * SECOND
    )
    return path


def killed_and_restarted_without_checkpointing(path: Path, **kw: Any) -> Path:
    """``save_interval`` 0: incarnation 0 is SIGKILLed in iteration 25; with no checkpoint
    to load, incarnation 1 (a new process, 60 s later) starts again from 0 and trains to 30."""
    first = Process(path, pid=4242, **kw)
    first.pretrain(train_iters=100, save_interval=0, kill=Kill(25))
    Process(path, pid=5151, clock=first.clock + 60 * SECOND, **kw).pretrain(
        train_iters=30, save_interval=0
    )
    return path


def async_save_lost(path: Path, **kw: Any) -> Path:
    """Async saves: the one at 10 is finalized at the top of pass 10; the one at 20 is
    dispatched, then the SIGKILL lands in its finalize (top of pass 20), so it never
    became durable; incarnation 1 resumes from 10 and trains to 40."""
    first = Process(path, pid=4242, **kw)
    first.pretrain(train_iters=100, save_interval=10, async_save=True, kill=Kill(20, True))
    Process(path, pid=5151, clock=first.clock + 60 * SECOND, **kw).pretrain(
        train_iters=40, save_interval=10, start_iteration=10, load=True, async_save=True
    )
    return path


def restarted_as(path: Path, first: dict[str, Any], second: dict[str, Any]) -> Path:
    """The killed-and-resumed run, each process with the given resource identity
    (``pid``, ``host``, ``extra_resource``, ``instance_id``)."""
    killed = Process(path, **first)
    killed.pretrain(train_iters=100, save_interval=10, kill=Kill(25))
    Process(path, clock=killed.clock + 60 * SECOND, **second).pretrain(
        train_iters=40, save_interval=10, start_iteration=20, load=True
    )
    return path


def on_two_hosts(path: Path) -> Path:
    """In containers: pid 1 of its container both times, the restart on another host;
    the resource nemo-lens gives a run with an id (one service.instance.id per rank)."""
    lens = {"pid": 1, "instance_id": "job-4711-rank0"}
    return restarted_as(path, {**lens, "host": "node-a"}, {**lens, "host": "node-b"})


def requeued_in_place(path: Path, counter: str = "slurm.restart_count") -> Path:
    """Requeued onto the same host, pid 1 both times: only the launcher's restart counter
    (``slurm.restart_count``, or NVRx's ``nvrx.cycle``) tells the two processes apart."""
    return restarted_as(
        path,
        {"pid": 1, "extra_resource": {counter: 0}},
        {"pid": 1, "extra_resource": {counter: 1}},
    )


# -- files as log rotation and collectors leave them -------------------------------------


def rotate(path: Path, compress: str = "") -> Path:
    """Move ``path`` to ``path.1`` (as logrotate does), compressed with ``gz`` or ``zst``."""
    rotated = path.with_name(path.name + ".1")
    path.rename(rotated)
    if not compress:
        return rotated
    packed = rotated.with_name(rotated.name + "." + compress)
    if compress == "gz":
        with open(rotated, "rb") as src, gzip.open(packed, "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        import zstandard

        with open(rotated, "rb") as src, open(packed, "wb") as dst:
            zstandard.ZstdCompressor().copy_stream(src, dst)
    rotated.unlink()
    return packed


def as_collector_writes(sources: Sequence[Path], out: Path, per_line: int = 3) -> Path:
    """The requests of ``sources``, interleaved and batched ``per_line`` to a line, as a
    collector's file exporter writes what several processes sent it: a line holds several
    ``resourceSpans``, each with its own resource."""
    requests = [
        [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
        for source in sources
    ]
    merged = [r for batch in _interleave(requests) for r in batch["resourceSpans"]]
    with open(out, "w", encoding="utf-8") as dst:
        for start in range(0, len(merged), per_line):
            dst.write(json.dumps({"resourceSpans": merged[start : start + per_line]}) + "\n")
    return out


def _interleave(lists: Sequence[list[Any]]) -> Iterator[Any]:
    for position in range(max(len(items) for items in lists)):
        for items in lists:
            if position < len(items):
                yield items[position]


def spans_by_name(path: Path) -> dict[str, int]:
    """How many spans of each name the file holds (read with the stdlib only)."""
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        for resource_spans in json.loads(line)["resourceSpans"]:
            for scope_spans in resource_spans["scopeSpans"]:
                for span in scope_spans["spans"]:
                    counts[span["name"]] = counts.get(span["name"], 0) + 1
    return counts
