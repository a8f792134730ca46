"""The call-site API backed by OpenTelemetry.

Same five names and signatures as :mod:`megatron.core.telemetry.fallbacks`.
The design constraint is the disabled path: ``managed_span`` sits around
every layer and microbatch, so when its group is off it must cost one
``frozenset`` lookup and touch no OpenTelemetry API at all.

Telemetry must never break training, so failures inside OpenTelemetry
(starting, annotating or ending a span) are logged and swallowed; only the
body's own exceptions propagate, unchanged.

An exception that unwinds through several spans (a fault in a forward pass
ends the forward-backward span, the iteration and the checkpoint interval) is
recorded once, as the OpenTelemetry ``exception`` event with its traceback, on
the first span it ends, where it was raised (:func:`record_exception_once`);
every span it ends has ERROR status and its message.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import context, trace
from opentelemetry.trace import Status, StatusCode

from megatron.core.telemetry import state
from megatron.core.telemetry._attributes import redact_words, sanitize_attributes
from megatron.core.telemetry.state import is_span_group_enabled

__all__ = [
    "is_span_group_enabled",
    "managed_span",
    "safe_set_span_attributes",
    "span_cm",
    "trace_fn",
]

_logger = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., Any])


def is_clean_exit(exc: BaseException) -> bool:
    """``sys.exit(0)`` or a generator closing, passing through a span, is no failure.

    The trainer's lifecycle asks the same of the exception that ends a run, so a
    span around a layer and the run's own spans never disagree about one exit.
    """
    if isinstance(exc, GeneratorExit):
        return True
    # Python exits 0 for a code of None or an int equal to 0 (False too), not 0.0.
    return isinstance(exc, SystemExit) and (
        exc.code is None or (isinstance(exc.code, int) and exc.code == 0)
    )


#: Set in an exception's ``__dict__`` once a span holds its ``exception`` event.
_RECORDED = "_megatron_telemetry_recorded"


def record_exception_once(span: Any, exc: BaseException) -> None:
    """Record ``exc`` as ``span``'s ``exception`` event, unless a span already holds it.

    Exceptions take no weak references, so the mark is an entry in the exception's
    own ``__dict__`` (never shown by its repr or traceback).
    """
    if vars(exc).get(_RECORDED):
        return
    span.record_exception(exc)
    vars(exc)[_RECORDED] = True


class _NoSpan:
    """The context manager for a disabled group: yields ``None``, does nothing.

    Stateless, so one shared instance serves every disabled call site and the
    disabled path allocates nothing.
    """

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return False


_NO_SPAN = _NoSpan()


class _SpanScope:
    """Starts a span, makes it current, and ends it however the body exits.

    A class rather than a ``@contextmanager`` generator: it is cheaper per use
    and the exception path is explicit (``__exit__`` returns ``False``, so the
    body's exception object propagates untouched, traceback included).
    """

    __slots__ = ("_attributes", "_name", "_record_exception", "_span", "_token", "_tracer")

    def __init__(
        self,
        name: str,
        tracer: trace.Tracer | None,
        attributes: Mapping[str, Any],
        record_exception: bool,
    ) -> None:
        self._name = name
        self._tracer = tracer
        self._attributes = attributes
        self._record_exception = record_exception
        self._span: trace.Span | None = None
        self._token: object | None = None

    def __enter__(self) -> trace.Span | None:
        try:
            tracer = self._tracer if self._tracer is not None else state.get_active_tracer()
            span = tracer.start_span(self._name, attributes=sanitize_attributes(self._attributes))
            self._token = context.attach(trace.set_span_in_context(span))
        except Exception:
            _logger.warning(
                "Could not start span %r; continuing without it", self._name, exc_info=True
            )
            return None
        self._span = span
        return span

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        span = self._span
        if span is None:
            return False
        self._span = None
        try:
            if exc is not None and self._record_exception and not is_clean_exit(exc):
                record_exception_once(span, exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        except Exception:
            _logger.warning("Could not record an exception on span %r", self._name, exc_info=True)
        finally:
            # Detach before ending: once ended, nothing new should find the
            # span as the current parent.
            try:
                context.detach(self._token)
            except Exception:
                _logger.warning("Could not detach span %r", self._name, exc_info=True)
            try:
                span.end()
            except Exception:
                _logger.warning("Could not end span %r", self._name, exc_info=True)
        return False


def managed_span(
    group: str, name: str, tracer: trace.Tracer | None = None, **attributes: Any
) -> AbstractContextManager[trace.Span | None]:
    """A context manager recording ``name`` as a span if ``group`` is enabled.

    Disabled group: the body runs, ``None`` is yielded, and no span object is
    created. Enabled: a span is started on ``tracer`` (default: the active
    handle's tracer) with the exportable subset of ``attributes``, made
    current so spans opened inside nest under it, and ended when the body
    exits. If the body raises, the exception is recorded on the span, its
    status set to ERROR, and the same exception object propagates.
    """
    if group not in state._enabled_groups:
        return _NO_SPAN
    return _SpanScope(name, tracer, attributes, True)


def span_cm(
    name: str,
    tracer: trace.Tracer | None = None,
    record_exception: bool = True,
    **attributes: Any,
) -> AbstractContextManager[trace.Span | None]:
    """Like :func:`managed_span` but not gated by any span group.

    For spans whose existence is decided elsewhere (the job lifecycle opens
    its structural spans after checking the ``job`` group once).
    ``record_exception=False`` leaves the span's status and events alone when
    the body raises, for callers that report the failure themselves.
    """
    return _SpanScope(name, tracer, attributes, record_exception)


def trace_fn(group: str, name: str, tracer: trace.Tracer | None = None) -> Callable[[_F], _F]:
    """Decorate a function so each call runs inside ``managed_span(group, name)``.

    The group is checked on every call, not when the module is imported, so
    decorating at import time and enabling telemetry later works. A generator
    or coroutine function is timed only while it is called (while the
    generator or coroutine object is created), not while it is consumed.
    """

    def decorator(fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if group not in state._enabled_groups:
                return fn(*args, **kwargs)
            with _SpanScope(name, tracer, {}, True):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


def safe_set_span_attributes(
    span: trace.Span | None,
    attributes: Mapping[str, Any] | None,
    redact_keys: Iterable[str] | None = None,
) -> None:
    """Set the exportable subset of ``attributes`` on ``span``; never raise.

    ``None`` span (a disabled group's ``managed_span`` yields ``None``) is a
    no-op, so call sites need no check. Skipped: ``None`` values, non-scalar
    values and mixed or nested sequences; lists and tuples of one scalar type
    are kept. String values whose key looks sensitive (see
    :data:`~megatron.core.telemetry._attributes.DEFAULT_REDACT_WORDS`;
    ``redact_keys`` adds words) are replaced by ``"[REDACTED]"``.
    """
    if span is None:
        return
    try:
        clean = sanitize_attributes(attributes, redact_words(redact_keys))
        if clean:
            span.set_attributes(clean)
    except Exception:
        _logger.debug("Could not set span attributes", exc_info=True)
