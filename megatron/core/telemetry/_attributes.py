"""Turning arbitrary call-site keyword arguments into safe span attributes.

Call sites pass whatever they have (``None`` for "unknown", a tensor, a config
object, a token for a private hub). OpenTelemetry accepts only scalars and
homogeneous sequences of scalars and logs a warning per bad value, and an
exported span may end up in a shared backend. So values are filtered here,
once, and string values under sensitive-looking keys are replaced.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

_logger = logging.getLogger(__name__)

REDACTED = "[REDACTED]"

#: Words that mark an attribute key as sensitive. A key matches when one of
#: its segments (split on anything that is not a letter or digit) equals a
#: word or ends with it, so ``hf_token``, ``api_key``, ``accessToken`` and
#: ``db.password`` are redacted while ``tokenizer_type`` and ``keyframes`` are
#: not. Matching whole segments instead of substrings avoids redacting
#: harmless strings such as the tokenizer name.
DEFAULT_REDACT_WORDS: frozenset[str] = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "secret",
        "token",
        "key",
        "apikey",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "cookie",
        "headers",
    }
)

_SCALAR_TYPES = (str, bool, int, float)
_SEGMENT_SPLIT = re.compile(r"[^a-z0-9]+")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


@functools.lru_cache(maxsize=4096)
def is_sensitive_key(key: str, words: frozenset[str] = DEFAULT_REDACT_WORDS) -> bool:
    """Whether string values under ``key`` must not be exported verbatim.

    Cached: call sites use a small, fixed set of keys, so after warm-up the
    check costs one dictionary lookup.
    """
    lowered = key.lower()
    if lowered in words:
        return True
    segments = _SEGMENT_SPLIT.split(_CAMEL_BOUNDARY.sub("_", key).lower())
    return any(segment.endswith(word) for segment in segments if segment for word in words)


def redact_words(redact_keys: Iterable[str] | None) -> frozenset[str]:
    """The default sensitive words extended (never narrowed) by ``redact_keys``.

    Extending rather than replacing means a caller adding its own secret
    field cannot accidentally switch off redaction of passwords.
    """
    if not redact_keys:
        return DEFAULT_REDACT_WORDS
    if isinstance(redact_keys, str):
        redact_keys = (redact_keys,)
    return DEFAULT_REDACT_WORDS | frozenset(str(k).lower() for k in redact_keys)


def _clean_value(value: Any) -> Any:
    """The value if OpenTelemetry can carry it, else ``None``.

    A list or tuple is kept (as a tuple) only when every item is a scalar of
    one single type; ``bool`` counts as its own type, not as ``int``.
    """
    if isinstance(value, _SCALAR_TYPES):
        return value
    if isinstance(value, (list, tuple)):
        item_types = {type(item) for item in value}
        if len(item_types) > 1:
            return None
        if item_types and not issubclass(next(iter(item_types)), _SCALAR_TYPES):
            return None
        return tuple(value)
    return None


def sanitize_attributes(
    attributes: Mapping[str, Any] | None,
    words: frozenset[str] = DEFAULT_REDACT_WORDS,
) -> dict[str, Any]:
    """Keep the exportable attributes, redacting sensitive string values.

    Skipped: non-string or empty keys, ``None`` values, non-scalar values and
    mixed or nested sequences. Never raises: a broken mapping yields what was
    collected before it broke.
    """
    clean: dict[str, Any] = {}
    if not attributes:
        return clean
    try:
        for key, value in attributes.items():
            if not isinstance(key, str) or not key or value is None:
                continue
            value = _clean_value(value)
            if value is None:
                continue
            if is_sensitive_key(key, words) and (
                isinstance(value, str)
                or (isinstance(value, tuple) and value and isinstance(value[0], str))
            ):
                value = REDACTED
            clean[key] = value
    except Exception:
        _logger.debug("Could not read span attributes", exc_info=True)
    return clean
