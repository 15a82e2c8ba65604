# SPDX-License-Identifier: LGPL-3.0-only
"""What ``flux dws rabbits`` shows about each rabbit, as pure functions of DWS's objects.

A rabbit's nodes come from the SystemConfiguration, its state, health, capacity and the
reasons it is out of service from its Storage resource, and what its capacity is used for from
the Servers resources: those a Workflow owns are Flux jobs' allocations, those a
PersistentStorageInstance owns are persistent storage (dws-api.md section 7).

Capacity, as nnf-sos reports it: ``status.capacity`` is what is still free and the devices'
capacities add up to the total; what is neither free nor a job's is persistent or system
storage (NnfSystemStorage).  The total is flux_dws.core.rabbits.device_capacity, the one sum
the graph and the service use too; a Storage without a device figure (none listed, or every
drive reporting 0, as nnf-sos writes for drives that are not Ready) has only
``status.capacity`` as its total, as in the graph; free is then what the Servers leave of it.
A rabbit that is not Ready has nothing free.

DRIFT is the service's capacity-drift alarm (``[dws] capacity-drift``), the same pure
computation (flux_dws.core.health.capacity_drifts): how much less free a rabbit has than its
Servers explain, when that is more than the threshold.

Everything here is untrusted input: a malformed field reads as absent, never as an error, so
one bad object cannot hide the other rabbits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.hostlist import encode_hostlist
from flux_dws.core.health import Drift, capacity_drifts
from flux_dws.core.policy import Policy
from flux_dws.core.rabbits import device_capacity, servers_held

OWNER_KIND = "dataworkflowservices.github.io/owner.kind"
OWNER_NAME = "dataworkflowservices.github.io/owner.name"
#: HPE's ``nnf rabbit`` tool records why it disabled or drained a rabbit in these annotations.
DISABLE_REASON = "disable_reason"
DRAIN_REASON = "drain_reason"
#: Storage status.status values of a rabbit that takes new allocations.
READY = "Ready"


@dataclass(frozen=True)
class RabbitRow:
    """One rabbit as ``flux dws rabbits`` shows it; sizes in bytes."""

    name: str
    nodes: tuple[str, ...]
    state: str  # Storage spec.state: Enabled or Disabled
    status: str  # Storage status.status (Ready, Offline, ...; NotPresent without a Storage)
    total: int
    allocated: int  # held by Flux jobs' workflows
    persistent: int  # held by persistent and system storage
    free: int
    reasons: tuple[str, ...] = ()
    #: workflow (or persistent storage) name -> bytes it holds here
    holders: Mapping[str, int] = field(default_factory=dict)
    drift: Drift | None = None  # less free than its Servers explain, past the threshold
    #: its nodes Flux has drained (host -> reason); None where Flux's drains were not read
    drained: Mapping[str, str] | None = None

    @property
    def hostlist(self) -> str:
        return encode_hostlist(self.nodes)

    @property
    def usable(self) -> bool:
        return self.state == "Enabled" and self.status == READY


def _bytes(value: Any) -> int:
    return untrusted.count(value) or 0


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return untrusted.mapping(
        untrusted.mapping(untrusted.mapping(obj).get("metadata")).get("labels")
    )


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = untrusted.mapping(untrusted.mapping(obj).get("metadata"))
    return untrusted.mapping(meta.get("annotations"))


def _holder(servers: Mapping[str, Any]) -> tuple[str, str]:
    """(owner kind, owner name) of a Servers resource; the Servers' own name without labels."""
    labels = _labels(servers)
    kind = labels.get(OWNER_KIND)
    name = labels.get(OWNER_NAME)
    if not isinstance(name, str) or not name:
        name = untrusted.name_of(servers)
    return (kind if isinstance(kind, str) else ""), untrusted.field(name, 253)


def _reasons(storage: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[str, ...]:
    notes = _annotations(storage)
    found = []
    for key, what in ((DISABLE_REASON, "disabled"), (DRAIN_REASON, "drained")):
        text = notes.get(key)
        if isinstance(text, str) and text.strip():
            found.append(f"{what}: {untrusted.text(text, 200)}")
    message = status.get("message")
    if isinstance(message, str) and message.strip():
        found.append(untrusted.text(message, 200))
    return tuple(found)


def with_drains(rows: Iterable[RabbitRow], drained: Mapping[str, str]) -> list[RabbitRow]:
    """The rows with the nodes each rabbit serves that Flux has drained (host -> reason, as
    ``resource.status`` gives them); reasons made readable, one line each."""
    return [
        replace(
            row,
            drained={h: untrusted.text(drained[h], 200) for h in row.nodes if h in drained},
        )
        for row in rows
    ]


def rabbit_rows(
    system_configuration: Mapping[str, Any] | None,
    storages: Iterable[Mapping[str, Any]],
    servers: Iterable[Mapping[str, Any]] = (),
    drift_threshold: int = Policy.capacity_drift,
) -> list[RabbitRow]:
    """Every rabbit the SystemConfiguration names (and any other Storage), sorted by name;
    ``drift_threshold``: ``[dws] capacity-drift``, in bytes."""
    storages, servers = list(storages), list(servers)
    spec = untrusted.mapping(untrusted.mapping(system_configuration).get("spec"))
    computes: dict[str, list[str]] = {}
    for node in untrusted.sequence(spec.get("storageNodes")):
        node = untrusted.mapping(node)
        name = node.get("name")
        if not isinstance(name, str) or not name or node.get("type", "Rabbit") != "Rabbit":
            continue
        hosts = computes.setdefault(untrusted.field(name, 253), [])
        for entry in untrusted.sequence(node.get("computesAccess")):
            host = untrusted.mapping(entry).get("name")
            if isinstance(host, str) and host:
                hosts.append(untrusted.field(host, 253))
    by_name = {untrusted.name_of(s): untrusted.mapping(s) for s in storages}
    by_name.pop(untrusted.UNKNOWN, None)
    held: dict[str, dict[tuple[str, str], int]] = {}
    for obj in servers:
        owner = _holder(obj)
        for rabbit, size in servers_held(obj).items():
            spot = held.setdefault(rabbit, {})
            spot[owner] = spot.get(owner, 0) + size
    drifts = capacity_drifts(storages, servers, drift_threshold)
    return [
        replace(
            _row(name, computes.get(name, []), by_name.get(name), held.get(name, {})),
            drift=drifts.get(name),
        )
        for name in sorted(set(computes) | set(by_name))
    ]


def _row(
    name: str,
    nodes: Sequence[str],
    storage: Mapping[str, Any] | None,
    held: Mapping[tuple[str, str], int],
) -> RabbitRow:
    jobs = sum(size for (kind, _), size in held.items() if kind == "Workflow")
    persistent_known = sum(size for (kind, _), size in held.items() if kind != "Workflow")
    holders = {owner: size for (_, owner), size in sorted(held.items())}
    if storage is None:
        return RabbitRow(name, tuple(nodes), "Disabled", "NotPresent", 0, jobs, 0, 0, (), holders)
    spec = untrusted.mapping(storage.get("spec"))
    status = untrusted.mapping(storage.get("status"))
    state = "Disabled" if spec.get("state") == "Disabled" else "Enabled"
    health = status.get("status")
    health = untrusted.field(health, 32) if isinstance(health, str) and health else "Unknown"
    devices = device_capacity(status)
    reported = _bytes(status.get("capacity"))
    if health != READY:  # what it reports is not there to be used; nothing is free
        total = reported if devices is None else devices
        persistent, free = persistent_known, 0
    elif devices is not None:
        total = devices
        free = min(reported, total)
        persistent = max(0, total - free - jobs)
    else:
        total = reported
        persistent = persistent_known
        free = max(0, total - jobs - persistent)
    return RabbitRow(
        name,
        tuple(nodes),
        state,
        health,
        total,
        jobs,
        persistent,
        free,
        _reasons(storage, status),
        holders,
    )


def serving(rows: Iterable[RabbitRow], host: str) -> RabbitRow | None:
    """The rabbit that serves compute node ``host``, or None."""
    return next((row for row in rows if host in row.nodes), None)


def job_allocation(servers: Iterable[Mapping[str, Any]], workflow: str) -> dict[str, int]:
    """Rabbit -> bytes the job's workflow holds on it, from its Servers resources."""
    found: dict[str, int] = {}
    for obj in servers:
        if _holder(obj) != ("Workflow", workflow):
            continue
        for rabbit, size in servers_held(obj).items():
            found[rabbit] = found.get(rabbit, 0) + size
    return found


__all__ = [
    "DISABLE_REASON",
    "DRAIN_REASON",
    "RabbitRow",
    "job_allocation",
    "rabbit_rows",
    "serving",
]
