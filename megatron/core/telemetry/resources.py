"""The resource every span, metric and log record of a rank carries.

Who is reporting: the run's identity (service, run id, instance, host,
process, rank) and, inside a SLURM job, the job's metadata.
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

__all__ = ["SLURM_RESOURCE_ATTRIBUTES", "build_resource"]

#: SLURM job metadata on the resource, named as nemo-lens's resource detection
#: names it; present only inside a SLURM job (``SLURM_JOB_ID`` set).
SLURM_RESOURCE_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "slurm.job.id": ("SLURM_JOB_ID",),
    "slurm.job.name": ("SLURM_JOB_NAME",),
    "slurm.nodelist": ("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "slurm.nnodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
    "slurm.ntasks": ("SLURM_NTASKS",),
    "slurm.partition": ("SLURM_JOB_PARTITION",),
    "slurm.cluster.name": ("SLURM_CLUSTER_NAME",),
}
_SLURM_INT_ATTRIBUTES = frozenset({"slurm.nnodes", "slurm.ntasks"})


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
