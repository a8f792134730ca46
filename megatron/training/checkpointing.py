"""Checkpoints in Megatron-LM's layout, written so a crash never costs the last good one.

Layout (as upstream, so tools that read a Megatron checkpoint directory find
their way): ``<save>/iter_0000010/model_optim_rng.pt`` plus the tracker file
``<save>/latest_checkpointed_iteration.txt`` holding the iteration number.

Why the care with writing: a job is most likely to be killed while it saves
(that is when preemption notices and time limits land). Every file is written
to a temporary name in its final directory, fsynced, and moved into place with
``os.replace`` (atomic on POSIX), and the tracker is replaced last. A crash at
any point therefore leaves the tracker naming a complete checkpoint; at worst
a stray temporary file remains, and the next run removes those
(:func:`remove_stale_temporaries`, only names of exactly our pattern).

:func:`save_directory_problem` is the startup check of ``--save``: create it,
write and remove a probe, and remove what it created, so an unwritable
directory is reported before training rather than at the first save, and a
start refused later leaves nothing behind.

Loading uses ``torch.load(..., weights_only=True)``, which refuses arbitrary
pickled objects, so a checkpoint holds only tensors and plain containers of
primitives. A corrupt or truncated file is reported as :class:`CheckpointError`
naming the file; nothing on disk is touched on that path.

The RNG state saved and restored is torch's (CPU and CUDA), which is all the
training draws from. Python's ``random`` is left alone on purpose: it is where
OpenTelemetry draws trace and span ids, and restoring it would make a resumed
run repeat the ids its predecessor wrote into the same trace file.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import nn

from megatron.training.distributed import barrier, print_rank_0, unwrap_model
from megatron.training.job_config import JobConfig, ModelConfig

__all__ = [
    "TRACKER_FILENAME",
    "CheckpointError",
    "TrainState",
    "checkpoint_path",
    "empty_directory",
    "has_checkpoint",
    "load_checkpoint",
    "remove_stale_temporaries",
    "save_checkpoint",
    "save_directory_problem",
    "sidecar_path",
]

TRACKER_FILENAME = "latest_checkpointed_iteration.txt"
CHECKPOINT_FILENAME = "model_optim_rng.pt"
#: Small per-rank files a save may write beside the checkpoint (the live
#: goodput metrics' carry-forward record): ``goodput_rank<R>.json``.
SIDECAR_PATTERN = r"goodput_rank\d+\.json"

_log = logging.getLogger(__name__)

# What _create_temporary names its temporaries: a dot, the final name, a dot,
# eight random characters, ".tmp".
_FINAL_NAMES = "|".join([*map(re.escape, (CHECKPOINT_FILENAME, TRACKER_FILENAME)), SIDECAR_PATTERN])
_TEMPORARY = re.compile(rf"\.(?:{_FINAL_NAMES})\.[a-z0-9_]{{8}}\.tmp")
_ITERATION_DIR = re.compile(r"iter_\d{7,}")
# How often the --save probe retries when another rank removed the directory under it.
_PROBE_ATTEMPTS = 5


class CheckpointError(Exception):
    """A checkpoint that cannot be loaded; the message names the file."""


@dataclass
class TrainState:
    """Everything a checkpoint captures, and the loop's progress counters.

    ``iteration`` counts completed iterations (Megatron's convention: the
    checkpoint saved after 10 iterations is ``iter_0000010`` and a run resumed
    from it executes iteration 10 next); ``consumed_samples`` is where the data
    continues.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    iteration: int = 0
    consumed_samples: int = 0


def checkpoint_path(directory: str | os.PathLike[str], iteration: int) -> Path:
    return Path(directory) / f"iter_{iteration:07d}" / CHECKPOINT_FILENAME


# ---------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------


def save_checkpoint(
    directory: str | os.PathLike[str],
    state: TrainState,
    config: JobConfig,
    is_rank_0: bool,
    sidecar: tuple[str, bytes] | None = None,
) -> None:
    """Write the checkpoint for ``state.iteration`` (rank 0 writes; every rank waits for it).

    ``sidecar`` (name, bytes): a small file this rank writes beside the
    checkpoint, whatever its rank (the exporting rank's goodput record), before
    the tracker names the checkpoint. It is telemetry's: failing to write it
    is logged, never raised.
    """
    barrier()
    if sidecar is not None:
        _write_sidecar(checkpoint_path(directory, state.iteration).parent, *sidecar)
    if is_rank_0:
        path = checkpoint_path(directory, state.iteration)
        path.parent.mkdir(parents=True, exist_ok=True)
        contents = {
            "iteration": state.iteration,
            "consumed_samples": state.consumed_samples,
            "model": unwrap_model(state.model).state_dict(),
            "optimizer": state.optimizer.state_dict(),
            "scheduler": state.scheduler.state_dict(),
            "args": _saved_args(config),
            "rng": _rng_state(),
        }
        _write_atomically(path, lambda f: torch.save(contents, f))
        tracker = Path(directory) / TRACKER_FILENAME
        _write_atomically(tracker, lambda f: f.write(f"{state.iteration}\n".encode()))
        print_rank_0(f"saved checkpoint at iteration {state.iteration:7d} to {directory}")
    barrier()


def _saved_args(config: JobConfig) -> dict[str, Any]:
    """The arguments recorded in a checkpoint, under Megatron-LM's names.

    The model's shape is checked on load (:func:`_check_model_args`); the rest
    is a record of how the checkpoint was trained.
    """
    model, training = config.model, config.training
    return {
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "seq_length": model.seq_length,
        "micro_batch_size": training.micro_batch_size,
        "global_batch_size": training.global_batch_size,
        "train_iters": training.train_iters,
        "lr": config.optimizer.lr,
        "seed": training.seed,
    }


def _write_sidecar(folder: Path, name: str, payload: bytes) -> None:
    if not re.fullmatch(SIDECAR_PATTERN, name):
        raise ValueError(f"sidecar name {name!r} does not match {SIDECAR_PATTERN}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _write_atomically(folder / name, lambda f: f.write(payload))
    except OSError as exc:
        _log.warning("could not write %s beside the checkpoint: %s", folder / name, exc)


def sidecar_path(directory: str | os.PathLike[str], iteration: int, name: str) -> Path:
    """Where the sidecar ``name`` of the checkpoint of ``iteration`` is (it may not exist)."""
    return checkpoint_path(directory, iteration).parent / name


def _write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    fd, tmp_name = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _create_temporary(path: Path) -> tuple[int, str]:
    """A new file beside ``path`` named ``.<name>.<8 random>.tmp``, open for writing.

    Created with mode 0o666 less the umask, as ``open(path, "wb")`` (and so
    ``torch.save`` to a path) would: ``mkstemp``'s 0o600 would make every
    checkpoint unreadable to the rest of a team sharing the directory.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        name = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(name, flags, 0o666), name
        except FileExistsError:
            continue


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def remove_stale_temporaries(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries a save killed mid-write left in ``directory``.

    Only names of exactly the pattern :func:`_write_atomically` uses, in the
    checkpoint directory and its ``iter_*`` directories, are touched; each
    can be as large as a checkpoint. Call it where no save is running (rank
    0, at startup). Returns what was removed.
    """
    root = Path(directory)
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    folders = [root, *(p for p in root.iterdir() if _ITERATION_DIR.fullmatch(p.name))]
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if _TEMPORARY.fullmatch(path.name) and path.is_file():
                path.unlink(missing_ok=True)
                removed.append(path)
    if removed:
        print_rank_0(f"removed {len(removed)} temporary file(s) left by an interrupted save")
    return removed


def not_a_directory(path: str | os.PathLike[str]) -> bool:
    """Whether something other than a directory stands at ``path``, in one look.

    Two looks (exists, then is-a-directory) can straddle another rank's
    :func:`save_directory_problem`, which creates the directory and removes it
    again: there, then gone, it read as a file that is not a directory.
    """
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False  # nothing there (or a parent is a file: the save check says so)


def save_directory_problem(directory: str | os.PathLike[str]) -> str | None:
    """Why checkpoints cannot be written to ``directory``, or None when they can.

    Creates the directory (as the first save would) and writes and removes a
    probe file in it, then removes the directories this call created, so a
    start that stops later on bad input finds the disk as it was; the first
    save (or the telemetry files under ``--save``) creates them for real.
    Several ranks may check at once: each probe has a name of its own, and a
    directory another rank is probing in is not empty, so it stays.
    """
    path = Path(directory)
    missing = []
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            break
        missing.append(candidate)
    problem = None
    for attempt in range(_PROBE_ATTEMPTS):
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".write_probe.", dir=path)
            os.close(fd)
            os.unlink(probe)
            break
        except OSError as exc:
            # Another rank's check may have removed the directory between our
            # mkdir and our probe: make it again (a path that cannot exist
            # fails every attempt).
            if isinstance(exc, FileNotFoundError) and attempt + 1 < _PROBE_ATTEMPTS:
                continue
            cause = exc.strerror or exc
            problem = f"--save {directory}: cannot create or write checkpoints there ({cause})"
            break
    for created in missing:  # innermost first
        try:
            created.rmdir()
        except OSError:
            break
    return problem


def empty_directory(directory: str | os.PathLike[str], is_rank_0: bool) -> None:
    """Remove ``directory`` and its contents, so a run starts from nothing (``--demo``)."""
    if is_rank_0:
        shutil.rmtree(directory, ignore_errors=True)
    barrier()


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def has_checkpoint(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` names a latest checkpoint (its tracker file exists)."""
    return (Path(directory) / TRACKER_FILENAME).is_file()


def load_checkpoint(
    directory: str | os.PathLike[str], state: TrainState, model: ModelConfig
) -> None:
    """Restore ``state`` from the latest checkpoint in ``directory``, if there is one.

    A directory without a tracker file means "start from scratch" (Megatron's
    behaviour: the first run of a job usually passes the same --load as its
    resumptions), and ``state`` is left as it is. Anything unreadable raises
    :class:`CheckpointError`.
    """
    tracker = Path(directory) / TRACKER_FILENAME
    if not tracker.is_file():
        print_rank_0(
            f"WARNING: could not find the checkpoint tracker {tracker}; "
            "will not load any checkpoint and will start from random"
        )
        return
    iteration = _read_tracker(tracker)
    path = checkpoint_path(directory, iteration)
    try:
        contents = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(
            f"{tracker} names iteration {iteration}, but {path} is missing"
        ) from None
    except Exception as exc:  # noqa: BLE001 -- unpickling, zip and I/O errors alike
        # The exception type is enough to tell truncation from garbage; torch's
        # own messages run to many lines and suggest weights_only=False.
        raise CheckpointError(
            f"checkpoint {path} is corrupt or truncated ({type(exc).__name__})"
        ) from None
    try:
        _check_model_args(contents["args"], model, path)
        unwrap_model(state.model).load_state_dict(contents["model"])
        state.optimizer.load_state_dict(contents["optimizer"])
        state.scheduler.load_state_dict(contents["scheduler"])
        _set_rng_state(contents["rng"])
        state.iteration = int(contents["iteration"])
        state.consumed_samples = int(contents["consumed_samples"])
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint {path} cannot be restored: {exc!r}") from None
    print_rank_0(f"loaded checkpoint from {directory} at iteration {state.iteration}")


def _read_tracker(tracker: Path) -> int:
    text = tracker.read_text(encoding="utf-8", errors="replace").strip()
    try:
        iteration = int(text)
    except ValueError:
        iteration = -1
    if iteration < 0:
        raise CheckpointError(
            f"checkpoint tracker {tracker} is corrupt: expected an iteration number, got {text!r}"
        )
    return iteration


def _check_model_args(saved: dict[str, Any], model: ModelConfig, path: Path) -> None:
    """Refuse a checkpoint of another shape, naming each flag that differs."""
    # Field names are the flags' (num_layers is --num-layers), in flag order.
    mismatched = [
        f"--{name.replace('_', '-')} {value} (checkpoint: {saved.get(name)})"
        for name, value in dataclasses.asdict(model).items()
        if saved.get(name) != value
    ]
    if mismatched:
        raise CheckpointError(
            f"checkpoint {path} was saved with a different model: {', '.join(mismatched)}"
        )


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
