# SPDX-License-Identifier: LGPL-3.0-only
"""Flux's compact host and id lists (RFC 29 hostlists, RFC 22 idsets), as pure functions.

flux-core's own classes live in its Python bindings, which the service and the tests do not
always have; R (RFC 20) and the resource graph need only expansion and encoding.

R and drain state come from Flux but are read as untrusted: a range is ASCII digits only (not
``²`` or ``３``, which ``str.isdigit`` takes), and no list expands to more than
``MAX_EXPANSION`` names (``node[0-99999999999]`` would otherwise be built in memory first).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from flux_dws.base.untrusted import ECHO_LIMIT, echo

_HOST_RE = re.compile(r"^([^\[\],]*)\[([^\[\]]+)\]([^\[\],]*)$")
_DIGITS = re.compile(r"[0-9]{1,18}", re.ASCII)  # an id fits an int64 (RFC 22 ids are uint)

#: The most names (hosts or ids) one list may expand to: more nodes than any Flux instance has.
MAX_EXPANSION = 1 << 20


class HostlistError(ValueError):
    """A hostlist or idset that does not parse; the message names it."""


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {_shown(text)}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"unbalanced '[' in hostlist {_shown(text)}")
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]


def _shown(value: str) -> str:
    return echo(value, ECHO_LIMIT)


def _ranges(text: str, whole: str, room: int) -> list[str]:
    """'01-03,7' -> ['01', '02', '03', '7'], keeping each range's zero padding; at most
    ``room`` of them (HostlistError beyond)."""
    out: list[str] = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        if not _DIGITS.fullmatch(lo) or (sep and not _DIGITS.fullmatch(hi)):
            raise HostlistError(f"invalid range {_shown(part)} in {_shown(whole)}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise HostlistError(
                f"invalid range {_shown(part)} in {_shown(whole)}: end before start"
            )
        if len(out) + last - first + 1 > room:
            raise HostlistError(f"{_shown(whole)} names more than {MAX_EXPANSION} hosts or ids")
        if not sep:
            out.append(lo)
            continue
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        out.extend(str(n).zfill(width) for n in range(first, last + 1))
    return out


def expand_hostlist(text: str) -> list[str]:
    """An RFC 29 hostlist ('node[0-3],login1') -> host names in order."""
    if not isinstance(text, str):
        raise HostlistError(f"a hostlist must be a string, not {type(text).__name__}")
    hosts: list[str] = []
    for entry in _split_top(text):
        match = _HOST_RE.match(entry)
        if match is None:
            if "[" in entry or "]" in entry:
                raise HostlistError(f"invalid hostlist entry {_shown(entry)}")
            if len(hosts) >= MAX_EXPANSION:
                raise HostlistError(f"{_shown(text)} names more than {MAX_EXPANSION} hosts")
            hosts.append(entry)
            continue
        prefix, ranges, suffix = match.groups()
        room = MAX_EXPANSION - len(hosts)
        hosts.extend(f"{prefix}{n}{suffix}" for n in _ranges(ranges, entry, room))
    return hosts


def expand_idset(text: str) -> list[int]:
    """An RFC 22 idset ('0-3,7') -> sorted distinct ids."""
    if not isinstance(text, str):
        raise HostlistError(f"an idset must be a string, not {type(text).__name__}")
    if not text.strip():
        return []
    return sorted({int(n) for n in _ranges(text.strip().strip("[]"), text, MAX_EXPANSION)})


def encode_idset(ids: Iterable[int]) -> str:
    """Sorted ids -> the shortest RFC 22 idset ('0-3,7')."""
    values = sorted(set(ids))
    runs: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        runs.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(runs)


__all__ = ["MAX_EXPANSION", "HostlistError", "encode_idset", "expand_hostlist", "expand_idset"]
