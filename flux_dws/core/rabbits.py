# SPDX-License-Identifier: LGPL-3.0-only
"""Rabbits in Fluxion's resource graph, as pure functions.

Fluxion schedules what its resource graph holds.  flux-dws writes the instance's R (RFC 20) with
a JGF ``scheduling`` key in which each rabbit is a vertex that contains its compute nodes and its
``ssd`` pool sized in GiB, so a jobspec asking for a node together with SSD capacity gets both
under the same rabbit.  Which nodes a rabbit serves comes from DWS's SystemConfiguration, its
capacity and health from its Storage resource (dws-api.md section 7).  The job's own R, once
Fluxion allocated it, says which rabbits the job got (:func:`allocated_rabbits`).

Everything read from Kubernetes or from R is untrusted: a malformed object is a
:class:`RabbitError` with one line naming it.
"""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.hostlist import HostlistError, expand_hostlist, expand_idset

GIB = 2**30
#: The vertex type of a rabbit: a chassis, as in the existing Flux integration's graph, so the
#: jobspecs its users submit (``chassis x C -> node x n``) keep working.  Its name is the
#: rabbit's, and its ``rabbit`` property names it too.
RABBIT_TYPE = "chassis"
SSD_TYPE = "ssd"
#: Storage status.status of a rabbit that may take new allocations.
READY = "Ready"


class RabbitError(ValueError):
    """A SystemConfiguration, Storage or R that cannot be used; one line naming it."""


@dataclass(frozen=True)
class Rabbit:
    """One rabbit: the compute nodes it serves, its capacity and its health."""

    name: str
    computes: tuple[str, ...]
    capacity: int  # bytes; 0 when DWS reports none
    status: str  # Storage status.status ("NotPresent" when there is no Storage)
    enabled: bool  # Storage spec.state == Enabled

    @property
    def usable(self) -> bool:
        """May new jobs get this rabbit's storage?"""
        return self.enabled and self.status == READY

    @property
    def gib(self) -> int:
        return self.capacity // GIB


def _name(obj: Mapping[str, Any], what: str) -> str:
    name = untrusted.mapping(untrusted.mapping(obj).get("metadata")).get("name")
    if not isinstance(name, str) or not name:
        raise RabbitError(f"{what} without a metadata.name")
    return untrusted.field(name)


def rabbit_inventory(
    system_configuration: Mapping[str, Any], storages: Iterable[Mapping[str, Any]]
) -> dict[str, Rabbit]:
    """Rabbit name -> Rabbit, from the SystemConfiguration and the Storage resources."""
    if not isinstance(system_configuration, Mapping):
        raise RabbitError("SystemConfiguration is not an object")
    spec = system_configuration.get("spec") or {}
    nodes = spec.get("storageNodes") if isinstance(spec, Mapping) else None
    if not isinstance(nodes, list):
        raise RabbitError("SystemConfiguration spec.storageNodes is not a list")
    by_storage: dict[str, Mapping[str, Any]] = {}
    for storage in storages:
        if not isinstance(storage, Mapping):
            raise RabbitError("a Storage resource is not an object")
        by_storage[_name(storage, "a Storage resource")] = storage
    rabbits: dict[str, Rabbit] = {}
    for node in nodes:
        if not isinstance(node, Mapping) or not isinstance(node.get("name"), str):
            raise RabbitError("SystemConfiguration storageNodes entry without a name")
        if node.get("type", "Rabbit") != "Rabbit":
            continue
        access = node.get("computesAccess") or []
        if not isinstance(access, list):
            raise RabbitError(f"SystemConfiguration {node['name']}: computesAccess is not a list")
        computes = []
        for entry in access:
            name = entry.get("name") if isinstance(entry, Mapping) else None
            if not isinstance(name, str) or not name:
                raise RabbitError(f"SystemConfiguration {node['name']}: compute without a name")
            computes.append(name)
        rabbits[node["name"]] = _rabbit(node["name"], computes, by_storage.get(node["name"]))
    return rabbits


def _rabbit(name: str, computes: Sequence[str], storage: Mapping[str, Any] | None) -> Rabbit:
    if storage is None:
        return Rabbit(name, tuple(computes), 0, "NotPresent", False)
    spec = storage.get("spec") or {}
    status = storage.get("status") or {}
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        raise RabbitError(f"Storage {name}: spec or status is not an object")
    capacity = status.get("capacity", 0)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise RabbitError(f"Storage {name}: status.capacity {capacity!r} is not a byte count")
    health = status.get("status", "Unknown")
    if not isinstance(health, str):
        raise RabbitError(f"Storage {name}: status.status is not a string")
    enabled = spec.get("state", "Enabled") == "Enabled"
    return Rabbit(name, tuple(computes), capacity, health or "Unknown", enabled)


# ---- writing the graph -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Node:
    rank: int
    host: str
    children: Mapping[str, list[int]]  # core/gpu -> ids
    properties: tuple[str, ...]


def _nodes_of(R: Mapping[str, Any]) -> list[_Node]:
    """The nodes of an RFC 20 R, in rank order, with their children and properties."""
    execution = R.get("execution") if isinstance(R, Mapping) else None
    if not isinstance(execution, Mapping):
        raise RabbitError("R has no execution object")
    try:
        hosts = [h for entry in execution.get("nodelist") or [] for h in expand_hostlist(entry)]
        children: dict[int, dict[str, list[int]]] = {}
        for entry in execution.get("R_lite") or []:
            kids = {str(k): expand_idset(str(v)) for k, v in (entry.get("children") or {}).items()}
            for rank in expand_idset(str(entry["rank"])):
                children[rank] = kids
        props: dict[int, list[str]] = {}
        for name, idset in sorted((execution.get("properties") or {}).items()):
            for rank in expand_idset(str(idset)):
                props.setdefault(rank, []).append(str(name))
    except (HostlistError, KeyError, TypeError, AttributeError) as exc:
        raise RabbitError(f"R cannot be read: {exc}") from None
    ranks = sorted(children)
    if len(hosts) != len(ranks):
        raise RabbitError(f"R has {len(ranks)} ranks in R_lite but {len(hosts)} hosts in nodelist")
    return [
        _Node(rank, hosts[i], children[rank], tuple(props.get(rank, ())))
        for i, rank in enumerate(ranks)
    ]


class _Graph:
    """JGF nodes and edges with ids handed out in order: the same input, the same bytes."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.edges: list[dict[str, Any]] = []

    def add(self, parent: dict[str, Any] | None, type_: str, name: str, **meta: Any) -> dict:
        uniq = len(self.nodes)
        base = parent["metadata"]["paths"]["containment"] if parent else ""
        metadata = {
            "type": type_,
            "basename": meta.pop("basename", type_),
            "name": name,
            "id": meta.pop("id", uniq),
            "uniq_id": uniq,
            "rank": meta.pop("rank", -1),
            "exclusive": meta.pop("exclusive", False),
            "unit": meta.pop("unit", ""),
            "size": meta.pop("size", 1),
            "status": meta.pop("status", 0),
            "paths": {"containment": f"{base}/{name}"},
        }
        properties = meta.pop("properties", None)
        if properties:
            metadata["properties"] = (
                dict(properties)
                if isinstance(properties, Mapping)
                else dict.fromkeys(properties, "")
            )
        assert not meta, meta
        vertex = {"id": str(uniq), "metadata": metadata}
        self.nodes.append(vertex)
        if parent is not None:
            self.edges.append(
                {
                    "source": parent["id"],
                    "target": vertex["id"],
                    "metadata": {"subsystem": "containment"},
                }
            )
        return vertex

    def add_node(self, parent: dict[str, Any], node: _Node) -> None:
        vertex = self.add(
            parent, "node", node.host, rank=node.rank, id=node.rank, properties=node.properties
        )
        for kind in sorted(node.children):
            for index in node.children[kind]:
                self.add(vertex, kind, f"{kind}{index}", id=index, rank=node.rank, exclusive=True)


#: Parts each rabbit's SSD pool is split into.  Fluxion gives a vertex inside a jobspec slot
#: to one slot only, so a pool shared by a rabbit's nodes must be several vertices: a slot
#: takes as many parts as its GiB need, and a part never holds more than one job's data.
#: More parts waste less (a node's request rounds up to whole parts) and cost match time.
DEFAULT_CHUNKS = 36


def _chunks(gib: int, parts: int) -> list[int]:
    """``gib`` split into ``parts`` sizes that differ by at most one and add up to it."""
    base, extra = divmod(gib, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def resource_graph(
    R: Mapping[str, Any],
    rabbits: Mapping[str, Rabbit],
    cluster: str = "cluster0",
    chunks: int = DEFAULT_CHUNKS,
) -> dict[str, Any]:
    """A copy of ``R`` whose ``scheduling`` key holds the rabbit-aware JGF.

    Each rabbit serving at least one node of R becomes a ``chassis`` vertex holding those nodes
    and its SSD pool: ``chunks`` ``ssd`` vertices (at least one per node it holds) whose GiB add
    up to its capacity, down unless the rabbit is usable.  Nodes that no rabbit serves stay
    directly under the cluster.  Properties (and so queues) are kept.
    """
    if chunks < 1:
        raise RabbitError(f"chunks must be at least 1, not {chunks}")
    nodes = _nodes_of(R)
    served: dict[str, str] = {}
    for rabbit in sorted(rabbits.values(), key=lambda r: r.name):
        for host in rabbit.computes:
            if host in served:
                raise RabbitError(
                    f"compute {host} is served by both {served[host]} and {rabbit.name}"
                )
            served[host] = rabbit.name
    graph = _Graph()
    root = graph.add(None, "cluster", cluster, id=0, basename="cluster")
    ssd_id = 0
    held_by: dict[str, list[Any]] = {}  # rabbit -> its nodes, in R's order: one walk of R
    for node in nodes:
        if node.host in served:
            held_by.setdefault(served[node.host], []).append(node)
    for index, name in enumerate(sorted(held_by)):
        rabbit = rabbits[name]
        held = held_by[name]
        vertex = graph.add(root, RABBIT_TYPE, name, id=index, properties={"rabbit": name})
        for size in _chunks(rabbit.gib, max(chunks, len(held))):
            status = 0 if rabbit.usable else 1
            graph.add(
                vertex, SSD_TYPE, f"ssd{ssd_id}", id=ssd_id, unit="GiB", size=size, status=status
            )
            ssd_id += 1
        for node in held:
            graph.add_node(vertex, node)
    for node in nodes:
        if node.host not in served:
            graph.add_node(root, node)
    out = copy.deepcopy(dict(R))
    out["scheduling"] = {"graph": {"nodes": graph.nodes, "edges": graph.edges}}
    return out


# ---- reading an allocation -------------------------------------------------------------------


def _jgf_vertices(R: Any) -> list[tuple[Any, Any, str]] | None:
    """(type, name, containment path) of each vertex of R's scheduling JGF that has a path;
    None when R carries no vertex list.  R is untrusted: anything else is skipped."""
    scheduling = R.get("scheduling") if isinstance(R, Mapping) else None
    graph = scheduling.get("graph") if isinstance(scheduling, Mapping) else None
    vertices = graph.get("nodes") if isinstance(graph, Mapping) else None
    if not isinstance(vertices, list):
        return None
    found = []
    for vertex in vertices:
        meta = vertex.get("metadata") if isinstance(vertex, Mapping) else None
        paths = meta.get("paths") if isinstance(meta, Mapping) else None
        path = paths.get("containment") if isinstance(paths, Mapping) else None
        if isinstance(path, str):
            found.append((meta.get("type"), meta.get("name"), path))
    return found


def allocated_rabbits(R: Mapping[str, Any] | None) -> dict[str, list[str]] | None:
    """Rabbit -> the job's hosts under it, from the JGF Fluxion wrote into the job's R.

    A rabbit is the parent of an ``ssd`` vertex; a node under the same parent is served by it.
    None when R carries no ssd at all (not scheduled with rabbits).  Paths, not edges, are
    read, so a writer that leaves out the ancestors' vertices still gives the answer.
    """
    vertices = _jgf_vertices(R) or []
    ssd_parents = {posixpath.dirname(p) for kind, _, p in vertices if kind == SSD_TYPE}
    if not ssd_parents:
        return None
    found: dict[str, list[str]] = {}
    for kind, name, path in vertices:
        parent = posixpath.dirname(path)
        if kind == "node" and isinstance(name, str) and parent in ssd_parents:
            found.setdefault(posixpath.basename(parent), []).append(name)
    return found


def ssd_paths(R: Any) -> dict[str, tuple[str, ...]]:
    """Rabbit -> the containment paths of its ssd vertices (to mark them up or down)."""
    found: dict[str, list[str]] = {}
    for kind, _, path in _jgf_vertices(R) or []:
        if kind == SSD_TYPE:
            found.setdefault(posixpath.basename(posixpath.dirname(path)), []).append(path)
    return {rabbit: tuple(sorted(paths)) for rabbit, paths in found.items()}


__all__ = [
    "DEFAULT_CHUNKS",
    "GIB",
    "RABBIT_TYPE",
    "SSD_TYPE",
    "Rabbit",
    "RabbitError",
    "allocated_rabbits",
    "rabbit_inventory",
    "resource_graph",
    "ssd_paths",
]
