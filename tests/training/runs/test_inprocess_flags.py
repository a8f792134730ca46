"""``--inprocess-restart`` and Megatron-LM's other ``--inprocess-*`` flags, as parsed.

The runs themselves need NVIDIA Resiliency Extension and take minutes
(``tests/inprocess``, ``tox -e inprocess``); here: the flags' names, defaults and
checks, and the one line a user without NVRx gets, whether or not this
environment has it (the child hides it as an uninstalled package is hidden).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.training.arguments import parse_args

REPO_ROOT = Path(__file__).resolve().parents[3]

#: Runs ``python -m megatron.training ARGS...`` with NVRx not importable.
WITHOUT_NVRX = """
import runpy, sys
sys.modules["nvidia_resiliency_ext"] = None
sys.argv = ["megatron-pretrain", *sys.argv[1:]]
runpy.run_module("megatron.training", run_name="__main__", alter_sys=True)
"""


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "MEGATRON_OTEL_ENABLED"):
        monkeypatch.delenv(name, raising=False)


def test_without_nvrx_the_flag_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    argv = ["--mock-data", "--save", "ck", "--inprocess-restart"]
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_NVRX, *argv],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "megatron-pretrain: error: --inprocess-restart needs NVIDIA Resiliency Extension "
        "(nvidia-resiliency-ext), which is not installed: "
        "pip install 'megatron-telemetry-spans[inprocess]'"
    ]
    assert not (tmp_path / "ck").exists()  # it stopped before creating anything


def test_megatron_lm_s_flags_and_defaults(clean_env) -> None:
    options = parse_args(["--mock-data"]).inprocess
    assert not options.inprocess_restart
    assert options.inprocess_max_iterations is None
    assert (options.inprocess_soft_timeout, options.inprocess_hard_timeout) == (60.0, 90.0)
    assert (options.inprocess_heartbeat_interval, options.inprocess_heartbeat_timeout) == (30, 60)
    assert (options.inprocess_barrier_timeout, options.inprocess_completion_timeout) == (120, 120)
    assert (options.inprocess_last_call_wait, options.inprocess_termination_grace_time) == (1, 1)
    assert options.inprocess_monitor_thread_interval == 1.0
    assert options.inprocess_monitor_process_interval == 1.0
    assert options.inprocess_progress_watchdog_interval == 1.0
    assert (options.inprocess_granularity, options.inprocess_active_world_size) == ("node", 1)
    assert not options.inprocess_empty_cuda_cache
    given = parse_args(["--mock-data", "--inprocess-max-iterations", "3"]).inprocess
    assert given.inprocess_max_iterations == 3


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--inprocess-soft-timeout", "90"],
            "--inprocess-soft-timeout (90) must be less than --inprocess-hard-timeout (90), "
            "as NVRx requires",
        ),
        (
            ["--inprocess-heartbeat-interval", "60"],
            "--inprocess-heartbeat-interval (60) must be less than "
            "--inprocess-heartbeat-timeout (60), as NVRx requires",
        ),
        (
            ["--inprocess-active-world-size", "2"],
            "--inprocess-active-world-size (2) must equal the world size (1): this trainer "
            "keeps no spare ranks",
        ),
    ],
)
def test_a_value_nvrx_refuses_is_one_line_at_parse_time(clean_env, capsys, argv, says) -> None:
    """Checked before NVRx's presence: a bad value is the user's to fix either way."""
    with pytest.raises(SystemExit) as exited:
        parse_args(["--mock-data", "--inprocess-restart", *argv])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == f"megatron-pretrain: error: {says}"
