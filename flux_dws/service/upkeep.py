# SPDX-License-Identifier: LGPL-3.0-only
"""The service's housekeeping tick: watchdog pings, API health, metrics, STATUS lines.

One timer on the service's loop, every second (faster when the watchdog asks for it).  The
watchdog ping is sent from here and nowhere else, so it stops exactly when the loop stops
turning; Kubernetes calls run on worker threads and never delay it.  Each tick also:

- judges API health from every request attempt (flux_dws.service.apihealth) and hands changes to the
  service, which logs and alarms (``[dws] api-alarm``);
- probes the API server (GET /version, no retries) when no request started for a while, so
  a server that hangs while the service is idle is noticed too;
- refreshes the Prometheus gauges (flux_dws.service.metrics), when the endpoint is on;
- tells systemd READY=1 after the first reconcile, and a STATUS= line when it changes.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

from flux_dws.base.loop import Loop
from flux_dws.core.policy import Policy
from flux_dws.core.status import job_summary
from flux_dws.k8s import KubeClient, KubeWorker
from flux_dws.service.apihealth import ApiHealth
from flux_dws.service.jobs import Metrics, Tracked
from flux_dws.service.metrics import PromMetrics, Snapshot
from flux_dws.service.notify import Notifier
from flux_dws.service.presence import Presence

log = logging.getLogger("flux-dws")

TICK = 1.0  # seconds between ticks, unless the watchdog wants pings more often
REACTIONS_KEPT = 100_000  # in-memory reaction times (jobs.Metrics) kept for benchmarks
BIND_RETRY_TICKS = 30  # a metrics address in use (by the active service) is tried again


class RequestHub:
    """The KubeClient's observer: each attempt feeds API health and the request metrics."""

    def __init__(self, health: ApiHealth, metrics: PromMetrics | None) -> None:
        self.health, self.metrics = health, metrics

    def attempt_started(self, verb: str, resource: str) -> Any:
        return self.health.begin(f"{verb} {resource}")

    def attempt_ended(self, token: Any, verb: str, code: int | None, attempt: int) -> None:
        self.health.end(token, code is not None, f"{verb}: no HTTP answer")
        if self.metrics is not None:
            self.metrics.request(verb, code, attempt)


class Watched(Protocol):
    """What upkeep reads of the service, and nothing more."""

    jobs: Mapping[int, Tracked]
    metrics: Metrics
    reconciled_at: float | None
    last_reconcile: float

    def inbox_depth(self) -> int: ...

    def watch_counts(self) -> tuple[int, int]: ...

    def proposals_waiting(self) -> int: ...

    def capacity_missing(self) -> Mapping[str, int]:
        """Rabbit -> bytes it misses beyond [dws] capacity-drift (the health monitor's)."""
        ...


class Upkeep:
    """The tick; see the module docstring.  Start and stop it on the loop's thread."""

    def __init__(
        self,
        *,
        policy: Policy,
        loop: Loop,
        kube: KubeClient,
        worker: KubeWorker,
        presence: Presence,
        watched: Watched,
        notifier: Notifier | None = None,
    ) -> None:
        self.policy = policy
        self.loop = loop
        self.kube = kube
        self.worker = worker
        self.presence = presence
        self.watched = watched
        self.notifier = notifier or Notifier()
        self.metrics = PromMetrics() if policy.metrics_address else None
        wd = self.notifier.watchdog
        self.period = min(TICK, wd / 3) if wd else TICK
        self.health = ApiHealth(overdue=min(kube.timeout, policy.api_alarm / 2), tick=self.period)
        kube.observer = RequestHub(self.health, self.metrics)
        self.probe_after = min(policy.heartbeat, policy.api_alarm / 2)
        self._probing = False
        self._reachable = True
        self._ready_sent = False
        self._status = ""
        self._stopped = False
        self.ticks = 0

    def start(self) -> None:
        self._serve_metrics()
        self.loop.call_soon(self._tick)

    def _serve_metrics(self, quiet: bool = False) -> None:
        address = self.policy.metrics_address
        if self.metrics is not None and address and self.metrics.address is None:
            self.metrics.serve(address, quiet=quiet)

    def stop(self, why: str) -> None:
        self._stopped = True
        self.notifier.stopping(why)
        if self.metrics is not None:
            self.metrics.close()

    def _tick(self) -> None:
        if self._stopped:
            return
        self.ticks += 1
        self.notifier.ping()
        self._judge_health()
        self._probe()
        self._tell_systemd()
        if self.metrics is not None:
            if self.metrics.address is None and self.ticks % BIND_RETRY_TICKS == 0:
                self._serve_metrics(quiet=True)  # a standby whose active one held the port
            self.metrics.refresh(self.snapshot())
        self._trim_reactions()
        self.loop.call_later(self.period, self._tick)

    def _trim_reactions(self) -> None:
        """Keep the in-memory reaction list bounded in a service that runs for months."""
        reactions = self.watched.metrics.reactions
        if len(reactions) > REACTIONS_KEPT:
            dropped = len(reactions) - REACTIONS_KEPT // 2
            del reactions[:dropped]
            if self.metrics is not None:
                self.metrics.forget_reactions(dropped)

    def _judge_health(self) -> None:
        verdict = self.health.judge()
        if verdict.reachable != self._reachable:
            self._reachable = verdict.reachable
            if not verdict.reachable:
                self.presence.note_error(f"Kubernetes API unreachable: {verdict.why}")
            self.presence.api_health(verdict.reachable, verdict.since or time.time(), verdict.why)

    def _probe(self) -> None:
        if self._probing or self.health.idle_for() < self.probe_after:
            return
        self._probing = True

        def done(_result: Any, _error: BaseException | None) -> None:
            self._probing = False  # the outcome went to self.health through the observer

        self.worker.submit(self.kube.ping, on_done=done)

    def _tell_systemd(self) -> None:
        if not self._ready_sent and (
            self.watched.reconciled_at is not None or self.presence.role == "standby"
        ):
            self._ready_sent = True
            self.notifier.ready(self.status_line())
            return
        line = self.status_line()
        if line != self._status:
            self._status = line
            self.notifier.status(line)

    def status_line(self) -> str:
        """What systemctl status shows: role, jobs, API health."""
        presence, watched = self.presence, self.watched
        if presence.role == "standby":
            return f"standby: {presence.peer or 'another service'} is active"
        if watched.reconciled_at is None:
            return "starting: waiting for the job snapshot and the workflow list"
        held = sum(1 for t in watched.jobs.values() if t.record is not None)
        api = "API reachable" if self._reachable else "API UNREACHABLE"
        return f"active: {held} #DW job(s) held; {api}"

    def snapshot(self) -> Snapshot:
        presence, watched = self.presence, self.watched
        phases: Counter[str] = Counter()
        states: Counter[str] = Counter()
        for tracked in watched.jobs.values():
            if tracked.record is not None:
                phases[str(tracked.record.get("phase"))] += 1
            if tracked.workflow is not None and tracked.workflow.state is not None:
                states[tracked.workflow.state.value] += 1
        records = [t.record for t in watched.jobs.values() if t.record is not None]
        summary = job_summary(records, time.time())
        restarts, relists = watched.watch_counts()
        heartbeat = presence.heartbeat_ok
        return Snapshot(
            active=presence.role == "active",
            phases=phases,
            states=states,
            overdue={row.state: row.overdue for row in summary if row.overdue},
            reactions=watched.metrics.reactions,
            failures=watched.metrics.failures,
            watch_restarts=restarts,
            watch_relists=relists,
            api_down_since=presence.api_down_since,
            heartbeat_age=time.time() - heartbeat if heartbeat else -1.0,
            queues={
                "kube": self.worker.queued(),
                "inbox": watched.inbox_depth(),
                "proposal": watched.proposals_waiting(),
            },
            reconcile=watched.last_reconcile,
            missing=dict(watched.capacity_missing()),
        )
