"""``telemetry_spans.py`` spells its own names; the reader's vocabulary must agree.

The module is copied byte for byte into Megatron-LM, where ``megatron.trace_format``
does not exist, so it cannot import the reader's ``semconv``. This holds the two
spellings equal, name by name, and keeps the module free of imports that would
not resolve in Megatron-LM.
"""

from __future__ import annotations

import ast
import inspect

import megatron.training.telemetry_spans as telemetry_spans
from megatron.trace_format import semconv

SHARED_NAMES = (
    "PRE_STARTUP_SPAN",
    "STARTUP_SPAN",
    "LAUNCH_SCRIPT_SPAN",
    "CONTAINER_LOAD_SPAN",
    "INTERVAL_SPAN",
    "IS_GOODPUT_SPAN",
    "MODEL_TYPE",
    "INTERVAL_INDEX",
    "INTERVAL_FIRST_ITERATION",
    "INTERVAL_LAST_ITERATION",
    "INTERVAL_REROOTED",
    "SHUTDOWN_REASON",
    "ERROR_TYPE",
)


def test_every_name_the_module_writes_is_the_readers():
    for name in SHARED_NAMES:
        assert getattr(telemetry_spans, name) == getattr(semconv, name), name


def test_every_upper_case_string_constant_is_checked():
    """A name added to the module without its reader counterpart fails here."""
    constants = {
        name
        for name, value in vars(telemetry_spans).items()
        if name.isupper() and isinstance(value, str) and not name.startswith("_")
    }
    assert constants - {"JOB_GROUP"} == set(SHARED_NAMES)
    assert telemetry_spans.JOB_GROUP == "job"


def test_imports_only_what_megatron_lm_has():
    """The standard library, transitions, and (inside functions) OpenTelemetry and nemo-lens."""
    tree = ast.parse(inspect.getsource(telemetry_spans))
    top, inner = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = (
                [node.module]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
            )
            target = top if node.col_offset == 0 else inner
            target.update(name.split(".")[0] for name in names if name)
    import sys

    assert {name for name in top if name not in sys.stdlib_module_names} == {"transitions"}
    assert {name for name in inner if name not in sys.stdlib_module_names} <= {
        "opentelemetry",
        "nemo",
    }
    assert "megatron" not in top | inner


_ALONE = r"""
import importlib.util, sys

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("opentelemetry", "nemo", "megatron"):
            raise ModuleNotFoundError(name)

sys.meta_path.insert(0, Absent())
spec = importlib.util.spec_from_file_location("telemetry_spans", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)

# Megatron-LM without its telemetry extra has no handle (get_telemetry() is None).
phases = module.SpanPhases(None, save_interval=2)
phases.start_job()
phases.start_train()
for i in range(5):
    phases.step(i)
phases.end_train()
try:
    phases.start_job()
except module.SpanPhaseError as err:
    print("rejected", err.trigger, err.state)
phases.shutdown()
print(phases.state, "opentelemetry" in sys.modules)
"""


def test_imports_and_runs_with_neither_opentelemetry_nor_megatron(tmp_path):
    """As in a Megatron-LM install without the telemetry extra: the module imports,
    the machine runs and rejects an illegal order, and OpenTelemetry is never loaded."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _ALONE, inspect.getsourcefile(telemetry_spans)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["rejected start_job ended", "shutdown False"]
