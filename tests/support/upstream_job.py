"""A real job writing its telemetry as Megatron-LM does, for ``watch``'s end-to-end tests.

``upstream_traces`` re-enacts Megatron-LM's lifecycle on a virtual clock, so a
test knows every figure exactly. ``watch`` needs the other thing: a job that
runs in real time, trains a real (tiny) torch model, and whose files grow
while it runs, with none of this project's code writing them. This script is
that job. Run as ``python upstream_job.py TRACE_FILE [options]``:

* the spans are the ``default`` span groups' (``job``, ``checkpoint``,
  ``evaluate``) as Megatron-LM's ``pretrain()`` / ``train()`` open them:
  ``megatron.startup`` with its backdated ``megatron.startup.*`` phases, one
  ``megatron.train`` per checkpoint interval (a new trace linked to the one
  before), and per loop pass ``megatron.checkpoint.ft_heartbeat`` and
  ``megatron.checkpoint.save.finalize``; at each save
  ``megatron.checkpoint.exposed_save`` around ``reclaim_memory`` and
  ``save``; ``megatron.evaluate`` with its ``megatron.evaluate.step`` children;
  ``megatron.checkpoint.exit_finalize`` after the loop. No attribute of ours:
  only ``is_goodput_span``, ``megatron.model_type``, ``megatron.iteration`` and
  ``megatron.eval_iteration``;
* the resource is the one nemo-lens detects (``service.name``, ``host.name``,
  ``process.pid``, ``dl.rank`` from ``RANK``, ``nemo.run.id``);
* the SDK's ``BatchSpanProcessor`` (``OTEL_BSP_SCHEDULE_DELAY`` applies) into
  OpenTelemetry's official ``FileSpanExporter``, and the log-interval metric
  points (Megatron-LM's names, :func:`record_training_metrics`) through a
  ``PeriodicExportingMetricReader`` into the official ``FileMetricExporter``
  writing ``metrics.jsonl`` beside the trace. The reader's thread keeps
  exporting while the loop is stuck, as Megatron-LM's does;
* ``--rotate-bytes N`` hands the exporter a stream that, past N bytes, renames
  the file to ``.1`` (older copies shifted up), compresses it to ``.1.gz`` and
  starts a new one, as a collector's rotating file exporter leaves them;
* at each log interval, a line ``iteration N/M | lm loss: …`` on stdout, as
  Megatron-LM logs (N: the iterations done);
* ``--otlp-grpc HOST:PORT`` sends the spans and the metric points over the wire
  too, with the SDK's OTLP gRPC exporters (a second batch processor, a second
  periodic reader), as nemo-lens's ``otlp`` exporter does: the file stays
  the reference of what was sent;
* ``MEGATRON_TEST_ITERATION_SLEEP`` and ``MEGATRON_TEST_HANG_AT_ITERATION``
  (the trainer's fault hooks, read by the same code) slow or block the step.

SIGTERM ends it as an unhandled signal ends Megatron-LM without a handler:
nothing more is written.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import IO, Any

PROGRAM_START_NS = time.time_ns()

import torch  # noqa: E402  (the imports are the startup's first phase)
from opentelemetry import trace  # noqa: E402
from opentelemetry.context import Context  # noqa: E402
from opentelemetry.exporter.otlp.json.file import (  # noqa: E402
    FileMetricExporter,
    FileSpanExporter,
)
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: E402
from opentelemetry.trace import Link, Span  # noqa: E402

from megatron.core.telemetry.training_metrics import record_training_metrics  # noqa: E402
from megatron.training.fault_injection import FaultInjection  # noqa: E402

GOODPUT = {"is_goodput_span": True}


class RotatingStream:
    """A text stream the exporter writes whole lines to; past ``limit`` bytes the file is
    renamed to ``.1`` (``.1.gz`` to ``.2.gz`` and so on first), compressed, and a new one
    begun."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path, self.limit = path, limit
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, text: str) -> int:
        written = self._file.write(text)
        if self._file.tell() >= self.limit and text.endswith("\n"):
            self._rotate()
        return written

    @property
    def closed(self) -> bool:
        return self._file.closed

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def _rotate(self) -> None:
        self._file.close()
        numbers = sorted(
            (
                int(copy.name[len(self.path.name) + 1 : -3])
                for copy in self.path.parent.glob(self.path.name + ".*.gz")
            ),
            reverse=True,
        )
        for number in numbers:  # the oldest first: .2.gz -> .3.gz before .1.gz -> .2.gz
            copy = self.path.with_name(f"{self.path.name}.{number}.gz")
            copy.rename(self.path.with_name(f"{self.path.name}.{number + 1}.gz"))
        rotated = self.path.with_name(self.path.name + ".1")
        self.path.rename(rotated)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        with open(rotated, "rb") as src, gzip.open(f"{rotated}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        rotated.unlink()


class Job:
    """``pretrain()`` with nemo-lens's handle exporting to files, the ``default`` groups."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        rank = int(os.environ.get("RANK", "0"))
        resource = Resource.create(
            {
                "service.name": "megatron",
                "host.name": socket.gethostname(),
                "process.pid": os.getpid(),
                "dl.rank": rank,
                "nemo.run.id": args.run_id,
            }
        )
        # no service.instance.id: nemo-lens sets none without a run id of its own
        resource = Resource(
            {k: v for k, v in resource.attributes.items() if k != "service.instance.id"}
        )
        trace_file: Path = args.trace_file
        trace_file.parent.mkdir(parents=True, exist_ok=True)
        stream: Any = (
            RotatingStream(trace_file, args.rotate_bytes)
            if args.rotate_bytes
            else open(trace_file, "a", encoding="utf-8")  # noqa: SIM115
        )
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(BatchSpanProcessor(FileSpanExporter(stream=stream)))
        self.tracer = self.tracer_provider.get_tracer("megatron.training")
        readers = [
            PeriodicExportingMetricReader(
                FileMetricExporter(trace_file.with_name("metrics.jsonl")),
                export_interval_millis=args.metrics_interval * 1000,
            )
        ]
        if args.otlp_grpc:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            endpoint = f"http://{args.otlp_grpc}"
            wire = OTLPSpanExporter(endpoint=endpoint, insecure=True)
            self.tracer_provider.add_span_processor(BatchSpanProcessor(wire))
            readers.append(
                PeriodicExportingMetricReader(
                    OTLPMetricExporter(endpoint=endpoint, insecure=True),
                    export_interval_millis=args.metrics_interval * 1000,
                )
            )
        self.meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        self.meter = self.meter_provider.get_meter("megatron.training")
        self.faults = FaultInjection.from_env()

    def span(self, name: str, parent: Span | None, links: list[Link] | None = None, **attrs: Any):
        context = trace.set_span_in_context(parent) if parent is not None else Context()
        return self.tracer.start_span(
            name, context=context, links=links or [], attributes={**GOODPUT, **attrs}
        )

    def backdated(self, name: str, parent: Span, start_ns: int, end_ns: int) -> None:
        context = trace.set_span_in_context(parent)
        span = self.tracer.start_span(
            name, context=context, attributes=GOODPUT, start_time=start_ns
        )
        span.end(end_time=end_ns)

    def run(self) -> None:
        args = self.args
        startup = self.tracer.start_span(
            "megatron.startup",
            context=Context(),
            attributes={**GOODPUT, "megatron.model_type": "GPT"},
            start_time=PROGRAM_START_NS,
        )
        imported = time.time_ns()
        self.backdated("megatron.startup.imports", startup, PROGRAM_START_NS, imported)
        torch.manual_seed(1234 + int(os.environ.get("RANK", "0")))
        torch.set_num_threads(1)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.backdated("megatron.startup.initialize_megatron", startup, imported, time.time_ns())
        startup.end()

        previous: Span = startup
        interval: Span | None = None
        iteration = 0
        checkpoints = args.trace_file.parent / "checkpoints"
        while iteration < args.train_iters:
            if iteration % args.save_interval == 0:
                if interval is not None:
                    interval.end()
                interval = self.span("megatron.train", None, [Link(previous.get_span_context())])
                previous = interval
            self.span("megatron.checkpoint.ft_heartbeat", interval).end()
            self.span("megatron.checkpoint.save.finalize", interval).end()
            self.faults.before_forward(iteration)
            started = time.perf_counter()
            loss = self.step(model, optimizer)
            iteration += 1
            if iteration % args.log_interval == 0:
                print(f" iteration {iteration:8d}/{args.train_iters:8d} | lm loss: {loss:.6E} |")
                record_training_metrics(
                    self.meter,
                    step_duration_ms=(time.perf_counter() - started) * 1e3,
                    loss=loss,
                    learning_rate=1e-3,
                )
            if args.eval_interval and iteration % args.eval_interval == 0:
                evaluate = self.span("megatron.evaluate", interval)
                with torch.no_grad():
                    for k in range(2):
                        step = self.span(
                            "megatron.evaluate.step", evaluate, **{"megatron.eval_iteration": k + 1}
                        )
                        model(torch.randn(32, 64))
                        step.end()
                evaluate.end()
            if iteration % args.save_interval == 0:
                at = {"megatron.iteration": iteration}
                exposed = self.span("megatron.checkpoint.exposed_save", interval, **at)
                self.span("megatron.checkpoint.reclaim_memory", exposed).end()
                save = self.span("megatron.checkpoint.save", exposed, **at)
                checkpoints.mkdir(exist_ok=True)
                torch.save(model.state_dict(), checkpoints / "model.pt")
                save.end()
                exposed.end()
        self.span("megatron.checkpoint.exit_finalize", interval).end()
        if interval is not None:
            interval.end()
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()

    @staticmethod
    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
        batch = torch.randn(32, 64)
        loss = torch.nn.functional.mse_loss(model(batch), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return float(loss.detach())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace_file", type=Path)
    parser.add_argument("--train-iters", type=int, default=100)
    parser.add_argument("--save-interval", type=int, default=20)
    parser.add_argument("--eval-interval", type=int, default=0)
    parser.add_argument("--log-interval", type=int, default=1)
    parser.add_argument("--metrics-interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--rotate-bytes", type=int, default=0)
    parser.add_argument("--run-id", default="job-4711")
    parser.add_argument("--otlp-grpc", default=None, metavar="HOST:PORT")
    sys.stdout.reconfigure(line_buffering=True)
    Job(parser.parse_args(argv)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
