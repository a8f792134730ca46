"""Fixtures shared by the training-side tests.

The folders and files say what they test:

* ``telemetry_spans/``: the span lifecycle, ``megatron/training/telemetry_spans.py``,
  one file per concern; the ``lifecycles`` fixture serves them.
* ``test_port_upstream.py``: ``megatron/training/port_upstream/`` on checkouts it
  must refuse (the port on the real tree is ``tests/upstream``).
* ``telemetry/``: the trainer's telemetry modules, ``megatron/training/telemetry/``.
* ``runs/``: end-to-end runs of the trainer (``megatron/training/training.py``) in
  subprocesses through the one harness, ``tests/support/processes.py``; the
  ``training_*`` fixtures serve them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_handles import RecordingProvider
from fake_process import FakeProcess
from lifecycles import Lifecycles
from processes import TrainingCLI


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


@pytest.fixture
def tracer_provider(monkeypatch: pytest.MonkeyPatch) -> RecordingProvider:
    """The global tracer provider, recording the shared lifecycle's flushes."""
    from opentelemetry import trace

    provider = RecordingProvider()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    return provider


def _tmpfs(tmp_path, name: str, options: str, otherwise: str):
    """A tmpfs mounted with ``options`` while the test runs, where this process may mount
    one (else the test skips, saying which test ``otherwise`` covers the case)."""
    mount_point = tmp_path / name
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount here; {otherwise}")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


@pytest.fixture
def read_only_mount(tmp_path):
    """A real read-only filesystem (tmpfs mounted ro), where this process may mount one."""
    yield from _tmpfs(
        tmp_path, "ro-mount", "ro,size=1m", "the simulated EROFS test covers the check"
    )


@pytest.fixture
def small_mount(tmp_path):
    """A 96 KiB tmpfs, where this process may mount one: a disk that fills up mid-run."""
    yield from _tmpfs(
        tmp_path, "small-mount", "size=96k", "the simulated ENOSPC test covers the sink"
    )


@pytest.fixture
def fake_process(monkeypatch: pytest.MonkeyPatch) -> FakeProcess:
    """The process's atexit and signal calls, recorded instead of done."""
    return FakeProcess(monkeypatch)
