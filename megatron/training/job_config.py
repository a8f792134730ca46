"""The typed, frozen job configuration: what one run was asked to do, in sections.

:func:`megatron.training.arguments.parse_args` builds a :class:`JobConfig`
once, after every check has passed; nothing changes it afterwards (every
section is a frozen dataclass), so a value read at iteration 10 000 is the
value the job was validated with. Each module takes the section it uses
(the optimizer its :class:`OptimizerConfig`, the early-exit check its
:class:`ExitConfig`...), never the whole command line.

Field names are Megatron-LM's argument names (``--train-iters`` is
``training.train_iters``), so a reader who knows upstream's ``args.X`` finds
``X`` in its section. Every field is either one flag's value or *derived*:
declared with :func:`derived`, which records why it exists, and computed by
the parser from other flags or the environment (for instance the number of
gradient-accumulation steps). A flag whose default depends on another value
(``--global-batch-size``) is resolved by the parser, so no field is ever
``None`` for "work it out later".

This module is declarations only; it reads no flag and no environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from megatron.core.telemetry import TelemetryConfig

__all__ = [
    "FLAG_SECTIONS",
    "CheckpointConfig",
    "DataConfig",
    "EvalConfig",
    "ExitConfig",
    "InprocessConfig",
    "JobConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimizerConfig",
    "TrainingConfig",
    "derived",
    "derived_fields",
]

_DERIVED = "derived"


def derived(reason: str) -> Any:
    """Declare a field no flag sets: the parser computes it, for ``reason``."""
    return field(metadata={_DERIVED: reason})


def derived_fields(section: type) -> dict[str, str]:
    """``{field name: why it exists}`` for the derived fields of a section class."""
    return {f.name: f.metadata[_DERIVED] for f in fields(section) if _DERIVED in f.metadata}


@dataclass(frozen=True)
class ModelConfig:
    """The model's shape; a checkpoint is only loaded into the shape it was saved with."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int


@dataclass(frozen=True)
class TrainingConfig:
    """How many iterations, over how many samples each, and the seed."""

    micro_batch_size: int
    # --global-batch-size, resolved: given, or micro-batch-size x data-parallel size.
    global_batch_size: int
    train_iters: int
    seed: int
    data_parallel_size: int = derived(
        "the world size torchrun announces (every rank is a data-parallel rank here); "
        "the batch arithmetic and the per-rank TFLOP/s need it before any process group exists"
    )
    num_microbatches: int = derived(
        "global-batch-size / (micro-batch-size x data-parallel size): the gradient-accumulation "
        "steps of one iteration, checked to divide exactly at parse time"
    )


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW's learning rate, its warmup + cosine schedule, and gradient clipping."""

    lr: float
    min_lr: float
    lr_warmup_iters: int
    clip_grad: float
    lr_decay_iters: int = derived(
        "where the cosine reaches --min-lr; Megatron-LM's --lr-decay-iters, which defaults to "
        "--train-iters and has no flag here, so the schedule never reads the training section"
    )


@dataclass(frozen=True)
class DataConfig:
    """Where samples come from: exactly one of the synthetic source and a file."""

    # True under --demo when no --data-path is given (the preset trains on mock data).
    mock_data: bool
    data_path: str | None


@dataclass(frozen=True)
class LoggingConfig:
    """How often the loop prints its log line and records the training metrics."""

    log_interval: int


@dataclass(frozen=True)
class EvalConfig:
    """Validation: how often, and over how many micro-batches per rank."""

    eval_interval: int | None
    eval_iters: int


@dataclass(frozen=True)
class CheckpointConfig:
    """Where checkpoints are written and read, and how often; also where traces are cut."""

    save: str | None
    load: str | None
    save_interval: int | None
    fresh_save_dir: bool = derived(
        "--demo owns its default directory and starts it empty; a directory the user named "
        "(even the same one), or a --load, turns that off"
    )

    @property
    def interval(self) -> int:
        """``--save-interval`` with "unset" and ``0`` both meaning: no periodic saves."""
        return self.save_interval or 0

    def is_save_iteration(self, iteration: int) -> bool:
        """Whether a periodic checkpoint is written after ``iteration`` completes."""
        return bool(self.save and self.interval and iteration % self.interval == 0)


@dataclass(frozen=True)
class ExitConfig:
    """Megatron-LM's reasons to save and stop before ``--train-iters`` (exit status 0)."""

    exit_interval: int | None
    exit_duration_in_mins: float | None
    exit_signal_handler: bool


@dataclass(frozen=True)
class InprocessConfig:
    """Megatron-LM's in-process restart (NVIDIA Resiliency Extension's ``inprocess.Wrapper``):
    on a fault, ``pretrain()`` is called again in the same processes. Times in seconds."""

    inprocess_restart: bool
    inprocess_max_iterations: int | None  # restart iterations (cycles) allowed; None: no limit
    inprocess_monitor_thread_interval: float
    inprocess_monitor_process_interval: float
    inprocess_progress_watchdog_interval: float
    inprocess_heartbeat_interval: float
    inprocess_soft_timeout: float
    inprocess_hard_timeout: float
    inprocess_heartbeat_timeout: float
    inprocess_barrier_timeout: float
    inprocess_completion_timeout: float
    inprocess_last_call_wait: float
    inprocess_termination_grace_time: float
    inprocess_granularity: str  # "node" or "rank": which ranks restart together
    inprocess_active_world_size: int
    inprocess_empty_cuda_cache: bool


@dataclass(frozen=True)
class JobConfig:
    """Everything one ``pretrain()`` was asked to do, checked, in sections."""

    model: ModelConfig
    training: TrainingConfig
    optimizer: OptimizerConfig
    data: DataConfig
    logging: LoggingConfig
    eval: EvalConfig
    checkpoint: CheckpointConfig
    exit: ExitConfig
    inprocess: InprocessConfig
    # Resolved once, at parse time: flags over MEGATRON_OTEL_* over NEMO_LENS_*
    # over defaults, including the run id every later reader must agree on.
    telemetry: TelemetryConfig
    demo: bool  # --demo: the entry point ends by drawing the trace


#: The sections built from flags, by the field of :class:`JobConfig` holding each.
FLAG_SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "training": TrainingConfig,
    "optimizer": OptimizerConfig,
    "data": DataConfig,
    "logging": LoggingConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
    "exit": ExitConfig,
    "inprocess": InprocessConfig,
}
