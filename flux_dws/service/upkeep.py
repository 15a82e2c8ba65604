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
from typing import TYPE_CHECKING, Any

from flux_dws.core.status import job_summary
from flux_dws.service.apihealth import ApiHealth
from flux_dws.service.metrics import PromMetrics, Snapshot
from flux_dws.service.notify import Notifier

if TYPE_CHECKING:
    from flux_dws.service.service import Service

log = logging.getLogger("flux-dws")

TICK = 1.0  # seconds between ticks, unless the watchdog wants pings more often
REACTIONS_KEPT = 100_000  # in-memory reaction times (service.Metrics) kept for benchmarks
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


class Upkeep:
    """The tick; see the module docstring.  Start and stop it on the loop's thread."""

    def __init__(self, service: Service, notifier: Notifier | None = None) -> None:
        self.service = service
        self.notifier = notifier or Notifier()
        self.metrics = PromMetrics() if service.policy.metrics_address else None
        policy = service.policy
        self.health = ApiHealth(overdue=min(service.kube.timeout, policy.api_alarm / 2))
        service.kube.observer = RequestHub(self.health, self.metrics)
        wd = self.notifier.watchdog
        self.period = min(TICK, wd / 3) if wd else TICK
        self.probe_after = min(service.policy.heartbeat, service.policy.api_alarm / 2)
        self._probing = False
        self._reachable = True
        self._ready_sent = False
        self._status = ""
        self._stopped = False
        self.ticks = 0

    def start(self) -> None:
        self._serve_metrics()
        self.service.loop.call_soon(self._tick)

    def _serve_metrics(self, quiet: bool = False) -> None:
        address = self.service.policy.metrics_address
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
        self.service.loop.call_later(self.period, self._tick)

    def _trim_reactions(self) -> None:
        """Keep the in-memory reaction list bounded in a service that runs for months."""
        reactions = self.service.metrics.reactions
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
                self.service.note_error(f"Kubernetes API unreachable: {verdict.why}")
            self.service.api_health(verdict.reachable, verdict.since or time.time(), verdict.why)

    def _probe(self) -> None:
        if self._probing or self.health.idle_for() < self.probe_after:
            return
        self._probing = True

        def done(_result: Any, _error: BaseException | None) -> None:
            self._probing = False  # the outcome went to self.health through the observer

        self.service.worker.submit(self.service.kube.ping, on_done=done)

    def _tell_systemd(self) -> None:
        service = self.service
        if not self._ready_sent and (
            service.reconciled_at is not None or service.role == "standby"
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
        service = self.service
        if service.role == "standby":
            return f"standby: {service.peer or 'another service'} is active"
        if service.reconciled_at is None:
            return "starting: waiting for the job snapshot and the workflow list"
        held = sum(1 for t in service.jobs.values() if t.record is not None)
        api = "API reachable" if self._reachable else "API UNREACHABLE"
        return f"active: {held} #DW job(s) held; {api}"

    def snapshot(self) -> Snapshot:
        service = self.service
        phases: Counter[str] = Counter()
        states: Counter[str] = Counter()
        for tracked in service.jobs.values():
            if tracked.record is not None:
                phases[str(tracked.record.get("phase"))] += 1
            if tracked.workflow is not None and tracked.workflow.state is not None:
                states[tracked.workflow.state.value] += 1
        records = [t.record for t in service.jobs.values() if t.record is not None]
        summary = job_summary(records, time.time())
        watch = service._watch  # noqa: SLF001 (the service's own part)
        worker = service.worker
        return Snapshot(
            active=service.role == "active",
            phases=phases,
            states=states,
            overdue={row.state: row.overdue for row in summary if row.overdue},
            reactions=service.metrics.reactions,
            failures=service.metrics.failures,
            watch_restarts=watch.restarts if watch else 0,
            watch_relists=watch.relists if watch else 0,
            api_down_since=service.api_down_since,
            heartbeat_age=time.time() - service.heartbeat_ok if service.heartbeat_ok else -1.0,
            queues={
                "kube": worker.queued() if hasattr(worker, "queued") else 0,
                "inbox": service.inbox_depth(),
                "proposal": len(service.window.waiting),
            },
            reconcile=service.last_reconcile,
        )
