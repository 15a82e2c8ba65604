# SPDX-License-Identifier: LGPL-3.0-only
"""Watches and committed snapshots: what the store hands its readers (see store.py).

A committed object is an immutable snapshot, encoded once at commit: every copy handed out
and every watch event is made from that one JSON text.  A Watch filters one resource's
events by namespace and selectors, turns an object leaving a label selector into DELETED,
and emits BOOKMARKs on a quiet stream.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from . import errors
from .resources import Resource
from .selectors import fields_match, matches, parse_field_selector, parse_label_selector

__all__ = ["Watch"]


@dataclass(frozen=True)
class _Snapshot:
    """A committed object and its JSON text: made once per commit, shared by every reader."""

    obj: dict  # never mutated after commit
    text: str  # json.dumps(obj)

    @classmethod
    def of(cls, obj: dict) -> _Snapshot:
        return cls(obj, _dumps(obj))

    def copy(self) -> dict:
        """A private copy for a caller (one decoding; the text is never re-encoded)."""
        return json.loads(self.text)

    def out(self, shared: bool) -> dict:
        """What a caller gets: a private copy, or with ``shared`` the object itself (read-only)."""
        return self.obj if shared else json.loads(self.text)


@dataclass(frozen=True)
class _Event:
    rv: int
    plural: str
    type: str  # ADDED | MODIFIED | DELETED
    snap: _Snapshot  # the object as committed
    prev: _Snapshot | None


class Watch:
    """A stream of events for one resource, filtered by namespace and selectors.

    ``next`` returns ('ADDED'|'MODIFIED'|'DELETED'|'BOOKMARK', object) or None on timeout or once
    closed (with ``shared``, the object is the stored one: read it, never change it);
    ``next_text`` the same with the object as JSON text, for a server that only sends it on.
    With a bookmark interval, a quiet stream yields a BOOKMARK carrying only
    metadata.resourceVersion: every matching event up to that version has been delivered.
    """

    def __init__(
        self,
        resource: Resource,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
        start_rv: int,
        bookmark_interval: float | None,
        on_close: Callable[[Watch], None],
        shared: bool = False,
    ) -> None:
        self.resource = resource
        self._shared = shared
        self._namespace = namespace if resource.namespaced else None
        self._labels = parse_label_selector(label_selector)
        self._fields = parse_field_selector(field_selector, resource)
        self._cond = threading.Condition()
        self._queue: deque[tuple[str, _Snapshot]] = deque()  # shared with the store
        self._seen_rv = start_rv
        self._bookmark_interval = bookmark_interval
        self._last_emit = time.monotonic()
        self._closed = False
        self._on_close = on_close

    @property
    def closed(self) -> bool:
        return self._closed

    def next(self, timeout: float) -> tuple[str, dict] | None:
        found = self._next(timeout)
        if found is None:
            return None
        kind, event = found
        return kind, event.out(self._shared) if isinstance(event, _Snapshot) else event

    def next_text(self, timeout: float, api_version: str | None = None) -> tuple[str, str] | None:
        """``next`` with the object as JSON text; with ``api_version``, the object says that
        apiVersion (as a server answering a request for that version must)."""
        found = self._next(timeout)
        if found is None:
            return None
        kind, event = found
        if isinstance(event, _Snapshot):
            return kind, _with_api_version(event.text, event.obj.get("apiVersion"), api_version)
        if api_version is not None:
            event["apiVersion"] = api_version
        return kind, json.dumps(event)

    def _next(self, timeout: float) -> tuple[str, _Snapshot | dict] | None:
        """The next queued event, or a BOOKMARK (a new object) when one is due."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while True:
                if self._queue:
                    found = self._queue.popleft()
                    self._last_emit = time.monotonic()
                    return found
                if self._closed:
                    return None
                now = time.monotonic()
                wake = deadline
                if self._bookmark_interval is not None:
                    due = self._last_emit + self._bookmark_interval
                    if now >= due:
                        self._last_emit = now
                        return "BOOKMARK", self._bookmark_object()
                    wake = min(wake, due)
                if now >= deadline:
                    return None
                self._cond.wait(wake - now)

    def bookmark(self) -> tuple[str, dict] | None:
        """A BOOKMARK for the current position, or None while events are still queued."""
        with self._cond:
            if self._queue or self._closed:
                return None
            self._last_emit = time.monotonic()
            return "BOOKMARK", self._bookmark_object()

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        self._on_close(self)

    def _bookmark_object(self) -> dict:
        return {
            "kind": self.resource.kind,
            "apiVersion": self.resource.api_version(),
            "metadata": {"resourceVersion": str(self._seen_rv)},
        }

    def _wants(self, obj: dict | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata", {})
        if self._namespace is not None and meta.get("namespace") != self._namespace:
            return False
        return matches(self._labels, meta.get("labels")) and fields_match(self._fields, obj)

    def _offer(self, event: _Event | None, rv: int) -> None:
        """Called under the store lock for every commit (event None: another resource)."""
        delivered = None
        if event is not None and event.plural == self.resource.plural:
            delivered = self._translate(event)
        with self._cond:
            if self._closed:
                return
            self._seen_rv = max(self._seen_rv, rv)
            if delivered is not None:
                self._queue.append(delivered)
                self._cond.notify_all()

    def _push_added(self, snap: _Snapshot) -> None:
        with self._cond:
            self._queue.append(("ADDED", snap))

    def _translate(self, event: _Event) -> tuple[str, _Snapshot] | None:
        obj = event.snap.obj
        prev = event.prev.obj if event.prev is not None else None
        now_in = event.type != "DELETED" and self._wants(obj)
        was_in = event.type != "ADDED" and self._wants(prev if event.type == "MODIFIED" else obj)
        if event.type == "MODIFIED" and was_in and not now_in:
            # Left the selector: DELETED with the old content at the new version, as k8s does.
            assert event.prev is not None
            gone = event.prev.copy()
            gone["metadata"]["resourceVersion"] = str(event.rv)
            return "DELETED", _Snapshot.of(gone)
        if now_in:
            return ("ADDED" if not was_in else "MODIFIED"), event.snap
        if event.type == "DELETED" and was_in:
            return "DELETED", event.snap
        return None


def _dumps(obj: Any) -> str:
    try:
        return json.dumps(obj)
    except (TypeError, ValueError) as exc:
        raise errors.bad_request(f"object is not plain JSON data: {exc}") from None


def _with_api_version(text: str, stored: Any, wanted: str | None) -> str:
    """``text`` (an object whose apiVersion is ``stored``) saying apiVersion ``wanted``."""
    if wanted is None or stored == wanted:
        return text
    obj = json.loads(text)
    obj["apiVersion"] = wanted
    return json.dumps(obj)
