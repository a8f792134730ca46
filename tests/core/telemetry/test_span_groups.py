from __future__ import annotations

from types import MappingProxyType

import pytest

from megatron.core.telemetry.span_groups import MegatronSpanGroup, SpanGroup

FINE_GRAINED = {"microbatch", "layer", "activation_offload", "trace_region"}


@pytest.mark.parametrize("cls", [SpanGroup, MegatronSpanGroup])
def test_presets_nest(cls: type[SpanGroup]) -> None:
    default = cls.resolve("default")
    per_step = cls.resolve("per_step")
    everything = cls.resolve("all")
    assert default < per_step <= everything
    assert everything == cls.ALL_GROUPS == cls.resolve("profiling")


def test_base_groups() -> None:
    assert {
        "job",
        "checkpoint",
        "evaluate",
        "model_init",
        "load_checkpoint",
        "step",
        "forward_backward",
        "optimizer",
    } == SpanGroup.ALL_GROUPS
    assert SpanGroup.resolve("default") == {"job", "checkpoint", "evaluate"}
    assert SpanGroup.resolve("per_step") == SpanGroup.ALL_GROUPS


def test_megatron_groups_and_presets() -> None:
    added = MegatronSpanGroup.ALL_GROUPS - SpanGroup.ALL_GROUPS
    assert added == FINE_GRAINED | {
        "communication",
        "data_loading",
        "first_iteration",
        "inference",
    }
    assert MegatronSpanGroup.resolve("default") == {
        "job",
        "checkpoint",
        "evaluate",
        "first_iteration",
        "inference",
    }
    assert MegatronSpanGroup.resolve("per_step") == MegatronSpanGroup.resolve("default") | {
        "model_init",
        "load_checkpoint",
        "step",
        "forward_backward",
        "optimizer",
        "communication",
        "data_loading",
    }


def test_megatron_presets_are_their_own_object() -> None:
    assert MegatronSpanGroup.PRESETS is not SpanGroup.PRESETS
    # and resolving through the base class does not see Megatron's groups
    assert "microbatch" not in SpanGroup.resolve("all")


@pytest.mark.parametrize("group", sorted(FINE_GRAINED))
def test_fine_grained_groups_only_in_all(group: str) -> None:
    presets = MegatronSpanGroup.PRESETS
    assert group in presets["all"]
    assert group in presets["profiling"]
    assert group not in presets["per_step"]
    assert group not in presets["default"]


def test_resolve_mixes_presets_and_groups() -> None:
    resolved = MegatronSpanGroup.resolve("default,microbatch")
    assert resolved == MegatronSpanGroup.resolve("default") | {"microbatch"}
    assert MegatronSpanGroup.resolve(" Step , LAYER,,") == {"step", "layer"}


@pytest.mark.parametrize("spec", ["default,bogus", "bogus"])
def test_resolve_unknown_token_names_it_and_the_valid_names(spec: str) -> None:
    with pytest.raises(ValueError) as info:
        MegatronSpanGroup.resolve(spec)
    message = str(info.value)
    assert "'bogus'" in message
    assert "valid presets: all, default, per_step, profiling" in message
    assert "microbatch" in message and "job" in message


def test_resolve_base_rejects_megatron_only_group() -> None:
    with pytest.raises(ValueError, match="'microbatch'"):
        SpanGroup.resolve("microbatch")


@pytest.mark.parametrize("spec", ["", " , "])
def test_resolve_empty_spec(spec: str) -> None:
    with pytest.raises(ValueError, match="empty span-group spec"):
        MegatronSpanGroup.resolve(spec)


def test_presets_keep_megatron_lms_name_beside_the_public_one() -> None:
    """Megatron-LM's code and tests say ``_PRESETS``; ``PRESETS`` is the same table."""
    for cls in (SpanGroup, MegatronSpanGroup):
        assert cls.PRESETS is cls._PRESETS
    assert MegatronSpanGroup._PRESETS is not SpanGroup._PRESETS


def test_a_subclass_overriding_presets_by_megatron_lms_name_is_resolved_through_it() -> None:
    class Narrow(MegatronSpanGroup):
        _PRESETS = MappingProxyType({"default": frozenset({MegatronSpanGroup.JOB})})

    assert Narrow.resolve("default") == frozenset({"job"})
    with pytest.raises(ValueError, match="unknown span group 'per_step'; valid presets: default;"):
        Narrow.resolve("per_step")
