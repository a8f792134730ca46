"""Bad input: one clear message naming the flag or file, exit status 2, nothing damaged."""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import threading
from pathlib import Path

import pytest
import torch

from megatron.training.arguments import parse_args
from megatron.training.checkpointing import not_a_directory
from megatron.training.training_log import parse_log_losses

MODEL = ("--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2")


@pytest.fixture
def clean_env(monkeypatch):
    for name in (
        "WORLD_SIZE",
        "MEGATRON_OTEL_ENABLED",
        "MEGATRON_OTEL_EXPORTER",
        "OTEL_SERVICE_NAME",
    ):
        monkeypatch.delenv(name, raising=False)


def _one_error(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr
    return errors[0]


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (
            ["--mock-data", "--hidden-size", "30", "--num-attention-heads", "4"],
            ["--hidden-size", "--num-attention-heads"],
        ),
        (["--mock-data", "--num-layers", "0"], ["--num-layers"]),
        (["--mock-data", "--seq-length", "-3"], ["--seq-length"]),
        (
            ["--mock-data", "--micro-batch-size", "4", "--global-batch-size", "6"],
            ["--global-batch-size", "--micro-batch-size"],
        ),
        (["--mock-data", "--lr", "0.1", "--min-lr", "0.5"], ["--min-lr", "--lr"]),
        (["--mock-data", "--lr", "-1"], ["--lr"]),
        (["--mock-data", "--save-interval", "-1"], ["--save-interval"]),
        ([], ["--mock-data", "--data-path"]),
        (["--mock-data", "--data-path", "x.txt"], ["--mock-data", "--data-path"]),
        (["--mock-data", "--otel-exporter", "carrier-pigeon"], ["--otel-exporter", "jsonl"]),
        (["--mock-data", "--otel-span-groups", "default,bogus"], ["--otel-span-groups", "bogus"]),
        (["--mock-data", "--otel-enabled", "--otel-service-name", " "], ["--otel-service-name"]),
    ],
)  # fmt: skip
def test_invalid_flags_give_one_message_and_exit_2(argv, names, capsys, clean_env):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    message = _one_error(capsys.readouterr().err)
    for name in names:
        assert name in message


def test_data_path_problems_name_the_file(tmp_path, capsys, clean_env):
    missing = tmp_path / "nowhere.txt"
    with pytest.raises(SystemExit) as exc:
        parse_args(["--data-path", str(missing)])
    assert exc.value.code == 2
    assert str(missing) in _one_error(capsys.readouterr().err)

    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * 32)  # needs --seq-length + 1 = 33
    with pytest.raises(SystemExit) as exc:
        parse_args(["--data-path", str(short), "--seq-length", "32"])
    assert exc.value.code == 2
    message = _one_error(capsys.readouterr().err)
    assert str(short) in message and "--seq-length" in message


def test_save_onto_a_regular_file_is_refused(tmp_path, capsys, clean_env):
    target = tmp_path / "ckpt"
    target.write_text("not a directory")
    with pytest.raises(SystemExit):
        parse_args(["--mock-data", "--save", str(target)])
    assert "--save" in _one_error(capsys.readouterr().err)


def test_a_save_directory_another_rank_makes_and_removes_is_no_file(tmp_path):
    """Under torchrun each rank checks --save while another's write probe creates the
    directory and removes it again: looked at twice (there, then gone), it once read in CI
    as "exists and is not a directory". One look never does; a file still is one."""
    target = tmp_path / "ckpt"
    stop = threading.Event()

    def another_rank() -> None:
        while not stop.is_set():
            target.mkdir(exist_ok=True)
            target.rmdir()

    rank = threading.Thread(target=another_rank)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the two threads take turns between any two lines
    rank.start()
    try:
        seen = [not_a_directory(target) for _ in range(20_000)]
    finally:
        stop.set()
        rank.join()
        sys.setswitchinterval(interval)
    assert not any(seen)
    target.write_text("not a directory")
    assert not_a_directory(target) and not not_a_directory(tmp_path)


def test_demo_preset_yields_to_explicit_flags(clean_env):
    config = parse_args(["--demo", "--train-iters", "7", "--no-otel-enabled"])
    assert config.training.train_iters == 7 and config.telemetry.enabled is False
    assert config.telemetry.span_groups_spec == "per_step" and config.data.mock_data
    assert config.checkpoint.save == "runs/demo" and config.checkpoint.fresh_save_dir
    assert not parse_args(["--demo", "--save", "runs/demo"]).checkpoint.fresh_save_dir
    assert not parse_args(["--demo", "--load", "runs/demo"]).checkpoint.fresh_save_dir


# -- through the real entry point --------------------------------------------


@pytest.fixture(scope="module")
def saved_checkpoint(training_module_cli) -> Path:
    cli = training_module_cli
    result = cli.run(*cli.TINY, "--train-iters", "2", "--save", "ckpt", "--save-interval", "1")
    assert result.returncode == 0, result.stderr
    return cli.cwd / "ckpt"


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.mark.slow
def test_cli_flag_error_exits_2_before_anything_starts(training_cli):
    cli = training_cli
    result = cli.run(*cli.TINY, "--global-batch-size", "3", "--otel-enabled")
    assert result.returncode == 2
    assert "--global-batch-size" in _one_error(result.stderr)
    assert list(cli.cwd.iterdir()) == []  # no telemetry directory, nothing


@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "named_file"),
    [
        ("truncate", "iter_0000002/model_optim_rng.pt"),
        ("garbage", "iter_0000002/model_optim_rng.pt"),
        ("tracker", "latest_checkpointed_iteration.txt"),
        ("tracker-ahead", "iter_0000099/model_optim_rng.pt"),
    ],
)
def test_unreadable_checkpoint_exits_2_and_changes_nothing(
    training_cli, saved_checkpoint, damage, named_file
):
    cli = training_cli
    ckpt = cli.cwd / "ckpt"
    shutil.copytree(saved_checkpoint, ckpt)
    weights = ckpt / "iter_0000002" / "model_optim_rng.pt"
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage":
        weights.write_bytes(b"\x00not a checkpoint" * 100)
    elif damage == "tracker":
        tracker.write_text("release-candidate\n")
    else:
        tracker.write_text("99\n")
    before = _snapshot(ckpt)

    result = cli.run(*cli.TINY, "--train-iters", "4", "--load", "ckpt", "--save", "ckpt")

    assert result.returncode == 2, result.stderr
    message = _one_error(result.stderr)
    assert message.startswith("megatron-pretrain: error:")
    assert str(Path("ckpt") / named_file) in message
    assert _snapshot(ckpt) == before


@pytest.mark.slow
def test_load_without_a_tracker_starts_from_scratch(training_cli):
    cli = training_cli
    (cli.cwd / "empty").mkdir()
    result = cli.run(*cli.TINY, "--train-iters", "1", "--load", "empty")
    assert result.returncode == 0, result.stderr
    assert "will start from random" in result.stdout
    assert sorted(parse_log_losses(result.stdout)) == [1]


@pytest.mark.slow
def test_unwritable_trace_file_exits_2_naming_it(training_cli):
    cli = training_cli
    (cli.cwd / "blocked").write_text("a file, not a directory")
    result = cli.run(*cli.TINY, "--otel-enabled", "--otel-trace-file", "blocked/traces.jsonl")
    assert result.returncode == 2, result.stderr
    message = _one_error(result.stderr)
    assert "blocked/traces.jsonl" in message and "--otel-trace-file" in message


@pytest.mark.slow
def test_loading_into_a_different_model_names_the_flag(training_cli, saved_checkpoint):
    cli = training_cli
    shutil.copytree(saved_checkpoint, cli.cwd / "ckpt")
    args = [a if a != "32" else "48" for a in cli.TINY]  # --hidden-size and --seq-length
    result = cli.run(*args, "--train-iters", "4", "--load", "ckpt")
    assert result.returncode == 2, result.stderr
    message = _one_error(result.stderr)
    assert "--hidden-size 48 (checkpoint: 32)" in message
    assert "iter_0000002/model_optim_rng.pt" in message


def test_bad_hang_timeout_stops_the_job_at_startup(capsys, clean_env, monkeypatch):
    monkeypatch.setenv("MEGATRON_OTEL_HANG_TIMEOUT", "soon")
    with pytest.raises(SystemExit) as exc:
        parse_args(["--mock-data"])
    assert exc.value.code == 2
    message = _one_error(capsys.readouterr().err)
    assert "MEGATRON_OTEL_HANG_TIMEOUT='soon'" in message and "0 turns the watchdog off" in message


# -- a start that fails leaves the disk as it found it ------------------------


class _Payload:
    """Unpickling this would run a command: ``torch.load(weights_only=True)`` must refuse."""

    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


def _damage(ckpt: Path, how: str) -> None:
    weights = ckpt / "iter_0000002" / "model_optim_rng.pt"
    if how == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "corrupt":
        weights.write_bytes(b"\x00not a checkpoint" * 100)
    elif how == "empty":
        weights.write_bytes(b"")
    elif how == "pickle-payload":
        weights.write_bytes(pickle.dumps(_Payload()))
    elif how == "other-shape":
        torch.save({"weights": [1, 2, 3]}, weights)
    elif how == "tracker":
        (ckpt / "latest_checkpointed_iteration.txt").write_text("release-candidate\n")


def _listing(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a directory)."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "extra", "env", "named"),
    [
        *[
            (how, ("--load", "ckpt"), {}, name)
            for how, name in (
                ("corrupt", "iter_0000002/model_optim_rng.pt"),
                ("truncated", "iter_0000002/model_optim_rng.pt"),
                ("empty", "iter_0000002/model_optim_rng.pt"),
                ("pickle-payload", "iter_0000002/model_optim_rng.pt"),
                ("other-shape", "iter_0000002/model_optim_rng.pt"),
                ("tracker", "latest_checkpointed_iteration.txt"),
            )
        ],
        (
            "otlp-protocol",
            ("--otel-exporter", "otlp"),
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "bogus"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        ("export-rank", (), {"MEGATRON_OTEL_EXPORT_RANK": "3"}, "MEGATRON_OTEL_EXPORT_RANK"),
        ("trace-file-is-a-directory", ("--otel-trace-file", "adir"), {}, "adir"),
        ("trace-file-under-proc", ("--otel-trace-file", "/proc/x/t.jsonl"), {}, "/proc/x/t.jsonl"),
        ("trace-file-under-a-file", ("--otel-trace-file", "afile/t.jsonl"), {}, "afile/t.jsonl"),
        ("trace-file-read-only", ("--otel-trace-file", "{ro}/t.jsonl"), {}, "{ro}/t.jsonl"),
        ("trace-file-empty", ("--otel-trace-file", ""), {}, "--otel-trace-file=''"),
        ("trace-file-dot", ("--otel-trace-file", "."), {}, "--otel-trace-file='.'"),
        ("trace-file-slash", ("--otel-trace-file", "adir/"), {}, "--otel-trace-file='adir/'"),
        (
            "trace-file-env-dot",
            (),
            {"MEGATRON_OTEL_TRACE_FILE": "."},
            "MEGATRON_OTEL_TRACE_FILE='.'",
        ),
    ],
)
def test_a_start_that_fails_leaves_the_disk_as_it_found_it(
    training_cli, saved_checkpoint, request, case, extra, env, named
):
    cli = training_cli
    shutil.copytree(saved_checkpoint, cli.cwd / "ckpt")
    _damage(cli.cwd / "ckpt", case)
    (cli.cwd / "adir").mkdir()
    (cli.cwd / "afile").write_text("a file, not a directory\n")
    if "{ro}" in named:
        ro = request.getfixturevalue("read_only_mount")
        extra = tuple(a.replace("{ro}", str(ro)) for a in extra)
        named = named.replace("{ro}", str(ro))
    before = _listing(cli.cwd)

    result = cli.run(
        *cli.TINY, "--train-iters", "4", "--save", "fresh/ckpt", *cli.TELEMETRY_ON, *extra, env=env
    )

    assert result.returncode == 2, result.stderr
    message = _one_error(result.stderr)
    assert message.startswith("megatron-pretrain: error:") and named in message, message
    assert _listing(cli.cwd) == before  # no fresh/, no telemetry files, nothing run


WITHOUT_OTLP_EXTRA = """
import sys
for name in list(sys.modules):
    if name.startswith("opentelemetry.exporter.otlp"):
        del sys.modules[name]
sys.modules["opentelemetry.exporter.otlp"] = None  # as if the extra were not installed
from megatron.training.__main__ import main
main([{args}])
"""


@pytest.mark.slow
@pytest.mark.parametrize("case", ["otlp-without-the-extra", "export-rank-past-the-world"])
def test_setup_time_errors_point_to_help_like_argument_errors(training_cli, case):
    cli = training_cli
    argv = (*cli.TINY, "--train-iters", "1", "--otel-enabled")
    if case == "otlp-without-the-extra":
        args = ", ".join(repr(a) for a in (*argv, "--otel-exporter", "otlp"))
        result = cli.run_script(WITHOUT_OTLP_EXTRA.format(args=args))
        named = "megatron-telemetry-spans[otlp]"
    else:
        result = cli.run(*argv, env={"MEGATRON_OTEL_EXPORT_RANK": "1"})
        named = "MEGATRON_OTEL_EXPORT_RANK=1"
    assert result.returncode == 2, result.stderr
    assert named in _one_error(result.stderr)
    assert result.stderr.splitlines()[-1] == "See 'megatron-pretrain --help' for every flag."
