"""Megatron-LM's own ``tests/unit_tests/telemetry``, run on this project's base layer.

The tests are copied out of ``MEGATRON_LM_DIR`` into a folder where
``megatron.core.telemetry`` resolves to this project's package (no Megatron-LM
tree on ``sys.path``), so every name of Megatron-LM's API they use is looked up
on ours: a rename such as ``MegatronSpanGroup._PRESETS`` -> ``PRESETS`` fails
here. They run twice: with nemo-lens installed (as Megatron-LM's ``dev`` extra
has it) and with it hidden (the sitecustomize makes ``nemo.lens`` fail to import),
where Megatron-LM's tests check its no-op fallbacks.

One of Megatron-LM's tests is not run without nemo-lens:
``test_resolve_without_nemo_lens_raises`` asserts that Megatron-LM's stand-in
``SpanGroup`` refuses to resolve a spec. This layer defines its groups itself
and resolves without nemo-lens on purpose (this project's trainer runs
without it); ``megatron/core/telemetry/README.md`` says so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from megatron_lm import HIDE_PACKAGES, SITE_DIR

import megatron.core.telemetry

TESTS = Path("tests/unit_tests/telemetry")
#: Megatron-LM's test of its nemo-lens-less stand-in, whose behaviour ours does not share.
STAND_IN_ONLY = "test_span_groups.py::TestResolve::test_resolve_without_nemo_lens_raises"


def _env(hide_nemo_lens: bool) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("MEGATRON_OTEL_", "NEMO_LENS_", "OTEL_", "MEGATRON_LM_TEST_"))
        and key != "PYTHONPATH"
    }
    if hide_nemo_lens:
        env.update(
            {
                "PYTHONPATH": str(SITE_DIR),
                "MEGATRON_LM_CPU_SHIMS": "1",
                HIDE_PACKAGES: "nemo.lens",
            }
        )
    return env


@pytest.mark.parametrize("nemo_lens", ["installed", "hidden"])
def test_megatron_lms_telemetry_tests_pass_on_our_base_layer(trees, tmp_path, nemo_lens):
    folder = tmp_path / "unit_tests" / "telemetry"
    shutil.copytree(trees.source / TESTS, folder)
    names = sorted(p.name for p in folder.glob("test_*.py"))
    assert names == ["test_fallbacks.py", "test_span_groups.py", "test_training_metrics.py"]
    hidden = nemo_lens == "hidden"
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "telemetry"]
    if hidden:
        command += ["--deselect", f"telemetry/{STAND_IN_ONLY}"]
    probe = (
        "import megatron.core.telemetry as layer\n"
        "try:\n    import nemo.lens\nexcept ImportError:\n    print(layer.__file__, 'hidden')\n"
        "else:\n    print(layer.__file__, 'installed')\n"
    )
    where = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=folder.parent,
        env=_env(hidden),
        capture_output=True,
        text=True,
        check=False,
    )
    assert where.stdout.split() == [megatron.core.telemetry.__file__, nemo_lens], (
        where.stdout + where.stderr
    )
    result = subprocess.run(
        command,
        cwd=folder.parent,
        env=_env(hidden),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    print(f"\nMegatron-LM's telemetry tests on our layer, nemo-lens {nemo_lens}: {summary}")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "failed" not in summary and "error" not in summary
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    skipped = re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", result.stdout)
    # Each run skips only the tests written for the other one (Megatron-LM's markers).
    other = "requires nemo-lens" if hidden else "only used without nemo-lens"
    assert skipped and all(other in reason for reason in skipped), skipped
    assert passed >= 60
    if hidden:
        assert "1 deselected" in summary
