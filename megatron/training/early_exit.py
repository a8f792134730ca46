"""When a run stops before ``--train-iters``: Megatron-LM's early-exit conditions.

Kept apart from the loop because each condition is a cross-rank decision
(every rank must stop at the same iteration, or the others hang in the next
collective), and the loop only needs to ask once per iteration.
"""

from __future__ import annotations

import time

from megatron.training.distributed import GracefulExitSignal, max_across_ranks
from megatron.training.job_config import ExitConfig

__all__ = ["ExitConditions"]


class ExitConditions:
    """When ``train()`` should stop early (checked after every iteration).

    As in Megatron-LM: a graceful SIGTERM, then the wall-clock budget (both
    agreed across ranks, so every rank stops at the same iteration), then
    ``--exit-interval``. The collectives run only when their flag is set.
    """

    def __init__(
        self, config: ExitConfig, started_at: float, exit_signal: GracefulExitSignal | None
    ) -> None:
        self.config = config
        self.started_at = started_at
        self.exit_signal = exit_signal

    def check(self, iteration: int) -> str | None:
        config = self.config
        if self.exit_signal is not None and self.exit_signal.received_on_any_rank():
            return "received SIGTERM (--exit-signal-handler)"
        if config.exit_duration_in_mins is not None:
            minutes = max_across_ranks((time.time() - self.started_at) / 60.0)
            if minutes >= config.exit_duration_in_mins:
                limit = config.exit_duration_in_mins
                return f"ran {minutes:.2f} minutes (--exit-duration-in-mins {limit})"
        if config.exit_interval and iteration % config.exit_interval == 0:
            return f"--exit-interval {config.exit_interval}"
        return None
