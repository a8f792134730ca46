from __future__ import annotations

import subprocess
import sys

import pytest

from megatron.core.telemetry import fallbacks


def test_trace_fn_returns_the_same_function() -> None:
    def work(x: int) -> int:
        return x + 1

    decorated = fallbacks.trace_fn("step", "work")(work)
    assert decorated is work
    assert decorated(1) == 2


def test_managed_span_yields_none_and_propagates() -> None:
    ran = []
    with fallbacks.managed_span("step", "s", tracer=object(), a=1) as span:
        ran.append(True)
        assert span is None
    assert ran == [True]

    error = RuntimeError("boom")
    with pytest.raises(RuntimeError) as info, fallbacks.managed_span("step", "s"):
        raise error
    assert info.value is error


def test_span_cm_yields_none_and_propagates() -> None:
    with fallbacks.span_cm("s", record_exception=False, a=1) as span:
        assert span is None
    error = KeyError("k")
    with pytest.raises(KeyError) as info, fallbacks.span_cm("s"):
        raise error
    assert info.value is error


def test_is_span_group_enabled_is_false() -> None:
    assert fallbacks.is_span_group_enabled("job") is False


def test_safe_set_span_attributes_accepts_anything() -> None:
    assert fallbacks.safe_set_span_attributes(None, {"a": 1}) is None
    assert fallbacks.safe_set_span_attributes(object(), {"a": object()}, redact_keys=["a"]) is None


def test_fallbacks_import_without_opentelemetry() -> None:
    # Block every opentelemetry import in a fresh interpreter.
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'opentelemetry':\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import importlib.util, pathlib\n"
        f"spec = importlib.util.spec_from_file_location('fb', {fallbacks.__file__!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "with mod.managed_span('job', 'x') as s: assert s is None\n"
        "assert not any(m.startswith('opentelemetry') for m in sys.modules)\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
