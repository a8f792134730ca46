"""Real subprocesses, the one harness: the trainer's CLI and scripts driving a lifecycle.

What the end-to-end tests check (exit status, death by signal, what reached the
trace file before a SIGKILL) only exists at the process level. Every child
gets the same environment (:func:`subprocess_env`): this checkout importable,
unbuffered output, and none of the caller's telemetry, SLURM or torchrun
settings. :class:`Process` is a child whose output is read as it runs, for the
tests that signal it mid-run; :class:`TrainingCLI` runs
``python -m megatron.training`` to completion or starts it as a
:class:`Process`; :class:`ScriptRun` is a :class:`Process` running a script
written on :data:`SCRIPT_PRELUDE`.

Every child also starts with the default action of the signals the tests send
it, however the suite itself was started (:func:`give_children_default_signals`,
which ``tests/conftest.py`` applies to the whole test session).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# A model small enough that an iteration takes milliseconds on one CPU core.
TINY_MODEL = (
    "--mock-data",
    "--num-layers", "2",
    "--hidden-size", "32",
    "--num-attention-heads", "2",
    "--seq-length", "32",
    "--micro-batch-size", "2",
)  # fmt: skip
TINY = (*TINY_MODEL, "--log-interval", "1")

TELEMETRY_ON = ("--otel-enabled", "--otel-span-groups", "per_step")

#: ``python`` arguments that start torchrun with two ranks on this node, before the
#: script or ``-m module`` it launches. ``--standalone``: torchrun's agent binds its
#: store on a port the kernel picks (port 0) and the ranks reach it through that
#: store, so no test picks a free port, closes it and hopes no other process on the
#: machine takes it in the seconds before torchrun binds it.
TORCHRUN_2 = ("-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
              "--nproc-per-node", "2")  # fmt: skip

_DROPPED_PREFIXES = ("MEGATRON_", "NEMO_LENS_", "OTEL_", "SLURM_")
_DROPPED_NAMES = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})


def subprocess_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without its telemetry, SLURM and torchrun settings.

    This checkout comes first on ``PYTHONPATH``; ``extra`` is applied last.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(_DROPPED_PREFIXES) and key not in _DROPPED_NAMES
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


#: The signals whose default action (death by the signal) a test expects of a child
#: it sends one to. SIGPIPE, the fourth, is not among them: Python ignores it in
#: itself, and ``subprocess`` resets it in every child (``restore_signals``, on by
#: default), whatever this process inherited.
CHILD_DEFAULT_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def _still_ignored(signum: int, frame: object) -> None:
    """Stands for SIG_IGN in this process (:func:`give_children_default_signals`)."""


def give_children_default_signals() -> None:
    """Have every child this process starts from now on begin with the default action of
    :data:`CHILD_DEFAULT_SIGNALS`, while this process goes on ignoring those it ignores.

    A non-interactive shell starts a background job with SIGINT (and SIGQUIT)
    ignored (``bash -c 'tox &'``), ``nohup`` starts its command with SIGHUP
    ignored, and an ignored signal stays ignored through fork and exec: the
    trainer a test interrupts would not notice the signal. A caught signal,
    though, is reset to its default action by exec. So each of these signals
    this process ignores is given a handler that does nothing: this process
    still carries on when it arrives (a system call it interrupts is retried,
    PEP 475), and every program it starts (through this harness, by a test's
    own ``subprocess`` call, or through a launcher such as torchrun, down to
    its ranks) begins with the default action. Signals this process does not
    ignore are left as they are: exec resets a handler, and SIG_DFL is
    inherited as it is.

    Not ``preexec_fn`` (unsafe in a process with threads, and the harness reads
    every child's output in threads), and not SIG_DFL here: a Ctrl-C meant for
    the shell's foreground job, or the hangup ``nohup`` guards against, would
    then end the test run itself. Main thread only (``signal.signal``'s rule);
    calling it again changes nothing.
    """
    for signum in CHILD_DEFAULT_SIGNALS:
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, _still_ignored)


#: ``python -c IGNORING_THEN_EXEC SIGNAL[,SIGNAL...] PROGRAM ARG...``: runs PROGRAM (in
#: the same process: the pid a test signals is PROGRAM's) with those signals ignored,
#: as a shell's background job (SIGINT, SIGQUIT) or ``nohup`` (SIGHUP) starts it.
#: SIGPIPE and SIGXFSZ, which Python ignores in itself, go back to their default
#: first, as ``subprocess`` leaves them; a signal named here is ignored all the same.
IGNORING_THEN_EXEC = textwrap.dedent(
    """
    import os, signal, sys

    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    for name in sys.argv[1].split(","):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    os.execvp(sys.argv[2], sys.argv[2:])
    """
)


def ignoring(signals: Iterable[str], argv: Sequence[str]) -> list[str]:
    """The command line that runs ``argv`` with ``signals`` (names) ignored from its start."""
    return [sys.executable, "-c", IGNORING_THEN_EXEC, ",".join(signals), *argv]


def kill_job(job: subprocess.Popen) -> None:
    """SIGKILL ``job`` (a trainer, or a torchrun job) and every process under it at
    once, as a scheduler ends a job: torchrun starts its ranks in sessions of their own (its
    process group is not enough), so the tree is read from ``/proc``, every process of it
    stopped first (none can see another die and react, by an exception path that ends
    and flushes its spans), then killed."""
    stopped: set[int] = set()
    for _ in range(10):  # until the tree holds no process that was not stopped
        family = {job.pid, *_descendants(job.pid)} - stopped
        if not family:
            break
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= family
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    job.wait()


def _descendants(pid: int) -> set[int]:
    """Every process whose parent chain leads to ``pid`` (from ``/proc``)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


class Process:
    """A child process whose stdout lines and stderr are collected by threads as it runs."""

    def __init__(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> None:
        self.process = subprocess.Popen(
            list(argv),
            cwd=str(cwd),
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: list[str] = []
        self._stderr_parts: list[str] = []
        self._seen = 0  # lines wait_for has looked at
        self._stdout_closed = False
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self._lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._stdout_closed = True
            self._changed.notify_all()

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for chunk in self.process.stderr:
            self._stderr_parts.append(chunk)

    @property
    def stdout(self) -> str:
        """Everything printed so far."""
        return "".join(line + "\n" for line in list(self._lines))

    @property
    def stderr(self) -> str:
        return "".join(self._stderr_parts)

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def lines_starting(self, prefix: str) -> list[str]:
        return [line for line in list(self._lines) if line.startswith(prefix)]

    def wait_for(self, marker: str, timeout: float = 30.0) -> str:
        """The next stdout line starting with ``marker``; fails the test if none comes."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                while self._seen < len(self._lines):
                    line = self._lines[self._seen]
                    self._seen += 1
                    if line.startswith(marker):
                        return line
                if self._stdout_closed:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
        if self._stdout_closed:
            self._reap(timeout=5)
            pytest.fail(f"process ended before printing {marker!r}; {self.describe()}")
        self.kill()
        pytest.fail(f"timed out waiting for {marker!r}; {self.describe()}")

    def wait_until(self, condition: Callable[[], bool], timeout: float = 60) -> None:
        """Poll ``condition`` while the process runs; fails the test if it exits first."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                pytest.fail(f"process exited early ({self.process.returncode}):\n{self.stderr}")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"condition not reached in {timeout}s:\n{self.stdout}\n{self.stderr}")
            time.sleep(0.05)

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 60) -> int:
        """Wait for the exit and for all output; fails the test (after a kill) on timeout."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"process did not end within {timeout}s; {self.describe()}")
        self._reap(timeout=5)
        return self.process.returncode

    def _reap(self, timeout: float) -> None:
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        for reader in self._readers:  # the output's end (EOF) after the exit; 60 s: a hang
            reader.join(timeout=60)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def describe(self) -> str:
        return (
            f"returncode={self.process.returncode}\n--- stdout ---\n{self.stdout}"
            f"--- stderr ---\n{self.stderr}"
        )


class TrainingCLI:
    """Runs ``python -m megatron.training`` in a directory, with the repo importable."""

    TINY = TINY
    TELEMETRY_ON = TELEMETRY_ON

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return subprocess_env(extra)

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

    def start(self, *args: str, env: dict[str, str] | None = None) -> Process:
        return Process(
            [sys.executable, "-m", "megatron.training", *args], cwd=self.cwd, env=self.env(env)
        )

    def killed_then_resumed(
        self, args: Sequence[str], trace: Path, *, load: str, resume_iters: int
    ) -> subprocess.CompletedProcess[str]:
        """Run ``args`` (which save checkpoints) towards 100 slow iterations, SIGKILL it once
        iteration 12 is finished in ``trace``, then resume from ``load`` to ``resume_iters``."""
        trainer = self.start(
            *args, "--train-iters", "100", env={"MEGATRON_TEST_ITERATION_SLEEP": "0.2"}
        )
        trainer.wait_until(lambda: finished_iteration(trace, 12))
        trainer.kill()
        assert trainer.process.returncode == -signal.SIGKILL
        return self.run(*args, "--train-iters", str(resume_iters), "--load", load)


def finished_iteration(trace: Path, iteration: int) -> bool:
    """Whether ``trace`` holds a finished ``megatron.train.iteration`` numbered ``iteration``
    or later (exported: the batch that holds it is on disk)."""
    from megatron.trace.otlp.reader import read_spans

    return trace.exists() and any(
        s["name"] == "megatron.train.iteration"
        and s["attributes"]["megatron.iteration"] >= iteration
        for s in read_spans(trace)
    )


SCRIPT_PRELUDE = textwrap.dedent(
    """
    import json
    import os
    import signal
    import sys
    import time

    from megatron.core.telemetry import TelemetryConfig, setup_telemetry
    # The trainer's lifecycle and exit hooks (SIGHUP and SIGINT too), as it runs them.
    from megatron.training.telemetry.lifecycle import TRAINER_EXIT_HOOKS as EXIT_HOOKS
    from megatron.training.telemetry.lifecycle import TrainerSpanPhases as SpanPhases
    from megatron.training.telemetry.lifecycle import install_exit_hooks

    TRACE_FILE = sys.argv[1]


    def say(*parts):
        print(*parts, flush=True)

    def telemetry_code(source, **names):
        '''The definitions in ``source`` as code of the telemetry base layer: a signal
        that lands in their frames lands inside telemetry code, as in the SDK's.'''
        namespace = {"__name__": "megatron.core.telemetry.test_double", **names}
        exec(source, namespace)
        return namespace


    def make_handle():
        config = TelemetryConfig.from_env(
            env={
                "MEGATRON_OTEL_ENABLED": "1",
                "MEGATRON_OTEL_TRACE_FILE": TRACE_FILE,
                "MEGATRON_OTEL_SPAN_GROUPS": "per_step",
            }
        )
        handle = setup_telemetry(config, rank=0, world_size=1)
        assert handle.is_exporting, "the real handle is not exporting"
        return handle


    class Proxy:
        '''Any object with the handle surface is accepted by SpanPhases.'''

        def __init__(self, handle, tracer=None):
            self._handle = handle
            self.tracer = tracer if tracer is not None else handle.tracer
            self.is_exporting = handle.is_exporting
            self.span_groups = handle.span_groups
            self.shutdown_calls = 0

        def force_flush(self, *args, **kwargs):
            return self._handle.force_flush(*args, **kwargs)

        def shutdown(self, *args, **kwargs):
            self.shutdown_calls += 1
            return self._handle.shutdown(*args, **kwargs)
    """
)


class ScriptRun(Process):
    """A script written on :data:`SCRIPT_PRELUDE`, run with the trace file as ``argv[1]``."""

    def __init__(
        self,
        tmp_path: Path,
        body: str,
        name: str = "driver.py",
        extra_args: Iterable[str] = (),
    ) -> None:
        self.trace_file = tmp_path / "telemetry" / "traces.jsonl"
        self.script = tmp_path / name
        self.script.write_text(SCRIPT_PRELUDE + "\n" + textwrap.dedent(body))
        super().__init__(
            [sys.executable, str(self.script), str(self.trace_file), *extra_args],
            cwd=tmp_path,
            env=subprocess_env(),
        )

    def read_spans(self) -> list[dict]:
        from megatron.trace.otlp.reader import read_spans

        assert self.trace_file.exists(), f"no trace file written; {self.describe()}"
        return list(read_spans(self.trace_file))


def named(spans: Iterable[dict], name: str) -> list[dict]:
    return [s for s in spans if s["name"] == name]
