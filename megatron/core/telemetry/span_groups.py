"""Span groups: named switches that decide which spans a run records.

Every span a call site opens belongs to one group (``"step"``, ``"layer"``...).
A run enables a set of groups, usually through a preset, and ``managed_span``
checks membership before doing any OpenTelemetry work. Groups are plain
strings, not an ``Enum``, so the hot-path check is a ``frozenset`` lookup of a
``str`` and a call site reads exactly as it does upstream
(``SpanGroup.STEP``).

Presets trade detail for overhead: ``default`` records a handful of spans per
run, ``per_step`` a few per iteration, ``all`` (alias ``profiling``) adds the
per-microbatch and per-layer spans that are only affordable while profiling.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

__all__ = ["MegatronSpanGroup", "SpanGroup"]


class SpanGroup:
    """The framework-neutral span groups and their presets."""

    JOB = "job"
    CHECKPOINT = "checkpoint"
    EVALUATE = "evaluate"
    MODEL_INIT = "model_init"
    LOAD_CHECKPOINT = "load_checkpoint"
    STEP = "step"
    FORWARD_BACKWARD = "forward_backward"
    OPTIMIZER = "optimizer"

    ALL_GROUPS: ClassVar[frozenset[str]] = frozenset(
        {
            JOB,
            CHECKPOINT,
            EVALUATE,
            MODEL_INIT,
            LOAD_CHECKPOINT,
            STEP,
            FORWARD_BACKWARD,
            OPTIMIZER,
        }
    )

    #: Preset name -> the groups it enables (what :meth:`resolve` expands a preset to).
    #: Read-only so that no caller can widen a preset for the whole process.
    #: ``_PRESETS`` is Megatron-LM's name for this table (its own tests and any
    #: subclass written against it use that name, and :meth:`resolve` reads it);
    #: ``PRESETS`` is the same object under a public name.
    _PRESETS: ClassVar[Mapping[str, frozenset[str]]] = MappingProxyType(
        {
            "default": frozenset({JOB, CHECKPOINT, EVALUATE}),
            "per_step": ALL_GROUPS,
            "profiling": ALL_GROUPS,
            "all": ALL_GROUPS,
        }
    )
    PRESETS: ClassVar[Mapping[str, frozenset[str]]] = _PRESETS

    @classmethod
    def resolve(cls, spec: str) -> frozenset[str]:
        """Turn a span-group spec into the set of enabled groups.

        ``spec`` is a comma-separated mix of preset names and group names, for
        example ``"default,microbatch"``. Tokens are stripped and compared
        case-insensitively; empty tokens (``"a,,b"``) are ignored. The result
        is the union of everything named.

        Raises:
            ValueError: the spec names nothing, or a token is neither a preset
                nor a group of ``cls``. The message names the bad token and
                lists the valid presets and groups, because it is shown to a
                user who mistyped a flag.
        """
        if not isinstance(spec, str):
            raise ValueError(f"span-group spec must be a string, got {type(spec).__name__}")
        tokens = [token.strip().lower() for token in spec.split(",")]
        tokens = [token for token in tokens if token]
        if not tokens:
            raise ValueError(f"empty span-group spec {spec!r}; {cls._valid_names()}")
        groups: set[str] = set()
        for token in tokens:
            if token in cls._PRESETS:
                groups.update(cls._PRESETS[token])
            elif token in cls.ALL_GROUPS:
                groups.add(token)
            else:
                raise ValueError(f"unknown span group {token!r}; {cls._valid_names()}")
        return frozenset(groups)

    @classmethod
    def _valid_names(cls) -> str:
        presets = ", ".join(sorted(cls._PRESETS))
        groups = ", ".join(sorted(cls.ALL_GROUPS))
        return f"valid presets: {presets}; valid groups: {groups}"


class MegatronSpanGroup(SpanGroup):
    """Megatron's span groups: the base set plus the fine-grained ones.

    ``_PRESETS`` (alias ``PRESETS``) is this class's own mapping, never the
    base class's object, so resolving ``"all"`` here yields the Megatron groups
    while ``SpanGroup.resolve("all")`` keeps yielding only the base ones.
    """

    MICROBATCH = "microbatch"
    LAYER = "layer"
    COMMUNICATION = "communication"
    ACTIVATION_OFFLOAD = "activation_offload"
    DATA_LOADING = "data_loading"
    FIRST_ITERATION = "first_iteration"
    TRACE_REGION = "trace_region"
    INFERENCE = "inference"

    ALL_GROUPS: ClassVar[frozenset[str]] = SpanGroup.ALL_GROUPS | frozenset(
        {
            MICROBATCH,
            LAYER,
            COMMUNICATION,
            ACTIVATION_OFFLOAD,
            DATA_LOADING,
            FIRST_ITERATION,
            TRACE_REGION,
            INFERENCE,
        }
    )

    _DEFAULT: ClassVar[frozenset[str]] = frozenset(
        {
            SpanGroup.JOB,
            SpanGroup.CHECKPOINT,
            SpanGroup.EVALUATE,
            FIRST_ITERATION,
            INFERENCE,
        }
    )

    # microbatch, layer, activation_offload and trace_region fire many times
    # per iteration, so they are reachable only through "all"/"profiling" or
    # by naming them.
    _PRESETS: ClassVar[Mapping[str, frozenset[str]]] = MappingProxyType(
        {
            "default": _DEFAULT,
            "per_step": _DEFAULT
            | frozenset(
                {
                    SpanGroup.MODEL_INIT,
                    SpanGroup.LOAD_CHECKPOINT,
                    SpanGroup.STEP,
                    SpanGroup.FORWARD_BACKWARD,
                    SpanGroup.OPTIMIZER,
                    COMMUNICATION,
                    DATA_LOADING,
                }
            ),
            "profiling": ALL_GROUPS,
            "all": ALL_GROUPS,
        }
    )
    PRESETS: ClassVar[Mapping[str, frozenset[str]]] = _PRESETS
