"""The trainer under Megatron-LM's telemetry settings: switches, log bridge, rank strategies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from processes import TORCHRUN_2

from megatron.trace.otlp.reader import decode_any_value, iter_logs, read_spans
from megatron.training.arguments import parse_args
from megatron.training.training_log import parse_log_losses

ITERATION_LINE = " iteration "


@pytest.mark.parametrize(
    ("variable", "value", "valid"),
    [
        ("MEGATRON_OTEL_RANK_STRATEGY", "every_rank", "first_rank_per_node"),
        ("NEMO_LENS_EXPORT_SAMPLE_RATE", "1.5", "from 0.0 to 1.0"),
        ("MEGATRON_OTEL_SAMPLING_STRATEGY", "random", "rank_aware"),
        ("MEGATRON_OTEL_LOGS_ENABLED", "sure", "true/false"),
    ],
)
def test_bad_value_stops_the_job_with_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    valid: str,
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as exc:
        parse_args(["--mock-data", "--otel-enabled"])
    assert exc.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert f"{variable}={value!r} is not valid" in line and valid in line


def log_records(path: Path) -> list[dict[str, Any]]:
    return [record["data"] for record in iter_logs(path)]


@pytest.mark.slow
def test_iteration_log_lines_open_their_iteration_span(training_cli) -> None:
    cli = training_cli
    result = cli.run(
        *cli.TINY, *cli.TELEMETRY_ON, "--train-iters", "4", "--log-interval", "2",
        "--save", "ckpt", "--save-interval", "2",
        env={"MEGATRON_OTEL_LOGS_ENABLED": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sorted(parse_log_losses(result.stdout)) == [2, 4]  # the console is unchanged
    telemetry = cli.cwd / "ckpt" / "telemetry"
    spans = read_spans(telemetry / "traces.jsonl")
    iteration_spans = {
        s["attributes"]["megatron.iteration"]: s
        for s in spans
        if s["name"] == "megatron.train.iteration"
    }
    lines = [
        r
        for r in log_records(telemetry / "logs.jsonl")
        if decode_any_value(r["body"]).startswith(" [")
        and ITERATION_LINE in decode_any_value(r["body"])
    ]
    assert len(lines) == 2
    for record in lines:
        body = decode_any_value(record["body"])
        assert body in result.stdout  # the same line the console shows
        (reported,) = parse_log_losses(body)  # "iteration N" ends 0-based iteration N-1
        span = iteration_spans[reported - 1]
        assert (record["traceId"], record["spanId"]) == (span["trace_id"], span["span_id"])
    records = log_records(telemetry / "logs.jsonl")
    saves = [r for r in records if "saved checkpoint" in decode_any_value(r["body"])]
    save_spans = {s["span_id"] for s in spans if s["name"] == "megatron.checkpoint.save"}
    assert saves and all(r["spanId"] in save_spans for r in saves)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("switch", "written"),
    [
        ("MEGATRON_OTEL_TRACES_ENABLED", ["metrics.jsonl"]),
        ("NEMO_LENS_METRICS_ENABLED", ["traces.jsonl"]),
    ],
)
def test_one_signal_off_writes_only_the_other(
    training_cli, switch: str, written: list[str]
) -> None:
    cli = training_cli
    result = cli.run(
        *cli.TINY, *cli.TELEMETRY_ON, "--train-iters", "3", "--save", "ckpt",
        env={switch: "0"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sorted(parse_log_losses(result.stdout)) == [1, 2, 3]
    assert sorted(p.name for p in (cli.cwd / "ckpt" / "telemetry").iterdir()) == written
    if written == ["traces.jsonl"]:
        names = {s["name"] for s in read_spans(cli.cwd / "ckpt" / "telemetry" / "traces.jsonl")}
        assert {"megatron.startup", "megatron.train", "megatron.train.iteration"} <= names


@pytest.mark.slow
@pytest.mark.parametrize(
    "env",
    [
        {"MEGATRON_OTEL_RANK_STRATEGY": "first_rank_per_node"},
        # lens's hash puts rank 0 at 0.785 and rank 1 at 0.8411: 0.8 samples rank 0 only.
        {"NEMO_LENS_EXPORT_STRATEGY": "sampled", "MEGATRON_OTEL_EXPORT_SAMPLE_RATE": "0.8"},
    ],
    ids=["first_rank_per_node", "sampled"],
)
def test_torchrun_rank_strategies_pick_rank_0(training_cli, env: dict[str, str]) -> None:
    # The default single_rank strategy would pick the last rank, rank 1.
    cli = training_cli
    torchrun = (*TORCHRUN_2, "-m", "megatron.training")
    result = cli.run(
        *cli.TINY, *cli.TELEMETRY_ON, "--train-iters", "2", "--save", "ckpt",
        module=torchrun,
        env={"OMP_NUM_THREADS": "1", **env},
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    spans = read_spans(cli.cwd / "ckpt" / "telemetry" / "traces.jsonl")
    assert {s["resource"]["dl.rank"] for s in spans} == {0}
    assert {s["resource"]["dl.local_rank"] for s in spans} == {0}
    assert len({s["resource"]["nemo.run.id"] for s in spans}) == 1
    assert len([s for s in spans if s["name"] == "megatron.train.iteration"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "env", "says"),
    [
        (("--otel-span-groups", "step, CHECKPOINT"), {}, "not computed: the job span group is off"),
        ((), {"OTEL_TRACES_SAMPLER": "always_off"}, "not computed: no span was recorded"),
        ((), {"MEGATRON_OTEL_EXPORTER": "console"}, "% of "),
    ],
    ids=["job-group-off", "always-off-sampler", "console-exporter"],
)
def test_the_summary_says_in_one_line_what_it_can_account(training_cli, extra, env, says):
    cli = training_cli
    result = cli.run(
        *cli.TINY, "--train-iters", "4", "--save-interval", "2", "--save", "ckpt",
        "--otel-enabled", *extra, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (goodput,) = [line for line in result.stdout.splitlines() if line.startswith("  goodput:")]
    assert says in goodput, goodput
    assert "checkpoint_save 100.0 %" not in result.stdout
