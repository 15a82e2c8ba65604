# SPDX-License-Identifier: LGPL-3.0-only
"""One reader for untrusted data: everything from Kubernetes, DWS, NNF or a user.

Such data may be of any type and any size, and its text may hold NUL, control characters
(ESC sequences that would drive a terminal), invalid UTF-8 or lone UTF-16 surrogates.  Flux
parses every message with jansson, which refuses a NUL (``\\u0000``), a lone surrogate and the
non-numbers NaN and Infinity: one such character anywhere in a request makes the jobtap plugin
refuse the whole request (EPROTO).  So every reading of such data goes through this module:

- :func:`readable`: THE sanitiser for what people read: any value as one safe, printable
  line cut to a limit (messages, names, drain reasons, events, exception notes, log lines,
  everything the CLI prints), or with ``lines=True`` as several lines (newlines and tabs kept:
  container output).  Every sink goes through it (tests/test_sinks.py holds the code to that);
  :func:`text`, :func:`lines` and :func:`echo` are its short forms;
- :func:`field`: a string field kept as it is (newlines, tabs and printable text), with only
  what jansson refuses replaced; "" when it is not a string;
- :func:`mapping`, :func:`sequence`, :func:`integer`, :func:`name_of`: typed reads with a
  safe fallback;
- :func:`json_safe` / :func:`jansson_problem`: a whole payload made, or checked, acceptable.

Each sink passes its own bound (characters once readable; a longer text is cut and ends in
``...``), so a megabyte message from DWS reaches none of them whole: :data:`RECORD_LIMIT` for
a string inside an event, a KVS record or a memo, :data:`LOG_LIMIT` for a service log line,
:data:`LINE_LIMIT` for a line (or a JSON string) that ``flux dws`` prints; an exception note
(flux_dws.flux.jobmanager.NOTE_LIMIT) and a drain reason (flux_dws.core.health.MAX_REASON)
have shorter ones of their own.

One rendering everywhere: a character that is not printable is written as Python writes it in
a string literal (``\\n``, ``\\r``, ``\\t``, ``\\x00``, ``\\x1b``, ``\\u202e``); a lone
surrogate or undecodable byte becomes U+FFFD; a cut text ends in ``...``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

#: How many characters of untrusted input an error message echoes.
ECHO_LIMIT = 80
#: The default bound of :func:`text`: no single line from outside is longer.
TEXT_LIMIT = 4096
#: A string inside an event, a KVS record or a memo (``flux job eventlog``, ``flux jobs -o``):
#: each is at most this long (flux_dws.flux.jobmanager sends nothing longer).
RECORD_LIMIT = TEXT_LIMIT
#: A service log line's message (flux_dws.service.daemon.ReadableFormatter).
LOG_LIMIT = TEXT_LIMIT
#: A line ``flux dws`` prints, and a string in the JSON it prints (flux_dws.cli.render).
LINE_LIMIT = TEXT_LIMIT
#: The mark that ends a text cut short.
CUT = "..."
#: The placeholder for a missing or unreadable name.
UNKNOWN = "?"
#: Integers that go to Flux (jansson's json_int_t) and Kubernetes (int64).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Integers a Kubernetes int32 field holds (exit codes, restart counts).
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_REPLACEMENT = "\ufffd"
_EMPTY: Mapping[str, Any] = {}


def _is_surrogate(char: str) -> bool:
    return 0xD800 <= ord(char) <= 0xDFFF


def _jansson_clean(value: str) -> bool:
    """No NUL and no lone surrogate: the common case, decided at C speed (a per-character
    check cost most of the service's CPU on container logs and RPC payloads)."""
    if "\x00" in value:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")  # fails exactly on a lone surrogate
    except UnicodeEncodeError:
        return False
    return True


def _escape(char: str) -> str:
    """One character as shown: itself when printable, else its escape (or U+FFFD)."""
    if char.isprintable():
        return char
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if 0xD800 <= code <= 0xDFFF:
        return _REPLACEMENT
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _as_str(value: Any) -> str:
    """Any value as a str: bytes decoded as UTF-8 (bad bytes -> U+FFFD), anything else str()
    (and its type's name should even str() fail)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    try:
        return str(value)
    except Exception:  # a broken __str__ is untrusted too
        return f"<{type(value).__name__}>"


def _cut(shown: str, limit: int | None) -> str:
    if limit is not None and len(shown) > limit:
        return shown[: max(limit - len(CUT), 0)] + CUT[: max(limit, 0)]
    return shown


def _render(value: Any, limit: int | None, keep: str) -> str:
    raw = _as_str(value)
    if limit is not None and len(raw) > limit + 1:
        raw = raw[: limit + 1]  # each character shows as one or more: no need to read the rest
    plain = raw
    for char in keep:
        plain = plain.replace(char, "")
    if plain.isprintable():  # nothing to escape (C speed); else character by character
        return _cut(raw, limit)
    shown = "".join(c if c in keep else _escape(c) for c in raw)
    return _cut(shown, limit)


def readable(value: Any, limit: int | None = TEXT_LIMIT, *, lines: bool = False) -> str:
    """``value`` (of any type) made safe for a person to read, on a terminal or in a table.

    Control characters (C0 and C1: ESC, so CSI and OSC sequences too; NUL; DEL), bidi overrides
    and isolates (U+202A-202E, U+2066-2069), line and paragraph separators and every other
    non-printable character are escaped (``\\n``, ``\\x00``, ``\\x1b``, ``\\u202e``); lone
    surrogates and bad UTF-8 become U+FFFD; at most ``limit`` characters are kept (then the text
    ends in ``...``; ``None``: no limit).  One line unless ``lines``, which keeps newlines and
    tabs (container output)."""
    return _render(value, limit, "\n\t" if lines else "")


def text(value: Any, limit: int | None = TEXT_LIMIT) -> str:
    """:func:`readable` as one line."""
    return readable(value, limit)


def lines(value: Any, limit: int | None = None) -> str:
    """:func:`readable` with newlines and tabs kept (several lines: container output)."""
    return readable(value, limit, lines=True)


def field(value: Any, limit: int | None = None) -> str:
    """A string field of untrusted data, as it is but safe for Flux's JSON: NUL as ``\\x00``, a
    lone surrogate as U+FFFD, cut to ``limit``; "" when ``value`` is not a string.

    Other characters are kept (a log's ESC too): print it through :func:`text` or
    :func:`lines`."""
    if not isinstance(value, str):
        return ""
    if limit is not None and len(value) > limit:
        value = _cut(value, limit)
    if not _jansson_clean(value):
        value = "".join(
            "\\x00" if c == "\x00" else _REPLACEMENT if _is_surrogate(c) else c for c in value
        )
        value = _cut(value, limit)
    return value


def echo(value: Any, limit: int = ECHO_LIMIT) -> str:
    """Untrusted input quoted for an error message: a string escaped, cut and in quotes,
    anything else its repr, escaped and cut."""
    if isinstance(value, str):
        return f"'{readable(value, limit)}'"
    try:
        shown = repr(value) if not isinstance(value, int) or abs(value) < 10**limit else ""
    except Exception:
        shown = f"<{type(value).__name__}>"
    if not shown:  # a huge int: repr() would refuse (or take long); its size says enough
        shown = f"<an integer of {value.bit_length()} bits>"
    return readable(shown, limit)


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else _EMPTY


def sequence(value: Any) -> list[Any]:
    """``value``'s items when it is a list or tuple, else none."""
    return list(value) if isinstance(value, (list, tuple)) else []


#: Digits :func:`decimal` reads at most: INT64_MAX has 19.
_DECIMAL_DIGITS = 19


def integer(value: Any, low: int = INT64_MIN, high: int = INT64_MAX) -> int | None:
    """``value`` when it is an int (never a bool) with ``low <= value <= high``, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return int(value)
    return None


def count(value: Any, high: int = INT64_MAX) -> int | None:
    """A non-negative int that fits an int64 (or ``high``), else None."""
    return integer(value, 0, high)


def decimal(value: Any, high: int = INT64_MAX) -> int | None:
    """``value`` read as :func:`count` when it is a string of ASCII digits, else None.
    ``str.isdigit`` also takes "²" (which ``int`` then refuses) and "３" (which it reads)."""
    if isinstance(value, str) and 0 < len(value) <= _DECIMAL_DIGITS and value.isascii():
        return count(int(value), high) if value.isdigit() else None
    return None


def name_of(obj: Any, *, namespaced: bool = False, limit: int = 253) -> str:
    """``obj``'s metadata.name as one safe line (``namespace/name`` with ``namespaced``);
    ``?`` for a missing or empty one."""
    meta = mapping(mapping(obj).get("metadata"))
    name = text(meta.get("name"), limit) if isinstance(meta.get("name"), str) else ""
    if namespaced:
        space = text(meta.get("namespace"), limit) if isinstance(meta.get("namespace"), str) else ""
        return f"{space or UNKNOWN}/{name or UNKNOWN}"
    return name or UNKNOWN


def jansson_problem(value: Any, path: str = "") -> str | None:
    """Why jansson would refuse ``value`` once sent as JSON (None if it would not).

    The same rules as ``json_loads(text, 0, ...)`` in flux-core's job-manager: no NUL in any
    string or key, no lone surrogate, no NaN or infinity, and no integer outside jansson's
    ``json_int_t`` (int64: jansson reports "too big integer").
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if not INT64_MIN <= value <= INT64_MAX:
            return f"{path or 'value'}: integer {echo(value, 40)} is out of int64 range"
        return None
    if isinstance(value, str):
        for char in value:
            if char == "\x00":
                return f"{path or 'value'}: NUL (\\u0000) is not allowed"
            if _is_surrogate(char):
                return f"{path or 'value'}: lone surrogate U+{ord(char):04X} is invalid Unicode"
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path or 'value'}: {value} is not a JSON number"
    if isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            problem = jansson_problem(str(key), where) or jansson_problem(item, where)
            if problem:
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = jansson_problem(item, f"{path}[{i}]")
            if problem:
                return problem
    return None


def json_safe(
    value: Any, *, one_line: bool = False, record: bool = False, limit: int = RECORD_LIMIT
) -> Any:
    """A copy of a JSON payload that jansson accepts: strings (and keys) through :func:`field`
    (or :func:`readable`, as one line and at most ``limit`` characters, with ``one_line``),
    non-finite floats as None.

    With ``record`` (an event, a KVS record, a memo: what a person reads), strings go through
    :func:`readable` (newlines kept unless ``one_line``), each cut to ``limit``, and an integer
    outside int64 becomes None, so the record is kept with that figure unknown rather than lost
    to EPROTO.  Without it such an integer is left for the caller's own checks (a request the
    plugin acts on must not change meaning), and strings are not cut."""
    kind = type(value)  # the exact JSON types first: no ABC checks for what json.loads makes
    if kind is str:
        if one_line or record:
            if len(value) <= limit and value.isprintable():  # nothing to escape or cut
                return value
            return readable(value, limit, lines=not one_line)
        return field(value)
    if kind is dict:
        one_key = one_line or record
        out = {}
        for k, v in value.items():
            if type(k) is not str or not (one_key and len(k) <= limit and k.isprintable()):
                k = json_safe(_as_str(k), one_line=one_key, limit=limit)
            if v is not None and v is not True and v is not False:
                v = json_safe(v, one_line=one_line, record=record, limit=limit)
            out[k] = v
        return out
    if kind is int:
        return None if record and not INT64_MIN <= value <= INT64_MAX else value
    if kind is bool or value is None:
        return value
    if isinstance(value, str):
        if one_line or record:
            return readable(value, limit, lines=not one_line)
        return field(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if record and integer(value) is None and isinstance(value, int) and not isinstance(value, bool):
        return None
    if isinstance(value, Mapping):
        return {
            json_safe(_as_str(k), one_line=one_line or record, limit=limit): json_safe(
                v, one_line=one_line, record=record, limit=limit
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [json_safe(v, one_line=one_line, record=record, limit=limit) for v in value]
    return value


__all__ = [
    "CUT",
    "ECHO_LIMIT",
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "LINE_LIMIT",
    "LOG_LIMIT",
    "RECORD_LIMIT",
    "TEXT_LIMIT",
    "UNKNOWN",
    "count",
    "echo",
    "field",
    "integer",
    "jansson_problem",
    "json_safe",
    "lines",
    "mapping",
    "name_of",
    "readable",
    "sequence",
    "text",
]


#: A Kubernetes object name (an RFC 1123 subdomain), as DWS names its Storage after a rabbit.
_OBJECT_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_OBJECT_NAME_LIMIT = 253


def object_name_problem(value: Any, what: str = "name") -> str | None:
    """Why ``value`` cannot name a Kubernetes object such as a rabbit's Storage (None if it
    can): an RFC 1123 subdomain of at most 253 characters, and not all digits, which Flux
    and hostlists would read as a number.  The text is one line, echoing the value safely."""
    if not isinstance(value, str):
        return f"{what} {echo(value)} is not a string"
    if len(value) > _OBJECT_NAME_LIMIT or not _OBJECT_NAME_RE.fullmatch(value) or value.isdigit():
        return (
            f"{what} {echo(value)} is not a DNS-1123 name (lowercase letters, digits, '-' and"
            " '.', beginning and ending with a letter or digit, not all digits)"
        )
    return None
