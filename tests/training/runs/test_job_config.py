"""The typed job config ``parse_args`` returns: every flag in one section, frozen, built once."""

from __future__ import annotations

import dataclasses
import json

import pytest

from megatron.core.telemetry import TelemetryConfig
from megatron.training.arguments import build_parser, parse_args
from megatron.training.job_config import FLAG_SECTIONS, JobConfig, derived_fields

TELEMETRY_FLAGS = {
    "otel_enabled",
    "otel_span_groups",
    "otel_service_name",
    "otel_exporter",
    "otel_trace_file",
}


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("WORLD_SIZE", "MEGATRON_OTEL_RUN_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)


def test_every_flag_lands_in_exactly_one_section_and_every_other_field_says_why():
    dests = set(vars(build_parser().parse_args([])))  # every flag's, at its default
    from_flags: list[str] = []
    for section in FLAG_SECTIONS.values():
        reasons = derived_fields(section)
        assert all(reason.strip() for reason in reasons.values()), section
        from_flags += [f.name for f in dataclasses.fields(section) if f.name not in reasons]
    assert len(from_flags) == len(set(from_flags)), "a flag in two sections"
    assert {*from_flags, *TELEMETRY_FLAGS, "demo"} == dests
    # Every derived field is one no flag sets (Megatron-LM's names stay flags' names).
    for section in FLAG_SECTIONS.values():
        assert not set(derived_fields(section)) & dests
    sections = {f.name for f in dataclasses.fields(JobConfig)}
    assert sections == {*FLAG_SECTIONS, "telemetry", "demo"}


def test_the_job_config_cannot_be_changed_after_parsing(clean_env):
    config = parse_args(["--mock-data", "--train-iters", "5"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.training.train_iters = 6  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.checkpoint = config.checkpoint  # type: ignore[misc]
    assert config.training.train_iters == 5


def test_derived_fields_come_from_the_flags_and_the_world_size(clean_env, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = ["--mock-data", "--micro-batch-size", "2", "--train-iters", "30"]
    config = parse_args([*argv, "--global-batch-size", "8"])
    assert config.training.data_parallel_size == 2
    assert config.training.global_batch_size == 8
    assert config.training.num_microbatches == 2  # 8 / (2 x 2)
    assert config.optimizer.lr_decay_iters == 30
    assert not config.checkpoint.fresh_save_dir
    default = parse_args(argv)
    assert default.training.global_batch_size == 4 and default.training.num_microbatches == 1


def test_save_interval_unset_and_0_both_mean_no_periodic_saves(clean_env, tmp_path):
    for extra in ([], ["--save-interval", "0"]):
        checkpoint = parse_args(["--mock-data", "--save", str(tmp_path), *extra]).checkpoint
        assert checkpoint.interval == 0
        assert not any(checkpoint.is_save_iteration(i) for i in range(1, 20))
    checkpoint = parse_args(["--mock-data", "--save-interval", "5"]).checkpoint
    assert not checkpoint.is_save_iteration(5)  # no --save: nothing written...
    assert checkpoint.interval == 5  # ...but the trace is still cut there
    checkpoint = parse_args(["--mock-data", "--save", str(tmp_path), "--save-interval", "5"])
    assert [i for i in range(1, 16) if checkpoint.checkpoint.is_save_iteration(i)] == [5, 10, 15]


def test_the_parser_builds_the_telemetry_config_once(clean_env, monkeypatch):
    calls = []
    real = TelemetryConfig.from_args.__func__

    def counting(cls, args, env=None):
        calls.append(args)
        return real(cls, args, env)

    monkeypatch.setattr(TelemetryConfig, "from_args", classmethod(counting))
    config = parse_args(["--mock-data", "--otel-enabled", "--otel-service-name", "svc"])
    assert len(calls) == 1
    assert config.telemetry.enabled and config.telemetry.service_name == "svc"


ONE_RUN_ID = """
import json, sys
from megatron.core.telemetry import TelemetryConfig
from megatron.training.arguments import parse_args
from megatron.training.training import pretrain

config = parse_args(sys.argv[1:])

def again(*args, **kwargs):
    raise AssertionError("the telemetry config was built a second time")

TelemetryConfig.from_args = again
pretrain(config)
print("RUN_ID", json.dumps(config.telemetry.run_id))
"""


@pytest.mark.slow
def test_the_run_exports_under_the_run_id_the_parser_chose(training_cli):
    cli = training_cli
    argv = [*cli.TINY, "--train-iters", "2", "--otel-enabled", "--otel-trace-file", "t.jsonl"]
    result = cli.run(*argv, module=("-c", ONE_RUN_ID))
    assert result.returncode == 0, result.stderr
    run_id = json.loads(result.stdout.split("RUN_ID ", 1)[1])
    ids = set()
    for line in (cli.cwd / "t.jsonl").read_text().splitlines():
        for resource_spans in json.loads(line).get("resourceSpans", []):
            for attribute in resource_spans["resource"]["attributes"]:
                if attribute["key"] == "megatron.run_id":
                    ids.add(attribute["value"]["stringValue"])
    assert ids == {run_id}
