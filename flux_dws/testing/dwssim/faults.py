# SPDX-License-Identifier: LGPL-3.0-only
"""Rabbit and node faults the simulator can be told to play, and the resources they show in.

- A rabbit's Storage changes status on command (``set_rabbit_status``), as DWS's Storage
  controller reports a rabbit or a PCIe link going Offline and coming back.
- ``Faults.setup`` names rabbits that fail to create their part of a job's file systems:
  Setup's Servers status then lists only the rabbits that made theirs, with ``status.error``
  naming the failed one, and the directive's driver entry fails (Fatal: Error; a WLM that tolerates
  the loss forces the state ready).
- ``Faults.mount`` names compute nodes whose mount fails in PreRun: nnf-sos's ClientMount for
  that node (one per compute per workflow, in a namespace named after the compute, with the
  workflow's labels) shows ``status.error`` and an unready mount, and PreRun fails.
- ``Faults.unmount`` names compute nodes whose unmount hangs (``Faults.hang_unmount``).  As
  nnf-sos does, PostRun unmounts the workflow's ClientMounts (``status.mounts[].state``
  unmounted); a hung one stays ``mounted`` with ``status.error`` and keeps PostRun waiting,
  and Teardown (which unmounts again) fails naming the computes still mounted.  A compute
  DWS's SystemStatus lists as Disabled is skipped, as nnf-sos's ``checkOfflineOrFencedCompute``
  does: no unmount is tried on it (its ClientMount is left as it is until Teardown deletes it),
  so a stuck mount there holds and fails nothing.  A compute whose Storage link is Offline or
  Fenced is skipped too; a Fenced one fails the workflow in PostRun with nnf-sos's "compute
  nodes [...] were fenced during the job" (``set_rabbit(..., links={node: "Fenced"})``).

forceReady is honoured by the DWS controller (status.force_ready), as in DWS: the state goes
Ready/Completed with "Forced Ready" whatever the driver entries say; the failed entries stay
as they are, and the next desiredState change resets forceReady.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flux_dws.testing.dwssim import companions as cmp
from flux_dws.testing.dwssim.outcomes import FATAL, Fail, ResourceError
from flux_dws.testing.kubeapi.errors import ApiError

STORAGE_NAMESPACE = "default"


@dataclass
class Faults:
    """What the simulator is told to break (thread-safe: tests set it while it runs)."""

    setup: set[str] = field(default_factory=set)  # rabbits whose Setup fails
    mount: set[str] = field(default_factory=set)  # computes whose mount fails
    unmount: set[str] = field(default_factory=set)  # computes whose unmount hangs
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fail_setup(self, rabbit: str, fail: bool = True) -> None:
        with self._lock:
            (self.setup.add if fail else self.setup.discard)(rabbit)

    def fail_mount(self, compute: str, fail: bool = True) -> None:
        with self._lock:
            (self.mount.add if fail else self.mount.discard)(compute)

    def hang_unmount(self, compute: str, hang: bool = True) -> None:
        with self._lock:
            (self.unmount.add if hang else self.unmount.discard)(compute)

    def stuck(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self.unmount)

    def snapshot(self) -> tuple[frozenset[str], frozenset[str]]:
        with self._lock:
            return frozenset(self.setup), frozenset(self.mount)


# ---- Storage ------------------------------------------------------------------------------


def storage_status_update(
    storage: Mapping[str, Any],
    status: str,
    *,
    links: Mapping[str, str] | None = None,
    message: str = "",
) -> dict[str, Any]:
    """The Storage's new status: ``status`` for the rabbit; every link follows a rabbit that
    is Ready (Ready) or gone (Offline), unless ``links`` gives computes their own status."""
    current = dict(storage.get("status") or {})
    access = dict(current.get("access") or {})
    computes = []
    for entry in access.get("computes") or []:
        name = entry.get("name")
        if links is not None and name in links:
            link = links[name]
        elif links is not None:
            link = entry.get("status", "Ready")
        else:
            # links come from NnfNode's servers, not from the rabbit's own status: a
            # Degraded rabbit still reaches its computes
            link = "Ready" if status in ("Ready", "Degraded") else "Offline"
        computes.append({"name": name, "status": link})
    access["computes"] = computes
    access["servers"] = [
        {**s, "status": "Ready" if status == "Ready" else status}
        for s in access.get("servers") or []
    ]
    return {**current, "status": status, "message": message, "access": access}


def set_rabbit_status(
    store: Any,
    rabbit: str,
    status: str,
    *,
    links: Mapping[str, str] | None = None,
    enabled: bool | None = None,
) -> dict[str, Any]:
    """What DWS's Storage controller writes when a rabbit (or some links) change."""
    for _ in range(8):
        current = store.get("storages", STORAGE_NAMESPACE, rabbit)
        new = dict(current, status=storage_status_update(current, status, links=links))
        if enabled is not None:
            new["spec"] = {
                **(current.get("spec") or {}),
                "state": "Enabled" if enabled else "Disabled",
            }
        try:
            return store.replace("storages", STORAGE_NAMESPACE, rabbit, new)
        except ApiError as exc:
            if exc.code != 409:
                raise
    raise RuntimeError(f"Storage {rabbit} kept changing")


# ---- Setup --------------------------------------------------------------------------------


def rabbits_of(servers: Mapping[str, Any]) -> list[str]:
    names: list[str] = []
    for aset in (servers.get("spec") or {}).get("allocationSets") or []:
        for entry in aset.get("storage") or []:
            if entry.get("name") and entry["name"] not in names:
                names.append(entry["name"])
    return names


def failed_servers_status(status: Mapping[str, Any], failed: Iterable[str]) -> dict[str, Any]:
    """Servers status with the failed rabbits' storage left out and ``error`` naming them."""
    bad = sorted(set(failed))
    sets = []
    for aset in status.get("allocationSets") or []:
        storage = {k: v for k, v in (aset.get("storage") or {}).items() if k not in bad}
        sets.append({**aset, "storage": storage})
    error = f"could not create storage on rabbit(s) {', '.join(bad)}"
    return {**status, "ready": False, "allocationSets": sets, "error": error}


def _fatal(user_message: str, debug: str) -> Fail:
    return ResourceError(user_message, debug, severity=FATAL).fail()


def setup_failure(failed: Sequence[str]) -> Fail:
    names = ", ".join(sorted(failed))
    return _fatal(
        f"could not create file system on rabbit(s) {names}",
        f"storage allocation failed on {names}",
    )


# ---- PreRun: ClientMounts ------------------------------------------------------------------


def clientmount(
    workflow: Mapping[str, Any], index: int, compute: str, path: str, failed: bool
) -> dict[str, Any]:
    """nnf-sos's ClientMount for one compute node of a workflow's directive ``index``."""
    meta = cmp.child_metadata(workflow, f"{workflow['metadata']['name']}-{index}-{compute}")
    meta["namespace"] = compute
    mount = {"state": "mounted", "ready": not failed}
    status: dict[str, Any] = {"mounts": [mount], "allReady": not failed}
    if failed:
        status["error"] = {
            "severity": "Major",
            "type": "Internal",
            "userMessage": f"could not mount file system on {compute}",
            "debugMessage": f"mount {path} on {compute}: input/output error",
        }
    return {
        **cmp.api_object("clientmounts"),
        "metadata": meta,
        "spec": {
            "node": compute,
            "desiredState": "mounted",
            "mounts": [{"mountPath": path, "type": "xfs"}],
        },
        "status": status,
    }


def mount_failure(failed: Sequence[str]) -> Fail:
    names = ", ".join(sorted(failed))
    return _fatal(
        f"could not mount file system on compute node(s) {names}", f"ClientMount error on {names}"
    )


# ---- PostRun and Teardown: unmounting ------------------------------------------------------


def unmounted(clientmount: Mapping[str, Any], stuck: bool) -> dict[str, Any]:
    """A ClientMount after nnf-sos tried to unmount it: ``unmounted``, or still ``mounted``
    with an error when the unmount hangs."""
    spec = {**(clientmount.get("spec") or {}), "desiredState": "unmounted"}
    mounts = [
        {**m, "state": "mounted" if stuck else "unmounted", "ready": not stuck}
        for m in (clientmount.get("status") or {}).get("mounts") or []
    ]
    status: dict[str, Any] = {"mounts": mounts, "allReady": not stuck}
    if stuck:
        node = spec.get("node", "")
        status["error"] = {
            "severity": "Major",
            "type": "Internal",
            "userMessage": f"could not unmount file system on {node}",
            "debugMessage": f"umount on {node}: target is busy",
        }
    return {**clientmount, "spec": spec, "status": status}


def unmount_failure(stuck: Sequence[str]) -> Fail:
    names = ", ".join(sorted(stuck))
    return _fatal(
        f"could not unmount file system on compute node(s) {names}",
        f"ClientMount unmount error on {names}",
    )


def fence_failure(fenced: Sequence[str]) -> Fail:
    """nnf-sos's ``detectFencedComputes`` error once a job's computes were fenced (Go's
    ``%v`` of a []string: ``[a b]``)."""
    names = " ".join(sorted(fenced))
    return _fatal(
        f"Workflow failed: compute nodes [{names}] were fenced during the job",
        f"compute nodes have been fenced: [{names}]",
    )


def link_states(storages: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Compute -> its link status in the rabbits' Storage ``status.access.computes``."""
    found: dict[str, str] = {}
    for storage in storages:
        for entry in ((storage.get("status") or {}).get("access") or {}).get("computes") or []:
            if isinstance(entry, Mapping) and entry.get("name"):
                found[entry["name"]] = str(entry.get("status", ""))
    return found
