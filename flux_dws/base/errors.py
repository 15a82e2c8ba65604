# SPDX-License-Identifier: LGPL-3.0-only
"""Error types.  Every message is one line a user or admin can act on."""

from __future__ import annotations


class DwsError(ValueError):
    """Base of every flux-dws input error; str() is the one-line message."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class DirectiveError(DwsError):
    """A #DW directive is malformed or breaks a DWS rule."""


class PolicyError(DwsError):
    """The site's [dws] configuration table is invalid."""


class RequestError(DwsError):
    """A job's DWS attributes (system.dw, system.dw_timeout, ...) are invalid."""


def quote(text: str, limit: int = 60) -> str:
    """``text`` quoted for a one-line message (repr escapes control characters), cut short."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")
