"""Which ranks export, and which spans an exporting rank keeps.

Two layers, as nemo-lens defines them and Megatron-LM configures them:

* the rank strategy (``MEGATRON_OTEL_RANK_STRATEGY``) decides once, at setup,
  whether this process exports at all; a rank that does not gets no-op
  providers and creates no spans;
* the sampling strategy (``MEGATRON_OTEL_SAMPLING_STRATEGY=rank_aware``) is
  an SDK ``Sampler``: spans are created, then kept or dropped per rank.

Both choose ranks by the same deterministic hash lens uses (the MD5 of the
rank's decimal string, modulo 10000, as a fraction compared with the rate).
So every rank decides alone, without communication; a restarted job samples
the same ranks; and a job mixing this code with lens agrees on which ranks
those are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

__all__ = ["RankAwareSampler", "is_rank_sampled", "rank_exports"]

_BUCKETS = 10_000


def is_rank_sampled(rank: int, rate: float) -> bool:
    """Whether ``rank`` falls in the sampled fraction ``rate`` (lens's rule).

    Rate 1.0 keeps every rank and 0.0 none, since the hash fraction is in
    ``[0, 1)``.
    """
    digest = hashlib.md5(str(rank).encode(), usedforsecurity=False).hexdigest()
    return (int(digest, 16) % _BUCKETS) / _BUCKETS < rate


def local_rank_from_env(env: Mapping[str, str]) -> int:
    """``LOCAL_RANK`` as torchrun and similar launchers set it; missing counts as 0.

    Raises ``ValueError`` for a value that is not an integer.
    """
    value = env.get("LOCAL_RANK", "").strip()
    return int(value) if value else 0


def rank_exports(
    strategy: str,
    rank: int,
    world_size: int,
    *,
    export_rank: int = -1,
    sample_rate: float = 1.0,
    local_rank: int = 0,
) -> bool:
    """Whether this rank exports under ``strategy``.

    * ``single_rank``: only ``export_rank`` (-1: the last rank, which sees
      the final loss);
    * ``all_ranks``: every rank;
    * ``sampled``: the ranks :func:`is_rank_sampled` picks at ``sample_rate``;
    * ``first_rank_per_node``: local rank 0 of each node.
    """
    if strategy == "all_ranks":
        return True
    if strategy == "sampled":
        return is_rank_sampled(rank, sample_rate)
    if strategy == "first_rank_per_node":
        return local_rank == 0
    if strategy == "single_rank":
        return rank == (export_rank if export_rank >= 0 else world_size - 1)
    raise ValueError(f"unknown rank strategy {strategy!r}")


class RankAwareSampler(Sampler):
    """Keep all of a sampled rank's spans and none of the others'.

    The decision is per rank, not per span (lens's ``RankAwareSampler``). On
    a sampled rank the decision is handed to ``delegate``, the sampler the SDK
    built from ``OTEL_TRACES_SAMPLER``, so the two compose: rate 0.1 and
    ``traceidratio`` 0.1 keep 10 % of the traces of 10 % of the ranks.
    """

    def __init__(self, rank: int, sample_rate: float, delegate: Sampler) -> None:
        self._rank = rank
        self._sample_rate = sample_rate
        self._delegate = delegate
        self.sampled = is_rank_sampled(rank, sample_rate)

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if not self.sampled:
            return SamplingResult(Decision.DROP)
        return self._delegate.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return (
            f"RankAwareSampler{{rank={self._rank},rate={self._sample_rate},"
            f"delegate={self._delegate.get_description()}}}"
        )
