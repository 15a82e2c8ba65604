# SPDX-License-Identifier: LGPL-3.0-only
"""The health monitor: compare rabbits with Flux and act, on every Storage change and every
``[dws] health-interval``.

Storage and Servers are watched (flux_dws.k8s.watch.StorageWatch and ServersWatch: one list
each, then a watch, as for the workflows), so a rabbit that goes down starts a pass at once and
neither is listed in steady state.  One pass reads Flux's drain state (resource.status), then on
a worker thread the SystemConfiguration and the SystemStatus; flux_dws.core.health decides
from the watched Storages; this module drains and undrains through flux_dws.flux.resource, marks
down rabbits' ssd pools in Fluxion, and writes only the SystemStatus entries that changed.  Each
pass also compares each rabbit's free space (from the watched Storage) with what the watched
Servers explain (flux_dws.core.health.capacity_drifts): a rabbit missing more than ``[dws]
capacity-drift`` is logged, counted in ``report()`` (shown by `flux dws status`) and has that
much of its pool kept down in Fluxion until it is explained.  With ``[dws] soft-drain`` the
nodes a rabbit drain would take (its rabbit, or their link to it, down) get Fluxion's
``badrabbit`` property instead, and lose it when their rabbit is Ready
(flux_dws.core.softdrain).  Each pass is a full comparison
(level-triggered), and one runs every ``health-interval`` even when nothing was seen to change,
so a restarted service (or a missed change) converges on the next pass, and a pass that fails
is simply repeated on the next one.  Passes never overlap.

No pass runs before the service has read every workflow (``hold_first``): a pass marks
rabbits' pools up, and the ssd parts that released jobs hold until their Teardown is done
(flux_dws.core.release) are known only from the workflows' marks.  They are held down first,
so no pass ever marks one up, even for an instant (Fluxion would give it to a queued job).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable

from flux_dws.base.hostlist import encode_idset
from flux_dws.base.loop import Loop, Timer
from flux_dws.base.untrusted import readable
from flux_dws.core import health, softdrain
from flux_dws.core.policy import Policy
from flux_dws.core.storage import rabbit_map
from flux_dws.flux.resource import NodeControl, NodeStatus
from flux_dws.k8s import KubeClient, KubeWorker
from flux_dws.k8s.watch import DELETED, ServersWatch, StorageWatch, qualified_name
from flux_dws.service.placements import Placements

log = logging.getLogger("flux-dws")


def _nodes(status: NodeStatus, ranks: Sequence[int]) -> str:
    """Ranks as an admin reads them: their hosts, and the ranks themselves."""
    return f"{readable(health.hostlist(status.hosts_of(ranks)))} (rank {encode_idset(ranks)})"


@dataclass(frozen=True)
class Observed:
    """What one pass read from Kubernetes."""

    rabbits: tuple[health.RabbitHealth, ...]
    served: Mapping[str, str]
    system_status: Any
    drifts: Mapping[str, health.Drift]


class HealthMonitor:
    """See the module docstring; call every method on the loop's thread."""

    def __init__(
        self,
        *,
        policy: Policy,
        loop: Loop,
        worker: KubeWorker,
        kube: KubeClient,
        nodes: NodeControl,
        placements: Placements | None = None,
    ) -> None:
        self.policy = policy
        self.placements = placements  # told of every Servers too (service.placements)
        self.loop = loop
        self.worker = worker
        self.kube = kube
        self.nodes = nodes
        self.passes = 0  # completed passes (in report(): `flux dws status --json`, tests)
        self.last_plan: health.DrainPlan | None = None
        self.last_error: str | None = None
        self._down: dict[str, str] = {}  # rabbit -> why, as last logged / marked in Fluxion
        self.drained: dict[str, str] = {}  # Flux's drained hosts -> reason, last pass
        self._marked: set[str] = set()  # rabbits whose pool state Fluxion holds as we want
        self.badrabbit: set[str] | None = None  # hosts marked badrabbit; None: not known
        self.drifts: dict[str, health.Drift] = {}  # rabbit -> its capacity drift, last pass
        self._running = False
        self._again = False
        self._timer: Timer | None = None
        self._stopped = False
        self._rabbits: dict[str, health.RabbitHealth] = {}  # Storage name -> as last seen
        self._storages: dict[str, dict] = {}  # Storage name -> the object (capacity drift)
        self._servers: dict[str, dict] = {}  # namespace/name -> every Servers (capacity drift)
        self._listed: set[str] = set()  # watches that listed once; passes run after both
        self._holds_known = False  # released jobs' parts are held (hold_first): passes may run
        self._watches = (
            StorageWatch(
                kube,
                lambda kind, obj: loop.call_soon(self._storage_event, kind, obj),
                on_listed=lambda: loop.call_soon(self._watch_listed, "storage"),
            ),
            ServersWatch(
                kube,
                lambda kind, obj: loop.call_soon(self._servers_event, kind, obj),
                on_listed=lambda: loop.call_soon(self._watch_listed, "servers"),
            ),
        )

    @property
    def _ready(self) -> bool:
        return len(self._listed) == len(self._watches)

    def start(self) -> None:
        for watch in self._watches:  # the first pass runs once both have listed
            watch.start()

    def stop(self) -> None:
        self._stopped = True
        if self._timer:
            self._timer.cancel()
        for watch in self._watches:
            watch.stop()

    def _storage_event(self, kind: str, obj: dict) -> None:
        """A Storage changed: a pass at once if what health reads of it changed."""
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        before = self._storages.get(name) if isinstance(name, str) else None
        if kind != DELETED and before is not None and reads_same(before, obj):
            self._storages[name] = obj  # its free space: read by the next pass
            return
        rabbit = health.rabbit_health(obj)
        if rabbit is None:
            return
        if kind == DELETED:
            changed = self._rabbits.pop(rabbit.name, None) is not None
            self._storages.pop(rabbit.name, None)
        else:
            changed = self._rabbits.get(rabbit.name) != rabbit
            self._rabbits[rabbit.name] = rabbit
            self._storages[rabbit.name] = obj  # free space changes start no pass of their own
        if changed and self._ready:
            self.poke()

    def _servers_event(self, kind: str, obj: dict) -> None:
        """A Servers changed: kept for the next pass's drift comparison (starts no pass, as
        free space changes start none)."""
        key = qualified_name(obj)
        if kind == DELETED:
            self._servers.pop(key, None)
        elif key:
            self._servers[key] = obj
        if self.placements is not None:
            self.placements.seen(kind, obj)

    def _watch_listed(self, which: str) -> None:
        was = self._ready
        self._listed.add(which)
        if which == "servers" and self.placements is not None:
            self.placements.listed()
        if self._ready and not was:
            self.poke()

    def hold_first(self, paths: Sequence[str], done: Callable[[str | None], None]) -> None:
        """The service has read every workflow's release mark: hold ``paths`` (every ssd part
        a released job holds, core.release.held_parts) down, and only then let passes run.
        ``done`` gets the marking's error, or None; passes run either way (a part that could
        not be marked is still never marked up by a pass, and its job's decisions retry)."""

        def held(error: str | None) -> None:
            if error is not None:
                log.warning("holding released jobs' ssd parts: %s", readable(error))
            first = not self._holds_known
            self._holds_known = True
            if first:
                self.poke()
            done(error)

        self.nodes.hold_parts(paths, True, held)

    def poke(self) -> None:
        """Run a pass now (or right after the one in flight)."""
        if self._stopped or not self._ready or not self._holds_known:
            return  # before the first lists and holds: the first pass follows them
        if self._running:
            self._again = True
            return
        if self._timer:
            self._timer.cancel()
            self._timer = None
        self._running = True
        self.nodes.status(self._got_flux)

    def drain_for_job(
        self, hosts: Sequence[str], reason: str, done: Callable[[str | None], None]
    ) -> None:
        """Drain a job's failed nodes (never undone by a pass: see flux_dws.core.health).

        By hostname: every rank of a failed node, as ``flux resource drain HOST`` does."""
        reason = readable(reason, health.MAX_REASON)
        log.warning("draining %s: %s", readable(health.hostlist(hosts)), reason)

        def drained(error: str | None) -> None:
            if error is None:
                self.poke()  # SystemStatus follows
            done(error)

        self.nodes.drain(health.hostlist(hosts), reason, drained, replace=False)

    # ------------------------------------------------------------------ one pass

    def _got_flux(self, status: NodeStatus | None, error: str | None) -> None:
        if status is None:
            self._finish(f"cannot read Flux's drain state: {error}")
            return

        rabbits = tuple(self._rabbits.values())  # as watched, taken on the loop's thread
        drifts = health.capacity_drifts(
            self._storages.values(), self._servers.values(), self.policy.capacity_drift
        )

        def read() -> Observed:
            served = rabbit_map(self.kube.read_system_configuration())
            return Observed(rabbits, served, self.kube.read_system_status(), drifts)

        def finished(result: Observed | None, exc: BaseException | None) -> None:
            self._decide(status, result, exc)  # delivered on the loop by the worker

        try:
            self.worker.submit(read, on_done=finished)
        except RuntimeError:  # the worker stopped: the service is stopping
            self._running = False

    def _decide(self, status: NodeStatus, seen: Observed | None, exc: BaseException | None) -> None:
        if seen is None:
            self._finish(f"cannot read the SystemConfiguration or SystemStatus: {exc}")
            return
        plan = health.plan_drains(
            seen.rabbits,
            seen.served,
            status.ranks,
            status.drained,
            drain_nodes=self.policy.drain_compute_nodes,
        )
        self.last_plan = plan
        self._report_rabbits(plan.down_rabbits, {r.name for r in seen.rabbits})
        self._report_drifts(seen.drifts)
        self.drained = status.drained_hosts()
        drained = dict(status.drained)
        steps: list[Callable[[Callable[[str | None], None]], None]] = []
        by_reason: dict[str, list[int]] = {}
        for rank, reason in plan.drain.items():
            reason = readable(reason, health.MAX_REASON)
            by_reason.setdefault(reason, []).append(rank)
            drained[rank] = reason
        for reason, ranks in sorted(by_reason.items()):
            replace = any(r in status.drained for r in ranks)
            targets = encode_idset(ranks)
            log.warning("draining %s: %s", _nodes(status, ranks), reason)
            steps.append(
                lambda done, t=targets, r=reason, x=replace: self.nodes.drain(t, r, done, replace=x)
            )
        if plan.undrain:
            log.info("undraining %s: their rabbits are Ready again", _nodes(status, plan.undrain))
            targets = encode_idset(plan.undrain)
            steps.append(lambda done: self.nodes.undrain(targets, done))
            for rank in plan.undrain:
                drained.pop(rank, None)
        for rabbit in sorted({r.name for r in seen.rabbits} - self._marked):
            up = rabbit not in plan.down_rabbits
            drift = self.drifts.get(rabbit)
            hold = drift.missing if drift else 0
            steps.append(lambda done, r=rabbit, u=up, h=hold: self._mark(r, u, h, done))
        if self.policy.soft_drain:
            steps.extend(self._soft_drain_steps(seen, status))
        by_host: dict[str, str] = {}  # host -> reason of its lowest drained rank
        for rank, reason in sorted(drained.items(), reverse=True):
            if rank in status.ranks:
                by_host[status.ranks[rank]] = reason
        wanted = health.node_states(status.hosts, by_host, status.offline_hosts())
        patch = health.system_status_patch(seen.system_status, wanted)
        if patch is not None:
            exists = seen.system_status is not None
            steps.append(lambda done: self._write_status(patch, exists, done))
        self._run(steps, [])

    def _soft_drain_steps(self, seen: Observed, status: NodeStatus) -> list[Any]:
        """Mark the nodes a rabbit drain would take with ``badrabbit``; clear the others."""
        wanted = health.wanted_drains(seen.rabbits, seen.served, status.hosts)
        mark, clear = softdrain.changes(wanted, self.badrabbit, status.hosts)
        steps = []
        if mark:
            reasons = sorted({wanted[h] for h in mark})
            log.warning(
                "marking %s %s in Fluxion (soft drain: not drained, no new #DW job): %s",
                readable(health.hostlist(mark)),
                softdrain.BADRABBIT,
                readable("; ".join(reasons), health.MAX_REASON),
            )
            steps.append(lambda done: self._mark_nodes(mark, True, done))
        if clear:
            if self.badrabbit is not None:
                log.info(
                    "clearing %s from %s: their rabbits are Ready again",
                    softdrain.BADRABBIT,
                    readable(health.hostlist(clear)),
                )
            steps.append(lambda done: self._mark_nodes(clear, False, done))
        return steps

    def _mark_nodes(
        self, hosts: Sequence[str], bad: bool, done: Callable[[str | None], None]
    ) -> None:
        def marked(error: str | None) -> None:
            if error is not None:
                self.badrabbit = None  # not known: the next pass sets and clears every node
            else:
                known = set(self.badrabbit or ())
                self.badrabbit = known | set(hosts) if bad else known - set(hosts)
            done(error)

        self.nodes.mark_nodes(hosts, bad, marked)

    def _mark(self, rabbit: str, up: bool, hold: int, done: Callable[[str | None], None]) -> None:
        """Tell Fluxion once per change; a refusal (e.g. no such vertex in its graph) is
        logged once and not retried until the rabbit changes again."""

        def marked(error: str | None) -> None:
            self._marked.add(rabbit)
            if error is not None:
                log.warning(
                    "could not mark rabbit %s %s in Fluxion: %s",
                    readable(rabbit),
                    "up" if up else "down",
                    readable(error),
                )
            done(None)

        self.nodes.mark_rabbit(rabbit, up, marked, hold=hold)

    def _report_drifts(self, drifts: Mapping[str, health.Drift]) -> None:
        """Log each rabbit whose drift appears, changes or goes; its pool is marked again."""
        gib = 2**30
        for rabbit, drift in sorted(drifts.items()):
            if self.drifts.get(rabbit) != drift:
                log.warning(
                    "rabbit %s: %.1f GiB less free than its Servers explain (free %.1f GiB, "
                    "expected %.1f GiB): leaked or outside allocation? that much of its pool "
                    "is kept from new jobs until it is explained",
                    rabbit,
                    drift.missing / gib,
                    drift.free / gib,
                    drift.expected / gib,
                )
                self._marked.discard(rabbit)
        for rabbit in sorted(set(self.drifts) - set(drifts)):
            log.info("rabbit %s: free capacity agrees with its Servers again", rabbit)
            self._marked.discard(rabbit)
        self.drifts = dict(drifts)

    def report(self) -> dict[str, Any]:
        """Rabbit and node health for the service's heartbeat report (`flux dws status`)."""
        return {
            "down": dict(self._down),
            "drift": {rabbit: d.to_json() for rabbit, d in sorted(self.drifts.items())},
            "drained": dict(sorted(self.drained.items())),
            "passes": self.passes,
        }

    def _report_rabbits(self, down: Mapping[str, str], known: set[str]) -> None:
        for rabbit, why in sorted(down.items()):
            if self._down.get(rabbit) != why:
                log.warning(
                    "rabbit %s is down (%s): no new job gets its storage",
                    readable(rabbit),
                    readable(why),
                )
                self._marked.discard(rabbit)
        for rabbit in sorted(set(self._down) - set(down)):
            if rabbit in known:
                log.info("rabbit %s is Ready again", readable(rabbit))
            self._marked.discard(rabbit)
        self._down = dict(down)

    def _write_status(
        self, patch: dict[str, Any], exists: bool, done: Callable[[str | None], None]
    ) -> None:
        changed = patch["data"]["nodes"]
        log.info(
            "SystemStatus: %d node(s) changed (%s)",
            len(changed),
            readable(", ".join(f"{h}={s}" for h, s in list(changed.items())[:8])),
        )

        def finished(_result: Any, exc: BaseException | None) -> None:
            done(None if exc is None else f"SystemStatus: {exc}")

        self.worker.submit(self.kube.write_system_status, patch, exists, on_done=finished)

    def _run(self, steps: list[Any], errors: list[str], first: int = 0) -> None:
        """Run ``steps[first:]`` one after another.  The next step is queued on the loop, not
        called from the last one's callback: a callback that runs at once (720 rabbits to
        mark) would otherwise nest one frame deeper per step, past Python's recursion limit."""
        if first >= len(steps):
            self._finish("; ".join(errors) or None)
            return

        def next_step(error: str | None) -> None:
            if error is not None:
                errors.append(error)
            self.loop.call_soon(self._run, steps, errors, first + 1)

        try:
            steps[first](next_step)
        except Exception as exc:  # a bug must not stop the monitor: log and go on
            log.exception("health pass step failed")
            next_step(f"{type(exc).__name__}: {exc}")

    def _finish(self, error: str | None) -> None:
        if error and error != self.last_error:
            log.warning(
                "health pass: %s; trying again in %.0fs",
                readable(error),
                self.policy.health_interval,
            )
        self.last_error = error
        self.passes += 1
        self._running = False
        if self._stopped:
            return
        if self._again:
            self._again = False
            self.loop.call_soon(self.poke)
        else:
            self._timer = self.loop.call_later(self.policy.health_interval, self.poke)


def reads_same(before: Any, after: Any) -> bool:
    """Whether health.rabbit_health reads the same of the Storage ``after`` as of
    ``before``: the same name, annotations, spec.state and status but for its capacity.  A
    Storage changes mostly in its free space, which the watch reports for every allocation;
    this tells it at C speed, without reading the rabbit again."""
    if type(before) is not dict or type(after) is not dict:
        return False
    meta_b, meta_a = before.get("metadata"), after.get("metadata")
    spec_b, spec_a = before.get("spec"), after.get("spec")
    status_b, status_a = before.get("status"), after.get("status")
    if type(meta_b) is not dict or type(meta_a) is not dict:
        return False
    if type(status_b) is not dict or type(status_a) is not dict:
        return False
    return (
        meta_b.get("name") == meta_a.get("name")
        and meta_b.get("annotations") == meta_a.get("annotations")
        and (
            spec_b == spec_a
            or (
                type(spec_b) is dict
                and type(spec_a) is dict
                and spec_b.get("state") == spec_a.get("state")
            )
        )
        and all(status_b.get(key) == status_a.get(key) for key in _RABBIT_STATUS)
    )


#: What health.rabbit_health reads of a Storage's status.
_RABBIT_STATUS = ("access", "status", "rebootRequired", "message")
