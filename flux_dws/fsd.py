"""Flux Standard Duration: "30s", "5m", "1.5h", "2d", "500ms", a bare number of seconds, "inf"."""

from __future__ import annotations

import math
import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "": 1.0}
_FSD = re.compile(r"^(?P<num>(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?)(?P<unit>ms|s|m|h|d)?$")


def parse_fsd(value: object) -> float:
    """Return seconds for a duration string or a non-negative number; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError(f"invalid duration {value!r} (too large)") from None
    elif isinstance(value, str):
        text = value.strip()
        if text.lower() in ("inf", "infinity"):
            return math.inf
        match = _FSD.match(text)
        if not match:
            raise ValueError(f"invalid duration {value!r} (expected e.g. 30s, 5m, 1.5h, 2d)")
        seconds = float(match.group("num")) * _UNITS[match.group("unit") or ""]
    else:
        raise ValueError(f"invalid duration {value!r} (expected e.g. 30s, 5m, 1.5h, 2d)")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"invalid duration {value!r} (must not be negative)")
    return seconds


def format_fsd(seconds: float) -> str:
    """The shortest exact FSD for ``seconds`` ("90s" -> "1.5m", 3600 -> "1h")."""
    if math.isinf(seconds):
        return "inf"
    for unit in ("d", "h", "m", "s"):
        size = _UNITS[unit]
        if seconds >= size and _round(seconds / size) == seconds / size:
            return f"{_number(seconds / size)}{unit}"
    if 0 < seconds < 1:
        return f"{_number(seconds * 1000)}ms"
    return f"{_number(seconds)}s"


def _round(x: float) -> float:
    return round(x, 3)


def _number(x: float) -> str:
    """All the digits of ``x`` to the millisecond (not ``:g``, which keeps only six)."""
    text = repr(_round(x))
    return text[:-2] if text.endswith(".0") else text
