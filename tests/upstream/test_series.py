"""The port's patch series on the real Megatron-LM tree, patch by patch.

``python -m megatron.training.port_upstream --series`` writes the pull requests
for a copy of ``MEGATRON_LM_DIR``; ``git am`` applies them one by one onto a
git repository of that copy, so each prefix of the series is a commit. For
every prefix: ``import megatron.training`` works with neither ``transitions``
nor OpenTelemetry importable; the tests it ships pass in Megatron-LM's pytest
with the OpenTelemetry SDK and without it, beside Megatron-LM's own
``tests/unit_tests/telemetry``. The first patch is then driven through
``training.py``'s own call sites on fakes (``call_sites.py``) against the
pristine file, scenario by scenario: zero differences. The whole series is the
tree the other tests in this folder run (``conftest.py``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from call_sites import Scenario, differences, normalised, run
from megatron_lm import HIDE_PACKAGES, apply_series, copy_tree, job_env

from megatron.training.port_upstream import series

MODULE = series.MODULE_DEST
SHIPPED = series.TESTS_DEST


@pytest.fixture(scope="module")
def prefixes(trees) -> list[str]:
    """The commits of the series in the repository it was applied to, oldest first."""
    log = subprocess.run(
        ["git", "log", "--format=%H %s", f"-{len(series.SITES)}"],
        cwd=trees.series_repo, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    commits = log.splitlines()[::-1]
    assert [line.split(" ", 1)[1] for line in commits] == [p.subject for p in series.patches()]
    return [line.split()[0] for line in commits]


def _checkout(repo: Path, commit: str) -> None:
    subprocess.run(["git", "checkout", "-q", commit], cwd=repo, check=True)


def test_each_patch_applies_with_git_am_on_the_one_before(trees, prefixes):
    """The conftest applied them in order; every file the series wrote is its own."""
    names = sorted(path.name for path in trees.series_dir.glob("*.patch"))
    assert len(names) == len(prefixes) == len(series.SITES)
    print(f"\n{len(names)} patches: " + ", ".join(name[:4] for name in names))


def test_the_tests_folder_gets_an_init_only_where_the_checkout_has_none(trees, tmp_path):
    """The pinned tree keeps no other test of ``tests/unit_tests/training``: the first
    patch adds its ``__init__.py`` (the copyright line, as ``tests/unit_tests/telemetry``'s).
    Megatron-LM's whole tree has one: the series leaves it alone and applies there too."""
    assert not (trees.pristine / series.TESTS_INIT).exists()
    assert (trees.ported / series.TESTS_INIT).read_bytes() == series.HEADER
    first = sorted(trees.series_dir.glob("0001-*.patch"))[0].read_text()
    assert f"+++ b/{series.TESTS_INIT}" in first
    whole = copy_tree(trees.source, tmp_path / "whole")
    (whole / series.TESTS_INIT).parent.mkdir(parents=True)
    (whole / series.TESTS_INIT).write_bytes(series.HEADER + b"# theirs\n")
    written = series.write_series(whole, tmp_path / "series")
    assert [p.name for p in written if str(series.TESTS_INIT) in p.read_text()] == []
    apply_series(whole, tmp_path / "series")
    assert (whole / series.TESTS_INIT).read_bytes() == series.HEADER + b"# theirs\n"


@pytest.mark.parametrize("number", range(1, len(series.SITES) + 1))
def test_every_prefix_imports_without_transitions_or_opentelemetry(
    trees, prefixes, tmp_path, number
):
    """megatron-core's wheel depends on neither: ``import megatron.training`` must not
    need them, whatever patch the tree is at."""
    _checkout(trees.series_repo, prefixes[number - 1])
    hidden = {HIDE_PACKAGES: "transitions,opentelemetry,nemo.lens"}
    env = job_env(trees.series_repo, tmp_path, telemetry=False, env=hidden)
    program = (
        "import sys, megatron.training, megatron.training.telemetry_spans as t\n"
        "assert t.Machine is None\n"
        "print(sorted(m for m in ('transitions', 'opentelemetry') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=False, timeout=300)  # fmt: skip
    assert done.returncode == 0, f"patch {number}:\n{done.stderr[-3000:]}"
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("sdk", ["with_sdk", "without_sdk"])
@pytest.mark.parametrize("number", range(1, len(series.SITES) + 1))
def test_every_prefix_passes_its_tests_and_megatron_lms_telemetry_tests(
    trees, prefixes, tmp_path, number, sdk
):
    _checkout(trees.series_repo, prefixes[number - 1])
    hide = {HIDE_PACKAGES: "opentelemetry.sdk"} if sdk == "without_sdk" else {}
    env = job_env(trees.series_repo, tmp_path, telemetry=False, env=hide)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
         "tests/unit_tests/telemetry", str(SHIPPED)],
        cwd=trees.series_repo, env=env, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, (
        f"patch {number} {sdk}:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
    )
    assert re.search(r"\b\d+ passed", summary), summary
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert [line for line in skipped if "test_telemetry_spans" in line] == []  # none of ours
    shipped = re.findall(rf"^PASSED {re.escape(str(SHIPPED))}::", done.stdout, re.M)
    assert len(shipped) >= 60, f"patch {number}: {len(shipped)} of the shipped tests passed"
    print(f"\npatch {number}, {sdk}: {summary}")


#: The cases the first patch must not change.
SCENARIOS = [
    Scenario("save_interval"),
    Scenario("save_interval_changed_before_the_loop", save_interval=3, save_interval_in_train=2),
    Scenario("no_save_interval", save_interval=0),
    Scenario("exception_out_of_train", fault_at=3),
    Scenario("startup_fault", startup_fault=True),
    Scenario("train_without_pretrain", calls=("train",)),
    Scenario("train_pretrain_train", calls=("train", "pretrain", "train")),
    Scenario("second_pretrain", calls=("pretrain", "pretrain")),
    Scenario("exit_interval", exit_at=3),
    Scenario("graceful_sigterm_job_on", exit_signal_handler=True, signal_at=2),
    Scenario("graceful_sigterm_job_off", exit_signal_handler=True, signal_at=2, groups=("step",)),
    Scenario("hard_sigterm", signal_at=2),
    Scenario("hard_sigterm_previous_handler", signal_at=2, previous="handler"),
    Scenario("hard_sigterm_ignored", signal_at=2, previous="ignore"),
    Scenario("hard_sigterm_in_startup", signal_at=-1),
    Scenario("hard_sigterm_in_startup_survived", signal_at=-1, previous="handler"),
    Scenario("atexit", interrupt_at=3),
    Scenario("no_telemetry", telemetry="none"),
    Scenario("telemetry_not_exporting", telemetry="not_exporting"),
    Scenario("nothing_to_train", first_iteration=5),
    # Telemetry that fails: what raised before raises, what was swallowed is.
    Scenario("start_span_of_startup_fails", faults={"start:megatron.startup": 1}),
    Scenario("start_span_of_a_phase_fails", faults={"start:megatron.startup.imports": 1}),
    Scenario("start_span_of_an_interval_fails_once", faults={"start:megatron.train": 1}),
    Scenario("startup_has_no_context", faults={"context:megatron.startup": True}),
    Scenario("an_interval_has_no_context", faults={"context:megatron.train": True}),
    Scenario("set_attribute_fails", faults={"attribute": True}),
    Scenario("spans_not_recording", faults={"not_recording": True}),
    Scenario("link_fails", faults={"link": True}),
    Scenario("detach_fails", faults={"detach": True}),
    Scenario("handle_shutdown_fails_once", faults={"shutdown": 1}),
    Scenario(
        "launch_window",
        timestamps={
            "slurm_job_start_time": 80.0,
            "launch_script_start": 90.0,
            "launch_script_presrun": 95.0,
            "program_start": 100.0,
            "main_entry": 101.0,
            "pretrain_entry": 102.0,
        },
    ),
]


@pytest.fixture(scope="module")
def first_patch(trees, prefixes, tmp_path_factory) -> Path:
    """The tree at the first patch, copied out (its training.py and module)."""
    _checkout(trees.series_repo, prefixes[0])
    out = tmp_path_factory.mktemp("first_patch")
    for relative in (Path("megatron/training/training.py"), MODULE):
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        (out / relative).write_bytes((trees.series_repo / relative).read_bytes())
    return out


def test_the_first_patch_acts_on_a_sigterm_in_the_final_shutdown_at_once_as_before(
    trees, first_patch, tmp_path
):
    """A SIGTERM during pretrain()'s final shutdown: the pristine handler calls the
    handle's shutdown() again at once and the default action kills the process in the
    middle of the first call; the first patch does the same (acting on a signal once
    telemetry code is left is a later patch's change, stated there)."""
    training = Path("megatron/training/training.py")
    scenario = Scenario("signal_in_final_shutdown", signal_in_shutdown=True)
    theirs = run(trees.pristine / training, None, scenario, tmp_path / "pristine")
    ours = run(first_patch / training, first_patch / MODULE, scenario, tmp_path / "first")
    assert theirs["returncode"] == ours["returncode"] == -15
    events = [[e["event"] for e in r["events"] if e["event"] != "end"] for r in (theirs, ours)]
    assert events[0][-2:] == ["handle_shutdown", "handle_shutdown"]  # again, mid-flush
    assert events[1] == events[0]
    spans = [[e for e in r["events"] if e["event"] == "end"] for r in (theirs, ours)]
    assert normalised(spans[0]) == normalised(spans[1])


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_the_first_patch_changes_no_behaviour(trees, first_patch, tmp_path, scenario):
    """Through training.py's own call sites, pristine and at the first patch, on the
    same fakes: the same spans, flushes, shutdowns, previous-handler calls, exit."""
    training = Path("megatron/training/training.py")
    theirs = run(trees.pristine / training, None, scenario, tmp_path / "pristine")
    ours = run(first_patch / training, first_patch / MODULE, scenario, tmp_path / "first")
    assert ours["returncode"] == theirs["returncode"], ours["stderr"][-2000:]
    assert theirs["events"], "the pristine run recorded nothing"
    found = list(differences(normalised(theirs["events"]), normalised(ours["events"])))
    assert found == [], "\n".join(found[:10])
    spans = sum(event["event"] == "end" for event in theirs["events"])
    print(f"\n{scenario.name}: exit {theirs['returncode']}, {spans} spans alike")
