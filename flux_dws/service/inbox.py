# SPDX-License-Identifier: LGPL-3.0-only
"""The workflow watch's events on their way from its thread to the service's loop.

Under load the loop falls behind the watch: only the newest version of each workflow is worth
parsing and deciding on, so events for one workflow (name and uid) that the loop has not
reached yet collapse into the newest, keeping the first one's time, and a backlog costs one
decision per workflow, not one per event.  The order of first arrival is kept, so a DELETED
and a re-creation stay in order.  One drain per batch is queued on the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from flux_dws.base import untrusted
from flux_dws.base.loop import Loop

log = logging.getLogger("flux-dws")

#: (kind, workflow object, monotonic time it first arrived) -> None, on the loop
Handler = Callable[[str, "dict[str, Any]", float], None]


class Inbox:
    """``put`` on the watch thread; ``handle`` runs on the loop for each event left."""

    def __init__(self, loop: Loop, handle: Handler) -> None:
        self.loop = loop
        self.handle = handle
        self._events: dict[tuple[str, str], tuple[str, dict[str, Any], float]] = {}
        self._lock = threading.Lock()
        self._queued = False

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        """Called on the watch thread: stamp the time and leave the event here."""
        meta = untrusted.mapping(obj.get("metadata"))
        key = (untrusted.field(meta.get("name")), untrusted.field(meta.get("uid")))
        seen = time.monotonic()
        with self._lock:
            waiting = self._events.get(key)
            self._events[key] = (kind, obj, waiting[2] if waiting else seen)
            if self._queued:
                return
            self._queued = True
        self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        with self._lock:
            events, self._events, self._queued = self._events, {}, False
        for (name, _uid), (kind, obj, seen) in events.items():
            try:
                self.handle(kind, obj, seen)
            except Exception:  # a bug for one workflow must not lose the others' events
                log.exception("workflow %s: handling its %s event failed", name, kind)

    def depth(self) -> int:
        """Events waiting for the loop."""
        with self._lock:
            return len(self._events)
