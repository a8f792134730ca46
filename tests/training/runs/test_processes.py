"""End-to-end: two pretrain() calls in one process, and two data-parallel ranks."""

from __future__ import annotations

import json

import pytest
from processes import TORCHRUN_2
from trace_helpers import incarnations

from megatron.trace.otlp.reader import read_spans
from megatron.training.training_log import parse_log_losses

pytestmark = pytest.mark.slow

PRETRAIN_TWICE = """
import json, signal, sys
from megatron.training.telemetry import lifecycle
from megatron.training.training import pretrain

installs = []
real_signal = signal.signal
def counting_signal(signum, handler):
    if signum == signal.SIGTERM:
        installs.append(getattr(handler, "__qualname__", repr(handler)))
    return real_signal(signum, handler)
signal.signal = counting_signal

results = [pretrain(sys.argv[1:] + ["--otel-trace-file", f"run{n}/traces.jsonl"]) for n in (1, 2)]
print(json.dumps({
    "installs": installs,
    "hooks_state": lifecycle.TRAINER_EXIT_HOOKS.state,
    "handler": getattr(signal.getsignal(signal.SIGTERM), "__qualname__", None),
    "iterations": [r.iteration for r in results],
    "trace_files": [str(r.trace_file) for r in results],
}))
"""


def test_two_pretrain_calls_in_one_process(training_cli):
    cli = training_cli
    args = (
        *cli.TINY,
        *cli.TELEMETRY_ON,
        "--train-iters", "4",
        "--save-interval", "2",
        "--exit-signal-handler",
    )  # fmt: skip
    result = cli.run(*args, module=("-c", PRETRAIN_TWICE))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # The trainer's graceful handler, then the telemetry hook chaining to it:
    # each installed once for the process, not once per pretrain().
    assert report["installs"] == ["GracefulExitSignal.handle", "ExitHooks.handle_sigterm"]
    assert report["handler"] == "ExitHooks.handle_sigterm"
    assert report["hooks_state"] == "installed"
    assert report["iterations"] == [4, 4]
    assert report["trace_files"] == ["run1/traces.jsonl", "run2/traces.jsonl"]
    for trace_file in report["trace_files"]:
        spans = read_spans(cli.cwd / trace_file)
        (run,) = incarnations(spans)
        assert run["startup"] is not None
        assert [c["attributes"]["megatron.interval.index"] for c in run["intervals"]] == [0, 1]
        assert not [s for s in spans if s["attributes"].get("megatron.span.cut_short")]


def test_torchrun_two_ranks_train_and_only_the_last_rank_exports(training_cli):
    cli = training_cli
    torchrun = (*TORCHRUN_2, "-m", "megatron.training")
    result = cli.run(
        *cli.TINY,
        *cli.TELEMETRY_ON,
        "--train-iters", "4",
        "--global-batch-size", "8",  # 2 ranks x micro-batch 2 x 2 accumulation steps
        "--save-interval", "2",
        "--save", "ckpt",
        module=torchrun,
        env={"OMP_NUM_THREADS": "1"},
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sorted(parse_log_losses(result.stdout)) == [1, 2, 3, 4]  # rank 0 logs
    assert (cli.cwd / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    written = sorted(str(p.relative_to(cli.cwd)) for p in cli.cwd.rglob("*.jsonl"))
    assert written == ["ckpt/telemetry/metrics.jsonl", "ckpt/telemetry/traces.jsonl"]
    spans = read_spans(cli.cwd / "ckpt" / "telemetry" / "traces.jsonl")
    assert {s["resource"]["dl.rank"] for s in spans} == {1}
    assert {s["resource"]["dl.data_parallel.size"] for s in spans} == {2}
    (run,) = incarnations(spans)
    assert len(run["intervals"]) == 2
    assert len([s for s in spans if s["name"] == "megatron.train.iteration"]) == 4
    # 2 accumulation steps per iteration on the exporting rank.
    assert len([s for s in spans if s["name"] == "megatron.train.forward_backward"]) == 8
