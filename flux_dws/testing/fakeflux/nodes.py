# SPDX-License-Identifier: LGPL-3.0-only
"""fakeflux's resource module: drained nodes with reasons, as flux-core's resource module keeps
them (src/modules/resource/drain.c), and a NodeControl client for the service.

Semantics mirrored from flux-core:
- drain without a mode fails with EEXIST ("rank(s) ... already drained") if any target is
  already drained with a reason; mode "update" only sets a reason where none is set; mode
  "overwrite" replaces the reason (the timestamp of an already drained node is kept).
- undrain without a mode fails with EINVAL if any target is not drained; mode "update" skips
  targets that are not drained.
- targets name hosts (a comma-separated hostlist); unknown hosts are EINVAL.
- drained nodes are not given to new jobs (the scheduler skips them).
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flux_dws.base.loop import Loop
from flux_dws.flux.resource import Done, NodeStatus

MODES = (None, "update", "overwrite", "force-overwrite")


@dataclass
class Drain:
    timestamp: float
    reason: str


class DrainError(OSError):
    """A refused drain/undrain: errno and flux-core's message."""


class DrainSet:
    """Drained hosts, keyed by hostname (call on fakeflux's loop thread)."""

    def __init__(self, hosts: Sequence[str], clock: Callable[[], float] = time.time) -> None:
        self.hosts = tuple(hosts)
        self.info: dict[str, Drain] = {}
        self.offline: set[str] = set()
        self._clock = clock

    def _targets(self, targets: str) -> list[str]:
        names = [t for t in targets.split(",") if t]
        if not names:
            raise DrainError(errno.EINVAL, "idset is empty")
        unknown = [n for n in names if n not in self.hosts]
        if unknown:
            raise DrainError(errno.EINVAL, f"unknown host {unknown[0]}")
        return names

    def drain(self, targets: str, reason: str = "", mode: str | None = None) -> None:
        if mode not in MODES:
            raise DrainError(errno.EINVAL, "Invalid mode specified")
        names = self._targets(targets)
        if mode is None:
            already = [n for n in names if n in self.info and self.info[n].reason]
            if already:
                plural = "s" if len(already) > 1 else ""
                raise DrainError(errno.EEXIST, f"rank{plural} {','.join(already)} already drained")
        now = self._clock()
        for name in names:
            current = self.info.get(name)
            if current is None:
                self.info[name] = Drain(now, reason)
            elif mode in ("overwrite", "force-overwrite") or not current.reason:
                current.reason = reason
                if mode == "force-overwrite":
                    current.timestamp = now

    def undrain(self, targets: str, mode: str | None = None) -> None:
        if mode not in MODES:
            raise DrainError(errno.EINVAL, f"invalid undrain mode '{mode}' specified")
        names = self._targets(targets)
        if mode is None:
            missing = [n for n in names if n not in self.info]
            if missing:
                plural = "s" if len(missing) > 1 else ""
                raise DrainError(errno.EINVAL, f"rank{plural} {','.join(missing)} not drained")
        for name in names:
            self.info.pop(name, None)

    def status(self) -> NodeStatus:
        drained = {h: d.reason for h, d in self.info.items()}
        return NodeStatus(self.hosts, drained, frozenset(self.offline))


class FakeNodes:
    """NodeControl for a service on ``client_loop``, acting on fakeflux's DrainSet."""

    def __init__(self, flux: Any, client_loop: Loop) -> None:
        self.flux = flux
        self.client_loop = client_loop
        self.rabbits: dict[str, bool] = {}  # what a Fluxion would hold: rabbit -> up
        self.held: dict[str, int] = {}  # rabbit -> bytes its pool keeps down (capacity drift)
        self.fluxion = False  # fakeflux has no Fluxion unless a test says so

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

    def drain(self, hosts: Sequence[str], reason: str, on_done: Done, *, replace: bool) -> None:
        mode = "overwrite" if replace else "update"
        self._call(
            lambda: self.flux.drains.drain(",".join(hosts), reason, mode), lambda _r, e: on_done(e)
        )

    def undrain(self, hosts: Sequence[str], on_done: Done) -> None:
        self._call(
            lambda: self.flux.undrain_on_loop(",".join(hosts), "update"), lambda _r, e: on_done(e)
        )

    def mark_rabbit(self, rabbit: str, up: bool, on_done: Done, *, hold: int = 0) -> None:
        if not self.fluxion:
            on_done(None)
            return
        self.rabbits[rabbit] = up
        self.held[rabbit] = hold if up else 0
        on_done(None)


# ---- the same over fakeflux's Unix socket (a service in a process of its own) ---------------


def serve_resource(flux: Any, method: str, payload: Any) -> dict[str, Any]:
    """Answer a ``resource.*`` request on fakeflux's loop (FakeFluxServer); DrainError if
    refused.  ``resource.status`` answers in a plain form (hosts, drained, offline), not R."""
    payload = payload if isinstance(payload, dict) else {}
    if method == "resource.status":
        status = flux.drains.status()
        return {
            "hosts": list(status.hosts),
            "drained": dict(status.drained),
            "offline": sorted(status.offline),
        }
    if method == "resource.drain":
        flux.drains.drain(
            str(payload.get("targets", "")), str(payload.get("reason", "")), payload.get("mode")
        )
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
                    tuple(response.get("hosts") or ()),
                    dict(response.get("drained") or {}),
                    frozenset(response.get("offline") or ()),
                ),
                None,
            )

        self.transport.rpc("resource.status", {}, answered)

    def drain(self, hosts: Sequence[str], reason: str, on_done: Done, *, replace: bool) -> None:
        payload = {"targets": ",".join(hosts), "reason": reason}
        payload["mode"] = "overwrite" if replace else "update"
        self.transport.rpc("resource.drain", payload, lambda _r, e: on_done(e and str(e)))

    def undrain(self, hosts: Sequence[str], on_done: Done) -> None:
        payload = {"targets": ",".join(hosts), "mode": "update"}
        self.transport.rpc("resource.undrain", payload, lambda _r, e: on_done(e and str(e)))

    def mark_rabbit(self, rabbit: str, up: bool, on_done: Done, *, hold: int = 0) -> None:
        on_done(None)  # fakeflux has no Fluxion
