"""``telemetry_spans.py`` spells its own names; the reader's vocabulary must agree.

The module is what the port's patch series ends in, inside Megatron-LM, where
``megatron.trace_format`` does not exist, so it cannot import the reader's
``semconv``. This holds the two spellings equal, name by name, and keeps the
module free of imports that would not resolve in Megatron-LM.
"""

from __future__ import annotations

import ast
import inspect

import megatron.training.telemetry_spans as telemetry_spans
from megatron.trace_format import semconv

SHARED_NAMES = (
    "PRE_STARTUP_SPAN",
    "STARTUP_SPAN",
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
    # Spelled where they are written, once each: the folded launch window's phases.
    source = inspect.getsource(telemetry_spans)
    for name in ("LAUNCH_SCRIPT_SPAN", "CONTAINER_LOAD_SPAN"):
        assert source.count(f'"{getattr(semconv, name)}"') == 1, name


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
    """The standard library; ``transitions`` at import, where it may be missing (the
    ``otel`` extra brings it); OpenTelemetry only inside functions, once telemetry is on."""
    import sys

    tree = ast.parse(inspect.getsource(telemetry_spans))
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    inside = {id(n) for f in functions for n in ast.walk(f)}
    module_level, in_functions = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = (
                [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            )
            target = in_functions if id(node) in inside else module_level
            target.update(name.split(".")[0] for name in names if name)
    assert {n for n in module_level if n not in sys.stdlib_module_names} == {"transitions"}
    (guarded,) = [n for n in tree.body if isinstance(n, ast.Try)]  # its ImportError answered
    assert "transitions" in ast.unparse(guarded.body[0])
    assert [h.type.id for h in guarded.handlers] == ["ImportError"]
    assert {n for n in in_functions if n not in sys.stdlib_module_names} == {"opentelemetry"}


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
phases = module.SpanPhases(None, save_interval=2, strict=True)
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
