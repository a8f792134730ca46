"""Gradient all-reduce spans on DDP: a rank's own work, apart from its wait for the others.

In a data-parallel job every rank waits, inside ``backward()``, for the
gradient all-reduce, and so for the slowest rank. The phase spans alone
cannot show who is slow: each rank's ``megatron.train.forward_backward``
lasts as long as the slowest rank's. These two spans (Megatron-LM's names,
span group ``communication``) cut the wait out:

* ``megatron.grad_sync.start``: from the first gradient bucket DDP hands to
  its communication hook to the dispatch of the last one: backward compute
  with the all-reduces of the earlier buckets overlapping it (the rank's own
  work);
* ``megatron.grad_sync.finish``: from that last dispatch until ``backward()``
  returns, all buckets reduced: the wait for the other ranks (plus the
  exposed transfer time). Opened in the hook, it is an open span while a rank
  is blocked there, so a stall report names it.

Both carry ``megatron.iteration``, so ``megatron-trace report`` can subtract
each iteration's wait from its duration.

The hook is a DDP communication hook (``register_comm_hook``) that reduces
exactly as DDP's default does (torch's own ``allreduce_hook``: sum, divided by
the world size) and only reads the clock around it. It is registered only
when the ``communication`` group is on when the model is wrapped, so the
default groups run DDP's built-in reduction and pay nothing. The hook runs
in whatever thread autograd uses (the caller's, on a CPU); the spans get
their parent from the window opened on the training thread, not from the
hook thread's context.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace import Span
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from megatron.core.telemetry.span_groups import MegatronSpanGroup
from megatron.core.telemetry.state import get_active_tracer, is_span_group_enabled
from megatron.trace_format.semconv import (
    GRAD_SYNC_BUCKETS,
    GRAD_SYNC_FINISH_SPAN,
    GRAD_SYNC_START_SPAN,
    ITERATION,
)

__all__ = [
    "GradSyncSpans",
    "attach_grad_sync_spans",
    "grad_sync_window",
    "wait_markers",
]

_log = logging.getLogger(__name__)

# The spans of each wrapped model, without keeping a discarded model alive.
_ATTACHED: weakref.WeakKeyDictionary[nn.Module, GradSyncSpans] = weakref.WeakKeyDictionary()


class GradSyncSpans:
    """A DDP communication hook that reduces as DDP does and records the two spans.

    One backward at a time: :meth:`window` brackets the backward pass whose
    buckets are reduced (the last micro-batch's), and the hook fills it in.
    Outside a window the hook only reduces.
    """

    def __init__(self) -> None:
        self._parent: otel_context.Context | None = None
        self._iteration: int | None = None
        self._first_ns: int | None = None
        self._buckets = 0
        self._finish: Span | None = None
        self._failures = 0

    def register(self, model: DistributedDataParallel) -> None:
        model.register_comm_hook(state=None, hook=self.hook)

    @contextmanager
    def window(self, iteration: int | None) -> Iterator[None]:
        """The backward pass of ``iteration`` whose gradients are all-reduced."""
        self._parent = otel_context.get_current()
        self._iteration = iteration
        self._first_ns = None
        self._buckets = 0
        try:
            yield
        finally:
            finish, self._finish = self._finish, None
            self._parent = None
            if finish is not None:
                self._guarded(finish.end)

    def hook(self, state, bucket):
        """DDP's default all-reduce of ``bucket``, timed when a window is open.

        Unannotated on purpose: DDP inspects a hook's annotations and rejects
        any but its own classes, which postponed (string) annotations are not.
        """
        if self._parent is None or not is_span_group_enabled(MegatronSpanGroup.COMMUNICATION):
            return allreduce_hook(state, bucket)
        if self._first_ns is None:
            self._first_ns = time.time_ns()
        self._buckets += 1
        future = allreduce_hook(state, bucket)
        if bucket.is_last():
            self._guarded(self._open_spans, time.time_ns())
        return future

    def _open_spans(self, dispatched_ns: int) -> None:
        tracer = get_active_tracer()
        attributes = {} if self._iteration is None else {ITERATION: self._iteration}
        start = tracer.start_span(
            GRAD_SYNC_START_SPAN,
            context=self._parent,
            start_time=self._first_ns,
            attributes={**attributes, GRAD_SYNC_BUCKETS: self._buckets},
        )
        start.end(end_time=dispatched_ns)
        self._finish = tracer.start_span(
            GRAD_SYNC_FINISH_SPAN,
            context=self._parent,
            start_time=dispatched_ns,
            attributes=attributes,
        )

    def _guarded(self, call: Any, *args: Any) -> None:
        # Telemetry never breaks training: the reduction already happened.
        try:
            call(*args)
        except Exception:  # noqa: BLE001 -- any SDK failure is non-fatal
            self._failures += 1
            if self._failures == 1:
                _log.warning("gradient-sync spans failed; training continues", exc_info=True)


def attach_grad_sync_spans(model: nn.Module) -> GradSyncSpans | None:
    """Register the timing hook on a DDP model when the ``communication`` group is on."""
    if not isinstance(model, DistributedDataParallel):
        return None
    if not is_span_group_enabled(MegatronSpanGroup.COMMUNICATION):
        return None
    spans = GradSyncSpans()
    spans.register(model)
    _ATTACHED[model] = spans
    return spans


def grad_sync_window(model: nn.Module, iteration: int | None) -> AbstractContextManager[object]:
    """The timing window of ``model``'s reducing backward pass (a no-op without the hook)."""
    spans = _ATTACHED.get(model)
    return nullcontext() if spans is None else spans.window(iteration)


def wait_markers(model: nn.Module) -> tuple[frozenset[str], bool]:
    """How the hang watchdog tells that a rank stalled waiting for this model's all-reduce.

    ``(open spans that mean waiting, whether a stall in torch.autograd does)``:
    with the hook, the open ``megatron.grad_sync.finish`` says it exactly;
    a DDP model without it waits inside ``backward()``, in autograd, where
    the rank's own backward work also runs, so that is the best one can say;
    a model that is not DDP waits for nobody.
    """
    if model in _ATTACHED:
        return frozenset({GRAD_SYNC_FINISH_SPAN}), False
    return frozenset(), isinstance(model, DistributedDataParallel)
