# SPDX-License-Identifier: LGPL-3.0-only
"""Start-up reconciliation and the orphan sweep, as pure functions.

A restarted service rebuilds its whole work list from two observations: the jobs the jobtap
plugin holds (one snapshot) and the workflows carrying this instance's label (one list, read
page by page).  decide() then takes each job from wherever it is; what is left here is which
jobs may be decided while the list is still paging, the order in which jobs are taken up,
and which workflows are orphans.  ``flux dws cleanup`` shows and applies the same orphan plan
by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flux_dws.base.jobid import f58
from flux_dws.core.identity import owned_jobid
from flux_dws.core.release import RELEASE_ANNOTATION


@dataclass(frozen=True)
class Sweep:
    """A workflow the orphan sweep will tear down and delete, and why."""

    name: str
    jobid: int
    reason: str


def plan_cleanup(
    workflows: Iterable[Mapping[str, Any]], held_jobids: Iterable[int], identity: str
) -> list[Sweep]:
    """This instance's workflows whose job it no longer holds (see identity.owned_jobid).

    A workflow whose job's nodes went back early (the release annotation) is not an orphan:
    its job is inactive on purpose and the service finishes its DataOut and Teardown.
    """
    held = set(held_jobids)
    plan = []
    for obj in workflows:
        jobid = owned_jobid(obj, identity)
        if jobid is None or jobid in held:
            continue
        meta = obj["metadata"]
        annotations = meta.get("annotations")
        if isinstance(annotations, Mapping) and RELEASE_ANNOTATION in annotations:
            continue
        if meta.get("deletionTimestamp"):
            reason = f"job {f58(jobid)} is not held by this instance; the workflow is being deleted"
        else:
            reason = f"job {f58(jobid)} is not held by this instance (inactive or unknown)"
        plan.append(Sweep(name=str(meta["name"]), jobid=jobid, reason=reason))
    plan.sort(key=lambda s: s.jobid)
    return plan


def startup_order(jobs: Iterable[tuple[int, bool, float]]) -> list[int]:
    """The order to take jobs up after a (re)start: (jobid, has_workflow, t_submit) each.

    Jobs whose workflow is already in flight come first, so a backlog of new jobs never
    delays them; jobs still waiting for a workflow then get one in submit order.
    """
    return [jobid for jobid, _, _ in sorted(jobs, key=lambda j: (not j[1], j[2], j[0]))]


def waits_for_list(held: bool, seen: bool) -> bool:
    """Whether a job must wait for the whole workflow list before it is decided.

    ``held``: the plugin holds the job; ``seen``: its workflow has been read already (from a
    page of the list, or an event).  A held job whose workflow was seen is decided on both
    observations at once.  A held job whose workflow was not seen may have one on a later
    page: deciding now would create a second.  A workflow whose job is not held is swept
    (or, released early, finished) only on the whole list, so that nothing is deleted from
    a partial view and the health monitor holds every released job's ssd parts (it reads
    each workflow's release mark from the whole list) before any is given back.
    """
    return not (held and seen)


def may_decide(*, synced: bool, listed: bool, held: bool, seen: bool) -> bool:
    """Whether a job can be decided now, at start-up: never before the plugin's snapshot
    (without it, every workflow would look orphaned), and before the whole workflow list
    only if it ``waits_for_list`` not."""
    return synced and (listed or not waits_for_list(held, seen))
