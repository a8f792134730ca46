"""Whether the launchers' restart counters prove that no launch came between two incarnations.

A launch SIGKILLed before its first export leaves nothing in any file, so the time between
two incarnations of a rank may hold one (``megatron/trace/README.md``, "Bounds"). The
counters a launcher puts in the environment, and the trainer on the resource, can rule it
out. torchrun counts its worker group's restarts (``TORCHELASTIC_RESTART_COUNT``,
``slurm.torchelastic.restart_count`` as Megatron-LM names it): 0 for the group an agent
starts first, one more at each restart after a failure. A launch by the same agent between
two of its groups would have taken a count between theirs. But a new agent starts again
at 0 (a Slurm requeue, a relaunch by hand or by a script's retry loop, a new container), so
counts 0 then 1 may be two agents' with the second's 0 unseen between them; and a job's run
id, Slurm's job id and restart count stay the same across a relaunch within one allocation.
Only the agent itself tells them apart: ``torchelastic.agent.id``, the process's parent by
boot, pid and start time (this project's trainer writes it; Megatron-LM does not, and
``OTEL_RESOURCE_ATTRIBUTES`` set anew for each torchrun can give it, and how many workers
it started).

And an agent counts only the restarts after its own workers failed. One that sees another
node waiting to join (``num_nodes_waiting``) restarts its healthy workers uncounted, "a
membership change": on a job of several nodes, every node but the one whose worker failed
restarts so, typically (its workers still blocked in a collective), and such a restart
killed before its first export lies unseen between counts 0 and 1 of the same agent. Only
an agent that started every rank of the job (``torchelastic.agent.local_world_size``, its
``LOCAL_WORLD_SIZE``, equal to ``dl.world_size``: one node) has no other node to wait for.

:func:`next_launch` is the rule. Both incarnations' resources carry the same agent, which
started every rank, the same Slurm restart count (or none), the same job
(:func:`~megatron.trace_format.jobs.job_of`), and torchrun counts that differ by exactly one.
It assumes no node joins that one-node job in between: an elastic job (``--nnodes 1:MAX``)
a node joined would have restarted uncounted; one of a fixed node count has no such restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from megatron.trace.model.incarnation import RECORD_LISTS, Incarnation
from megatron.trace_format.jobs import job_of
from megatron.trace_format.semconv import (
    DL_WORLD_SIZE,
    SLURM_RESTART_COUNT,
    SLURM_TORCHELASTIC_RESTART_COUNT,
    TORCHELASTIC_AGENT_ID,
    TORCHELASTIC_AGENT_LOCAL_WORLD_SIZE,
)

__all__ = ["next_launch", "resource_of"]


def resource_of(inc: Incarnation) -> Mapping[str, Any] | None:
    """The resource of the process that wrote the incarnation's records (None: it wrote no
    structural span)."""
    for name in ("startup", *RECORD_LISTS):
        records = getattr(inc, name)
        record = records if name == "startup" else (records[0] if records else None)
        if record is not None:
            return record["resource"]
    return None


def _count(value: Any) -> int | None:
    """A restart count: an int, or the digits the environment gives (None: neither)."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _started_every_rank(resource: Mapping[str, Any]) -> bool:
    """Whether the torchrun agent started every rank of the job (module doc)."""
    workers = _count(resource.get(TORCHELASTIC_AGENT_LOCAL_WORLD_SIZE))
    world = _count(resource.get(DL_WORLD_SIZE))
    return workers is not None and workers > 0 and workers == world


def next_launch(earlier: Incarnation, later: Incarnation) -> bool:
    """Whether ``later`` was the launch right after ``earlier`` (of one rank, in that order):
    the same torchrun agent, which started every rank, restarted its worker group once
    between them (module doc)."""
    before, after = resource_of(earlier), resource_of(later)
    if before is None or after is None:
        return False
    agent = before.get(TORCHELASTIC_AGENT_ID)
    if agent in (None, "") or after.get(TORCHELASTIC_AGENT_ID) != agent:
        return False
    if not (_started_every_rank(before) and _started_every_rank(after)):
        return False  # other nodes' failures may have restarted it uncounted
    if str(before.get(SLURM_RESTART_COUNT)) != str(after.get(SLURM_RESTART_COUNT)):
        return False
    if job_of(before) != job_of(after):
        return False
    first = _count(before.get(SLURM_TORCHELASTIC_RESTART_COUNT))
    second = _count(after.get(SLURM_TORCHELASTIC_RESTART_COUNT))
    return first is not None and second == first + 1
