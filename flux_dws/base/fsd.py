# SPDX-License-Identifier: LGPL-3.0-only
"""Flux Standard Duration: "30s", "5m", "1.5h", "2d", "500ms", a bare number of seconds, "inf"."""

from __future__ import annotations

import functools
import math
import re

from flux_dws.base.untrusted import echo

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "": 1.0}
# ASCII digits only: str.isdigit() and \d also take "３０" (fullwidth) and other scripts.
_FSD = re.compile(
    r"^(?P<num>([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?)(?P<unit>ms|s|m|h|d)?$", re.ASCII
)
_EXPECTED = "expected e.g. 30s, 5m, 1.5h, 2d"


def _shown(value: object) -> str:
    """The value as an error message echoes it: escaped and cut short (it may be anything)."""
    return echo(value)


def parse_fsd(value: object) -> float:
    """Return seconds for a duration string or a non-negative number; ValueError otherwise.

    "inf" (or a float infinity) means no limit; a finite number too large for a float
    (``1e400s``) is refused rather than read as no limit.
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {_shown(value)}")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError(f"invalid duration {_shown(value)} (too large)") from None
    elif isinstance(value, str):
        text = value.strip()
        if text.lower() in ("inf", "infinity"):
            return math.inf
        if text.lower() == "nan":
            raise ValueError(f"invalid duration {_shown(value)} (NaN is not a number of seconds)")
        match = _FSD.match(text)
        if not match:
            raise ValueError(f"invalid duration {_shown(value)} ({_EXPECTED})")
        seconds = float(match.group("num")) * _UNITS[match.group("unit") or ""]
        if math.isinf(seconds):
            raise ValueError(
                f'invalid duration {_shown(value)} (out of range; use "inf" for no limit)'
            )
    else:
        raise ValueError(f"invalid duration {_shown(value)} ({_EXPECTED})")
    if math.isnan(seconds):
        raise ValueError(f"invalid duration {_shown(value)} (NaN is not a number of seconds)")
    if seconds < 0:
        raise ValueError(f"invalid duration {_shown(value)} (must not be negative)")
    return seconds


@functools.lru_cache(maxsize=256)  # a few timeouts, formatted for every job's events
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
