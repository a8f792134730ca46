"""Rank strategies and the rank-aware sampler: which ranks export, which spans stay."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from megatron.core.telemetry import (
    TelemetryConfig,
    TelemetryConfigError,
    TelemetryHandle,
    managed_span,
    setup_telemetry,
)
from megatron.core.telemetry.sampling import is_rank_sampled, rank_exports

Make = Callable[..., TelemetryHandle]


def lens_rule(rank: int, rate: float) -> bool:
    """nemo-lens's documented rule, written out independently."""
    return (int(hashlib.md5(str(rank).encode()).hexdigest(), 16) % 10000) / 10000.0 < rate


@pytest.mark.parametrize("rate", [0.0, 0.05, 0.1, 0.5, 0.785, 0.7851, 0.9, 1.0])
def test_sampled_ranks_agree_with_lens(rate: float) -> None:
    for rank in range(2000):
        assert is_rank_sampled(rank, rate) == lens_rule(rank, rate), rank


def test_sampled_known_ranks() -> None:
    # Pinned so a change of hash cannot go unnoticed: rank 0 hashes to 0.785,
    # rank 1 to 0.8411, ranks 3..6 below 0.2.
    assert [r for r in range(8) if is_rank_sampled(r, 0.5)] == [3, 4, 5, 6]
    assert is_rank_sampled(0, 0.786) and not is_rank_sampled(0, 0.785)
    assert not is_rank_sampled(1, 0.8)


def test_sampled_fraction_tracks_the_rate_and_is_nested() -> None:
    ranks = range(10_000)
    for rate in (0.01, 0.1, 0.3):
        chosen = [r for r in ranks if is_rank_sampled(r, rate)]
        assert abs(len(chosen) / len(ranks) - rate) < 0.02
    # A higher rate keeps every rank a lower one kept.
    assert {r for r in ranks if is_rank_sampled(r, 0.1)} <= {
        r for r in ranks if is_rank_sampled(r, 0.3)
    }
    assert not any(is_rank_sampled(r, 0.0) for r in range(1000))
    assert all(is_rank_sampled(r, 1.0) for r in range(1000))


def test_rank_exports_per_strategy() -> None:
    world = 4
    assert [rank_exports("single_rank", r, world) for r in range(world)] == [0, 0, 0, 1]
    assert [rank_exports("single_rank", r, world, export_rank=1) for r in range(world)] == [
        0,
        1,
        0,
        0,
    ]
    assert all(rank_exports("all_ranks", r, world) for r in range(world))
    assert [rank_exports("sampled", r, 8, sample_rate=0.5) for r in range(8)] == [
        is_rank_sampled(r, 0.5) for r in range(8)
    ]
    assert rank_exports("first_rank_per_node", 5, world, local_rank=0)
    assert not rank_exports("first_rank_per_node", 0, world, local_rank=1)


def config(**kwargs: object) -> TelemetryConfig:
    values: dict[str, object] = {"enabled": True, "exporter": "none", "run_id": "r"}
    values["span_groups_spec"] = "all"
    return TelemetryConfig(**{**values, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("local_rank", "exports"), [(None, True), ("0", True), ("1", False), (" ", True)]
)
def test_first_rank_per_node_reads_local_rank(
    monkeypatch: pytest.MonkeyPatch, make_handle: Make, local_rank: str | None, exports: bool
) -> None:
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    handle = make_handle(config(rank_strategy="first_rank_per_node"), rank=3, world_size=8)
    assert handle.is_exporting is exports


def test_first_rank_per_node_with_a_bad_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "first")
    with pytest.raises(TelemetryConfigError, match=r"^LOCAL_RANK='first' is not valid"):
        setup_telemetry(config(rank_strategy="first_rank_per_node"), rank=0, world_size=2)


def test_sampled_strategy_at_setup(make_handle: Make, tmp_path: Path) -> None:
    cfg = config(rank_strategy="sampled", export_sample_rate=0.5)
    exporting = [make_handle(cfg, rank=r, world_size=8).is_exporting for r in range(8)]
    assert exporting == [is_rank_sampled(r, 0.5) for r in range(8)]


def spans_kept(make_handle: Make, rank: int, **kwargs: object) -> list[str]:
    exporter = InMemorySpanExporter()
    handle = make_handle(
        config(sampling_strategy="rank_aware", rank_strategy="all_ranks", **kwargs),
        rank=rank,
        world_size=8,
        span_exporter=exporter,
    )
    assert handle.is_exporting  # the sampler drops spans; the rank still exports
    with managed_span("job", "outer"), managed_span("step", "inner"):
        pass
    handle.shutdown()
    return sorted(span.name for span in exporter.get_finished_spans())


def test_rank_aware_keeps_all_of_a_sampled_ranks_spans(make_handle: Make) -> None:
    assert spans_kept(make_handle, rank=3, export_sample_rate=0.5) == ["inner", "outer"]


def test_rank_aware_keeps_none_of_an_unsampled_ranks_spans(make_handle: Make) -> None:
    assert spans_kept(make_handle, rank=0, export_sample_rate=0.5) == []


def test_rank_aware_composes_with_otel_traces_sampler(
    make_handle: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sampled rank defers to the SDK's sampler: here it keeps no trace.
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    assert spans_kept(make_handle, rank=3, export_sample_rate=0.5) == []
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
    assert spans_kept(make_handle, rank=3, export_sample_rate=0.5) == ["inner", "outer"]


def test_empty_sampling_strategy_keeps_the_sdk_sampler(make_handle: Make) -> None:
    exporter = InMemorySpanExporter()
    make_handle(config(export_sample_rate=0.0), span_exporter=exporter)
    with managed_span("job", "kept"):
        pass
    assert [span.name for span in exporter.get_finished_spans()] == ["kept"]
