"""What the loop reports every ``--log-interval``: a log line and the training metrics.

Both come from the same window of iterations, so the console and the metrics
backend can never disagree. Per-iteration results are kept as tensors until
the report (no host sync per iteration), and the loss is averaged over the
data-parallel ranks only then: one small all-reduce per log interval, which
every rank takes part in, while only rank 0 prints and only the exporting
rank's meter records anything (it is a no-op meter elsewhere).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import torch

from megatron.core.telemetry import record_training_metrics
from megatron.training.data import VOCAB_SIZE
from megatron.training.distributed import all_reduce_mean, print_rank_0
from megatron.training.job_config import LoggingConfig, ModelConfig, TrainingConfig

__all__ = ["StepResult", "TrainingLog", "parse_log_iteration_ms", "parse_log_losses"]

# Read back the lines _report writes (kept beside it so the two cannot drift).
_LOG_LINE = re.compile(r" iteration\s+(\d+)/\s*\d+ \|.*? lm loss: (\S+) \|")
_ITERATION_MS = re.compile(
    r" iteration\s+(\d+)/\s*\d+ \|.*? elapsed time per iteration \(ms\): ([0-9.]+) \|"
)


@dataclass(frozen=True)
class StepResult:
    """One training iteration's outcome, as ``train_step`` returns it."""

    loss: torch.Tensor  # this rank's mean LM loss over its micro-batches
    grad_norm: torch.Tensor
    learning_rate: float
    skipped: bool  # the update was skipped because the gradient was not finite
    duration_s: float

    def span_attributes(self) -> dict[str, float]:
        """Stamps for the iteration span (each costs a device-to-host sync)."""
        return {"megatron.loss": self.loss.item(), "megatron.grad_norm": self.grad_norm.item()}


class TrainingLog:
    def __init__(
        self,
        logging_config: LoggingConfig,
        training: TrainingConfig,
        model: ModelConfig,
        meter: Any,
    ) -> None:
        self.log_interval = logging_config.log_interval
        self.training = training
        self.seq_length = model.seq_length
        self.meter = meter
        self.flops_per_iteration = _flops_per_iteration(model, training.global_batch_size)
        self.reported: list[tuple[int, float]] = []  # (iteration, DP-averaged loss)
        self._reset()

    def _reset(self) -> None:
        self._losses: list[torch.Tensor] = []
        self._iterations = 0
        self._seconds = 0.0
        self._skipped = 0

    def record(self, iteration: int, consumed_samples: int, step: StepResult) -> None:
        """Add one iteration; report when ``iteration`` ends a log interval."""
        if not step.skipped:
            self._losses.append(step.loss)
        self._iterations += 1
        self._seconds += step.duration_s
        self._skipped += int(step.skipped)
        if iteration % self.log_interval == 0:
            self._report(iteration, consumed_samples, step)

    def _report(self, iteration: int, consumed_samples: int, step: StepResult) -> None:
        training = self.training
        # A resumed run's first window can be shorter than --log-interval.
        iterations = self._iterations
        window_loss = (
            torch.stack(self._losses).mean() if self._losses else torch.tensor(float("nan"))
        )
        loss = all_reduce_mean(window_loss).item()
        grad_norm = step.grad_norm.item()
        ms_per_iteration = 1000.0 * self._seconds / iterations
        tokens_per_sec = iterations * training.global_batch_size * self.seq_length / self._seconds
        dp_size = training.data_parallel_size
        tflops = iterations * self.flops_per_iteration / self._seconds / 1e12 / dp_size
        record_training_metrics(
            self.meter,
            step_duration_ms=ms_per_iteration,
            loss=loss,
            grad_norm=grad_norm,
            learning_rate=step.learning_rate,
            tokens_per_sec=tokens_per_sec,
            throughput_tflops=tflops,
            skipped_iters=self._skipped,
            memory_allocated_gb=_memory_allocated_gb(),
        )
        print_rank_0(
            f" [{time.strftime('%Y-%m-%d %H:%M:%S')}]"
            f" iteration {iteration:8d}/{training.train_iters:8d} |"
            f" consumed samples: {consumed_samples:12d} |"
            f" elapsed time per iteration (ms): {ms_per_iteration:.1f} |"
            f" learning rate: {step.learning_rate:.6E} |"
            f" global batch size: {training.global_batch_size:5d} |"
            f" lm loss: {loss:.6E} |"
            f" grad norm: {grad_norm:.3f} |"
            f" number of skipped iterations: {self._skipped:3d} |"
            f" tokens per second: {tokens_per_sec:.1f} |"
            f" TFLOP/s/rank: {tflops:.4f} |"
        )
        self.reported.append((iteration, loss))
        self._reset()


def parse_log_losses(text: str) -> dict[int, float]:
    """``{iteration: lm loss}`` from a run's log output (for tests and tools)."""
    return {int(iteration): float(loss) for iteration, loss in _LOG_LINE.findall(text)}


def parse_log_iteration_ms(text: str) -> dict[int, float]:
    """``{iteration: mean ms per iteration over the window ending there}`` from a log."""
    return {int(iteration): float(ms) for iteration, ms in _ITERATION_MS.findall(text)}


def _flops_per_iteration(model: ModelConfig, global_batch_size: int) -> float:
    """Model FLOPs of one iteration: 6 per parameter per token, plus attention scores."""
    h, layers, seq = model.hidden_size, model.num_layers, model.seq_length
    params = layers * 12 * h * h + (VOCAB_SIZE + seq) * h
    tokens = global_batch_size * seq
    return 6.0 * params * tokens + 12.0 * layers * h * seq * tokens


def _memory_allocated_gb() -> float | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.memory_allocated() / 2**30
