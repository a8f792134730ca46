"""The resource every span, metric and log record of a rank carries.

Who is reporting: the run's identity (service, run id, instance, host,
process, rank), inside a SLURM job the job's metadata, and the launchers'
restart counters where they set them: Slurm's requeue count and torchrun's
count of its worker group's restarts, named and typed as Megatron-LM writes
them (strings, as the environment has them), with the torchrun agent that
started the process and how many workers it started. ``megatron-trace`` reads
them to rule out a launch killed before its first export between two
incarnations (``megatron/trace/README.md``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource

from megatron.core.telemetry._attributes import sanitize_attributes
from megatron.core.telemetry.config import TelemetryConfig
from megatron.trace_format import semconv

__all__ = ["RESTART_COUNT_ATTRIBUTES", "SLURM_RESOURCE_ATTRIBUTES", "build_resource"]

#: SLURM job metadata on the resource, named as nemo-lens's resource detection
#: names it; present only inside a SLURM job (``SLURM_JOB_ID`` set).
SLURM_RESOURCE_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    semconv.SLURM_JOB_ID: ("SLURM_JOB_ID",),
    "slurm.job.name": ("SLURM_JOB_NAME",),
    "slurm.nodelist": ("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "slurm.nnodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
    "slurm.ntasks": ("SLURM_NTASKS",),
    "slurm.partition": ("SLURM_JOB_PARTITION",),
    "slurm.cluster.name": ("SLURM_CLUSTER_NAME",),
}
_SLURM_INT_ATTRIBUTES = frozenset({"slurm.nnodes", "slurm.ntasks"})

#: The launchers' restart counters on the resource, wherever the variable is set (strings,
#: as Megatron-LM writes them): Slurm's requeue count, torchrun's worker-group restarts.
RESTART_COUNT_ATTRIBUTES: dict[str, str] = {
    semconv.SLURM_RESTART_COUNT: "SLURM_RESTART_COUNT",
    semconv.SLURM_TORCHELASTIC_RESTART_COUNT: "TORCHELASTIC_RESTART_COUNT",
}


def build_resource(
    config: TelemetryConfig,
    rank: int,
    world_size: int,
    resource_attributes: Mapping[str, Any] | None,
) -> Resource:
    """The rank's resource: the caller's attributes, SLURM's, then the identity.

    ``None`` values among ``resource_attributes`` are skipped; the identity
    attributes are set last so a caller cannot overwrite them.
    """
    attributes = sanitize_attributes(resource_attributes or {})
    attributes.update(_slurm_attributes(os.environ))
    attributes.update(_restart_counts(os.environ))
    # Identity attributes come last so a caller cannot overwrite them.
    attributes.update(
        {
            semconv.SERVICE_NAME: config.service_name,
            semconv.NEMO_RUN_ID: config.run_id,
            # The name this project used first; readers of older files use it.
            semconv.RUN_ID: config.run_id,
            semconv.SERVICE_INSTANCE_ID: f"{config.run_id}-rank{rank}",
            semconv.HOST_NAME: socket.gethostname(),
            semconv.PROCESS_PID: os.getpid(),
            semconv.DL_RANK: rank,
            semconv.DL_WORLD_SIZE: world_size,
        }
    )
    # Resource.create also merges OTEL_RESOURCE_ATTRIBUTES and the SDK's
    # telemetry.sdk.* attributes; explicit attributes win.
    return Resource.create(attributes)


def _slurm_attributes(env: Mapping[str, str]) -> dict[str, Any]:
    """``slurm.*`` attributes from the job's environment; none outside SLURM."""
    if not env.get("SLURM_JOB_ID", "").strip():
        return {}
    found: dict[str, Any] = {}
    for attribute, variables in SLURM_RESOURCE_ATTRIBUTES.items():
        value = next((env[v].strip() for v in variables if env.get(v, "").strip()), None)
        if value is None:
            continue
        if attribute in _SLURM_INT_ATTRIBUTES:
            try:
                found[attribute] = int(value)
            except ValueError:
                continue
        else:
            found[attribute] = value
    return found


def _restart_counts(env: Mapping[str, str]) -> dict[str, Any]:
    """The launchers' restart counters (:data:`RESTART_COUNT_ATTRIBUTES`) the environment
    sets and, under torchrun, the agent that started this process (its parent) and how many
    workers it started (``LOCAL_WORLD_SIZE``)."""
    found: dict[str, Any] = {}
    for attribute, variable in RESTART_COUNT_ATTRIBUTES.items():
        value = env.get(variable, "").strip()
        if value:
            found[attribute] = value
    if semconv.SLURM_TORCHELASTIC_RESTART_COUNT in found:
        agent = _parent_identity()
        if agent is not None:
            found[semconv.TORCHELASTIC_AGENT_ID] = agent
        workers = env.get("LOCAL_WORLD_SIZE", "").strip()
        if workers.isdigit():
            found[semconv.TORCHELASTIC_AGENT_LOCAL_WORLD_SIZE] = int(workers)
    return found


def _parent_identity(proc: str = "/proc") -> str | None:
    """``<boot id>/<pid>/<start ticks>`` of this process's parent (torchrun's agent, under
    torchrun), unique among the processes a host ever runs: a pid is reused, but not with
    the same start time within one boot. None where ``/proc`` does not say (not Linux)."""
    parent = os.getppid()
    try:
        with open(f"{proc}/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()
        with open(f"{proc}/{parent}/stat") as file:
            stat = file.read()
        # the fields after the command name (which may hold spaces and parentheses): the
        # process's start time is the 22nd field, the 20th after the name
        ticks = stat[stat.rindex(")") + 2 :].split()[19]
    except (OSError, ValueError, IndexError):
        return None
    if not boot or not ticks.isdigit():
        return None
    return f"{boot}/{parent}/{ticks}"
