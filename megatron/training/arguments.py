"""Command-line arguments: Megatron-LM's flag names, checked before anything starts.

Flag names and meanings are Megatron-LM's, so a command line reads the same
here as upstream. Every check runs at parse time, before a process group, a
thread or a file exists, and each failure is one ``parser.error`` line naming
the flag (exit status 2): a job that is going to fail on its arguments should
fail in the first second, not after model initialization on 1000 GPUs.

:func:`parse_args` returns a frozen, typed
:class:`~megatron.training.job_config.JobConfig`, built once the checks have
passed: the argparse namespace never leaves this module, and the values the
rest of the trainer reads (including the telemetry settings and their run id,
resolved here once) are the ones that were checked.

``--demo`` is a preset, not a mode: it only changes defaults, so any flag given
explicitly still wins and the run takes exactly the code path a normal run
takes.

Notes on choices that differ from, or are not covered by, upstream:

* ``--save-interval`` without ``--save`` is allowed (as in Megatron-LM): no
  checkpoint is written, but the interval still decides where the telemetry
  trace is cut into per-interval traces.
* ``--save`` without ``--save-interval`` (or with ``--save-interval 0``, which
  Megatron-LM also reads as "no periodic saves") writes only the final
  checkpoint (at the end of training or on an early exit), and the loop is one
  trace.
* ``--save`` is created, a probe file written and removed in it, and what
  the check created removed again, at parse time, so a read-only or
  misplaced checkpoint directory stops the job in the first second instead
  of at its first save, hours in, and a job refused later (a corrupt
  checkpoint) leaves nothing behind (see ``start_footprint``).
* An error is one line and a pointer to ``--help``: argparse's usage block
  (over twenty lines here) buried the one line that matters.
* ``--exit-duration-in-mins`` takes a float (upstream: int), so a test can ask
  for seconds.
* The ``--inprocess-*`` flags are Megatron-LM's (``_add_inprocess_restart_args``),
  same names, defaults and meanings, checked here against the orderings NVIDIA
  Resiliency Extension's ``inprocess.Wrapper`` requires (a soft timeout under the
  hard one...), so a bad combination is one line at parse time rather than an
  NVRx assertion at the first call. ``--inprocess-max-iterations`` is honoured
  (Megatron-LM parses it and never uses it). ``--inprocess-granularity node``
  groups a node's ranks by ``LOCAL_WORLD_SIZE`` (Megatron-LM counts CUDA devices).
  Spare ranks (an ``--inprocess-active-world-size`` under the world size) are not
  supported: one line says so. Without NVRx installed ``--inprocess-restart`` is one
  line naming the extra.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import NoReturn

from megatron.core.telemetry import TelemetryConfig, TelemetryConfigError, add_telemetry_args
from megatron.training.checkpointing import not_a_directory, save_directory_problem
from megatron.training.data import data_file_problem
from megatron.training.distributed import world_size_from_env
from megatron.training.fault_injection import FaultInjection
from megatron.training.job_config import (
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    ExitConfig,
    InprocessConfig,
    JobConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    TrainingConfig,
)
from megatron.training.requirements import missing_for_inprocess_restart

__all__ = ["DEMO_PRESET", "DEMO_SAVE_DIR", "build_parser", "parse_args"]

PROG = "megatron-pretrain"

DEMO_SAVE_DIR = "runs/demo"

# Under a minute on one CPU core (one torch thread): the loss falls from ~5.5 to well under 1.
DEMO_PRESET = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 64,
    "micro_batch_size": 8,
    "global_batch_size": 16,
    "train_iters": 2000,
    "lr": 3e-3,
    "min_lr": 3e-4,
    "lr_warmup_iters": 20,
    "log_interval": 100,
    "eval_interval": 500,
    "eval_iters": 5,
    "save": DEMO_SAVE_DIR,
    "save_interval": 500,
    "otel_enabled": True,
    "otel_span_groups": "per_step",
}


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


_DEFAULT = "Default: %(default)s."

# argparse names the type in its error ("invalid _positive_int value"), so give
# each checker the name of what it accepts.
_positive_int.__name__ = "positive int"
_non_negative_int.__name__ = "non-negative int"
_non_negative_float.__name__ = "non-negative float"
_positive_float.__name__ = "positive float"


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, without the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\nSee '{self.prog} --help' for every flag.\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Pretrain a small GPT, Megatron-LM style, with OpenTelemetry spans.",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="Preset for a CPU run of 2000 iterations of a tiny GPT, under a minute on a "
        "free CPU core (one torch thread unless OMP_NUM_THREADS is set), with telemetry on "
        "(per_step span groups), "
        f"checkpoints in ./{DEMO_SAVE_DIR} (emptied at start unless --save/--load is given). "
        "Explicit flags override the preset.",
    )

    model = parser.add_argument_group("model")
    model.add_argument("--num-layers", type=_positive_int, default=2, help=_DEFAULT)
    model.add_argument("--hidden-size", type=_positive_int, default=64, help=_DEFAULT)
    model.add_argument("--num-attention-heads", type=_positive_int, default=4, help=_DEFAULT)
    model.add_argument("--seq-length", type=_positive_int, default=64, help=_DEFAULT)

    training = parser.add_argument_group("training")
    training.add_argument("--micro-batch-size", type=_positive_int, default=4, help=_DEFAULT)
    training.add_argument(
        "--global-batch-size",
        type=_positive_int,
        default=None,
        help="Samples per iteration over all ranks; a multiple of micro-batch-size x "
        "data-parallel size (the quotient is the number of gradient-accumulation steps). "
        "Default: micro-batch-size x data-parallel size.",
    )
    training.add_argument("--train-iters", type=_positive_int, default=100, help=_DEFAULT)
    training.add_argument("--lr", type=_non_negative_float, default=1e-3, help=_DEFAULT)
    training.add_argument(
        "--min-lr",
        type=_non_negative_float,
        default=1e-4,
        help="Floor of the cosine decay. " + _DEFAULT,
    )
    training.add_argument(
        "--lr-warmup-iters",
        type=_non_negative_int,
        default=10,
        help="Linear warmup, then cosine decay to --min-lr at --train-iters. " + _DEFAULT,
    )
    training.add_argument(
        "--clip-grad",
        type=_non_negative_float,
        default=1.0,
        help="Gradient-norm clip; 0: off. " + _DEFAULT,
    )
    training.add_argument("--seed", type=int, default=1234, help=_DEFAULT)

    logging = parser.add_argument_group("logging and evaluation")
    logging.add_argument("--log-interval", type=_positive_int, default=10, help=_DEFAULT)
    logging.add_argument(
        "--eval-interval",
        type=_positive_int,
        default=None,
        help="Evaluate every this many iterations. Default: never.",
    )
    logging.add_argument(
        "--eval-iters",
        type=_positive_int,
        default=5,
        help="Validation micro-batches per rank and evaluation. " + _DEFAULT,
    )

    checkpoint = parser.add_argument_group("checkpointing")
    checkpoint.add_argument("--save", default=None, help="Checkpoint directory to write.")
    checkpoint.add_argument("--load", default=None, help="Checkpoint directory to resume from.")
    checkpoint.add_argument(
        "--save-interval",
        type=_non_negative_int,
        default=None,
        help="Save every this many iterations; also where the telemetry trace is cut. "
        "0 or unset: only a final checkpoint, and one trace for the whole loop.",
    )

    exit_group = parser.add_argument_group("exiting early")
    exit_group.add_argument(
        "--exit-interval",
        type=_positive_int,
        default=None,
        help="Save and exit 0 when the iteration number is a multiple of this.",
    )
    exit_group.add_argument(
        "--exit-duration-in-mins",
        type=_positive_float,
        default=None,
        help="Save and exit 0 once the job has run this long (agreed across ranks).",
    )
    exit_group.add_argument(
        "--exit-signal-handler",
        action="store_true",
        help="On SIGTERM, finish the iteration, save and exit 0 instead of dying.",
    )

    _add_inprocess_restart_args(parser)

    data = parser.add_argument_group("data (exactly one)")
    data.add_argument(
        "--mock-data",
        action="store_true",
        help="Synthetic structured sequences (learnable in a minute on a CPU).",
    )
    data.add_argument("--data-path", default=None, help="A file, trained on as raw bytes.")

    add_telemetry_args(parser)
    return parser


def _add_inprocess_restart_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's in-process restart flags: its names, defaults and help."""
    group = parser.add_argument_group("in-process restart (NVIDIA Resiliency Extension)")
    group.add_argument(
        "--inprocess-restart",
        action="store_true",
        help="On a fault on any rank, call pretrain() again in the same processes, resuming "
        "from the last checkpoint (needs the inprocess extra).",
    )
    group.add_argument(
        "--inprocess-max-iterations",
        type=_positive_int,
        default=None,
        help="Maximum number of in-process restart iterations (cycles, the first included); "
        "the job then ends with an error. Default: no limit.",
    )
    seconds = {
        "monitor-thread-interval": (1.0, "Monitoring interval for the monitoring thread."),
        "monitor-process-interval": (1.0, "Monitoring interval for the monitoring process."),
        "progress-watchdog-interval": (
            1.0,
            "Interval for automatic progress watchdog timestamp updates.",
        ),
        "heartbeat-interval": (30.0, "Monitoring interval for detecting unresponsive ranks."),
        "soft-timeout": (60.0, "Soft progress timeout: the rank's cycle is interrupted."),
        "hard-timeout": (90.0, "Hard progress timeout: the rank is terminated."),
        "heartbeat-timeout": (60.0, "Timeout for a missing rank detection heartbeat."),
        "barrier-timeout": (120.0, "Timeout for the internal distributed barrier."),
        "completion-timeout": (120.0, "Timeout for the barrier on completion on all ranks."),
        "last-call-wait": (
            1.0,
            "Time for other ranks to report concurrent terminal failures.",
        ),
        "termination-grace-time": (
            1.0,
            "Interval between SIGTERM and SIGKILL issued on hard timeout.",
        ),
    }
    for name, (default, text) in seconds.items():
        group.add_argument(
            f"--inprocess-{name}",
            type=_positive_float,
            default=default,
            help=f"{text} Seconds. " + _DEFAULT,
        )
    group.add_argument(
        "--inprocess-granularity",
        choices=("node", "rank"),
        default="node",
        help="Restart a node's ranks together (node) or each rank alone (rank). " + _DEFAULT,
    )
    group.add_argument(
        "--inprocess-active-world-size",
        type=_positive_int,
        default=world_size_from_env(),
        help="Ranks initially executing the workload (the rest would be spares; this trainer "
        "needs all of them). Default: the world size.",
    )
    group.add_argument(
        "--inprocess-empty-cuda-cache",
        action="store_true",
        help="Release unoccupied cached GPU memory at every in-process restart (nothing on a CPU).",
    )


#: NVRx's ``Wrapper`` requires each left value under the right one (its ``enforce_value``s).
_INPROCESS_ORDER = (
    ("inprocess_soft_timeout", "inprocess_hard_timeout"),
    ("inprocess_hard_timeout", "inprocess_barrier_timeout"),
    ("inprocess_monitor_process_interval", "inprocess_barrier_timeout"),
    ("inprocess_heartbeat_timeout", "inprocess_barrier_timeout"),
    ("inprocess_heartbeat_interval", "inprocess_heartbeat_timeout"),
    ("inprocess_monitor_process_interval", "inprocess_heartbeat_timeout"),
    ("inprocess_monitor_process_interval", "inprocess_soft_timeout"),
    ("inprocess_monitor_thread_interval", "inprocess_soft_timeout"),
    ("inprocess_progress_watchdog_interval", "inprocess_soft_timeout"),
)


def _inprocess_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> InprocessConfig:
    """The in-process restart section; on a bad value one line (exit 2)."""
    names = [f.name for f in dataclasses.fields(InprocessConfig)]
    config = InprocessConfig(**{name: getattr(args, name) for name in names})
    if not config.inprocess_restart:
        return config
    for low, high in _INPROCESS_ORDER:
        if not getattr(config, low) < getattr(config, high):
            parser.error(
                f"--{low.replace('_', '-')} ({getattr(config, low):g}) must be less than "
                f"--{high.replace('_', '-')} ({getattr(config, high):g}), as NVRx requires"
            )
    world_size = world_size_from_env()
    if config.inprocess_active_world_size != world_size:
        parser.error(
            f"--inprocess-active-world-size ({config.inprocess_active_world_size}) must equal "
            f"the world size ({world_size}): this trainer keeps no spare ranks"
        )
    if (missing := missing_for_inprocess_restart()) is not None:
        parser.exit(2, f"{parser.prog}: error: {missing}\n")  # one line: no flag to fix
    return config


def parse_args(argv: Sequence[str] | None = None) -> JobConfig:
    """Parse and check ``argv`` into the job's config; on any problem print one line and exit 2.

    The argparse namespace never leaves this module: what the rest of the
    trainer reads is the frozen :class:`~megatron.training.job_config.JobConfig`.
    """
    parser = build_parser()
    preview, _ = parser.parse_known_args(argv)
    if preview.demo:
        parser.set_defaults(**DEMO_PRESET)
    args = parser.parse_args(argv)
    # The demo owns its default directory and starts it empty; a directory the
    # user named (even the same one), or a --load, turns that off.
    fresh_save_dir = args.demo and preview.save is None and preview.load is None
    return _job_config(parser, args, fresh_save_dir)


def _job_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace, fresh_save_dir: bool
) -> JobConfig:
    """Check ``args`` (in the order the errors are reported) and build the config."""
    dp_size = world_size_from_env()
    mock_data = args.mock_data or (args.demo and not args.data_path)
    if args.hidden_size % args.num_attention_heads:
        parser.error(
            f"--hidden-size ({args.hidden_size}) must be divisible by "
            f"--num-attention-heads ({args.num_attention_heads})"
        )
    global_batch_size = args.global_batch_size
    if global_batch_size is None:
        global_batch_size = args.micro_batch_size * dp_size
    if global_batch_size % (args.micro_batch_size * dp_size):
        parser.error(
            f"--global-batch-size ({global_batch_size}) must be a multiple of "
            f"--micro-batch-size ({args.micro_batch_size}) x data-parallel size ({dp_size})"
        )
    if args.min_lr > args.lr:
        parser.error(f"--min-lr ({args.min_lr}) must not exceed --lr ({args.lr})")
    if mock_data == bool(args.data_path):
        parser.error("give exactly one of --mock-data and --data-path")
    if args.data_path and (problem := data_file_problem(args.data_path, args.seq_length)):
        parser.error(problem)
    for flag, path in (("--save", args.save), ("--load", args.load)):
        if path is not None and not_a_directory(path):
            parser.error(f"{flag} {path}: exists and is not a directory")
    try:
        telemetry = TelemetryConfig.from_args(args)
    except TelemetryConfigError as exc:
        parser.error(str(exc))
    try:
        FaultInjection.from_env()
    except ValueError as exc:
        parser.error(str(exc))
    inprocess = _inprocess_config(parser, args)
    # Last: the slowest check (it touches the disk); it leaves nothing behind.
    if args.save is not None and (problem := save_directory_problem(args.save)):
        parser.error(problem)
    return JobConfig(
        model=ModelConfig(
            num_layers=args.num_layers,
            hidden_size=args.hidden_size,
            num_attention_heads=args.num_attention_heads,
            seq_length=args.seq_length,
        ),
        training=TrainingConfig(
            micro_batch_size=args.micro_batch_size,
            global_batch_size=global_batch_size,
            train_iters=args.train_iters,
            seed=args.seed,
            data_parallel_size=dp_size,
            num_microbatches=global_batch_size // (args.micro_batch_size * dp_size),
        ),
        optimizer=OptimizerConfig(
            lr=args.lr,
            min_lr=args.min_lr,
            lr_warmup_iters=args.lr_warmup_iters,
            clip_grad=args.clip_grad,
            lr_decay_iters=args.train_iters,
        ),
        data=DataConfig(mock_data=mock_data, data_path=args.data_path),
        logging=LoggingConfig(log_interval=args.log_interval),
        eval=EvalConfig(eval_interval=args.eval_interval, eval_iters=args.eval_iters),
        checkpoint=CheckpointConfig(
            save=args.save,
            load=args.load,
            save_interval=args.save_interval,
            fresh_save_dir=fresh_save_dir,
        ),
        exit=ExitConfig(
            exit_interval=args.exit_interval,
            exit_duration_in_mins=args.exit_duration_in_mins,
            exit_signal_handler=args.exit_signal_handler,
        ),
        inprocess=inprocess,
        telemetry=telemetry,
        demo=args.demo,
    )
