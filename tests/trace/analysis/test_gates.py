"""The gates for CI: exit 1 exactly when the bound is crossed, with one line saying which.

``report --fail-under-goodput PCT`` (and, with ``diff``, ``--fail-if-slower``
in ``test_diff.py``); ``megatron/trace/README.md``, "Gates for CI".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tracegen as g

from megatron.trace.analysis.gates import goodput_gate, percent_text
from megatron.trace.cli.main import COMMANDS, build_parser, main


@pytest.fixture
def three_quarters(tmp_path: Path) -> Path:
    """2 s of startup, then 6 s of iterations and no saves: goodput exactly 75 %."""
    return g.write(tmp_path / "t.jsonl", g.lifecycle(0, save=False))


@pytest.mark.parametrize(
    ("bound", "status"),
    [("0", 0), ("50", 0), ("74.99", 0), ("75", 0), ("75.0001", 1), ("80", 1), ("100", 1)],
)
def test_fail_under_goodput_exits_1_exactly_under_the_bound(
    three_quarters: Path, capsys, bound: str, status: int
) -> None:
    assert main(["report", str(three_quarters), "--fail-under-goodput", bound]) == status
    captured = capsys.readouterr()
    assert captured.out.startswith("wall clock")  # the report is printed either way
    if status:
        assert captured.err == (
            "megatron-trace report: goodput 75.0 % is under "
            f"--fail-under-goodput {float(bound):g} %\n"
        )
    else:
        assert captured.err == ""


def test_the_gate_line_comes_after_the_json_which_stays_last_on_stdout(
    three_quarters: Path, capsys
) -> None:
    assert main(["report", str(three_quarters), "--json", "--fail-under-goodput", "90"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[-1])["goodput_fraction"] == 0.75
    assert captured.err.splitlines() == [
        "megatron-trace report: goodput 75.0 % is under --fail-under-goodput 90 %"
    ]


def test_a_gate_on_goodput_not_computed_is_not_a_pass(tmp_path: Path, capsys) -> None:
    """No startup and no interval (the job span group off): nothing to judge, exit 2."""
    path = g.write(tmp_path / "t.jsonl", [g.span("megatron.checkpoint.save", 0, 1)])
    assert main(["report", str(path)]) == 0
    capsys.readouterr()
    assert main(["report", str(path), "--fail-under-goodput", "10"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        "megatron-trace report: error: --fail-under-goodput cannot judge: not computed: goodput:"
    )


@pytest.mark.parametrize("bad", ["-1", "eighty", "nan", "inf"])
def test_a_bound_that_is_no_percentage_is_a_bad_option(three_quarters, capsys, bad) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(three_quarters), "--fail-under-goodput", bad])
    assert exit_info.value.code == 2
    assert "expected a percentage" in capsys.readouterr().err


def test_the_line_never_reads_the_bound_itself() -> None:
    assert percent_text(79.96, 80) == "79.96"
    assert percent_text(71.34, 80) == "71.3"
    report = {
        "not_computed": [],
        "accounting_ns": {"wall": 10_000, "goodput": 7_999},
    }
    assert goodput_gate(report, 80) == "goodput 79.99 % is under --fail-under-goodput 80 %"
    assert goodput_gate({**report, "accounting_ns": {"wall": 10_000, "goodput": 8_000}}, 80) is None


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_every_help_lists_the_exit_statuses(command: str | None, capsys) -> None:
    text = _help([command] if command else [], capsys)
    epilog = text[text.index("exit status:") :]
    for status in ("0 success", "2 bad input", "141 the output pipe was closed"):
        assert status in epilog
    if command in (None, "check", "report", "diff"):
        assert "; 1 " in epilog
    if command == "report":
        assert "1 the goodput is under --fail-under-goodput" in epilog
    if command == "diff":
        assert "1 B's median iteration time is over --fail-if-slower" in epilog
    if command in ("timeline", "export"):
        assert "; 1 " not in epilog
    gated = command in (None, "report", "diff")
    assert ("a gate on a figure not computed" in epilog) == gated


@pytest.fixture
def killed_just_after_a_save(tmp_path: Path) -> list[Path]:
    """Two ranks killed 1.5 s after the save of iteration 5 ended (the SDK's 5 s export
    delay: the save's spans never reached the files), then resumed from that save: the
    killed incarnation's last seconds may have been progress that survived."""
    import ground_truth as gt

    history = gt.History(
        (gt.Plan(6, "killed", into=0.5, gap_s=40), gt.Plan(13)),
        ranks=2,
        save_interval=5,
        export_delay_s=(5.0, 3.0),
    )
    return gt.write(gt.simulate(history), tmp_path / "traces.jsonl")


def test_a_gate_on_a_bounded_goodput_judges_the_bounds(
    killed_just_after_a_save: list[Path], capsys
) -> None:
    """Exit 0 when even the lower bound reaches the threshold, 1 when even the upper one is
    under it, 2 (one line giving both) only when they straddle it."""
    files = [str(path) for path in killed_just_after_a_save]
    assert main(["report", "--json", *files]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    bound = report["bounds"]["goodput_s"]
    wall = report["accounting_ns"]["wall"] / 1e9
    lower, upper = 100 * bound["lower"] / wall, 100 * bound["upper"] / wall
    assert lower < upper
    assert main(["report", *files, "--fail-under-goodput", f"{lower - 0.5:.3f}"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["report", *files, "--fail-under-goodput", f"{upper + 0.5:.3f}"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("megatron-trace report: goodput at most ")
    assert f"--fail-under-goodput {upper + 0.5:.3f} %" in line
    middle = (lower + upper) / 2
    assert main(["report", *files, "--fail-under-goodput", f"{middle:.3f}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # a gate that cannot judge prints no report
    (line,) = captured.err.splitlines()
    assert "cannot judge: goodput between " in line and f"straddles {middle:.3f} %" in line
    assert "SIGKILLed" in line
