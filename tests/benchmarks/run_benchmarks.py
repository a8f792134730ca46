"""What the span lifecycle and the instrumentation cost, as ratios measured in one run.

Each figure is ours over a baseline measured in the same process (or, for the
training loop, the same run of this script), interleaved repetition by
repetition so drift in machine load hits both sides alike; we report medians.
Nothing here asserts a time: the figures are printed, a readable table first,
and as the last line one JSON object (the keys of issue #5).

Run with ``tox -e bench`` (or ``python tests/benchmarks/run_benchmarks.py``).
Kept out of the default test run: pytest collects only ``test_*.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link

from megatron.core.telemetry.reader import read_spans
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
    "report_s_per_million_spans": 30.0,
    "report_peak_mb_1m_spans": 200.0,
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
        from megatron.trace.report import report_files

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


def record_trace_report(results: dict, rows: list, repeats: int) -> None:
    """Add ``report_s_per_million_spans`` and ``report_peak_mb_1m_spans``."""
    per_million, peak_mb, spans, size_mb, imports_mb = bench_trace_report(repeats)
    results["report_s_per_million_spans"] = round(per_million, 2)
    rows.append(
        (
            "report_s_per_million_spans",
            f"{per_million:.2f}",
            f"{spans} spans",
            f"{size_mb:.0f} MB file",
        )
    )
    results["report_peak_mb_1m_spans"] = round(peak_mb, 1)
    rows.append(
        ("report_peak_mb_1m_spans", f"{peak_mb:.1f}", "peak RSS", f"{imports_mb:.1f} MB imports")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = parser.parse_args(argv)
    reps = 5 if args.quick else 21
    train_reps = 1 if args.quick else 12
    train_iterations = 50 if args.quick else 150

    results: dict[str, float] = {}
    rows: list[tuple[str, str, str, str]] = []

    def record(key: str, ratio: float, ours: str, base: str) -> None:
        results[key] = round(ratio, 3)
        rows.append((key, f"{ratio:.3f}", ours, base))

    for key, enabled in (("step_ratio_off", False), ("step_ratio_on", True)):
        ratio, ours, base = bench_step(enabled, reps, 200_000)
        record(key, ratio, f"{ours * 1e9:.1f} ns", f"{base * 1e9:.1f} ns (empty method)")

    ratio, ours, base = bench_reroot(reps, 2_000)
    record("reroot_ratio", ratio, f"{ours * 1e6:.2f} us", f"{base * 1e6:.2f} us (raw SDK)")

    ratio, ours, base = bench_lifecycle(max(reps // 2, 3))
    record("lifecycle_ratio", ratio, f"{ours * 1e3:.2f} ms", f"{base * 1e3:.2f} ms (raw SDK)")

    default, per_step, off_ms = bench_training(train_reps, train_iterations)
    record("train_overhead_default", default, "", f"{off_ms:.2f} ms/iter (telemetry off)")
    record("train_overhead_per_step", per_step, "", f"{off_ms:.2f} ms/iter (telemetry off)")

    seconds, written = bench_sigterm(3 if args.quick else 5)
    results["sigterm_exit_s"] = round(seconds, 3)
    rows.append(("sigterm_exit_s", f"{seconds:.3f}", f"{written} spans in file", "(absolute)"))

    record_trace_report(results, rows, 1 if args.quick else 3)

    print(f"{'key':<26}{'median':>10}  {'target':>7}  {'ours':<22}baseline")
    for key, value, ours_text, base_text in rows:
        print(f"{key:<26}{value:>10}  {TARGETS[key]:>7}  {ours_text:<22}{base_text}")
    print(f"# {os.cpu_count()} cpus, python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
