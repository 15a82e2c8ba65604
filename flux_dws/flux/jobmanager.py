# SPDX-License-Identifier: LGPL-3.0-only
"""The service's side of doc/protocol.rst: requests to the dws jobtap plugin.

Every request is built here and nowhere else, for the real Flux transport and for fakeflux
alike.  Errors that mean "already done" (a repeated release, a prolog already finished) come
back as RpcError with EINVAL; callers treat them as success.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Mapping
from typing import Any, Callable

from flux_dws.base.untrusted import RECORD_LIMIT, field, json_safe, readable
from flux_dws.flux.transport import Callback, Payload, RpcError, Transport

log = logging.getLogger("flux-dws.flux.jobmanager")

RecordsCallback = Callable[[list[dict[str, Any]], bool], None]

#: The longest exception note sent (DWS messages can be any size).
NOTE_LIMIT = 1024

#: Errors that say a request already took effect (or can no longer): not worth a retry.
SETTLED_ERRNOS = frozenset({errno.EINVAL, errno.ENOENT})


class JobManager:
    """Requests to ``job-manager.dws.*``; each callback runs on the service's loop."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.sent: dict[str, int] = {}

    def _rpc(self, method: str, payload: Payload, on_done: Callback, *, safe: bool = False) -> None:
        """Send one request; nothing jansson refuses leaves here (flux_dws.base.untrusted), so a
        NUL in a DWS message can never make the plugin refuse the request.  ``safe``: the
        payload's parts from outside went through json_safe already (and its own strings
        through field), so it is not copied again."""
        self.sent[method] = self.sent.get(method, 0) + 1
        self.transport.rpc(method, payload if safe else json_safe(payload), on_done)

    def watch(
        self,
        on_records: RecordsCallback,
        on_lost: Callable[[RpcError], None],
        *,
        who: Mapping[str, Any] | None = None,
        on_standby: Callable[[dict[str, Any]], None] | None = None,
        on_standby_waiting: Callable[[dict[str, Any]], None] | None = None,
    ) -> Callable[[], None]:
        """Stream job records: the snapshot first, then every change (see the protocol).

        ``who`` ({"pid", "host"}) describes this service to the plugin.  While another
        service is active the plugin answers ``{"standby": true, "active": {...}}`` first
        (``on_standby(active)``); the snapshot follows if this one takes over.  The active
        service hears of each standby that comes (``on_standby_waiting(standby)``).
        """

        def on_response(response: Payload | None, error: RpcError | None) -> None:
            if error is not None:
                on_lost(error)
            elif response is not None and response.get("standby") is True:
                if on_standby is not None:
                    active = response.get("active")
                    on_standby(active if isinstance(active, dict) else {})
            elif response is not None:
                waiting = response.get("standby_waiting")
                if isinstance(waiting, dict) and on_standby_waiting is not None:
                    on_standby_waiting(waiting)
                on_records(list(response.get("jobs", [])), bool(response.get("snapshot")))

        self.sent["watch"] = self.sent.get("watch", 0) + 1
        return self.transport.stream("watch", {"service": True, **(who or {})}, on_response)

    def release(self, jobid: int, update: Mapping[str, Any], on_done: Callback) -> None:
        self._rpc("release", {"id": jobid, "update": dict(update)}, on_done)

    def prolog_finish(
        self, jobid: int, success: bool, env: Mapping[str, str], on_done: Callback
    ) -> None:
        payload: Payload = {"id": jobid, "success": success}
        if success:
            payload["env"] = dict(env)
        self._rpc("prolog-finish", payload, on_done)

    def epilog_finish(self, jobid: int, on_done: Callback) -> None:
        self._rpc("epilog-finish", {"id": jobid}, on_done)

    def raise_exception(
        self, jobid: int, type_: str, severity: int, note: str, on_done: Callback
    ) -> None:
        note = readable(note, NOTE_LIMIT)
        payload = {"id": jobid, "type": type_, "severity": severity, "note": note}
        self._rpc("raise", payload, on_done)

    def heartbeat(self, on_done: Callback, report: Mapping[str, Any] | None = None) -> None:
        """Tell the plugin the service is alive (it cannot see a client disconnect); the
        plugin keeps the active service's ``report`` for `flux dws status`."""
        self._rpc("heartbeat", {"report": dict(report)} if report else {}, on_done)

    def post(self, jobid: int, name: str, context: Mapping[str, Any], on_done: Callback) -> None:
        """Post a dws-* event; its strings come from DWS, so each is readable and at most
        RECORD_LIMIT long, and a figure jansson cannot hold is posted as unknown (the event is
        not lost)."""
        context = json_safe(dict(context), one_line=True, record=True)
        payload = {"id": jobid, "name": field(name), "context": context}
        self._rpc("post", payload, on_done, safe=True)

    def memo(self, jobid: int, memo: Mapping[str, Any], on_done: Callback) -> None:
        """Set user annotations on the job (``flux jobs -o '{user.KEY}'``): as an event's
        context, each string readable, one line and at most RECORD_LIMIT long."""
        memo = json_safe(dict(memo), one_line=True, record=True)
        self._rpc("memo", {"id": jobid, "memo": memo}, on_done, safe=True)

    def storage_held(self, on_done: Callback) -> None:
        """Tell the plugin the ssd parts of jobs released early are held again in Fluxion, so
        it lets #DW jobs go on to the scheduler (doc/protocol.rst, storage-held)."""
        self._rpc("storage-held", {}, on_done)

    def persistent(self, snapshot: Mapping[str, Any], on_done: Callback) -> None:
        """Give the plugin the persistent storage it checks persistentdw against at submit
        (flux_dws.core.persistent.pushed_snapshot; it replaces the last one)."""
        self._rpc("persistent", json_safe(dict(snapshot), record=True), on_done, safe=True)

    def save(
        self,
        jobid: int,
        key: str,
        value: Mapping[str, Any],
        on_done: Callback,
        *,
        limit: int = RECORD_LIMIT,
    ) -> None:
        """Write ``value`` (JSON) at ``key`` in the job's own KVS directory (keys ``dws.*``):
        each string readable (newlines kept) and at most ``limit`` long (a saved container
        log passes the bound that keeps it whole: SavedOutput.text_limit)."""
        value = json_safe(dict(value), record=True, limit=limit)  # a bad figure: unknown
        self._rpc("save", {"id": jobid, "key": field(key), "value": value}, on_done, safe=True)
