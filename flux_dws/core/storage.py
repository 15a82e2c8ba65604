# SPDX-License-Identifier: LGPL-3.0-only
"""Storage sizing: DirectiveBreakdowns -> the job's storage needs and the Servers allocation.

Pure functions.  nnf-sos says in each DirectiveBreakdown what a directive needs (allocation
sets with a strategy and a minimum capacity); flux-dws puts a summary of that into the jobspec
before the job is scheduled, and once the job has its compute nodes it tells NNF which rabbits
serve each allocation set by writing the Servers resource (dws-api.md section 2).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.hostlist import encode_hostlist
from flux_dws.base.sizes import MAX_BYTES, MAX_COUNT, bounded_sum, ceil_div
from flux_dws.base.untrusted import ECHO_LIMIT, echo
from flux_dws.core import colocation

PER_COMPUTE = "AllocatePerCompute"
PER_SERVER = "AllocatePerServer"
ACROSS_SERVERS = "AllocateAcrossServers"
SINGLE_SERVER = "AllocateSingleServer"
STRATEGIES = (PER_COMPUTE, PER_SERVER, ACROSS_SERVERS, SINGLE_SERVER)
#: The allocation-set labels of a Lustre file system (nnf-sos's targets).
LUSTRE_LABELS = frozenset({"ost", "mdt", "mgt", "mgtmdt"})
#: The least nnf-sos allocates for one Lustre target: it raises a smaller Servers
#: allocationSize to this, so that its zpool can be made (nnf_storage_controller.go,
#: minimumLustreAllocationSizeInBytes).  The Servers plan and the reservation count it too
#: (flux_dws.core.jobspec.min_allocations), or the rabbit would hold more than they say.
NNF_LUSTRE_MIN_ALLOCATION = 4_000_000_000

#: The jobspec key flux-dws sets when it releases a job's dependency.
JOBSPEC_STORAGE_KEY = "attributes.system.dw_storage"


class StorageError(ValueError):
    """A breakdown or the system configuration does not allow an allocation; one line."""


class BreakdownPending(Exception):
    """A DirectiveBreakdown reports a recoverable error (severity Minor or Major) and is not
    ready: its driver is still retrying, so the read is tried again later (bounded by the
    state's timeout), never taken for a failure."""


#: DWS ResourceError severities that its drivers retry on their own (dws api, resource_error).
RECOVERABLE = frozenset({"Minor", "Major"})


@dataclass(frozen=True)
class AllocationNeed:
    """One allocation set of one breakdown: what NNF must allocate, and where it is recorded."""

    breakdown: str  # DirectiveBreakdown name
    servers: tuple[str, str]  # (namespace, name) of the Servers resource to write
    label: str  # raw, xfs, gfs2, mgt, mdt, mgtmdt, ost
    strategy: str
    capacity: int  # minimumCapacity in bytes
    count: int | None = None  # constraints.count, when the breakdown fixes the server count
    exclusive: tuple[str, ...] = ()  # constraints.colocation's exclusive keys (core.colocation)

    @property
    def keys(self) -> frozenset[str]:
        """The exclusive keys this set holds where it is placed (an MGT's always)."""
        return colocation.held_keys(self.label, self.exclusive)

    def to_json(self) -> dict[str, Any]:
        return {
            "breakdown": self.breakdown,
            "servers": list(self.servers),
            "label": self.label,
            "strategy": self.strategy,
            "capacity": self.capacity,
            "count": self.count,
            "exclusive": list(self.exclusive),
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
            exclusive=tuple(
                k for k in untrusted.sequence(data.get("exclusive")) if isinstance(k, str)
            ),
        )


def needs_from_breakdowns(breakdowns: Sequence[Any]) -> tuple[AllocationNeed, ...]:
    """Every allocation set of every breakdown; StorageError, one line naming the breakdown
    and the field, for one that reports an error or has a field of the wrong type or out of
    range, or when the sizes add up past an int64."""
    needs: list[AllocationNeed] = []
    for i, bd in enumerate(breakdowns):
        if not isinstance(bd, Mapping):
            raise StorageError(f"DirectiveBreakdown [{i}] must be an object, not {_kind(bd)}")
        meta = _mapping(bd, "metadata", f"DirectiveBreakdown [{i}]")
        name = meta.get("name")
        who = f"DirectiveBreakdown {echo(name) if isinstance(name, str) else f'[{i}]'}"
        status = _mapping(bd, "status", who)
        error = status.get("error")
        if error:
            severity = error.get("severity") if isinstance(error, Mapping) else None
            if severity not in RECOVERABLE:
                raise StorageError(f"{who}: {breakdown_error(error)}")
            if status.get("ready") is not True:
                raise BreakdownPending(f"{who} is not ready: {breakdown_error(error)}")
            # Ready with a recoverable error: a later reconcile of the driver hit trouble it
            # retries (nnf-sos: its cache a step behind, "already exists"); what it reported
            # when it became ready stands.
        storage = _mapping(status, "storage", f"{who}: status")
        if not storage:
            continue
        ref = _mapping(storage, "reference", f"{who}: status.storage")
        namespace, server = ref.get("namespace") or "", ref.get("name") or ""
        if not isinstance(namespace, str) or not isinstance(server, str):
            raise StorageError(f"{who}: status.storage.reference must name a Servers resource")
        if not server:
            raise StorageError(f"{who}: storage has no Servers reference")
        sets = storage.get("allocationSets") or []
        if not isinstance(sets, (list, tuple)):
            raise StorageError(f"{who}: status.storage.allocationSets must be a list")
        for j, aset in enumerate(sets):
            where = f"{who}: status.storage.allocationSets[{j}]"
            if not isinstance(aset, Mapping):
                raise StorageError(f"{where} must be an object, not {_kind(aset)}")
            strategy = aset.get("allocationStrategy")
            if strategy not in STRATEGIES:
                raise StorageError(f"{who}: unknown allocationStrategy {echo(strategy)}")
            capacity = aset.get("minimumCapacity")
            if untrusted.count(capacity, MAX_BYTES) is None:
                raise StorageError(
                    f"{where}: minimumCapacity {echo(capacity)} is not a size"
                    f" (0 to {MAX_BYTES} bytes)"
                )
            label = aset.get("label", "")
            if not isinstance(label, str):
                raise StorageError(f"{where}.label must be a string, not {_kind(label)}")
            constraints = _mapping(aset, "constraints", where)
            count = constraints.get("count")
            if count is not None and untrusted.count(count, MAX_COUNT) is None:
                raise StorageError(
                    f"{where}.constraints.count {echo(count)} is not a count (0 to {MAX_COUNT})"
                )
            exclusive, problem = colocation.parse_colocation(constraints.get("colocation"))
            if problem:
                raise StorageError(f"{where}.constraints.colocation{problem}")
            needs.append(
                AllocationNeed(
                    breakdown=name if isinstance(name, str) else f"[{i}]",
                    servers=(namespace, server),
                    label=label,
                    strategy=strategy,
                    capacity=capacity,
                    count=count if isinstance(count, int) and count > 0 else None,
                    exclusive=exclusive,
                )
            )
    jobspec_storage(needs)  # its sums go into dws-proposal and the release: int64, or refused
    return tuple(needs)


def breakdown_error(error: Any) -> str:
    """What the user is told of a DirectiveBreakdown's ``status.error`` (a DWS ResourceError:
    userMessage, debugMessage, type, severity): its user-facing message, never the debug
    detail, which is for the admin's logs."""
    if not isinstance(error, Mapping):
        return f"error {echo(error)}"
    kind, message = error.get("type"), error.get("userMessage")
    kind = kind if isinstance(kind, str) and kind else ""
    head = f"{untrusted.text(kind, 20)} error" if kind else "error"
    if isinstance(message, str) and message.strip():
        return f"{head}: {untrusted.text(message.strip(), 400)}"
    return f"{head} (DWS gave no user message; the admin can read the DirectiveBreakdown)"


def _mapping(data: Mapping[str, Any], key: str, who: str) -> Mapping[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise StorageError(f"{who}: {key} must be an object, not {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return type(value).__name__


def jobspec_storage(needs: Sequence[AllocationNeed]) -> dict[str, Any]:
    """The summary put into the jobspec: bytes per compute node and bytes shared, per label.

    A scheduler (or a site's jobspec policy) can read ``attributes.system.dw_storage`` to
    place the job near enough rabbit capacity; flux-dws itself only records it.
    """
    per_compute: dict[str, int] = {}
    shared: dict[str, int] = {}
    for need in needs:
        into = per_compute if need.strategy == PER_COMPUTE else shared
        into[need.label] = add_sizes(
            into.get(need.label, 0), need.capacity, f"{need.label} storage"
        )
    return {"per_compute": per_compute, "shared": shared}


def add_sizes(total: int, size: int, what: str) -> int:
    """``total + size``, or StorageError when the sum passes what Flux and DWS hold (int64):
    such a figure would be refused by the jobtap plugin's JSON parser, wedging the job."""
    try:
        return bounded_sum((total, size), what)
    except ValueError as exc:
        raise StorageError(f"the job's {exc}") from None


def rabbit_map(system_configuration: Mapping[str, Any] | None) -> dict[str, str]:
    """compute hostname -> rabbit name, from a DWS SystemConfiguration."""
    return compute_layout(system_configuration).rabbits


@dataclass(frozen=True)
class ComputeLayout:
    """What DWS's SystemConfiguration says of the compute nodes.

    ``rabbits``: each attached node's rabbit (``storageNodes[].computesAccess``).
    ``external``: its ``externalComputeNodes``, nodes "not directly matched with any of the
    StorageNodes".  DWS's controllers treat them as any compute (Computes just lists names);
    nnf-sos makes each a namespace for its ClientMounts, and mounts Lustre on them over the
    network, but a per-compute file system (xfs, gfs2, raw) needs the node's own rabbit.
    """

    rabbits: dict[str, str]
    external: frozenset[str] = frozenset()

    def covers(self, hosts: Sequence[str]) -> bool:
        """Does this say something of every one of ``hosts``?"""
        return all(h in self.rabbits or h in self.external for h in hosts)


def compute_layout(system_configuration: Mapping[str, Any] | None) -> ComputeLayout:
    """The :class:`ComputeLayout` of a DWS SystemConfiguration (none: an empty layout).

    A node both attached and listed external is attached: it has a rabbit."""
    mapping: dict[str, str] = {}
    config = untrusted.mapping(system_configuration)
    spec = config.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    for node in untrusted.sequence(spec.get("storageNodes")):  # a malformed entry serves nothing
        if not isinstance(node, Mapping) or not isinstance(node.get("name"), str):
            continue
        accesses = node.get("computesAccess")
        for access in untrusted.sequence(accesses):
            name = access.get("name") if isinstance(access, Mapping) else None
            if isinstance(name, str) and name and node["name"]:
                mapping[name] = node["name"]
    external = set()
    for node in untrusted.sequence(spec.get("externalComputeNodes")):
        name = node.get("name") if isinstance(node, Mapping) else None
        if isinstance(name, str) and name and name not in mapping:
            external.add(name)
    return ComputeLayout(mapping, frozenset(external))


def plan_servers(
    needs: Sequence[AllocationNeed],
    hosts: Sequence[str],
    rabbits: Mapping[str, str],
    min_allocation: Mapping[str, int] | None = None,
    external: Collection[str] = frozenset(),
    taken: Mapping[str, Collection[str]] | None = None,
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Servers (namespace, name) -> spec.allocationSets, for a job on ``hosts``.

    ``rabbits`` maps each host to its rabbit: the rabbits Fluxion allocated when the job's R
    says (flux_dws.core.rabbits.allocated_rabbits), else the SystemConfiguration.  As DWS expects:
    - AllocatePerCompute: one allocation per node, on that node's rabbit;
    - AllocateAcrossServers: over the job's rabbits, weighted by the job's nodes on each (the
      greatest common divisor of those counts makes the allocations as large as possible);
      with a ``count`` constraint, that many allocations on the rabbits with the most of the
      job's nodes, wrapping round when there are fewer rabbits than allocations;
    - AllocateSingleServer: exactly one, on the rabbit with the most of the job's nodes;
    - AllocatePerServer: one on each of the job's rabbits.
    ``min_allocation`` (label -> bytes) raises every allocation to the site's minimum.
    ``external`` are DWS's externalComputeNodes (:class:`ComputeLayout`): no rabbit of theirs
    holds anything, so storage other than Lustre is refused on them, and Lustre goes on the
    rabbits of its other nodes, as nnf-sos mounts Lustre on external nodes over the network.
    ``taken`` (rabbit -> exclusive colocation keys held there by other jobs and persistent
    storage, flux_dws.core.colocation) keeps apart the sets with an exclusive key (an MGT's
    ``lustre-mgt``): a set placed by count (single server, ``count``) gets each allocation on
    a rabbit of its own, the first of the job's rabbits, in the order above, where neither
    ``taken`` nor the job's earlier sets hold its key; a set of another strategy, which goes on
    every rabbit of the job, needs them all free of its key.  Otherwise StorageError, naming
    the key and the rabbits.
    What this puts on each rabbit never exceeds what :func:`reserve_per_node` had Fluxion
    reserve there.  A job with no allocation sets (``#DW container``, test-driver directives)
    needs no rabbit and gets no Servers.
    """
    if not needs:
        return {}
    if not hosts:
        raise StorageError("the job has no compute nodes to place storage near")
    missing = [h for h in hosts if h not in rabbits and h not in external]
    if missing:
        raise StorageError(
            f"no rabbit serves compute node {untrusted.text(missing[0], ECHO_LIMIT)}: the "
            "SystemConfiguration lists it under no rabbit's computesAccess, so it cannot have"
            " #DW storage"
        )
    outside = [h for h in hosts if h not in rabbits]
    if outside:
        _refuse_external(needs, hosts, outside)
    per_rabbit: dict[str, int] = {}
    for host in hosts:
        if host not in rabbits:
            continue
        per_rabbit[rabbits[host]] = per_rabbit.get(rabbits[host], 0) + 1
    for rabbit in sorted(per_rabbit):
        problem = untrusted.object_name_problem(rabbit, "rabbit name")
        if problem:
            raise StorageError(f"{problem}; Servers cannot name it")
    # Most of the job's nodes first; the name breaks ties, so a plan never depends on order.
    ranked = sorted(per_rabbit, key=lambda r: (-per_rabbit[r], r))
    plan: dict[tuple[str, str], list[dict[str, Any]]] = {}
    held = colocation.merge([{r: frozenset(k) for r, k in (taken or {}).items()}])
    for need in needs:
        floor = (min_allocation or {}).get(need.label, 0)
        storage, size = _placement(need, per_rabbit, ranked, len(hosts) - len(outside), floor, held)
        if need.keys:  # the job's later sets keep apart from this one too
            held = colocation.merge([held, {entry["name"]: need.keys for entry in storage}])
        allocations = sum(entry["allocationCount"] for entry in storage)
        if size * allocations > MAX_BYTES:  # nnf-sos adds them up in an int64
            raise StorageError(
                f"{need.label} storage of {allocations} allocations of {size} bytes adds up to"
                f" more than {MAX_BYTES} bytes"
            )
        plan.setdefault(need.servers, []).append(
            {"label": need.label, "allocationSize": size, "storage": storage}
        )
    return plan


def _refuse_external(
    needs: Sequence[AllocationNeed], hosts: Sequence[str], outside: Sequence[str]
) -> None:
    """StorageError unless the job's storage can be had on externalComputeNodes ``outside``:
    only Lustre's sets, and only with one node of the job on a rabbit to hold them."""
    node = untrusted.text(outside[0], ECHO_LIMIT)
    for need in needs:
        if need.label not in LUSTRE_LABELS:  # nnf-sos mounts only Lustre over the network
            raise StorageError(
                f"compute node {node} is one of the SystemConfiguration's"
                f" externalComputeNodes: no rabbit is attached to it, so it cannot have"
                f" {untrusted.text(need.label, ECHO_LIMIT)} storage (only Lustre reaches it)"
            )
    if len(outside) == len(hosts):
        raise StorageError(
            f"every compute node of the job ({node}"
            f"{f' and {len(outside) - 1} more' if len(outside) > 1 else ''}) is one of the"
            " SystemConfiguration's externalComputeNodes: no rabbit near the job can hold"
            " its storage"
        )


def _placement(
    need: AllocationNeed,
    per_rabbit: Mapping[str, int],
    ranked: Sequence[str],
    nnodes: int,
    floor: int,
    held: Mapping[str, frozenset[str]],
) -> tuple[list[dict[str, Any]], int]:
    """(Servers storage entries, allocation size) for one allocation set; ``held``: rabbit ->
    the exclusive keys already there.

    Integer arithmetic only, and no loop longer than the job's rabbits: a ``count`` comes
    from outside."""
    if need.strategy == SINGLE_SERVER or (need.count and need.strategy == ACROSS_SERVERS):
        count = _count_of(need)
        size = max(ceil_div(need.capacity, count), floor)
        if need.keys:  # one allocation a rabbit, never more: within what each node reserves
            free = [r for r in ranked if not held.get(r, frozenset()) & need.keys]
            if len(free) < count:
                raise StorageError(_held_elsewhere(need, count, ranked, free, held))
            return [{"name": r, "allocationCount": 1} for r in free[:count]], size
        rounds, extra = divmod(count, len(ranked))  # wraps onto the rabbits with most nodes
        storage = [
            {"name": r, "allocationCount": rounds + (1 if i < extra else 0)}
            for i, r in enumerate(ranked)
            if rounds or i < extra
        ]
        return storage, size
    if need.strategy in (PER_COMPUTE, PER_SERVER):
        each = need.strategy == PER_SERVER
        storage = [{"name": r, "allocationCount": 1 if each else per_rabbit[r]} for r in ranked]
        storage, size = sorted(storage, key=lambda e: e["name"]), max(need.capacity, floor)
    else:
        unit = math.gcd(*per_rabbit.values())
        storage = [
            {"name": r, "allocationCount": per_rabbit[r] // unit} for r in sorted(per_rabbit)
        ]
        size = max(ceil_div(need.capacity * unit, nnodes), floor)
    busy = [e["name"] for e in storage if held.get(e["name"], frozenset()) & need.keys]
    if busy:  # these strategies go on every rabbit of the job: no choice to make
        raise StorageError(
            f"the {_label(need)} allocation set ({need.strategy}) goes on every rabbit of the"
            f" job, and {_rabbits(busy)} already {'holds' if len(busy) == 1 else 'hold'} an"
            f" allocation of {_keys(need, busy, held)}"
        )
    return storage, size


def _label(need: AllocationNeed) -> str:
    return untrusted.text(need.label, ECHO_LIMIT)


def _rabbits(names: Sequence[str]) -> str:
    return untrusted.text(encode_hostlist(sorted(names)), 200)


def _keys(need: AllocationNeed, busy: Sequence[str], held: Mapping[str, frozenset[str]]) -> str:
    """The exclusive keys of ``need`` that rabbits ``busy`` hold, as a user reads them."""
    keys = sorted(set().union(*(held.get(r, frozenset()) & need.keys for r in busy)))
    shown = ", ".join(echo(k) for k in keys)
    mgt = " (a rabbit mounts one Lustre MGT)" if colocation.MGT_KEY in keys else ""
    return f"exclusive colocation key{'s' if len(keys) > 1 else ''} {shown}{mgt}"


def _held_elsewhere(
    need: AllocationNeed,
    count: int,
    ranked: Sequence[str],
    free: Sequence[str],
    held: Mapping[str, frozenset[str]],
) -> str:
    """Why a set placed by count with an exclusive key has too few rabbits of its own."""
    busy = [r for r in ranked if r not in free]
    wanted = "a rabbit" if count == 1 else f"{count} rabbits"
    if free:
        has = "has" if len(free) == 1 else "have"
        where = f"only {len(free)} of the job's {len(ranked)} rabbits {has} none ("
    else:
        where = "every one of the job's rabbits has one ("
    return (
        f"the {_label(need)} allocation set needs {wanted} of the job where no other"
        f" allocation holds {_keys(need, busy, held)}, and {where}{_rabbits(busy)}"
        f" {'holds' if len(busy) == 1 else 'hold'} one already: another job's, persistent"
        " storage's or another of this job's sets)"
    )


def _count_of(need: AllocationNeed) -> int:
    """Allocations of a set placed by count: one for AllocateSingleServer."""
    return 1 if need.strategy == SINGLE_SERVER else int(need.count or 1)


def reserve_per_node(need: AllocationNeed, nnodes: int, floor: int = 0) -> int:
    """Bytes each of the job's ``nnodes`` nodes has Fluxion reserve for ``need``, so that
    wherever Fluxion places the nodes, :func:`plan_servers` puts no more on a rabbit than its
    nodes reserved there (k nodes on a rabbit reserve k shares).

    The rewrite runs before placement, and a jobspec cannot ask for extra SSD on whichever
    rabbit gets a target, so each share is the most any one node can be charged:
    - per compute: the allocation (raised to ``floor``) on each node's rabbit;
    - per server: one allocation per rabbit, so a rabbit with one node bears it whole;
    - across servers: the weighted allocations come to at most ``max(ceil(C/N), floor)`` a
      node (an allocation for u nodes is ``ceil(C*u/N)``, at most ``u*ceil(C/N)``);
    - single server or ``count`` c (Lustre's MGT, an MDT with count 1): allocations of
      ``s = max(ceil(C/c), floor)`` dealt round the rabbits.  A rabbit may hold one of the
      job's nodes and ``ceil(c/2)`` of them (all c when the job has one node), so each node
      reserves that many.  For a 32 GiB MDT that is 32 GiB on every node: an over-reservation
      on the rabbits that do not get it, never an under-reservation on the one that does.
    """
    if nnodes < 1:
        raise StorageError("the job asks for no nodes to place storage near")
    if need.strategy in (PER_COMPUTE, PER_SERVER):
        return max(need.capacity, floor)
    if need.strategy == SINGLE_SERVER or need.count:
        count = _count_of(need)
        size = max(ceil_div(need.capacity, count), floor)
        return size * (count if nnodes == 1 else ceil_div(count, 2))
    return max(ceil_div(need.capacity, nnodes), floor)
