"""OpenTelemetry spans and metrics for Megatron-style training.

The call-site API (``managed_span``, ``trace_fn``, ``span_cm``,
``is_span_group_enabled``, ``safe_set_span_attributes``) keeps Megatron-LM's
names and signatures; :mod:`.fallbacks` has no-op twins for environments
without OpenTelemetry. :func:`setup_telemetry` turns a
:class:`TelemetryConfig` into a :class:`TelemetryHandle` owning its own
providers.

Importing this package starts nothing: no thread, no file, no provider.
"""

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
