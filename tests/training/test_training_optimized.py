"""The trainer's entry points work under ``python -OO``, which strips docstrings.

Code that builds text from ``__doc__`` (an argparse description, say) fails
there with ``AttributeError`` on ``None``; a user who runs optimised gets a
traceback instead of ``--help``.
"""

from __future__ import annotations

import pytest
from processes import TrainingCLI


@pytest.mark.parametrize(
    ("module", "usage"),
    [
        ("megatron.training", "usage: "),
        (
            "megatron.training.telemetry.diagrams",
            "usage: python -m megatron.training.telemetry.diagrams",
        ),
    ],
)
def test_help_works_under_python_OO(training_cli: TrainingCLI, module: str, usage: str) -> None:
    result = training_cli.run("--help", module=("-OO", "-m", module), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(usage), result.stdout
    assert "Traceback" not in result.stderr
