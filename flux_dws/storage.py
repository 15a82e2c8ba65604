"""Storage sizing: DirectiveBreakdowns -> the job's storage needs and the Servers allocation.

Pure functions.  nnf-sos says in each DirectiveBreakdown what a directive needs (allocation
sets with a strategy and a minimum capacity); flux-dws puts a summary of that into the jobspec
before the job is scheduled, and once the job has its compute nodes it tells NNF which rabbits
serve each allocation set by writing the Servers resource (dws-api.md section 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PER_COMPUTE = "AllocatePerCompute"
PER_SERVER = "AllocatePerServer"
ACROSS_SERVERS = "AllocateAcrossServers"
SINGLE_SERVER = "AllocateSingleServer"
STRATEGIES = (PER_COMPUTE, PER_SERVER, ACROSS_SERVERS, SINGLE_SERVER)

#: The jobspec key flux-dws sets when it releases a job's dependency.
JOBSPEC_STORAGE_KEY = "attributes.system.dw_storage"


class StorageError(ValueError):
    """A breakdown or the system configuration does not allow an allocation; one line."""


@dataclass(frozen=True)
class AllocationNeed:
    """One allocation set of one breakdown: what NNF must allocate, and where it is recorded."""

    breakdown: str  # DirectiveBreakdown name
    servers: tuple[str, str]  # (namespace, name) of the Servers resource to write
    label: str  # raw, xfs, gfs2, mgt, mdt, mgtmdt, ost
    strategy: str
    capacity: int  # minimumCapacity in bytes
    count: int | None = None  # constraints.count, when the breakdown fixes the server count

    def to_json(self) -> dict[str, Any]:
        return {
            "breakdown": self.breakdown,
            "servers": list(self.servers),
            "label": self.label,
            "strategy": self.strategy,
            "capacity": self.capacity,
            "count": self.count,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AllocationNeed:
        return cls(
            breakdown=data["breakdown"],
            servers=(data["servers"][0], data["servers"][1]),
            label=data["label"],
            strategy=data["strategy"],
            capacity=int(data["capacity"]),
            count=data.get("count"),
        )


def needs_from_breakdowns(breakdowns: Sequence[Mapping[str, Any]]) -> tuple[AllocationNeed, ...]:
    """Every allocation set of every ready breakdown; StorageError names a malformed one."""
    needs: list[AllocationNeed] = []
    for bd in breakdowns:
        name = bd.get("metadata", {}).get("name", "?")
        status = bd.get("status") or {}
        if status.get("error"):
            raise StorageError(f"DirectiveBreakdown {name}: {status['error']}")
        storage = status.get("storage")
        if not storage:
            continue
        ref = storage.get("reference") or {}
        servers = (ref.get("namespace", ""), ref.get("name", ""))
        if not servers[1]:
            raise StorageError(f"DirectiveBreakdown {name}: storage has no Servers reference")
        for aset in storage.get("allocationSets") or []:
            strategy = aset.get("allocationStrategy")
            if strategy not in STRATEGIES:
                raise StorageError(
                    f"DirectiveBreakdown {name}: unknown allocationStrategy {strategy!r}"
                )
            capacity = aset.get("minimumCapacity")
            if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
                raise StorageError(
                    f"DirectiveBreakdown {name}: minimumCapacity {capacity!r} is not a size"
                )
            count = (aset.get("constraints") or {}).get("count")
            needs.append(
                AllocationNeed(
                    breakdown=name,
                    servers=servers,
                    label=str(aset.get("label", "")),
                    strategy=strategy,
                    capacity=capacity,
                    count=count if isinstance(count, int) and count > 0 else None,
                )
            )
    return tuple(needs)


def jobspec_storage(needs: Sequence[AllocationNeed]) -> dict[str, Any]:
    """The summary put into the jobspec: bytes per compute node and bytes shared, per label.

    A scheduler (or a site's jobspec policy) can read ``attributes.system.dw_storage`` to
    place the job near enough rabbit capacity; flux-dws itself only records it.
    """
    per_compute: dict[str, int] = {}
    shared: dict[str, int] = {}
    for need in needs:
        into = per_compute if need.strategy == PER_COMPUTE else shared
        into[need.label] = into.get(need.label, 0) + need.capacity
    return {"per_compute": per_compute, "shared": shared}


def rabbit_map(system_configuration: Mapping[str, Any] | None) -> dict[str, str]:
    """compute hostname -> rabbit name, from a DWS SystemConfiguration."""
    mapping: dict[str, str] = {}
    spec = (system_configuration or {}).get("spec") or {}
    for node in spec.get("storageNodes") or []:
        for access in node.get("computesAccess") or []:
            if access.get("name") and node.get("name"):
                mapping[access["name"]] = node["name"]
    return mapping


def plan_servers(
    needs: Sequence[AllocationNeed],
    hosts: Sequence[str],
    rabbits: Mapping[str, str],
    min_allocation: Mapping[str, int] | None = None,
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Servers (namespace, name) -> spec.allocationSets, for a job on ``hosts``.

    ``rabbits`` maps each host to its rabbit: the rabbits Fluxion allocated when the job's R
    says (flux_dws.rabbits.allocated_rabbits), else the SystemConfiguration.  As DWS expects:
    - AllocatePerCompute: one allocation per node, on that node's rabbit;
    - AllocateAcrossServers: over the job's rabbits, weighted by the job's nodes on each (the
      greatest common divisor of those counts makes the allocations as large as possible);
      with a ``count`` constraint, that many allocations on the rabbits with the most of the
      job's nodes, wrapping round when there are fewer rabbits than allocations;
    - AllocateSingleServer: exactly one, on the rabbit with the most of the job's nodes;
    - AllocatePerServer: one on each of the job's rabbits.
    ``min_allocation`` (label -> bytes) raises every allocation to the site's minimum.
    """
    if not hosts:
        raise StorageError("the job has no compute nodes to place storage near")
    missing = [h for h in hosts if h not in rabbits]
    if missing:
        raise StorageError(
            f"no rabbit serves compute node {missing[0]} (not in the SystemConfiguration)"
        )
    per_rabbit: dict[str, int] = {}
    for host in hosts:
        per_rabbit[rabbits[host]] = per_rabbit.get(rabbits[host], 0) + 1
    # Most of the job's nodes first; the name breaks ties, so a plan never depends on order.
    ranked = sorted(per_rabbit, key=lambda r: (-per_rabbit[r], r))
    plan: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for need in needs:
        storage, size = _placement(need, per_rabbit, ranked, len(hosts))
        floor = (min_allocation or {}).get(need.label, 0)
        plan.setdefault(need.servers, []).append(
            {"label": need.label, "allocationSize": max(size, floor), "storage": storage}
        )
    return plan


def _placement(
    need: AllocationNeed, per_rabbit: Mapping[str, int], ranked: Sequence[str], nnodes: int
) -> tuple[list[dict[str, Any]], int]:
    """(Servers storage entries, allocation size) for one allocation set."""
    if need.strategy == PER_COMPUTE:
        return [{"name": r, "allocationCount": per_rabbit[r]} for r in sorted(per_rabbit)], (
            need.capacity
        )
    if need.strategy == PER_SERVER:
        return [{"name": r, "allocationCount": 1} for r in sorted(per_rabbit)], need.capacity
    if need.strategy == SINGLE_SERVER or need.count:
        count = 1 if need.strategy == SINGLE_SERVER else int(need.count or 1)
        counts: dict[str, int] = {}
        for i in range(count):  # wraps onto the rabbits with the most nodes
            rabbit = ranked[i % len(ranked)]
            counts[rabbit] = counts.get(rabbit, 0) + 1
        storage = [{"name": r, "allocationCount": counts[r]} for r in ranked if r in counts]
        return storage, math.ceil(need.capacity / count)
    unit = math.gcd(*per_rabbit.values())
    storage = [{"name": r, "allocationCount": per_rabbit[r] // unit} for r in sorted(per_rabbit)]
    return storage, math.ceil(need.capacity * unit / nnodes)
