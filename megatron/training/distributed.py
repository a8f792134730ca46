"""Process-group plumbing: one place that knows whether this is a torchrun job.

The loop is written once for any number of data-parallel ranks. Everything
that differs between "one process" and "torchrun --nproc_per_node=N" (process
group init and teardown, the DDP wrapper, barriers, cross-rank reductions)
lives here and degrades to a cheap no-op in a single process, so the loop
never asks how many ranks there are.

The graceful-exit signal handler lives here too because, as in Megatron-LM's
``DistributedSignalHandler``, "a signal arrived" is a cross-rank decision: one
rank's SIGTERM must make every rank save and stop at the same iteration, or the
others would hang in the next collective.

``teardown_distributed`` must really end the group: ``destroy_process_group``
drops the registry's references, and the group's C++ object (gloo's worker
threads with it) lives on while anything else holds one. Importing
``torch.distributed.nn`` after the group exists (DDP's constructor does) gives
its functions ``group.WORLD`` as a default argument, a reference held until the
interpreter finalizes. A gloo worker still running then is ended by
``pthread_exit``, which C++ turns into "terminate called without an active
exception", a SIGABRT at the end of a finished run. So that module is imported
before the group is made.
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from megatron.core.telemetry.logs import console_logger, print_lines
from megatron.training.telemetry.grad_sync_spans import attach_grad_sync_spans, grad_sync_window

__all__ = [
    "DistributedEnv",
    "GracefulExitSignal",
    "all_reduce_mean",
    "any_rank",
    "barrier",
    "grad_sync",
    "initialize_distributed",
    "install_graceful_exit_handler",
    "max_across_ranks",
    "print_rank_0",
    "teardown_distributed",
    "unwrap_model",
    "world_size_from_env",
    "wrap_model",
]


@dataclass(frozen=True)
class DistributedEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_rank_0(self) -> bool:
        return self.rank == 0


def world_size_from_env() -> int:
    """The data-parallel size torchrun announces, known before any process group exists."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def initialize_distributed(seed: int, store: torch_dist.Store | None = None) -> DistributedEnv:
    """Join the torchrun process group (if launched by torchrun) and seed torch.

    ``store``: where the group's ranks meet (an in-process restart's cycle gives its
    own prefix of a store the cycles share); None: torchrun's, from the environment.

    gloo on CPU, nccl on CUDA; a single process never creates a group. Each
    rank seeds with the same value so model initialization is identical
    everywhere without a broadcast (DDP checks this anyway).

    Python's ``random`` is deliberately not seeded: nothing here draws from it,
    and OpenTelemetry's default id generator does. Seeding it would give every
    run with the same ``--seed`` the same trace and span ids, and a resumed
    run appends to the same trace file as the run it continues.
    """
    world_size = world_size_from_env()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not torch_dist.is_initialized():
        # Imported before the group exists, not later by DDP's constructor: its
        # functions' ``group=group.WORLD`` defaults would hold the default group, and
        # teardown_distributed could not destroy it (module doc).
        importlib.import_module("torch.distributed.nn")
        backend = "nccl" if device.type == "cuda" else "gloo"
        torch_dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            device_id=_device_id(device),
            store=store,
        )
    torch.manual_seed(seed)  # also seeds every CUDA device
    return DistributedEnv(rank, world_size, local_rank, device)


def _device_id(device: torch.device) -> torch.device | None:
    return device if device.type == "cuda" else None


def teardown_distributed() -> None:
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def wrap_model(model: nn.Module, env: DistributedEnv) -> nn.Module:
    """DDP when there is more than one rank, the bare module otherwise.

    With the ``communication`` span group on, the DDP model gets the hook
    that times its gradient all-reduce (:mod:`~megatron.training.telemetry.grad_sync_spans`).
    """
    model = model.to(env.device)
    if env.world_size == 1:
        return model
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=device_ids)
    attach_grad_sync_spans(ddp)
    return ddp


def unwrap_model(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def grad_sync(
    model: nn.Module, enabled: bool, iteration: int | None = None
) -> AbstractContextManager[object]:
    """Gradient accumulation: let DDP all-reduce only when ``enabled`` (the last micro-batch).

    The reducing pass is also the window the gradient-sync spans of
    ``iteration`` are timed in (when the model has the hook).
    """
    if not isinstance(model, DistributedDataParallel):
        return nullcontext()
    if enabled:
        return grad_sync_window(model, iteration)
    return model.no_sync()


def _distributed() -> bool:
    return torch_dist.is_initialized() and torch_dist.get_world_size() > 1


def barrier() -> None:
    if _distributed():
        torch_dist.barrier()


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """The mean of ``value`` over data-parallel ranks (a copy; the input is untouched)."""
    value = value.detach().clone()
    if _distributed():
        torch_dist.all_reduce(value, op=torch_dist.ReduceOp.SUM)
        value /= torch_dist.get_world_size()
    return value


def max_across_ranks(value: float) -> float:
    if not _distributed():
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=_collective_device())
    torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MAX)
    return float(tensor.item())


def any_rank(flag: bool) -> bool:
    return max_across_ranks(1.0 if flag else 0.0) > 0.0


def _collective_device() -> torch.device:
    if torch_dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_CONSOLE = console_logger()


def print_rank_0(message: str) -> None:
    """Print on rank 0, as Megatron does; log the same line on every rank.

    The console shows exactly what it always did. The log record (INFO, on
    the non-propagating console logger) is what the telemetry log bridge
    exports, and it is made on every rank because the exporting rank need
    not be rank 0. With no bridge installed the logger is below INFO and no
    record is even created.
    """
    if not _distributed() or torch_dist.get_rank() == 0:
        print_lines(message)
    _CONSOLE.info(message)


class GracefulExitSignal:
    """Remembers that SIGTERM arrived, so the loop can save and stop at a clean point.

    The handler only records; all the work (finish the iteration, save, exit 0)
    happens in the loop, outside signal context.
    """

    def __init__(self) -> None:
        self.received = False

    def handle(self, signum: int, frame: object) -> None:
        self.received = True

    def received_on_any_rank(self) -> bool:
        return any_rank(self.received)


_GRACEFUL_EXIT = GracefulExitSignal()


@functools.cache
def _install_handler_once() -> None:
    # Once per process: a second pretrain() must not replace the telemetry
    # exit hook, which was installed after this handler and chains to it.
    signal.signal(signal.SIGTERM, _GRACEFUL_EXIT.handle)


def install_graceful_exit_handler() -> GracefulExitSignal:
    """Catch SIGTERM for a graceful exit (``--exit-signal-handler``), fresh for this run."""
    _install_handler_once()
    _GRACEFUL_EXIT.received = False
    return _GRACEFUL_EXIT
