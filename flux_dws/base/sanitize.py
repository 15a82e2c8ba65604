# SPDX-License-Identifier: LGPL-3.0-only
"""Text from Kubernetes made safe to hand to Flux, and to show in one line.

Flux parses every message with jansson, which refuses a NUL (``\\u0000``), a lone UTF-16
surrogate and the non-numbers NaN and Infinity: one such character anywhere in a request makes
the jobtap plugin refuse the whole request (EPROTO), so an exception or event built from a DWS
message would never be delivered.  Everything DWS, NNF or a user wrote is untrusted, so the
service passes every payload through :func:`json_safe` before it leaves for Flux, and every
message meant for a person through :func:`one_line`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: How many characters of untrusted input an error message echoes.
ECHO_LIMIT = 80

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x00": "\\0"}


def _is_surrogate(char: str) -> bool:
    return 0xD800 <= ord(char) <= 0xDFFF


def _is_control(char: str) -> bool:
    code = ord(char)
    return code < 0x20 or 0x7F <= code < 0xA0


def jansson_problem(value: Any, path: str = "") -> str | None:
    """Why jansson would refuse ``value`` once sent as JSON (None if it would not).

    The same rules as ``json_loads(text, 0, ...)`` in flux-core's job-manager: no NUL in any
    string or key, no lone surrogate, no NaN or infinity.
    """
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


def safe_text(text: str) -> str:
    """``text`` with what jansson refuses replaced: NUL as ``\\0``, a lone surrogate as U+FFFD."""
    if not any(c == "\x00" or _is_surrogate(c) for c in text):
        return text
    return "".join("\\0" if c == "\x00" else "\ufffd" if _is_surrogate(c) else c for c in text)


def one_line(text: Any, limit: int | None = None) -> str:
    """``text`` for a message: control characters escaped (``\\n``, ``\\x1b``), no NUL or lone
    surrogate, and at most ``limit`` characters (then ``...``)."""
    text = text if isinstance(text, str) else str(text)
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif _is_control(char):
            out.append(f"\\x{ord(char):02x}")
        elif _is_surrogate(char):
            out.append("\ufffd")
        else:
            out.append(char)
    shown = "".join(out)
    if limit is not None and len(shown) > limit:
        shown = shown[: max(limit - 3, 0)] + "..."
    return shown


def echo(value: Any, limit: int = ECHO_LIMIT) -> str:
    """Untrusted input quoted for an error message: escaped, truncated, in quotes."""
    return f"'{one_line(value, limit)}'"


def json_safe(value: Any, *, text: bool = False) -> Any:
    """A copy of a JSON payload that jansson accepts: strings (and keys) through
    :func:`safe_text` (or :func:`one_line` with ``text``), non-finite floats as None."""
    if isinstance(value, str):
        return one_line(value) if text else safe_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {json_safe(str(k), text=text): json_safe(v, text=text) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, text=text) for v in value]
    return value


__all__ = ["ECHO_LIMIT", "echo", "jansson_problem", "json_safe", "one_line", "safe_text"]
