"""A compact causal GPT: the smallest model that is still the real architecture.

The telemetry this project is about only means something on a genuine training
step, so the model is a real decoder-only transformer (token and learned
position embeddings, pre-LayerNorm blocks of causal self-attention and a GELU
MLP, a final LayerNorm, an output head tied to the embedding), not a stand-in
linear layer. It is kept to one screen: no tensor or pipeline parallelism, no
dropout, no fused kernels beyond PyTorch's own ``scaled_dot_product_attention``.

Initialization follows Megatron-LM / GPT-2: normal(0, 0.02) everywhere, with
the projections that write into the residual stream scaled down by
``1/sqrt(2 * num_layers)`` so the residual's variance does not grow with depth.

Each block is instrumented as Megatron-LM instruments its transformer layer,
for the ``layer`` span group (in ``all`` / ``profiling`` only):
``megatron.layer.forward`` (``megatron.layer_number``, 1-based) with its
``megatron.layer.self_attention`` and ``megatron.layer.mlp`` children. The
group is looked up once per block call; with it off the block runs its
plain forward and opens nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from megatron.core.telemetry import MegatronSpanGroup, is_span_group_enabled, managed_span

__all__ = ["GPTConfig", "GPTModel"]


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    seq_length: int
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    init_method_std: float = 0.02


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(x).split(hidden, dim=-1)
        # [b, s, h] -> [b, heads, s, h/heads]
        q, k, v = (t.view(batch, seq, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, hidden))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.hidden_size, 4 * config.hidden_size)
        self.proj = nn.Linear(4 * config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


_LAYER = MegatronSpanGroup.LAYER


class TransformerBlock(nn.Module):
    def __init__(self, config: GPTConfig, layer_number: int = 1) -> None:
        super().__init__()
        self.layer_number = layer_number  # 1-based, as Megatron-LM numbers its layers
        self.ln_attn = nn.LayerNorm(config.hidden_size)
        self.attn = CausalSelfAttention(config)
        self.ln_mlp = nn.LayerNorm(config.hidden_size)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not is_span_group_enabled(_LAYER):
            x = x + self.attn(self.ln_attn(x))
            return x + self.mlp(self.ln_mlp(x))
        return self._traced_forward(x)

    def _traced_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The same computation, each part in its span (the ``layer`` group is on)."""
        with managed_span(
            _LAYER, "megatron.layer.forward", **{"megatron.layer_number": self.layer_number}
        ):
            with managed_span(_LAYER, "megatron.layer.self_attention"):
                x = x + self.attn(self.ln_attn(x))
            with managed_span(_LAYER, "megatron.layer.mlp"):
                return x + self.mlp(self.ln_mlp(x))


class GPTModel(nn.Module):
    """``forward(tokens, labels=None)``: logits, or the mean LM loss when labels are given."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embedding = nn.Embedding(config.seq_length, config.hidden_size)
        self.layers = nn.ModuleList(
            TransformerBlock(config, number) for number in range(1, config.num_layers + 1)
        )
        self.final_layernorm = nn.LayerNorm(config.hidden_size)
        self._init_weights()

    def _init_weights(self) -> None:
        std = self.config.init_method_std
        residual_std = std / math.sqrt(2.0 * self.config.num_layers)
        for name, param in self.named_parameters():
            if param.dim() == 1:  # biases and LayerNorm: weights were set to 1 by LayerNorm
                if name.endswith("bias"):
                    nn.init.zeros_(param)
            elif name.endswith("proj.weight"):
                nn.init.normal_(param, mean=0.0, std=residual_std)
            else:
                nn.init.normal_(param, mean=0.0, std=std)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embedding(tokens) + self.position_embedding(positions)
        for layer in self.layers:
            x = layer(x)
        # Output head tied to the input embedding, as in Megatron's GPT.
        logits = F.linear(self.final_layernorm(x), self.embedding.weight)
        if labels is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
