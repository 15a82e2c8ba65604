# SPDX-License-Identifier: LGPL-3.0-only
"""Deprecated: the old names of :mod:`flux_dws.base.untrusted`, kept only until
flux_dws/service/ and flux_dws/testing/fakeflux/ import that module instead.  Do not use."""

from __future__ import annotations

from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.untrusted import ECHO_LIMIT, echo, jansson_problem


def one_line(text: Any, limit: int | None = None) -> str:
    """Now :func:`flux_dws.base.untrusted.text`."""
    return untrusted.text(text, limit)


def safe_text(text: str) -> str:
    """Now :func:`flux_dws.base.untrusted.field`."""
    return untrusted.field(text)


def json_safe(value: Any, *, text: bool = False) -> Any:
    """Now :func:`flux_dws.base.untrusted.json_safe` (``one_line=`` for ``text=``)."""
    return untrusted.json_safe(value, one_line=text)


__all__ = ["ECHO_LIMIT", "echo", "jansson_problem", "json_safe", "one_line", "safe_text"]
