# SPDX-License-Identifier: LGPL-3.0-only
"""The service's standing with its instance: the job stream, heartbeats, standby, API alarms.

A part of flux_dws.service.service.Service, given what it needs in its constructor.  It
keeps the service's side of the presence protocol (doc/protocol.rst): the ``watch`` stream
and its reconnections, one heartbeat every ``[dws] heartbeat`` carrying the report `flux dws
status` shows, waiting as a standby while another service is active, stopping for good when
the Flux instance is gone, and the ``[dws] api-alarm`` raised when the Kubernetes API stays
unreachable.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections import deque
from typing import Any, Callable

from flux_dws.base import untrusted
from flux_dws.base.fsd import format_fsd
from flux_dws.base.loop import Loop, Timer
from flux_dws.core.policy import Policy
from flux_dws.flux.jobmanager import JobManager
from flux_dws.flux.jobrecords import share_alike
from flux_dws.flux.transport import RpcError

log = logging.getLogger("flux-dws")

WATCH_RETRY_MAX = 30.0
#: Errors that mean the connection to the Flux instance itself is gone (not just the plugin).
INSTANCE_GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ECONNREFUSED})
ERRORS_KEPT = 10  # the last errors, for `flux dws status`
UNLOAD_QUIET = 5.0  # seconds an unloaded plugin is not yet an error (the instance may be ending)
RETRY_MIN = 0.5  # seconds before the first reconnection of the job stream


class Presence:
    """The service's job stream, heartbeats, standby role and API alarms; see the module.

    ``on_records(records, snapshot)`` gets the plugin's records; ``on_gone()`` is called once
    the Flux instance is gone (the service stops); ``held()`` lists the jobs held now,
    ``ready()`` says whether the first reconcile is done and ``status()`` is the one-line
    status, for the heartbeat's report.  Call every method on the loop's thread.
    """

    def __init__(
        self,
        *,
        policy: Policy,
        loop: Loop,
        jm: JobManager,
        on_records: Callable[[list[dict[str, Any]], bool], None],
        on_gone: Callable[[], None],
        held: Callable[[], list[int]],
        ready: Callable[[], bool],
        status: Callable[[], str],
        rabbits: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.policy = policy
        self.loop = loop
        self.jm = jm
        self._handle_records = on_records
        self._on_gone = on_gone
        self._held = held
        self._ready = ready
        self._status = status
        self._rabbits = rabbits
        self.instance_gone = False  # the Flux instance went away: this one stopped
        self.role = "starting"  # then "active", or "standby" while another service is active
        self.peer = ""  # the active service, as the plugin described it to a standby
        self.started_at = time.time()
        self.heartbeat_ok: float | None = None  # the plugin last answered a heartbeat
        self.api_down_since: float | None = None
        self.errors: deque[tuple[float, str]] = deque(maxlen=ERRORS_KEPT)
        self._unloaded_since: float | None = None  # the job stream ends with ENOSYS since
        self._records_retry = RETRY_MIN
        self._api_alarm: Timer | None = None
        self._cancel_records: Callable[[], None] | None = None
        self._stopped = False

    def start(self) -> None:
        self._watch_records()
        self._heartbeat()

    def stop(self) -> None:
        self._stopped = True
        if self._cancel_records:
            self._cancel_records()
        if self._api_alarm:
            self._api_alarm.cancel()

    def _heartbeat(self) -> None:
        if self._stopped:
            return

        def answered(_response: Any, error: RpcError | None) -> None:
            if error is None:
                self.heartbeat_ok = time.time()
            elif error.errnum in INSTANCE_GONE:
                self._instance_gone(error)
            elif error.errnum == errno.ENOSYS:  # no plugin: the job stream says so, once
                log.debug("heartbeat to the dws jobtap plugin failed: %s", error)
            elif not self._stopped:
                log.warning("heartbeat to the dws jobtap plugin failed: %s", error)

        self.jm.heartbeat(answered, self.report())
        self.loop.call_later(self.policy.heartbeat, self._heartbeat)

    def report(self) -> dict[str, Any]:
        """What `flux dws status` shows of this service (sent with each heartbeat)."""
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": self.started_at,
            "role": self.role,
            "ready": self._ready(),
            "status": self._status(),
            "api": {"reachable": self.api_down_since is None, "since": self.api_down_since},
            "errors": [[when, text] for when, text in self.errors],
            **({"rabbits": self._rabbits()} if self._rabbits else {}),
        }

    def _watch_records(self) -> None:
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        self._cancel_records = self.jm.watch(
            self._on_records,
            self._on_records_lost,
            who=me,
            on_standby=self._on_standby,
            on_standby_waiting=self._on_standby_waiting,
        )

    def _on_records(self, records: list[dict[str, Any]], snapshot: bool) -> None:
        self._records_retry = RETRY_MIN
        self._unloaded_since = None
        if snapshot and self.role != "active":
            log.info(
                "active: this service (pid %d) is the active flux-dws service for this instance%s",
                os.getpid(),
                f", taking over from {self.peer}" if self.role == "standby" else "",
            )
            self.role = "active"
        share_alike(records)  # held while the job is: one copy of each text and part alike
        self._handle_records(records, snapshot)

    def _on_standby_waiting(self, standby: dict[str, Any]) -> None:
        log.info(
            "active: this service (pid %d) stays the active flux-dws service for this "
            "instance; a standby waits: %s",
            os.getpid(),
            describe_peer({k: v for k, v in standby.items() if k != "since"}),
        )

    def _on_standby(self, active: dict[str, Any]) -> None:
        """The plugin keeps this service as a standby: another one is active."""
        self.peer = describe_peer(active)
        self.role = "standby"
        log.warning(
            "standby: the active flux-dws service for this instance is %s; this one (pid %d) "
            "waits and takes over if it stops",
            self.peer,
            os.getpid(),
        )

    def _instance_gone(self, error: RpcError) -> None:
        """The Flux instance went away (flux shutdown, broker exit): stop for good."""
        if self._stopped:
            return
        log.warning("the Flux instance is gone (%s); stopping", error.message)
        self.instance_gone = True
        self._on_gone()

    def note_error(self, message: str) -> None:
        """Keep ``message`` among the last errors `flux dws status` shows."""
        self.errors.append((time.time(), message))

    def _on_records_lost(self, error: RpcError) -> None:
        if self._stopped:
            return
        if error.errnum in INSTANCE_GONE:
            self._instance_gone(error)
            return
        delay = self._records_retry
        self._records_retry = min(delay * 2, WATCH_RETRY_MAX)
        self.role = "starting"
        self.loop.call_later(delay, self._watch_records)
        if error.errnum == errno.ENOSYS:
            # The plugin was unloaded.  At `flux shutdown` the instance follows within
            # moments: the reconnections tell which, and only one line is logged.
            now = time.monotonic()
            if self._unloaded_since is None:
                self._unloaded_since = now
            if now - self._unloaded_since < UNLOAD_QUIET:
                log.debug("job stream ended (%s); reconnecting in %.1fs", error, delay)
                return
        else:
            self._unloaded_since = None
        self.note_error(f"lost the job stream from the dws jobtap plugin: {error}")
        log.error(
            "lost the job stream from the dws jobtap plugin (%s); jobs stay held; "
            "reconnecting in %.1fs",
            error,
            delay,
        )

    def api_health(self, connected: bool, since: float, why: str = "") -> None:
        """Requests found the API reachable or not (flux_dws.service.upkeep): alarm if it
        stays down."""
        if connected:
            if self.api_down_since is not None:
                log.info("Kubernetes API reachable again; carrying on")
            self.api_down_since = None
            if self._api_alarm:
                self._api_alarm.cancel()
                self._api_alarm = None
            return
        if self.api_down_since is not None:
            return
        self.api_down_since = since
        log.warning(
            "Kubernetes API unreachable (%s); %d job(s) stay held, none is killed; "
            "alarm if still down in %s",
            why or "no answer",
            len(self._held()),
            format_fsd(self.policy.api_alarm),
        )
        self._api_alarm = self.loop.call_at(since + self.policy.api_alarm, self._raise_api_alarm)

    def _raise_api_alarm(self) -> None:
        since = self.api_down_since
        if since is None:
            return
        held = self._held()
        self.note_error(
            f"Kubernetes API unreachable for more than {format_fsd(self.policy.api_alarm)}"
        )
        log.error(
            "Kubernetes API unreachable for more than %s: %d #DW job(s) held and waiting; "
            "check the API server and the kubeconfig",
            format_fsd(self.policy.api_alarm),
            len(held),
        )
        context = {"since": since, "note": "Kubernetes API unreachable; the job waits"}
        for jobid in held:
            self.jm.post(jobid, "dws-api-unreachable", context, lambda _r, _e: None)


def describe_peer(info: Any) -> str:
    """'pid 123 on host1 (active since 12:00:01)' from the plugin's description, whatever it is."""
    if not isinstance(info, dict):
        return "another flux-dws service"
    pid = untrusted.integer(info.get("pid"))
    host, since = info.get("host"), info.get("since")
    text = f"pid {pid}" if pid is not None else "a service"
    if isinstance(host, str) and host:
        text += f" on {untrusted.text(host, 64)}"
    if isinstance(since, (int, float)) and not isinstance(since, bool) and since > 0:
        text += f" (active since {time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(since))})"
    return text
