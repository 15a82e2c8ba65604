# SPDX-License-Identifier: LGPL-3.0-only
"""A list followed page by page: ``limit`` and continue tokens, as a real API server wants.

Every page of one list shows the objects as they were when its first page was taken (one
resourceVersion).  A continue token that expired meanwhile (410) starts the list again, a
bounded number of times; the page that starts it again is ``fresh``, so whoever takes the
pages as they come (flux_dws.k8s.watch) knows to count from there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Callable, NamedTuple

from flux_dws.k8s.errors import KubeError

log = logging.getLogger("flux-dws.k8s")

#: How often one list may start again after its continue token expired.
LIST_RESTARTS = 3


class Page(NamedTuple):
    """One page of a list."""

    items: list[dict]
    resource_version: str  # the list's: the same on every page of one list
    fresh: bool  # the first page of the list (or of the list started again)
    last: bool  # no page follows: the list is complete


#: token (None: the first page) -> (items, resourceVersion, next token or None)
PageReader = Callable[["str | None"], "tuple[list[dict], str, str | None]"]


def pages(read: PageReader, what: str) -> Iterator[Page]:
    """Every page of one list, as each arrives; ``what`` names the list in log lines."""
    restarts, token, fresh, count = 0, None, True, 0
    while True:
        try:
            items, rv, following = read(token)
        except KubeError as exc:
            if exc.status != 410 or token is None or restarts >= LIST_RESTARTS:
                raise
            restarts += 1
            log.info(
                "listing %s: continue token expired after %d items; restarting the list (%d of %d)",
                what,
                count,
                restarts,
                LIST_RESTARTS,
            )
            token, fresh, count = None, True, 0
            continue
        count += len(items)
        yield Page(items, rv, fresh, not following)
        if not following:
            return
        token, fresh = following, False


def collect(listed: Iterator[Page]) -> tuple[list[dict], str]:
    """The whole list at once: (items, resourceVersion)."""
    items: list[dict] = []
    for page in listed:
        if page.fresh:
            items = []
        items.extend(page.items)
        if page.last:
            return items, page.resource_version
    raise AssertionError("a list ends with its last page")  # pages() never stops early
