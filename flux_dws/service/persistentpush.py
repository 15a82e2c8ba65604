# SPDX-License-Identifier: LGPL-3.0-only
"""Keep the jobtap plugin informed of our namespace's persistent storage, for submit checks.

PersistentStorageInstances are watched (flux_dws.k8s.watch.PersistentWatch: one list, then a
watch; no list per job); after the first list and on every change that alters what a
persistentdw may use, the service sends the plugin flux_dws.core.persistent.pushed_snapshot
(method ``persistent``), coalesced to one request per loop turn.  It is sent again every
``[dws] heartbeat`` x6, so a plugin reloaded meanwhile gets it back.  Without one, the plugin
accepts the job and nnf-sos checks it at Proposal.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Callable

from flux_dws.base.loop import Loop
from flux_dws.core.persistent import directives_refusal, persistent_rows, pushed_snapshot
from flux_dws.core.policy import Policy
from flux_dws.flux.jobmanager import JobManager
from flux_dws.flux.transport import RpcError
from flux_dws.k8s import KubeClient
from flux_dws.k8s.watch import DELETED, PersistentWatch, slim

log = logging.getLogger("flux-dws")
RESEND_HEARTBEATS = 6
#: How long a new job with a persistentdw waits for the first list (then nnf-sos checks it).
LIST_GRACE = 30.0


class PersistentPush:
    """See the module docstring; call every method on the loop's thread."""

    def __init__(
        self,
        *,
        policy: Policy,
        loop: Loop,
        kube: KubeClient,
        jm: JobManager,
    ) -> None:
        self.policy = policy
        self.loop = loop
        self.jm = jm
        self.sent = 0  # snapshots the plugin accepted (tests wait on this)
        self._objects: dict[str, dict[str, Any]] = {}
        self._last: dict[str, Any] | None = None
        self._listed = False
        self._grace_over = False
        self._waiting: list[Callable[[], None]] = []  # run once ready()
        self._queued = False
        self._stopped = False
        self._watch = PersistentWatch(
            kube,
            lambda kind, obj: loop.call_soon(self._event, kind, obj),
            on_listed=lambda: loop.call_soon(self._on_listed),
        )

    def start(self) -> None:
        self._watch.start()
        self.loop.call_later(LIST_GRACE, self._grace_ended)
        self.loop.call_later(self.policy.heartbeat * RESEND_HEARTBEATS, self._resend)

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()

    def ready(self) -> bool:
        """Whether jobs' persistentdw can be checked now: listed once, or waited long enough
        (the API may be down: nnf-sos checks at Proposal then)."""
        return self._listed or self._grace_over

    def _grace_ended(self) -> None:
        if not self.ready() and not self._stopped:
            self._grace_over = True
            log.warning(
                "persistent storage instances not listed after %.0fs: persistentdw is checked"
                " by nnf-sos at Proposal until they are",
                LIST_GRACE,
            )
            self._became_ready()

    def when_ready(self, then: Callable[[], None]) -> None:
        """Run ``then`` (on the loop) once ready(): at the first list, or when its grace ends."""
        if self.ready():
            self.loop.call_soon(then)
        else:
            self._waiting.append(then)

    def _became_ready(self) -> None:
        waiting, self._waiting = self._waiting, []
        for then in waiting:
            self.loop.call_soon(then)

    def refusal(self, directives: Sequence[str], userid: int) -> tuple[str, str] | None:
        """The persistentdw (and why) the job may not use, from what the watch saw; None
        before the first list (nnf-sos checks it at Proposal then)."""
        if not self._listed:
            return None
        rows = {row.name: row for row in persistent_rows(self._objects.values())}
        return directives_refusal(directives, rows, userid)

    def _event(self, kind: str, obj: dict) -> None:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str):
            return
        if kind == DELETED:
            self._objects.pop(name, None)
        else:
            self._objects[name] = slim(obj)
        self._schedule()

    def _on_listed(self) -> None:
        first = not self.ready()
        self._listed = True
        self._schedule()
        if first:
            self._became_ready()  # jobs waiting for the list are decided again

    def _resend(self) -> None:
        if self._stopped:
            return
        self._last = None
        self._schedule()
        self.loop.call_later(self.policy.heartbeat * RESEND_HEARTBEATS, self._resend)

    def _schedule(self) -> None:
        if self._listed and not self._queued and not self._stopped:
            self._queued = True
            self.loop.call_soon(self._push)

    def _push(self) -> None:
        self._queued = False
        snapshot = pushed_snapshot(persistent_rows(self._objects.values()))
        if snapshot == self._last or self._stopped:
            return
        self._last = snapshot

        def answered(_response: Any, error: RpcError | None) -> None:
            if error is None:
                self.sent += 1
            else:
                self._last = None  # sent again on the next change or resend
                log.warning(
                    "telling the dws jobtap plugin of %d persistent storage instance(s)"
                    " failed: %s; persistentdw is checked at Proposal until it succeeds",
                    len(snapshot["storage"]),
                    error,
                )

        self.jm.persistent(snapshot, answered)


__all__ = ["PersistentPush"]
