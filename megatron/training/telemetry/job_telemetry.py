"""The trainer's side of the telemetry wiring, apart from the span lifecycle.

What the trainer tells the base layer about the run (its shape as resource
attributes, the launcher's timestamps for the startup trace) and what it
prints once the run is over (the summary of what telemetry wrote). The spans
themselves are opened and closed in :mod:`megatron.training.telemetry_spans`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from megatron.core.telemetry import TelemetryConfig, TelemetryHandle
from megatron.core.telemetry.logs import print_lines
from megatron.training.distributed import DistributedEnv
from megatron.training.job_config import JobConfig
from megatron.training.telemetry.trace_summary import rank_line, summarize

__all__ = ["print_telemetry_summary", "resource_attributes", "startup_timestamps"]

_log = logging.getLogger(__name__)


def resource_attributes(config: JobConfig, env: DistributedEnv) -> dict[str, Any]:
    """The run's shape, named as Megatron-LM's ``_set_telemetry`` names it."""
    model, training = config.model, config.training
    return {
        "dl.local_rank": env.local_rank,
        "dl.tensor_parallel.size": 1,
        "dl.pipeline_parallel.size": 1,
        "dl.data_parallel.size": training.data_parallel_size,
        "dl.batch_size": training.global_batch_size,
        "dl.sequence_length": model.seq_length,
        "megatron.num_layers": model.num_layers,
        "megatron.hidden_size": model.hidden_size,
        "megatron.num_attention_heads": model.num_attention_heads,
        "megatron.train_iters": training.train_iters,
        "megatron.micro_batch_size": training.micro_batch_size,
        # torch.save of one model_optim_rng.pt per checkpoint, Megatron's "torch" format.
        "megatron.ckpt_format": "torch",
        "megatron.precision": "fp32",
    }


_LAUNCH_ENV = {
    "launch_script_start": "MEGATRON_LAUNCH_SCRIPT_START",
    "launch_script_presrun": "MEGATRON_LAUNCH_SCRIPT_PRESRUN",
    "slurm_job_start_time": "SLURM_JOB_START_TIME",
}


def startup_timestamps(
    program_start: float | None,
    main_entry: float | None,
    pretrain_entry: float,
    *,
    launcher: bool = True,
) -> dict[str, float | None]:
    """The startup trace's timestamps: ours, plus (with ``launcher``) the launcher's from
    the environment, which only the process's first ``pretrain()`` waited through."""
    timestamps: dict[str, float | None] = {
        "program_start": program_start,
        "main_entry": main_entry,
        "pretrain_entry": pretrain_entry,
    }
    for key, variable in _LAUNCH_ENV.items() if launcher else ():
        value = os.environ.get(variable)
        if not value:
            continue
        try:
            timestamps[key] = float(value)
        except ValueError:
            _log.warning("ignoring %s=%r: not a number of seconds since the epoch", variable, value)
    return timestamps


def print_telemetry_summary(telemetry: TelemetryHandle, config: TelemetryConfig) -> None:
    """What this run's telemetry wrote, printed by the rank that wrote it.

    Rank 0 prints the whole summary; every other exporting rank (``all_ranks``)
    one line of its own (its rank, spans, file and goodput), so a job of many
    ranks does not repeat the summary once per rank. After training nothing
    telemetry does may change the job's exit status: a summary that cannot be
    made is one warning line. Spans sent to the console or over OTLP are
    summarized too; with traces off, one line says so.
    """
    if not telemetry.is_exporting:
        return
    try:
        tally = telemetry.tally
        if tally is not None and telemetry.rank != 0:
            line = rank_line(
                telemetry.rank, telemetry.trace_file, tally, config.exporter, telemetry.span_groups
            )
            print_lines(line)
        elif tally is not None:
            summary = summarize(
                telemetry.trace_file,
                tally,
                exporter=config.exporter,
                span_groups=telemetry.span_groups,
            )
            print_lines(summary)
        else:
            print_lines("telemetry: traces off, so no span summary and no goodput")
        for report in telemetry.failure_reports():
            print_lines(f"telemetry: {report}")
    except Exception as exc:  # noqa: BLE001 -- the run succeeded; the summary is a bonus
        _log.warning("telemetry summary not printed: %s", exc)
