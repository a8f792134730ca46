"""In-process restart: NVIDIA Resiliency Extension's ``inprocess.Wrapper`` around ``pretrain()``.

With ``--inprocess-restart`` a fault on any rank (an exception, or a rank that
makes no progress past ``--inprocess-soft-timeout``) does not end the job: NVRx
(the ``inprocess`` extra) interrupts every rank, aborts the process group,
checks health and calls ``pretrain()`` again in the same processes, which
resumes from the last checkpoint (``--load``, else the job's own ``--save``).
Each call is a *cycle*, numbered by NVRx's restart iteration
(``CallWrapper.iteration``), which ``--inprocess-max-iterations`` limits. The
options are Megatron-LM's, with the same meanings (``arguments.py``); this module
is the counterpart of Megatron-LM's ``megatron/training/inprocess_restart.py``.

What the cycles share lives in one :class:`InprocessRun` per process:

* the process group's rendezvous store, made once (as Megatron-LM does) and seen
  by each cycle under a prefix of its own (``PrefixStore(str(iteration), store)``),
  so a cycle never reads the last one's keys;
* telemetry: set up by the first cycle and kept up across the others (each
  cycle's ``pretrain()`` runs a lifecycle of its own on it, see
  :class:`~megatron.training.telemetry.lifecycle.TrainerSpanPhases`), the live
  goodput gauges with it, and every span a cycle starts carries
  ``nvrx.inprocess.iteration``;
* the latest cycle's lifecycle, which NVRx's finalize step (:class:`EndCycle`)
  ends if the fault's way out of ``pretrain()`` could not, and which
  :meth:`InprocessRun.close` ends once NVRx is done, shutting telemetry down if
  no cycle did.

NVRx interrupts a healthy rank by raising ``RankShouldRestart`` in its main
thread asynchronously, between any two bytecodes. A lifecycle transition is
held from it by ``CallWrapper.atomic()``'s lock (the one NVRx takes before it
interrupts); a rank stuck outside Python (a collective waiting for a dead peer)
is freed by NVRx's abort, which destroys the process group.

What runs here on a CPU (gloo), as Megatron-LM's path does on GPUs: its
``CudaHealthCheck`` (nothing to check without CUDA), ``AbortTorchDistributed``,
``RetryController``, the ``Tree`` rank assignment of ``--inprocess-granularity``
(a node's ranks counted by ``LOCAL_WORLD_SIZE``, where Megatron-LM counts CUDA
devices) and the wrapper's store on ``MASTER_PORT + 2`` (the process group's on
``MASTER_PORT + 1``). Left out: NVRx's nested-restarter callbacks, which report to
its in-job launcher (``ft_launcher``), which does not run this trainer, and
Transformer Engine's abort. One process without torchrun gets a loopback
rendezvous of its own.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib
import logging
import os
import socket
import traceback
import warnings
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from megatron.trace_format.semconv import NVRX_INPROCESS_ITERATION
from megatron.training.job_config import InprocessConfig, JobConfig

if TYPE_CHECKING:
    from megatron.core.telemetry import TelemetryHandle
    from megatron.training.telemetry.goodput_metrics import LiveGoodput
    from megatron.training.telemetry.lifecycle import TrainerSpanPhases

__all__ = ["Cycle", "EndCycle", "InprocessRun", "RestartsExhausted", "run_with_inprocess_restart"]

_log = logging.getLogger(__name__)

#: The ports of the wrapper's store and of the process group's, past ``MASTER_PORT``
#: (Megatron-LM's layout).
_PROCESS_GROUP_PORT_OFFSET, _WRAPPER_PORT_OFFSET = 1, 2
_STORE_TIMEOUT = datetime.timedelta(seconds=300)


class RestartsExhausted(RuntimeError):
    """``--inprocess-max-iterations`` cycles ran, and the last one ended by a fault."""


def import_inprocess() -> ModuleType:
    """``nvidia_resiliency_ext.inprocess``, with one warning of its turned off: each call of
    the wrapper warns when the root logger has no stream handler ("logging not
    initialized"), which says nothing a user can act on (NVRx's warnings and errors, a
    rank's fault and restart, still reach stderr through Python's last-resort handler)."""
    warnings.filterwarnings("ignore", "logging not initialized", UserWarning)
    return importlib.import_module("nvidia_resiliency_ext.inprocess")


class InprocessRun:
    """What the cycles of one process share (the module doc), and the cycles' function."""

    def __init__(
        self, config: JobConfig, inprocess: ModuleType, pretrain: Callable[..., Any]
    ) -> None:
        self.config = config
        self.inprocess = inprocess
        self.pretrain = pretrain
        self.store: torch.distributed.Store | None = None
        self.telemetry: TelemetryHandle | None = None
        self.goodput: LiveGoodput | None = None
        self.lifecycle: TrainerSpanPhases | None = None  # the latest cycle's
        self.unwound: BaseException | None = None  # what left the latest cycle's pretrain()
        self.cycles = 0

    def allows_cycle(self, index: int) -> bool:
        """Whether NVRx may run cycle ``index`` (``--inprocess-max-iterations``)."""
        limit = self.config.inprocess.inprocess_max_iterations
        return limit is None or index < limit

    def restarts_from(self, cause: BaseException | int | None) -> bool:
        """Whether NVRx restarts after ``cause`` leaves ``pretrain()``: an ``Exception``,
        or its own interruption; not a ``KeyboardInterrupt`` nor a ``SystemExit``."""
        interruption = self.inprocess.monitor_thread.RankShouldRestart
        return isinstance(cause, (Exception, interruption))

    def shared_telemetry(self, setup: Callable[[], TelemetryHandle]) -> TelemetryHandle:
        """The process's telemetry: set up by the first cycle, kept by the others (set
        up again only where a cycle that was not restarted from shut it down)."""
        if self.telemetry is None or self.telemetry.is_shut_down:
            self.telemetry, self.goodput = setup(), None
        return self.telemetry

    def shared_goodput(self, start: Callable[[], LiveGoodput | None]) -> LiveGoodput | None:
        """The process's live goodput gauges, registered once on its telemetry's meter."""
        if self.goodput is None:
            self.goodput = start()
        return self.goodput

    def call(self, program_start: float | None, main_entry: float | None, call_wrapper: Any) -> Any:
        """One cycle: ``pretrain()`` as NVRx calls it (``call_wrapper`` is its
        ``CallWrapper``, filled in by NVRx from the annotation :meth:`function` gives)."""
        cycle = Cycle(self, call_wrapper)
        self.lifecycle, self.unwound = None, None
        self.cycles = cycle.index + 1
        first = cycle.index == 0
        return self.pretrain(
            self.config,
            program_start=program_start if first else None,
            main_entry=main_entry if first else None,
            cycle=cycle,
        )

    def function(self) -> Callable[..., Any]:
        """:meth:`call` as a function NVRx can wrap: NVRx passes its ``CallWrapper`` to
        the parameter annotated with that class (an annotation object, not a string)."""

        def cycle(program_start: Any, main_entry: Any, call_wrapper: Any = None) -> Any:
            return self.call(program_start, main_entry, call_wrapper)

        cycle.__annotations__ = {"call_wrapper": self.inprocess.CallWrapper}
        return cycle

    def close(self) -> None:
        """NVRx is done (the last cycle finished, or it gave up): end the latest cycle's
        lifecycle, which shuts telemetry down unless that cycle's own shutdown did."""
        if self.lifecycle is not None:
            self.lifecycle.terminate()


class Cycle:
    """One cycle: NVRx's restart iteration ``index``, and what ``pretrain()`` asks of it."""

    def __init__(self, run: InprocessRun, call_wrapper: Any) -> None:
        self.run = run
        self.call_wrapper = call_wrapper
        self.index: int = call_wrapper.iteration

    def restarts_after(self, cause: BaseException | int | None) -> bool:
        """Whether NVRx calls ``pretrain()`` again after ``cause`` ended this cycle."""
        return self.run.restarts_from(cause) and self.run.allows_cycle(self.index + 1)

    @contextlib.contextmanager
    def exclusive(self, wait: bool) -> Iterator[bool]:
        """Hold NVRx's atomic lock (its interruption waits for it), yielding True; with
        ``wait`` False, yield False at once when NVRx holds it (it is interrupting)."""
        if wait:
            with self.call_wrapper.atomic():
                yield True
            return
        lock = self.call_wrapper.atomic_lock
        if not lock.acquire(blocking=False):
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    def process_group_store(self) -> torch.distributed.Store | None:
        """The rendezvous store of this cycle's process group (None: one rank, no group)."""
        store = self.run.store
        return None if store is None else torch.distributed.PrefixStore(str(self.index), store)

    def telemetry(self, setup: Callable[[], TelemetryHandle]) -> TelemetryHandle:
        """The process's telemetry, its spans stamped with this cycle from now on."""
        handle = self.run.shared_telemetry(setup)
        handle.stamp_spans({NVRX_INPROCESS_ITERATION: self.index})
        return handle

    def live_goodput(self, start: Callable[[], LiveGoodput | None]) -> LiveGoodput | None:
        return self.run.shared_goodput(start)

    def began(self, lifecycle: TrainerSpanPhases) -> None:
        """``pretrain()`` made this cycle's lifecycle."""
        self.run.lifecycle = lifecycle

    def unwinding(self, exc: BaseException) -> None:
        """``exc`` is leaving ``pretrain()``: what NVRx's finalize records if the
        lifecycle's own way out was held off."""
        self.run.unwound = exc

    def release(self, exc: BaseException) -> None:
        """``exc`` left this cycle's ``pretrain()``: let go of what its frames held.

        On gloo, a rank's process group closes its connections only once nothing
        refers to it any more (neither NVRx's abort nor ``destroy_process_group``
        does while the DDP model holds it), and the frames of ``exc``'s traceback
        hold the model. A peer blocked in a collective with this rank fails at once
        when they close, instead of waiting for NVRx's timeouts. So the locals of
        the finished frames are cleared (the traceback keeps its lines) and the
        model's reference cycles collected, before ``pretrain()`` tears the group down.
        """
        seen: set[int] = set()
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            traceback.clear_frames(exc.__traceback__)
            exc = exc.__cause__ or exc.__context__
        gc.collect()

    def ping(self) -> None:
        """A loop pass finished: progress, for NVRx's soft and hard timeouts."""
        self.call_wrapper.ping()


def _as_finalize(inprocess: ModuleType, step: type) -> type:
    """``step`` as a subclass of NVRx's ``Finalize`` (which ``Wrapper`` checks for); made
    once NVRx is imported, so that this module imports without it."""
    return type(step.__name__, (step, inprocess.finalize.Finalize), {})


class EndCycle:
    """NVRx's finalize step: the cycle's exit path, in the main thread once NVRx's
    interruption is over. Fires ``restart`` on the cycle's lifecycle, with the
    exception that left ``pretrain()`` (else NVRx's record of it); a no-op where the
    way out of ``pretrain()`` already ended the cycle. Never raises: an exception
    here would end the job instead of restarting it."""

    def __init__(self, run: InprocessRun) -> None:
        self.run = run

    def __call__(self, state: Any) -> Any:
        run = self.run
        try:
            if run.lifecycle is not None:
                run.lifecycle.restart(cause=run.unwound or state.fn_exception)
        except Exception:  # noqa: BLE001 -- telemetry never stops a restart
            _log.warning("telemetry: could not end the cycle's spans", exc_info=True)
        return state


class _EmptyCudaCache:
    """``--inprocess-empty-cuda-cache``: release cached GPU memory (nothing on a CPU)."""

    def __call__(self, state: Any) -> Any:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return state


def _seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=value)


def build_wrapper(run: InprocessRun) -> Any:
    """NVRx's ``Wrapper`` as Megatron-LM configures it from the ``--inprocess-*`` options."""
    inprocess, options = run.inprocess, run.config.inprocess
    layers = [
        inprocess.rank_assignment.Layer(
            min_ranks=options.inprocess_active_world_size,
            max_ranks=options.inprocess_active_world_size,
            flag=inprocess.rank_assignment.LayerFlag.RESERVE,
        )
    ]
    if options.inprocess_granularity == "node":
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        layers.append(
            inprocess.rank_assignment.Layer(
                min_ranks=per_node,
                max_ranks=per_node,
                key_or_fn=lambda _: socket.gethostname(),
                flag=inprocess.rank_assignment.LayerFlag.RESERVE,
            )
        )
    finalize = [_as_finalize(inprocess, EndCycle)(run)]
    if options.inprocess_empty_cuda_cache:
        finalize.append(_as_finalize(inprocess, _EmptyCudaCache)())
    return inprocess.Wrapper(
        store_kwargs={
            "timeout": _STORE_TIMEOUT,
            "port": int(os.environ["MASTER_PORT"]) + _WRAPPER_PORT_OFFSET,
        },
        initialize=inprocess.initialize.RetryController(
            max_iterations=options.inprocess_max_iterations,
            min_world_size=options.inprocess_active_world_size,
        ),
        abort=_abort(inprocess),
        health_check=inprocess.health_check.CudaHealthCheck(timeout=_seconds(10)),
        rank_assignment=inprocess.rank_assignment.Tree(layers=layers),
        finalize=inprocess.Compose(*finalize),
        heartbeat_interval=_seconds(options.inprocess_heartbeat_interval),
        heartbeat_timeout=_seconds(options.inprocess_heartbeat_timeout),
        barrier_timeout=_seconds(options.inprocess_barrier_timeout),
        completion_timeout=_seconds(options.inprocess_completion_timeout),
        monitor_process_interval=_seconds(options.inprocess_monitor_process_interval),
        monitor_thread_interval=_seconds(options.inprocess_monitor_thread_interval),
        progress_watchdog_interval=_seconds(options.inprocess_progress_watchdog_interval),
        last_call_wait=_seconds(options.inprocess_last_call_wait),
        soft_timeout=_seconds(options.inprocess_soft_timeout),
        hard_timeout=_seconds(options.inprocess_hard_timeout),
        termination_grace_time=_seconds(options.inprocess_termination_grace_time),
        enabled=True,
    )


def _abort(inprocess: ModuleType) -> Any:
    """How NVRx's monitor thread unblocks a rank it interrupts: Megatron-LM's
    ``AbortTorchDistributed`` where the group is NCCL's, whose abort ends a collective in
    flight. A gloo group's does not (neither ``abort`` nor ``destroy_process_group`` ends a
    collective another thread waits in), and destroying it from the monitor thread while
    the main thread is inside one can block that thread, so NVRx never interrupts the
    rank: on a CPU there is none. A rank blocked in a collective is freed by its peer
    instead, whose fault (or interruption) releases that peer's group
    (:meth:`Cycle.release`), closing the connections it waits on."""
    if torch.cuda.is_available():
        return inprocess.Compose(inprocess.abort.AbortTorchDistributed())
    return None


def _one_line(exc: BaseException, limit: int = 200) -> str:
    """``Type: message``, the message's first line, at most ``limit`` characters."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_process_rendezvous() -> None:
    """Outside torchrun, the variables NVRx's store reads: this process, on loopback."""
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as probe:  # a port the kernel says is free; NVRx binds it next
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ["MASTER_PORT"] = str(port - _WRAPPER_PORT_OFFSET)
    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(name, value)
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")


def _process_group_store(options: InprocessConfig) -> torch.distributed.Store | None:
    """The store every cycle's process group meets in (None for one rank)."""
    world_size = int(os.environ["WORLD_SIZE"])
    if world_size == 1:
        return None
    return torch.distributed.TCPStore(
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]) + _PROCESS_GROUP_PORT_OFFSET,
        world_size=world_size,
        is_master=int(os.environ.get("RANK", "0")) == 0,
        timeout=_STORE_TIMEOUT,
        wait_for_workers=True,
        use_libuv=True,
    )


def run_with_inprocess_restart(
    pretrain: Callable[..., Any],
    config: JobConfig,
    *,
    program_start: float | None = None,
    main_entry: float | None = None,
) -> Any:
    """``pretrain(config, ..., cycle=)`` (:func:`megatron.training.training.pretrain`) under
    NVRx's in-process restart: cycle after cycle until one finishes, returning what it
    returns. Raises :class:`RestartsExhausted` when ``--inprocess-max-iterations``
    cycles ended by a fault, and whatever else ends NVRx's wrapper."""
    inprocess = import_inprocess()
    _one_process_rendezvous()
    run = InprocessRun(config, inprocess, pretrain)
    run.store = _process_group_store(config.inprocess)
    wrapped = build_wrapper(run)(run.function())
    try:
        return wrapped(program_start, main_entry)
    except inprocess.exception.RestartAbort as exc:
        limit = config.inprocess.inprocess_max_iterations
        last = run.unwound
        ended_by = "" if last is None else f"; the last ended by {_one_line(last)}"
        raise RestartsExhausted(
            f"in-process restart gave up after {run.cycles} cycles "
            f"(--inprocess-max-iterations {limit}){ended_by}"
        ) from exc
    finally:
        run.close()
