"""Fixtures shared by the training-side tests.

``lifecycles`` serves the span-lifecycle tests (``test_telemetry_spans_*.py``).
The ``training_*`` fixtures serve the end-to-end tests of the training loop
(``test_training_*.py``), which run the real trainer in subprocesses
(``python -m megatron.training``), because what they check (exit status, death
by signal, what reached the trace file before a SIGKILL) only exists at the
process level.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from lifecycles import Lifecycles

REPO_ROOT = Path(__file__).resolve().parents[2]

# A model small enough that an iteration takes milliseconds on one CPU core.
TINY = (
    "--mock-data",
    "--num-layers", "2",
    "--hidden-size", "32",
    "--num-attention-heads", "2",
    "--seq-length", "32",
    "--micro-batch-size", "2",
    "--log-interval", "1",
)  # fmt: skip

TELEMETRY_ON = ("--otel-enabled", "--otel-span-groups", "per_step")


class TrainingCLI:
    """Runs ``python -m megatron.training`` in a directory, with the repo importable."""

    TINY = TINY
    TELEMETRY_ON = TELEMETRY_ON

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("MEGATRON_", "NEMO_LENS_", "OTEL_", "SLURM_"))
            and key not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
        }
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        return env

    def run(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        module: Sequence[str] = ("-m", "megatron.training"),
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *module, *args],
            cwd=self.cwd,
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def run_script(self, source: str, *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run(module=("-c", source), timeout=timeout)

    def start(self, *args: str, env: dict[str, str] | None = None) -> RunningTrainer:
        out = self.cwd / "stdout.txt"
        err = self.cwd / "stderr.txt"
        with open(out, "w") as stdout, open(err, "w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "megatron.training", *args],
                cwd=self.cwd,
                env=self.env(env),
                stdout=stdout,
                stderr=stderr,
                text=True,
            )
        return RunningTrainer(process, out, err)


class RunningTrainer:
    """A trainer subprocess whose output goes to files, for signal tests."""

    def __init__(self, process: subprocess.Popen[str], stdout: Path, stderr: Path) -> None:
        self.process = process
        self.stdout_path = stdout
        self.stderr_path = stderr

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait_until(self, condition: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                pytest.fail(f"trainer exited early ({self.process.returncode}):\n{self.stderr}")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"condition not reached in {timeout}s:\n{self.stdout}\n{self.stderr}")
            time.sleep(0.05)

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def training_cli(tmp_path: Path) -> TrainingCLI:
    return TrainingCLI(tmp_path)


@pytest.fixture(scope="module")
def training_module_cli(tmp_path_factory: pytest.TempPathFactory) -> TrainingCLI:
    """One working directory shared by a module's tests (for runs worth reusing)."""
    return TrainingCLI(tmp_path_factory.mktemp("training"))


@pytest.fixture
def lifecycles() -> Iterator[Lifecycles]:
    """A factory of ``SpanPhases``, from an empty context, all shut down afterwards."""
    with Lifecycles() as made:
        yield made
