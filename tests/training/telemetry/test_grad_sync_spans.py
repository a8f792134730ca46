"""The DDP gradient-sync spans, on a real one-rank gloo process group in this process.

Two ranks are the torchrun tests' business (``test_training_stragglers_hangs``);
here: the hook reduces exactly as DDP's built-in reduction, the spans are
where and what they should be, and nothing is registered without the
``communication`` span group.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from torch.nn.parallel import DistributedDataParallel

from megatron.core.telemetry import TelemetryConfig, managed_span, setup_telemetry, state
from megatron.training.telemetry.grad_sync_spans import (
    attach_grad_sync_spans,
    grad_sync_window,
    wait_markers,
)


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def telemetry(tmp_path: Path):
    def make(groups: str):
        exporter = InMemorySpanExporter()
        config = TelemetryConfig(
            enabled=True, exporter="none", span_groups_spec=groups, metrics_enabled=False
        )
        handle = setup_telemetry(config, span_exporter=exporter)
        made.append(handle)
        return exporter

    made: list = []
    yield make
    for handle in made:
        handle.shutdown()
    state._reset()


def _model() -> DistributedDataParallel:
    torch.manual_seed(0)
    # Two 1 MB buckets: the hook runs twice per backward.
    net = torch.nn.Sequential(
        torch.nn.Linear(512, 512), torch.nn.Linear(512, 512), torch.nn.Linear(512, 1)
    )
    return DistributedDataParallel(net, bucket_cap_mb=1)


def _backward(model, iteration: int | None) -> list[torch.Tensor]:
    model.zero_grad()
    with (
        managed_span("forward_backward", "megatron.train.forward_backward"),
        grad_sync_window(model, iteration),
    ):
        model(torch.ones(4, 512)).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_the_spans_time_the_all_reduce_under_the_current_span(process_group, telemetry):
    exporter = telemetry("per_step")
    plain = _model()
    hooked = _model()
    assert attach_grad_sync_spans(hooked) is not None
    assert wait_markers(hooked) == (frozenset({"megatron.grad_sync.finish"}), False)
    # DDP reduces everything as one bucket the first time, then rebuilds its buckets.
    for iteration in (6, 7):
        expected = _backward(plain, None)
        exporter.clear()
        grads = _backward(hooked, iteration)
        for got, want in zip(grads, expected, strict=True):
            assert torch.equal(got, want)  # reduced exactly as DDP's own reduction
    spans = {s.name: s for s in exporter.get_finished_spans()}
    start, finish = spans["megatron.grad_sync.start"], spans["megatron.grad_sync.finish"]
    parent = spans["megatron.train.forward_backward"]
    for span in (start, finish):
        assert span.parent.span_id == parent.context.span_id
        assert span.attributes["megatron.iteration"] == 7
    assert start.attributes["megatron.grad_sync.buckets"] == 2
    assert start.start_time <= start.end_time == finish.start_time <= finish.end_time
    assert finish.end_time <= parent.end_time


def test_outside_the_window_the_hook_only_reduces(process_group, telemetry):
    exporter = telemetry("per_step")
    model = _model()
    attach_grad_sync_spans(model)
    model(torch.ones(4, 512)).sum().backward()
    assert not [s for s in exporter.get_finished_spans() if s.name.startswith("megatron.grad")]


def test_no_hook_without_the_communication_group(process_group, telemetry):
    exporter = telemetry("default")
    model = _model()
    assert attach_grad_sync_spans(model) is None
    assert wait_markers(model) == (frozenset(), True)  # DDP waits unobserved, in autograd
    _backward(model, 1)
    assert not [s for s in exporter.get_finished_spans() if s.name.startswith("megatron.grad")]
    assert attach_grad_sync_spans(torch.nn.Linear(2, 2)) is None
    assert wait_markers(torch.nn.Linear(2, 2)) == (frozenset(), False)
