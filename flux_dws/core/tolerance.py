# SPDX-License-Identifier: LGPL-3.0-only
"""A job's failed compute nodes, as decide() treats them: go on without those that failed Setup
or PreRun when the job tolerates it (``dw_failure_tolerance``), and drain those nnf-sos fenced.

Pure, beside flux_dws.core.lifecycle, which calls these and keeps every move of the workflow
(aborting a job whose failed nodes are more than it tolerates included); which nodes failed,
and the tolerance rule itself, are read by flux_dws.core.health.
"""

from __future__ import annotations

from flux_dws.core.actions import (
    Action,
    DrainNodes,
    ForceReady,
    PostEvent,
    RaiseException,
    ReadFailures,
)
from flux_dws.core.health import FENCED, Failures, fenced_nodes, job_reason, tolerate
from flux_dws.core.jobview import JobPhase, JobView
from flux_dws.core.messages import directive_index, directive_of, dws_reason, failure_note
from flux_dws.core.states import State
from flux_dws.core.workflow import WorkflowView

_TOLERANT_STATES = (State.SETUP, State.PRERUN)


def tolerated(job: JobView, wf: WorkflowView) -> list[Action] | str | None:
    """Setup or PreRun failed on some nodes: go on without them if the job allows it.

    The actions that go on without them (``ReadFailures`` first, to learn which they are); or
    the job's failure note when they are more than it tolerates, which decide() aborts the
    job with; or None when this does not apply (the ordinary failure path decides).  With
    ``dw_failure_tolerance`` 0 the failed nodes are still found first, so the job's note
    names them.  A TransientCondition counts as a failure only for a job that tolerates some.
    """
    state = wf.desired_state
    allowed = job.request.failure_tolerance if job.request is not None else 0
    if state not in _TOLERANT_STATES or job.phase is not JobPhase.PROLOG:
        return None
    if not (wf.failed or (wf.transient and allowed > 0)) or wf.container.state.is_failure:
        return None  # nothing failed, or a container did (never a node's fault alone)
    if job.failures is None or job.failures.state != state.value:
        return [ReadFailures(state)]
    failures = job.failures
    fresh = tuple(n for n in failures.nodes if n not in job.tolerated)
    everyone = tuple(sorted({*job.tolerated, *fresh}))
    combined = Failures(failures.state, everyone, failures.causes, failures.lustre)
    note = tolerate(combined, allowed, job.hosts)
    if note is not None:
        if not combined.nodes and not combined.lustre:
            return None  # nothing to name or tolerate: the ordinary failure path decides
        said = wf.message or ("workflow status is Error" if wf.failed else "TransientCondition")
        directive = directive_of(wf.directives, directive_index(wf.message))
        reason = f"{dws_reason(said)} ({note})"
        return failure_note(state.value, reason, job.jobid, directive=directive)
    keep = tuple(h for h in job.hosts if h not in everyone)
    actions: list[Action] = []
    if fresh:
        causes = {n: failures.causes.get(n, "") for n in fresh}
        why = "; ".join(f"{n}: {c}" for n, c in causes.items())
        actions.append(
            DrainNodes(fresh, job_reason(job.jobid, f"{state.value} failed on this node: {why}"))
        )
        context = {
            "state": state.value,
            "nodes": list(fresh),
            "all": list(everyone),
            "tolerance": allowed,
            "causes": causes,
        }
        actions.append(PostEvent("dws-tolerated", context))
        going_on = (
            f"going on without {'it' if len(fresh) == 1 else 'them'} "
            f"(dw_failure_tolerance={allowed}, {len(everyone)} used)"
        )
        reason = f"on {', '.join(fresh)} ({why})"
        note = failure_note(state.value, reason, job.jobid, step=going_on)
        actions.append(RaiseException(note, severity=1))
    actions.append(ForceReady(keep))
    return actions


def drain_fenced(job: JobView, wf: WorkflowView) -> list[DrainNodes]:
    """nnf-sos failed the workflow because some of the job's computes were fenced: drain
    them (the reason makes them Disabled in SystemStatus, so NNF skips their unmount)."""
    nodes = fenced_nodes(wf.user_message, job.hosts) if wf.failed else ()
    if not nodes:
        return []
    why = f"{FENCED} (workflow {wf.name}: {wf.user_message})"
    return [DrainNodes(nodes, job_reason(job.jobid, why))]
