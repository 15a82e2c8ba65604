# SPDX-License-Identifier: LGPL-3.0-only
"""Early release, as decide() treats it: when a job's nodes go back once PostRun has unmounted
its storage, what the release does, and how the workflow is finished once the job is gone.

Pure, beside flux_dws.core.lifecycle, which calls these and keeps every move of a job's
workflow (on to DataOut after PostRun, or to Teardown when PostRun ran past its deadline);
the release mark, the early release's actions and the pools' bookkeeping are
flux_dws.core.release.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.fsd import format_fsd
from flux_dws.core.actions import (
    Action,
    DeleteWorkflow,
    DrainNodes,
    FinishEpilog,
    PostEvent,
    ReadFailures,
    SetDesiredState,
    WakeAt,
)
from flux_dws.core.copies import pending_copies
from flux_dws.core.health import UNMOUNT_FAILED, job_reason
from flux_dws.core.jobview import JobPhase, JobView
from flux_dws.core.messages import directive_index, directive_of, failure_note
from flux_dws.core.release import (
    HoldStorage,
    MarkReleased,
    RecordRelease,
    ReleaseMark,
    ReturnStorage,
    read_mark,
)
from flux_dws.core.states import State
from flux_dws.core.workflow import WorkflowView


def begin(
    job: JobView, wf: WorkflowView, postrun_timeout: float, now: float
) -> ReadFailures | PostEvent | None:
    """PostRun is over for a job that gives its nodes back early: once every ClientMount
    reads unmounted, the release's record (``dws-release``), which decide() follows with the
    release itself (the workflow moved on, then :func:`give_back`).

    PostRun past its deadline (``postrun_timeout``, the job's) with some nodes still mounted:
    those alone are drained (with the job and workflow in the reason), the others go back,
    and the record carries the reason the job fails with as the workflow goes to Teardown.
    ``ReadFailures`` first, to learn which nodes still hold a mount; None when early release
    does not apply (yet).
    """
    if job.request is None or not job.request.releases_early:
        return None
    if job.phase is not JobPhase.EPILOG or not job.started or wf.desired_state is not State.POSTRUN:
        return None
    late = (
        not wf.complete
        and job.posted_state is State.POSTRUN
        and job.deadline is not None
        and now >= job.deadline
    )
    if not (wf.complete or late) or (wf.failed and not late):
        return None
    if job.failures is None or job.failures.state != State.POSTRUN.value:
        return ReadFailures(State.POSTRUN)
    stuck = [n for n in job.failures.nodes if n in job.hosts]
    context: dict[str, Any] = {
        "workflow": wf.name,
        "nodes": list(job.hosts),
        "drained": stuck,
        "causes": {n: job.failures.causes.get(n, "") for n in stuck},
        "ssd": list(job.ssd),
    }
    if late:
        timeout = format_fsd(postrun_timeout)
        on = f": still mounted on {', '.join(stuck)}" if stuck else ""
        late_by = f"did not complete within {timeout}{on}"
        context["reason"] = failure_note(State.POSTRUN.value, late_by, job.jobid)
    return PostEvent("dws-release", context, wait=True)


def give_back(
    job: JobView, wf: WorkflowView, context: Mapping[str, Any], dataout: float, teardown: float
) -> list[Action]:
    """The release itself, once decide() has moved the workflow on (again after a restart:
    every step is idempotent): stuck nodes are drained, the ssd parts are held, the mark (with
    the job's ``dataout`` and ``teardown`` timeouts) goes on the workflow, and only then is
    the epilog finished."""
    drained = tuple(n for n in untrusted.sequence(context.get("drained")) if isinstance(n, str))
    causes = untrusted.mapping(context.get("causes"))
    actions: list[Action] = []
    for node in drained:  # UNMOUNT_FAILED first: the node is Disabled for NNF (core.health)
        why = f"{UNMOUNT_FAILED} (workflow {wf.name}: PostRun did not unmount the job's storage)"
        cause = untrusted.field(causes.get(node)).removeprefix(f"{UNMOUNT_FAILED}: ")
        actions.append(
            DrainNodes((node,), job_reason(job.jobid, f"{why}: {cause or 'still mounted'}"))
        )
    mark = ReleaseMark(ssd=job.ssd, dataout=dataout, teardown=teardown, drained=drained)
    if job.ssd:
        actions.append(HoldStorage(job.ssd))
    if read_mark(wf.annotations) != mark:
        actions.append(MarkReleased(mark))
    return [*actions, FinishEpilog()]


def finish(jobid: int, wf: WorkflowView, mark: ReleaseMark, now: float) -> list[Action]:
    """A released job's workflow, finished without the job: DataOut, its outcome saved in
    the job's KVS, Teardown, its outcome saved, the ssd parts given back, then delete.

    Decided from the workflow alone (the job is inactive), so a restarted service takes it
    up where it was; saving an outcome again is harmless, and each is saved before the
    workflow moves past the state it describes.  Until Teardown is over every decision
    holds the parts again (idempotent): a restarted Fluxion has forgotten they were down.
    """
    held: list[Action] = [HoldStorage(mark.ssd)] if mark.ssd else []
    state = wf.desired_state
    since = wf.desired_state_change if wf.settled else None
    # A state that is done is dated by DWS (readyChange): the same on every decision, so a
    # record saved again (say while the workflow is being deleted) keeps its time.
    done_at = wf.ready_change if wf.ready_change is not None else now
    if state is State.TEARDOWN:
        if wf.complete:
            ending: list[Action] = [RecordRelease(state.value, {"status": "done", "at": done_at})]
        else:
            stuck = _overdue(jobid, wf, since, mark.teardown, now)
            if not stuck:
                return held + _wake(since, mark.teardown, now)
            outcome = {"status": "failed", "message": stuck, "at": now}
            ending = [RecordRelease(state.value, outcome)]
        if mark.ssd:
            ending.append(ReturnStorage(mark.ssd))
        return [*ending, DeleteWorkflow()]
    if state is State.DATAOUT:
        copies = _copies(wf)
        if wf.complete:
            done = {"status": "done", "copies": copies, "at": done_at}
            return [*held, RecordRelease(state.value, done), SetDesiredState(State.TEARDOWN)]
        stuck = _overdue(jobid, wf, since, mark.dataout, now)
        if not stuck:
            return held + _wake(since, mark.dataout, now)
        # the job's real result: Flux's is fixed (the job is inactive, no memo can be set)
        outcome = {
            "status": "failed",
            "message": stuck,
            "copies": copies,
            "at": now,
            "result": "FAILED",
        }
        teardown = SetDesiredState(State.TEARDOWN, hurry=True)
        return [*held, RecordRelease(state.value, outcome), teardown]
    if state is State.POSTRUN and wf.complete and not mark.problem:
        return [*held, SetDesiredState(State.DATAOUT)]
    return [*held, SetDesiredState(State.TEARDOWN, hurry=True)]


def _copies(wf: WorkflowView) -> list[int]:
    return list(pending_copies(wf.directives, State.DATAOUT, None))


def _overdue(jobid: int, wf: WorkflowView, since: float | None, limit: float, now: float) -> str:
    """Why the state cannot end well (failed, or past its deadline) in the one form, or ""."""
    if wf.failed:
        reason = wf.message or "workflow status is Error"
    elif since is not None and not math.isinf(limit) and now >= since + limit:
        reason = f"did not complete within {format_fsd(limit)}"
    else:
        return ""
    directive = directive_of(wf.directives, directive_index(wf.message))
    step = "" if wf.desired_state is State.TEARDOWN else None  # nothing left for the user
    return failure_note(wf.desired_state.value, reason, jobid, directive=directive, step=step)


def _wake(since: float | None, limit: float, now: float) -> list[Action]:
    if since is None or math.isinf(limit) or since + limit <= now:
        return []
    return [WakeAt(since + limit)]
