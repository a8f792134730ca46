"""No ``global`` statement and no module-level mutable span state
(the lifecycle object owns its spans, tokens and counter)."""

from __future__ import annotations

import ast
import contextvars

import pytest
from fake_handles import FakeHandle
from launch_times import launch_timestamps
from lifecycles import Lifecycles
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext
from processes import REPO_ROOT

import megatron.training.telemetry_spans as telemetry_spans

MODULE_PATH = REPO_ROOT / "megatron" / "training" / "telemetry_spans.py"

MUTABLE_NODES = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
MUTABLE_FACTORIES = {"list", "dict", "set", "defaultdict", "deque", "Counter", "OrderedDict"}


@pytest.fixture(scope="module")
def tree():
    return ast.parse(MODULE_PATH.read_text(encoding="utf-8"), filename=str(MODULE_PATH))


def test_no_global_or_nonlocal_statement(tree):
    found = [
        f"line {node.lineno}: {type(node).__name__} {', '.join(node.names)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Global | ast.Nonlocal)
    ]
    assert found == []


def _module_level_assignments(tree):
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            yield names, node.value, node.lineno
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield [node.target.id], node.value, node.lineno


def test_no_module_level_mutable_containers(tree):
    offenders = []
    for names, value, lineno in _module_level_assignments(tree):
        if names == ["__all__"] or value is None:
            continue
        is_mutable = isinstance(value, MUTABLE_NODES) or (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name | ast.Attribute)
            and (value.func.id if isinstance(value.func, ast.Name) else value.func.attr)
            in MUTABLE_FACTORIES
        )
        if is_mutable:
            offenders.append(f"line {lineno}: {names}")
    assert offenders == []


def test_no_module_level_span_placeholders(tree):
    """Nothing named like the upstream ``_otel_*`` globals, and no module-level
    ``None`` placeholder for a span, token, counter or flag to be filled in later."""
    suspicious = ("span", "token", "counter", "interval", "done", "active", "installed")
    offenders = []
    for names, value, lineno in _module_level_assignments(tree):
        for name in names:
            placeholder = isinstance(value, ast.Constant) and value.value in (None, False, True, 0)
            if name.lower().startswith("_otel") or (
                placeholder and any(word in name.lower() for word in suspicious)
            ):
                offenders.append(f"line {lineno}: {name}")
    assert offenders == []


def test_no_rebinding_through_globals(tree):
    """Module state cannot be smuggled in through ``globals()`` or ``sys.modules``."""
    offenders = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"globals", "vars"}
            and not node.args
        ):
            offenders.append(f"line {node.lineno}: {node.func.id}()")
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "modules"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            offenders.append(f"line {node.lineno}: sys.modules")
    assert offenders == []


def test_no_span_state_in_module_namespace_while_a_lifecycle_runs():
    """At run time, with an interval open, the module's namespace holds no span,
    span context, OTel context or context token."""
    with Lifecycles() as lifecycles:
        handle = FakeHandle()
        phases = lifecycles.new(handle, save_interval=2)
        phases.start_job(model_type="gpt", timestamps=launch_timestamps())
        phases.start_train()
        phases.step(0)
        forbidden_types = (Span, SpanContext, Context, contextvars.Token)
        offenders = {
            name: type(value).__name__
            for name, value in vars(telemetry_spans).items()
            if isinstance(value, forbidden_types)
        }
        assert offenders == {}
        phases.shutdown()
