# SPDX-License-Identifier: LGPL-3.0-only
"""Seed a store with what a DWS + NNF system has before any job: rabbits and profiles."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flux_dws.testing.dwssim.companions import (
    RABBIT_CAPACITY,
    api_object,
    group_computes,
    storage_resource,
    system_configuration,
)
from flux_dws.testing.dwssim.containers import PROFILE_NAMESPACE, PROFILE_PLURAL, seeded_profiles
from flux_dws.testing.dwssim.datamovement import DM_NAMESPACE
from flux_dws.testing.kubeapi.errors import ApiError


def compute_names(count: int) -> list[str]:
    """The compute node names the stand-ins use: compute-01, compute-02, ..."""
    return [f"compute-{i:02d}" for i in range(1, count + 1)]


def seed(
    store: Any,
    computes: Sequence[str] = (),
    rabbits: Mapping[str, Sequence[str]] | None = None,
    *,
    per_rabbit: int = 16,
    profiles: Iterable[Mapping[str, Any]] | None = None,
    capacity: int | Mapping[str, int] = RABBIT_CAPACITY,
    external: Sequence[str] = (),
    storages: bool = True,
) -> dict[str, list[str]]:
    """Create the SystemConfiguration "default", a Storage per rabbit and the
    NnfContainerProfiles; return the map.

    ``rabbits`` maps each rabbit to the compute nodes it serves; without it ``computes`` are
    given ``per_rabbit`` to a rabbit named rabbit-<n>.  ``profiles`` defaults to the
    simulator's behaviour profiles (``PROFILES``).  ``capacity`` is each rabbit's Storage
    capacity in bytes: one figure for all, or one per rabbit name.  ``external`` are compute
    nodes no rabbit serves, DWS's ``externalComputeNodes`` (nnf-sos makes each a namespace
    too, for its ClientMounts).  ``storages=False`` leaves the Storage objects to DWS's
    SystemConfiguration controller (and their status to nnf-sos), as on a real system.
    Objects that already exist are replaced.
    """
    mapping = (
        {r: list(c) for r, c in rabbits.items()}
        if rabbits is not None
        else group_computes(computes, per_rabbit)
    )
    # The namespaces NNF runs in: profiles in nnf-system, Lustre data movement in
    # nnf-dm-system, one per rabbit node and one per compute node (their per-node objects,
    # such as ClientMounts, live there).
    nodes = [*mapping, *(c for served in mapping.values() for c in served), *external]
    for namespace in dict.fromkeys(("default", PROFILE_NAMESPACE, DM_NAMESPACE, *nodes)):
        try:
            store.create("namespaces", None, {"metadata": {"name": namespace}})
        except ApiError as exc:
            if exc.code != 409:
                raise
    _put(store, "systemconfigurations", system_configuration(mapping, external))
    # DWS's SystemStatus, which the WLM fills with its view of the compute nodes
    _put(
        store,
        "systemstatuses",
        {
            **api_object("systemstatuses"),
            "metadata": {"name": "default", "namespace": "default"},
            "data": {"nodes": {}},
        },
    )
    for rabbit, served in mapping.items() if storages else ():
        size = capacity if isinstance(capacity, int) else capacity.get(rabbit, RABBIT_CAPACITY)
        _put(store, "storages", storage_resource(rabbit, served, size))
    for profile in seeded_profiles() if profiles is None else profiles:
        _put(store, PROFILE_PLURAL, profile)
    return mapping


def _put(store: Any, plural: str, obj: Mapping[str, Any]) -> None:
    meta = obj["metadata"]
    try:
        store.create(plural, meta["namespace"], obj)
    except ApiError as exc:
        if exc.code != 409:
            raise
        current = store.get(plural, meta["namespace"], meta["name"])
        fresh = dict(
            obj, metadata=dict(meta, resourceVersion=current["metadata"].get("resourceVersion"))
        )
        store.replace(plural, meta["namespace"], meta["name"], fresh)
