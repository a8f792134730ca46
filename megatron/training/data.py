"""Training data as a pure function of the sample index.

Every sample is computed from ``(seed, split, index)`` alone. That one property
gives the three things a Megatron-style loop needs from its data without any
state to checkpoint: determinism by seed, a resumed run that continues with
exactly the samples an uninterrupted run would have seen (it restarts at the
checkpoint's ``consumed_samples``), and data-parallel sharding by slicing the
index range (Megatron's pretraining sampler: in each step of
``micro_batch_size * dp`` samples, rank r takes the r-th slice).

Two sources, both byte-level (vocabulary 256):

* ``--mock-data``: sequences that repeat a short motif, where the motif is a
  walk on a fixed sparse successor graph. A tiny model learns this on a CPU in
  a minute in two visible stages: the graph's bigram statistics first (loss
  drops from ln 256 ~ 5.5 towards ~1), then copying the motif one period back
  (loss keeps falling towards 0). Pure random tokens would show no learning;
  real text would need far more compute to show it.
* ``--data-path FILE``: raw bytes of a file; each sample is a window at an
  offset drawn from the sample's own generator.

The validation split draws a separate stream of samples from the same source
(there is no held-out region), so the validation loss measures fit to the
distribution, not generalization to unseen text.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch

from megatron.training.distributed import DistributedEnv
from megatron.training.job_config import DataConfig, TrainingConfig

__all__ = [
    "VOCAB_SIZE",
    "ByteFileDataset",
    "MockGPTDataset",
    "build_train_valid_datasets",
    "data_file_problem",
    "micro_batches",
]

VOCAB_SIZE = 256
TRAIN, VALID = 0, 1

_MOTIF_PERIODS = (3, 9)  # motif lengths drawn from [3, 9)
_SUCCESSORS = 2  # out-degree of the successor graph


class GPTDataset(Protocol):
    seq_length: int

    def __getitem__(self, index: int) -> torch.Tensor:
        """``seq_length + 1`` tokens (inputs and the shifted-by-one labels)."""
        ...


def _generator(seed: int, split: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + split) * 1_000_000_007 + index)


class MockGPTDataset:
    """Periodic walks on a sparse successor graph: structure to learn, a fresh sample per index."""

    def __init__(self, seq_length: int, seed: int, split: int = TRAIN) -> None:
        self.seq_length = seq_length
        self.seed = seed
        self.split = split
        # The graph is shared by all splits: it is the "language" being learned.
        graph_rng = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(
            0, VOCAB_SIZE, (VOCAB_SIZE, _SUCCESSORS), generator=graph_rng
        )

    def __getitem__(self, index: int) -> torch.Tensor:
        rng = _generator(self.seed, self.split, index)
        period = int(torch.randint(*_MOTIF_PERIODS, (1,), generator=rng))
        choices = torch.randint(0, _SUCCESSORS, (period,), generator=rng).tolist()
        motif = [int(torch.randint(0, VOCAB_SIZE, (1,), generator=rng))]
        for choice in choices[1:]:
            motif.append(int(self.successors[motif[-1], choice]))
        repeats = (self.seq_length + 1) // period + 1
        return torch.tensor(motif * repeats)[: self.seq_length + 1]


class ByteFileDataset:
    """Windows of ``seq_length + 1`` bytes of a file, at per-sample random offsets.

    The file must hold at least ``seq_length + 1`` bytes (see :func:`data_file_problem`).
    """

    def __init__(self, path: str | Path, seq_length: int, seed: int, split: int = TRAIN) -> None:
        self.path = Path(path)
        self.seq_length = seq_length
        self.seed = seed
        self.split = split
        size = self.path.stat().st_size
        # Memory-mapped, copy-on-write: large files are not read up front.
        self.data = torch.from_file(str(self.path), shared=False, size=size, dtype=torch.uint8)
        self.max_offset = size - (seq_length + 1)

    def __getitem__(self, index: int) -> torch.Tensor:
        rng = _generator(self.seed, self.split, index)
        offset = int(torch.randint(0, self.max_offset + 1, (1,), generator=rng))
        return self.data[offset : offset + self.seq_length + 1].long()


def data_file_problem(path: str | Path, seq_length: int) -> str | None:
    """Why ``path`` cannot feed ``--data-path`` at this sequence length, or None if it can."""
    path = Path(path)
    if path.is_dir():
        return f"--data-path {path}: is a directory; expected a file (trained on as raw bytes)"
    if not path.is_file():
        return f"--data-path {path}: no such file"
    size = path.stat().st_size
    if size < seq_length + 1:
        return (
            f"--data-path {path}: the file has {size} bytes, fewer than "
            f"--seq-length + 1 = {seq_length + 1}"
        )
    return None


def build_train_valid_datasets(
    config: DataConfig, seq_length: int, seed: int
) -> tuple[GPTDataset, GPTDataset]:
    if config.mock_data:
        return (
            MockGPTDataset(seq_length, seed, TRAIN),
            MockGPTDataset(seq_length, seed, VALID),
        )
    assert config.data_path is not None  # the parser checked: exactly one source
    return (
        ByteFileDataset(config.data_path, seq_length, seed, TRAIN),
        ByteFileDataset(config.data_path, seq_length, seed, VALID),
    )


def micro_batches(
    dataset: GPTDataset, consumed_samples: int, training: TrainingConfig, env: DistributedEnv
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's ``(tokens, labels)`` micro-batches, starting after ``consumed_samples``.

    Endless: the loop decides when to stop.
    """
    size = training.micro_batch_size
    start = consumed_samples + env.rank * size
    while True:
        batch = torch.stack([dataset[start + i] for i in range(size)]).to(env.device)
        yield batch[:, :-1], batch[:, 1:]
        start += size * env.world_size
