"""Real training runs: what telemetry adds to an iteration, and how fast a SIGTERM
ends a process with spans queued (sections ``training`` and ``sigterm``)."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from harness import REPO_ROOT, Run

from megatron.trace.otlp.reader import read_spans
from megatron.training.training_log import parse_log_iteration_ms

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


def section_training(run: Run) -> None:
    default, per_step, off_ms = bench_training(1 if run.quick else 12, 50 if run.quick else 150)
    run.record("train_overhead_default", default, "", f"{off_ms:.2f} ms/iter (telemetry off)")
    run.record("train_overhead_per_step", per_step, "", f"{off_ms:.2f} ms/iter (telemetry off)")


def section_sigterm(run: Run) -> None:
    seconds, written = bench_sigterm(3 if run.quick else 5)
    run.record("sigterm_exit_s", seconds, f"{written} spans in file", "(absolute)")
