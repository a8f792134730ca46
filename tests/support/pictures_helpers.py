"""Hand-built trace files for the tests of ``megatron-trace timeline`` and ``export``.

A test describes a job as a few incarnations of a few ranks, with the spans
each process wrote (objects that know their parent and links, so a test can
point at "C1 of incarnation 0"); this writes them through ``tracegen``'s
encoding (:func:`tracegen.encoded`, the one OTLP/JSON builder of the tests) as the
lines the file exporter writes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tracegen  # the check and report tests' OTLP/JSON encoding, shared

S = 1_000_000_000  # nanoseconds per second
T0 = 1_800_000_000 * S  # an arbitrary wall-clock origin

_ids = itertools.count(1)


def new_span_id() -> str:
    return f"{next(_ids):016x}"


def new_trace_id() -> str:
    return f"{next(_ids):032x}"


@dataclass
class Span:
    name: str
    start: float  # seconds after T0
    end: float
    trace_id: str = field(default_factory=new_trace_id)
    span_id: str = field(default_factory=new_span_id)
    parent: Span | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    links: list[Span] = field(default_factory=list)

    def child(self, name: str, start: float, end: float, **attributes: Any) -> Span:
        return Span(name, start, end, trace_id=self.trace_id, parent=self, attributes=attributes)


def _encode(span: Span) -> dict[str, Any]:
    return tracegen.encoded(
        span.name,
        T0 + round(span.start * S),
        T0 + round(span.end * S),
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_span_id=span.parent.span_id if span.parent is not None else "",
        links=[(t.trace_id, t.span_id) for t in span.links],
        attributes=span.attributes,
    )


def resource(run: str, rank: int, pid: int) -> dict[str, Any]:
    """The writing process: what the trace model groups incarnations by."""
    return {"run": run, "dl.rank": rank, "process.pid": pid}


def incarnation(
    at: float,
    first_iteration: int,
    intervals: int,
    *,
    per_interval: int = 4,
    seconds_per_iteration: float = 1.0,
    queue: float = 0.0,
) -> list[Span]:
    """The structural spans of one clean incarnation, in the order a process ends them.

    ``queue`` > 0 adds a ``pre_startup`` of that many seconds before ``at``.
    Startup takes 3 s (imports 1 s, model_init 2 s with a checkpoint load when
    resuming); each interval saves and evaluates at its end.
    """
    spans: list[Span] = []
    if queue:
        spans.append(Span("pre_startup", at - queue, at, attributes={"is_goodput_span": True}))
    startup = Span("megatron.startup", at, at + 3, attributes={"is_goodput_span": True})
    spans.append(startup.child("megatron.startup.imports", at, at + 1))
    model_init = startup.child("megatron.startup.model_init", at + 1, at + 3)
    if first_iteration:
        spans.append(
            model_init.child(
                "megatron.checkpoint.load",
                at + 2,
                at + 2.5,
                **{"megatron.iteration": first_iteration},
            )
        )
    spans += [model_init, startup]
    previous, clock, iteration = startup, at + 3, first_iteration
    for index in range(intervals):
        last = iteration + per_interval - 1
        interval = Span(
            "megatron.train",
            clock,
            clock + per_interval * seconds_per_iteration + 1,
            attributes={
                "is_goodput_span": True,
                "megatron.interval.index": index,
                "megatron.interval.first_iteration": iteration,
                "megatron.interval.last_iteration": last,
            },
            links=[previous],
        )
        for it in range(iteration, last + 1):
            start = clock + (it - iteration) * seconds_per_iteration
            spans.append(
                interval.child(
                    "megatron.train.iteration",
                    start,
                    start + seconds_per_iteration,
                    **{"megatron.iteration": it},
                )
            )
        done = clock + per_interval * seconds_per_iteration
        spans.append(
            interval.child(
                "megatron.evaluate", done, done + 0.5, **{"megatron.iteration": last + 1}
            )
        )
        spans.append(
            interval.child(
                "megatron.checkpoint.save", done + 0.5, done + 1, **{"megatron.iteration": last + 1}
            )
        )
        spans.append(interval)
        previous, clock, iteration = interval, interval.end, last + 1
    return spans


def write_trace(path: Path, processes: list[tuple[dict[str, Any], list[Span]]]) -> Path:
    """Write each process's spans, a few per line, processes one after another."""
    with open(path, "a", encoding="utf-8") as out:
        for res, spans in processes:
            for chunk in range(0, len(spans), 5):
                encoded = [_encode(span) for span in spans[chunk : chunk + 5]]
                out.write(tracegen.line(encoded, rank=res["dl.rank"], pid=res["process.pid"]))
                out.write("\n")
    return path


def run_command(module: Any, argv: list[str]) -> int:
    """Run one subcommand through the ``megatron-trace`` entry point, as a user does: the
    command a writer's module serves (``megatron.trace.render.export.write``: ``export``)."""
    from megatron.trace.cli.main import main

    parts = module.__name__.split(".")
    command = parts[parts.index("render") + 1] if "render" in parts else parts[-1]
    return main([command, *argv])
