# SPDX-License-Identifier: LGPL-3.0-only
"""A #DW job's resources rewritten for Fluxion: every node with its share of rabbit SSD.

Pure functions.  Once Proposal is ready, nnf-sos has said in the DirectiveBreakdowns what the
job's storage needs (:class:`flux_dws.core.storage.AllocationNeed`).  With rabbits in the resource
graph (:mod:`flux_dws.core.rabbits`), the dependency release replaces the job's top-level ``node``
request by ``slot[rabbit] x N -> (node x 1, ssd x G)``: Fluxion then gives each node G GiB of
SSD from a pool under the same rabbit.  G follows the rule the Servers plan keeps to
(:func:`flux_dws.core.storage.reserve_per_node`): per-compute file systems (xfs, gfs2, raw)
count in full on every node, Lustre OSTs are spread over the job's nodes, and a target DWS puts
on one rabbit (an MGT or MDT) counts in full on every node, since the rabbit that gets it is
not known before placement.  The site's limits
(``[dws.storage.<type>]``) bound what one node may ask for and round each allocation up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flux_dws.base.sizes import MAX_BYTES, MAX_COUNT, ceil_div
from flux_dws.core.directives import Directive, parse_size
from flux_dws.core.rabbits import GIB, SSD_TYPE
from flux_dws.core.storage import (
    JOBSPEC_STORAGE_KEY,
    LUSTRE_LABELS,
    NNF_LUSTRE_MIN_ALLOCATION,
    PER_COMPUTE,
    AllocationNeed,
    StorageError,
    add_sizes,
    jobspec_storage,
    reserve_per_node,
)

#: File-system types a site may bound, and the allocation-set labels that count as each.
FS_TYPES = ("xfs", "gfs2", "raw", "lustre")
#: The label of the slot that pairs a node with its SSD share.
RABBIT_SLOT = "rabbit"


@dataclass(frozen=True)
class StorageLimit:
    """A site's bounds for one file-system type, in bytes."""

    max_per_node: int | None = None  # None: no maximum
    min_allocation: int = 0


NO_LIMIT = StorageLimit()


def fs_type(label: str) -> str:
    """The file-system type an allocation-set label belongs to."""
    return "lustre" if label in LUSTRE_LABELS else label


def _gib(size: int) -> int:
    return ceil_div(size, GIB)


def _show(size: int) -> str:
    return f"{_gib(size)} GiB" if size % GIB == 0 or size > GIB else f"{size} bytes"


def check_per_node(per_node: Mapping[str, int], limits: Mapping[str, StorageLimit]) -> None:
    """StorageError naming the type, the amount and the maximum for the first type over it."""
    for fs in FS_TYPES:
        asked = per_node.get(fs, 0)
        limit = limits.get(fs, NO_LIMIT).max_per_node
        if limit is not None and asked > limit:
            raise StorageError(
                f"{fs} storage of {_show(asked)} per node is over the site maximum of "
                f"{_show(limit)} per node"
            )


def bytes_per_node(
    needs: Sequence[AllocationNeed], nnodes: int, limits: Mapping[str, StorageLimit]
) -> dict[str, int]:
    """File-system type -> bytes each of the job's ``nnodes`` nodes needs.

    Each allocation is first raised to its type's minimum allocation; per-compute sets count in
    full per node, every other set (Lustre) is shared out over the nodes, rounded up.
    """
    if nnodes < 1:
        raise StorageError("the job asks for no nodes to place storage near")
    per_node: dict[str, int] = {}
    for need in needs:
        fs = fs_type(need.label)
        size = max(need.capacity, limits.get(fs, NO_LIMIT).min_allocation)
        share = size if need.strategy == PER_COMPUTE else ceil_div(size, nnodes)
        per_node[fs] = add_sizes(per_node.get(fs, 0), share, f"{fs} storage per node")
    return per_node


def reserved_gib(
    needs: Sequence[AllocationNeed], nnodes: int, limits: Mapping[str, StorageLimit]
) -> int:
    """GiB of SSD each of the job's ``nnodes`` nodes reserves in Fluxion: the sum of
    :func:`flux_dws.core.storage.reserve_per_node` over the needs, the one rule the Servers
    plan keeps to.  It may be more than :func:`bytes_per_node` (what the site's per-node
    limits are checked against): a Lustre MGT or MDT counts in full on every node."""
    least = min_allocations(limits)
    total = 0
    for need in needs:
        share = reserve_per_node(need, nnodes, least.get(need.label, 0))
        total = add_sizes(total, share, "rabbit storage per node")
    return _gib(total)


def directive_bytes_per_node(
    directives: Sequence[Directive], nnodes: int | None, limits: Mapping[str, StorageLimit]
) -> dict[str, int]:
    """What the job's ``jobdw`` directives alone say each node needs, before DWS is asked.

    Per-compute types count in full per node; Lustre capacity is shared out over the nodes,
    so it is left out when the node count is not known at submit.
    """
    per_node: dict[str, int] = {}
    for directive in directives:
        fs, capacity = directive.args.get("type"), directive.args.get("capacity")
        if directive.command != "jobdw" or fs not in FS_TYPES or capacity is None:
            continue
        size = max(parse_size(capacity), limits.get(fs, NO_LIMIT).min_allocation)
        if fs == "lustre":
            if not nnodes:
                continue
            size = ceil_div(size, nnodes)
        per_node[fs] = add_sizes(per_node.get(fs, 0), size, f"{fs} storage per node")
    return per_node


def _count(entry: Any) -> int | None:
    count = entry.get("count") if isinstance(entry, Mapping) else None
    return None if isinstance(count, bool) or not isinstance(count, int) or count < 1 else count


def _grouped_nodes(top: Mapping[str, Any]) -> int | None:
    """Nodes in one ``slot`` or ``chassis`` of a jobspec (its ``node`` child's count)."""
    nodes = [c for c in top.get("with") or [] if isinstance(c, Mapping) and c.get("type") == "node"]
    return _count(nodes[0]) if len(nodes) == 1 else None


def node_count(resources: Any) -> int | None:
    """The nodes a jobspec's resources ask for, when it says (a top-level ``node`` request
    such as ``-N``, or a ``slot`` or ``chassis`` of nodes); None when it does not."""
    if not isinstance(resources, list) or len(resources) != 1:
        return None
    top = resources[0]
    count = _count(top)
    if count is None:
        return None
    if top.get("type") == "node":
        return count
    if top.get("type") in ("slot", "chassis"):
        per = _grouped_nodes(top)
        return None if per is None else count * per
    return None


#: What a job is told when its own jobspec asks for ``ssd`` where flux-dws may not replace it.
OWN_SSD = (
    "the job's resources ask for ssd themselves; rabbit storage is asked for with "
    "#DW jobdw, and flux-dws adds the ssd"
)
#: What a job with rabbit storage is told when its resources are not a shape the rewrite takes.
WHOLE_NODES = (
    "a job with rabbit storage must ask for whole nodes (flux run -N), so that each "
    "node gets its share of SSD"
)


#: The deepest a #DW job's resources may nest.  A real jobspec nests a handful of levels
#: (cluster, rack, node, socket, core, slot); JSON may nest hundreds, more than Python's
#: recursion limit leaves room for once the service sends the rewrite back to Flux.
MAX_NESTING = 16


def check_nesting(resources: Any) -> None:
    """StorageError when the resources nest more than :data:`MAX_NESTING` levels deep
    (walked with a list, never by recursion)."""
    todo = [(r, 1) for r in resources] if isinstance(resources, list) else []
    while todo:
        resource, depth = todo.pop()
        if depth > MAX_NESTING:
            raise StorageError(f"the job's resources nest more than {MAX_NESTING} levels deep")
        children = resource.get("with") if isinstance(resource, Mapping) else None
        if isinstance(children, list):
            todo.extend((c, depth + 1) for c in children)


def has_ssd(resources: Any) -> bool:
    """Do the resources ask for ``ssd`` anywhere (rewritten already, or the user's own)?

    Walked with a list, not by recursion: a jobspec nested as deep as JSON allows is looked
    through in one pass over what it holds, never a RecursionError."""
    todo = list(resources) if isinstance(resources, list) else []
    while todo:
        resource = todo.pop()
        if not isinstance(resource, Mapping):
            continue
        if resource.get("type") == SSD_TYPE:
            return True
        children = resource.get("with")
        if isinstance(children, list):
            todo.extend(children)
    return False


def check_no_ssd(resources: Any) -> None:
    """StorageError (:data:`OWN_SSD`) when the resources ask for ``ssd`` anywhere: with
    rabbits in Fluxion's graph, only flux-dws's rewrite of a #DW job may ask for their SSD."""
    if has_ssd(resources):
        raise StorageError(OWN_SSD)


def rewritten_nodes(resources: Any) -> int:
    """The job's node count, for a jobspec the rewrite can take (a top-level ``node``, or a
    ``slot`` or ``chassis`` of nodes); StorageError (:data:`WHOLE_NODES`) for any other."""
    nnodes = node_count(resources)
    if nnodes is None:
        raise StorageError(WHOLE_NODES)
    return nnodes


def without_ssd(resources: Any) -> Any:
    """The resources as the user asked before any rewrite: a ``slot[rabbit]`` of nodes made
    a ``node x N`` again and every top-level ``ssd`` taken out.  The rewrite is the only
    source of ssd (a user's own would let Fluxion reserve less than DWS allocates), so it
    starts from these.  StorageError for ``ssd`` deeper down, which cannot be taken out, and
    for resources nested past :data:`MAX_NESTING` (counted without the rewrite's slot)."""
    original = _without_ssd(resources)
    check_nesting(original)
    return original


def _without_ssd(resources: Any) -> Any:
    if not has_ssd(resources) or len(resources) != 1 or not isinstance(resources[0], Mapping):
        return resources
    top = dict(resources[0])
    kids = [
        c
        for c in top.get("with") or []
        if not (isinstance(c, Mapping) and c.get("type") == SSD_TYPE)
    ]
    nodes = [c for c in kids if isinstance(c, Mapping) and c.get("type") == "node"]
    if (
        top.get("type") == "slot"
        and top.get("label") == RABBIT_SLOT
        and len(kids) == 1 == len(nodes)
    ):
        node, count = dict(nodes[0]), _count(top)
        if count is not None and _count(node) == 1:
            top, kids = node, list(node.get("with") or [])
            top["count"] = count
    top["with"] = kids
    if not kids:
        del top["with"]
    check_no_ssd([top])
    return [top]


def rabbit_resources(
    resources: Any, needs: Sequence[AllocationNeed], limits: Mapping[str, StorageLimit]
) -> list[dict[str, Any]] | None:
    """The job's resources with SSD per node, or None when there is nothing to change.

    A top-level ``node x N`` becomes ``slot[rabbit] x N -> (node x 1, ssd x G)``; a ``slot`` or
    ``chassis`` of k nodes gets ``ssd x k*G`` beside its nodes, so they and their SSD come from
    one rabbit.  G is :func:`reserved_gib`.  Any ``ssd`` already there (the user's own, or this
    rewrite's on a release repeated after a restart) is replaced, so the same job always gets
    the same resources and the site limits are always checked.  None when that changes
    nothing; StorageError, in one line, when the request names no node count, is over a site
    limit or asks for more than Fluxion's counts and Flux's int64 hold.
    """
    original = without_ssd(resources)
    if not needs:  # no rabbit storage: only a user's own ssd to take out
        return None if original == resources else original
    nnodes = rewritten_nodes(original)
    check_per_node(bytes_per_node(needs, nnodes, limits), limits)
    gib = reserved_gib(needs, nnodes, limits)
    if gib < 1:  # breakdowns asking for nothing: nothing to place
        return None if original == resources else original
    top = dict(original[0])  # only its own keys change: what it holds is shared, not copied
    per = 1 if top["type"] == "node" else _grouped_nodes(top) or 1
    _check_counts(nnodes, gib, per)
    if top["type"] != "node":
        top["with"] = [*top["with"], {"type": SSD_TYPE, "count": gib * per, "exclusive": True}]
        rewritten = [top]
    else:
        top["count"] = 1
        rewritten = [
            {
                "type": "slot",
                "count": nnodes,
                "label": RABBIT_SLOT,
                "with": [top, {"type": SSD_TYPE, "count": gib, "exclusive": True}],
            }
        ]
    return None if rewritten == resources else rewritten


def _check_counts(nnodes: int, gib: int, per: int) -> None:
    """StorageError when a count of the rewrite is more than Fluxion's jobspec parser takes,
    or the job's SSD in all is more bytes than an int64 holds."""
    if max(nnodes, gib * per) > MAX_COUNT:
        raise StorageError(
            f"the job's {nnodes} nodes of {gib} GiB of rabbit storage each are more than "
            f"Fluxion's jobspec counts hold (at most {MAX_COUNT})"
        )
    if nnodes * gib * GIB > MAX_BYTES:
        raise StorageError(
            f"the job's {nnodes} nodes of {gib} GiB of rabbit storage each add up to more "
            f"than {MAX_BYTES} bytes"
        )


def release_update(
    resources: Any,
    needs: Sequence[AllocationNeed],
    limits: Mapping[str, StorageLimit],
    rabbit_scheduling: bool,
) -> dict[str, Any]:
    """The jobspec update that comes with the job's dependency release.

    Always the summary (``attributes.system.dw_storage``); with rabbits in Fluxion's graph,
    the rewritten resources too.  StorageError when the needs break a site limit: the job
    fails at Proposal with the words the validator uses at submit.
    """
    update: dict[str, Any] = {JOBSPEC_STORAGE_KEY: jobspec_storage(needs)}
    if rabbit_scheduling:
        rewritten = rabbit_resources(resources, needs, limits)
        if rewritten is not None:
            update["resources"] = rewritten
    elif limits:
        check_per_node(bytes_per_node(needs, node_count(resources) or 1, limits), limits)
    return update


def min_allocations(limits: Mapping[str, StorageLimit]) -> dict[str, int]:
    """Allocation-set label -> the least one allocation takes, for the Servers plan and each
    node's reservation: the site's minimum, and for a Lustre target at least what nnf-sos
    allocates (NNF_LUSTRE_MIN_ALLOCATION, whatever the Servers say)."""
    labels = ("raw", "xfs", "gfs2", *sorted(LUSTRE_LABELS))
    least = {label: limits.get(fs_type(label), NO_LIMIT).min_allocation for label in labels}
    for label in LUSTRE_LABELS:
        least[label] = max(least[label], NNF_LUSTRE_MIN_ALLOCATION)
    return least


__all__ = [
    "min_allocations",
    "release_update",
    "FS_TYPES",
    "NO_LIMIT",
    "RABBIT_SLOT",
    "StorageLimit",
    "bytes_per_node",
    "check_per_node",
    "directive_bytes_per_node",
    "fs_type",
    "OWN_SSD",
    "WHOLE_NODES",
    "MAX_NESTING",
    "check_nesting",
    "check_no_ssd",
    "has_ssd",
    "node_count",
    "rabbit_resources",
    "rewritten_nodes",
    "reserved_gib",
    "without_ssd",
]
