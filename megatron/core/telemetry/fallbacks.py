"""No-op stand-ins for the telemetry call-site API.

Code that must run where OpenTelemetry is not installed (a stripped-down
inference image, a tool that vendors one Megatron module) imports these
instead of :mod:`megatron.core.telemetry.helpers`. They have the same names
and signatures, do nothing, and import nothing beyond the standard library,
so a call site written against one works unchanged against the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = [
    "is_span_group_enabled",
    "managed_span",
    "safe_set_span_attributes",
    "span_cm",
    "trace_fn",
]

_F = TypeVar("_F", bound=Callable[..., Any])


def trace_fn(group: str, name: str, tracer: Any = None) -> Callable[[_F], _F]:
    """Return a decorator that hands the decorated function back unchanged.

    Returning the very same object (not a wrapper) means the fallback costs
    nothing per call and keeps ``inspect``/pickling behaviour intact.
    """

    def decorator(fn: _F) -> _F:
        return fn

    return decorator


@contextmanager
def managed_span(group: str, name: str, tracer: Any = None, **attributes: Any) -> Iterator[None]:
    """Run the body with no span; yield ``None``; let exceptions propagate."""
    yield None


@contextmanager
def span_cm(
    name: str, tracer: Any = None, record_exception: bool = True, **attributes: Any
) -> Iterator[None]:
    """Run the body with no span; yield ``None``; let exceptions propagate."""
    yield None


def is_span_group_enabled(group: str) -> bool:
    """No telemetry backend, so no group is ever enabled."""
    return False


def safe_set_span_attributes(
    span: Any,
    attributes: Mapping[str, Any] | None,
    redact_keys: Iterable[str] | None = None,
) -> None:
    """Accept any span (including ``None``) and any attributes; set nothing."""
    return None
