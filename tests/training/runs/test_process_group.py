"""A two-rank job's process group is gone when ``pretrain()`` returns, gloo's threads with it.

``destroy_process_group()`` only drops the registry's references; the group's C++
object (and its worker threads) lives on while anything else holds it. A group
that outlives ``pretrain()`` is destroyed, if ever, during interpreter
finalization, and a gloo worker that touches Python then is ended by
``pthread_exit``, which C++ turns into ``std::terminate``: "terminate called
without an active exception" and a SIGABRT at the end of a run that finished
(rank 1 of ``test_torchrun_rank_strategies_pick_rank_0`` once, under a load of 20).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from processes import TINY, TORCHRUN_2

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="counts native threads through Linux's /proc"
)

_AFTER_PRETRAIN = """
import os, sys, time
from megatron.core.telemetry.logs import print_lines
from megatron.training.training import pretrain

def gloo_threads():
    tasks = f"/proc/{os.getpid()}/task"
    names = []
    for task in os.listdir(tasks):
        try:
            names.append(open(f"{tasks}/{task}/comm").read().strip())
        except OSError:  # the thread finished leaving between the two reads
            pass
    return sorted(name for name in names if "gloo" in name)

pretrain(sys.argv[1:])
# A thread pthread_join has returned for can still be listed for a moment: the kernel
# wakes the joiner before it removes the thread's entry. So wait for the threads to
# go; the bound only ends the wait when something holds the group (they never go).
deadline = time.monotonic() + 60
while (gloo := gloo_threads()) and time.monotonic() < deadline:
    time.sleep(0.01)
# one write per line: print() writes the newline apart, and the other rank's line can land
# between the two on the stdout the ranks share
print_lines(f"rank {os.environ['RANK']} after pretrain: gloo threads {gloo}")
"""


@pytest.mark.slow
def test_pretrain_leaves_no_gloo_thread_behind(training_cli, tmp_path: Path) -> None:
    script = tmp_path / "after_pretrain.py"
    script.write_text(_AFTER_PRETRAIN)
    result = training_cli.run(
        *TINY, "--train-iters", "2",
        module=(*TORCHRUN_2, str(script)),
        env={"OMP_NUM_THREADS": "1"},
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    said = sorted(line for line in result.stdout.splitlines() if " after pretrain: " in line)
    assert said == [
        "rank 0 after pretrain: gloo threads []",
        "rank 1 after pretrain: gloo threads []",
    ], result.stdout
