"""Which process, rank and incarnation wrote a span: the model's grouping rule.

Spans belong to the *process* that wrote them: the resource's
``service.instance.id``, run id (``nemo.run.id``, ``megatron.run_id``),
``host.name`` and ``process.pid``, and the restart counters launchers set
(``slurm.restart_count``, NVRx's ``nvrx.cycle``), so two containers' pid 1 on
two hosts, or a job requeued onto the same host, are two processes even
without a ``service.instance.id`` (:func:`process_key`); a process that called
``pretrain()`` more than once is split at each ``megatron.startup`` by start
time (a ``pre_startup`` goes with the startup it precedes): :func:`slot_of`
is that rule. The rank is the resource's ``dl.rank`` (else its
``service.instance.id``, else the file name). Grouping by process rather than
by following links keeps a broken link a finding of ``check`` instead of
silently making a new incarnation.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from megatron.trace_format.semconv import (
    DL_RANK,
    HOST_NAME,
    NEMO_RUN_ID,
    NVRX_CYCLE,
    PRE_STARTUP_SPAN,
    PROCESS_PID,
    RUN_ID,
    SERVICE_INSTANCE_ID,
    SLURM_RESTART_COUNT,
)

__all__ = [
    "PROCESS_KEYS",
    "process_key",
    "process_of",
    "process_of_resource",
    "rank_of",
    "rank_sort_key",
    "rank_value",
    "slot_of",
]


#: The writing process's identity, beside its rank (see the module docstring).
PROCESS_KEYS = (
    SERVICE_INSTANCE_ID,
    PROCESS_PID,
    RUN_ID,
    NEMO_RUN_ID,
    HOST_NAME,
    SLURM_RESTART_COUNT,
    NVRX_CYCLE,
)


def _rank(resource: Mapping[str, Any], path: Path | str | None) -> str:
    if DL_RANK in resource:
        return str(resource[DL_RANK])
    if SERVICE_INSTANCE_ID in resource:
        return str(resource[SERVICE_INSTANCE_ID])
    return str(path)


def process_key(resource: Mapping[str, Any], path: Path | str | None) -> tuple[Any, ...]:
    """The process that wrote the spans of ``resource``, read from ``path``: its rank and
    every identity the resource carries (:data:`PROCESS_KEYS`)."""
    return (_rank(resource, path), *map(resource.get, PROCESS_KEYS))


def rank_of(span: Mapping[str, Any]) -> str:
    """The rank a span's writer ran as (``dl.rank``, else instance id, else file)."""
    return _rank(span["resource"], span["file"])


def process_of(span: Mapping[str, Any]) -> tuple[Any, ...]:
    """The process that wrote a span: :func:`process_key` of its resource."""
    return process_key(span["resource"], span["file"])


def process_of_resource(resource: Mapping[str, Any], file: Any) -> tuple[Any, ...]:
    """:func:`process_of` for anything carrying this resource (the metrics' heartbeat too)."""
    return process_of({"resource": resource, "file": file})


def slot_of(boundaries: Sequence[int], name: str, start_ns: int, end_ns: int) -> int:
    """Which of a process's incarnations a span belongs to: the incarnation-split rule.

    ``boundaries`` are the start times of the process's ``megatron.startup``
    spans but the first, in order; a span goes to the incarnation whose
    startup last began at or before it. A ``pre_startup`` ends where its own
    startup begins, so it is placed by its end; every other span by its start.
    """
    at = end_ns if name == PRE_STARTUP_SPAN else start_ns
    return bisect.bisect_right(boundaries, at)


def rank_sort_key(rank: str) -> tuple[int, int | str]:
    return (0, int(rank)) if rank.isdigit() else (1, rank)


def rank_value(rank: str) -> int | str:
    """A rank as the report writes it: the integer ``dl.rank`` gave, or (a resource without
    one) the instance id or file name the model named it by."""
    return int(rank) if rank.isdigit() else rank
