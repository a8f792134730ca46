"""Megatron-LM's observability settings: the lens-derived variables, fallbacks, run id.

Megatron-LM documents each ``MEGATRON_OTEL_*`` variable as an alias of a
nemo-lens configuration field with ``NEMO_LENS_*`` as fallback; these tests
pin that precedence (flag, ``MEGATRON_OTEL_*``, ``NEMO_LENS_*``, default) for
every variable, and the validation of the new ones.
"""

from __future__ import annotations

import argparse
import logging
import re
from typing import Any

import pytest

from megatron.core.telemetry import TelemetryConfig, TelemetryConfigError, add_telemetry_args
from megatron.core.telemetry.config import KNOWN_VARIABLES, env_names, unknown_variables


def parse(*argv: str) -> argparse.Namespace:
    return add_telemetry_args(argparse.ArgumentParser()).parse_args(list(argv))


def message(env: dict[str, str]) -> str:
    with pytest.raises(TelemetryConfigError) as exc:
        TelemetryConfig.from_env(env)
    return str(exc.value)


def test_defaults_follow_megatron_lm() -> None:
    config = TelemetryConfig.from_env({})
    assert config.export_sample_rate == 1.0
    assert config.sampling_strategy == ""
    assert (config.traces_enabled, config.metrics_enabled, config.logs_enabled) == (
        True,
        True,
        False,
    )


# (field, MEGATRON_OTEL_ suffix, Megatron value, lens value, expected from each)
FALLBACKS: list[tuple[str, str, str, str, Any, Any]] = [
    ("enabled", "ENABLED", "0", "1", False, True),
    ("span_groups_spec", "SPAN_GROUPS", "all", "per_step", "all", "per_step"),
    ("exporter", "EXPORTER", "none", "console", "none", "console"),
    ("rank_strategy", "RANK_STRATEGY", "all_ranks", "sampled", "all_ranks", "sampled"),
    ("export_rank", "EXPORT_RANK", "2", "0", 2, 0),
    ("export_sample_rate", "EXPORT_SAMPLE_RATE", "0.25", "0.5", 0.25, 0.5),
    ("sampling_strategy", "SAMPLING_STRATEGY", "rank_aware", "rank_aware", "rank_aware",
     "rank_aware"),
    ("traces_enabled", "TRACES_ENABLED", "on", "off", True, False),
    ("metrics_enabled", "METRICS_ENABLED", "yes", "no", True, False),
    ("logs_enabled", "LOGS_ENABLED", "false", "true", False, True),
    ("run_id", "RUN_ID", "megatron-id", "lens-id", "megatron-id", "lens-id"),
    ("hang_timeout_s", "HANG_TIMEOUT", "30", "0", 30.0, 0.0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("field", "suffix", "megatron", "lens", "from_megatron", "from_lens"), FALLBACKS
)
def test_megatron_variable_then_nemo_lens_variable(
    field: str, suffix: str, megatron: str, lens: str, from_megatron: Any, from_lens: Any
) -> None:
    both = {f"MEGATRON_OTEL_{suffix}": megatron, f"NEMO_LENS_{suffix}": lens}
    assert getattr(TelemetryConfig.from_env(both), field) == from_megatron
    lens_only = {f"MEGATRON_OTEL_{suffix}": "  ", f"NEMO_LENS_{suffix}": lens}  # empty = unset
    assert getattr(TelemetryConfig.from_env(lens_only), field) == from_lens


def test_flags_win_over_both_prefixes() -> None:
    env = {
        "MEGATRON_OTEL_ENABLED": "1",
        "NEMO_LENS_ENABLED": "1",
        "NEMO_LENS_SPAN_GROUPS": "all",
        "NEMO_LENS_EXPORTER": "console",
    }
    config = TelemetryConfig.from_args(
        parse("--no-otel-enabled", "--otel-span-groups", "per_step", "--otel-exporter", "none"),
        env=env,
    )
    assert (config.enabled, config.span_groups_spec, config.exporter) == (
        False,
        "per_step",
        "none",
    )
    # And a flag-less run takes the lens values.
    config = TelemetryConfig.from_args(parse(), env=env)
    assert (config.enabled, config.span_groups_spec, config.exporter) == (True, "all", "console")


def test_lens_spelling_of_the_rank_strategy() -> None:
    # Lens calls the field export_strategy; its variable is read after the prefix swap.
    assert TelemetryConfig.from_env({"NEMO_LENS_EXPORT_STRATEGY": "sampled"}).rank_strategy == (
        "sampled"
    )
    env = {"NEMO_LENS_RANK_STRATEGY": "all_ranks", "NEMO_LENS_EXPORT_STRATEGY": "sampled"}
    assert TelemetryConfig.from_env(env).rank_strategy == "all_ranks"
    env["MEGATRON_OTEL_RANK_STRATEGY"] = "first_rank_per_node"
    assert TelemetryConfig.from_env(env).rank_strategy == "first_rank_per_node"


def test_lens_sampler_switch_means_rank_aware() -> None:
    assert TelemetryConfig.from_env({"NEMO_LENS_SAMPLER_ENABLED": "1"}).sampling_strategy == (
        "rank_aware"
    )
    assert TelemetryConfig.from_env({"NEMO_LENS_SAMPLER_ENABLED": "0"}).sampling_strategy == ""
    # An explicit (even empty-valued override) strategy wins over the switch.
    config = TelemetryConfig.from_env({"NEMO_LENS_SAMPLER_ENABLED": "1"}, sampling_strategy="")
    assert config.sampling_strategy == ""
    assert message({"NEMO_LENS_SAMPLER_ENABLED": "sometimes"}).startswith(
        "NEMO_LENS_SAMPLER_ENABLED='sometimes' is not valid; expected a boolean"
    )


def test_run_id_precedence() -> None:
    env = {
        "MEGATRON_OTEL_RUN_ID": "megatron",
        "NEMO_LENS_RUN_ID": "lens",
        "SLURM_JOB_ID": "4242",
        "TORCHELASTIC_RUN_ID": "rdzv",
    }
    expected = ["megatron", "lens", "4242", "rdzv"]
    for name, want in zip(list(env), expected, strict=True):
        assert TelemetryConfig.from_env(env).run_id == want
        del env[name]
    generated = {TelemetryConfig.from_env({}).run_id for _ in range(3)}
    assert len(generated) == 3
    assert all(re.fullmatch(r"[0-9a-f]{12}", run_id) for run_id in generated)


@pytest.mark.parametrize("value", ["2", "-0.1", "nan", "lots", "inf"])
def test_bad_sample_rate(value: str) -> None:
    assert message({"MEGATRON_OTEL_EXPORT_SAMPLE_RATE": value}) == (
        f"MEGATRON_OTEL_EXPORT_SAMPLE_RATE={value!r} is not valid; "
        "expected a fraction of ranks from 0.0 to 1.0"
    )


def test_bad_value_from_the_fallback_names_the_fallback() -> None:
    assert message({"NEMO_LENS_EXPORT_SAMPLE_RATE": "1.5"}).startswith(
        "NEMO_LENS_EXPORT_SAMPLE_RATE='1.5' is not valid"
    )
    assert message({"NEMO_LENS_EXPORT_STRATEGY": "every_other"}).startswith(
        "NEMO_LENS_EXPORT_STRATEGY='every_other' is not valid"
    )


def test_bad_sampling_strategy() -> None:
    assert message({"MEGATRON_OTEL_SAMPLING_STRATEGY": "random"}) == (
        "MEGATRON_OTEL_SAMPLING_STRATEGY='random' is not valid; "
        "expected one of: '' (empty), rank_aware"
    )


@pytest.mark.parametrize("suffix", ["TRACES_ENABLED", "METRICS_ENABLED", "LOGS_ENABLED"])
def test_bad_signal_switch(suffix: str) -> None:
    assert message({f"MEGATRON_OTEL_{suffix}": "maybe"}) == (
        f"MEGATRON_OTEL_{suffix}='maybe' is not valid; "
        "expected a boolean (1/0, true/false, yes/no, on/off)"
    )


def test_direct_construction_checks_the_new_fields() -> None:
    with pytest.raises(TelemetryConfigError, match="export_sample_rate"):
        TelemetryConfig(export_sample_rate=1.01)
    with pytest.raises(TelemetryConfigError, match="sampling_strategy"):
        TelemetryConfig(sampling_strategy="everything")
    with pytest.raises(TelemetryConfigError, match="rank_strategy"):
        TelemetryConfig(rank_strategy="odd_ranks")


def test_megatron_lm_recipes_export_strategy() -> None:
    # Megatron-LM's recipes name the rank strategy after lens's field.
    env = {"MEGATRON_OTEL_EXPORT_STRATEGY": "all_ranks"}
    assert TelemetryConfig.from_env(env).rank_strategy == "all_ranks"
    # Every MEGATRON_OTEL_* spelling wins over every lens one ...
    env.update({"NEMO_LENS_RANK_STRATEGY": "sampled", "NEMO_LENS_EXPORT_STRATEGY": "sampled"})
    assert TelemetryConfig.from_env(env).rank_strategy == "all_ranks"
    # ... and the project's own name wins over the recipes' one.
    env["MEGATRON_OTEL_RANK_STRATEGY"] = "first_rank_per_node"
    assert TelemetryConfig.from_env(env).rank_strategy == "first_rank_per_node"
    assert env_names("MEGATRON_OTEL_RANK_STRATEGY") == (
        "MEGATRON_OTEL_RANK_STRATEGY",
        "MEGATRON_OTEL_EXPORT_STRATEGY",
        "NEMO_LENS_RANK_STRATEGY",
        "NEMO_LENS_EXPORT_STRATEGY",
    )
    assert message({"MEGATRON_OTEL_EXPORT_STRATEGY": "most"}).startswith(
        "MEGATRON_OTEL_EXPORT_STRATEGY='most' is not valid"
    )


def test_unknown_variable_is_one_warning_naming_the_nearest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {
        "MEGATRON_OTEL_RANK_STRATGY": "all_ranks",
        "MEGATRON_OTEL_ZZZ": "1",
        "MEGATRON_OTEL_ENABLED": "1",
        "NEMO_LENS_WHATEVER": "1",
    }
    with caplog.at_level(logging.WARNING, logger="megatron.core.telemetry.config"):
        config = TelemetryConfig.from_env(env)
    assert config.enabled and config.rank_strategy == "single_rank"  # the typo is ignored
    assert [record.getMessage() for record in caplog.records] == [
        "MEGATRON_OTEL_RANK_STRATGY is not a telemetry setting and is ignored; "
        "did you mean MEGATRON_OTEL_RANK_STRATEGY?",
        "MEGATRON_OTEL_ZZZ is not a telemetry setting and is ignored; "
        "see megatron/core/telemetry/README.md",
    ]


def test_every_variable_the_config_reads_is_known() -> None:
    import megatron.core.telemetry.config as config_module

    read = {
        value
        for name, value in vars(config_module).items()
        if name.startswith("ENV_") and value.startswith("MEGATRON_OTEL_")
    }
    assert read == set(KNOWN_VARIABLES)
    assert unknown_variables({name: "1" for name in read}) == []
