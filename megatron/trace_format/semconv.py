"""The telemetry's vocabulary: span names, attribute keys and report categories, once.

Like OpenTelemetry's semantic-conventions modules, this module only names
things. The lifecycle (:mod:`megatron.training.telemetry_spans`) writes these
names, the base layer counts them (:mod:`~megatron.core.telemetry.tally`) and
``megatron-trace`` reads them back, so each is spelled in one place and a
grep for any of them finds its one definition. Every attribute of the
job-level spans and every resource key is here, even where one module alone
writes it, so the wire format reads in one place; the trainer's own phase
and step span names, each used by the trainer alone, stay in the trainer.

The strings are the wire format: traces already written and the tests
(which assert it) hold them as they are, so a constant's *value* never
changes; only its Python name may.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

__all__ = [
    "BADPUT_CATEGORIES",
    "BADPUT_CATEGORY_ATTRIBUTE",
    "CHECKPOINT_DIR",
    "CHECKPOINT_EXIT_FINALIZE_SPAN",
    "CHECKPOINT_FINALIZE_SPAN",
    "CHECKPOINT_LOAD_SPAN",
    "CHECKPOINT_SAVE_SPAN",
    "CHECKPOINT_SPAN_PREFIX",
    "CONTAINER_LOAD_SPAN",
    "DL_RANK",
    "DL_WORLD_SIZE",
    "ERROR_TYPE",
    "EVALUATE_LOSS",
    "EVALUATE_SPAN",
    "EVALUATE_STEP",
    "FIRST_ITERATION_SPAN",
    "FORWARD_BACKWARD_SPAN",
    "GET_BATCH_SPAN",
    "GOODPUT_GAUGES",
    "GRAD_SYNC_BUCKETS",
    "GRAD_SYNC_FINISH_SPAN",
    "GRAD_SYNC_START_SPAN",
    "HANG_FRAME",
    "HANG_LAST_ITERATION",
    "HANG_LAST_PROGRESS",
    "HANG_RECOVERED_SPAN",
    "HANG_SPAN",
    "HANG_STACKS",
    "HANG_STALLED_S",
    "HANG_STALLED_SPAN",
    "HANG_STALLED_SPAN_ID",
    "HANG_TIMEOUT_S",
    "HANG_WAITING",
    "HEARTBEAT_METRIC",
    "HEARTBEAT_PERIOD_S",
    "HOST_NAME",
    "INTERVAL_FIRST_ITERATION",
    "INTERVAL_INDEX",
    "INTERVAL_LAST_ITERATION",
    "INTERVAL_REROOTED",
    "INTERVAL_SPAN",
    "IS_GOODPUT_SPAN",
    "ITERATION",
    "ITERATION_SPAN",
    "ITERATION_TIME_SOURCES",
    "ITERATION_TIME_SOURCE_ATTRIBUTE",
    "LAUNCH_SCRIPT_SPAN",
    "LOG_INTERVAL",
    "LOST_PROGRESS_COUNTER",
    "MEGATRON_HANG_DURATION_S",
    "MEGATRON_HANG_SUSPECTED",
    "MEGATRON_JOB_STATE",
    "MEGATRON_STRAGGLER_NAMED",
    "MEGATRON_STRAGGLER_SCORE",
    "MEGATRON_TRAINING_BADPUT_S",
    "MEGATRON_TRAINING_CHECKPOINT_SAVE_START_TIME",
    "MEGATRON_TRAINING_GOODPUT_FRACTION",
    "MEGATRON_TRAINING_GOODPUT_S",
    "MEGATRON_TRAINING_GRAD_NORM",
    "MEGATRON_TRAINING_ITERATION",
    "MEGATRON_TRAINING_ITERATION_TIME_S",
    "MEGATRON_TRAINING_LEARNING_RATE",
    "MEGATRON_TRAINING_LOSS",
    "MEGATRON_TRAINING_MEMORY_ALLOCATED_GB",
    "MEGATRON_TRAINING_SKIPPED_ITERS",
    "MEGATRON_TRAINING_STEP_DURATION_MS",
    "MEGATRON_TRAINING_THROUGHPUT_TFLOPS",
    "MEGATRON_TRAINING_TOKENS_PER_SEC",
    "MEGATRON_TRAINING_WALL_CLOCK_S",
    "MICROBATCH_BACKWARD_SPAN",
    "MICROBATCH_FORWARD_SPAN",
    "MODEL_TYPE",
    "NEMO_LENS_JOB_UUID",
    "NEMO_LENS_RUN_UUID",
    "NEMO_RUN_ID",
    "NVRX_CYCLE",
    "NVRX_INPROCESS_ITERATION",
    "OPTIMIZER_SPAN",
    "PRE_STARTUP_SPAN",
    "PROCESS_PID",
    "PROGRESS_COUNTER",
    "RUN_ID",
    "SAVE_START_GAUGE",
    "SERVICE_INSTANCE_ID",
    "SERVICE_NAME",
    "SHUTDOWN_REASON",
    "SHUTDOWN_REASON_INPROCESS_RESTART",
    "SLURM_JOB_ID",
    "SLURM_RESTART_COUNT",
    "SLURM_TORCHELASTIC_RESTART_COUNT",
    "SPAN_CATEGORY",
    "SPAN_CUT_SHORT",
    "SPAN_TRUNCATED",
    "STALE_AFTER_S",
    "STARTUP_ARG_PARSE_SPAN",
    "STARTUP_DATALOADER_SPAN",
    "STARTUP_IMPORTS_SPAN",
    "STARTUP_INITIALIZE_SPAN",
    "STARTUP_INPROCESS_SETUP_SPAN",
    "STARTUP_MODEL_INIT_SPAN",
    "STARTUP_PHASE_PREFIX",
    "STARTUP_SPAN",
    "STRUCTURAL_SPAN_NAMES",
    "TORCHELASTIC_AGENT_ID",
    "TORCHELASTIC_AGENT_LOCAL_WORLD_SIZE",
    "WATCH_CORRUPT_LINES_COUNTER",
    "WATCH_GAUGES",
    "WATCH_LINES_COUNTER",
    "WATCH_SPANS",
    "WATCH_TORN_LINES",
    "Category",
    "Gauge",
]

# ---------------------------------------------------------------------------
# Span names: the job-level spans the lifecycle opens, and the trainer's spans
# the accounting reads.
# ---------------------------------------------------------------------------

#: Trace A: the time the job sat in the scheduler queue, backdated (Slurm start to launch).
PRE_STARTUP_SPAN = "pre_startup"
#: Trace B's root: launch (when known) or program start to the first training step.
STARTUP_SPAN = "megatron.startup"
#: The prefix of every child of ``megatron.startup``: the startup phases.
STARTUP_PHASE_PREFIX = "megatron.startup."
#: Child of startup: the launch script, from its start to just before ``srun``.
LAUNCH_SCRIPT_SPAN = "megatron.startup.launch_script"
#: Child of startup: from ``srun`` to the program's first line (the container's load).
CONTAINER_LOAD_SPAN = "megatron.startup.container_load"
#: The root of each trace C0..Cn: one checkpoint interval of the training loop.
INTERVAL_SPAN = "megatron.train"
#: One training iteration (loop pass), a child of its interval (``per_step`` groups).
ITERATION_SPAN = "megatron.train.iteration"
#: One checkpoint save, inside an interval.
CHECKPOINT_SAVE_SPAN = "megatron.checkpoint.save"
#: The checkpoint load of a resumed run, inside startup.
CHECKPOINT_LOAD_SPAN = "megatron.checkpoint.load"
#: One evaluation pass, inside an interval.
EVALUATE_SPAN = "megatron.evaluate"
#: One evaluation step inside it (span and attribute: the step's number).
EVALUATE_STEP = "megatron.evaluate.step"
#: Attribute of an evaluation: its mean loss.
EVALUATE_LOSS = "megatron.evaluate.loss"
#: Attribute of a checkpoint load: the directory it read.
CHECKPOINT_DIR = "megatron.checkpoint.dir"
#: Child of startup: program start to ``main()`` (the imports).
STARTUP_IMPORTS_SPAN = "megatron.startup.imports"
#: Child of startup: ``main()`` to ``pretrain()`` (parsing the arguments).
STARTUP_ARG_PARSE_SPAN = "megatron.startup.arg_parse"
#: Child of startup: ``pretrain()`` to the distributed setup done.
STARTUP_INITIALIZE_SPAN = "megatron.startup.initialize_megatron"
#: Child of startup, under an in-process restart: ``pretrain()``'s own setup for the
#: cycle (the rendezvous store of its restart iteration), before the distributed setup.
#: Megatron-LM's name.
STARTUP_INPROCESS_SETUP_SPAN = "megatron.startup.inprocess_setup"
#: Child of startup: building the model and optimizer (and loading a checkpoint).
STARTUP_MODEL_INIT_SPAN = "megatron.startup.model_init"
#: Child of startup: building the data iterators.
STARTUP_DATALOADER_SPAN = "megatron.startup.dataloader"
#: The first iteration of an incarnation (its warm-up), a goodput span.
FIRST_ITERATION_SPAN = "megatron.train.first_iteration"
#: Inside an iteration: the forward and backward passes of every microbatch.
FORWARD_BACKWARD_SPAN = "megatron.train.forward_backward"
#: Inside ``forward_backward``: fetching one microbatch.
GET_BATCH_SPAN = "megatron.train.get_batch"
#: Inside ``forward_backward``: one microbatch's forward pass.
MICROBATCH_FORWARD_SPAN = "megatron.microbatch.forward"
#: Inside ``forward_backward``: one microbatch's backward pass.
MICROBATCH_BACKWARD_SPAN = "megatron.microbatch.backward"
#: Inside an iteration: the optimizer step.
OPTIMIZER_SPAN = "megatron.train.optimizer"
#: The prefix of every checkpoint span. Megatron-LM writes more than the save and load
#: (``exposed_save`` around each save, bookkeeping such as ``reclaim_memory``,
#: ``timers_log``, ``ft_heartbeat``): the report counts their time as checkpoint time.
CHECKPOINT_SPAN_PREFIX = "megatron.checkpoint."
#: Megatron-LM, each loop pass: the non-blocking finalize of an earlier async save; an
#: async save is durable once a finalize after it ended.
CHECKPOINT_FINALIZE_SPAN = "megatron.checkpoint.save.finalize"
#: Megatron-LM, after the loop: the blocking finalize of the last async save.
CHECKPOINT_EXIT_FINALIZE_SPAN = "megatron.checkpoint.exit_finalize"
#: Inside ``forward_backward`` (``communication`` group, a DDP model): from the first
#: gradient bucket DDP hands its communication hook to the dispatch of the last;
#: Megatron-LM's name.
GRAD_SYNC_START_SPAN = "megatron.grad_sync.start"
#: From that dispatch until ``backward()`` has every bucket reduced: this rank's
#: wait for the other ranks; Megatron-LM's name.
GRAD_SYNC_FINISH_SPAN = "megatron.grad_sync.finish"
#: The hang watchdog's record of a stall, under the innermost open span, at detection.
HANG_SPAN = "megatron.hang"
#: The hang watchdog's record that a loop pass finished again after a stall.
HANG_RECOVERED_SPAN = "megatron.hang.recovered"

# ---------------------------------------------------------------------------
# Span attribute keys
# ---------------------------------------------------------------------------

#: True on every span the lifecycle opens (pre_startup, startup and its backdated
#: phases, the intervals) and on the trainer's spans Megatron-LM marks too (model
#: init, data loader, checkpoint load and save, the iteration spans); its name.
IS_GOODPUT_SPAN = "is_goodput_span"
#: On ``megatron.startup``: the model type the trainer was started with; Megatron-LM's name.
MODEL_TYPE = "megatron.model_type"
#: On ``megatron.train``: the interval's 0-based position within its incarnation.
INTERVAL_INDEX = "megatron.interval.index"
#: On ``megatron.train``: the first iteration the interval ran.
INTERVAL_FIRST_ITERATION = "megatron.interval.first_iteration"
#: On ``megatron.train``: the last iteration the interval ran.
INTERVAL_LAST_ITERATION = "megatron.interval.last_iteration"
#: On ``megatron.train``: True when a reroot closed it (so another interval followed),
#: False when ``end_train`` or ``shutdown`` did; a last interval saying True means
#: the next one was lost (the process was killed while it was open).
INTERVAL_REROOTED = "megatron.interval.rerooted"
#: The iteration a span belongs to: on iterations, checkpoint saves and loads, evaluations.
ITERATION = "megatron.iteration"
#: True on a span that was still open when telemetry shut down, and was ended then.
SPAN_CUT_SHORT = "megatron.span.cut_short"
#: nemo-lens's mark for the same: a span force-ended at telemetry shutdown.
SPAN_TRUNCATED = "nemo.span.truncated"
#: On ``megatron.grad_sync.start``: how many gradient buckets were reduced.
GRAD_SYNC_BUCKETS = "megatron.grad_sync.buckets"
#: On ``megatron.hang``: the last iteration that finished (absent: none yet).
HANG_LAST_ITERATION = "megatron.hang.last_iteration"
#: On both hang spans: seconds without progress (at detection; at recovery, in all).
HANG_STALLED_S = "megatron.hang.stalled_s"
#: On ``megatron.hang``: the timeout in force, in seconds.
HANG_TIMEOUT_S = "megatron.hang.timeout_s"
#: On ``megatron.hang``: when the last loop pass finished, epoch ns.
HANG_LAST_PROGRESS = "megatron.hang.last_progress_unix_nano"
#: On ``megatron.hang``: the name of the innermost open span, where it stalled.
HANG_STALLED_SPAN = "megatron.hang.span"
#: On ``megatron.hang``: that span's id (16 hex digits).
HANG_STALLED_SPAN_ID = "megatron.hang.span_id"
#: On ``megatron.hang``: the training thread's innermost Python frame, ``file:line in function``.
HANG_FRAME = "megatron.hang.frame"
#: On ``megatron.hang``: True when the rank was waiting for the others (in a collective).
HANG_WAITING = "megatron.hang.waiting"
#: On ``megatron.hang``: every thread's Python stack, as text.
HANG_STACKS = "megatron.hang.stacks"
#: On the spans ``shutdown`` ended when the run did not end cleanly (the open
#: interval, or ``megatron.startup`` of a start that failed): why, as
#: ``exception``, ``interrupt`` (a ``KeyboardInterrupt``: Ctrl-C) or ``signal``
#: (a hard SIGTERM or SIGHUP). Ours.
SHUTDOWN_REASON = "megatron.shutdown.reason"
#: ``megatron.shutdown.reason`` of a cycle an in-process restart ended: the fault (the
#: exception beside it in ``error.type``) ended this ``pretrain()`` and NVRx calls it
#: again in the same process, with telemetry still up. Ours.
SHUTDOWN_REASON_INPROCESS_RESTART = "inprocess_restart"
#: Beside it: OpenTelemetry's ``error.type``, the exception's class (as the SDK's
#: ``exception.type`` names it) or the signal's name (``SIGTERM``).
ERROR_TYPE = "error.type"

# ---------------------------------------------------------------------------
# The heartbeat (:mod:`megatron.core.telemetry.heartbeat` writes it, the
# liveness rule reads it)
# ---------------------------------------------------------------------------

#: Gauge: 1 while the job's telemetry is up, 0 in the export made at shutdown.
HEARTBEAT_METRIC = "megatron.training.running"
#: How often the ``jsonl`` sink exports metrics, so how often the heartbeat beats.
HEARTBEAT_PERIOD_S = 10.0
#: How old the newest record of an incarnation that has not ended may be for
#: it to count as running: three heartbeat periods.
STALE_AFTER_S = 3 * HEARTBEAT_PERIOD_S

# ---------------------------------------------------------------------------
# The per-iteration training metrics (:mod:`megatron.core.telemetry.training_metrics`
# records them: a histogram of step durations, a counter of skipped iterations, gauges)
# ---------------------------------------------------------------------------

MEGATRON_TRAINING_STEP_DURATION_MS = "megatron.training.step_duration_ms"
MEGATRON_TRAINING_LOSS = "megatron.training.loss"
MEGATRON_TRAINING_THROUGHPUT_TFLOPS = "megatron.training.throughput_tflops"
MEGATRON_TRAINING_GRAD_NORM = "megatron.training.grad_norm"
MEGATRON_TRAINING_SKIPPED_ITERS = "megatron.training.skipped_iters"
MEGATRON_TRAINING_LEARNING_RATE = "megatron.training.learning_rate"
MEGATRON_TRAINING_TOKENS_PER_SEC = "megatron.training.tokens_per_sec"
MEGATRON_TRAINING_MEMORY_ALLOCATED_GB = "megatron.training.memory_allocated_gb"

# ---------------------------------------------------------------------------
# The live goodput metrics (:mod:`megatron.training.telemetry.goodput_metrics` records them
# in-process; ``megatron-trace watch --otlp-endpoint`` pushes them from the files)
# ---------------------------------------------------------------------------

#: Gauges, seconds so far: progress that survived, the time lost per category
#: (:data:`BADPUT_CATEGORY_ATTRIBUTE`), and their sum.
MEGATRON_TRAINING_GOODPUT_S = "megatron.training.goodput_s"
MEGATRON_TRAINING_BADPUT_S = "megatron.training.badput_s"
MEGATRON_TRAINING_WALL_CLOCK_S = "megatron.training.wall_clock_s"
#: Gauge: goodput over wall clock.
MEGATRON_TRAINING_GOODPUT_FRACTION = "megatron.training.goodput_fraction"
#: Gauge: iterations completed so far (the next one's number).
MEGATRON_TRAINING_ITERATION = "megatron.training.iteration"
#: Gauge: when the checkpoint save in flight began, Unix seconds (0: none is), as
#: Prometheus's ``process_start_time_seconds`` says a start. This project's trainer exports
#: it beside the goodput gauges; a killed run's last point then says whether, and since
#: when, a save was in flight (:mod:`megatron.trace.analysis.sightings`).
MEGATRON_TRAINING_CHECKPOINT_SAVE_START_TIME = "megatron.training.checkpoint_save_start_time"
#: Metric attribute: the badput category of a ``badput_s`` point.
BADPUT_CATEGORY_ATTRIBUTE = "megatron.badput.category"


@dataclass(frozen=True)
class Gauge:
    """One live gauge, declared once for every place that exports it: the trainer
    (OpenTelemetry, :mod:`megatron.training.telemetry.goodput_metrics`: the goodput ones),
    ``watch``'s OTLP push (the same name) and its Prometheus endpoint (``prometheus``: the
    name in Prometheus's conventions, so one dashboard serves both)."""

    name: str
    unit: str  # UCUM, as OpenTelemetry's semantic conventions write units
    description: str
    prometheus: str


#: The live goodput gauges by name, in the order they are registered.
GOODPUT_GAUGES: Mapping[str, Gauge] = MappingProxyType(
    {
        gauge.name: gauge
        for gauge in (
            Gauge(
                MEGATRON_TRAINING_GOODPUT_S,
                "s",
                "Time whose training progress survived, so far",
                "megatron_training_goodput_seconds",
            ),
            Gauge(
                MEGATRON_TRAINING_BADPUT_S,
                "s",
                f"Time lost so far, per report category ({BADPUT_CATEGORY_ATTRIBUTE})",
                "megatron_training_badput_seconds",
            ),
            Gauge(
                MEGATRON_TRAINING_WALL_CLOCK_S,
                "s",
                "The job's wall clock so far: goodput plus every badput",
                "megatron_training_wall_clock_seconds",
            ),
            Gauge(
                MEGATRON_TRAINING_GOODPUT_FRACTION,
                "1",
                "Goodput over wall clock, so far",
                "megatron_training_goodput_ratio",
            ),
            Gauge(
                MEGATRON_TRAINING_ITERATION,
                "{iteration}",
                "Iterations completed so far: the next one's number",
                "megatron_training_iteration",
            ),
        )
    }
)

#: The trainer's gauge beside them (``watch`` cannot see a save in flight, so does not serve it).
SAVE_START_GAUGE = Gauge(
    MEGATRON_TRAINING_CHECKPOINT_SAVE_START_TIME,
    "s",
    "When the checkpoint save in flight began, Unix time (0: none is in flight)",
    "megatron_training_checkpoint_save_start_time_seconds",
)

#: ``megatron-trace watch``'s counters beside the gauges (Prometheus names): time that made
#: training progress, kept or later lost, and the part lost; goodput is their difference.
PROGRESS_COUNTER = "megatron_training_progress_seconds_total"
LOST_PROGRESS_COUNTER = "megatron_training_lost_progress_seconds_total"

#: Gauge (``watch``): 1 for a rank's state, 0 for the others.
MEGATRON_JOB_STATE = "megatron.job.state"
#: Gauge (``watch``): 1 while a hang is suspected on a rank.
MEGATRON_HANG_SUSPECTED = "megatron.hang.suspected"
#: Gauge (``watch``): how long the suspected hang has lasted.
MEGATRON_HANG_DURATION_S = "megatron.hang.duration_s"
#: Gauge (``watch``): a rank's recent time per iteration, from what its spans show
#: (:data:`ITERATION_TIME_SOURCE_ATTRIBUTE` says from which).
MEGATRON_TRAINING_ITERATION_TIME_S = "megatron.training.iteration_time_s"
#: Metric attribute of an ``iteration_time_s`` point: what it was taken from, one of
#: :data:`ITERATION_TIME_SOURCES`.
ITERATION_TIME_SOURCE_ATTRIBUTE = "megatron.iteration_time.source"
#: The ``iteration_time_s`` sources, the first a rank's spans allow: the median of its
#: last iteration spans (the ``per_step`` groups); the median of its last loop passes,
#: told by Megatron-LM's ``megatron.checkpoint.save.finalize`` at the top of each (the
#: ``checkpoint`` group); its last checkpoint intervals' time over the iterations they
#: covered (``megatron.interval.first_iteration`` to ``last_iteration``, or derived:
#: saves and evaluations inside count, so it is at least the loop's own time).
ITERATION_TIME_SOURCES = ("iteration_spans", "loop_passes", "intervals")
#: Gauge (``watch``): a rank's straggler score.
MEGATRON_STRAGGLER_SCORE = "megatron.straggler.score"
#: Gauge (``watch``): 1 when ``report``'s straggler rule names the rank, else 0.
MEGATRON_STRAGGLER_NAMED = "megatron.straggler.named"

#: What ``megatron-trace watch`` serves of each rank beside the goodput gauges, by name,
#: in the order served (on its Prometheus endpoint and in its OTLP push alike).
WATCH_GAUGES: Mapping[str, Gauge] = MappingProxyType(
    {
        gauge.name: gauge
        for gauge in (
            Gauge(
                MEGATRON_JOB_STATE,
                "1",
                "1 for the rank's state (running, finished, stalled, killed), 0 for the others",
                "megatron_job_state",
            ),
            Gauge(
                MEGATRON_HANG_SUSPECTED,
                "1",
                "1 while the rank's iterations have stopped for longer than max(floor, "
                "factor x its rolling median iteration time), or the hang watchdog reported "
                "a stall; else 0 (also when its spans show neither iterations nor loop passes)",
                "megatron_hang_suspected",
            ),
            Gauge(
                MEGATRON_HANG_DURATION_S,
                "s",
                "How long the suspected hang has lasted (0: none)",
                "megatron_hang_seconds",
            ),
            Gauge(
                MEGATRON_TRAINING_ITERATION_TIME_S,
                "s",
                "The rank's recent time per iteration: the median of its last iteration "
                "spans or loop passes, else its last intervals' time over the iterations "
                f"they covered ({ITERATION_TIME_SOURCE_ATTRIBUTE} says which)",
                "megatron_iteration_time_seconds",
            ),
            Gauge(
                MEGATRON_STRAGGLER_SCORE,
                "1",
                "The fastest rank's median work per iteration over this rank's (1: the fastest)",
                "megatron_straggler_score",
            ),
            Gauge(
                MEGATRON_STRAGGLER_NAMED,
                "1",
                "1 when report's rule names the rank a straggler (a score under 0.9 and its "
                "work's lower quartile above the fastest rank's upper quartile), else 0 (also "
                "when not computed: one rank, or no iteration and gradient-sync spans)",
                "megatron_straggler_named",
            ),
        )
    }
)

#: ``watch``'s own counts of what it read (Prometheus names: only its endpoint serves them).
WATCH_SPANS = "megatron_trace_watch_spans"
WATCH_LINES_COUNTER = "megatron_trace_watch_lines_total"
WATCH_CORRUPT_LINES_COUNTER = "megatron_trace_watch_corrupt_lines_total"
WATCH_TORN_LINES = "megatron_trace_watch_torn_lines"

# ---------------------------------------------------------------------------
# Resource attribute keys (the first three are OpenTelemetry's own names)
# ---------------------------------------------------------------------------

#: OpenTelemetry's service name of the exported telemetry.
SERVICE_NAME = "service.name"
#: OpenTelemetry's instance id: one per run and rank (``<run id>-rank<rank>``).
SERVICE_INSTANCE_ID = "service.instance.id"
#: OpenTelemetry's process id of the writing process.
PROCESS_PID = "process.pid"
#: The run id: the same on every rank of a job (the launcher's job id, when it has one).
RUN_ID = "megatron.run_id"
#: nemo-lens's run id: the same on every rank of a job.
NEMO_RUN_ID = "nemo.run.id"
#: nemo-lens's run UUID, where a version of it records one: Megatron-LM's names one launch
#: (it changes with each Slurm requeue and each torchelastic restart).
NEMO_LENS_RUN_UUID = "nemo.lens.run_uuid"
#: Megatron-LM's job UUID for nemo-lens: the logical job, the same across its requeues and
#: restarts (derived from the Slurm cluster and job id, the array's for an array job).
NEMO_LENS_JOB_UUID = "nemo.lens.job_uuid"
#: SLURM's job id, as nemo-lens's SLURM resource detector records it.
SLURM_JOB_ID = "slurm.job.id"
#: OpenTelemetry's host name: with the pid, which process wrote (containers reuse pids).
HOST_NAME = "host.name"
#: SLURM's requeue counter (``SLURM_RESTART_COUNT``, a string as Megatron-LM writes it),
#: where a launcher records it: a requeued job's process again.
SLURM_RESTART_COUNT = "slurm.restart_count"
#: torchrun's count of its worker group's restarts (``TORCHELASTIC_RESTART_COUNT``, a string),
#: Megatron-LM's name: 0 for the group an agent starts first, one more at each restart
#: after a failure; a new agent (a requeue, a relaunch) starts again at 0.
SLURM_TORCHELASTIC_RESTART_COUNT = "slurm.torchelastic.restart_count"
#: The torchrun agent that started the process (its parent): the host's boot id, the agent's
#: pid and its start time in clock ticks since boot (``<boot id>/<pid>/<ticks>``), so two
#: agents never share it, not even one relaunched as pid 1 of a new container. This
#: project's own attribute: Megatron-LM writes no such one.
TORCHELASTIC_AGENT_ID = "torchelastic.agent.id"
#: How many workers that agent started (``LOCAL_WORLD_SIZE``, an int): every rank
#: (``dl.world_size``) on one node; fewer where other nodes' agents started the rest, whose
#: failures restart its workers uncounted. This project's own, as the agent's id is.
TORCHELASTIC_AGENT_LOCAL_WORLD_SIZE = "torchelastic.agent.local_world_size"
#: NVIDIA Resiliency Extension's restart cycle, where it runs the job.
NVRX_CYCLE = "nvrx.cycle"
#: On every span of an in-process restart's cycle: NVRx's restart iteration
#: (``inprocess.CallWrapper.iteration``, 0 for the first call of ``pretrain()``, the
#: count Megatron-LM's ``--inprocess-max-iterations`` limits). A span attribute, since
#: the process's resource stays the same across its cycles. Ours.
NVRX_INPROCESS_ITERATION = "nvrx.inprocess.iteration"
#: The writing process's global rank.
DL_RANK = "dl.rank"
#: Megatron's ``--log-interval``, where a job's resource (or its startup span) records it:
#: the step-duration histogram is recorded once every so many iterations, so its count
#: times this is how far the process got.
LOG_INTERVAL = "megatron.log_interval"
#: How many ranks the job has.
DL_WORLD_SIZE = "dl.world_size"

# ---------------------------------------------------------------------------
# Report categories: where ``megatron-trace report`` puts each nanosecond
# ---------------------------------------------------------------------------


class Category(str, Enum):
    """A report category: where ``megatron-trace report`` puts each nanosecond.

    A ``str`` whose value is the wire name (the JSON keys of ``badput_s`` and
    ``accounting_ns``, the metrics' ``category`` attribute), so it compares,
    hashes, formats and serialises as that name.
    """

    #: The training intervals, less what nests in them (without intervals, the training
    #: loop's iterations and spans marked ``is_goodput_span``): the useful time.
    GOODPUT = "goodput"
    #: The scheduler queue (``pre_startup``).
    QUEUE = "queue"
    #: The launch script and the container's load.
    LAUNCH = "launch"
    #: Startup, less what nests in it.
    STARTUP = "startup"
    #: Checkpoint loads.
    CHECKPOINT_LOAD = "checkpoint_load"
    #: Checkpoint saves.
    CHECKPOINT_SAVE = "checkpoint_save"
    #: Evaluations.
    EVALUATION = "evaluation"
    #: Training whose results were lost: past the progress that survived an incarnation.
    WASTED_PROGRESS = "wasted_progress"
    #: An incarnation's unrecovered stall: from its last progress to its end.
    HANG = "hang"
    #: Between one incarnation's last span and the next one's first.
    RESTART_GAP = "restart_gap"
    #: Time no category covers.
    OTHER = "other"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


#: The badput categories, in the order the report lists them.
BADPUT_CATEGORIES = (
    Category.QUEUE,
    Category.LAUNCH,
    Category.STARTUP,
    Category.CHECKPOINT_LOAD,
    Category.CHECKPOINT_SAVE,
    Category.EVALUATION,
    Category.HANG,
    Category.WASTED_PROGRESS,
    Category.RESTART_GAP,
    Category.OTHER,
)

#: Span name -> the report category its time counts as. Its keys are the
#: structural spans: all the goodput accounting is built from.
SPAN_CATEGORY: Mapping[str, str] = MappingProxyType(
    {
        PRE_STARTUP_SPAN: Category.QUEUE,
        STARTUP_SPAN: Category.STARTUP,
        LAUNCH_SCRIPT_SPAN: Category.LAUNCH,
        CONTAINER_LOAD_SPAN: Category.LAUNCH,
        INTERVAL_SPAN: Category.GOODPUT,
        CHECKPOINT_LOAD_SPAN: Category.CHECKPOINT_LOAD,
        CHECKPOINT_SAVE_SPAN: Category.CHECKPOINT_SAVE,
        EVALUATE_SPAN: Category.EVALUATION,
    }
)

#: The lifecycle's structural spans, which the tally and the trace model keep.
STRUCTURAL_SPAN_NAMES = frozenset(SPAN_CATEGORY)
