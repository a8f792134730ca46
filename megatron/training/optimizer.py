"""The optimizer and its learning-rate schedule (Megatron's warmup + cosine decay).

The schedule is a pure function of the step count, carried by a stock
``LambdaLR`` so its whole state is the step counter: a resumed run continues
the curve exactly where the checkpoint left it, without pickling any code.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from megatron.training.job_config import OptimizerConfig

__all__ = ["build_optimizer", "learning_rate"]

WEIGHT_DECAY = 0.01
BETAS = (0.9, 0.95)


def learning_rate(
    step: int, lr: float, min_lr: float, warmup_iters: int, decay_iters: int
) -> float:
    """Linear warmup to ``lr`` over ``warmup_iters``, then cosine down to ``min_lr``."""
    if warmup_iters > 0 and step < warmup_iters:
        return lr * (step + 1) / warmup_iters
    decay_steps = max(decay_iters - warmup_iters, 1)
    progress = min((step - warmup_iters) / decay_steps, 1.0)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(
    model: nn.Module, config: OptimizerConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (no weight decay on biases and norms) and the schedule driving its lr."""
    decay, no_decay = [], []
    for param in model.parameters():
        (decay if param.dim() >= 2 else no_decay).append(param)
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=BETAS,
    )

    def lr_factor(step: int) -> float:
        # Closes over a frozen section: the schedule is fixed once built.
        if config.lr == 0:
            return 0.0
        rate = learning_rate(
            step, config.lr, config.min_lr, config.lr_warmup_iters, config.lr_decay_iters
        )
        return rate / config.lr

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
