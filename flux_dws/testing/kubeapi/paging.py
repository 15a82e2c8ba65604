# SPDX-License-Identifier: LGPL-3.0-only
"""List paging: ``limit`` and ``continue`` tokens, as the API server (over etcd) has them.

A token names the resourceVersion of the first page and the key after which the next page
starts; every page of one list shows the objects as they were at that version (the store
rebuilds it from its event history), and a token older than the history is 410 Expired,
answered with an "inconsistent" token (resourceVersion -1) that continues from the current
state instead.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Reversible
from dataclasses import dataclass
from typing import Any

from .errors import ApiError, bad_request
from .objectrules import key_of
from .resources import Resource
from .selectors import fields_match, matches

Key = tuple[str, str]  # (namespace or "", name)
INCONSISTENT = -1

EXPIRED_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. You can"
    " start a new list without the continue parameter, or use the continue token in this"
    " response to retrieve the remainder of the results. Continuing with the provided token"
    " results in an inconsistent list - objects that were created, modified, or deleted"
    " between the time the first chunk was returned and now may show up in the list."
)


@dataclass(frozen=True)
class Token:
    rv: int  # the version every page shows; INCONSISTENT: the current state
    start: Key  # the last key already returned


def encode(rv: int, last: Key) -> str:
    body = {"v": "meta.k8s.io/v1", "rv": rv, "start": f"{last[0]}/{last[1]}\x00"}
    return base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()


def decode(text: str) -> Token:
    """The token a client sent back; 400 when it is not one of ours."""
    try:
        padded = text + "=" * (-len(text) % 4)
        body = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad_request("continue key is not valid: illegal base64 data") from None
    if not isinstance(body, dict) or body.get("v") != "meta.k8s.io/v1":
        raise bad_request("continue key is not valid: server does not recognize this encoded key")
    rv, start = body.get("rv"), body.get("start")
    if not isinstance(rv, int) or isinstance(rv, bool) or not isinstance(start, str):
        raise bad_request("continue key is not valid: incorrect encoded start resourceVersion")
    if rv == 0 or rv < INCONSISTENT or "/" not in start:
        raise bad_request("continue key is not valid: incorrect encoded start resourceVersion")
    namespace, _, name = start.rstrip("\x00").partition("/")
    return Token(rv, (namespace, name))


def expired(last: Key) -> ApiError:
    """410 for a token older than the history, carrying the inconsistent continuation."""
    error = ApiError(410, "Expired", EXPIRED_MESSAGE)
    error.metadata = {"continue": encode(INCONSISTENT, last)}
    return error


def check_limit(text: str | None) -> int:
    """The ``limit`` parameter: a non-negative integer (0 or absent: no limit)."""
    if not text:
        return 0
    try:
        limit = int(text)
    except ValueError:
        raise bad_request(f'strconv.ParseInt: parsing "{text}": invalid syntax') from None
    return max(limit, 0)


def select(
    table: Mapping[Key, Any],
    start: Key | None,
    namespace: str | None,
    labels: Any,
    fields: Any,
    limit: int,
) -> tuple[list[Any], Key | None, int | None]:
    """One page from ``table`` (key -> stored snapshot, whose ``obj`` is the object): the
    objects after ``start`` in key order, in ``namespace`` (None: any), matching the parsed
    selectors, at most ``limit`` (0: all).  Returns them, the key of the last one when more
    follow (None: this is the last page), and how many are left when nothing is filtered
    (remainingItemCount; None otherwise, as the server leaves it unset)."""
    keys = sorted(
        key
        for key in table
        if (start is None or key > start) and (namespace is None or key[0] == namespace)
    )
    selected = labels or fields
    items: list[Any] = []
    last: Key | None = None
    for index, key in enumerate(keys):
        snap = table[key]
        if selected and not (
            matches(labels, snap.obj["metadata"].get("labels")) and fields_match(fields, snap.obj)
        ):
            continue
        if limit and len(items) == limit:  # one more matches: this page ends here
            return items, last, None if selected else len(keys) - index
        items.append(snap)
        last = key
    return items, None, None


def table_at(
    table: Mapping[Key, Any], history: Reversible[Any], resource: Resource, rv: int
) -> dict[Key, Any]:
    """The objects of ``resource`` as they were at ``rv`` (within the history): ``table`` (as
    now, key -> snapshot) with each later event of ``history`` (the store's, oldest first)
    undone."""
    found = dict(table)
    for event in reversed(history):
        if event.rv <= rv:
            break
        if event.plural != resource.plural:
            continue
        key = key_of(resource, event.snap.obj)
        if event.type == "ADDED" or event.prev is None:
            found.pop(key, None)
        else:
            found[key] = event.prev
    return found
