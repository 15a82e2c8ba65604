# SPDX-License-Identifier: LGPL-3.0-only
"""Where exclusive allocations are: what the Servers plan keeps apart (flux_dws.core.colocation).

A set with an exclusive colocation key (a Lustre MGT's ``lustre-mgt``) may not go on a rabbit
where another Servers holds the same key: another job's, persistent storage's, another
instance's.  Those come from the Servers watch the health monitor runs (every Servers, in every
namespace; flux_dws.service.healthwatch), or, where there is none or it has not listed yet,
from a list of every Servers read when a job needs it.

Two jobs are often placed one right after the other, and neither's Servers is in the watch
when the other plans.  So what a plan holds is kept as a *claim* until the watch shows that
Servers with the same keys (or deleted), or, where the Servers are listed rather than
watched, until its patch has ended.  A claim whose patch failed is dropped at once only when
the watch does not know that Servers (it will never show it); otherwise it is kept, which is
conservative: a retry of the same job replaces it, and the Servers goes with its workflow.

Everything here runs on the loop: the watch tells it what it sees, and a job plans there
with the pure planner (flux_dws.core.storage.plan_servers), between the worker's read of
every Servers (where the watch has not listed: ``must_list``) and its patch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

from flux_dws.core import colocation
from flux_dws.core.storage import AllocationNeed
from flux_dws.k8s.watch import DELETED, qualified_name

Plan = dict[tuple[str, str], list[dict[str, Any]]]
Holds = dict[str, frozenset[str]]


def servers_key(servers: tuple[str, str]) -> str:
    """A need's (namespace, name) as the watch names the Servers (qualified_name)."""
    return f"{servers[0]}/{servers[1]}"


def annotations(needs: Sequence[AllocationNeed]) -> dict[tuple[str, str], dict[str, str]]:
    """The annotations each Servers gets (the exclusive keys of its sets), by (namespace,
    name); Servers with no such set get none."""
    by_servers: dict[tuple[str, str], list[tuple[str, tuple[str, ...]]]] = {}
    for need in needs:
        by_servers.setdefault(need.servers, []).append((need.label, need.exclusive))
    out = {}
    for servers, sets in by_servers.items():
        value = colocation.annotation(sets)
        if value is not None:
            out[servers] = {colocation.ANNOTATION: value}
    return out


class Placements:
    """See the module docstring."""

    def __init__(self) -> None:
        self._watched: dict[str, Holds] = {}  # every watched Servers -> its holds
        self._listed = False  # the watch has listed: _watched is every Servers
        self._claims: dict[str, Holds] = {}  # Servers -> what a plan put there, not yet seen

    # ---- from the Servers watch ------------------------------------------------------------

    def seen(self, kind: str, obj: dict[str, Any]) -> None:
        key = qualified_name(obj)
        if not key:
            return
        if kind == DELETED:
            self._watched.pop(key, None)
            self._claims.pop(key, None)
            return
        holds = colocation.servers_exclusive(obj)
        self._watched[key] = holds
        if self._claims.get(key) == holds:
            del self._claims[key]  # the watch shows what we wrote: it holds it now

    def listed(self) -> None:
        self._listed = True

    # ---- a job's plan -----------------------------------------------------------------------

    def must_list(self, needs: Sequence[AllocationNeed]) -> bool:
        """Whether planning ``needs`` takes a list of every Servers (read on a worker first):
        they hold an exclusive key and the watch has not listed."""
        return not self._listed and any(need.keys for need in needs)

    def plan(
        self,
        needs: Sequence[AllocationNeed],
        planner: Callable[[Holds], Plan],
        listed: Sequence[Any] = (),
    ) -> tuple[Plan, dict[tuple[str, str], dict[str, str]]]:
        """(``planner``'s plan, the annotations each Servers of it gets).  ``planner`` gets
        rabbit -> the exclusive keys other Servers hold there; ``listed``: every Servers,
        where ``must_list``.  Call :meth:`settle` once the Servers are written (or not)."""
        notes = annotations(needs)
        if not any(need.keys for need in needs):
            return planner({}), notes
        own = {servers_key(need.servers) for need in needs}
        watched = self._watched
        if not self._listed:
            watched = {qualified_name(o): colocation.servers_exclusive(o) for o in listed}
        views = {**watched, **self._claims}  # a claim is newer than what was seen
        taken = colocation.merge(h for key, h in views.items() if key not in own)
        plan = planner(taken)
        for servers, sets in plan.items():
            spec = {"allocationSets": sets}
            meta = {"annotations": notes.get(servers, {})}
            holds = colocation.servers_exclusive({"metadata": meta, "spec": spec})
            if holds:
                self._claims[servers_key(servers)] = holds
            else:
                self._claims.pop(servers_key(servers), None)
        return plan, notes

    def settle(self, plan: Plan, written: bool) -> None:
        """The Servers of ``plan`` were written (``written``), or their patch failed."""
        for servers in plan:
            key = servers_key(servers)
            if not self._listed or (not written and key not in self._watched):
                self._claims.pop(key, None)
