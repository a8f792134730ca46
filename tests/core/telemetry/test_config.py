from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from megatron.core.telemetry import TelemetryConfig, TelemetryConfigError, add_telemetry_args
from megatron.core.telemetry.span_groups import MegatronSpanGroup


def parse(*argv: str) -> argparse.Namespace:
    return add_telemetry_args(argparse.ArgumentParser()).parse_args(list(argv))


def test_flags_default_to_none_so_absence_is_visible() -> None:
    args = parse()
    for name in (
        "otel_enabled",
        "otel_span_groups",
        "otel_service_name",
        "otel_exporter",
        "otel_trace_file",
    ):
        assert getattr(args, name) is None
    assert parse("--otel-enabled").otel_enabled is True
    assert parse("--no-otel-enabled").otel_enabled is False


def test_flags_live_in_a_telemetry_group() -> None:
    parser = add_telemetry_args(argparse.ArgumentParser())
    (group,) = [g for g in parser._action_groups if g.title == "telemetry"]
    flags = {opt for action in group._group_actions for opt in action.option_strings}
    assert {"--otel-enabled", "--otel-span-groups", "--otel-exporter"} <= flags


def test_defaults() -> None:
    config = TelemetryConfig.from_args(parse(), env={})
    assert config.enabled is False
    assert config.span_groups_spec == "default"
    assert config.span_groups == MegatronSpanGroup.resolve("default")
    assert config.service_name == "megatron"
    assert config.exporter == "jsonl"
    assert config.trace_file == Path("telemetry/traces.jsonl")
    assert config.rank_strategy == "single_rank"
    assert config.export_rank == -1
    assert config.run_id


# (field, flag argv, value from the flag, env var, env value, value from env, default)
PRECEDENCE: list[tuple[str, list[str], Any, str, str, Any, Any]] = [
    ("enabled", ["--no-otel-enabled"], False, "MEGATRON_OTEL_ENABLED", "yes", True, False),
    ("span_groups_spec", ["--otel-span-groups", "all"], "all",
     "MEGATRON_OTEL_SPAN_GROUPS", "per_step", "per_step", "default"),
    ("service_name", ["--otel-service-name", "flag-svc"], "flag-svc",
     "OTEL_SERVICE_NAME", "env-svc", "env-svc", "megatron"),
    ("exporter", ["--otel-exporter", "otlp"], "otlp",
     "MEGATRON_OTEL_EXPORTER", "console", "console", "jsonl"),
    ("trace_file", ["--otel-trace-file", "/flag/t.jsonl"], Path("/flag/t.jsonl"),
     "MEGATRON_OTEL_TRACE_FILE", "/env/t.jsonl", Path("/env/t.jsonl"),
     Path("telemetry/traces.jsonl")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("field", "argv", "flag_value", "var", "env_value", "env_expected", "default"), PRECEDENCE
)
def test_flag_over_env_over_default(
    field: str,
    argv: list[str],
    flag_value: Any,
    var: str,
    env_value: str,
    env_expected: Any,
    default: Any,
) -> None:
    env = {var: env_value}
    assert getattr(TelemetryConfig.from_args(parse(*argv), env=env), field) == flag_value
    assert getattr(TelemetryConfig.from_args(parse(), env=env), field) == env_expected
    assert getattr(TelemetryConfig.from_args(parse(), env={}), field) == default


def test_enabled_flag_beats_env_in_both_directions() -> None:
    env_off = {"MEGATRON_OTEL_ENABLED": "off"}
    assert TelemetryConfig.from_args(parse("--otel-enabled"), env=env_off).enabled is True


def test_span_groups_follow_the_spec() -> None:
    config = TelemetryConfig.from_args(parse("--otel-span-groups", "default,microbatch"), env={})
    assert config.span_groups == MegatronSpanGroup.resolve("default") | {"microbatch"}


@pytest.mark.parametrize("value", ["1", "true", "YES", "on", " On "])
def test_true_booleans(value: str) -> None:
    assert TelemetryConfig.from_env({"MEGATRON_OTEL_ENABLED": value}).enabled is True


@pytest.mark.parametrize("value", ["0", "false", "no", "OFF"])
def test_false_booleans(value: str) -> None:
    assert TelemetryConfig.from_env({"MEGATRON_OTEL_ENABLED": value}).enabled is False


def test_empty_env_value_counts_as_unset() -> None:
    config = TelemetryConfig.from_env({"MEGATRON_OTEL_EXPORTER": "", "OTEL_SERVICE_NAME": " "})
    assert config.exporter == "jsonl"
    assert config.service_name == "megatron"


def test_trace_file_follows_save() -> None:
    args = parse()
    args.save = "/ckpt/run1"
    config = TelemetryConfig.from_args(args, env={})
    assert config.trace_file == Path("/ckpt/run1/telemetry/traces.jsonl")
    # an explicit location still wins over --save
    config = TelemetryConfig.from_args(args, env={"MEGATRON_OTEL_TRACE_FILE": "/x/t.jsonl"})
    assert config.trace_file == Path("/x/t.jsonl")


def test_rank_settings_from_env_and_overrides() -> None:
    env = {"MEGATRON_OTEL_RANK_STRATEGY": "all_ranks", "MEGATRON_OTEL_EXPORT_RANK": "3"}
    config = TelemetryConfig.from_env(env)
    assert (config.rank_strategy, config.export_rank) == ("all_ranks", 3)
    config = TelemetryConfig.from_env(env, rank_strategy="single_rank", export_rank=0)
    assert (config.rank_strategy, config.export_rank) == ("single_rank", 0)
    assert TelemetryConfig.from_env({}).export_rank == -1


def test_run_id_precedence() -> None:
    env = {
        "MEGATRON_OTEL_RUN_ID": "explicit",
        "SLURM_JOB_ID": "4242",
        "TORCHELASTIC_RUN_ID": "rdzv",
    }
    assert TelemetryConfig.from_env(env).run_id == "explicit"
    del env["MEGATRON_OTEL_RUN_ID"]
    assert TelemetryConfig.from_env(env).run_id == "4242"
    del env["SLURM_JOB_ID"]
    assert TelemetryConfig.from_env(env).run_id == "rdzv"
    env["TORCHELASTIC_RUN_ID"] = "none"  # torchrun's placeholder is no identity
    generated = {TelemetryConfig.from_env(env).run_id for _ in range(3)}
    assert len(generated) == 3


def test_from_env_overrides() -> None:
    config = TelemetryConfig.from_env(
        {"MEGATRON_OTEL_EXPORTER": "console"},
        enabled=True,
        exporter="none",
        span_groups=["step", "layer"],
    )
    assert config.enabled is True
    assert config.exporter == "none"
    assert config.span_groups == {"step", "layer"}
    with pytest.raises(TypeError, match="exporterr"):
        TelemetryConfig.from_env({}, exporterr="none")


def test_config_is_frozen() -> None:
    config = TelemetryConfig.from_env({})
    with pytest.raises(AttributeError):
        config.enabled = True  # type: ignore[misc]


def message(**kwargs: Any) -> str:
    with pytest.raises(TelemetryConfigError) as info:
        if "argv" in kwargs:
            TelemetryConfig.from_args(parse(*kwargs["argv"]), env=kwargs.get("env", {}))
        else:
            TelemetryConfig.from_env(kwargs["env"])
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_unknown_exporter_via_env() -> None:
    assert message(env={"MEGATRON_OTEL_EXPORTER": "foo"}) == (
        "MEGATRON_OTEL_EXPORTER='foo' is not valid; expected one of: console, jsonl, none, otlp"
    )


def test_unknown_exporter_via_flag() -> None:
    assert message(argv=["--otel-exporter", "zipkin"], env={"MEGATRON_OTEL_EXPORTER": "otlp"}) == (
        "--otel-exporter='zipkin' is not valid; expected one of: console, jsonl, none, otlp"
    )


def test_bad_span_group_via_flag() -> None:
    text = message(argv=["--otel-span-groups", "default,bogus"])
    assert text.startswith("--otel-span-groups: unknown span group 'bogus'; ")
    assert "valid presets: all, default, per_step, profiling" in text
    assert "valid groups: activation_offload, checkpoint" in text


def test_bad_span_group_via_env() -> None:
    text = message(env={"MEGATRON_OTEL_SPAN_GROUPS": "steps"})
    assert text.startswith("MEGATRON_OTEL_SPAN_GROUPS: unknown span group 'steps'; ")


@pytest.mark.parametrize("value", ["last", "1.5", "-2"])
def test_bad_export_rank(value: str) -> None:
    assert message(env={"MEGATRON_OTEL_EXPORT_RANK": value}) == (
        f"MEGATRON_OTEL_EXPORT_RANK={value!r} is not valid; "
        "expected an integer rank >= 0, or -1 for the last rank"
    )


def test_bad_rank_strategy() -> None:
    assert message(env={"MEGATRON_OTEL_RANK_STRATEGY": "rank_zero"}) == (
        "MEGATRON_OTEL_RANK_STRATEGY='rank_zero' is not valid; "
        "expected one of: all_ranks, first_rank_per_node, sampled, single_rank"
    )


def test_bad_boolean() -> None:
    assert message(env={"MEGATRON_OTEL_ENABLED": "maybe"}) == (
        "MEGATRON_OTEL_ENABLED='maybe' is not valid; "
        "expected a boolean (1/0, true/false, yes/no, on/off)"
    )


def test_empty_service_name_flag() -> None:
    assert message(argv=["--otel-service-name", " "]) == "--otel-service-name must not be empty"


def test_direct_construction_is_validated() -> None:
    with pytest.raises(TelemetryConfigError, match="exporter='nope'"):
        TelemetryConfig(exporter="nope")
    config = TelemetryConfig(span_groups_spec="per_step")
    assert config.span_groups == MegatronSpanGroup.resolve("per_step")


def test_hang_timeout_unset_derives_zero_disables_and_seconds_are_kept() -> None:
    assert TelemetryConfig.from_env({}).hang_timeout_s is None
    assert TelemetryConfig.from_env({"MEGATRON_OTEL_HANG_TIMEOUT": "0"}).hang_timeout_s == 0.0
    assert TelemetryConfig.from_env({"MEGATRON_OTEL_HANG_TIMEOUT": " 2.5 "}).hang_timeout_s == 2.5
    assert TelemetryConfig.from_env({}, hang_timeout_s=7).hang_timeout_s == 7.0


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_bad_hang_timeout(value: str) -> None:
    assert message(env={"MEGATRON_OTEL_HANG_TIMEOUT": value}) == (
        f"MEGATRON_OTEL_HANG_TIMEOUT={value!r} is not valid; expected seconds without a "
        "finished iteration before a stall is reported (a number >= 0; 0 turns the watchdog off)"
    )
    with pytest.raises(TelemetryConfigError, match="hang_timeout_s=-3"):
        TelemetryConfig(hang_timeout_s=-3)


@pytest.mark.parametrize("value", ["", " ", ".", "..", "runs/", "runs/.", "runs/.."])
def test_a_trace_file_that_names_no_file_is_refused(value: str) -> None:
    expected = (
        f"--otel-trace-file={value!r} is not valid; expected the path of the trace file to "
        "write (e.g. telemetry/traces.jsonl; metrics.jsonl is written beside it)"
    )
    assert message(argv=["--otel-trace-file", value]) == expected
    # the variable: an empty value counts as unset (the default), any other is checked
    if value.strip():
        assert message(env={"MEGATRON_OTEL_TRACE_FILE": value}) == expected.replace(
            "--otel-trace-file", "MEGATRON_OTEL_TRACE_FILE"
        )
    else:
        assert TelemetryConfig.from_env({"MEGATRON_OTEL_TRACE_FILE": value}).trace_file == Path(
            "telemetry/traces.jsonl"
        )
