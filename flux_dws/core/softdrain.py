# SPDX-License-Identifier: LGPL-3.0-only
"""Soft drain (``[dws] soft-drain``): nodes whose rabbit is down are marked, not drained.

flux-coral2's answer to draining (``rabbit.soft_drain``, src/python/flux_k8s/storage.py)
sets the Fluxion property ``badrabbit=bad`` on each compute node whose rabbit, or whose PCIe
link to it, is not Ready, and removes it when they are Ready again; ``coral2_dws`` then gives
every #DW job the constraint ``{"not": [{"properties": ["badrabbit"]}]}``.  HPE's ``nnf
rabbit state`` (nnf-sos tools/nnf/src/nnf/commands/rabbit/state.py) lists those nodes under
"Disabled Computes (badrabbit+)" from ``flux ion-resource find property=badrabbit``.  A
node so marked keeps running jobs without #DW, and no queued job becomes unsatisfiable: the
property only narrows where #DW jobs may go.

Pure: which nodes to mark and which to clear, from the nodes health wants out of rabbit
service (flux_dws.core.health.wanted_drains) and what was marked before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Any

#: The property (flux-coral2's EXCLUDE_PROPERTY) and the value it sets.
BADRABBIT = "badrabbit"
BADRABBIT_VALUE = "bad"
#: What a #DW job asks of its nodes while soft drain is on (RFC 31 constraint).
AVOID = {"not": [{"properties": [BADRABBIT]}]}
#: Where the job's release puts it (the jobtap plugin passes the job's own along).
CONSTRAINTS_KEY = "attributes.system.constraints"


def changes(
    wanted: Iterable[str], marked: Set[str] | None, hosts: Iterable[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(hosts to mark, hosts to clear), each sorted.  ``marked`` None: not known (a service
    that just started, or after a failed mark): every host not wanted is cleared, so a mark
    left by an earlier service is taken off once its rabbit is fine."""
    known = set(hosts)
    want = set(wanted) & known
    if marked is None:
        return tuple(sorted(want)), tuple(sorted(known - want))
    return tuple(sorted(want - marked)), tuple(sorted((set(marked) & known) - want))


def with_avoid(constraints: Any) -> dict[str, Any]:
    """A job's ``attributes.system.constraints`` with the badrabbit exclusion added (kept as
    it is when it already excludes them)."""
    if not isinstance(constraints, Mapping) or not constraints:
        return dict(AVOID)
    if constraints == AVOID or AVOID in (constraints.get("and") or []):
        return dict(constraints)
    return {"and": [dict(constraints), AVOID]}


__all__ = ["AVOID", "BADRABBIT", "BADRABBIT_VALUE", "CONSTRAINTS_KEY", "changes", "with_avoid"]
