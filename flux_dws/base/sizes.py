# SPDX-License-Identifier: LGPL-3.0-only
"""Sizes such as "10GiB" or "1.5TB" -> bytes.

Two grammars: the wide one of :func:`parse_size` (decimals, B, PB, K/M/G/T/P) for sizes that
never go into a directive, and the narrower one DWS admits in ``capacity=`` (checked in
flux_dws.core.directives on top of this one).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from fractions import Fraction

from flux_dws.base.errors import DirectiveError, quote

SIZE_EXAMPLES = "e.g. 10GiB, 100GB"

_SIZE_RE = re.compile(r"(-?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([A-Za-z]*)")
_UNITS: dict[str, int] = {"": 1, "B": 1}
for _i, _p in enumerate("KMGTP", start=1):
    _UNITS[_p] = _UNITS[_p + "B"] = 1000**_i
    _UNITS[_p + "iB"] = 1024**_i
MAX_BYTES = 2**63 - 1  # what a Kubernetes quantity (and nnf-sos's int64) holds
#: The largest count Fluxion's jobspec parser takes (an unsigned 32-bit count).
MAX_COUNT = 2**32 - 1
_MAX_SIZE_TEXT = 64


def size_bytes(text: str) -> int:
    """Bytes in ``text``, or ValueError whose message completes "'<text>' ...".

    A decimal that is not a whole number of bytes rounds up: a capacity is a minimum.
    """
    match = _SIZE_RE.fullmatch(text) if len(text) <= _MAX_SIZE_TEXT else None
    if match is None or match.group(3) not in _UNITS:
        raise ValueError(f"is not a size ({SIZE_EXAMPLES})")
    sign, number, unit = match.groups()
    amount = Fraction(number) * _UNITS[unit]
    if sign or amount == 0:
        raise ValueError("must be more than zero")
    size = math.ceil(amount)
    if size > MAX_BYTES:
        raise ValueError("is too large")
    return size


def ceil_div(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded up, in integers: a float quotient loses bytes
    beyond 2**53 (a need of 2**62+1 bytes would ask for a GiB too few)."""
    return -(-numerator // denominator)


def bounded_sum(sizes: Iterable[int], what: str, limit: int = MAX_BYTES) -> int:
    """The sum of ``sizes``, or ValueError naming ``what`` when it passes ``limit``
    (jansson's int64, for a figure that goes to Flux or DWS)."""
    total = 0
    for size in sizes:
        total += size
        if total > limit:
            raise ValueError(f"{what} add up to more than {limit} bytes")
    return total


def parse_size(text: str) -> int:
    """Bytes in a size such as "10GiB", "100GB", "1.5TiB", "512MiB", "10G" or "4096".

    Units: B; KB, MB, GB, TB, PB (powers of 1000, also written K, M, G, T, P); KiB, MiB, GiB,
    TiB, PiB (powers of 1024).  No unit means bytes.  Zero, negative and malformed sizes
    raise DirectiveError naming the text.
    """
    if not isinstance(text, str):
        raise DirectiveError(f"size {text!r} is not a string ({SIZE_EXAMPLES})")
    try:
        return size_bytes(text.strip())
    except ValueError as exc:
        raise DirectiveError(f"size {quote(text)} {exc}") from None


def show_bytes(size: int) -> str:
    """Bytes for a person, in the largest binary unit under which it is at least 1: "0",
    "512B", "1.5TiB", "100GiB" (at most one decimal, dropped when it is .0)."""
    if size < 1024:
        return "0" if size <= 0 else f"{size}B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        value /= 1024
        if value < 1024 or unit == "EiB":
            text = f"{value:.1f}".removesuffix(".0")
            return f"{text}{unit}"
    raise AssertionError("unreachable")
