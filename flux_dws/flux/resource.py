# SPDX-License-Identifier: LGPL-3.0-only
"""The service's hands on Flux's nodes: drain state, drain, undrain, Fluxion's rabbit pools.

flux-core's resource module answers ``resource.status`` (R, the drained ranks with their
reasons, the offline ranks) and ``resource.drain`` / ``resource.undrain`` (targets as a
hostlist or idset; ``mode`` "update" leaves a node that already has a reason alone and skips
nodes not drained on undrain).  The service runs as the instance owner, which these RPCs
require.  Fluxion, when loaded, takes ``sched-fluxion-resource.set_status`` to mark each of
a rabbit's ssd vertices up or down; their paths come from the rabbit-aware JGF in R's
``scheduling`` key (flux_dws.core.rabbits.resource_graph: ``/<cluster>/<rabbit>/ssd<N>``), which
``resource.status`` leaves out of its R, so they are asked of Fluxion itself
(``sched-fluxion-resource.find``, every vertex, as JGF) the first time they are needed.  With
``[dws] soft-drain``, ``sched-fluxion-resource.set_property`` / ``remove_property`` put and
take flux-coral2's ``badrabbit`` property on compute node vertices (flux_dws.core.softdrain),
whose paths come from the same graph.

Drains are keyed by rank (NodeStatus), and drained and undrained by rank (an RFC 22 idset as
targets), never by a hostname that several ranks may share.

``parse_resource_status`` is pure; ``FluxNodes`` is the thin adapter over a Flux handle and
fakeflux has its own (flux_dws.testing.fakeflux.nodes) with the same semantics.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from flux_dws.base import untrusted
from flux_dws.base.frozen import FrozenMap
from flux_dws.base.hostlist import expand_idset
from flux_dws.core.rabbits import node_paths, parts_to_hold, ssd_parts
from flux_dws.core.release import PoolMarks
from flux_dws.core.softdrain import BADRABBIT, BADRABBIT_VALUE

log = logging.getLogger("flux-dws")


Done = Callable[[Optional[str]], None]  # None, or a one-line error


@dataclass(frozen=True)
class NodeStatus:
    """Flux's view of its nodes, by rank: each rank's hostname (ranks may share one), the
    drained ranks with reasons, the offline ranks, and each rabbit's ssd vertex paths where R
    holds a rabbit-aware graph.

    Drains are kept by rank because flux-core keeps them so: where ranks share a hostname, a
    reason read by hostname would mix an admin's drain of one rank with ours of another."""

    ranks: Mapping[int, str] = field(default_factory=FrozenMap)  # rank -> hostname
    drained: Mapping[int, str] = field(default_factory=FrozenMap)  # rank -> reason
    offline: frozenset[int] = frozenset()
    ssd_parts: Mapping[str, tuple[tuple[str, int], ...]] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", FrozenMap(dict(sorted(self.ranks.items()))))
        object.__setattr__(self, "drained", FrozenMap(dict(sorted(self.drained.items()))))
        object.__setattr__(self, "ssd_parts", FrozenMap(dict(self.ssd_parts)))

    @classmethod
    def of_hosts(
        cls,
        hosts: Sequence[str],
        drained: Mapping[str, str] | None = None,
        offline: Iterable[str] = (),
    ) -> NodeStatus:
        """One rank per host, in order (fakeflux's nodes): drained and offline by hostname."""
        rank_of = {h: i for i, h in enumerate(hosts)}
        return cls(
            dict(enumerate(hosts)),
            {rank_of[h]: r for h, r in (drained or {}).items() if h in rank_of},
            frozenset(rank_of[h] for h in offline if h in rank_of),
        )

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every hostname once, in rank order."""
        return tuple(dict.fromkeys(self.ranks.values()))

    def hosts_of(self, ranks: Iterable[int]) -> list[str]:
        """The hostnames of ``ranks``, each once, in rank order."""
        return list(dict.fromkeys(self.ranks[r] for r in sorted(set(ranks)) if r in self.ranks))

    def drained_hosts(self) -> dict[str, str]:
        """host -> reason of its lowest drained rank (for people and for SystemStatus)."""
        shown: dict[str, str] = {}
        for rank, reason in self.drained.items():
            shown.setdefault(self.ranks.get(rank, str(rank)), reason)
        return shown

    def offline_hosts(self) -> set[str]:
        return set(self.hosts_of(self.offline))


class NodeControl(Protocol):
    """What the health monitor and the job actions need from Flux; callbacks on the loop."""

    def status(self, on_done: Callable[[NodeStatus | None, str | None], None]) -> None: ...

    def drain(self, targets: str, reason: str, on_done: Done, *, replace: bool) -> None:
        """Drain ``targets`` (an idset of ranks, or a hostlist: every rank of those hosts);
        a rank already drained keeps its reason unless ``replace``."""

    def undrain(self, targets: str, on_done: Done) -> None:
        """Undrain ``targets`` (an idset of ranks: only those)."""

    def mark_rabbit(self, rabbit: str, up: bool, on_done: Done, *, hold: int = 0) -> None:
        """Mark the rabbit's ssd pool up or down in Fluxion (ENOSYS-style error if absent);
        up but ``hold`` bytes kept down (the parts that cover them: capacity drift).  Parts
        held for a released job stay down either way."""

    def hold_parts(self, paths: Sequence[str], hold: bool, on_done: Done) -> None:
        """Mark a released job's ssd vertices down (``hold``) until its Teardown is done, or
        up again after (those its rabbit keeps down, marked down or for drift, stay down)."""

    def mark_nodes(self, hosts: Sequence[str], bad: bool, on_done: Done) -> None:
        """Set (``bad``) or remove the ``badrabbit`` property on these compute nodes in
        Fluxion (soft drain); nothing to do, and no error, without Fluxion."""


def parse_resource_status(
    response: Mapping[str, Any], expand: Callable[[Iterable[str]], list[str]]
) -> NodeStatus:
    """A ``resource.status`` response -> NodeStatus; ``expand`` turns R's nodelist (hostlist
    strings) into hostnames in rank order.  Reasons are kept as Flux holds them (an admin's
    included); they are made readable where they are shown."""
    execution = (response.get("R") or {}).get("execution") or {}
    ranks: set[int] = set()
    for entry in execution.get("R_lite") or []:
        ranks.update(expand_idset(str(entry.get("rank", ""))))
    names = expand(execution.get("nodelist") or [])
    by_rank = dict(zip(sorted(ranks), names))
    drained: dict[int, str] = {}
    for ids, info in (response.get("drain") or {}).items():
        for rank in expand_idset(str(ids)):
            if rank in by_rank:
                drained[rank] = untrusted.field(untrusted.mapping(info).get("reason"))
    offline = {r for r in expand_idset(str(response.get("offline") or "")) if r in by_rank}
    return NodeStatus(by_rank, drained, frozenset(offline), ssd_parts(response.get("R")))


def expand_nodelist(nodelist: Iterable[str]) -> list[str]:
    """R's ``nodelist`` (hostlist strings) as hostnames in rank order, by flux-core's own
    hostlist (imported here: it comes with the bindings)."""
    from flux.hostlist import Hostlist

    names: list[str] = []
    for item in nodelist:
        names.extend(Hostlist(item))
    return names


class FluxNodes:
    """NodeControl over a Flux handle (call only on the FluxLoop's thread)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._fluxion: bool | None = None  # unknown until the first set_status answers
        self._parts: Mapping[str, tuple[tuple[str, int], ...]] = {}  # rabbit -> ssd (path, GiB)
        self._asked_fluxion = False  # its graph was read once (find), whatever it held
        self._unplaced: set[str] = set()
        self._marks = PoolMarks()  # rabbits' marks and released jobs' holds (core.release)
        self._nodes: Mapping[str, str] = {}  # host -> its node vertex's path (soft drain)
        self._pathless: set[str] = set()  # hosts without a node vertex, logged once

    def _rpc(self, topic: str, payload: Mapping[str, Any], then: Callable[[Any], None]) -> None:
        self.handle.rpc(topic, dict(payload), nodeid=0).then(lambda f: then(f))

    @staticmethod
    def _error(future: Any) -> tuple[Any, str | None, int]:
        try:
            return future.get(), None, 0
        except OSError as exc:
            try:
                text = future.error_string() or exc.strerror or str(exc)
            except Exception:  # the future may be gone with the handle
                text = exc.strerror or str(exc)
            return None, text, exc.errno or 0

    def status(self, on_done: Callable[[NodeStatus | None, str | None], None]) -> None:
        def answered(future: Any) -> None:
            response, error, _ = self._error(future)
            if error is not None:
                on_done(None, f"resource.status: {error}")
                return
            try:
                status = parse_resource_status(response or {}, expand_nodelist)
            except (ValueError, TypeError, AttributeError) as exc:
                on_done(None, f"resource.status: unreadable answer: {exc}")
                return
            if status.ssd_parts:
                self._parts = status.ssd_parts
            on_done(status, None)

        self._rpc("resource.status", {}, answered)

    def drain(self, targets: str, reason: str, on_done: Done, *, replace: bool) -> None:
        payload = {"targets": targets, "reason": reason}
        payload["mode"] = "overwrite" if replace else "update"
        self._rpc("resource.drain", payload, lambda f: on_done(self._error(f)[1]))

    def undrain(self, targets: str, on_done: Done) -> None:
        payload = {"targets": targets, "mode": "update"}
        self._rpc("resource.undrain", payload, lambda f: on_done(self._error(f)[1]))

    def _read_fluxion_graph(self, then: Callable[[], None]) -> None:
        """Learn the ssd vertices' paths from Fluxion's own graph (once)."""
        self._asked_fluxion = True

        def answered(future: Any) -> None:
            response, error, errnum = self._error(future)
            if errnum == errno.ENOSYS:
                self._fluxion = False
                log.info("sched-fluxion-resource is not loaded: rabbit pools are not marked")
            elif error is not None:
                log.warning("reading Fluxion's graph for rabbit pools failed: %s", error)
            elif isinstance(response, Mapping):
                graph = {"scheduling": response.get("R")}
                self._parts = ssd_parts(graph) or self._parts
                self._nodes = node_paths(graph) or self._nodes
            then()

        payload = {"criteria": "status=up or status=down", "format": "jgf"}
        self._rpc("sched-fluxion-resource.find", payload, answered)

    def mark_rabbit(self, rabbit: str, up: bool, on_done: Done, *, hold: int = 0) -> None:
        parts = self._parts.get(rabbit, ())
        paths = [path for path, _ in parts]
        if not paths and not self._asked_fluxion and self._fluxion is not False:
            self._read_fluxion_graph(lambda: self.mark_rabbit(rabbit, up, on_done, hold=hold))
            return
        if self._fluxion is False or not paths:
            if not paths and rabbit not in self._unplaced:
                self._unplaced.add(rabbit)
                log.info("rabbit %s has no ssd vertex in R's graph: not marked in Fluxion", rabbit)
            on_done(None)
            return
        kept = paths if not up else parts_to_hold(parts, hold)
        self._set_status(self._marks.rabbit(rabbit, paths, kept), on_done)

    def hold_parts(self, paths: Sequence[str], hold: bool, on_done: Done) -> None:
        marks = self._marks.hold(paths) if hold else self._marks.give_back(paths)
        self._set_status(marks, on_done)

    def mark_nodes(self, hosts: Sequence[str], bad: bool, on_done: Done) -> None:
        if not self._nodes and not self._asked_fluxion and self._fluxion is not False:
            self._read_fluxion_graph(lambda: self.mark_nodes(hosts, bad, on_done))
            return
        paths = [self._nodes[h] for h in hosts if h in self._nodes]
        missing = sorted(set(hosts) - set(self._nodes) - self._pathless)
        if missing and self._fluxion is not False:
            self._pathless.update(missing)
            log.info("no node vertex in Fluxion's graph for %s: not marked", ",".join(missing))
        if self._fluxion is False or not paths:
            on_done(None)
            return
        if bad:
            topic = "sched-fluxion-resource.set_property"
            payload: dict[str, Any] = {
                "sp_resource_path": paths,
                "sp_keyval": f"{BADRABBIT}={BADRABBIT_VALUE}",
            }
        else:
            topic = "sched-fluxion-resource.remove_property"
            payload = {"resource_path": paths, "key": BADRABBIT}

        def answered(future: Any) -> None:
            _, error, errnum = self._error(future)
            if errnum == errno.ENOSYS:
                self._fluxion = False
                log.info("sched-fluxion-resource is not loaded: nodes are not marked %s", BADRABBIT)
                error = None
            on_done(None if error is None else f"{topic}: {error}")

        self._rpc(topic, payload, answered)

    def _set_status(self, wanted: Mapping[str, bool], on_done: Done) -> None:
        """``sched-fluxion-resource.set_status`` for each path (up if True, else down); one
        answer for all.  Without Fluxion (ENOSYS) there is nothing to mark: not an error."""
        if self._fluxion is False or not wanted:
            on_done(None)
            return
        left = {"count": len(wanted), "error": None}

        def answered(future: Any) -> None:
            _, error, errnum = self._error(future)
            if errnum == errno.ENOSYS:
                if self._fluxion is not False:
                    log.info("sched-fluxion-resource is not loaded: rabbit pools are not marked")
                self._fluxion = False
                error = None
            elif error is None:
                self._fluxion = True
            left["error"] = left["error"] or error
            left["count"] -= 1
            if left["count"] == 0:
                failed = left["error"]
                on_done(None if failed is None else f"sched-fluxion-resource.set_status: {failed}")

        for path, up in wanted.items():
            payload = {"resource_path": path, "status": "up" if up else "down"}
            self._rpc("sched-fluxion-resource.set_status", payload, answered)
