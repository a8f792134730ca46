"""Which job a process belongs to, by its resource: the receiver's folders and the reader agree.

The first of these the resource carries names the job:

1. ``nemo.lens.job_uuid``: Megatron-LM's id of the logical job, the same on every rank and
   across its Slurm requeues and torchelastic restarts. Off Slurm, Megatron-LM derives it
   from no job at all, and every such job carries the same value (:data:`UNPLACED_JOB_UUID`),
   which is passed over;
2. ``megatron.run_id`` (this project's trainer: ``MEGATRON_OTEL_RUN_ID``, else Slurm's job
   id, else torchrun's rendezvous id, else an id of each process);
3. ``nemo.run.id`` (nemo-lens: ``MEGATRON_OTEL_RUN_ID``/``NEMO_LENS_RUN_ID``, else Slurm's
   job id; else a random id per process);
4. ``slurm.job.id``;
5. ``service.instance.id`` less its ``-rank<N>``.

``service.name`` is not one: every Megatron-LM job is ``megatron-lm``. Without a run id
given, launches of one job carry different ids (and so may the ranks of one launch): an id
that differs does not make another job by itself; the reader also asks whether the later
launch resumed from the earlier's checkpoints (:mod:`megatron.trace.model.jobs`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from megatron.trace_format.semconv import (
    NEMO_LENS_JOB_UUID,
    NEMO_RUN_ID,
    RUN_ID,
    SERVICE_INSTANCE_ID,
    SLURM_JOB_ID,
)

__all__ = ["JOB_KEYS", "UNPLACED_JOB_UUID", "job_of"]

#: The resource attributes naming a job, in the order they are tried (then
#: ``service.instance.id`` less ``-rank<N>``).
JOB_KEYS = (NEMO_LENS_JOB_UUID, RUN_ID, NEMO_RUN_ID, SLURM_JOB_ID)
#: The ``nemo.lens.job_uuid`` Megatron-LM gives every job run outside Slurm (its UUID5 of
#: ``nemo.lens.job/nocluster/nojob``): shared by unrelated jobs, so it names none.
UNPLACED_JOB_UUID = "d2badfc7-0e4c-537b-b4ea-8785f79f8679"

_RANK_SUFFIX = re.compile(r"-rank\d+$")


def job_of(attributes: Mapping[str, Any]) -> str | None:
    """The job of the process whose resource has ``attributes`` (decoded: key -> value),
    as the module docstring orders them; ``None`` when it names none."""
    for key in JOB_KEYS:
        value = attributes.get(key)
        if value in (None, "") or (key == NEMO_LENS_JOB_UUID and value == UNPLACED_JOB_UUID):
            continue
        return str(value)
    instance = attributes.get(SERVICE_INSTANCE_ID)
    if instance not in (None, ""):
        return _RANK_SUFFIX.sub("", str(instance)) or str(instance)
    return None
