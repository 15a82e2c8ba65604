# SPDX-License-Identifier: LGPL-3.0-only
"""Rabbits in Fluxion's resource graph, as pure functions.

Fluxion schedules what its resource graph holds.  flux-dws writes the instance's R (RFC 20) with
a JGF ``scheduling`` key in which each rabbit is a vertex that contains its compute nodes and its
``ssd`` pool sized in GiB, so a jobspec asking for a node together with SSD capacity gets both
under the same rabbit.  Which nodes a rabbit serves comes from DWS's SystemConfiguration, its
health and devices from its Storage resource (dws-api.md section 7).  The job's own R, once
Fluxion allocated it, says which rabbits the job got (:func:`allocated_rabbits`).

A rabbit's pool is what Flux's jobs may have of it: its total device capacity, less what
storage made outside the WLM holds (:func:`outside_allocations`).  Storage ``status.capacity``
is *not* the total: nnf-sos copies it from NnfNode ``status.capacity``
(internal/controller/dws_storage_controller.go), which nnf_node_controller.go sets to nnf-ec's
``GuaranteedBytes``, the bytes still unallocated (nnf-ec pkg/manager-nnf/manager.go); the total
is the sum of ``status.devices[].capacity``, one entry per drive.

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
from flux_dws.base.sizes import MAX_BYTES
from flux_dws.core.colocation import ANNOTATION as EXCLUSIVE_ANNOTATION

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
class RabbitPool:
    """One rabbit as Fluxion's graph holds it: the compute nodes it serves, its ssd pool, and
    whether new jobs may have it.  Read strictly (a malformed Storage is a RabbitError), for
    the R an admin writes; the health monitor's reading of the same Storage, which never
    raises, is flux_dws.core.health.RabbitHealth."""

    name: str
    computes: tuple[str, ...]
    capacity: int  # bytes of the pool (total less outside allocations); 0 when none reported
    status: str  # Storage status.status ("NotPresent" when there is no Storage)
    enabled: bool  # Storage spec.state == Enabled
    free: int | None = None  # Storage status.capacity: bytes nnf-sos says are unallocated
    outside: int = 0  # bytes held by persistent and system storage (not Flux's to schedule)

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


#: Servers owned by these kinds hold storage that outlives any one job: a persistent file
#: system (nnf-sos nnf_persistentstorageinstance_controller.go creates its Servers) and system
#: storage (nnfsystemstorage_controller.go).  DWS labels every owned object with its owner's
#: kind (dws api owner_labels.go, ``OwnerKindLabel``).
OWNER_KIND_LABEL = "dataworkflowservices.github.io/owner.kind"
OUTSIDE_KINDS = frozenset({"PersistentStorageInstance", "NnfSystemStorage"})


def _count(value: Any) -> int:
    """A byte or allocation count from the API; 0 for anything else (untrusted)."""
    return untrusted.integer(value, 0) or 0


#: nnf-sos's finalizer on a Servers resource it manages (dws_servers_controller.go).
NNF_SERVERS_FINALIZER = "nnf.cray.hpe.com/nnf-servers"


def servers_awaiting_nnf(servers: Any) -> bool:
    """Whether nnf-sos manages this Servers and has not yet shown that it read its spec.

    nnf-sos's Setup reads the Servers from its informer cache and fails the job at once
    (Fatal: "Allocation request does not meet directive requirements") when the cache still
    holds the spec from before the WLM filled it in.  Its Servers controller, once its cache
    has the spec, writes ``status.allocationSets`` as a copy of the spec's labels and storage
    names (clearAllocationStatus): until that copy matches, asking for Setup races its cache.
    A Servers without nnf-sos's finalizer (another driver, or none) is never awaited.
    """
    if not isinstance(servers, Mapping):
        return False
    meta = untrusted.mapping(servers.get("metadata"))
    if NNF_SERVERS_FINALIZER not in untrusted.sequence(meta.get("finalizers")):
        return False

    def shape(sets: Any) -> list[tuple[Any, list[Any]]]:
        out = []
        for aset in untrusted.sequence(sets):
            aset = untrusted.mapping(aset)
            storage = aset.get("storage")
            if isinstance(storage, Mapping):  # status: a map by rabbit name
                names = sorted(str(k) for k in storage)
            else:  # spec: a list of {name, allocationCount}
                names = sorted(
                    str(untrusted.mapping(e).get("name")) for e in untrusted.sequence(storage)
                )
            out.append((aset.get("label"), names))
        return out

    spec = untrusted.mapping(servers.get("spec")).get("allocationSets")
    status = untrusted.mapping(servers.get("status")).get("allocationSets")
    return shape(spec) != shape(status)


def servers_held(servers: Mapping[str, Any]) -> dict[str, int]:
    """Rabbit -> bytes one Servers resource allocates (allocationSize x allocationCount per
    ``spec.allocationSets[].storage[]``, as nnf_storage_controller.go sizes each rabbit's
    allocation); malformed entries count nothing."""
    held: dict[str, int] = {}
    spec = untrusted.mapping(untrusted.mapping(servers).get("spec"))
    for aset in untrusted.sequence(spec.get("allocationSets")):
        aset = untrusted.mapping(aset)
        size = _count(aset.get("allocationSize"))
        for entry in untrusted.sequence(aset.get("storage")):
            entry = untrusted.mapping(entry)
            name = entry.get("name")
            if isinstance(name, str) and name:
                count = untrusted.count(entry.get("allocationCount"))  # absent: one
                held[name] = held.get(name, 0) + size * (1 if count is None else count)
    return held


def servers_kept(servers: Mapping[str, Any]) -> dict[str, Any]:
    """What health and the Servers plan read of a Servers (its identity and labels, and
    ``spec``: servers_held, owner_kind; the exclusive keys flux-dws wrote on it,
    flux_dws.core.colocation), sharing values with ``servers``: a watch holds one per
    workflow, and its status and owner references would double that.  Never raises."""
    out: dict[str, Any] = {k: servers[k] for k in ("apiVersion", "kind", "spec") if k in servers}
    meta = servers.get("metadata")
    if isinstance(meta, Mapping):
        keys = ("name", "namespace", "uid", "resourceVersion", "labels")
        out["metadata"] = {k: meta[k] for k in keys if k in meta}
        annotations = meta.get("annotations")
        if isinstance(annotations, Mapping) and EXCLUSIVE_ANNOTATION in annotations:
            out["metadata"]["annotations"] = {
                EXCLUSIVE_ANNOTATION: annotations[EXCLUSIVE_ANNOTATION]
            }
    elif meta is not None:
        out["metadata"] = meta
    return out


def owner_kind(obj: Any) -> str | None:
    labels = untrusted.mapping(
        untrusted.mapping(untrusted.mapping(obj).get("metadata")).get("labels")
    )
    kind = labels.get(OWNER_KIND_LABEL)
    return kind if isinstance(kind, str) else None


def outside_allocations(servers: Iterable[Any]) -> dict[str, int]:
    """Rabbit -> bytes held by persistent and system storage (Servers owned by a
    PersistentStorageInstance or an NnfSystemStorage): never in Flux's pool."""
    held: dict[str, int] = {}
    for obj in servers:
        if owner_kind(obj) in OUTSIDE_KINDS:
            for rabbit, size in servers_held(obj).items():
                held[rabbit] = held.get(rabbit, 0) + size
    return held


def device_capacity(status: Mapping[str, Any]) -> int | None:
    """Sum of ``status.devices[].capacity`` (nnf-sos writes 0 for a drive that is not Ready);
    None when the Storage lists no device with a capacity."""
    sizes = [
        _count(untrusted.mapping(d).get("capacity"))
        for d in untrusted.sequence(status.get("devices"))
    ]
    return sum(sizes) if any(sizes) else None


def rabbit_inventory(
    system_configuration: Mapping[str, Any],
    storages: Iterable[Mapping[str, Any]],
    servers: Iterable[Any] = (),
) -> dict[str, RabbitPool]:
    """Rabbit name -> RabbitPool, from the SystemConfiguration, the Storage resources and every
    Servers resource (whose persistent and system storage shrink the pools)."""
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
    outside = outside_allocations(servers)
    rabbits: dict[str, RabbitPool] = {}
    for node in nodes:
        if not isinstance(node, Mapping) or not isinstance(node.get("name"), str):
            raise RabbitError("SystemConfiguration storageNodes entry without a name")
        if node.get("type", "Rabbit") != "Rabbit":
            continue
        problem = untrusted.object_name_problem(node["name"], "SystemConfiguration rabbit")
        if problem:
            raise RabbitError(problem)
        access = node.get("computesAccess") or []
        if not isinstance(access, list):
            raise RabbitError(f"SystemConfiguration {node['name']}: computesAccess is not a list")
        computes = []
        for entry in access:
            name = entry.get("name") if isinstance(entry, Mapping) else None
            if not isinstance(name, str) or not name:
                raise RabbitError(f"SystemConfiguration {node['name']}: compute without a name")
            computes.append(name)
        rabbits[node["name"]] = _rabbit(
            node["name"], computes, by_storage.get(node["name"]), outside.get(node["name"], 0)
        )
    return rabbits


def _rabbit(
    name: str, computes: Sequence[str], storage: Mapping[str, Any] | None, outside: int = 0
) -> RabbitPool:
    if storage is None:
        return RabbitPool(name, tuple(computes), 0, "NotPresent", False)
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
    # the total is the drives' sum; a Storage without devices (an older simulator, or nnf-sos
    # before it listed the drives) only has status.capacity, the best figure there is
    total = device_capacity(status)
    pool = max(0, (capacity if total is None else total) - outside)
    return RabbitPool(name, tuple(computes), pool, health or "Unknown", enabled, capacity, outside)


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


#: Vertex metadata Fluxion fills in when a JGF vertex leaves it out (flux-sched's JGF reader,
#: ``apply_defaults``, since 0.39): written only where a vertex differs.  Fluxion parses R's
#: JSON several times on load (flux-core hands it over in resource.acquire, Fluxion prints
#: the graph back out and reads it again), so every key costs load time on every vertex.
_DEFAULTS = {"rank": -1, "exclusive": False, "unit": "", "size": 1, "status": 0}


class _Graph:
    """JGF nodes and edges with ids handed out in order: the same input, the same bytes.

    Compact: a vertex carries ``uniq_id`` only as its JGF ``id``, ``basename`` only as its
    type, and none of :data:`_DEFAULTS`; an edge is containment, Fluxion's default
    subsystem, so it carries no metadata.  At El Capitan's size this is 40% fewer bytes and
    about 40% less CPU for Fluxion to load the graph (doc/guide/admin.rst, Scheduling rabbits
    with Fluxion)."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.edges: list[dict[str, Any]] = []

    def add(self, parent: dict[str, Any] | None, type_: str, name: str, **meta: Any) -> dict:
        uniq = len(self.nodes)
        base = parent["metadata"]["paths"]["containment"] if parent else ""
        metadata: dict[str, Any] = {"type": type_, "name": name, "id": meta.pop("id", uniq)}
        for key, default in _DEFAULTS.items():
            value = meta.pop(key, default)
            if value != default or type(value) is not type(default):
                metadata[key] = value
        metadata["paths"] = {"containment": f"{base}/{name}"}
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
            self.edges.append({"source": parent["id"], "target": vertex["id"]})
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


def excluded_hosts(R: Mapping[str, Any], exclude: str | None) -> frozenset[str]:
    """The hosts of R that flux-core's ``[resource] exclude`` names: an idset of ranks
    ("0-1") or a hostlist ("compute[01-02]"), as flux-core takes it."""
    if not exclude:
        return frozenset()
    nodes = _nodes_of(R)
    try:
        if exclude.replace(",", "").replace("-", "").isdigit():
            ranks = set(expand_idset(exclude))
            return frozenset(n.host for n in nodes if n.rank in ranks)
        return frozenset(expand_hostlist(exclude))
    except HostlistError as exc:
        raise RabbitError(f"resource.exclude {exclude!r} cannot be read: {exc}") from None


#: The most parts a pool is split into: each is a vertex Fluxion matches against.
MAX_CHUNKS = 4096


def _check_sizes(rabbits: Iterable[RabbitPool]) -> None:
    """RabbitError for a capacity flux-core or Fluxion could not load: every size in JGF, and
    their sum that Fluxion keeps per subtree, must be an int64."""
    total = 0
    for rabbit in rabbits:
        if untrusted.count(rabbit.capacity, MAX_BYTES) is None:
            raise RabbitError(
                f"Storage {untrusted.text(rabbit.name, untrusted.ECHO_LIMIT)}: capacity "
                f"{untrusted.echo(rabbit.capacity)} is not a byte count from 0 to {MAX_BYTES}"
            )
        total += rabbit.gib
    if total > MAX_BYTES:
        raise RabbitError(f"the rabbits' capacities add up to more than {MAX_BYTES} GiB")


def resource_graph(
    R: Mapping[str, Any],
    rabbits: Mapping[str, RabbitPool],
    cluster: str = "cluster0",
    chunks: int = DEFAULT_CHUNKS,
    exclude: Iterable[str] = (),
) -> dict[str, Any]:
    """A copy of ``R`` whose ``scheduling`` key holds the rabbit-aware JGF.

    Each rabbit serving at least one node of R becomes a ``chassis`` vertex holding those nodes
    and its SSD pool: ``chunks`` ``ssd`` vertices (at least one per node it holds) whose GiB add
    up to its capacity, down unless the rabbit is usable.  Nodes that no rabbit serves stay
    directly under the cluster.  Properties (and so queues) are kept.  Hosts in ``exclude``
    (flux-core's ``[resource] exclude``) are left out of the graph: flux-core takes them out of
    the R it gives the scheduler, and Fluxion, which schedules from the graph, must not see
    them either; a rabbit left with none of R's nodes gets no vertex.
    """
    if not 1 <= chunks <= MAX_CHUNKS:
        raise RabbitError(f"chunks must be from 1 to {MAX_CHUNKS}, not {chunks}")
    _check_sizes(rabbits.values())
    left_out = set(exclude)
    nodes = [n for n in _nodes_of(R) if n.host not in left_out]
    served: dict[str, str] = {}
    for rabbit in sorted(rabbits.values(), key=lambda r: r.name):
        for host in rabbit.computes:
            if host in served:
                raise RabbitError(
                    f"compute {host} is served by both {served[host]} and {rabbit.name}"
                )
            served[host] = rabbit.name
    graph = _Graph()
    root = graph.add(None, "cluster", cluster, id=0)
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


@dataclass(frozen=True)
class _Vertex:
    type: Any
    name: str  # metadata.name, else the last part of its path
    path: str
    size: int  # metadata.size (Fluxion leaves it out when it is 1)
    exclusive: bool


def _jgf_vertices(R: Any) -> list[_Vertex] | None:
    """Each vertex of R's scheduling JGF that has a containment path; None when R carries no
    vertex list.  Fluxion's JGF writer leaves out ``name`` when it is basename + id, and
    ``size`` when it is 1 (resource/writers/match_writers.cpp, ``emit_vtx_base``), so the
    path's last part names a vertex and 1 is its size then.  R is untrusted: anything else
    is skipped."""
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
            name = meta.get("name")
            name = name if isinstance(name, str) and name else posixpath.basename(path)
            size = meta.get("size", 1)
            found.append(
                _Vertex(
                    meta.get("type"),
                    name,
                    path,
                    untrusted.integer(size, 0) or 0,
                    meta.get("exclusive") is True,
                )
            )
    return found


def _hosts_of(R: Any) -> list[str]:
    execution = untrusted.mapping(untrusted.mapping(R).get("execution"))
    try:
        return [
            h for e in untrusted.sequence(execution.get("nodelist")) for h in expand_hostlist(e)
        ]
    except (HostlistError, TypeError):
        return []


def allocated_rabbits(
    R: Mapping[str, Any] | None, served: Mapping[str, str] | None = None
) -> dict[str, list[str]] | None:
    """Rabbit -> the job's hosts under it, from the JGF Fluxion wrote into the job's R.

    A rabbit is the parent of an ``ssd`` vertex; a node under the same parent is served by it.
    None when R carries no ssd at all (not scheduled with rabbits).  Paths, not edges, are
    read, so a writer that leaves out the ancestors' vertices still gives the answer.

    Fluxion's ``rv1_shorthand`` (writer ``fluxion:jgf_shorthand``) leaves out every vertex
    under one allocated exclusively: a job given a whole rabbit shows its chassis alone.
    Such a rabbit's hosts are R's own (``execution.nodelist``) that ``served`` (host ->
    rabbit, from the SystemConfiguration) gives it.
    """
    vertices = _jgf_vertices(R) or []
    ssd_parents = {posixpath.dirname(v.path) for v in vertices if v.type == SSD_TYPE}
    whole = sorted({v.name for v in vertices if v.type == RABBIT_TYPE and v.exclusive})
    if not ssd_parents and not whole:
        return None
    found: dict[str, list[str]] = {}
    for v in vertices:
        parent = posixpath.dirname(v.path)
        if v.type == "node" and parent in ssd_parents:
            found.setdefault(posixpath.basename(parent), []).append(v.name)
    for rabbit in whole:
        if rabbit not in found:
            hosts = [h for h in _hosts_of(R) if (served or {}).get(h) == rabbit]
            found[rabbit] = hosts
    return found


def ssd_parts(R: Any) -> dict[str, tuple[tuple[str, int], ...]]:
    """Rabbit -> (containment path, GiB) of each of its ssd vertices, by path."""
    found: dict[str, list[tuple[str, int]]] = {}
    for v in _jgf_vertices(R) or []:
        if v.type == SSD_TYPE:
            found.setdefault(posixpath.basename(posixpath.dirname(v.path)), []).append(
                (v.path, v.size)
            )
    return {rabbit: tuple(sorted(parts)) for rabbit, parts in found.items()}


def node_paths(R: Any) -> dict[str, str]:
    """Host -> containment path of its ``node`` vertex in R's scheduling JGF (where Fluxion
    sets a node's properties)."""
    return {v.name: v.path for v in _jgf_vertices(R) or [] if v.type == "node"}


def parts_to_hold(parts: Sequence[tuple[str, int]], hold: int) -> tuple[str, ...]:
    """The paths of the fewest parts, taken from the end, whose GiB cover ``hold`` bytes
    (every part when they do not): what to mark down so Fluxion cannot hand out capacity the
    rabbit does not have.  Fluxion keeps a job's allocation on a part marked down, so a part
    already in use is only kept from the next job."""
    if hold <= 0:
        return ()
    taken: list[str] = []
    covered = 0
    for path, gib in reversed(parts):
        if covered >= hold:
            break
        taken.append(path)
        covered += gib * GIB
    return tuple(sorted(taken))


__all__ = [
    "NNF_SERVERS_FINALIZER",
    "servers_awaiting_nnf",
    "DEFAULT_CHUNKS",
    "GIB",
    "RABBIT_TYPE",
    "SSD_TYPE",
    "RabbitPool",
    "RabbitError",
    "allocated_rabbits",
    "device_capacity",
    "excluded_hosts",
    "node_paths",
    "outside_allocations",
    "parts_to_hold",
    "rabbit_inventory",
    "servers_held",
    "resource_graph",
    "ssd_parts",
]
