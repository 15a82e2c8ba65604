# SPDX-License-Identifier: LGPL-3.0-only
"""Prometheus metrics of the service, served on ``[dws] metrics-address`` (off by default).

Counters are fed as things happen (requests from the Kubernetes client's worker threads;
transitions and failures from the service's in-memory ``Metrics`` lists, read on the loop);
gauges are set from the service's state by :meth:`PromMetrics.refresh`, which runs on the
loop thread every upkeep tick, so the HTTP thread that answers a scrape never reads the
service's dicts.  Each service has its own registry: two in one process do not mix.

The metrics, all named ``flux_dws_*``, are listed in the admin guide ("Metrics").
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.exposition import start_wsgi_server

log = logging.getLogger("flux-dws")

#: Reaction time buckets, seconds: from a quick API server (ms) to a wedged loop (a minute).
REACTION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0)
PHASES = ("depend", "sched", "prolog", "run", "epilog")


class PromMetrics:
    """The service's Prometheus registry and its metrics (see the admin guide)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.up_since = Gauge(
            "flux_dws_start_time_seconds", "When this service started (epoch)", registry=r
        )
        self.active = Gauge(
            "flux_dws_active",
            "1 if this service is the instance's active one, 0 while it is a standby",
            registry=r,
        )
        self.jobs = Gauge("flux_dws_jobs", "#DW jobs held, by phase", ["phase"], registry=r)
        self.workflows = Gauge(
            "flux_dws_workflows",
            "Workflows of this instance, by status.state",
            ["state"],
            registry=r,
        )
        self.past_deadline = Gauge(
            "flux_dws_jobs_past_deadline",
            "Jobs whose workflow is past the deadline of the state it was asked for",
            ["state"],
            registry=r,
        )
        self.transitions = PromCounter(
            "flux_dws_transitions",
            "Workflow desiredState changes sent, by the state asked for",
            ["state"],
            registry=r,
        )
        self.reaction = Histogram(
            "flux_dws_reaction_seconds",
            "From the observation that allowed a transition to its patch being sent",
            buckets=REACTION_BUCKETS,
            registry=r,
        )
        self.action_failures = PromCounter(
            "flux_dws_action_failures",
            "Actions that failed and will be retried, by action",
            ["action"],
            registry=r,
        )
        self.requests = PromCounter(
            "flux_dws_kube_requests",
            'Kubernetes request attempts by verb and HTTP status ("none": no answer)',
            ["verb", "code"],
            registry=r,
        )
        self.retries = PromCounter(
            "flux_dws_kube_retries",
            "Kubernetes request attempts that were retries",
            ["verb"],
            registry=r,
        )
        self.watch_restarts = PromCounter(
            "flux_dws_watch_restarts",
            "Workflow watch requests opened after the first one",
            registry=r,
        )
        self.watch_relists = PromCounter(
            "flux_dws_watch_relists",
            "Full lists of the workflows (start-up, and after each 410 Gone)",
            registry=r,
        )
        self.api_reachable = Gauge(
            "flux_dws_api_reachable", "1 if the Kubernetes API server answers, else 0", registry=r
        )
        self.api_down_since = Gauge(
            "flux_dws_api_unreachable_since_seconds",
            "When the API server stopped answering (epoch; 0 while it answers)",
            registry=r,
        )
        self.heartbeat_age = Gauge(
            "flux_dws_plugin_heartbeat_age_seconds",
            "Seconds since the dws jobtap plugin last answered a heartbeat",
            registry=r,
        )
        self.capacity_missing = Gauge(
            "flux_dws_rabbit_capacity_missing_bytes",
            "Bytes a rabbit has less free than its Servers explain, beyond [dws] capacity-drift",
            ["rabbit"],
            registry=r,
        )
        self.queue = Gauge(
            "flux_dws_queue_depth",
            "Work waiting: kube (calls for a worker thread), inbox (watch events for the "
            "loop), proposal (jobs waiting for a Proposal slot)",
            ["queue"],
            registry=r,
        )
        self.reconcile = Gauge(
            "flux_dws_last_reconcile_seconds",
            "Loop time of the last pass that decided for every job (start-up, snapshots)",
            registry=r,
        )
        self.up_since.set(time.time())
        self._reactions_seen = 0
        self._failures_seen: Counter[str] = Counter()
        self._watch_seen: dict[int, int] = {}
        self._server: Any = None
        self.address: tuple[str, int] | None = None

    # ---- fed from the Kubernetes client's threads (RequestObserver's second half)

    def request(self, verb: str, code: int | None, attempt: int) -> None:
        self.requests.labels(verb, "none" if code is None else str(code)).inc()
        if attempt > 1:
            self.retries.labels(verb).inc()

    # ---- refreshed on the loop thread

    def refresh(self, snap: Snapshot) -> None:
        """Set every gauge, and count what the in-memory lists gained since the last call."""
        self.active.set(1 if snap.active else 0)
        for phase in PHASES:
            self.jobs.labels(phase).set(snap.phases.get(phase, 0))
        for state, count in snap.states.items():
            self.workflows.labels(state).set(count)
        for state in set(self._known(self.workflows)) - set(snap.states):
            self.workflows.labels(state).set(0)
        for state in set(self._known(self.past_deadline)) | set(snap.overdue):
            self.past_deadline.labels(state).set(snap.overdue.get(state, 0))
        for state, seconds in snap.reactions[self._reactions_seen :]:
            self.transitions.labels(getattr(state, "value", str(state))).inc()
            self.reaction.observe(seconds)
        self._reactions_seen = len(snap.reactions)
        for action, count in snap.failures.items():
            gained = count - self._failures_seen[action]
            if gained > 0:
                self.action_failures.labels(action).inc(gained)
            self._failures_seen[action] = count
        for counter, seen in ((self.watch_restarts, snap.watch_restarts),
                              (self.watch_relists, snap.watch_relists)):  # fmt: skip
            gained = seen - self._watch_seen.get(id(counter), 0)
            if gained > 0:
                counter.inc(gained)
            self._watch_seen[id(counter)] = seen
        self.api_reachable.set(0 if snap.api_down_since else 1)
        self.api_down_since.set(snap.api_down_since or 0)
        self.heartbeat_age.set(snap.heartbeat_age if math.isfinite(snap.heartbeat_age) else -1)
        for rabbit in set(self._known(self.capacity_missing)) | set(snap.missing):
            self.capacity_missing.labels(rabbit).set(snap.missing.get(rabbit, 0))
        for name, depth in snap.queues.items():
            self.queue.labels(name).set(depth)
        self.reconcile.set(snap.reconcile)

    @staticmethod
    def _known(gauge: Gauge) -> Iterable[str]:
        return [labels[0] for labels in gauge._metrics]  # noqa: SLF001 (no public listing)

    # ---- the endpoint

    def forget_reactions(self, dropped: int) -> None:
        """The service dropped the oldest ``dropped`` reactions (all counted already)."""
        self._reactions_seen = max(0, self._reactions_seen - dropped)

    def serve(self, address: tuple[str, int], quiet: bool = False) -> bool:
        """Serve /metrics on ``address`` (port 0: any free port); False if it cannot bind."""
        host, port = address
        try:
            self._server, _thread = start_wsgi_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            if quiet:
                return False
            log.warning(
                "metrics: cannot listen on %s:%d (%s); serving no metrics for now",
                _shown(host),
                port,
                exc.strerror or exc,
            )
            return False
        self.address = (host, self._server.server_port)
        log.info(
            "metrics: Prometheus endpoint on http://%s:%d/metrics", _shown(host), self.address[1]
        )
        return True

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@dataclass
class Snapshot:
    """What :meth:`PromMetrics.refresh` needs, read from the service on its loop."""

    active: bool
    phases: Mapping[str, int]
    states: Mapping[str, int]
    overdue: Mapping[str, int]
    reactions: Sequence[tuple[Any, float]]  # the service's list itself: only new ones are read
    failures: Mapping[str, int]
    watch_restarts: int
    watch_relists: int
    api_down_since: float | None
    heartbeat_age: float
    queues: Mapping[str, int]
    reconcile: float
    missing: Mapping[str, int] = field(default_factory=dict)  # rabbit -> bytes (drift)


def _shown(host: str) -> str:
    """A host as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host
