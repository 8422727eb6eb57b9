"""Parse human durations such as ``1m``, ``90s``, ``500ms``, ``2h`` or Spark's ``10 minutes``."""

from __future__ import annotations

import re

from onceflow.errors import ConfigError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_WORDS = {"millisecond": "ms", "milliseconds": "ms", "sec": "s", "second": "s", "seconds": "s",
          "min": "m", "minute": "m", "minutes": "m", "hour": "h", "hours": "h", "day": "d", "days": "d"}
_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|[a-z]+)?\s*$")


def parse_duration(text: str | float | int) -> float:
    """Parse a duration into seconds.

    Args:
        text: ``"1m"``, ``"30s"``, ``"500ms"``, ``"2h"``, ``"1d"``, or a number of seconds.

    Returns:
        Seconds.

    Raises:
        ConfigError: The text is not a duration.
    """
    if isinstance(text, (int, float)):
        if text < 0:
            raise ConfigError(f"duration must be >= 0, got {text}")
        return float(text)
    m = _RE.match(text.lower())
    unit = _WORDS.get(m.group(2), m.group(2)) if m else None
    if m is None or (unit and unit not in _UNITS):
        raise ConfigError(
            f"invalid duration {text!r}: use a number with a unit ms, s, m, h or d (e.g. '1m', '90s', "
            "'10 minutes')"
        )
    return float(m.group(1)) * _UNITS[unit or "s"]
