# SPDX-License-Identifier: LGPL-3.0-only
"""The lifecycle core: what to do next for one #DW job, as a pure function.

    decide(job, workflow, policy, now) -> list[Action]

Level-triggered: the answer depends only on what is observable now (the job as Flux and the
job's own eventlog show it, the workflow as Kubernetes shows it), never on remembering that an
earlier callback ran.  After a crash the same observations give the same next step, and every
action is idempotent, so restart safety comes from the design rather than special cases.

What flux-dws must remember across restarts it writes on the job as events (``dws-workflow``,
``dws-state`` with the absolute deadline, ``dws-transient``, ``dws-container``,
``dws-proposal``, ``dws-datamovement``) and reads back into the JobView; the workflow itself
lives in Kubernetes.

Every rule of a job's workflow is here, and every move of it.  Two siblings answer what this
file asks: flux_dws.core.earlyrelease (when a job's nodes go back early, what the release
does, and how a released job's workflow is finished) and flux_dws.core.tolerance (going on
without a job's failed nodes, draining those fenced).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.fsd import format_fsd
from flux_dws.core import earlyrelease, softdrain
from flux_dws.core.actions import (
    Action,
    CreateWorkflow,
    DeleteWorkflow,
    DrainNodes,
    FinishEpilog,
    FinishProlog,
    PostEvent,
    RaiseException,
    ReadFailures,
    ReadProposal,
    RecordCopies,
    ReleaseDependency,
    SaveOutput,
    SetDesiredState,
    WakeAt,
)
from flux_dws.core.containeroutcome import ContainerState
from flux_dws.core.copies import pending_copies
from flux_dws.core.failing import refusal_note
from flux_dws.core.health import (
    UNMOUNT_FAILED,
    job_reason,
)
from flux_dws.core.identity import FINALIZER
from flux_dws.core.jobenv import env_problem, token_problem, token_required, token_secret_for
from flux_dws.core.jobspec import release_update
from flux_dws.core.jobview import (
    JobPhase,
    JobView,
)
from flux_dws.core.messages import directive_index, directive_of, dws_reason, failure_note
from flux_dws.core.policy import Policy
from flux_dws.core.release import (
    ReturnStorage,
    read_mark,
)
from flux_dws.core.states import State
from flux_dws.core.storage import StorageError
from flux_dws.core.tolerance import drain_fenced, tolerated
from flux_dws.core.workflow import WorkflowView

# Which desiredStates are consistent with each job phase (a job that has run: EPILOG).
_EXPECTED: Mapping[JobPhase, frozenset[State]] = {
    JobPhase.DEPEND: frozenset({State.PROPOSAL}),
    JobPhase.SCHED: frozenset({State.PROPOSAL}),
    JobPhase.PROLOG: frozenset({State.PROPOSAL, State.SETUP, State.DATAIN, State.PRERUN}),
    JobPhase.RUN: frozenset({State.PRERUN}),
    JobPhase.EPILOG: frozenset({State.PRERUN, State.POSTRUN, State.DATAOUT}),
}


# ----------------------------------------------------------------------------- decide


def decide(job: JobView, workflow: WorkflowView | None, policy: Policy, now: float) -> list[Action]:
    """The next actions for ``job``, given its workflow (None when there is none)."""
    if not job.active:
        mark = read_mark(workflow.annotations) if workflow is not None else None
        if workflow is not None and mark is not None and not _released(workflow):
            return earlyrelease.finish(job.jobid, workflow, mark, now)
        return _sweep_orphan(workflow, policy, now)
    if job.refusal is not None and job.exception is None:  # found while acting (core.failing)
        return [RaiseException(refusal_note(job, workflow, job.refusal))]
    if workflow is None or _released(workflow):
        return _without_workflow(job, workflow)
    actions: list[Action] = []
    actions += _record(job, workflow, policy, now)
    if job.phase is JobPhase.EPILOG and job.release is not None:  # decided before a restart
        return actions + _release_nodes(job, workflow, job.release, policy, now)
    copies = _unrecorded_copies(job, workflow)
    if copies is not None:  # before anything moves on (or tears down) past the copies
        return [*actions, copies]
    if workflow.desired_state is State.TEARDOWN:
        ending = _teardown(job, workflow, policy, now)
        if any(isinstance(a, DeleteWorkflow) for a in ending):
            return actions + ending
        actions += ending
    elif _aborted(job):
        return actions + _abort(job, None, policy, now)
    else:
        # fenced computes are never tolerated nor released early: NNF says the job failed
        fenced = drain_fenced(job, workflow)
        early = None if fenced else _early_release(job, workflow, policy, now)
        if early is not None:
            return actions + early
        tolerance = None if fenced else _tolerance(job, workflow, policy, now)
        if tolerance is not None:
            return actions + tolerance
        problem = _failure(job, workflow, policy, now)
        if problem:
            return actions + fenced + _abort(job, problem, policy, now)
        actions = _ask_before_saving(actions, _advance(job, workflow, policy, now), workflow)
    wake = _next_wake(job, workflow, policy, now)
    if wake is not None:
        actions.append(WakeAt(wake))
    return actions


def decide_unreadable(
    job: JobView, name: str, problem: str, since: float, policy: Policy, now: float
) -> list[Action]:
    """The next actions for ``job`` while its workflow ``name`` cannot be read (since
    ``since``, for ``problem``): hold, but never past a deadline.

    Deciding from a workflow that cannot be read could fail the job wrongly or leak its
    storage, so nothing moves while a readable version may still come.  But the workflow must
    be readable by the deadline of the state the job is in, as it must be complete by then:
    past it the job fails with the problem as its reason and the workflow is asked for
    Teardown (a patch of spec alone, which DWS admits from any state).  Should it still be
    unreadable past Teardown's own deadline, the job is let go as for a Teardown that cannot
    complete: the failure is recorded, the workflow deleted (DWS's finalizer cleans up).
    """
    if not job.active:  # an orphan's workflow: nothing is held for it
        return []
    state = job.posted_state or State.PROPOSAL
    deadline = job.deadline
    if deadline is None or job.posted_state is None:
        timeout = _timeout(job, state.key, policy)
        deadline = None if math.isinf(timeout) else since + timeout
    if deadline is None:  # the site allows this state to take for ever
        return []
    if now < deadline:
        return [WakeAt(deadline)]
    reason = f"the workflow cannot be read: {untrusted.readable(problem, 300)}"
    if state is not State.TEARDOWN:
        return _abort(job, failure_note(state.value, reason, job.jobid), policy, now)
    ending: list[Action] = []
    if not job.teardown_failed:  # in Flux before the workflow is deleted
        context = {"workflow": name, "reason": f"Teardown failed: {reason}", "drained": []}
        ending.append(PostEvent("dws-teardown-failed", context, wait=True))
    return [*ending, DeleteWorkflow(), *_let_go(job, None)]


def _unrecorded_copies(job: JobView, wf: WorkflowView) -> RecordCopies | None:
    """DataIn or DataOut is over (complete or failed) and some of its copies are not on the
    job yet.  A user's cancel while data still moves records nothing: it did not end."""
    state = wf.desired_state
    if not (wf.complete or wf.failed) or state not in (State.DATAIN, State.DATAOUT):
        return None
    pending = pending_copies(wf.directives, state, job.copies_recorded)
    return RecordCopies(state, pending) if pending else None


def _released(wf: WorkflowView) -> bool:
    """Deleted as far as flux-dws is concerned: going away and no longer held by us."""
    return wf.deleting and FINALIZER not in wf.finalizers


def _fatal(job: JobView) -> bool:
    return job.exception is not None and job.exception.severity == 0


def _aborted(job: JobView) -> bool:
    """The job's workflow must go straight to Teardown, skipping what is left."""
    if _fatal(job):
        assert job.exception is not None
        return job.exception.aborts or not job.started
    return job.phase is JobPhase.EPILOG and not job.started


def _timeout(job: JobView, key: str, policy: Policy) -> float:
    if job.request is not None:
        return job.request.timeouts[key]
    return policy.timeout(key).default


def container_note(jobid: int, wf: WorkflowView) -> str:
    """The note of the workflow's failed containers, in the one form: the state they failed
    in, their ``#DW container`` directive, DWS's reason, where their output is."""
    outcome = wf.container
    directive = directive_of(wf.directives, outcome.dwd_index)
    phase = outcome.phase or wf.desired_state
    return failure_note(phase.value, outcome.reason, jobid, directive=directive)


def _failure(job: JobView, wf: WorkflowView, policy: Policy, now: float) -> str | None:
    """Why the workflow cannot go on (a user-facing note), or None."""
    state = wf.desired_state
    if job.phase is not JobPhase.GONE and state not in _EXPECTED[job.phase]:
        reason = f"workflow {wf.name} is in {state.value} while the job is in {job.phase.value}"
        return failure_note(state.value, reason, job.jobid)
    if wf.failed:
        if wf.container.state.is_failure:
            return container_note(job.jobid, wf)
        index, reason = directive_index(wf.message), wf.message or "workflow status is Error"
        directive = directive_of(wf.directives, index)
        return failure_note(state.value, reason, job.jobid, directive=directive)
    if wf.transient and job.transient and job.transient[0] is state:
        grace = _timeout(job, "transient", policy)
        if now >= job.transient[1] + grace:
            said = "in Error, retried by its driver," if wf.retrying else "in TransientCondition"
            reason = f"{said} for more than {format_fsd(grace)}: "
            return failure_note(
                state.value, reason + (dws_reason(wf.message) or "no message"), job.jobid
            )
    if (
        not wf.complete
        and job.posted_state is state
        and job.deadline is not None
        and now >= job.deadline
    ):
        reason = f"did not complete within {format_fsd(_timeout(job, state.key, policy))}"
        said = dws_reason(wf.message)
        return failure_note(state.value, f"{reason}: {said}" if said else reason, job.jobid)
    return None


def _abort(job: JobView, problem: str | None, policy: Policy, now: float) -> list[Action]:
    """Record why, send the workflow to Teardown, then fail or cancel the job (once) and let
    go of the prolog.

    The reason goes on the job before Teardown is asked: once the workflow is in Teardown its
    status no longer says what failed, so a service killed between the patch and the event
    would otherwise forget why and let the job end as a success, so that post waits for
    Flux's answer (``PostEvent.wait``).  Teardown is asked before the exception: should Flux
    refuse the exception, the nodes and storage are still given back, and the recorded
    reason is raised when the exception is tried again."""
    if job.phase is JobPhase.PROLOG:
        actions = _fail_prolog(job, problem)
    else:
        actions = _fail(job, problem)
    ask, *record = _enter(job, State.TEARDOWN, policy, now, hurry=True)
    if record and problem and isinstance(record[0], PostEvent):  # kept for a retried raise
        record[0] = PostEvent("dws-state", {**record[0].context, "reason": problem}, wait=True)
    return [*record, ask, *actions]


def _enter(
    job: JobView,
    state: State,
    policy: Policy,
    now: float,
    hurry: bool = False,
    assign: tuple[str, ...] = (),
    rabbits: tuple[tuple[str, str], ...] = (),
) -> list[Action]:
    """Ask for ``state``, then record on the job that we did (with its deadline).

    The patch goes first so the job's eventlog stays off the critical path: the patch only
    needs handing to a worker, and the event follows in the same turn of the loop, so the
    next decision (once DWS reports the state ready) already sees it.  A restart between the
    two records the state from the workflow's own desiredStateChange (``_record``).
    Asking again while an earlier request is still on its way is harmless (DWS admits staying
    in a state); recording it again would not be, so a state already recorded is not.
    """
    ask = SetDesiredState(state, hurry=hurry, assign=assign, rabbits=rabbits)
    return [ask] if job.posted_state is state else [ask, _state_event(job, state, policy, now)]


def _state_event(job: JobView, state: State, policy: Policy, since: float) -> PostEvent:
    timeout = _timeout(job, state.key, policy)
    deadline = None if math.isinf(timeout) else since + timeout
    context = {"state": state.value, "timeout": format_fsd(timeout), "deadline": deadline}
    return PostEvent("dws-state", context)


def _fail(job: JobView, note: str | None) -> list[Action]:
    """Raise ``note`` as the job's exception, unless there is none or the job already has one."""
    return [RaiseException(note)] if note and not _fatal(job) else []


def _fail_prolog(job: JobView, note: str | None = None) -> list[Action]:
    """End the prolog hold so the job never starts; a failed prolog always has an exception."""
    if not note:
        state = job.posted_state if job.posted_state is not State.TEARDOWN else None
        ended = "the job's workflow ended before the job could start"
        note = failure_note((state or State.PRERUN).value, ended, job.jobid)
    return [*_fail(job, note), FinishProlog(success=False)]


def _advance(job: JobView, wf: WorkflowView, policy: Policy, now: float) -> list[Action]:
    """The next step of a healthy workflow, once its current state is complete."""
    if not wf.complete:
        return []
    state, phase = wf.desired_state, job.phase
    if state is State.PROPOSAL:
        if job.proposal is None:
            return [ReadProposal()]
        if phase is JobPhase.DEPEND:
            return _release_dependency(job, policy)
        if phase is JobPhase.PROLOG:
            return _enter(job, State.SETUP, policy, now, assign=job.hosts, rabbits=job.rabbits)
        return []
    if phase is JobPhase.PROLOG:
        if state is State.SETUP:
            return _enter(job, State.DATAIN, policy, now)
        if state is State.DATAIN:
            return _enter(job, State.PRERUN, policy, now)
        return _start(job, wf, policy, now)
    if phase is JobPhase.EPILOG:
        following = state.next()
        assert following is not None  # EPILOG only expects PreRun..DataOut here
        if following is State.TEARDOWN and _output_unsaved(job, wf):
            return []  # Teardown deletes the pods: it waits for dws-container (SaveOutput)
        return _enter(job, following, policy, now)
    return []


def _output_unsaved(job: JobView, wf: WorkflowView) -> bool:
    """The containers have ended and their outcome (output) is not on the job yet."""
    outcome = wf.container.state
    return outcome in _TERMINAL_CONTAINER and job.container_recorded is not outcome


def _ask_before_saving(
    recorded: list[Action], step: list[Action], wf: WorkflowView
) -> list[Action]:
    """A healthy step on is asked before the containers' output is saved, as the chain runs
    its actions in turn and the save (pod and log reads, off the urgent threads) would hold
    the step back.  So a clean exit seen while PostRun still runs is saved with the ask for
    DataOut, after it.  The pods live until Teardown, which ``_advance`` withholds until
    ``dws-container`` is on the job: the save runs while DataOut does, and a restart in
    between saves it then.  (A failure or abort saves first, before Teardown is asked.)"""
    saving = [a for a in recorded if isinstance(a, SaveOutput)]
    if not saving:
        return recorded + step
    rest = [a for a in recorded if not isinstance(a, SaveOutput)]
    if step:
        return rest + step + saving
    running = wf.desired_state is State.POSTRUN and not wf.complete
    return rest if running and wf.container.state is ContainerState.EXITED else recorded


def _start(job: JobView, wf: WorkflowView, policy: Policy, now: float) -> list[Action]:
    """PreRun is ready: start the job with the workflow's environment (and token), or fail
    it, naming the variable, when the environment could not be given to it."""
    needs_token = token_required(wf.requires, wf.directives)
    problem = env_problem(wf.env) or token_problem(
        wf.token_secret, wf.name, wf.namespace, needs_token
    )
    if problem:
        return _abort(job, failure_note(State.PRERUN.value, problem, job.jobid), policy, now)
    secret = token_secret_for(wf.name, wf.namespace) if wf.token_secret else None
    return [FinishProlog(True, wf.env, secret, token_required=needs_token)]


def _release_dependency(job: JobView, policy: Policy) -> list[Action]:
    """Release the dependency with the storage needs (and, with rabbits in Fluxion's graph,
    the rewritten resources) in the jobspec; a need over a site limit fails the job."""
    assert job.proposal is not None
    try:
        update = release_update(
            job.resources, job.proposal.needs, policy.storage_limits, policy.rabbit_scheduling
        )
    except StorageError as exc:
        reason = f"cannot schedule the job's storage: {exc}"
        return _fail(job, failure_note(State.PROPOSAL.value, reason, job.jobid))
    if policy.soft_drain:  # keep off the nodes marked badrabbit (flux_dws.core.softdrain)
        update[softdrain.CONSTRAINTS_KEY] = softdrain.with_avoid(job.constraints)
    return [ReleaseDependency(update)]


def _torn_down(job: JobView) -> list[Action]:
    """A job whose workflow was sent to Teardown must end with the reason recorded with
    Teardown (should the first raise have been refused, or the service stopped between the
    Teardown patch and the raise, the workflow's own message is gone by now); one that never
    ran must not be left waiting either: its prolog is let go."""
    reason = job.teardown_reason or None
    if job.phase is JobPhase.PROLOG:
        return _fail_prolog(job, reason)
    if job.phase in (JobPhase.DEPEND, JobPhase.SCHED):
        early = "the job's workflow was torn down before the job could run"
        return _fail(job, reason or failure_note(State.PROPOSAL.value, early, job.jobid))
    return _fail(job, reason)


def _teardown(job: JobView, wf: WorkflowView, policy: Policy, now: float) -> list[Action]:
    """Teardown: delete once done; give up (loudly, without holding the job) if it cannot be.

    Nodes of a job whose Teardown failed may hold a stuck mount: with ``[dws]
    drain-on-teardown-failure`` those whose ClientMount still shows a mount (or an error) are
    drained, and only those, so the next job does not land on them.  A rabbit that still holds
    the job's storage is kept from new jobs by the health monitor's capacity check.
    """
    actions = _torn_down(job)
    if wf.complete:
        return [*actions, DeleteWorkflow()]
    stuck = _teardown_stuck(job, wf, now)
    if stuck and job.teardown_failed:
        actions.append(DeleteWorkflow())  # recorded (and drained) already
    elif stuck:
        drain = policy.drain_on_teardown_failure and bool(job.hosts)
        if drain and (job.failures is None or job.failures.state != State.TEARDOWN.value):
            return [*actions, ReadFailures(State.TEARDOWN)]  # which nodes still hold a mount
        held = job.failures.nodes if drain and job.failures is not None else ()
        fenced = drain_fenced(job, wf)
        actions += fenced
        held = tuple(h for h in held if not any(h in a.hosts for a in fenced))
        context = {
            "workflow": wf.name,
            "reason": stuck,
            "drained": list(held),
        }
        if held:
            why = f"{UNMOUNT_FAILED} (workflow {wf.name} {stuck})"
            actions.append(DrainNodes(held, job_reason(job.jobid, why)))
        # in Flux before the workflow is deleted: afterwards nothing says Teardown failed
        actions.append(PostEvent("dws-teardown-failed", context, wait=True))
        actions.append(DeleteWorkflow())
    return actions


def _tolerance(job: JobView, wf: WorkflowView, policy: Policy, now: float) -> list[Action] | None:
    """Setup or PreRun failed on some nodes: go on without them if the job allows it, else
    abort it with a note naming them (flux_dws.core.tolerance); None when this does not apply
    (the ordinary failure path decides)."""
    verdict = tolerated(job, wf)
    return _abort(job, verdict, policy, now) if isinstance(verdict, str) else verdict


def _teardown_stuck(job: JobView, wf: WorkflowView, now: float) -> str | None:
    """Why Teardown cannot end well (the one form, no next step: nothing is left for the user
    to do), or None."""
    if wf.failed:
        reason = wf.message or "workflow status is Error"
    elif job.posted_state is State.TEARDOWN and job.deadline is not None and now >= job.deadline:
        reason = f"did not complete by its deadline: {dws_reason(wf.message) or 'no message'}"
    else:
        return None
    directive = directive_of(wf.directives, directive_index(wf.message))
    return failure_note(State.TEARDOWN.value, reason, job.jobid, directive=directive, step="")


def _without_workflow(job: JobView, wf: WorkflowView | None) -> list[Action]:
    """No workflow (never created, deleted by us, or vanished): create one or let go."""
    if job.request_error or job.request is None:
        reason = f"invalid DWS request: {job.request_error or 'no #DW directives'}"
        step = "correct the job's #DW directives and submit it again"
        return _let_go(job, failure_note(State.PROPOSAL.value, reason, job.jobid, step=step))
    if not job.workflow_created:
        if job.phase is JobPhase.DEPEND and job.exception is None:
            return [CreateWorkflow(job.request.lines, job.userid, job.groupid)]
        if job.phase in (JobPhase.DEPEND, JobPhase.EPILOG) or job.exception is not None:
            return _let_go(job, None)
        never = "no workflow was ever created for this job"
        return _let_go(job, failure_note(State.PROPOSAL.value, never, job.jobid))
    if job.posted_state is State.TEARDOWN or _fatal(job):
        return _torn_down(job) if job.phase is not JobPhase.EPILOG else _let_go(job, None)
    where = job.posted_state or State.PROPOSAL
    name = wf.name if wf is not None else "the job's workflow"
    reason = f"{name} was deleted outside flux-dws while in {where.value}"
    return _let_go(job, failure_note(where.value, reason, job.jobid))


def _let_go(job: JobView, note: str | None) -> list[Action]:
    """Let go of every hold on the job, failing it first with ``note`` if given (and giving
    back the ssd parts an early release began to hold, should its workflow have vanished)."""
    if job.phase is JobPhase.PROLOG:
        return _fail_prolog(job, note)
    if job.phase is JobPhase.EPILOG:
        held: list[Action] = [ReturnStorage(job.ssd)] if job.release and job.ssd else []
        return [*_fail(job, note), *held, FinishEpilog()]
    return _fail(job, note)


def _record(job: JobView, wf: WorkflowView, policy: Policy, now: float) -> list[Action]:
    """Job events that make the job's story visible and the next decision restart-safe."""
    events: list[Action] = []
    if not job.workflow_created:
        timeouts = job.request.describe_timeouts() if job.request else {}
        tolerance = job.request.failure_tolerance if job.request else 0
        context = {"name": wf.name, "namespace": wf.namespace, "timeouts": timeouts}
        events.append(PostEvent("dws-workflow", {**context, "failure_tolerance": tolerance}))
    if job.proposal is not None and not job.proposal_recorded:
        events.append(PostEvent("dws-proposal", job.proposal.to_json()))
    state = wf.desired_state
    # created, or asked for before a restart; a state behind the recorded one only means our
    # request for the later one is still on its way (DWS never goes back)
    if job.posted_state is None or state.index > job.posted_state.index:
        since = wf.desired_state_change if wf.settled and wf.desired_state_change else now
        events.append(_state_event(job, state, policy, since))
    if wf.transient and (job.transient is None or job.transient[0] is not state):
        events.append(
            PostEvent(
                "dws-transient",
                {"state": state.value, "since": now, "message": wf.user_message},
            )
        )
    elif not wf.transient and job.transient is not None:
        events.append(PostEvent("dws-transient", {"state": state.value, "since": None}))
    outcome = wf.container
    if _output_unsaved(job, wf):
        event: dict[str, Any] = {
            "state": outcome.state.value,
            "phase": outcome.phase.value if outcome.phase else None,
        }
        if outcome.state.is_failure:  # the one form first; DWS's own words after it
            event["note"] = container_note(job.jobid, wf)
        event.update(reason=outcome.reason, detail=outcome.detail)
        events.append(SaveOutput(event))
    return events


_TERMINAL_CONTAINER = frozenset(
    {
        ContainerState.EXITED,
        ContainerState.START_FAILED,
        ContainerState.FAILED,
        ContainerState.TIMED_OUT,
    }
)


def _next_wake(job: JobView, wf: WorkflowView, policy: Policy, now: float) -> float | None:
    """The earliest future time at which a deadline or grace period runs out."""
    times = []
    if not wf.complete and job.posted_state is wf.desired_state and job.deadline is not None:
        times.append(job.deadline)
    if wf.transient and job.transient and job.transient[0] is wf.desired_state:
        times.append(job.transient[1] + _timeout(job, "transient", policy))
    future = [t for t in times if t > now]
    return min(future) if future else None


def _sweep_orphan(wf: WorkflowView | None, policy: Policy, now: float) -> list[Action]:
    """A workflow of ours whose job is gone: Teardown, then delete."""
    if wf is None or _released(wf):
        return []
    if wf.desired_state is not State.TEARDOWN:
        return [SetDesiredState(State.TEARDOWN, hurry=True)]
    if wf.complete or wf.failed:
        return [DeleteWorkflow()]
    limit = policy.timeout("teardown").default
    since = wf.desired_state_change
    if since is not None and not math.isinf(limit):
        if now >= since + limit:
            return [DeleteWorkflow()]
        return [WakeAt(since + limit)]
    return []


# ----------------------------------------------------------------------------- early release


def _early_release(
    job: JobView, wf: WorkflowView, policy: Policy, now: float
) -> list[Action] | None:
    """PostRun is over for a job that gives its nodes back early (flux_dws.core.earlyrelease):
    once every ClientMount reads unmounted, record the release (``dws-release``) and give the
    nodes back; past PostRun's deadline, the job fails as the nodes still mounted are drained
    and the others go back.  None when early release does not apply (yet)."""
    begun = earlyrelease.begin(job, wf, _timeout(job, State.POSTRUN.key, policy), now)
    if not isinstance(begun, PostEvent):
        return None if begun is None else [begun]
    return [begun, *_release_nodes(job, wf, begun.context, policy, now)]


def _release_nodes(
    job: JobView, wf: WorkflowView, context: Mapping[str, Any], policy: Policy, now: float
) -> list[Action]:
    """The release itself (again after a restart: every step is idempotent): the workflow
    moves on (to Teardown, failing the job, when PostRun ran past its deadline; to DataOut
    once PostRun is complete), then the nodes go back (earlyrelease.give_back)."""
    reason = untrusted.field(context.get("reason"))
    actions: list[Action] = []
    if wf.desired_state is State.POSTRUN:
        if reason:
            actions += _abort(job, reason, policy, now)
        elif wf.complete:
            actions += _enter(job, State.DATAOUT, policy, now)
    dataout = _timeout(job, State.DATAOUT.key, policy)
    teardown = _timeout(job, State.TEARDOWN.key, policy)
    return [*actions, *earlyrelease.give_back(job, wf, context, dataout, teardown)]
