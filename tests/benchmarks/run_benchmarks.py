"""What the span lifecycle and the instrumentation cost, as ratios measured in one run.

Each figure is ours over a baseline measured in the same process (or, for the
training loop, the same run of this script), interleaved repetition by
repetition so drift in machine load hits both sides alike; we report medians.
Nothing here asserts a time: the figures are printed, a readable table first,
and as the last line one JSON object (the keys of the README's Performance table).

Run with ``tox -e bench`` (or ``python tests/benchmarks/run_benchmarks.py``);
``--only encode,pipeline`` runs some sections (``--list`` names them all).
Each section is one function, registered in ``SECTIONS`` with the keys it
records; a new benchmark is a function, a ``SECTIONS`` row and its targets.
Kept out of the default test run: pytest collects only ``test_*.py``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.exporter.otlp.json.common.trace_encoder import (
    encode_spans as official_encode_spans,
)
from opentelemetry.exporter.otlp.json.file import FileSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link

from megatron.core.telemetry import TelemetryConfig, managed_span, setup_telemetry
from megatron.core.telemetry._otlp_json import encode_spans
from megatron.core.telemetry.processors import BatchSettings
from megatron.core.telemetry.span_groups import SpanGroup
from megatron.trace.otlp.reader import read_spans
from megatron.training.telemetry_spans import SpanPhases
from megatron.training.training_log import parse_log_iteration_ms

REPO_ROOT = Path(__file__).resolve().parents[2]

TARGETS = {
    "step_ratio_off": 2.0,
    "step_ratio_on": 2.0,
    "reroot_ratio": 1.5,
    "lifecycle_ratio": 1.3,
    "train_overhead_default": 1.01,
    "train_overhead_per_step": 1.05,
    "sigterm_exit_s": 1.0,
    "encode_ratio_vs_official": 0.7,
    "pipeline_cpu_ratio": 0.8,
    "report_s_per_million_spans": 30.0,
    "report_peak_mb_1m_spans": 200.0,
    "report_floor_ratio": 1.0,
    "check_floor_ratio": 1.2,
    "export_floor_ratio": 2.0,
    "export_perfetto_floor_ratio": 2.0,
    "report_fallback_floor_ratio": float("nan"),  # measured, no target
    "export_many_intervals_floor_ratio": 2.0,
    # the same file, every reader: independent of the number of intervals, as above
    "report_many_intervals_floor_ratio": 1.0,
    "check_many_intervals_floor_ratio": 1.2,
    "export_perfetto_many_intervals_floor_ratio": 2.0,
    "check_peak_mb_1m_spans": 300.0,
    "export_perfetto_size_ratio": 1.0,
    # with the communication group (the straggler split): as fast as any report
    "report_communication_floor_ratio": 1.0,
    # peak RSS at 4M spans / at 1M, the same shape: flat memory is about 1
    "report_peak_growth_4x_spans": 1.1,
    "check_peak_growth_4x_spans": 1.1,
    "export_peak_growth_4x_spans": 1.1,
    "export_perfetto_peak_growth_4x_spans": 1.1,
    "timeline_peak_growth_4x_spans": 1.1,
    # the timeline's lanes into their page: ours (msgspec for the bars) must beat plotly's
    "timeline_page_ratio_vs_plotly": 1.0,
    # the report's order statistics by selection over the columns' parts against numpy's
    # partition of the whole column: a small fraction of its memory, for a few passes' time
    "selection_peak_ratio_vs_partition": 0.25,
    "selection_time_ratio_vs_partition": float("nan"),  # measured, no target
}


class _InMemoryTelemetry:
    """A handle on a real SDK provider whose spans land in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("bench")
        self.is_exporting = True
        self.span_groups = frozenset({"job"})

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        return self.provider.force_flush(timeout_ms)

    def shutdown(self, timeout_ms: int = 5000) -> None:
        self.provider.shutdown()


class _Comparable:
    """The step() baseline: an object with an empty method of the same shape."""

    def __init__(self) -> None:
        self._countdown = 1
        self.save_interval = 100

    def step(self, iteration: int | None = None) -> None:
        pass


def _interleaved(ours: Callable[[], float], baseline: Callable[[], float], repeats: int):
    """Median of per-repetition ratios, alternating which side runs first."""
    ratios, ours_times, base_times = [], [], []
    for rep in range(repeats):
        if rep % 2:
            b, o = baseline(), ours()
        else:
            o, b = ours(), baseline()
        ratios.append(o / b)
        ours_times.append(o)
        base_times.append(b)
    return statistics.median(ratios), statistics.median(ours_times), statistics.median(base_times)


def _time_calls(fn: Callable[[int], None], n: int) -> float:
    """Seconds per call of ``fn(i)`` over ``n`` calls."""
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) / n


# -- step() -----------------------------------------------------------------


def bench_step(enabled: bool, repeats: int, n: int):
    telemetry = _InMemoryTelemetry() if enabled else None
    phases = SpanPhases(telemetry, save_interval=10**12, enabled=enabled)
    phases.start_job(model_type="GPT")
    phases.start_train()
    phases.step(0)  # the boundary pass: opens the interval; the rest are not boundaries
    baseline = _Comparable()
    return _interleaved(
        lambda: _time_calls(phases.step, n), lambda: _time_calls(baseline.step, n), repeats
    )


# -- reroot -----------------------------------------------------------------


def bench_reroot(repeats: int, n: int):
    ours_telemetry = _InMemoryTelemetry()
    phases = SpanPhases(ours_telemetry, save_interval=1)
    phases.start_job(model_type="GPT")
    phases.start_train()
    phases.step(0)

    raw_telemetry = _InMemoryTelemetry()
    tracer = raw_telemetry.tracer
    first = tracer.start_span("megatron.train", context=otel_context.Context())
    raw = {"span": first, "token": otel_context.attach(otel_trace.set_span_in_context(first))}
    index = [0]

    def raw_reroot(_: int) -> None:
        # The minimal SDK calls for the same two spans and link: detach and end
        # C(k), start C(k+1) in an empty context linked to it, attach it.
        previous = raw["span"]
        otel_context.detach(raw["token"])
        previous.set_attribute("megatron.interval.rerooted", True)  # as ours writes it
        previous.end()
        index[0] += 1
        span = tracer.start_span(
            "megatron.train",
            context=otel_context.Context(),
            links=[Link(previous.get_span_context())],
            attributes={"is_goodput_span": True, "megatron.interval.index": index[0]},
        )
        raw["span"] = span
        raw["token"] = otel_context.attach(otel_trace.set_span_in_context(span))

    def ours() -> float:
        ours_telemetry.exporter.clear()
        return _time_calls(lambda _: phases.reroot(), n)

    def baseline() -> float:
        raw_telemetry.exporter.clear()
        return _time_calls(raw_reroot, n)

    result = _interleaved(ours, baseline, repeats)
    otel_context.detach(raw["token"])
    return result


# -- a whole lifecycle -------------------------------------------------------


def bench_lifecycle(repeats: int, passes: int = 10_000, save_interval: int = 100):
    def ours() -> float:
        telemetry = _InMemoryTelemetry()
        phases = SpanPhases(telemetry, save_interval=save_interval)
        start = time.perf_counter()
        phases.start_job(model_type="GPT", timestamps={"program_start": time.time() - 1})
        phases.start_train()
        for iteration in range(passes):
            phases.step(iteration)
        phases.end_train()
        phases.shutdown()
        elapsed = time.perf_counter() - start
        assert len(telemetry.exporter.get_finished_spans()) == 1 + passes // save_interval
        return elapsed

    def baseline() -> float:
        telemetry = _InMemoryTelemetry()
        tracer = telemetry.tracer
        start = time.perf_counter()
        startup = tracer.start_span(
            "megatron.startup",
            context=otel_context.Context(),
            start_time=int((time.time() - 1) * 1e9),
            attributes={"is_goodput_span": True, "megatron.model_type": "GPT"},
        )
        token = otel_context.attach(otel_trace.set_span_in_context(startup))
        otel_context.detach(token)
        startup.end()
        link_to, interval, index, first = startup.get_span_context(), None, 0, 0
        for iteration in range(passes):
            if iteration % save_interval == 0:
                if interval is not None:
                    otel_context.detach(token)
                    interval.set_attributes(
                        {
                            "megatron.interval.first_iteration": first,
                            "megatron.interval.last_iteration": iteration - 1,
                            "megatron.interval.rerooted": True,
                        }
                    )
                    interval.end()
                    link_to = interval.get_span_context()
                interval = tracer.start_span(
                    "megatron.train",
                    context=otel_context.Context(),
                    links=[Link(link_to)],
                    attributes={"is_goodput_span": True, "megatron.interval.index": index},
                )
                token = otel_context.attach(otel_trace.set_span_in_context(interval))
                index, first = index + 1, iteration
        otel_context.detach(token)
        interval.set_attributes(
            {
                "megatron.interval.first_iteration": first,
                "megatron.interval.last_iteration": passes - 1,
                "megatron.interval.rerooted": False,
            }
        )
        interval.end()
        telemetry.shutdown()
        return time.perf_counter() - start

    return _interleaved(ours, baseline, repeats)


# -- the training loop ------------------------------------------------------


def _train_ms_per_iteration(groups: str | None, iterations: int, workdir: Path) -> float:
    """Steady-state ms/iteration of a real training run, as the trainer logs it.

    The trainer logs the mean over each ``--log-interval`` window. We take the
    fastest window after the first (warm-up): the least-disturbed estimate,
    applied alike to every setting. Run-to-run noise of window means on this
    2-core machine is a few percent, far above what the spans cost.
    """
    log_interval = max(iterations // 10, 1)
    # The demo model's shape (``--demo``), with its own checkpoints and
    # evaluation left out so every window times the same work.
    cmd = [
        sys.executable, "-m", "megatron.training", "--mock-data",
        "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--micro-batch-size", "8", "--global-batch-size", "16",
        "--train-iters", str(iterations), "--log-interval", str(log_interval),
        "--save-interval", str(5 * log_interval), "--seed", "1234",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    if groups is None:
        cmd.append("--no-otel-enabled")
    else:
        trace_file = workdir / f"{groups}-{time.monotonic_ns()}.jsonl"
        cmd += [
            "--otel-enabled",
            "--otel-span-groups",
            groups,
            "--otel-trace-file",
            str(trace_file),
        ]
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"training run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    windows = list(parse_log_iteration_ms(done.stdout).values())
    if len(windows) < 2:
        raise RuntimeError(f"no per-iteration timings in the training log:\n{done.stdout[-2000:]}")
    return min(windows[1:])


def bench_training(repeats: int, iterations: int):
    """Runs of off, default and per_step, interleaved; ratios per repetition.

    The order rotates every repetition, so a slow drift of the machine (or
    whatever the first run of a triple warms up) does not favour one setting.
    """
    settings = [None, "default", "per_step"]
    ratios: dict[str, list[float]] = {"default": [], "per_step": []}
    off_ms = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            order = settings[rep % 3 :] + settings[: rep % 3]
            ms = {
                groups: _train_ms_per_iteration(groups, iterations, Path(tmp)) for groups in order
            }
            off_ms.append(ms[None])
            for groups in ratios:
                ratios[groups].append(ms[groups] / ms[None])
    return (
        statistics.median(ratios["default"]),
        statistics.median(ratios["per_step"]),
        statistics.median(off_ms),
    )


# -- SIGTERM to exit ----------------------------------------------------------

_SIGTERM_CHILD = textwrap.dedent(
    """
    import sys, time
    from megatron.core.telemetry import TelemetryConfig, setup_telemetry
    from megatron.training.telemetry_spans import SpanPhases, install_exit_hooks

    config = TelemetryConfig.from_env(env={
        "MEGATRON_OTEL_ENABLED": "1", "MEGATRON_OTEL_TRACE_FILE": sys.argv[1],
        "MEGATRON_OTEL_SPAN_GROUPS": "per_step",
    })
    telemetry = setup_telemetry(config)
    phases = SpanPhases(telemetry, save_interval=0)
    install_exit_hooks(phases)
    phases.start_job(model_type="GPT")
    phases.start_train()
    phases.step(0)
    tracer = telemetry.tracer
    for i in range(10_000):
        tracer.start_span("megatron.train.iteration", attributes={"megatron.iteration": i}).end()
    print("READY", flush=True)
    time.sleep(60)
    """
)


def bench_sigterm(repeats: int) -> tuple[float, int]:
    """Seconds from a hard SIGTERM to process exit with 10,000 spans queued."""
    times, spans_written = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            trace_file = Path(tmp) / f"traces-{rep}.jsonl"
            child = subprocess.Popen(
                [sys.executable, "-c", _SIGTERM_CHILD, str(trace_file)],
                stdout=subprocess.PIPE,
                text=True,
                env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
            )
            assert child.stdout.readline().strip() == "READY"
            start = time.perf_counter()
            child.send_signal(signal.SIGTERM)
            code = child.wait(timeout=60)
            times.append(time.perf_counter() - start)
            if code != -signal.SIGTERM:
                raise RuntimeError(f"child exited with {code}, expected death by SIGTERM")
            spans_written = len(read_spans(trace_file))
    return statistics.median(times), spans_written


# -- OTLP/JSON encoding: ours against the official encoder ---------------------


def _interval_batch(iterations: int = 128) -> list[ReadableSpan]:
    """One export batch of a ``per_step`` run: an interval root and, per
    iteration, the iteration span and its forward/backward, batch and
    optimizer children (``4 * iterations + 1`` spans)."""
    telemetry = _InMemoryTelemetry()
    tracer = telemetry.tracer
    startup = tracer.start_span("megatron.startup", context=otel_context.Context())
    startup.end()
    interval = tracer.start_span(
        "megatron.train",
        context=otel_context.Context(),
        links=[Link(startup.get_span_context())],
        attributes={"is_goodput_span": True, "megatron.interval.index": 0},
    )
    in_interval = otel_trace.set_span_in_context(interval)
    for i in range(iterations):
        iteration = tracer.start_span(
            "megatron.train.iteration", in_interval, attributes={"megatron.iteration": i}
        )
        in_iteration = otel_trace.set_span_in_context(iteration)
        forward = tracer.start_span("megatron.train.forward_backward", in_iteration)
        tracer.start_span("megatron.train.get_batch", otel_trace.set_span_in_context(forward)).end()
        forward.end()
        tracer.start_span("megatron.train.optimizer", in_iteration).end()
        iteration.end()
    interval.set_attributes(
        {"megatron.interval.first_iteration": 0, "megatron.interval.last_iteration": iterations}
    )
    interval.end()
    spans = [s for s in telemetry.exporter.get_finished_spans() if s.name != "megatron.startup"]
    telemetry.shutdown()
    return spans


def bench_encode(repeats: int, rounds: int = 20):
    """CPU seconds per span to turn one batch into the line each file exporter writes.

    Ours: ``encode_spans`` dumped as ``JsonlFile.write_lines`` dumps it. The
    official: ``encode_spans(...).to_dict()`` dumped as its ``FileSpanExporter``
    does. Both produce the same request (``test_core_otlp_conformance``).
    """
    batch = _interval_batch()

    # This thread's CPU time: on a shared machine, wall time would also count
    # the moments another process held the core.
    def ours() -> float:
        start = time.thread_time()
        for _ in range(rounds):
            json.dumps(encode_spans(batch), separators=(",", ":"), ensure_ascii=False)
        return (time.thread_time() - start) / (rounds * len(batch))

    def official() -> float:
        start = time.thread_time()
        for _ in range(rounds):
            json.dumps(official_encode_spans(batch).to_dict(), separators=(",", ":"))
        return (time.thread_time() - start) / (rounds * len(batch))

    return _interleaved(ours, official, repeats)


# -- the whole span path, CPU per exported span -------------------------------


def _cpu_per_span(emit: Callable[[], Path], expected: int) -> float:
    """Process CPU seconds (every thread) per span for ``emit``, which creates
    the spans and shuts its pipeline down; it returns the file written, whose
    span count is checked so neither side can win by dropping spans."""
    gc.collect()
    start = time.process_time()
    path = emit()
    elapsed = time.process_time() - start
    written = len(read_spans(path))
    if written != expected:
        raise RuntimeError(f"{path.name}: {written} spans written, expected {expected}")
    return elapsed / expected


def bench_pipeline(repeats: int, spans: int = 10_000):
    """CPU per exported span: ``managed_span`` through our processor into our
    JSONL file, against raw SDK spans through the SDK's ``BatchSpanProcessor``
    into the official ``FileSpanExporter``.

    Same spans (names, attributes, nesting, resource and scope), same count.
    The SDK processor gets our batch settings: at its default queue (2048)
    it would drop most of a 10,000-span burst, doing less work. Setup and
    file opening are outside the measured window; the final flush and
    shutdown are inside it.
    """
    settings = BatchSettings.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        counter = [0]

        def fresh(name: str) -> Path:
            counter[0] += 1
            return Path(tmp) / f"{name}-{counter[0]}.jsonl"

        def ours() -> float:
            path = fresh("ours")
            handle = setup_telemetry(
                TelemetryConfig(
                    enabled=True, exporter="jsonl", trace_file=path, span_groups_spec="per_step"
                )
            )

            def emit() -> Path:
                with managed_span(SpanGroup.JOB, "megatron.train", is_goodput_span=True):
                    for i in range(spans):
                        with managed_span(
                            SpanGroup.STEP, "megatron.train.iteration", **{"megatron.iteration": i}
                        ):
                            pass
                handle.shutdown()
                return path

            return _cpu_per_span(emit, spans + 1)

        # The baseline uses our handle's resource and scope, so both files hold
        # the same bytes per span.
        probe = setup_telemetry(
            TelemetryConfig(enabled=True, exporter="none", span_groups_spec="per_step")
        )
        with managed_span(SpanGroup.JOB, "probe") as span:
            resource, scope = span.resource, span.instrumentation_scope
        probe.shutdown()

        def official() -> float:
            path = fresh("official")
            provider = TracerProvider(resource=resource, shutdown_on_exit=False)
            provider.add_span_processor(
                BatchSpanProcessor(
                    FileSpanExporter(path),
                    max_queue_size=settings.max_queue_size,
                    schedule_delay_millis=settings.schedule_delay_millis,
                    max_export_batch_size=settings.max_export_batch_size,
                )
            )
            tracer = provider.get_tracer(scope.name, scope.version)

            def emit() -> Path:
                with tracer.start_as_current_span(
                    "megatron.train", attributes={"is_goodput_span": True}
                ):
                    for i in range(spans):
                        with tracer.start_as_current_span(
                            "megatron.train.iteration", attributes={"megatron.iteration": i}
                        ):
                            pass
                provider.shutdown()
                return path

            return _cpu_per_span(emit, spans + 1)

        return _interleaved(ours, official, repeats)


# -- sections -----------------------------------------------------------------


@dataclass
class Run:
    """Settings of one run, and what its sections recorded."""

    quick: bool
    results: dict[str, float] = field(default_factory=dict)
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)

    @property
    def reps(self) -> int:
        return 5 if self.quick else 21

    def record(self, key: str, value: float, ours: str, base: str) -> None:
        self.results[key] = round(value, 3)
        self.rows.append((key, f"{value:.3f}", ours, base))


def section_step(run: Run) -> None:
    for key, enabled in (("step_ratio_off", False), ("step_ratio_on", True)):
        ratio, ours, base = bench_step(enabled, run.reps, 200_000)
        run.record(key, ratio, f"{ours * 1e9:.1f} ns", f"{base * 1e9:.1f} ns (empty method)")


def section_reroot(run: Run) -> None:
    ratio, ours, base = bench_reroot(run.reps, 2_000)
    run.record("reroot_ratio", ratio, f"{ours * 1e6:.2f} us", f"{base * 1e6:.2f} us (raw SDK)")


def section_lifecycle(run: Run) -> None:
    ratio, ours, base = bench_lifecycle(max(run.reps // 2, 3))
    run.record("lifecycle_ratio", ratio, f"{ours * 1e3:.2f} ms", f"{base * 1e3:.2f} ms (raw SDK)")


def section_training(run: Run) -> None:
    default, per_step, off_ms = bench_training(1 if run.quick else 12, 50 if run.quick else 150)
    run.record("train_overhead_default", default, "", f"{off_ms:.2f} ms/iter (telemetry off)")
    run.record("train_overhead_per_step", per_step, "", f"{off_ms:.2f} ms/iter (telemetry off)")


def section_sigterm(run: Run) -> None:
    seconds, written = bench_sigterm(3 if run.quick else 5)
    run.record("sigterm_exit_s", seconds, f"{written} spans in file", "(absolute)")


def section_encode(run: Run) -> None:
    ratio, ours, base = bench_encode(run.reps)
    run.record(
        "encode_ratio_vs_official",
        ratio,
        f"{ours * 1e6:.2f} us/span",
        f"{base * 1e6:.2f} us/span (otlp-json-common)",
    )


def section_pipeline(run: Run) -> None:
    ratio, ours, base = bench_pipeline(5 if run.quick else 11)
    run.record(
        "pipeline_cpu_ratio",
        ratio,
        f"{ours * 1e6:.1f} us CPU/span",
        f"{base * 1e6:.1f} us CPU/span (SDK batch + FileSpanExporter)",
    )


# -----------------------------------------------------------------------------


def bench_trace_report(
    repeats: int, spans: int = 1_000_000
) -> tuple[float, float, int, float, float]:
    """``megatron-trace report`` on a synthetic per_step trace of ``spans`` spans.

    The file is written directly as OTLP/JSON lines shaped like a per_step run
    (intervals of 100 iterations, each with three children, a checkpoint save
    per interval, 500 spans per line), which takes seconds instead of a day of
    training. Each repetition reports in a fresh subprocess, so its peak RSS
    (``VmHWM``, else ``ru_maxrss``) is the report's own. Returns (seconds per million spans,
    peak MB, spans, file MB, peak MB before reading: interpreter and imports),
    medians over the repetitions.
    """
    resource = json.dumps(
        {"attributes": [{"key": "dl.rank", "value": {"intValue": "0"}},
                        {"key": "service.instance.id", "value": {"stringValue": "bench-rank0"}},
                        {"key": "process.pid", "value": {"intValue": "1"}}]}
    )  # fmt: skip
    head = (
        '{"resourceSpans":[{"resource":'
        + resource
        + ',"scopeSpans":[{"scope":{"name":"megatron"},"spans":['
    )
    ids = iter(range(1, 1 << 62))

    def span(
        name: str, trace: str, parent: str, start: int, end: int, attrs: str = "", links: str = ""
    ) -> str:
        span_id = f"{next(ids):016x}"
        return (
            f'{{"traceId":"{trace}","spanId":"{span_id}","parentSpanId":"{parent}","name":"{name}",'
            f'"kind":1,"startTimeUnixNano":"{start}","endTimeUnixNano":"{end}",'
            f'"attributes":[{attrs}],"events":[],"links":[{links}],"status":{{"code":0}}}}'
        ), span_id

    def iattr(key: str, value: int) -> str:
        return f'{{"key":"{key}","value":{{"intValue":"{value}"}}}}'

    path = Path(tempfile.mkdtemp(prefix="bench-report-")) / "traces.jsonl"
    ms = 1_000_000
    written, batch = 0, []
    with path.open("w") as file:

        def emit(text: str) -> None:
            nonlocal written
            batch.append(text)
            written += 1
            if len(batch) == 500:
                file.write(head + ",".join(batch) + "]}]}]}\n")
                batch.clear()

        now, iteration = 0, 0
        text, previous = span("megatron.startup", "a" * 32, "", now, now + 1000 * ms)
        previous_trace = "a" * 32
        emit(text)
        now += 1000 * ms
        index = 0
        while written < spans:
            trace = f"{index + 1:032x}"
            interval_id = f"{next(ids):016x}"
            start = now
            for _ in range(100):
                text, iteration_id = span(
                    "megatron.train.iteration",
                    trace,
                    interval_id,
                    now,
                    now + 20 * ms,
                    iattr("megatron.iteration", iteration),
                )
                for name in (
                    "megatron.train.get_batch",
                    "megatron.train.forward_backward",
                    "megatron.train.optimizer",
                ):
                    emit(span(name, trace, iteration_id, now, now + 5 * ms)[0])
                emit(text)
                now += 20 * ms
                iteration += 1
            emit(
                span(
                    "megatron.checkpoint.save",
                    trace,
                    interval_id,
                    now,
                    now + 50 * ms,
                    iattr("megatron.iteration", iteration),
                )[0]
            )
            now += 50 * ms
            attrs = ",".join(
                (
                    iattr("megatron.interval.index", index),
                    iattr("megatron.interval.first_iteration", iteration - 100),
                    iattr("megatron.interval.last_iteration", iteration - 1),
                )
            )
            link = f'{{"traceId":"{previous_trace}","spanId":"{previous}"}}'
            emit(
                f'{{"traceId":"{trace}","spanId":"{interval_id}","parentSpanId":"","name":"megatron.train",'
                f'"kind":1,"startTimeUnixNano":"{start}","endTimeUnixNano":"{now}",'
                f'"attributes":[{attrs}],"events":[],"links":[{link}],"status":{{"code":0}}}}'
            )
            previous, previous_trace, index = interval_id, trace, index + 1
        if batch:
            file.write(head + ",".join(batch) + "]}]}]}\n")
    code = textwrap.dedent(
        """
        import json, resource, sys, time
        from megatron.trace.analysis.goodput import report_files

        def peak_kb():
            try:  # VmHWM starts afresh at exec; ru_maxrss would inherit the parent's peak
                with open("/proc/self/status") as status:
                    return next(int(l.split()[1]) for l in status if l.startswith("VmHWM:"))
            except OSError:
                return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

        imports_kb = peak_kb()
        started = time.perf_counter()
        report = report_files([sys.argv[1]])
        elapsed = time.perf_counter() - started
        print(json.dumps({"s": elapsed, "peak_kb": peak_kb(), "imports_kb": imports_kb,
                          "spans": report["spans"]}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    seconds, peaks, imports = [], [], []
    try:
        for _ in range(repeats):
            out = subprocess.run(
                [sys.executable, "-c", code, str(path)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            measured = json.loads(out.stdout.splitlines()[-1])
            assert measured["spans"] == written
            seconds.append(measured["s"])
            peaks.append(measured["peak_kb"] / 1024)
            imports.append(measured["imports_kb"] / 1024)
        size_mb = path.stat().st_size / 2**20
    finally:
        path.unlink(missing_ok=True)
        path.parent.rmdir()
    per_million = statistics.median(seconds) * 1e6 / written
    return per_million, statistics.median(peaks), written, size_mb, statistics.median(imports)


def section_report(run: Run) -> None:
    per_million, peak_mb, spans, size_mb, imports_mb = bench_trace_report(1 if run.quick else 3)
    run.record(
        "report_s_per_million_spans", per_million, f"{spans} spans", f"{size_mb:.0f} MB file"
    )
    run.record("report_peak_mb_1m_spans", peak_mb, "peak RSS", f"{imports_mb:.1f} MB imports")


def bench_timeline_page(repeats: int) -> tuple[float, float, float, int]:
    """The timeline's lanes into their page: ours (the bars streamed through temporary
    columns into plotly's markup, msgspec encoding them) against plotly's own
    ``to_html`` of the whole figure, interleaved, each from the same read of a
    generated file with an interval every 4 iterations (the bars of every interval and
    save: what makes a big page). Returns (ratio, ours s, plotly s, bars)."""
    from megatron.trace.otlp.spans import span_source
    from megatron.trace.render.timeline_data import collect
    from megatron.trace.render.timeline_page import _bytes, _lanes_plot, figure

    with tempfile.TemporaryDirectory(prefix="bench-page-") as directory:
        path, _, _ = _trace_file(Path(directory), "traces.jsonl", spans=400_000, save_interval=4)
        timeline = collect(span_source([path]), [str(path)], jobs=1)
    config = {"displaylogo": False}

    def ours() -> float:
        start = time.perf_counter()
        for _ in _bytes(_lanes_plot(timeline, "timeline", config)):
            pass
        return time.perf_counter() - start

    def plotly() -> float:
        start = time.perf_counter()
        figure(timeline).to_html(
            full_html=False, include_plotlyjs=False, div_id="timeline", config=config
        )
        return time.perf_counter() - start

    return (*_interleaved(ours, plotly, repeats), sum(1 for _ in timeline.bars))


def bench_selection(
    repeats: int, rows: int = 4_000_000
) -> tuple[float, float, float, float, float, float]:
    """The report's median and p90 of ``rows`` iteration durations: selected a radix digit
    at a time over the columns' parts (:mod:`megatron.trace._store.selection`) against
    ``np.partition`` of the whole column, read from the same spilled columns, with the
    same answer. Returns (peak ratio, time ratio, our peak MB, partition's peak MB, our
    s, partition's s); the peaks are tracemalloc's, above what was allocated before."""
    import tracemalloc

    import numpy as np

    from megatron.trace._store.columns import Iterations
    from megatron.trace._store.selection import select

    rng = np.random.default_rng(7)
    durations = rng.lognormal(np.log(2e7), 0.1, rows).astype(np.int64)
    starts = np.cumsum(durations + 1000) - durations
    ends = starts + durations
    its = Iterations()
    for lo in range(0, rows, 4096):  # through the hot loop's arrays, as the reader fills them
        numbers_tail, starts_tail, ends_tail = its.arrays()
        numbers_tail.frombytes(np.arange(lo, min(lo + 4096, rows), dtype=np.int64).tobytes())
        starts_tail.frombytes(starts[lo : lo + 4096].tobytes())
        ends_tail.frombytes(ends[lo : lo + 4096].tobytes())
    del durations, starts, ends
    ranks = [(rows - 1) // 2, rows // 2, max(0, -(-9 * rows // 10) - 1)]

    def selected() -> list[int]:
        def parts() -> Iterator[Any]:
            for part in its.parts():
                yield np.frombuffer(part.ends, np.int64) - np.frombuffer(part.starts, np.int64)

        return select(parts, ranks)

    def partitioned() -> list[int]:
        whole = np.frombuffer(its.ends, np.int64) - np.frombuffer(its.starts, np.int64)
        whole.partition(ranks)
        return [int(whole[rank]) for rank in ranks]

    if selected() != partitioned():
        raise AssertionError("selection and np.partition disagree")

    def peak(function: Callable[[], list[int]]) -> float:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            function()
            return (tracemalloc.get_traced_memory()[1] - before) / 2**20
        finally:
            tracemalloc.stop()

    def timed(function: Callable[[], list[int]]) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            function()
            return time.perf_counter() - start

        return run

    ours_mb, base_mb = peak(selected), peak(partitioned)
    ratio, ours_s, base_s = _interleaved(timed(selected), timed(partitioned), repeats)
    return ours_mb / base_mb, ratio, ours_mb, base_mb, ours_s, base_s


def section_selection(run: Run) -> None:
    peak_ratio, time_ratio, ours_mb, base_mb, ours_s, base_s = bench_selection(
        3 if run.quick else 7
    )
    run.record(
        "selection_peak_ratio_vs_partition",
        peak_ratio,
        f"{ours_mb:.1f} MB over 4M rows",
        f"np.partition of the whole column: {base_mb:.1f} MB",
    )
    run.record(
        "selection_time_ratio_vs_partition",
        time_ratio,
        f"{ours_s * 1e3:.0f} ms",
        f"np.partition: {base_s * 1e3:.0f} ms",
    )


def section_timeline(run: Run) -> None:
    ratio, ours, plotly, bars = bench_timeline_page(3 if run.quick else 9)
    run.record(
        "timeline_page_ratio_vs_plotly",
        ratio,
        f"{ours * 1e3:.0f} ms, {bars} bars",
        f"plotly's to_html: {plotly * 1e3:.0f} ms",
    )


# -- reading a week of many ranks: each command against the stdlib floor --------

# Every process reports the peak RSS of its biggest process on stderr, last line:
# its own (VmHWM, which starts afresh at exec: a child's ru_maxrss would start at
# this big process's) or that of the biggest of the workers it forked and waited for.
_PEAK = (
    "import atexit, resource, sys\n"
    "def _peak():\n"
    "    with open('/proc/self/status') as status:\n"
    "        kb = next(int(l.split()[1]) for l in status if l.startswith('VmHWM:'))\n"
    "    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "    print(f'peak_kb {max(kb, workers)}', file=sys.stderr)\n"
    "atexit.register(_peak)\n"
)
_FLOOR = _PEAK + (
    "import json\n"
    "with open(sys.argv[1], 'rb') as file:\n"
    "    for line in file:\n"
    "        json.loads(line)\n"
)
_TRACE = _PEAK + (
    "import runpy\n"
    "if sys.argv[1] == 'stdlib':\n"
    "    sys.modules['msgspec'] = None  # as if it were not installed\n"
    "sys.argv = ['megatron-trace', *sys.argv[2:]]\n"
    "runpy.run_module('megatron.trace', run_name='__main__')\n"
)


def _process(argv: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MB) of one whole process (CPU from its own ``wait4``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    # as installed: with bytecode cached (an installer writes it), not compiled at each start
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        errors.seek(0)
        said = errors.read().decode()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):  # check exits 1 on a violation; none is expected
        raise RuntimeError(f"{' '.join(argv)}: exit {code}: {said[-500:]}")
    peak_kb = int(said.rsplit("peak_kb ", 1)[1].split()[0])
    return wall, usage.ru_utime + usage.ru_stime, peak_kb / 1024


def _trace_file(directory: Path, name: str, **shape: Any) -> tuple[Path, int, float]:
    sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))
    import synthetic

    (path,) = synthetic.write_per_step(directory / name, synthetic.Shape(**shape))
    with path.open("rb") as file:
        spans = sum(line.count(b'"spanId"') - line.count(b'"links":[{') for line in file)
    return path, spans, path.stat().st_size / 2**20


def bench_trace_commands(repeats: int, spans: int = 1_000_000) -> dict[str, Any]:
    """Every ``megatron-trace`` reader as a whole process against the floor, interleaved.

    The floor is what any pure-Python reader must pay: ``json.loads`` of every
    line of the same file, in a process of its own. The file is a synthetic
    two-rank ``per_step`` trace (a SIGKILL and a resume on each rank, 100
    iterations an interval), written as the sink writes. A second file of as
    many spans has an interval every 4 iterations (a hundred thousand
    intervals): its ratios say what the number of intervals costs. (It is as
    big as the first so that the fixed cost of starting a process weighs the
    same in both; on a file a quarter the size it added a fifth to each ratio.)
    Two more files have the ``communication`` group too (gradient all-reduce spans:
    what ``report`` splits into work and wait per rank), of 1M and 4M spans: every
    command's peak RSS on the second over the first says how its memory grows with
    the file.
    """
    py = sys.executable
    directory = Path(tempfile.mkdtemp(prefix="bench-trace-"))
    try:
        path, count, size_mb = _trace_file(
            directory, "traces.jsonl", ranks=2, spans=spans, incarnations=2
        )
        many, many_count, _ = _trace_file(
            directory, "many.jsonl", ranks=2, spans=spans, save_interval=4
        )
        comm, comm_count, _ = _trace_file(
            directory, "comm.jsonl", ranks=2, spans=spans, incarnations=2, communication=True
        )
        comm4, _, _ = _trace_file(
            directory, "comm4.jsonl", ranks=2, spans=4 * spans, incarnations=2, communication=True
        )
        out = directory / "out"

        def trace(*args: str) -> list[str]:
            return [py, "-c", _TRACE, "msgspec", *args]

        commands = {
            "floor": [py, "-c", _FLOOR, str(path)],
            "report": trace("report", str(path)),
            "check": trace("check", str(path)),
            "export": trace("export", str(path), "-o", f"{out}.json"),
            "export_perfetto": trace(
                "export", str(path), "--format", "perfetto", "-o", f"{out}.pftrace"
            ),
            "report_fallback": [py, "-c", _TRACE, "stdlib", "report", str(path)],
            "many_floor": [py, "-c", _FLOOR, str(many)],
            "many_export": trace("export", str(many), "-o", f"{out}-many.json"),
            "many_report": trace("report", str(many)),
            "many_check": trace("check", str(many)),
            "many_export_perfetto": trace(
                "export", str(many), "--format", "perfetto", "-o", f"{out}-many.pftrace"
            ),
            "comm_floor": [py, "-c", _FLOOR, str(comm)],
            "comm_report": trace("report", str(comm)),
            "comm_check": trace("check", str(comm)),
            "comm_export": trace("export", str(comm), "-o", f"{out}-comm.json"),
            "comm_export_perfetto": trace(
                "export", str(comm), "--format", "perfetto", "-o", f"{out}-comm.pftrace"
            ),
            "comm_timeline": trace("timeline", str(comm), "-o", f"{out}-comm.html"),
            "comm4_report": trace("report", str(comm4)),
            "comm4_check": trace("check", str(comm4)),
            "comm4_export": trace("export", str(comm4), "-o", f"{out}-comm4.json"),
            "comm4_export_perfetto": trace(
                "export", str(comm4), "--format", "perfetto", "-o", f"{out}-comm4.pftrace"
            ),
            "comm4_timeline": trace("timeline", str(comm4), "-o", f"{out}-comm4.html"),
        }
        measured: dict[str, list[tuple[float, float, float]]] = {name: [] for name in commands}
        for _ in range(repeats):
            for name, argv in commands.items():
                measured[name].append(_process(argv))
                # the growth runs' outputs (up to a GB): gone before their pages are
                # written back, so the disk is as quiet for the next command as before
                for output in directory.glob("out-comm*"):
                    output.unlink()
        sizes = {
            "json": Path(f"{out}.json").stat().st_size / 2**20,
            "perfetto": Path(f"{out}.pftrace").stat().st_size / 2**20,
        }
    finally:
        for child in directory.iterdir():
            child.unlink()
        directory.rmdir()

    def median(name: str, field: int) -> float:
        return statistics.median(sample[field] for sample in measured[name])

    return {
        "spans": count,
        "size_mb": size_mb,
        "many_spans": many_count,
        "comm_spans": comm_count,
        "sizes": sizes,
        "wall": {name: median(name, 0) for name in commands},
        "cpu": {name: median(name, 1) for name in commands},
        "peak_mb": {name: median(name, 2) for name in commands},
    }


def section_trace(run: Run) -> None:
    figures = bench_trace_commands(1 if run.quick else 5)
    wall, cpu, peak = figures["wall"], figures["cpu"], figures["peak_mb"]
    per_million = 1e6 / figures["spans"]
    for name in ("report", "check", "export", "export_perfetto", "report_fallback"):
        run.record(
            f"{name}_floor_ratio",
            wall[name] / wall["floor"],
            f"{wall[name] * per_million:.2f} s/M spans, cpu {cpu[name] / cpu['floor']:.2f}x",
            f"floor {wall['floor'] * per_million:.2f} s/M spans ({figures['spans']} spans, "
            f"{figures['size_mb']:.0f} MB)",
        )
    for name in ("export", "report", "check", "export_perfetto"):
        many = f"many_{name}"
        run.record(
            f"{name}_many_intervals_floor_ratio",
            wall[many] / wall["many_floor"],
            f"{wall[many] * 1e6 / figures['many_spans']:.2f} s/M spans, "
            f"cpu {cpu[many] / cpu['many_floor']:.2f}x",
            f"an interval every 4 iterations ({figures['many_spans']} spans)",
        )
    run.record(
        "check_peak_mb_1m_spans", peak["check"], "peak RSS", f"floor process {peak['floor']:.1f} MB"
    )
    run.record(
        "report_communication_floor_ratio",
        wall["comm_report"] / wall["comm_floor"],
        f"{wall['comm_report'] * 1e6 / figures['comm_spans']:.2f} s/M spans",
        f"with grad_sync spans ({figures['comm_spans']} spans)",
    )
    for name in ("report", "check", "export", "export_perfetto", "timeline"):
        run.record(
            f"{name}_peak_growth_4x_spans",
            peak[f"comm4_{name}"] / peak[f"comm_{name}"],
            f"{peak[f'comm4_{name}']:.1f} MB at 4M spans",
            f"{peak[f'comm_{name}']:.1f} MB at 1M",
        )
    run.record(
        "export_perfetto_size_ratio",
        figures["sizes"]["perfetto"] / figures["sizes"]["json"],
        f"{figures['sizes']['perfetto']:.0f} MB",
        f"chrome JSON {figures['sizes']['json']:.0f} MB",
    )


#: Section name -> the function that runs it, in run order. Keep the cheap
#: sections first so a broken expensive one does not hide their figures.
SECTIONS: dict[str, Callable[[Run], None]] = {
    "step": section_step,
    "reroot": section_reroot,
    "lifecycle": section_lifecycle,
    "encode": section_encode,
    "pipeline": section_pipeline,
    "training": section_training,
    "sigterm": section_sigterm,
    "report": section_report,
    "timeline": section_timeline,
    "selection": section_selection,
    "trace": section_trace,
}


def main(argv: list[str] | None = None) -> int:
    # Not taken from __doc__, which ``python -OO`` strips.
    parser = argparse.ArgumentParser(
        description="What the span lifecycle and the instrumentation cost, as ratios "
        "measured in one run."
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument(
        "--only",
        metavar="SECTIONS",
        help=f"comma-separated sections to run (default: all): {', '.join(SECTIONS)}",
    )
    parser.add_argument("--list", action="store_true", help="print the section names and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(SECTIONS))
        return 0
    chosen = list(SECTIONS)
    if args.only:
        chosen = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = [name for name in chosen if name not in SECTIONS]
        if unknown or not chosen:
            parser.error(
                f"--only: unknown section(s) {', '.join(unknown) or '(none)'}; "
                f"valid: {', '.join(SECTIONS)}"
            )

    run = Run(quick=args.quick)
    for name in chosen:
        SECTIONS[name](run)

    width = max([len("key"), *(len(key) for key, *_ in run.rows)]) + 2
    print(f"{'key':<{width}}{'median':>10}  {'target':>7}  {'ours':<22}baseline")
    for key, value, ours_text, base_text in run.rows:
        print(f"{key:<{width}}{value:>10}  {TARGETS[key]:>7}  {ours_text:<22} {base_text}")
    print(f"# {os.cpu_count()} cpus, python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}")
    print(json.dumps(run.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
