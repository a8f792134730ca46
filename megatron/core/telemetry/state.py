"""Process-wide telemetry state: which span groups are on, which tracer is live.

Call sites deep inside the model (``managed_span(MegatronSpanGroup.LAYER, ...)``)
cannot be handed a telemetry handle, so, as upstream Megatron does, the
enabled groups and the active tracer live here. The read path,
:func:`is_span_group_enabled`, is a single ``frozenset`` membership test on a
module global because it runs once per layer per microbatch even when
telemetry is off.

Only :func:`megatron.core.telemetry.setup.setup_telemetry` and
``TelemetryHandle.shutdown`` move the active tracer; everything else reads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from opentelemetry import trace

__all__ = [
    "NO_OP_TRACER",
    "get_active_tracer",
    "is_span_group_enabled",
    "set_enabled_span_groups",
]

#: What :func:`get_active_tracer` returns while no exporting handle is active: one
#: OpenTelemetry no-op tracer, so ``get_active_tracer() is NO_OP_TRACER`` says that none is.
NO_OP_TRACER: trace.Tracer = trace.NoOpTracer()

# Rebound (never mutated) so readers need no lock: a reader sees either the
# old frozenset or the new one.
_enabled_groups: frozenset[str] = frozenset()
_active_tracer: trace.Tracer = NO_OP_TRACER
_active_owner: object | None = None
# Re-entrant: a signal handler that shuts telemetry down may interrupt the
# main thread while it holds this lock.
_write_lock = threading.RLock()


def _reinit_lock_in_child() -> None:
    # A fork taken while another thread held the lock would leave the child
    # with a lock nobody can release.
    global _write_lock
    _write_lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_lock_in_child)


def is_span_group_enabled(group: str) -> bool:
    """Whether spans of ``group`` are recorded right now."""
    return group in _enabled_groups


def set_enabled_span_groups(groups: Iterable[str]) -> None:
    """Replace the enabled span groups for the whole process.

    Setup already enables the configured groups; this is for narrowing or
    widening them afterwards (a profiling window, a test).
    """
    global _enabled_groups
    _enabled_groups = frozenset(groups)


def get_active_tracer() -> trace.Tracer:
    """The tracer of the most recently set-up exporting handle.

    Falls back to the OpenTelemetry no-op tracer when no exporting handle is
    active, so a caller never has to check for ``None``.
    """
    return _active_tracer


def _activate(owner: object, tracer: trace.Tracer, groups: Iterable[str]) -> None:
    """Make ``owner``'s tracer and groups the process-wide ones."""
    global _active_tracer, _active_owner, _enabled_groups
    with _write_lock:
        _active_owner = owner
        _active_tracer = tracer
        _enabled_groups = frozenset(groups)


def _deactivate(owner: object) -> bool:
    """Reset to "nothing enabled" if ``owner`` is still the active handle.

    A handle that a later setup has superseded must not switch off the newer
    handle's groups when it shuts down, hence the ownership check. Returns
    whether anything was reset.
    """
    global _active_tracer, _active_owner, _enabled_groups
    with _write_lock:
        if _active_owner is not owner:
            return False
        _active_owner = None
        _active_tracer = NO_OP_TRACER
        _enabled_groups = frozenset()
        return True


def _reset() -> None:
    """Forget every handle and disable every group (test isolation)."""
    global _active_tracer, _active_owner, _enabled_groups
    with _write_lock:
        _active_owner = None
        _active_tracer = NO_OP_TRACER
        _enabled_groups = frozenset()
