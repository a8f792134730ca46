"""Synthetic ``per_step`` trace files of any size, shaped like what the ``jsonl`` sink writes.

The benchmarks and the scale tests need files of millions of spans; training
for a day to get one is not an option, and :mod:`tracegen` (hand-built, a few
spans, round numbers) is not shaped like the real thing. This module writes
the bytes the real sink writes for a ``per_step`` run — the resource the job
sets, one OTLP/JSON request of up to 512 spans per line (the batch processor's
batch), spans in the order they end, key for key as our encoder writes them
(``flags``, no empty ``attributes`` or ``links``, ``status: {}``) — at a few
hundred thousand spans a second.

Each rank runs ``incarnations`` incarnations: every one but the last is
SIGKILLed ``kill_after`` iterations into an interval (its in-flight interval
and iteration are never written), and the next resumes from the last saved
checkpoint. Ranks share one file (the ``all_ranks`` strategy's shared file,
their lines interleaved) unless ``per_rank_files`` is set.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LineWriter",
    "Shape",
    "bool_attribute",
    "double_attribute",
    "int_attribute",
    "resource_json",
    "write_per_step",
]

MS = 1_000_000
_BATCH = 512


@dataclass(frozen=True)
class Shape:
    """What the generated job looks like."""

    ranks: int = 2
    spans: int = 1_000_000  # at least this many in all (whole iterations)
    save_interval: int = 100  # iterations per checkpoint interval
    incarnations: int = 1  # per rank; all but the last killed, then resumed
    kill_after: int = 7  # iterations into an interval when a kill strikes
    per_rank_files: bool = False
    per_line: int = 512  # spans per line: the batch processor's batch size
    # the ``communication`` span group too: each forward_backward holds a gradient
    # all-reduce's dispatch and wait (megatron.grad_sync.start/.finish), two spans more
    communication: bool = False
    t0_ns: int = 1_796_119_852_000_000_000
    # every incarnation of a rank in one process (pretrain() called again in it, as an
    # in-process restart does), not a new process each
    in_process: bool = False
    # each iteration up to this much longer (ns), spread by its number: steps that vary,
    # as a loaded machine's do (0: every step of a rank alike)
    jitter_ns: int = 0


def resource_json(rank: int, world: int, pid: int, run: str) -> str:
    """The OTLP/JSON ``resource`` of one process of run ``run``, as the job sets it."""

    def s(key: str, value: str) -> str:
        return f'{{"key":"{key}","value":{{"stringValue":"{value}"}}}}'

    def i(key: str, value: int) -> str:
        return f'{{"key":"{key}","value":{{"intValue":"{value}"}}}}'

    attributes = [
        s("telemetry.sdk.language", "python"),
        s("telemetry.sdk.name", "opentelemetry"),
        s("telemetry.sdk.version", "1.45.2"),
        s("service.instance.id", f"{run}-rank{rank}"),
        i("dl.local_rank", rank),
        i("dl.tensor_parallel.size", 1),
        i("dl.pipeline_parallel.size", 1),
        i("dl.data_parallel.size", world),
        i("dl.batch_size", 4),
        i("dl.sequence_length", 64),
        i("megatron.num_layers", 2),
        i("megatron.hidden_size", 64),
        s("megatron.ckpt_format", "torch"),
        s("service.name", "megatron"),
        s("nemo.run.id", run),
        s("megatron.run_id", run),
        s("host.name", "node0"),
        i("process.pid", pid),
        i("dl.rank", rank),
        i("dl.world_size", world),
    ]
    return '{"attributes":[' + ",".join(attributes) + "]}"


class LineWriter:
    """One incarnation's spans, as the batch processor would cut them into lines."""

    def __init__(self, resource: str, ids: Iterator[int], per_line: int = _BATCH) -> None:
        self.head = (
            '{"resourceSpans":[{"resource":'
            + resource
            + ',"scopeSpans":[{"scope":{"name":"megatron","version":"0.1.0"},"spans":['
        )
        self.ids = ids
        self.batch: list[str] = []
        self.lines: list[str] = []
        self.count = 0
        self.per_line = per_line

    def new_id(self) -> str:
        return f"{next(self.ids):016x}"

    def span(
        self,
        name: str,
        trace: str,
        span_id: str,
        parent: str,
        start: int,
        end: int,
        attributes: str = "",
        links: str = "",
        status: str = "{}",
    ) -> None:
        parent_part = f'"parentSpanId":"{parent}",' if parent else ""
        text = (
            f'{{"traceId":"{trace}","spanId":"{span_id}",{parent_part}"flags":256,'
            f'"name":"{name}","kind":1,"startTimeUnixNano":"{start}",'
            f'"endTimeUnixNano":"{end}"'
        )
        if attributes:
            text += f',"attributes":[{attributes}]'
        if links:
            text += f',"links":[{links}]'
        self.batch.append(text + f',"status":{status}}}')
        self.count += 1
        if len(self.batch) == self.per_line:
            self.flush()

    def flush(self) -> None:
        if self.batch:
            self.lines.append(self.head + ",".join(self.batch) + "]}]}]}\n")
            self.batch.clear()


def int_attribute(key: str, value: int) -> str:
    """One OTLP/JSON attribute (``{"key": ..., "value": {"intValue": ...}}``), as text."""
    return f'{{"key":"{key}","value":{{"intValue":"{value}"}}}}'


def bool_attribute(key: str, value: bool) -> str:
    """One boolean OTLP/JSON attribute, as text."""
    return f'{{"key":"{key}","value":{{"boolValue":{"true" if value else "false"}}}}}'


def double_attribute(key: str, value: float) -> str:
    """One double OTLP/JSON attribute, as text."""
    return f'{{"key":"{key}","value":{{"doubleValue":{value!r}}}}}'


def _incarnation(
    writer: LineWriter, shape: Shape, now: int, first: int, last: int, killed: bool, rank: int
) -> tuple[int, int, int]:
    """Write one incarnation that trains ``first`` up to ``last`` (exclusive).

    A ``killed`` one then opens one more interval and dies ``kill_after``
    iterations into it. Returns (end ns, last saved iteration, iterations run).
    """
    new_id = writer.new_id
    trace = f"{next(writer.ids):032x}"
    startup = new_id()
    phases = ("imports", "arg_parse", "initialize_megatron", "model_init", "dataloader")
    t = now
    for phase in phases:
        length = 400 * MS if phase == "imports" else 20 * MS
        phase_id = new_id()
        if phase == "model_init" and first:
            writer.span("megatron.checkpoint.load", trace, new_id(), phase_id, t, t + 5 * MS,
                        int_attribute("megatron.iteration", first))  # fmt: skip
        writer.span(f"megatron.startup.{phase}", trace, phase_id, startup, t, t + length,
                    bool_attribute("is_goodput_span", True))  # fmt: skip
        t += length
    writer.span("megatron.startup", trace, startup, "", now, t,
                bool_attribute("is_goodput_span", True) + "," + '{"key":"megatron.model_type",'
                '"value":{"stringValue":"gpt"}}')  # fmt: skip
    previous, previous_trace = startup, trace
    iteration, saved, index = first, first, 0
    step = 20 * MS + rank * 1000  # ranks drift apart by a microsecond an iteration

    def iterations(trace: str, interval: str, count: int) -> None:
        nonlocal t, iteration
        for _ in range(count):
            # nested spans start a few microseconds after their parent, as real clocks read
            it_id, fb_id = new_id(), new_id()
            us = 1000
            writer.span("megatron.train.get_batch", trace, new_id(), fb_id, t + 7 * us,
                        t + 1 * MS)  # fmt: skip
            if shape.communication:  # the wait shrinks as a rank's step grows: work evens out
                dispatched, waited = t + 10 * MS, t + 14 * MS - rank * 1000
                writer.span("megatron.grad_sync.start", trace, new_id(), fb_id, t + 9 * MS,
                            dispatched, int_attribute("megatron.iteration", iteration) + ","
                            + int_attribute("megatron.grad_sync.buckets", 3))  # fmt: skip
                writer.span("megatron.grad_sync.finish", trace, new_id(), fb_id, dispatched,
                            waited, int_attribute("megatron.iteration", iteration))  # fmt: skip
            writer.span("megatron.train.forward_backward", trace, fb_id, it_id, t + 4 * us,
                        t + 15 * MS)  # fmt: skip
            writer.span("megatron.train.optimizer", trace, new_id(), it_id, t + 15 * MS + 3 * us,
                        t + 19 * MS)  # fmt: skip
            attributes = ",".join(
                (
                    int_attribute("megatron.iteration", iteration),
                    double_attribute("megatron.loss", 5.0 - iteration * 1e-4),
                    double_attribute("megatron.grad_norm", 1.0 + (iteration % 7) * 0.125),
                )
            )
            length = (
                step + (iteration * 7919 + rank * 104_729) % shape.jitter_ns
                if shape.jitter_ns
                else step
            )
            writer.span(
                "megatron.train.iteration", trace, it_id, interval, t, t + length, attributes
            )
            t += length + 2_000  # the loop's own few microseconds between iterations
            iteration += 1

    while iteration < last:
        trace = f"{next(writer.ids):032x}"
        interval, start, begin = new_id(), t, iteration
        t += 5_000  # the interval opens, then its first iteration
        iterations(trace, interval, min(shape.save_interval, last - iteration))
        t += 3_000
        writer.span("megatron.checkpoint.save", trace, new_id(), interval, t, t + 50 * MS,
                    int_attribute("megatron.iteration", iteration))  # fmt: skip
        saved = iteration
        t += 50 * MS + 1_000
        attributes = ",".join(
            (
                bool_attribute("is_goodput_span", True),
                int_attribute("megatron.interval.index", index),
                bool_attribute("megatron.interval.rerooted", iteration < last or killed),
                int_attribute("megatron.interval.first_iteration", begin),
                int_attribute("megatron.interval.last_iteration", iteration - 1),
            )
        )
        link = f'{{"traceId":"{previous_trace}","spanId":"{previous}","flags":256}}'
        writer.span("megatron.train", trace, interval, "", start, t, attributes, link)
        previous, previous_trace, index = interval, trace, index + 1
    if killed:
        # the interval in flight at the SIGKILL: its finished iterations are written,
        # then one child of the iteration in flight; the interval itself never is
        trace, interval = f"{next(writer.ids):032x}", new_id()
        iterations(trace, interval, shape.kill_after)
        writer.span("megatron.train.get_batch", trace, new_id(), new_id(), t, t + 1 * MS)
        t += 2 * MS
    return t, saved, iteration - first


def write_per_step(path: Path, shape: Shape = Shape()) -> list[Path]:
    """Write the trace (one file, or one per rank); returns the paths written.

    Every rank trains the same iterations, so the spans split evenly; each
    rank trains until it has run ``shape.spans / ranks / 4`` iterations (four
    spans each, six with ``communication``), so the file holds at least
    ``shape.spans`` spans.
    """
    per_rank = -(-shape.spans // (shape.ranks * (6 if shape.communication else 4)))
    ids = itertools.count(1)
    ranks_lines: list[list[str]] = []
    for rank in range(shape.ranks):
        lines: list[str] = []
        now, first, run = shape.t0_ns, 0, 0
        for number in range(shape.incarnations):
            killed = number < shape.incarnations - 1
            pid = 1000 + 10 * rank + (0 if shape.in_process else number)
            writer = LineWriter(resource_json(rank, shape.ranks, pid, "synth"), ids, shape.per_line)
            share = max(shape.save_interval, per_rank // shape.incarnations)
            last = first + share if killed else first + max(per_rank - run, 1)
            now, first, ran = _incarnation(writer, shape, now, first, last, killed, rank)
            writer.flush()
            lines.extend(writer.lines)
            run += ran
            now += 30_000 * MS  # the restart gap
        ranks_lines.append(lines)
    if shape.per_rank_files:
        paths = []
        for rank, lines in enumerate(ranks_lines):
            rank_path = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
            rank_path.write_text("".join(lines))
            paths.append(rank_path)
        return paths
    with path.open("w") as file:
        for group in itertools.zip_longest(*ranks_lines):
            file.writelines(line for line in group if line is not None)
    return [path]
