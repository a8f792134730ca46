"""When the launchers' restart counters prove the next launch (``model/restarts.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from megatron.trace.model.incarnation import Incarnation
from megatron.trace.model.restarts import next_launch

COUNT = "slurm.torchelastic.restart_count"
AGENT = "torchelastic.agent.id"
WORKERS = "torchelastic.agent.local_world_size"


def _inc(index: int, count: Any, **changed: Any) -> Incarnation:
    """Rank 0's incarnation whose startup span's resource says torchrun's ``count``, from
    the agent of all 8 ranks, unless ``changed`` (None: unsaid) says otherwise."""
    resource = {"dl.world_size": 8, COUNT: count, AGENT: "b00t/1/1000", WORKERS: 8, **changed}
    inc = Incarnation("0", index, ("0",), start_ns=index * 100, end_ns=index * 100 + 50)
    inc.startup = {"resource": {k: v for k, v in resource.items() if v is not None}}  # type: ignore[assignment]
    return inc


def test_the_same_agent_of_every_rank_counting_one_more_was_the_next_launch() -> None:
    assert next_launch(_inc(0, "0"), _inc(1, "1"))
    assert next_launch(_inc(0, 3), _inc(1, "4"))  # an int, or digits
    assert not next_launch(_inc(1, "1"), _inc(0, "0"))


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ({}, {COUNT: "2"}),  # a count jumping by 2: a launch between
        ({}, {COUNT: "0"}),  # the same count: a restart torchrun did not count
        ({}, {AGENT: "b00t/1/1001"}),  # another agent, counting from 0 again
        ({AGENT: None}, {AGENT: None}),  # Megatron-LM's resource: the count alone
        ({}, {WORKERS: 4}),  # one node of two
        ({WORKERS: 4}, {WORKERS: 4}),
        ({WORKERS: None}, {}),  # unsaid
        ({"slurm.restart_count": "0"}, {"slurm.restart_count": "1"}),  # a requeue between
        ({"slurm.job.id": "1"}, {"slurm.job.id": "2"}),  # another job
    ],
)
def test_anything_else_proves_nothing(earlier: dict[str, Any], later: dict[str, Any]) -> None:
    """A launch killed before its first export may lie between the two."""
    assert not next_launch(_inc(0, "0", **earlier), _inc(1, "1", **later))
