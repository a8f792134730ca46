"""OpenTelemetry spans and metrics for Megatron-style training.

The call-site API (``managed_span``, ``trace_fn``, ``span_cm``,
``is_span_group_enabled``, ``safe_set_span_attributes``) keeps Megatron-LM's
names and signatures; :mod:`.fallbacks` has no-op twins for environments
without OpenTelemetry. :func:`setup_telemetry` turns a
:class:`TelemetryConfig` into a :class:`TelemetryHandle` owning its own
providers.

Importing this package starts nothing: no thread, no file, no provider.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from megatron.core.telemetry.config import (
        TelemetryConfig,
        TelemetryConfigError,
        add_telemetry_args,
    )
    from megatron.core.telemetry.helpers import (
        managed_span,
        safe_set_span_attributes,
        span_cm,
        trace_fn,
    )
    from megatron.core.telemetry.processors import CUT_SHORT_ATTRIBUTE
    from megatron.core.telemetry.setup import TelemetryHandle, setup_telemetry
    from megatron.core.telemetry.span_groups import MegatronSpanGroup, SpanGroup
    from megatron.core.telemetry.state import is_span_group_enabled, set_enabled_span_groups
    from megatron.core.telemetry.training_metrics import record_training_metrics

# Name -> the submodule that defines it. Imported on first use (PEP 562), so a
# reader of trace files (megatron-trace, reader.py) does not load the
# OpenTelemetry SDK the rest of the package is built on.
_EXPORTS = {
    "CUT_SHORT_ATTRIBUTE": "processors",
    "MegatronSpanGroup": "span_groups",
    "SpanGroup": "span_groups",
    "TelemetryConfig": "config",
    "TelemetryConfigError": "config",
    "TelemetryHandle": "setup",
    "add_telemetry_args": "config",
    "is_span_group_enabled": "state",
    "managed_span": "helpers",
    "record_training_metrics": "training_metrics",
    "safe_set_span_attributes": "helpers",
    "set_enabled_span_groups": "state",
    "setup_telemetry": "setup",
    "span_cm": "helpers",
    "trace_fn": "helpers",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "CUT_SHORT_ATTRIBUTE",
    "MegatronSpanGroup",
    "SpanGroup",
    "TelemetryConfig",
    "TelemetryConfigError",
    "TelemetryHandle",
    "add_telemetry_args",
    "is_span_group_enabled",
    "managed_span",
    "record_training_metrics",
    "safe_set_span_attributes",
    "set_enabled_span_groups",
    "setup_telemetry",
    "span_cm",
    "trace_fn",
]
