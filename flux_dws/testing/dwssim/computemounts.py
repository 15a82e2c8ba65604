# SPDX-License-Identifier: LGPL-3.0-only
"""The compute side of nnf-sos's ClientMounts (its clientmountd), beside nnf-sos itself.

nnf-sos's NnfAccess controller makes a ClientMount in each compute node's namespace, and the
compute node's clientmountd (mount-daemon/, its NnfClientMountReconciler with ClientCompute)
mounts it.  That daemon is a system service of each compute node and is not run here, so this
plays it for the compute nodes it is given, with the same status sequence as
nnf_clientmount_controller.go's Reconcile: status.mounts sized to spec.mounts and set to the
desired state not ready; then its finalizer; then every mount ready and allReady; on
deletion, the finalizer taken off.  Nothing is mounted: a mount on a compute node of the test
is a status only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, Self

from flux_dws.testing.dwssim.writer import LOG
from flux_dws.testing.kubeapi.errors import ApiError

PLURAL = "clientmounts"
FINALIZER = "nnf.cray.hpe.com/nnf_clientmount"  # finalizerNnfClientMount
WATCH_POLL = 0.5
RELIST_PAUSE = 0.1


def next_step(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The ClientMount after one reconcile of its compute node's clientmountd, or None when
    there is nothing to do (pure; ``obj`` is not changed)."""
    meta = obj.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if meta.get("deletionTimestamp"):
        if FINALIZER not in finalizers:
            return None
        finalizers.remove(FINALIZER)
        return {**obj, "metadata": {**meta, "finalizers": finalizers}}
    spec = obj.get("spec") or {}
    wanted = spec.get("desiredState")
    count = len(spec.get("mounts") or [])
    status = dict(obj.get("status") or {})
    mounts = list(status.get("mounts") or [])
    if count == 0 or wanted not in ("mounted", "unmounted"):
        return None
    if len(mounts) != count or mounts[0].get("state") != wanted:
        status.update(mounts=[{"state": wanted, "ready": False}] * count, allReady=False)
        return {**obj, "status": status}
    if FINALIZER not in finalizers:
        return {**obj, "metadata": {**meta, "finalizers": [*finalizers, FINALIZER]}}
    if status.get("allReady") and all(m.get("ready") for m in mounts):
        return None
    status.pop("error", None)
    status.update(mounts=[{"state": wanted, "ready": True}] * count, allReady=True)
    return {**obj, "status": status}


class Background:
    """A stand-in for a node-side daemon: ``_run`` in one daemon thread until ``stop``."""

    name = "background"

    def __init__(self, store: Any) -> None:
        self._store = store
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        raise NotImplementedError


class Player(Background):
    """Plays a node's controller for one kind against a kubeapi Store, in a daemon thread:
    each object it is given (``_handle``) after a list, then as a watch sees it change."""

    plural = ""
    name = "player"

    def _run(self) -> None:
        while not self._stop.is_set():
            watch = None
            try:
                items, version = self._store.list(self.plural, None)
                for item in items:
                    self._handle(item)
                watch = self._store.watch(self.plural, resource_version=version)
                while not self._stop.is_set():
                    event = watch.next(timeout=WATCH_POLL)
                    if event is not None and event[0] in ("ADDED", "MODIFIED"):
                        self._handle(event[1])
                    elif event is not None and event[0] not in ("DELETED", "BOOKMARK"):
                        break  # the watch ended (expired): list again
            except Exception:
                if not self._stop.is_set():
                    LOG.exception("%s: watch on %s failed; listing again", self.name, self.plural)
                    self._stop.wait(RELIST_PAUSE)
            finally:
                if watch is not None:
                    watch.close()

    def _handle(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def _write(self, obj: dict[str, Any], new: dict[str, Any]) -> None:
        meta = obj["metadata"]
        try:
            self._store.replace(self.plural, meta["namespace"], meta["name"], new)
        except ApiError as exc:
            if exc.code not in (404, 409):  # gone, or changed: its next event decides again
                raise


class ComputeMounts(Player):
    """Plays clientmountd for ``computes``."""

    plural = PLURAL
    name = "clientmountd"

    def __init__(self, store: Any, computes: Iterable[str]) -> None:
        super().__init__(store)
        self._computes = frozenset(computes)

    def _handle(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if meta.get("namespace") not in self._computes:
            return  # a rabbit's own ClientMounts are its node controller's
        new = next_step(obj)
        if new is not None:
            self._write(obj, new)
