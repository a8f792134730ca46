"""End-to-end: the traces, metrics and losses of normal, early-exited and resumed runs."""

from __future__ import annotations

import itertools
import json
import math
import time

import pytest
from trace_helpers import ancestor_names, incarnations

from megatron.core.telemetry.training_metrics import (
    MEGATRON_TRAINING_GRAD_NORM,
    MEGATRON_TRAINING_LEARNING_RATE,
    MEGATRON_TRAINING_LOSS,
    MEGATRON_TRAINING_STEP_DURATION_MS,
    MEGATRON_TRAINING_TOKENS_PER_SEC,
)
from megatron.trace.otlp.reader import read_spans
from megatron.training.training_log import parse_log_iteration_ms, parse_log_losses

pytestmark = pytest.mark.slow

SAVE_INTERVAL = 3
TRAIN_ITERS = 9


def _args(cli, *extra: str) -> tuple[str, ...]:
    return (
        *cli.TINY,
        *cli.TELEMETRY_ON,
        "--train-iters", str(TRAIN_ITERS),
        "--save-interval", str(SAVE_INTERVAL),
        "--save", "ckpt",
        *extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def reference_run(training_module_cli):
    """An uninterrupted run: 9 iterations, a checkpoint and an evaluation every 3."""
    cli = training_module_cli
    now = time.time()
    launcher = {
        "MEGATRON_LAUNCH_SCRIPT_START": str(now - 2.0),
        "MEGATRON_LAUNCH_SCRIPT_PRESRUN": str(now - 1.0),
        "SLURM_JOB_START_TIME": "yesterday",  # unusable: ignored with a warning
    }
    result = cli.run(*_args(cli, "--eval-interval", "3", "--eval-iters", "2"), env=launcher)
    assert result.returncode == 0, result.stderr
    return result, cli.cwd / "ckpt"


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory, training_module_cli):
    """The same job stopped by --exit-interval 6, then resumed with --load."""
    cli = type(training_module_cli)(tmp_path_factory.mktemp("resumed"))
    first = cli.run(*_args(cli, "--exit-interval", "6"))
    second = cli.run(*_args(cli, "--load", "ckpt"))
    return first, second, cli.cwd / "ckpt"


def _iterations(spans):
    return sorted(
        s["attributes"]["megatron.iteration"]
        for s in spans
        if s["name"] == "megatron.train.iteration"
    )


def test_startup_trace_holds_the_measured_startup_phases(reference_run):
    _, ckpt = reference_run
    spans = read_spans(ckpt / "telemetry" / "traces.jsonl")
    (run,) = incarnations(spans)
    startup = run["startup"]
    assert startup["parent_id"] is None
    assert startup["attributes"]["megatron.model_type"] == "GPT"
    children = {s["name"] for s in spans if s["parent_id"] == startup["span_id"]}
    assert {
        "megatron.startup.launch_script",
        "megatron.startup.container_load",
        "megatron.startup.imports",
        "megatron.startup.arg_parse",
        "megatron.startup.initialize_megatron",
        "megatron.startup.model_init",
        "megatron.startup.dataloader",
    } <= children
    for span in spans:
        if span["parent_id"] == startup["span_id"]:
            assert span["trace_id"] == startup["trace_id"]
            assert startup["start_ns"] <= span["start_ns"] <= span["end_ns"] <= startup["end_ns"]
    assert not [s for s in spans if s["name"] == "pre_startup"]  # the queue time is unknown


def test_a_bad_launcher_timestamp_is_only_a_warning(reference_run):
    result, _ = reference_run
    assert "SLURM_JOB_START_TIME='yesterday'" in result.stderr


def test_one_linked_trace_per_checkpoint_interval(reference_run):
    _, ckpt = reference_run
    spans = read_spans(ckpt / "telemetry" / "traces.jsonl")
    (run,) = incarnations(spans)
    startup, intervals = run["startup"], run["intervals"]
    assert len(intervals) == TRAIN_ITERS // SAVE_INTERVAL
    assert [c["attributes"]["megatron.interval.index"] for c in intervals] == [0, 1, 2]
    # Each interval is a root in a trace of its own, chained by links.
    assert len({c["trace_id"] for c in intervals} | {startup["trace_id"]}) == 4
    assert all(c["parent_id"] is None for c in intervals)
    assert intervals[0]["links"] == [(startup["trace_id"], startup["span_id"])]
    for previous, interval in itertools.pairwise(intervals):
        assert interval["links"] == [(previous["trace_id"], previous["span_id"])]
        assert previous["end_ns"] <= interval["start_ns"]


def test_iterations_saves_and_evaluations_nest_under_their_interval(reference_run):
    _, ckpt = reference_run
    spans = read_spans(ckpt / "telemetry" / "traces.jsonl")
    (run,) = incarnations(spans)
    intervals = run["intervals"]
    assert _iterations(spans) == list(range(TRAIN_ITERS))
    for span in spans:
        if span["name"] == "megatron.train.iteration":
            interval = intervals[span["attributes"]["megatron.iteration"] // SAVE_INTERVAL]
            assert (span["trace_id"], span["parent_id"]) == (
                interval["trace_id"],
                interval["span_id"],
            )
    # Forward/backward and the optimizer step nest under their iteration (the
    # first one through megatron.train.first_iteration).
    for name in ("megatron.train.forward_backward", "megatron.train.optimizer"):
        found = [s for s in spans if s["name"] == name]
        assert len(found) == TRAIN_ITERS
        assert all("megatron.train.iteration" in ancestor_names(s, spans) for s in found)
    # The save (and the evaluation) after iteration 3k close interval k-1.
    for name in ("megatron.checkpoint.save", "megatron.evaluate"):
        found = [s for s in spans if s["name"] == name]
        assert [s["attributes"]["megatron.iteration"] for s in found] == [3, 6, 9]
        for span, interval in zip(found, intervals, strict=True):
            assert (span["trace_id"], span["parent_id"]) == (
                interval["trace_id"],
                interval["span_id"],
            )
    steps = [s for s in spans if s["name"] == "megatron.evaluate.step"]
    assert len(steps) == 3 * 2
    assert all(
        ancestor_names(s, spans)[:2] == ["megatron.evaluate", "megatron.train"] for s in steps
    )
    (first,) = [s for s in spans if s["name"] == "megatron.train.first_iteration"]
    assert ancestor_names(first, spans) == ["megatron.train.iteration", "megatron.train"]
    # ...and it is the parent of that iteration's work, as megatron/training/README.md draws it
    under_first = {s["name"] for s in spans if s["parent_id"] == first["span_id"]}
    assert under_first == {"megatron.train.forward_backward", "megatron.train.optimizer"}


# The spans Megatron-LM marks is_goodput_span (training.py, checkpointing.py) that
# this job emits too: every structural span of the lifecycle and each call site's.
GOODPUT_SPANS = {
    "megatron.startup",
    "megatron.startup.launch_script",
    "megatron.startup.container_load",
    "megatron.startup.imports",
    "megatron.startup.arg_parse",
    "megatron.startup.initialize_megatron",
    "megatron.startup.model_init",
    "megatron.startup.dataloader",
    "megatron.train",
    "megatron.train.iteration",
    "megatron.train.first_iteration",
    "megatron.checkpoint.save",
    "megatron.checkpoint.load",
}


def test_is_goodput_span_is_on_the_spans_megatron_lm_marks(reference_run, resumed_run):
    spans = read_spans(reference_run[1] / "telemetry" / "traces.jsonl")
    spans += read_spans(resumed_run[2] / "telemetry" / "traces.jsonl")  # with a load
    marked = {s["name"] for s in spans if s["attributes"].get("is_goodput_span") is True}
    unmarked = {s["name"] for s in spans} - marked
    assert marked == GOODPUT_SPANS
    assert not any(s["name"] in unmarked for s in spans if s["name"] in GOODPUT_SPANS)
    assert unmarked >= {"megatron.evaluate", "megatron.train.forward_backward"}


def test_per_step_groups_record_no_microbatch_or_layer_span(reference_run):
    spans = read_spans(reference_run[1] / "telemetry" / "traces.jsonl")
    assert not [
        s for s in spans if s["name"].startswith(("megatron.layer.", "megatron.microbatch."))
    ]


@pytest.mark.parametrize("groups", ["all", "profiling", "per_step,microbatch,layer"])
def test_all_groups_add_megatron_lm_s_microbatch_and_layer_spans(training_cli, groups):
    cli = training_cli
    result = cli.run(
        *cli.TINY, "--global-batch-size", "4",  # two micro-batches an iteration
        "--train-iters", "2", "--otel-enabled", "--otel-span-groups", groups,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    spans = read_spans(cli.cwd / "telemetry" / "traces.jsonl")
    by_id = {s["span_id"]: s for s in spans}

    def named(name):
        return [s for s in spans if s["name"] == name]

    def parent(span):
        return by_id[span["parent_id"]]["name"]

    forwards, backwards = (
        named("megatron.microbatch.forward"),
        named("megatron.microbatch.backward"),
    )
    assert len(forwards) == len(backwards) == 2 * 2
    assert {parent(s) for s in forwards + backwards} == {"megatron.train.forward_backward"}
    layers = named("megatron.layer.forward")
    assert len(layers) == 2 * len(forwards)  # --num-layers 2, in every micro-batch's forward
    assert {parent(s) for s in layers} == {"megatron.microbatch.forward"}
    numbers = sorted(s["attributes"]["megatron.layer_number"] for s in layers)
    assert numbers == [1] * 4 + [2] * 4  # 1-based, as Megatron-LM numbers layers
    for name in ("megatron.layer.self_attention", "megatron.layer.mlp"):
        found = named(name)
        assert len(found) == len(layers) and {parent(s) for s in found} == {
            "megatron.layer.forward"
        }
    for layer in layers:  # attention, then the MLP, inside their layer
        (attention,) = [
            s for s in named("megatron.layer.self_attention") if s["parent_id"] == layer["span_id"]
        ]
        (mlp,) = [s for s in named("megatron.layer.mlp") if s["parent_id"] == layer["span_id"]]
        assert layer["start_ns"] <= attention["start_ns"] <= attention["end_ns"] <= mlp["start_ns"]
        assert mlp["end_ns"] <= layer["end_ns"]


def test_checkpoints_and_metrics_are_written(reference_run):
    result, ckpt = reference_run
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "9"
    assert sorted(p.name for p in ckpt.glob("iter_*")) == [
        "iter_0000003",
        "iter_0000006",
        "iter_0000009",
    ]
    names = set()
    for line in (ckpt / "telemetry" / "metrics.jsonl").read_text().splitlines():
        for resource in json.loads(line)["resourceMetrics"]:
            for scope in resource["scopeMetrics"]:
                names.update(metric["name"] for metric in scope["metrics"])
    assert {
        MEGATRON_TRAINING_LOSS,
        MEGATRON_TRAINING_GRAD_NORM,
        MEGATRON_TRAINING_LEARNING_RATE,
        MEGATRON_TRAINING_STEP_DURATION_MS,
        MEGATRON_TRAINING_TOKENS_PER_SEC,
    } <= names
    # The end-of-run summary, from the exporting rank.
    assert "telemetry written to ckpt/telemetry/traces.jsonl" in result.stdout
    assert "intervals (megatron.train): 3" in result.stdout
    losses = parse_log_losses(result.stdout)
    assert sorted(losses) == list(range(1, TRAIN_ITERS + 1))
    assert all(math.isfinite(loss) for loss in losses.values())
    # The benchmark reads iteration times back from the same lines.
    iteration_ms = parse_log_iteration_ms(result.stdout)
    assert sorted(iteration_ms) == sorted(losses)
    assert all(ms > 0 for ms in iteration_ms.values())


def test_exit_interval_exits_zero_with_a_complete_trace(resumed_run):
    first, _, ckpt = resumed_run
    assert first.returncode == 0, first.stderr
    assert "exiting program at iteration 6" in first.stdout
    assert (ckpt / "iter_0000006").is_dir()
    spans = read_spans(ckpt / "telemetry" / "traces.jsonl")
    run = incarnations(spans)[0]
    assert run["startup"] is not None
    assert [c["attributes"]["megatron.interval.index"] for c in run["intervals"]] == [0, 1]
    first_run_traces = {run["startup"]["trace_id"]} | {c["trace_id"] for c in run["intervals"]}
    mine = [s for s in spans if s["trace_id"] in first_run_traces]
    assert _iterations(mine) == list(range(6))
    assert not [s for s in mine if s["attributes"].get("megatron.span.cut_short")]


def test_resume_appends_a_second_incarnation_that_continues(resumed_run, reference_run):
    first, second, ckpt = resumed_run
    assert second.returncode == 0, second.stderr
    assert "loaded checkpoint from ckpt at iteration 6" in second.stdout
    spans = read_spans(ckpt / "telemetry" / "traces.jsonl")
    runs = incarnations(spans)
    assert [r["startup"] is not None for r in runs] == [True, True]
    assert [len(r["intervals"]) for r in runs] == [2, 1]
    resumed = runs[1]
    load = [s for s in spans if s["name"] == "megatron.checkpoint.load"]
    assert len(load) == 1 and load[0]["trace_id"] == resumed["startup"]["trace_id"]
    assert load[0]["attributes"]["megatron.iteration"] == 6
    interval = resumed["intervals"][0]
    assert interval["attributes"]["megatron.interval.index"] == 0
    resumed_iterations = [s for s in spans if s["trace_id"] == interval["trace_id"]]
    assert _iterations(resumed_iterations) == [6, 7, 8]
    # Data, model, optimizer, schedule and RNG all resume exactly: the losses
    # are those of the uninterrupted run.
    expected = parse_log_losses(reference_run[0].stdout)
    got = {**parse_log_losses(first.stdout), **parse_log_losses(second.stdout)}
    assert sorted(got) == list(range(1, TRAIN_ITERS + 1))
    assert got == pytest.approx(expected, rel=1e-5)


TELEMETRY_OFF_SCRIPT = """
import json, os, signal, sys, threading
from megatron.training.training import pretrain

before = (repr(signal.getsignal(signal.SIGTERM)), threading.active_count())
result = pretrain(sys.argv[1:])
after = (repr(signal.getsignal(signal.SIGTERM)), threading.active_count())
print(json.dumps({
    "before": before, "after": after, "losses": result.losses,
    "trace_file": str(result.trace_file), "files": sorted(os.listdir(".")),
}))
"""


def test_telemetry_off_changes_nothing_but_trains_the_same(training_cli, reference_run):
    cli = training_cli
    args = (*cli.TINY, "--train-iters", str(TRAIN_ITERS), "--save-interval", str(SAVE_INTERVAL))
    result = cli.run(*args, module=("-c", TELEMETRY_OFF_SCRIPT))  # args become sys.argv[1:]
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["before"] == report["after"]
    assert report["after"][0] == "<Handlers.SIG_DFL: 0>"
    assert report["after"][1] == 1
    assert report["trace_file"] == "None"
    assert report["files"] == []  # no telemetry directory, no checkpoint
    assert "telemetry written" not in result.stdout
    expected = parse_log_losses(reference_run[0].stdout)
    # The same losses as the telemetry-on run (which logged them to 7 digits).
    assert dict(report["losses"]) == pytest.approx(expected, rel=1e-6)


def test_exit_duration_stops_after_the_budget(training_cli):
    cli = training_cli
    result = cli.run(*cli.TINY, "--train-iters", "50", "--exit-duration-in-mins", "0.0001")
    assert result.returncode == 0, result.stderr
    assert "exiting program at iteration 1: ran" in result.stdout
    assert sorted(parse_log_losses(result.stdout)) == [1]


def test_data_path_trains_on_the_bytes_of_a_file(training_cli):
    cli = training_cli
    (cli.cwd / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog. " * 50)
    result = cli.run(
        *[a for a in cli.TINY if a != "--mock-data"],
        "--data-path",
        "corpus.txt",
        "--train-iters",
        "3",
    )
    assert result.returncode == 0, result.stderr
    assert sorted(parse_log_losses(result.stdout)) == [1, 2, 3]


def test_demo_starts_from_an_empty_directory_and_prints_a_summary(training_cli):
    cli = training_cli
    stale = cli.cwd / "runs" / "demo" / "latest_checkpointed_iteration.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("12345\n")
    result = cli.run(
        "--demo",
        *cli.TINY[1:],
        "--train-iters",
        "2",
        "--save-interval",
        "2",
        "--eval-interval",
        "2",
    )
    assert result.returncode == 0, result.stderr
    assert stale.read_text() == "2\n"  # a fresh run, not a resume of the stale tracker
    assert "telemetry written to runs/demo/telemetry/traces.jsonl" in result.stdout
    assert "runs (pretrain calls): 1" in result.stdout
    spans = read_spans(cli.cwd / "runs" / "demo" / "telemetry" / "traces.jsonl")
    assert len(incarnations(spans)) == 1
    assert any(s["name"] == "megatron.train.iteration" for s in spans)  # per_step groups
