# SPDX-License-Identifier: LGPL-3.0-only
"""fakeflux's resource module: drained nodes with reasons, as flux-core's resource module keeps
them (src/modules/resource/drain.c), and a NodeControl client for the service.

Semantics mirrored from flux-core:
- drain without a mode fails with EEXIST ("rank(s) ... already drained") if any target is
  already drained with a reason; mode "update" only sets a reason where none is set; mode
  "overwrite" replaces the reason (the timestamp of an already drained node is kept).
- undrain without a mode fails with EINVAL if any target is not drained; mode "update" skips
  targets that are not drained.
- drains are kept by rank; targets are an RFC 22 idset of ranks, or hostnames (a
  comma-separated list: every rank of each host); unknown hosts or ranks are EINVAL.
- drained nodes are not given to new jobs (the scheduler skips them).
- stricter than flux-core, on purpose: a reason the service sends must be one readable line
  of at most MAX_REASON characters (what the resource module keeps is printed raw by `flux
  resource drain`), so FakeNodes and serve_resource refuse (EPROTO) one with a control
  character or a longer one, and a test catches a sink that skipped
  flux_dws.base.untrusted.readable or its bound.  An admin's drain (FakeFlux.drain) may say
  anything.
"""

from __future__ import annotations

import errno
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flux_dws.base.hostlist import HostlistError, encode_idset, expand_idset
from flux_dws.base.loop import Loop
from flux_dws.base.untrusted import echo, readable
from flux_dws.core.health import MAX_REASON
from flux_dws.core.rabbits import parts_to_hold
from flux_dws.core.release import PoolMarks
from flux_dws.flux.resource import Done, NodeStatus

MODES = (None, "update", "overwrite", "force-overwrite")


@dataclass
class Drain:
    timestamp: float
    reason: str


class DrainError(OSError):
    """A refused drain/undrain: errno and flux-core's message."""


def _service_reason(reason: str) -> str:
    """A reason from the service: refused unless it is one readable line of at most
    MAX_REASON characters (see above)."""
    if reason != readable(reason, MAX_REASON):
        raise DrainError(
            errno.EPROTO,
            f"drain reason {echo(reason)} is not one readable line of at most {MAX_REASON}"
            " characters",
        )
    return reason


class DrainSet:
    """Drained ranks (rank i is ``hosts[i]``; hosts may repeat), as flux-core keeps them (call
    on fakeflux's loop thread)."""

    def __init__(self, hosts: Sequence[str], clock: Callable[[], float] = time.time) -> None:
        self.hosts = tuple(hosts)
        self.info: dict[int, Drain] = {}  # rank -> drain
        self.offline: set[int] = set()
        self._clock = clock

    def _targets(self, targets: str) -> list[int]:
        if re.fullmatch(r"[0-9,\-]+", targets or ""):
            try:
                ranks = expand_idset(targets)
            except HostlistError as exc:
                raise DrainError(errno.EINVAL, str(exc)) from None
            unknown = [r for r in ranks if r >= len(self.hosts)]
            if unknown:
                raise DrainError(errno.EINVAL, f"rank {unknown[0]} is not in the instance")
        else:
            names = [t for t in targets.split(",") if t]
            unknown_hosts = [n for n in names if n not in self.hosts]
            if unknown_hosts:
                raise DrainError(errno.EINVAL, f"unknown host {unknown_hosts[0]}")
            ranks = [r for r, h in enumerate(self.hosts) if h in names]
        if not ranks:
            raise DrainError(errno.EINVAL, "idset is empty")
        return ranks

    def drain(self, targets: str, reason: str = "", mode: str | None = None) -> None:
        if mode not in MODES:
            raise DrainError(errno.EINVAL, "Invalid mode specified")
        ranks = self._targets(targets)
        if mode is None:
            already = [r for r in ranks if r in self.info and self.info[r].reason]
            if already:
                plural = "s" if len(already) > 1 else ""
                raise DrainError(
                    errno.EEXIST, f"rank{plural} {encode_idset(already)} already drained"
                )
        now = self._clock()
        for rank in ranks:
            current = self.info.get(rank)
            if current is None:
                self.info[rank] = Drain(now, reason)
            elif mode in ("overwrite", "force-overwrite") or not current.reason:
                current.reason = reason
                if mode == "force-overwrite":
                    current.timestamp = now

    def undrain(self, targets: str, mode: str | None = None) -> None:
        if mode not in MODES:
            raise DrainError(errno.EINVAL, f"invalid undrain mode '{mode}' specified")
        ranks = self._targets(targets)
        if mode is None:
            missing = [r for r in ranks if r not in self.info]
            if missing:
                plural = "s" if len(missing) > 1 else ""
                raise DrainError(errno.EINVAL, f"rank{plural} {encode_idset(missing)} not drained")
        for rank in ranks:
            self.info.pop(rank, None)

    def drained_hosts(self) -> set[str]:
        return {self.hosts[r] for r in self.info}

    def status(self) -> NodeStatus:
        drained = {r: d.reason for r, d in self.info.items()}
        return NodeStatus(dict(enumerate(self.hosts)), drained, frozenset(self.offline))


@dataclass
class SsdVertices:
    """A Fluxion's rabbits' ssd vertices, kept by the instance (not by a service: a restarted
    service finds them as it left them): ``parts`` (rabbit -> ssd paths of 1 GiB each, set by
    a test), each path's status (up: True) and every ``set_status`` in order, as FluxNodes
    sends it.  Marked only while FakeFlux.fluxion says Fluxion is loaded."""

    parts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    vertices: dict[str, bool] = field(default_factory=dict)
    set_status: list[tuple[str, bool]] = field(default_factory=list)


class FakeNodes:
    """NodeControl for a service on ``client_loop``, acting on fakeflux's DrainSet."""

    def __init__(self, flux: Any, client_loop: Loop) -> None:
        self.flux = flux
        self.client_loop = client_loop
        self.rabbits: dict[str, bool] = {}  # what a Fluxion would hold: rabbit -> up
        self.held: dict[str, int] = {}  # rabbit -> bytes its pool keeps down (capacity drift)
        self.fluxion = flux.fluxion  # fakeflux has no Fluxion unless a test says so
        # hosts with Fluxion's badrabbit property (soft drain): fakeflux's, kept across services
        self.badrabbit: set[str] = flux.badrabbit
        self.property_calls = 0  # set_property / remove_property requests a Fluxion would get
        self._marks = PoolMarks()  # this service's, as FluxNodes keeps them

    @property
    def parts_held(self) -> set[str]:
        """ssd paths a released job holds down (core.release)."""
        return self._marks.held

    def _send(self, wanted: dict[str, bool]) -> None:
        if self.fluxion:
            self.flux.ssd.vertices.update(wanted)
            self.flux.ssd.set_status.extend(wanted.items())

    def _call(self, fn: Callable[[], Any], on_done: Callable[[Any, str | None], None]) -> None:
        def run() -> None:
            try:
                result, error = fn(), None
            except DrainError as exc:
                result, error = None, exc.strerror
            self.client_loop.call_soon(on_done, result, error)

        self.flux.loop.call_soon(run)

    def status(self, on_done: Callable[[NodeStatus | None, str | None], None]) -> None:
        self._call(self.flux.drains.status, on_done)

    def drain(self, targets: str, reason: str, on_done: Done, *, replace: bool) -> None:
        mode = "overwrite" if replace else "update"
        self._call(
            lambda: self.flux.drains.drain(targets, _service_reason(reason), mode),
            lambda _r, e: on_done(e),
        )

    def undrain(self, targets: str, on_done: Done) -> None:
        self._call(lambda: self.flux.undrain_on_loop(targets, "update"), lambda _r, e: on_done(e))

    def mark_rabbit(self, rabbit: str, up: bool, on_done: Done, *, hold: int = 0) -> None:
        if not self.fluxion:
            on_done(None)
            return
        self.rabbits[rabbit] = up
        self.held[rabbit] = hold if up else 0
        paths = self.flux.ssd.parts.get(rabbit, ())
        kept = paths if not up else parts_to_hold([(p, 1) for p in paths], hold)
        self._send(self._marks.rabbit(rabbit, paths, kept))
        on_done(None)

    def hold_parts(self, paths: Sequence[str], hold: bool, on_done: Done) -> None:
        self._send(self._marks.hold(paths) if hold else self._marks.give_back(paths))
        on_done(None)

    def mark_nodes(self, hosts: Sequence[str], bad: bool, on_done: Done) -> None:
        if not self.fluxion:
            on_done(None)
            return
        self.property_calls += 1
        if bad:
            self.badrabbit.update(hosts)
        else:
            self.badrabbit.difference_update(hosts)
        on_done(None)


# ---- the same over fakeflux's Unix socket (a service in a process of its own) ---------------


def serve_resource(flux: Any, method: str, payload: Any) -> dict[str, Any]:
    """Answer a ``resource.*`` request on fakeflux's loop (FakeFluxServer); DrainError if
    refused.  ``resource.status`` answers in a plain form (hosts, drained, offline), not R."""
    payload = payload if isinstance(payload, dict) else {}
    if method == "resource.status":
        status = flux.drains.status()
        return {
            "ranks": {str(r): h for r, h in status.ranks.items()},
            "drained": {str(r): reason for r, reason in status.drained.items()},
            "offline": sorted(status.offline),
        }
    if method == "resource.drain":
        reason = _service_reason(str(payload.get("reason", "")))
        flux.drains.drain(str(payload.get("targets", "")), reason, payload.get("mode"))
        return {}
    if method == "resource.undrain":
        flux.undrain_on_loop(str(payload.get("targets", "")), payload.get("mode"))
        return {}
    raise DrainError(errno.ENOSYS, f"{method}: no such method")


class TransportNodes:
    """NodeControl over a transport that reaches serve_resource (fakeflux.remote)."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport

    def status(self, on_done: Callable[[NodeStatus | None, str | None], None]) -> None:
        def answered(response: Any, error: Any) -> None:
            if error is not None:
                on_done(None, str(error))
                return
            on_done(
                NodeStatus(
                    {int(r): h for r, h in (response.get("ranks") or {}).items()},
                    {int(r): why for r, why in (response.get("drained") or {}).items()},
                    frozenset(int(r) for r in response.get("offline") or ()),
                ),
                None,
            )

        self.transport.rpc("resource.status", {}, answered)

    def drain(self, targets: str, reason: str, on_done: Done, *, replace: bool) -> None:
        payload = {"targets": targets, "reason": reason}
        payload["mode"] = "overwrite" if replace else "update"
        self.transport.rpc("resource.drain", payload, lambda _r, e: on_done(e and str(e)))

    def undrain(self, targets: str, on_done: Done) -> None:
        payload = {"targets": targets, "mode": "update"}
        self.transport.rpc("resource.undrain", payload, lambda _r, e: on_done(e and str(e)))

    def mark_rabbit(self, rabbit: str, up: bool, on_done: Done, *, hold: int = 0) -> None:
        on_done(None)  # fakeflux has no Fluxion

    def hold_parts(self, paths: Sequence[str], hold: bool, on_done: Done) -> None:
        on_done(None)  # fakeflux has no Fluxion

    def mark_nodes(self, hosts: Sequence[str], bad: bool, on_done: Done) -> None:
        on_done(None)  # fakeflux has no Fluxion
