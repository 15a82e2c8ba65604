# SPDX-License-Identifier: LGPL-3.0-only
"""Rabbit capacity, as nnf-sos accounts it: what each workflow's Servers took from each rabbit.

A rabbit asked for more than its Storage resource says it has fails Setup the way nnf-sos does
(a Fatal WLM error, "<rabbit>: insufficient capacity available"), so a scheduler that ignores
capacity is caught by the tests.  Allocations are held from Setup until Teardown (or until the
workflow is deleted).

As in nnf-sos, a Storage resource's ``status.devices[].capacity`` add up to the rabbit's total
and ``status.capacity`` is what is still unallocated (NnfNode's ``GuaranteedBytes``): every
change to what the ledger holds is published there.  Besides the workflows' allocations the
ledger holds persistent and system storage (a Servers owned by an NnfSystemStorage or a
PersistentStorageInstance, made outside the WLM) and leaks (storage a failed Teardown left on a
rabbit, with no Servers at all), so tests can make Flux's and the rabbits' ideas of free
capacity drift apart.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from flux_dws.core.rabbits import OWNER_KIND_LABEL, device_capacity
from flux_dws.testing.dwssim.companions import STORAGE_NAMESPACE, api_object
from flux_dws.testing.kubeapi.errors import ApiError


def requested(servers: Mapping[str, Any]) -> dict[str, int]:
    """Rabbit -> bytes a Servers resource asks for (allocationSize x allocationCount)."""
    wanted: dict[str, int] = {}
    for aset in (servers.get("spec") or {}).get("allocationSets") or []:
        size = aset.get("allocationSize") or 0
        for entry in aset.get("storage") or []:
            count = entry.get("allocationCount") or 1
            wanted[entry["name"]] = wanted.get(entry["name"], 0) + int(size) * int(count)
    return wanted


class CapacityLedger:
    """Bytes held on each rabbit, per (workflow uid, directive index)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], dict[str, int]] = {}
        self._lock = threading.Lock()

    def used(self, rabbit: str, besides: tuple[str, int] | None = None) -> int:
        return sum(h.get(rabbit, 0) for key, h in self._held.items() if key != besides)

    def take(
        self, key: tuple[str, int], wanted: Mapping[str, int], capacity: Mapping[str, int | None]
    ) -> str | None:
        """Hold ``wanted`` for ``key``; the first rabbit short of capacity, or None.

        A rabbit whose capacity is unknown (no Storage resource) is not limited.  Taking the
        same key again replaces what it held (Setup is level-triggered).
        """
        with self._lock:
            for rabbit in sorted(wanted):
                limit = capacity.get(rabbit)
                if limit is not None and self.used(rabbit, key) + wanted[rabbit] > limit:
                    return rabbit
            self._held[key] = dict(wanted)
            return None

    def release(self, uid: str) -> None:
        with self._lock:
            for key in [k for k in self._held if k[0] == uid]:
                del self._held[key]

    def held(self) -> dict[str, int]:
        """Rabbit -> bytes held now, for tests and `flux dws simulate`."""
        with self._lock:
            total: dict[str, int] = {}
            for held in self._held.values():
                for rabbit, size in held.items():
                    total[rabbit] = total.get(rabbit, 0) + size
            return total


def storage_totals(store: Any) -> dict[str, int | None]:
    """Rabbit -> its total capacity: the sum of its devices' (status.capacity where it lists
    none); None where the Storage reports neither."""
    items, _ = store.list("storages", STORAGE_NAMESPACE, shared=True)
    found: dict[str, int | None] = {}
    for item in items:
        status = item.get("status") or {}
        total = device_capacity(status)
        if total is None:
            capacity = status.get("capacity")
            total = capacity if isinstance(capacity, int) else None
        found[item["metadata"]["name"]] = total
    return found


def publish_free(store: Any, ledger: CapacityLedger) -> None:
    """Write each rabbit's unallocated bytes to its Storage ``status.capacity`` (where it
    changed; Storage resources without devices are left as they are)."""
    held = ledger.held()
    items, _ = store.list("storages", STORAGE_NAMESPACE, shared=True)
    for item in items:
        status = item.get("status") or {}
        total = device_capacity(status)
        name = item["metadata"]["name"]
        if total is None:
            continue
        free = max(0, total - held.get(name, 0))
        for _ in range(8):
            current = store.get("storages", STORAGE_NAMESPACE, name)
            if (current.get("status") or {}).get("capacity") == free:
                break
            new = dict(current, status={**(current.get("status") or {}), "capacity": free})
            try:
                store.replace("storages", STORAGE_NAMESPACE, name, new)
                break
            except ApiError as exc:
                if exc.code != 409:
                    raise


def outside_servers(name: str, rabbit: str, size: int, kind: str) -> dict[str, Any]:
    """The Servers nnf-sos makes for system storage (``kind`` NnfSystemStorage) or a persistent
    file system (PersistentStorageInstance): one allocation of ``size`` on ``rabbit``."""
    return {
        **api_object("servers"),
        "metadata": {
            "name": name,
            "namespace": STORAGE_NAMESPACE,
            "labels": {
                OWNER_KIND_LABEL: kind,
                "dataworkflowservices.github.io/owner.name": name,
                "dataworkflowservices.github.io/owner.namespace": STORAGE_NAMESPACE,
            },
        },
        "spec": {
            "allocationSets": [
                {
                    "label": "xfs",
                    "allocationSize": int(size),
                    "storage": [{"name": rabbit, "allocationCount": 1}],
                }
            ]
        },
        "status": {"ready": True},
    }
