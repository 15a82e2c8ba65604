# SPDX-License-Identifier: LGPL-3.0-only
"""Subresources beyond /status: a registry the server routes to (e.g. pods/log).

A module that serves one registers a handler for (plural, subresource); the server hands it
the request after routing, and sends what it returns.  /status is built in (the store keeps
spec and status apart for every kind whose CRD declares the subresource).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HANDLERS", "Reply", "Request", "register"]


@dataclass(frozen=True)
class Request:
    method: str  # GET | PUT | PATCH | POST | DELETE
    namespace: str | None
    name: str
    query: dict[str, str]
    body: Any  # the decoded JSON body, or None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    code: int
    body: bytes
    content_type: str = "application/json"


#: (plural, subresource) -> handler(store, request) -> Reply; raise ApiError to fail.
Handler = Callable[[Any, Request], Reply]
HANDLERS: dict[tuple[str, str], Handler] = {}


def register(plural: str, subresource: str, handler: Handler) -> None:
    HANDLERS[(plural, subresource)] = handler
