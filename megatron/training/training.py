"""``pretrain()`` and ``train()``: the story of a training job, and nothing else.

Read top to bottom, ``pretrain`` is the life of a job (parse, join the process
group, start telemetry, build the model, load a checkpoint, build the data,
train, save, shut down) and ``train`` is the life of one iteration (fetch,
forward, backward, step, log, evaluate, save, decide whether to stop). Every
concern those lines touch lives in its own module and is called here in one
line.

Telemetry appears here only as call sites, as the upstream issue asks of
Megatron-LM's ``training.py``: named transitions fired on the span lifecycle
(``phases.start_job``, ``record_phase``, ``start_train``, ``step``,
``end_train``, ``shutdown``), ``managed_span`` blocks, one group gate, a few
attribute stamps, and the hang watchdog's heartbeat (one ``progress`` call per
loop pass; :mod:`megatron.core.telemetry.watchdog`). Which spans are open,
when a trace is cut, what happens on SIGTERM: all of that is
:mod:`megatron.training.telemetry_spans`. With telemetry
off every call site is a no-op and the job behaves exactly as it would without
them.

Every way a run can end ends the lifecycle exactly once:

1. normal: the loop finishes, ``end_train``, then ``shutdown``;
2. early exit (``--exit-interval``, ``--exit-duration-in-mins``, a graceful
   SIGTERM): checkpoint, ``shutdown``, and ``TrainingResult.exit_reason`` says
   why (the entry point exits 0; a library caller is never exited);
3. an exception anywhere after the job started: ``shutdown``, then the same
   exception object is re-raised;
4. a hard SIGTERM or SIGHUP, SIGINT, and the atexit fallback: the exit hooks
   installed by :func:`~megatron.training.telemetry.lifecycle.install_exit_hooks`
   fire ``terminate``, after which this file's own triggers record nothing.

The process group is torn down in a
``finally``: whatever ends the run, the exception that propagates is the one
that ended it. Telemetry's end-of-run summary is printed last and can only
ever log a warning.

Two choices worth knowing:

* The final checkpoint (when the last iteration is not on a ``--save-interval``
  boundary, and on every early exit) is written at the end of ``train()``,
  while the last interval's trace is still open, so its span nests under that
  interval like every other save instead of becoming an orphan trace.
* The first iteration a process executes is also wrapped in
  ``megatron.train.first_iteration`` (span group ``first_iteration``, on in
  the ``default`` preset where per-iteration spans are off): the time to the
  first completed step is a goodput number worth having in every trace.

Under ``--inprocess-restart`` (:mod:`megatron.training.inprocess_restart`)
each call of ``pretrain()`` is one *cycle* of NVRx's restart loop, given as
``cycle``: its process group meets in the cycle's own prefix of a store the
cycles share, its telemetry is the process's (set up by the first cycle, not
shut down by a cycle NVRx restarts from), its startup trace begins at its own
entry (the launch, imports and argument parsing belong to the first), each
loop pass tells NVRx it made progress, and a fault NVRx restarts from takes the
lifecycle to ``restarting`` instead of ``shutdown``: path 3 then ends the
cycle, not the process's telemetry, and a start that failed keeps its files
(the job goes on).

Test hooks (``MEGATRON_TEST_FAULT_AT_ITERATION``,
``MEGATRON_TEST_ITERATION_SLEEP``, ``MEGATRON_TEST_HANG_AT_ITERATION``,
``MEGATRON_TEST_HANG_AT_STARTUP``, ``MEGATRON_TEST_SAVE_SLEEP``): see
:mod:`megatron.training.fault_injection`;
checked at startup, read again when the job starts.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from megatron.core.telemetry import (
    MegatronSpanGroup,
    SpanGroup,
    TelemetryHandle,
    is_span_group_enabled,
    managed_span,
    safe_set_span_attributes,
    setup_telemetry,
)
from megatron.core.telemetry.watchdog import NO_WATCHDOG, Watchdog, hang_watchdog
from megatron.trace_format import semconv
from megatron.training.arguments import parse_args
from megatron.training.checkpointing import (
    TrainState,
    empty_directory,
    has_checkpoint,
    load_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
)
from megatron.training.data import VOCAB_SIZE, build_train_valid_datasets, micro_batches
from megatron.training.distributed import (
    DistributedEnv,
    all_reduce_mean,
    grad_sync,
    initialize_distributed,
    install_graceful_exit_handler,
    print_rank_0,
    teardown_distributed,
    wrap_model,
)
from megatron.training.early_exit import ExitConditions
from megatron.training.fault_injection import FaultInjection
from megatron.training.job_config import (
    EvalConfig,
    JobConfig,
    ModelConfig,
    OptimizerConfig,
    TrainingConfig,
)
from megatron.training.model import GPTConfig, GPTModel
from megatron.training.optimizer import build_optimizer
from megatron.training.telemetry.goodput_metrics import (
    LiveGoodput,
    checkpoint_sidecar,
    saving,
    start_live_goodput,
)
from megatron.training.telemetry.grad_sync_spans import wait_markers
from megatron.training.telemetry.job_telemetry import (
    print_telemetry_summary,
    resource_attributes,
    startup_timestamps,
)
from megatron.training.telemetry.lifecycle import TrainerSpanPhases, install_exit_hooks
from megatron.training.telemetry.start_footprint import StartFootprint, telemetry_files
from megatron.training.telemetry_spans import SpanPhases
from megatron.training.training_log import StepResult, TrainingLog

if TYPE_CHECKING:
    from megatron.training.inprocess_restart import Cycle

__all__ = ["TrainingResult", "pretrain", "train"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingResult:
    """What a finished ``pretrain()`` returns, early exits included."""

    iteration: int
    consumed_samples: int
    losses: list[tuple[int, float]]  # (iteration, lm loss) at every log interval
    trace_file: Path | None
    # Why the loop stopped before --train-iters (--exit-interval...), else None.
    exit_reason: str | None = None


def pretrain(
    config: JobConfig | Sequence[str] | None = None,
    *,
    program_start: float | None = None,
    main_entry: float | None = None,
    cycle: Cycle | None = None,
) -> TrainingResult:
    """Run one training job (an *incarnation*) from arguments to shutdown.

    ``config`` is a parsed job config (``main()`` parses first, so the time
    that takes shows as ``megatron.startup.arg_parse``) or an argv list.
    ``program_start`` and ``main_entry`` are the entry point's timestamps
    (epoch seconds) for the startup trace; unknown ones are left out of it.
    ``cycle`` is the in-process restart cycle this call is (the module doc).
    """
    pretrain_entry = time.time()
    if not isinstance(config, JobConfig):
        config = parse_args(config)
    store = None if cycle is None else cycle.process_group_store()
    setup_done = time.time()
    env = initialize_distributed(config.training.seed, store=store)
    try:
        entry = _Entry(program_start, main_entry, pretrain_entry, setup_done)
        return _run_job(config, env, entry, cycle)
    except BaseException as exc:
        if cycle is not None:  # so that the teardown below closes this rank's connections
            cycle.release(exc)
        raise
    finally:
        teardown_distributed()


@dataclass(frozen=True)
class _Entry:
    """When the process and this ``pretrain()`` got where (epoch seconds; None: unknown)."""

    program_start: float | None
    main_entry: float | None
    pretrain_entry: float
    setup_done: float  # the cycle's store made (in-process restart); else pretrain_entry


def _run_job(
    config: JobConfig, env: DistributedEnv, entry: _Entry, cycle: Cycle | None
) -> TrainingResult:
    """``pretrain()`` once the process group exists (it tears the group down)."""
    initialized = time.time()
    checkpoint = config.checkpoint
    if checkpoint.fresh_save_dir and (cycle is None or cycle.index == 0):
        empty_directory(checkpoint.save, env.is_rank_0)
    elif checkpoint.save and env.is_rank_0:
        remove_stale_temporaries(checkpoint.save)
    load = _load_dir(checkpoint, cycle)

    # Taken before anything is created: a start that fails removes what it made.
    footprint = StartFootprint.before([checkpoint.save, *telemetry_files(config.telemetry)])

    def start_telemetry() -> TelemetryHandle:
        return setup_telemetry(
            config.telemetry,
            rank=env.rank,
            world_size=env.world_size,
            resource_attributes=resource_attributes(config, env),
        )

    telemetry = start_telemetry() if cycle is None else cycle.telemetry(start_telemetry)
    # The trainer's own SIGTERM handler goes first, so the telemetry hook
    # installed next chains to it.
    graceful = config.exit.exit_signal_handler
    exit_signal = install_graceful_exit_handler() if graceful else None
    phases = TrainerSpanPhases(
        telemetry,
        save_interval=checkpoint.interval,
        is_span_group_enabled=is_span_group_enabled,
        cycle=cycle,
    )
    if cycle is not None:
        cycle.began(phases)
    install_exit_hooks(phases, graceful=graceful)

    # A later cycle's startup is its own: from its pretrain() on, no launch nor imports.
    first_start = cycle is None or cycle.index == 0
    program_start = entry.program_start if first_start else entry.pretrain_entry
    timestamps = startup_timestamps(
        program_start, entry.main_entry, entry.pretrain_entry, launcher=first_start
    )
    phases.start_job(model_type="GPT", timestamps=timestamps)
    phases.record_phase(semconv.STARTUP_IMPORTS_SPAN, program_start, entry.main_entry)
    phases.record_phase(semconv.STARTUP_ARG_PARSE_SPAN, entry.main_entry, entry.pretrain_entry)
    if cycle is not None:
        phases.record_phase(
            semconv.STARTUP_INPROCESS_SETUP_SPAN, entry.pretrain_entry, entry.setup_done
        )
    phases.record_phase(semconv.STARTUP_INITIALIZE_SPAN, entry.setup_done, initialized)
    exit_reason = None
    goodput: LiveGoodput | None = None
    hooks = FaultInjection.from_env()
    try:
        with managed_span(SpanGroup.JOB, semconv.STARTUP_MODEL_INIT_SPAN, is_goodput_span=True):
            hooks.at_startup("model_init")
            state = setup_model_and_optimizer(config.model, config.optimizer, env)
            if load:
                hooks.at_startup("load_checkpoint")
                with managed_span(
                    SpanGroup.LOAD_CHECKPOINT,
                    semconv.CHECKPOINT_LOAD_SPAN,
                    is_goodput_span=True,
                    **{semconv.CHECKPOINT_DIR: load},
                ) as span:
                    load_checkpoint(load, state, config.model)
                    safe_set_span_attributes(span, {semconv.ITERATION: state.iteration})

        def start_goodput() -> LiveGoodput | None:
            return start_live_goodput(telemetry, load, state.iteration)

        goodput = start_goodput() if cycle is None else cycle.live_goodput(start_goodput)
        if goodput is not None:
            goodput.follow_iteration(lambda: state.iteration)

        with managed_span(SpanGroup.JOB, semconv.STARTUP_DATALOADER_SPAN, is_goodput_span=True):
            hooks.at_startup("dataloader")
            train_data, valid_data = build_train_valid_datasets(
                config.data, config.model.seq_length, config.training.seed
            )
            train_batches = micro_batches(train_data, state.consumed_samples, config.training, env)

        log = TrainingLog(config.logging, config.training, config.model, telemetry.meter)
        exits = ExitConditions(config.exit, entry.pretrain_entry, exit_signal)
        wait_spans, autograd_waits = wait_markers(state.model)
        watchdog = hang_watchdog(
            telemetry,
            config.telemetry.hang_timeout_s,
            wait_spans=wait_spans,
            autograd_waits=autograd_waits,
        )
        train_iters = config.training.train_iters
        if state.iteration < train_iters:
            phases.start_train()
            exit_reason = train(
                config,
                env,
                phases,
                state,
                train_batches,
                valid_data,
                log,
                exits,
                goodput,
                watchdog,
                cycle,
            )
            if exit_reason is None:
                phases.end_train()
        else:
            print_rank_0(
                f"nothing to train: iteration {state.iteration} >= --train-iters {train_iters}"
            )
    except BaseException as exc:
        if cycle is not None:
            cycle.unwinding(exc)
        never_trained = phases.state in ("job", "startup")
        _shutdown(phases, exc)  # the trace records how the run ended
        if never_trained and isinstance(exc, Exception) and cycle is None:
            # A start that failed leaves the disk as it found it; an interrupted one
            # (Ctrl-C, a handler's SystemExit) keeps what it wrote, as any ending does.
            # A cycle of an in-process restart keeps it: the job goes on.
            footprint.undo()
        raise
    finally:
        if goodput is not None:  # its gauges outlive this call; the model must not
            goodput.stop_following()
    _shutdown(phases)

    print_telemetry_summary(telemetry, config.telemetry)
    return TrainingResult(
        state.iteration, state.consumed_samples, log.reported, telemetry.trace_file, exit_reason
    )


def _load_dir(checkpoint: Any, cycle: Cycle | None) -> str | None:
    """Where this start resumes from: ``--load``; for a restarted cycle without one, the
    job's own ``--save`` once it holds a checkpoint (the progress a fault must not cost)."""
    if checkpoint.load or cycle is None or cycle.index == 0 or not checkpoint.save:
        return checkpoint.load
    return checkpoint.save if has_checkpoint(checkpoint.save) else None


def _shutdown(phases: SpanPhases, cause: BaseException | None = None) -> None:
    """Fire ``shutdown``, never masking the exception in flight.

    ``cause`` is that exception: the lifecycle records it on the spans it ends.
    A hard-signal hook may already have terminated the lifecycle before a
    user's handler raised ``SystemExit``: ``shutdown`` is a no-op row in
    ``terminated``, and that ``SystemExit`` propagates.
    """
    try:
        phases.shutdown(cause)
    except Exception:  # noqa: BLE001 -- never replace the exception that ended the run
        _log.warning("telemetry shutdown failed; the run's own outcome stands", exc_info=True)


def train(
    config: JobConfig,
    env: DistributedEnv,
    phases: SpanPhases,
    state: TrainState,
    train_batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    valid_data: Any,
    log: TrainingLog,
    exits: ExitConditions,
    goodput: LiveGoodput | None = None,
    watchdog: Watchdog = NO_WATCHDOG,
    cycle: Cycle | None = None,
) -> str | None:
    """Train from ``state.iteration`` to ``--train-iters``.

    ``goodput`` (the live goodput metrics, when telemetry records them) gets
    its figures saved beside each checkpoint, for a resumed run to carry on.
    The hang ``watchdog`` (if any) watches the loop and hears once per
    finished pass, as does NVRx under an in-process restart (``cycle``).
    Returns why it stopped early, or None when it ran to the end.
    """
    hooks = FaultInjection.from_env()
    first_iteration = state.iteration
    exit_reason = None
    state.model.train()

    training, evaluation, checkpoint = config.training, config.eval, config.checkpoint
    with watchdog.watching(state.iteration):
        while state.iteration < training.train_iters and exit_reason is None:
            phases.step(state.iteration)
            with managed_span(
                SpanGroup.STEP,
                semconv.ITERATION_SPAN,
                is_goodput_span=True,
                **{semconv.ITERATION: state.iteration},
            ) as span:
                with _first_iteration_span(state.iteration == first_iteration):
                    step = train_step(training, config.optimizer, state, train_batches, hooks)
                if is_span_group_enabled(SpanGroup.STEP):  # the stamps cost a host sync
                    safe_set_span_attributes(span, step.span_attributes())
                state.iteration += 1
                state.consumed_samples += training.global_batch_size
                # Inside the iteration span, so the iteration's log line carries it.
                log.record(state.iteration, state.consumed_samples, step)
            if evaluation.eval_interval and state.iteration % evaluation.eval_interval == 0:
                evaluate_and_print(evaluation, training, env, state, valid_data)
            if checkpoint.is_save_iteration(state.iteration):
                _save(config, env, state, goodput, hooks)
            exit_reason = exits.check(state.iteration)
            # A finished pass, its evaluation and save included: the heartbeat.
            watchdog.progress(state.iteration - 1)
            if cycle is not None:
                cycle.ping()

    if checkpoint.save and not checkpoint.is_save_iteration(state.iteration):
        _save(config, env, state, goodput, hooks)
    if exit_reason is not None:
        print_rank_0(f"exiting program at iteration {state.iteration}: {exit_reason}")
    return exit_reason


def train_step(
    training: TrainingConfig,
    optimizer_config: OptimizerConfig,
    state: TrainState,
    train_batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    hooks: FaultInjection,
) -> StepResult:
    """Forward and backward over ``--global-batch-size`` samples, then one optimizer step."""
    started = time.perf_counter()
    model, optimizer = state.model, state.optimizer
    optimizer.zero_grad(set_to_none=True)
    losses = []
    num_microbatches = training.num_microbatches
    for microbatch in range(num_microbatches):
        with managed_span(SpanGroup.FORWARD_BACKWARD, semconv.FORWARD_BACKWARD_SPAN):
            with managed_span(MegatronSpanGroup.DATA_LOADING, semconv.GET_BATCH_SPAN):
                tokens, labels = next(train_batches)
            # DDP all-reduces gradients on the last micro-batch's backward only.
            last = microbatch == num_microbatches - 1
            with grad_sync(model, enabled=last, iteration=state.iteration):
                with managed_span(MegatronSpanGroup.MICROBATCH, semconv.MICROBATCH_FORWARD_SPAN):
                    hooks.before_forward(state.iteration)
                    loss = model(tokens, labels)
                with managed_span(MegatronSpanGroup.MICROBATCH, semconv.MICROBATCH_BACKWARD_SPAN):
                    (loss / num_microbatches).backward()
            losses.append(loss.detach())

    with managed_span(SpanGroup.OPTIMIZER, semconv.OPTIMIZER_SPAN):
        clip_grad = optimizer_config.clip_grad
        max_norm = clip_grad if clip_grad > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        learning_rate = optimizer.param_groups[0]["lr"]
        skipped = not torch.isfinite(grad_norm).item()
        if not skipped:
            optimizer.step()
            state.scheduler.step()
    return StepResult(
        loss=torch.stack(losses).mean(),
        grad_norm=grad_norm.detach(),
        learning_rate=learning_rate,
        skipped=skipped,
        duration_s=time.perf_counter() - started,
    )


def evaluate_and_print(
    evaluation: EvalConfig,
    training: TrainingConfig,
    env: DistributedEnv,
    state: TrainState,
    valid_data: Any,
) -> float:
    """Mean LM loss over ``--eval-iters`` validation micro-batches per rank.

    The same batches every time, so successive validation losses compare.
    """
    model = state.model
    batches = micro_batches(valid_data, 0, training, env)
    model.eval()
    with managed_span(
        SpanGroup.EVALUATE, semconv.EVALUATE_SPAN, **{semconv.ITERATION: state.iteration}
    ) as span:
        total = torch.zeros((), device=env.device)
        with torch.no_grad():
            for eval_step in range(evaluation.eval_iters):
                with managed_span(
                    SpanGroup.EVALUATE,
                    semconv.EVALUATE_STEP,
                    **{semconv.EVALUATE_STEP: eval_step},
                ):
                    tokens, labels = next(batches)
                    total += model(tokens, labels)
        loss = all_reduce_mean(total / evaluation.eval_iters).item()
        safe_set_span_attributes(span, {semconv.EVALUATE_LOSS: loss})
    model.train()
    line = (
        f" validation loss at iteration {state.iteration} | lm loss value: {loss:.6E} |"
        f" lm loss PPL: {math.exp(min(loss, 20.0)):.6E} |"
    )
    print_rank_0("-" * len(line) + "\n" + line + "\n" + "-" * len(line))
    return loss


def setup_model_and_optimizer(
    model_config: ModelConfig, optimizer_config: OptimizerConfig, env: DistributedEnv
) -> TrainState:
    gpt = GPTConfig(
        vocab_size=VOCAB_SIZE,
        seq_length=model_config.seq_length,
        num_layers=model_config.num_layers,
        hidden_size=model_config.hidden_size,
        num_attention_heads=model_config.num_attention_heads,
    )
    model = wrap_model(GPTModel(gpt), env)
    optimizer, scheduler = build_optimizer(model, optimizer_config)
    return TrainState(model, optimizer, scheduler)


def _first_iteration_span(is_first: bool) -> Any:
    if not is_first:
        return nullcontext()
    return managed_span(
        MegatronSpanGroup.FIRST_ITERATION, semconv.FIRST_ITERATION_SPAN, is_goodput_span=True
    )


def _save(
    config: JobConfig,
    env: DistributedEnv,
    state: TrainState,
    goodput: LiveGoodput | None,
    hooks: FaultInjection,
) -> None:
    with (
        managed_span(
            SpanGroup.CHECKPOINT,
            semconv.CHECKPOINT_SAVE_SPAN,
            is_goodput_span=True,
            **{semconv.ITERATION: state.iteration},
        ),
        saving(goodput),
    ):
        hooks.in_save(state.iteration)
        sidecar = checkpoint_sidecar(goodput, state.iteration)
        save_checkpoint(config.checkpoint.save, state, config, env.is_rank_0, sidecar)
