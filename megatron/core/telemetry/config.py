"""Telemetry configuration: command-line flags over environment over defaults.

Everything a user can get wrong is checked here, before any thread or file
exists, and reported as one :class:`TelemetryConfigError` that names the flag
or variable and the values it accepts. (The one check that needs the
filesystem, "can the trace file be written", runs at setup, on the exporting
rank only, because only that rank writes.)

Every ``MEGATRON_OTEL_*`` variable falls back to the matching ``NEMO_LENS_*``
one, as Megatron-LM documents (its variables are aliases of nemo-lens's
configuration fields): flag, then ``MEGATRON_OTEL_*``, then ``NEMO_LENS_*``,
then the default. Where lens calls the field differently, lens's own name is
read too (``NEMO_LENS_EXPORT_STRATEGY`` for the rank strategy,
``NEMO_LENS_SAMPLER_ENABLED`` for the ``rank_aware`` sampler), so a shared
environment configured for lens configures this job the same way. Megatron-LM's
recipes spell the rank strategy after lens's field, ``MEGATRON_OTEL_EXPORT_STRATEGY``;
it is read right after ``MEGATRON_OTEL_RANK_STRATEGY`` and before any
``NEMO_LENS_*`` name (every ``MEGATRON_OTEL_*`` name wins over every lens one).

A ``MEGATRON_OTEL_*`` variable this module does not read is most likely a typo:
it gets one warning line naming the nearest known variable, and is otherwise
ignored (telemetry never stops training for it).

An environment variable set to the empty string counts as unset, as the
OpenTelemetry SDK treats its own ``OTEL_*`` variables and lens treats its.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import math
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron.core.telemetry.span_groups import MegatronSpanGroup

__all__ = ["TelemetryConfig", "TelemetryConfigError", "add_telemetry_args"]

EXPORTERS: tuple[str, ...] = ("console", "jsonl", "none", "otlp")
RANK_STRATEGIES: tuple[str, ...] = ("all_ranks", "first_rank_per_node", "sampled", "single_rank")
#: ``""`` keeps the SDK's own sampler (``OTEL_TRACES_SAMPLER``).
SAMPLING_STRATEGIES: tuple[str, ...] = ("", "rank_aware")

DEFAULT_SPAN_GROUPS_SPEC = "default"
DEFAULT_SERVICE_NAME = "megatron"
DEFAULT_EXPORTER = "jsonl"
DEFAULT_RANK_STRATEGY = "single_rank"
DEFAULT_EXPORT_RANK = -1
DEFAULT_EXPORT_SAMPLE_RATE = 1.0
DEFAULT_SAMPLING_STRATEGY = ""
TRACE_FILE_RELATIVE = Path("telemetry") / "traces.jsonl"

ENV_ENABLED = "MEGATRON_OTEL_ENABLED"
ENV_SPAN_GROUPS = "MEGATRON_OTEL_SPAN_GROUPS"
ENV_SERVICE_NAME = "OTEL_SERVICE_NAME"
ENV_EXPORTER = "MEGATRON_OTEL_EXPORTER"
ENV_TRACE_FILE = "MEGATRON_OTEL_TRACE_FILE"
ENV_RANK_STRATEGY = "MEGATRON_OTEL_RANK_STRATEGY"
ENV_EXPORT_RANK = "MEGATRON_OTEL_EXPORT_RANK"
ENV_EXPORT_SAMPLE_RATE = "MEGATRON_OTEL_EXPORT_SAMPLE_RATE"
ENV_SAMPLING_STRATEGY = "MEGATRON_OTEL_SAMPLING_STRATEGY"
ENV_TRACES_ENABLED = "MEGATRON_OTEL_TRACES_ENABLED"
ENV_METRICS_ENABLED = "MEGATRON_OTEL_METRICS_ENABLED"
ENV_LOGS_ENABLED = "MEGATRON_OTEL_LOGS_ENABLED"
ENV_RUN_ID = "MEGATRON_OTEL_RUN_ID"
ENV_HANG_TIMEOUT = "MEGATRON_OTEL_HANG_TIMEOUT"
#: Megatron-LM's recipes' name for the rank strategy (lens's field is ``export_strategy``).
ENV_EXPORT_STRATEGY = "MEGATRON_OTEL_EXPORT_STRATEGY"

#: Every ``MEGATRON_OTEL_*`` variable this module reads; any other one is warned about.
KNOWN_VARIABLES: frozenset[str] = frozenset(
    {
        ENV_ENABLED,
        ENV_SPAN_GROUPS,
        ENV_EXPORTER,
        ENV_TRACE_FILE,
        ENV_RANK_STRATEGY,
        ENV_EXPORT_STRATEGY,
        ENV_EXPORT_RANK,
        ENV_EXPORT_SAMPLE_RATE,
        ENV_SAMPLING_STRATEGY,
        ENV_TRACES_ENABLED,
        ENV_METRICS_ENABLED,
        ENV_LOGS_ENABLED,
        ENV_RUN_ID,
        ENV_HANG_TIMEOUT,
    }
)

_logger = logging.getLogger(__name__)

_PREFIX = "MEGATRON_OTEL_"
_FALLBACK_PREFIX = "NEMO_LENS_"
# Lens's own names for settings whose Megatron name differs from the field's,
# read after the plain prefix swap.
_LENS_NAMES = {
    ENV_RANK_STRATEGY: "NEMO_LENS_EXPORT_STRATEGY",
}
# Other Megatron spellings of a setting, read after its own name and before
# any lens name.
_MEGATRON_ALIASES = {
    ENV_RANK_STRATEGY: (ENV_EXPORT_STRATEGY,),
}
_LENS_SAMPLER_ENABLED = "NEMO_LENS_SAMPLER_ENABLED"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class TelemetryConfigError(ValueError):
    """A telemetry setting has a value that cannot work.

    The message is meant for the person launching the job: it names the flag
    or variable, the bad value, and what would have been accepted.
    """


def _generate_run_id() -> str:
    """12 hex characters of a random UUID, as lens generates its run ids."""
    return uuid.uuid4().hex[:12]


def default_trace_file(save: str | os.PathLike[str] | None) -> Path:
    """``<save>/telemetry/traces.jsonl``, or ``./telemetry/traces.jsonl``.

    Beside the checkpoints by default, so the trace travels with the run.
    """
    base = Path(save).expanduser() if save else Path(".")
    return base / TRACE_FILE_RELATIVE


@dataclass(frozen=True)
class TelemetryConfig:
    """The resolved telemetry settings of one run.

    Build it with :meth:`from_args` (the trainer) or :meth:`from_env` (tools,
    tests). Direct construction checks the same choices, naming the field
    rather than a flag. ``span_groups`` is derived from ``span_groups_spec``
    when left ``None``, and ``trace_file`` defaults to
    ``./telemetry/traces.jsonl``; after construction neither is ``None``.
    """

    enabled: bool = False
    # ``None`` only as the "derive it from span_groups_spec" default.
    span_groups: frozenset[str] = None  # type: ignore[assignment]
    span_groups_spec: str = DEFAULT_SPAN_GROUPS_SPEC
    service_name: str = DEFAULT_SERVICE_NAME
    exporter: str = DEFAULT_EXPORTER
    trace_file: Path | None = None
    rank_strategy: str = DEFAULT_RANK_STRATEGY
    export_rank: int = DEFAULT_EXPORT_RANK
    export_sample_rate: float = DEFAULT_EXPORT_SAMPLE_RATE
    sampling_strategy: str = DEFAULT_SAMPLING_STRATEGY
    traces_enabled: bool = True
    metrics_enabled: bool = True
    logs_enabled: bool = False
    run_id: str = field(default_factory=_generate_run_id)
    #: Seconds without a finished iteration before the hang watchdog reports a
    #: stall; ``None`` derives it from the run (see
    #: :mod:`megatron.core.telemetry.watchdog`), ``0`` turns the watchdog off.
    hang_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.span_groups is None:
            groups = _resolve_groups(self.span_groups_spec, "span_groups_spec")
            object.__setattr__(self, "span_groups", groups)
        else:
            object.__setattr__(self, "span_groups", frozenset(self.span_groups))
        if self.trace_file is None:
            object.__setattr__(self, "trace_file", default_trace_file(None))
        else:
            object.__setattr__(self, "trace_file", Path(self.trace_file))
        _check_choice(self.exporter, EXPORTERS, "exporter")
        _check_choice(self.rank_strategy, RANK_STRATEGIES, "rank_strategy")
        _check_export_rank(self.export_rank, "export_rank")
        _check_sample_rate(self.export_sample_rate, "export_sample_rate")
        _check_choice(self.sampling_strategy, SAMPLING_STRATEGIES, "sampling_strategy")
        if self.hang_timeout_s is not None:
            _check_hang_timeout(self.hang_timeout_s, "hang_timeout_s")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> TelemetryConfig:
        """Settings from ``env`` (default ``os.environ``), with ``overrides`` on top.

        ``overrides`` play the role of command-line flags and take the same
        keyword names as the fields (``enabled``, ``span_groups`` as a spec
        string or an iterable of names, ``service_name``, ``exporter``,
        ``trace_file``, ``rank_strategy``, ``export_rank``,
        ``export_sample_rate``, ``sampling_strategy``, ``traces_enabled``,
        ``metrics_enabled``, ``logs_enabled``, ``run_id``, ``hang_timeout_s``), plus ``save`` for
        the default trace-file location. ``None`` means "not given".
        """
        allowed = {*_FLAG_NAMES, "save"}
        unknown = sorted(set(overrides) - allowed)
        if unknown:
            raise TypeError(f"TelemetryConfig.from_env() got unexpected overrides: {unknown}")
        given = dict(overrides)
        groups = given.get("span_groups")
        if groups is not None and not isinstance(groups, str):
            given["span_groups"] = ",".join(groups)
        return _build(os.environ if env is None else env, given, _OVERRIDE_NAMES)

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, env: Mapping[str, str] | None = None
    ) -> TelemetryConfig:
        """Settings from parsed arguments over ``env`` (default ``os.environ``).

        Reads ``otel_enabled``, ``otel_span_groups``, ``otel_service_name``,
        ``otel_exporter``, ``otel_trace_file`` and ``save`` from ``args``; a
        missing attribute or ``None`` means the flag was not given.
        """
        given = {
            "enabled": getattr(args, "otel_enabled", None),
            "span_groups": getattr(args, "otel_span_groups", None),
            "service_name": getattr(args, "otel_service_name", None),
            "exporter": getattr(args, "otel_exporter", None),
            "trace_file": getattr(args, "otel_trace_file", None),
            "save": getattr(args, "save", None),
        }
        return _build(os.environ if env is None else env, given, _FLAG_NAMES)


# How each setting is called in error messages, per source of the value.
_FLAG_NAMES = {
    "enabled": "--otel-enabled",
    "span_groups": "--otel-span-groups",
    "service_name": "--otel-service-name",
    "exporter": "--otel-exporter",
    "trace_file": "--otel-trace-file",
    # Megatron-LM has no flags for these; they are set by environment only.
    "rank_strategy": ENV_RANK_STRATEGY,
    "export_rank": ENV_EXPORT_RANK,
    "export_sample_rate": ENV_EXPORT_SAMPLE_RATE,
    "sampling_strategy": ENV_SAMPLING_STRATEGY,
    "traces_enabled": ENV_TRACES_ENABLED,
    "metrics_enabled": ENV_METRICS_ENABLED,
    "logs_enabled": ENV_LOGS_ENABLED,
    "run_id": ENV_RUN_ID,
    "hang_timeout_s": ENV_HANG_TIMEOUT,
}
_OVERRIDE_NAMES = {key: key for key in _FLAG_NAMES}


def _env_value(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def env_names(name: str) -> tuple[str, ...]:
    """The variables read for setting ``name``, in precedence order.

    ``MEGATRON_OTEL_X`` is followed by its other Megatron spellings
    (``MEGATRON_OTEL_EXPORT_STRATEGY`` for the rank strategy), then by
    ``NEMO_LENS_X`` and, where lens names the field differently, by lens's
    name; other variables stand alone.
    """
    if not name.startswith(_PREFIX):
        return (name,)
    names = [name, *_MEGATRON_ALIASES.get(name, ())]
    names.append(_FALLBACK_PREFIX + name[len(_PREFIX) :])
    if name in _LENS_NAMES:
        names.append(_LENS_NAMES[name])
    return tuple(names)


def unknown_variables(env: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Each set ``MEGATRON_OTEL_*`` variable not read here, with the nearest known one.

    Sorted by name; the nearest is ``None`` when no known name is close
    (:func:`difflib.get_close_matches`' default cutoff, on the part after
    ``MEGATRON_OTEL_``).
    """
    found = []
    for name in sorted(env):
        if name.startswith(_PREFIX) and name not in KNOWN_VARIABLES:
            # compared without the prefix they all share, which would make any name "close"
            suffixes = [known[len(_PREFIX) :] for known in sorted(KNOWN_VARIABLES)]
            close = difflib.get_close_matches(name[len(_PREFIX) :], suffixes, n=1)
            found.append((name, _PREFIX + close[0] if close else None))
    return found


def warn_unknown_variables(env: Mapping[str, str]) -> None:
    """One warning line per unknown ``MEGATRON_OTEL_*`` variable; never raises."""
    for name, nearest in unknown_variables(env):
        hint = f"did you mean {nearest}?" if nearest else "see megatron/core/telemetry/README.md"
        _logger.warning("%s is not a telemetry setting and is ignored; %s", name, hint)


def _env_lookup(env: Mapping[str, str], name: str) -> tuple[str | None, str]:
    """The first non-empty value among ``name`` and its fallbacks, and its variable."""
    for candidate in env_names(name):
        value = _env_value(env, candidate)
        if value is not None:
            return value, candidate
    return None, name


def _pick(given: Any, env: Mapping[str, str], env_name: str, given_name: str) -> tuple[Any, str]:
    """The winning value and the name of where it came from."""
    if given is not None:
        return given, given_name
    return _env_lookup(env, env_name)


def _pick_bool(
    given: Any, env: Mapping[str, str], env_name: str, given_name: str, default: bool
) -> bool:
    value, source = _pick(given, env, env_name, given_name)
    return default if value is None else _parse_bool(value, source)


def _build(
    env: Mapping[str, str], given: Mapping[str, Any], names: Mapping[str, str]
) -> TelemetryConfig:
    def pick_bool(key: str, env_name: str, default: bool) -> bool:
        return _pick_bool(given.get(key), env, env_name, names[key], default)

    warn_unknown_variables(env)

    enabled = pick_bool("enabled", ENV_ENABLED, False)

    value, source = _pick(given.get("span_groups"), env, ENV_SPAN_GROUPS, names["span_groups"])
    spec = DEFAULT_SPAN_GROUPS_SPEC if value is None else str(value)
    span_groups = _resolve_groups(spec, source)

    value, source = _pick(given.get("service_name"), env, ENV_SERVICE_NAME, names["service_name"])
    service_name = DEFAULT_SERVICE_NAME if value is None else str(value).strip()
    if not service_name:
        raise TelemetryConfigError(f"{source} must not be empty")

    value, source = _pick(given.get("exporter"), env, ENV_EXPORTER, names["exporter"])
    exporter = DEFAULT_EXPORTER if value is None else _check_choice(value, EXPORTERS, source)

    value, source = _pick(given.get("trace_file"), env, ENV_TRACE_FILE, names["trace_file"])
    trace_file = (
        default_trace_file(given.get("save")) if value is None else _check_trace_file(value, source)
    )

    value, source = _pick(
        given.get("rank_strategy"), env, ENV_RANK_STRATEGY, names["rank_strategy"]
    )
    rank_strategy = (
        DEFAULT_RANK_STRATEGY if value is None else _check_choice(value, RANK_STRATEGIES, source)
    )

    value, source = _pick(given.get("export_rank"), env, ENV_EXPORT_RANK, names["export_rank"])
    export_rank = DEFAULT_EXPORT_RANK if value is None else _check_export_rank(value, source)

    value, source = _pick(
        given.get("export_sample_rate"), env, ENV_EXPORT_SAMPLE_RATE, names["export_sample_rate"]
    )
    export_sample_rate = (
        DEFAULT_EXPORT_SAMPLE_RATE if value is None else _check_sample_rate(value, source)
    )

    sampling_strategy = _sampling_strategy(env, given.get("sampling_strategy"), names)

    traces_enabled = pick_bool("traces_enabled", ENV_TRACES_ENABLED, True)
    metrics_enabled = pick_bool("metrics_enabled", ENV_METRICS_ENABLED, True)
    logs_enabled = pick_bool("logs_enabled", ENV_LOGS_ENABLED, False)

    value, _ = _pick(given.get("run_id"), env, ENV_RUN_ID, names["run_id"])
    run_id = str(value) if value is not None else _default_run_id(env)

    value, source = _pick(
        given.get("hang_timeout_s"), env, ENV_HANG_TIMEOUT, names["hang_timeout_s"]
    )
    hang_timeout_s = None if value is None else _check_hang_timeout(value, source)

    return TelemetryConfig(
        enabled=enabled,
        span_groups=span_groups,
        span_groups_spec=spec,
        service_name=service_name,
        exporter=exporter,
        trace_file=trace_file,
        rank_strategy=rank_strategy,
        export_rank=export_rank,
        export_sample_rate=export_sample_rate,
        sampling_strategy=sampling_strategy,
        traces_enabled=traces_enabled,
        metrics_enabled=metrics_enabled,
        logs_enabled=logs_enabled,
        run_id=run_id,
        hang_timeout_s=hang_timeout_s,
    )


def _sampling_strategy(env: Mapping[str, str], given: Any, names: Mapping[str, str]) -> str:
    """The sampler: flag/override, the variables, then lens's boolean switch.

    Lens spells "install the rank-aware sampler" ``NEMO_LENS_SAMPLER_ENABLED``;
    it is read last, so any ``*_SAMPLING_STRATEGY`` value wins over it.
    """
    value, source = _pick(given, env, ENV_SAMPLING_STRATEGY, names["sampling_strategy"])
    if value is not None:
        return _check_choice(value, SAMPLING_STRATEGIES, source)
    switch = _env_value(env, _LENS_SAMPLER_ENABLED)
    if switch is not None and _parse_bool(switch, _LENS_SAMPLER_ENABLED):
        return "rank_aware"
    return DEFAULT_SAMPLING_STRATEGY


def _default_run_id(env: Mapping[str, str]) -> str:
    """``SLURM_JOB_ID``, else torchrun's rendezvous id, else a fresh id.

    (``MEGATRON_OTEL_RUN_ID`` and ``NEMO_LENS_RUN_ID`` were looked at before
    this.) Every rank must compute the same id without talking to the
    others, so launcher-provided ids come first; a generated id is unique
    per process and only right for single-process runs.
    """
    slurm = _env_value(env, "SLURM_JOB_ID")
    if slurm is not None:
        return slurm
    torchrun = _env_value(env, "TORCHELASTIC_RUN_ID")
    if torchrun is not None and torchrun != "none":
        return torchrun
    return _generate_run_id()


def _parse_bool(value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise TelemetryConfigError(
        f"{source}={value!r} is not valid; expected a boolean (1/0, true/false, yes/no, on/off)"
    )


def _check_choice(value: Any, choices: Iterable[str], source: str) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise TelemetryConfigError(
            f"{source}={value!r} is not valid; expected one of: "
            + ", ".join(choice or "'' (empty)" for choice in sorted(choices))
        )
    return text


def _check_sample_rate(value: Any, source: str) -> float:
    try:
        rate = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        rate = math.nan
    if not 0.0 <= rate <= 1.0:  # also rejects nan
        raise TelemetryConfigError(
            f"{source}={value!r} is not valid; expected a fraction of ranks from 0.0 to 1.0"
        )
    return rate


def _check_hang_timeout(value: Any, source: str) -> float:
    try:
        seconds = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise TelemetryConfigError(
            f"{source}={value!r} is not valid; expected seconds without a finished "
            "iteration before a stall is reported (a number >= 0; 0 turns the watchdog off)"
        )
    return seconds


def _check_trace_file(value: Any, source: str) -> Path:
    """A path naming a file: not empty, and not ending as a directory does (``/``, ``.``).

    A path that names an existing directory, or lies under a file, is refused
    when the sink opens it, with the reason the system gives.
    """
    text = os.fspath(value)
    path = Path(text).expanduser()
    if not text.strip() or os.path.basename(text) in ("", ".", ".."):
        raise TelemetryConfigError(
            f"{source}={text!r} is not valid; expected the path of the trace file to write "
            "(e.g. telemetry/traces.jsonl; metrics.jsonl is written beside it)"
        )
    return path


def _check_export_rank(value: Any, source: str) -> int:
    try:
        rank = (
            value
            if isinstance(value, int) and not isinstance(value, bool)
            else int(str(value).strip())
        )
    except ValueError:
        rank = None
    if rank is None or rank < -1:
        raise TelemetryConfigError(
            f"{source}={value!r} is not valid; "
            "expected an integer rank >= 0, or -1 for the last rank"
        )
    return rank


def _resolve_groups(spec: str, source: str) -> frozenset[str]:
    try:
        return MegatronSpanGroup.resolve(spec)
    except ValueError as exc:
        raise TelemetryConfigError(f"{source}: {exc}") from None


def add_telemetry_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``--otel-*`` flags in a "telemetry" group and return ``parser``.

    Every flag defaults to ``None`` so :meth:`TelemetryConfig.from_args` can
    tell "not given" (fall back to the environment) from an explicit value.
    ``--otel-exporter`` has no argparse ``choices``: it is validated in
    ``from_args`` so the message has the same shape for flag and variable.
    Returns the parser, as Megatron's ``extra_args_provider`` hooks do.
    """
    group = parser.add_argument_group("telemetry")
    group.add_argument(
        "--otel-enabled",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"Record OpenTelemetry spans and metrics (env {ENV_ENABLED}; default off).",
    )
    group.add_argument(
        "--otel-span-groups",
        default=None,
        help=(
            "Comma-separated span-group presets (default, per_step, profiling, all) and/or "
            f"group names (env {ENV_SPAN_GROUPS}; default 'default')."
        ),
    )
    group.add_argument(
        "--otel-service-name",
        default=None,
        help=(
            f"service.name of the exported telemetry (env {ENV_SERVICE_NAME}; "
            f"default '{DEFAULT_SERVICE_NAME}')."
        ),
    )
    group.add_argument(
        "--otel-exporter",
        default=None,
        help=(
            f"Where telemetry goes: {', '.join(EXPORTERS)} "
            f"(env {ENV_EXPORTER}; default '{DEFAULT_EXPORTER}')."
        ),
    )
    group.add_argument(
        "--otel-trace-file",
        default=None,
        help=(
            "Span file of the jsonl exporter; metrics.jsonl is written beside it "
            f"(env {ENV_TRACE_FILE}; default <save>/telemetry/traces.jsonl)."
        ),
    )
    return parser
