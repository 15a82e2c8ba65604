# SPDX-License-Identifier: LGPL-3.0-only
"""flux_dws.core.lifecycle.decide: unit tests per state x status x phase, and a hypothesis model.

The model plays DWS (admission rules included) and Flux's job-manager around decide(), in
pure Python: random observation sequences must never produce an illegal transition, a second
exception, or a hold that is never released.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flux_dws.base.jobid import f58
from flux_dws.core import actions as act
from flux_dws.core import lifecycle as lc
from flux_dws.core.containeroutcome import ContainerOutcome, ContainerState
from flux_dws.core.failing import Refusal
from flux_dws.core.health import Failures
from flux_dws.core.identity import FINALIZER
from flux_dws.core.jobview import EXCEPTION_TYPE, JobException, JobPhase, JobView, ProposalInfo
from flux_dws.core.lifecycle import decide
from flux_dws.core.policy import policy_from_table
from flux_dws.core.request import request_from_attributes
from flux_dws.core.states import STATE_ORDER, State, Status, is_legal_transition
from flux_dws.core.storage import JOBSPEC_STORAGE_KEY
from flux_dws.core.workflow import WorkflowView
from flux_dws.core.workflowstatus import DriverStatus

POLICY = policy_from_table({})
JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
CONTAINER = "#DW container name=c1 profile=ok DW_JOB_local_storage=shared"
GFS2 = "#DW jobdw type=gfs2 capacity=10GiB name=shared"
NOW = 1_800_000_000.0
NAME = "fluxjob-test-42"
NO_CONTAINER = ContainerOutcome(ContainerState.NONE)


def request(*lines: str, **timeouts: str):
    system: dict[str, Any] = {"dw": list(lines or (JOBDW,))}
    if timeouts:
        system["dw_timeout"] = timeouts
    return request_from_attributes(system, POLICY, userid=1001, owner_uid=1001)


def job(phase: JobPhase = JobPhase.DEPEND, **kw: Any) -> JobView:
    base: dict[str, Any] = dict(
        jobid=42,
        phase=phase,
        userid=1001,
        groupid=1001,
        request=request(),
        workflow_created=True,
        proposal_recorded=True,
    )
    base.update(kw)
    return JobView(**base)


def wf(
    desired: State = State.PROPOSAL,
    *,
    state: State | None = "same",  # type: ignore[assignment]
    ready: bool = True,
    status: Status | None = None,
    message: str = "",
    container: ContainerOutcome = NO_CONTAINER,
    deleting: bool = False,
    finalizers: tuple[str, ...] = (FINALIZER,),
    env: dict[str, str] | None = None,
    token: tuple[str, str] | None = None,
    since: float | None = NOW - 1,
) -> WorkflowView:
    if state == "same":
        state = desired
    if status is None:
        status = Status.COMPLETED if ready else Status.DRIVER_WAIT
    return WorkflowView(
        name=NAME,
        namespace="default",
        uid="uid-1",
        resource_version="7",
        jobid="42",
        desired_state=desired,
        state=state,
        ready=ready,
        status=status,
        message=message,
        drivers=(),
        env=env or {"DW_WORKFLOW_NAME": NAME},
        directives=(JOBDW,),
        hurry=False,
        desired_state_change=since,
        ready_change=None,
        elapsed_time_last_state="",
        token_secret=token,
        deleting=deleting,
        finalizers=finalizers,
        labels={},
        container=container,
    )


def kinds(actions: list[act.Action]) -> list[str]:
    return [type(a).__name__ for a in moves(actions)]


def moves(actions: list[act.Action]) -> list[act.Action]:
    """Everything but the job events (checked separately where they matter)."""
    return [a for a in actions if not isinstance(a, act.PostEvent)]


def tears_down(actions: list[act.Action]) -> bool:
    """Teardown is asked for, before the job is failed or its prolog let go (so it is asked
    even should Flux refuse the exception)."""
    kinds_ = moves(actions)
    teardown = act.SetDesiredState(State.TEARDOWN, hurry=True)
    if teardown not in kinds_:
        return False
    first = kinds_.index(teardown)
    return all(not isinstance(a, (act.RaiseException, act.FinishProlog)) for a in kinds_[:first])


def of(actions: list[act.Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def recorded(state: State, deadline: float | None = None, **kw: Any) -> dict[str, Any]:
    """JobView fields for a job on which dws-state for ``state`` was posted."""
    return dict(posted_state=state, deadline=deadline, **kw)


# ----------------------------------------------------------------------------- happy path


def test_new_job_creates_its_workflow_with_the_request_directives():
    j = job(workflow_created=False, proposal_recorded=False, request=request(JOBDW, GFS2))
    (create,) = decide(j, None, POLICY, NOW)
    assert create == act.CreateWorkflow((JOBDW, GFS2), 1001, 1001)


def test_workflow_creation_is_recorded_with_the_effective_timeouts():
    j = job(workflow_created=False, request=request(prerun="7m"))
    events = of(decide(j, wf(ready=False), POLICY, NOW), act.PostEvent)
    (created,) = [e for e in events if e.name == "dws-workflow"]
    assert created.context["name"] == NAME
    assert created.context["timeouts"]["prerun"] == "7m"
    assert created.context["timeouts"]["transient"] == "30s"


def test_each_state_entry_records_an_absolute_deadline_from_desired_state_change():
    j = job(request=request(proposal="2m"))
    (event,) = [e for e in of(decide(j, wf(ready=False), POLICY, NOW), act.PostEvent)]
    assert event.name == "dws-state"
    assert event.context == {"state": "Proposal", "timeout": "2m", "deadline": NOW - 1 + 120}


def test_proposal_ready_reads_proposal_then_releases_with_storage_needs():
    j = job(**recorded(State.PROPOSAL))
    assert kinds(decide(j, wf(), POLICY, NOW)) == ["ReadProposal"]
    j = dataclasses.replace(j, proposal=ProposalInfo())
    (release,) = decide(j, wf(), POLICY, NOW)
    assert isinstance(release, act.ReleaseDependency)
    assert JOBSPEC_STORAGE_KEY in release.jobspec_update


def test_proposal_not_ready_waits():
    j = job(**recorded(State.PROPOSAL, NOW + 100))
    actions = decide(j, wf(ready=False), POLICY, NOW)
    assert kinds(actions) == ["WakeAt"]
    assert of(actions, act.WakeAt)[0].time == NOW + 100


def test_scheduled_job_waits_with_proposal_ready_and_no_deadline():
    j = job(JobPhase.SCHED, proposal=ProposalInfo(), **recorded(State.PROPOSAL, NOW - 5))
    assert moves(decide(j, wf(), POLICY, NOW)) == []


def test_allocated_job_gets_its_nodes_assigned_then_setup():
    j = job(
        JobPhase.PROLOG, hosts=("n1", "n2"), proposal=ProposalInfo(), **recorded(State.PROPOSAL)
    )
    assert moves(decide(j, wf(), POLICY, NOW)) == [
        act.SetDesiredState(State.SETUP, assign=("n1", "n2"))
    ]


def test_setup_done_goes_straight_to_datain_then_prerun():
    j = job(JobPhase.PROLOG, hosts=("n1",), **recorded(State.SETUP))
    assert moves(decide(j, wf(State.SETUP), POLICY, NOW)) == [act.SetDesiredState(State.DATAIN)]
    j = dataclasses.replace(j, posted_state=State.DATAIN)
    assert moves(decide(j, wf(State.DATAIN), POLICY, NOW)) == [act.SetDesiredState(State.PRERUN)]


def test_prerun_ready_starts_the_job_with_the_workflow_environment_and_token():
    env = {"DW_JOB_scratch": "/mnt/nnf/x-0"}
    j = job(JobPhase.PROLOG, **recorded(State.PRERUN))
    secret = ("default", f"{NAME}-token")
    actions = decide(j, wf(State.PRERUN, env=env, token=secret), POLICY, NOW)
    assert actions == [act.FinishProlog(True, env, secret)]


def test_running_job_leaves_prerun_alone():
    j = job(JobPhase.RUN, started=True, **recorded(State.PRERUN))
    assert moves(decide(j, wf(State.PRERUN), POLICY, NOW)) == []


@pytest.mark.parametrize(
    "current,following",
    [
        (State.PRERUN, State.POSTRUN),
        (State.POSTRUN, State.DATAOUT),
        (State.DATAOUT, State.TEARDOWN),
    ],
)
def test_finished_job_walks_postrun_dataout_teardown(current, following):
    j = job(JobPhase.EPILOG, started=True, **recorded(current))
    assert moves(decide(j, wf(current), POLICY, NOW)) == [
        act.SetDesiredState(following, hurry=False)
    ]


def test_teardown_done_deletes_then_epilog_finishes():
    j = job(JobPhase.EPILOG, started=True, **recorded(State.TEARDOWN))
    assert kinds(decide(j, wf(State.TEARDOWN), POLICY, NOW)) == ["DeleteWorkflow"]
    assert kinds(decide(j, None, POLICY, NOW)) == ["FinishEpilog"]
    released = wf(State.TEARDOWN, deleting=True, finalizers=("dataworkflowservices/x",))
    assert kinds(decide(j, released, POLICY, NOW)) == ["FinishEpilog"]


def test_a_job_that_ran_gets_the_teardown_reason_it_was_not_raised_with():
    """The service stopped between the Teardown patch and the raise (seen in the chaos test,
    once the raise waited for the patch's answer): the recorded reason is raised, once."""
    reason = "PostRun failed: user container(s) failed to complete after 300 seconds"
    j = job(JobPhase.EPILOG, started=True, **recorded(State.TEARDOWN, teardown_reason=reason))
    actions = decide(j, wf(State.TEARDOWN, ready=False), POLICY, NOW)
    assert of(actions, act.RaiseException) == [act.RaiseException(reason)]
    raised = dataclasses.replace(j, exception=JobException("dws", 0, reason))
    assert (
        of(decide(raised, wf(State.TEARDOWN, ready=False), POLICY, NOW), act.RaiseException) == []
    )
    assert kinds(decide(raised, wf(State.TEARDOWN), POLICY, NOW)) == ["DeleteWorkflow"]
    # a job torn down with no reason (cancelled) gets none
    assert (
        of(
            decide(
                job(JobPhase.EPILOG, started=True, **recorded(State.TEARDOWN)),
                wf(State.TEARDOWN, ready=False),
                POLICY,
                NOW,
            ),
            act.RaiseException,
        )
        == []
    )


def test_a_refusal_found_while_acting_is_raised_once():
    refusal = Refusal("cannot place the job's storage: no rabbit", state=State.SETUP)
    j = job(JobPhase.PROLOG, **recorded(State.PROPOSAL), refusal=refusal)
    (raised,) = decide(j, wf(State.PROPOSAL), POLICY, NOW)
    assert isinstance(raised, act.RaiseException)
    assert raised.note.startswith("Setup failed: cannot place the job's storage: no rabbit")
    failed = dataclasses.replace(j, exception=JobException("dws", 0, raised.note))
    assert of(decide(failed, wf(State.PROPOSAL), POLICY, NOW), act.RaiseException) == []


# ----------------------------------------------------------------------------- failures


ACTIVE_STATES = [s for s in STATE_ORDER if s is not State.TEARDOWN]
PHASE_FOR = {
    State.PROPOSAL: JobPhase.DEPEND,
    State.SETUP: JobPhase.PROLOG,
    State.DATAIN: JobPhase.PROLOG,
    State.PRERUN: JobPhase.PROLOG,
    State.POSTRUN: JobPhase.EPILOG,
    State.DATAOUT: JobPhase.EPILOG,
}


@pytest.mark.parametrize("state", ACTIVE_STATES)
def test_error_in_any_state_raises_the_message_and_tears_down_at_once(state):
    phase = PHASE_FOR[state]
    # Setup and PreRun first look for the nodes that failed: here none is identified
    found = {"failures": Failures(state.value)} if state in (State.SETUP, State.PRERUN) else {}
    j = job(phase, started=phase is JobPhase.EPILOG, **recorded(state), **found)
    message = "DW Directive 0: User error: no space left"
    actions = decide(j, wf(state, ready=False, status=Status.ERROR, message=message), POLICY, NOW)
    raised = of(actions, act.RaiseException)
    # the state, the directive DWS named (DW Directive 0), DWS's reason without its
    # "User error:" prefix, and where to look next
    assert [r.note for r in raised] == [
        f"{state.value} failed: {JOBDW}: no space left; flux dws status {f58(j.jobid)}"
    ]
    assert tears_down(actions)
    assert (act.FinishProlog(False) in actions) == (phase is JobPhase.PROLOG)
    assert not of(actions, act.ReleaseDependency)


def test_prerun_container_failure_cancels_before_start_with_the_reason():
    outcome = ContainerOutcome(
        ContainerState.TIMED_OUT,
        State.PRERUN,
        "User error: user container(s) failed to start after 300 seconds",
    )
    j = job(JobPhase.PROLOG, **recorded(State.PRERUN))
    actions = decide(
        j, wf(State.PRERUN, ready=False, status=Status.ERROR, container=outcome), POLICY, NOW
    )
    # the containers' output is saved (and dws-container posted) before anything else; then
    # Teardown is asked, before the job is failed (so it is asked should Flux refuse that)
    assert kinds(actions) == ["SaveOutput", "SetDesiredState", "RaiseException", "FinishProlog"]
    (teardown,) = [e for e in of(actions, act.PostEvent) if e.name == "dws-state"]
    assert "failed to start after 300 seconds" in teardown.context["reason"]
    assert "failed to start after 300 seconds" in of(actions, act.RaiseException)[0].note
    assert of(actions, act.FinishProlog)[0].success is False
    (container,) = of(actions, act.SaveOutput)
    assert container.event["state"] == "timed-out"
    assert container.event["phase"] == "PreRun"


def test_postrun_container_failure_fails_the_job_and_skips_dataout():
    outcome = ContainerOutcome(
        ContainerState.FAILED,
        State.POSTRUN,
        "User error: user container(s) failed to run successfully after 7 attempts",
    )
    j = job(JobPhase.EPILOG, started=True, **recorded(State.POSTRUN))
    actions = decide(
        j, wf(State.POSTRUN, ready=False, status=Status.ERROR, container=outcome), POLICY, NOW
    )
    assert "after 7 attempts" in of(actions, act.RaiseException)[0].note
    assert of(actions, act.SetDesiredState) == [act.SetDesiredState(State.TEARDOWN, hurry=True)]


@pytest.mark.parametrize("state", ACTIVE_STATES)
def test_the_reason_for_an_abort_is_recorded_before_teardown_is_asked(state):
    """Once the workflow is in Teardown its status no longer says what failed: a service
    killed right after the patch must still find the reason on the job."""
    phase = PHASE_FOR[state]
    found = {"failures": Failures(state.value)} if state in (State.SETUP, State.PRERUN) else {}
    j = job(phase, started=phase is JobPhase.EPILOG, **recorded(state), **found)
    message = "DW Directive 0: User error: no space left"
    actions = decide(j, wf(state, ready=False, status=Status.ERROR, message=message), POLICY, NOW)
    kinds = [type(a).__name__ for a in actions]
    record = next(
        i for i, a in enumerate(actions) if isinstance(a, act.PostEvent) and a.name == "dws-state"
    )
    assert actions[record].context["reason"] == (
        f"{state.value} failed: {JOBDW}: no space left; flux dws status {f58(j.jobid)}"
    )
    assert record < kinds.index("SetDesiredState") < kinds.index("RaiseException")
    assert actions[record].wait  # the chain asks Teardown only once Flux holds the reason


def test_container_outcome_is_recorded_once():
    outcome = ContainerOutcome(ContainerState.EXITED, State.POSTRUN)
    j = job(JobPhase.EPILOG, started=True, **recorded(State.POSTRUN))

    def recorded_outcomes(view: JobView) -> list[act.SaveOutput]:
        actions = decide(view, wf(State.POSTRUN, container=outcome), POLICY, NOW)
        return of(actions, act.SaveOutput)

    (first,) = recorded_outcomes(j)
    assert first.event["state"] == "exited"
    assert recorded_outcomes(dataclasses.replace(j, container_recorded=ContainerState.EXITED)) == []
    # a restart in DataOut (asked, the output not saved yet) saves it then, once
    dataout = job(JobPhase.EPILOG, started=True, **recorded(State.DATAOUT))
    (again,) = of(
        decide(dataout, wf(State.DATAOUT, container=outcome), POLICY, NOW), act.SaveOutput
    )
    assert again == first


def test_dataout_is_asked_before_the_output_is_saved():
    """The containers exited: DataOut is asked for first, in the same decision, so that the
    save (reading the pods and their logs) does not hold it back: the chain runs in turn."""
    outcome = ContainerOutcome(ContainerState.EXITED, State.POSTRUN)
    j = job(JobPhase.EPILOG, started=True, **recorded(State.POSTRUN))
    actions = decide(j, wf(State.POSTRUN, container=outcome), POLICY, NOW)
    assert kinds(actions) == ["SetDesiredState", "SaveOutput"]
    assert of(actions, act.SetDesiredState) == [act.SetDesiredState(State.DATAOUT)]
    names = [a.name if isinstance(a, act.PostEvent) else type(a).__name__ for a in actions]
    assert names.index("dws-state") < names.index("SaveOutput")  # DataOut recorded first


def test_a_clean_exit_seen_while_postrun_runs_is_saved_with_the_ask_for_dataout():
    """Saved then, the output would hold the chain while PostRun completes, and DataOut with
    it; a failure, or an abort, still saves at once (Teardown follows)."""
    outcome = ContainerOutcome(ContainerState.EXITED, State.POSTRUN)
    j = job(JobPhase.EPILOG, started=True, **recorded(State.POSTRUN, NOW + 60))
    running = wf(State.POSTRUN, ready=False, container=outcome)
    assert not of(decide(j, running, POLICY, NOW), act.SaveOutput)
    cancelled = dataclasses.replace(j, exception=JobException("cancel"))
    actions = decide(cancelled, running, POLICY, NOW)
    assert tears_down(actions)
    assert kinds(actions).index("SaveOutput") < kinds(actions).index("SetDesiredState")
    late = decide(j, running, POLICY, NOW + 60)
    assert tears_down(late)
    assert kinds(late).index("SaveOutput") < kinds(late).index("SetDesiredState")


def test_teardown_waits_for_the_containers_output_on_the_job():
    """Teardown deletes the pods: it is withheld until dws-container is on the job."""
    outcome = ContainerOutcome(ContainerState.EXITED, State.POSTRUN)
    j = job(JobPhase.EPILOG, started=True, **recorded(State.DATAOUT))
    done = wf(State.DATAOUT, container=outcome)
    assert kinds(decide(j, done, POLICY, NOW)) == ["SaveOutput"]
    saved = dataclasses.replace(j, container_recorded=ContainerState.EXITED)
    assert of(decide(saved, done, POLICY, NOW), act.SetDesiredState) == [
        act.SetDesiredState(State.TEARDOWN)
    ]


@pytest.mark.parametrize("how", ["dataout-failed", "cancelled"])
def test_a_teardown_while_the_output_is_unsaved_comes_after_the_save(how):
    outcome = ContainerOutcome(ContainerState.EXITED, State.POSTRUN)
    j = job(JobPhase.EPILOG, started=True, **recorded(State.DATAOUT))
    view = wf(State.DATAOUT, container=outcome)
    if how == "dataout-failed":
        message = "DW Directive 0: User error: copy failed"
        view = wf(
            State.DATAOUT, ready=False, status=Status.ERROR, message=message, container=outcome
        )
    else:
        j = dataclasses.replace(j, exception=JobException("cancel"))
    actions = decide(j, view, POLICY, NOW)
    assert tears_down(actions)
    assert kinds(actions).index("SaveOutput") < kinds(actions).index("SetDesiredState")


def test_transient_condition_is_tolerated_for_the_grace_period_then_fails():
    j = job(JobPhase.PROLOG, **recorded(State.SETUP, NOW + 3600))
    transient = wf(State.SETUP, ready=False, status=Status.TRANSIENT, message="DW Directive 0: x")
    first = decide(j, transient, POLICY, NOW)
    assert [e.name for e in of(first, act.PostEvent)] == ["dws-transient"]
    j = dataclasses.replace(j, transient=(State.SETUP, NOW))
    waiting = decide(j, transient, POLICY, NOW + 29)
    assert kinds(waiting) == ["WakeAt"] and of(waiting, act.WakeAt)[0].time == NOW + 30
    late = decide(j, transient, POLICY, NOW + 30)
    assert "TransientCondition for more than 30s" in of(late, act.RaiseException)[0].note
    assert tears_down(late)


def test_an_error_its_driver_retries_is_waited_for_the_grace_period_then_fails():
    """nnf-sos's unclassified error (``Internal error: <err>``, error ``<err>``) clears on its
    next pass: the job waits as for a TransientCondition, and says so if it does not clear."""
    error = 'nnfcontainerprofiles.nnf.cray.hpe.com "x-1" already exists'
    entry = DriverStatus(
        "nnf", "", 0, State.PROPOSAL, False, "Error", f"Internal error: {error}", error, 0
    )
    message = f"DW Directive 0: Internal error: {error}"
    retried = wf(State.PROPOSAL, ready=False, status=Status.ERROR, message=message)
    retried = dataclasses.replace(retried, drivers=(entry,))
    j = job(JobPhase.PROLOG, **recorded(State.PROPOSAL, NOW + 3600))
    first = decide(j, retried, POLICY, NOW)
    assert [e.name for e in of(first, act.PostEvent)] == ["dws-transient"]
    assert not of(first, act.RaiseException) and not tears_down(first)
    j = dataclasses.replace(j, transient=(State.PROPOSAL, NOW))
    assert kinds(decide(j, retried, POLICY, NOW + 29)) == ["WakeAt"]
    (late,) = of(decide(j, retried, POLICY, NOW + 30), act.RaiseException)
    assert late.note.startswith(
        f"Proposal failed: in Error, retried by its driver, for more than 30s: {error}"
    ), late.note


def test_user_transient_grace_is_used():
    j = job(
        JobPhase.PROLOG,
        request=request(transient="2m"),
        transient=(State.SETUP, NOW),
        **recorded(State.SETUP),
    )
    transient = wf(State.SETUP, ready=False, status=Status.TRANSIENT)
    assert not of(decide(j, transient, POLICY, NOW + 60), act.RaiseException)
    assert of(decide(j, transient, POLICY, NOW + 120), act.RaiseException)


def test_transient_that_clears_is_recorded_as_cleared():
    j = job(JobPhase.PROLOG, transient=(State.SETUP, NOW), **recorded(State.SETUP))
    events = of(decide(j, wf(State.SETUP, ready=False), POLICY, NOW), act.PostEvent)
    assert [(e.name, e.context["since"]) for e in events] == [("dws-transient", None)]


@pytest.mark.parametrize("state", ACTIVE_STATES)
def test_a_state_past_its_deadline_fails_naming_state_and_timeout(state):
    phase = PHASE_FOR[state]
    req = request(**{state.key: "90s"})
    j = job(phase, request=req, started=phase is JobPhase.EPILOG, **recorded(state, NOW - 1))
    actions = decide(j, wf(state, ready=False), POLICY, NOW)
    (raised,) = of(actions, act.RaiseException)
    assert raised.note.startswith(f"{state.value} failed: did not complete within 1.5m")
    assert tears_down(actions)


def test_deadline_does_not_apply_once_the_state_is_ready():
    j = job(JobPhase.RUN, started=True, **recorded(State.PRERUN, NOW - 1000))
    assert moves(decide(j, wf(State.PRERUN), POLICY, NOW)) == []


def test_deadline_counts_from_the_patch_when_dws_has_not_caught_up():
    j = job(JobPhase.PROLOG, **recorded(State.SETUP))
    stale = wf(State.DATAIN, state=State.SETUP, ready=True)
    (event,) = of(decide(j, stale, POLICY, NOW), act.PostEvent)
    assert event.context["deadline"] == NOW + POLICY.timeout("datain").default


# ----------------------------------------------------------------------------- cancels


@pytest.mark.parametrize(
    "phase,state",
    [
        (JobPhase.PROLOG, State.SETUP),
        (JobPhase.PROLOG, State.PRERUN),
        (JobPhase.RUN, State.PRERUN),
        (JobPhase.EPILOG, State.POSTRUN),
        (JobPhase.EPILOG, State.DATAOUT),
    ],
)
def test_one_cancel_is_enough_to_reach_teardown_with_hurry(phase, state):
    started = phase in (JobPhase.RUN, JobPhase.EPILOG)
    j = job(phase, started=started, exception=JobException("cancel"), **recorded(state))
    actions = decide(j, wf(state, ready=False), POLICY, NOW)
    assert not of(actions, act.RaiseException)
    assert tears_down(actions)


def test_cancel_in_depend_before_the_workflow_exists_creates_nothing():
    j = job(workflow_created=False, exception=JobException("cancel"))
    assert moves(decide(j, None, POLICY, NOW)) == []
    epilog = dataclasses.replace(j, phase=JobPhase.EPILOG)
    assert kinds(decide(epilog, None, POLICY, NOW)) == ["FinishEpilog"]


def test_time_limit_after_start_still_runs_postrun_and_dataout():
    j = job(
        JobPhase.EPILOG, started=True, exception=JobException("timeout"), **recorded(State.PRERUN)
    )
    assert moves(decide(j, wf(State.PRERUN), POLICY, NOW)) == [act.SetDesiredState(State.POSTRUN)]


def test_job_that_never_started_goes_straight_to_teardown():
    j = job(
        JobPhase.EPILOG,
        exception=JobException("alloc"),
        proposal=ProposalInfo(),
        **recorded(State.PROPOSAL),
    )
    assert tears_down(decide(j, wf(), POLICY, NOW))


# ----------------------------------------------------------------------------- vanishing


@pytest.mark.parametrize("phase", [JobPhase.DEPEND, JobPhase.SCHED, JobPhase.PROLOG, JobPhase.RUN])
def test_workflow_deleted_behind_our_back_fails_the_job_and_releases_holds(phase):
    j = job(phase, started=phase is JobPhase.RUN, **recorded(State.PROPOSAL))
    actions = decide(j, None, POLICY, NOW)
    assert "deleted outside flux-dws" in of(actions, act.RaiseException)[0].note
    assert (act.FinishProlog(False) in actions) == (phase is JobPhase.PROLOG)


def test_workflow_deleted_in_epilog_before_teardown_fails_and_finishes_epilog():
    j = job(JobPhase.EPILOG, started=True, **recorded(State.DATAOUT))
    assert kinds(decide(j, None, POLICY, NOW)) == ["RaiseException", "FinishEpilog"]


def test_invalid_request_fails_the_job_once():
    j = job(request=None, request_error="system.dw: bad", workflow_created=False)
    (raised,) = decide(j, None, POLICY, NOW)
    assert raised.note == (
        "Proposal failed: invalid DWS request: system.dw: bad; "
        "correct the job's #DW directives and submit it again"
    )
    failed = dataclasses.replace(j, exception=JobException(EXCEPTION_TYPE))
    assert moves(decide(failed, None, POLICY, NOW)) == []


def test_teardown_error_gives_up_deletes_and_lets_the_job_go():
    j = job(JobPhase.EPILOG, started=True, **recorded(State.TEARDOWN, NOW + 100))
    actions = decide(j, wf(State.TEARDOWN, ready=False, status=Status.ERROR), POLICY, NOW)
    assert [e.name for e in of(actions, act.PostEvent)] == ["dws-teardown-failed"]
    assert of(actions, act.PostEvent)[0].wait  # in Flux before the workflow is deleted
    assert kinds(actions) == ["DeleteWorkflow"]


def test_teardown_error_drains_only_the_nodes_still_mounted():
    from flux_dws.core.health import Failures

    hosts = ("c1", "c2", "c3")
    j = job(JobPhase.EPILOG, started=True, hosts=hosts, **recorded(State.TEARDOWN, NOW + 100))
    failed = wf(State.TEARDOWN, ready=False, status=Status.ERROR, message="umount hung")
    assert kinds(decide(j, failed, POLICY, NOW))[0] == "ReadFailures"
    stuck = Failures("Teardown", ("c2",), {"c2": "unmount failed: busy"})
    actions = decide(dataclasses.replace(j, failures=stuck), failed, POLICY, NOW)
    (drain,) = of(actions, act.DrainNodes)
    assert drain.hosts == ("c2",) and "unmount failed" in drain.reason
    (event,) = of(actions, act.PostEvent)
    assert event.context["drained"] == ["c2"]
    none = Failures("Teardown", (), {})
    actions = decide(dataclasses.replace(j, failures=none), failed, POLICY, NOW)
    assert not of(actions, act.DrainNodes) and kinds(actions)[-1] == "DeleteWorkflow"


def test_fenced_computes_fail_the_job_and_are_drained():
    j = job(JobPhase.PROLOG, hosts=("c1", "c2"), **recorded(State.PRERUN, NOW + 100))
    text = "Workflow failed: compute nodes [c2] were fenced during the job"
    actions = decide(
        j, wf(State.PRERUN, ready=False, status=Status.ERROR, message=text), POLICY, NOW
    )
    (drain,) = of(actions, act.DrainNodes)
    assert drain.hosts == ("c2",) and "fenced during the job" in drain.reason
    assert "c2" in of(actions, act.RaiseException)[0].note


def test_workflow_in_a_state_the_job_phase_does_not_allow_is_torn_down():
    j = job(JobPhase.RUN, started=True, **recorded(State.POSTRUN))
    actions = decide(j, wf(State.POSTRUN), POLICY, NOW)
    assert "while the job is in run" in of(actions, act.RaiseException)[0].note


# ----------------------------------------------------------------------------- orphans


def test_orphan_is_torn_down_then_deleted():
    gone = JobView(42, JobPhase.GONE, userid=-1, groupid=-1)
    assert moves(decide(gone, wf(State.PRERUN), POLICY, NOW)) == [
        act.SetDesiredState(State.TEARDOWN, hurry=True)
    ]
    assert moves(decide(gone, wf(State.TEARDOWN), POLICY, NOW)) == [act.DeleteWorkflow()]
    assert moves(decide(gone, wf(State.TEARDOWN, deleting=True, finalizers=()), POLICY, NOW)) == []
    assert moves(decide(gone, None, POLICY, NOW)) == []


# ----------------------------------------------------------------------------- the model


@dataclasses.dataclass
class World:
    """DWS + the job-manager, as decide() sees them; enforces DWS's admission rules."""

    job: JobView
    wf: WorkflowView | None = None
    now: float = NOW
    raised: int = 0
    log: list[str] = dataclasses.field(default_factory=list)

    def apply(self, action: act.Action) -> None:
        self.log.append(repr(action))
        j, w = self.job, self.wf
        if isinstance(action, act.CreateWorkflow):
            assert w is None and j.phase is JobPhase.DEPEND
            self.wf = wf(State.PROPOSAL, state=None, ready=False, status=None, since=None)
            self.wf = dataclasses.replace(self.wf, status=None)
        elif isinstance(action, act.SetDesiredState):
            assert w is not None and not w.deleting
            current = w.desired_state
            assert is_legal_transition(current, action.state), (current, action.state)
            if action.state not in (current, State.TEARDOWN):
                assert w.complete, f"advanced {current} -> {action.state} before it was ready"
            if action.hurry:
                assert action.state is State.TEARDOWN
            # Setup always comes with the job's nodes (Computes and Servers), nothing else does
            if action.state is State.SETUP:
                assert j.phase is JobPhase.PROLOG and action.assign == j.hosts and j.hosts
            else:
                assert action.assign == ()
            if action.state is not current:
                self.wf = dataclasses.replace(
                    w, desired_state=action.state, ready=False, status=Status.DRIVER_WAIT
                )
        elif isinstance(action, act.ReadProposal):
            assert w is not None and w.desired_state is State.PROPOSAL and w.complete
            self.job = dataclasses.replace(j, proposal=ProposalInfo())
        elif isinstance(action, act.ReleaseDependency):
            assert j.phase is JobPhase.DEPEND and j.exception is None
            self.job = dataclasses.replace(j, phase=JobPhase.SCHED)
        elif isinstance(action, act.FinishProlog):
            assert j.phase is JobPhase.PROLOG
            if action.success:
                assert w is not None and w.desired_state is State.PRERUN and w.complete
                self.job = dataclasses.replace(j, phase=JobPhase.RUN, started=True)
            else:
                assert j.exception is not None, "a failed prolog without an exception"
                self.job = dataclasses.replace(j, phase=JobPhase.EPILOG)
        elif isinstance(action, act.FinishEpilog):
            assert j.phase is JobPhase.EPILOG
            assert w is None or (w.deleting and FINALIZER not in w.finalizers)
            self.job = dataclasses.replace(j, phase=JobPhase.GONE)
        elif isinstance(action, act.RaiseException):
            assert j.exception is None or j.exception.severity != 0, "second fatal exception"
            self.raised += 1
            self.job = dataclasses.replace(j, exception=JobException(action.type, 0, action.note))
            self._exception_moves_job()
        elif isinstance(action, act.PostEvent):
            self._record(action)
        elif isinstance(action, act.DeleteWorkflow):
            assert w is not None and w.desired_state is State.TEARDOWN
            self.wf = None
        elif isinstance(action, act.ReadFailures):  # as the service reads them: no node failed
            self.job = dataclasses.replace(j, failures=Failures(action.state.value))
        else:
            assert isinstance(action, act.WakeAt) and action.time > self.now

    def _record(self, event: act.PostEvent) -> None:
        ctx, j = event.context, self.job
        if event.name == "dws-workflow":
            self.job = dataclasses.replace(j, workflow_created=True)
        elif event.name == "dws-proposal":
            self.job = dataclasses.replace(j, proposal_recorded=True)
        elif event.name == "dws-state":
            state = State.parse(ctx["state"])
            self.job = dataclasses.replace(j, posted_state=state, deadline=ctx["deadline"])
        elif event.name == "dws-transient":
            since = ctx["since"]
            transient = None if since is None else (State.parse(ctx["state"]), since)
            self.job = dataclasses.replace(j, transient=transient)
        elif event.name == "dws-container":
            self.job = dataclasses.replace(j, container_recorded=ContainerState(ctx["state"]))

    def _exception_moves_job(self) -> None:
        """What Flux does with a fatal exception: a job not yet running goes to CLEANUP."""
        j = self.job
        if j.phase in (JobPhase.DEPEND, JobPhase.SCHED) or j.phase is JobPhase.RUN:
            self.job = dataclasses.replace(j, phase=JobPhase.EPILOG)

    def service(self) -> None:
        for action in decide(self.job, self.wf, POLICY, self.now):
            self.apply(action)

    # what happens around the service
    def dws(self, outcome: str) -> None:
        w = self.wf
        if w is None or w.deleting:
            return
        if w.state is not w.desired_state:
            self.wf = dataclasses.replace(
                w,
                state=w.desired_state,
                ready=False,
                status=Status.DRIVER_WAIT,
                desired_state_change=self.now,
            )
        elif not w.ready and w.status is not Status.ERROR:
            if outcome == "error":
                self.wf = dataclasses.replace(
                    w, status=Status.ERROR, message="DW Directive 0: boom"
                )
            elif outcome == "transient":
                self.wf = dataclasses.replace(w, status=Status.TRANSIENT)
            else:
                self.wf = dataclasses.replace(w, ready=True, status=Status.COMPLETED)

    def flux(self, event: str) -> None:
        j = self.job
        if event == "alloc" and j.phase is JobPhase.SCHED:
            self.job = dataclasses.replace(j, phase=JobPhase.PROLOG, hosts=("n1",))
        elif event == "finish" and j.phase is JobPhase.RUN:
            self.job = dataclasses.replace(j, phase=JobPhase.EPILOG)
        elif event in ("cancel", "timeout") and j.phase is not JobPhase.GONE:
            if j.exception is None:
                self.job = dataclasses.replace(j, exception=JobException(event))
                if j.phase is not JobPhase.PROLOG:
                    self._exception_moves_job()
        elif event == "vanish" and self.wf is not None:
            self.wf = None
        elif event == "time":
            self.now += 700


EVENTS = st.sampled_from(
    [
        "service",
        "service",
        "service",
        "dws-ok",
        "dws-ok",
        "dws-error",
        "dws-transient",
        "alloc",
        "finish",
        "cancel",
        "timeout",
        "vanish",
        "time",
    ]
)


def step(world: World, event: str) -> None:
    if event == "service":
        world.service()
    elif event.startswith("dws-"):
        world.dws(event[4:])
    else:
        world.flux(event)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(EVENTS, max_size=60), st.sampled_from([(JOBDW,), (GFS2, CONTAINER)]))
def test_any_observation_sequence_stays_legal_and_drains(events, lines):
    world = World(job(workflow_created=False, proposal_recorded=False, request=request(*lines)))
    for event in events:
        step(world, event)
    # Drain: DWS completes whatever it can, the job finishes, time passes; nothing may hang.
    for _ in range(200):
        if world.job.phase is JobPhase.GONE and world.wf is None:
            break
        world.service()
        world.dws("ok")
        world.flux("alloc")
        world.flux("finish")
        world.flux("time")
    assert world.job.phase is JobPhase.GONE, world.log[-10:]
    assert world.wf is None, world.log[-10:]
    assert world.raised <= 1


# ----------------------------------------------------------------------------- exhaustive

ALL_STATUS = [None, *Status]
PHASES = [p for p in JobPhase if p is not JobPhase.GONE]


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("status", ALL_STATUS)
@pytest.mark.parametrize("settled", [True, False])
@pytest.mark.parametrize("exception", [None, "cancel", "timeout"])
def test_every_state_status_phase_gives_only_legal_consistent_actions(
    phase, state, status, settled, exception
):
    started = phase in (JobPhase.RUN, JobPhase.EPILOG)
    ready = status is Status.COMPLETED
    previous = STATE_ORDER[max(state.index - 1, 0)]
    view = wf(state, state=state if settled else previous, ready=ready, status=status)
    j = job(
        phase,
        started=started,
        hosts=("n1",),
        proposal=ProposalInfo(),
        exception=JobException(exception) if exception else None,
        **recorded(state, NOW + 60),
    )
    actions = decide(j, view, POLICY, NOW)
    for action in actions:
        if isinstance(action, act.SetDesiredState):
            assert is_legal_transition(state, action.state)
            if action.state not in (state, State.TEARDOWN):
                assert view.complete, "advanced from a state that is not complete"
            assert not action.hurry or action.state is State.TEARDOWN
        if isinstance(action, act.FinishProlog):
            assert phase is JobPhase.PROLOG
            if not action.success:  # a failed prolog always comes with a fatal exception
                assert j.exception or of(actions, act.RaiseException)
        assert not isinstance(action, act.FinishEpilog) or phase is JobPhase.EPILOG
        assert not isinstance(action, act.ReleaseDependency) or phase is JobPhase.DEPEND
        assert not isinstance(action, act.CreateWorkflow)
    if j.exception is not None:
        assert not of(actions, act.RaiseException), "a second fatal exception"
    if settled and status is Status.ERROR and state is not State.TEARDOWN:
        teardown = act.SetDesiredState(State.TEARDOWN, hurry=True)
        if of(actions, act.ReadFailures):  # Setup/PreRun: find the failed nodes first
            assert phase is JobPhase.PROLOG and state in (State.SETUP, State.PRERUN)
            assert actions == [act.ReadFailures(state)]
            return
        assert teardown in actions
        assert j.exception or of(actions, act.RaiseException)


def test_asking_again_for_a_recorded_state_records_it_only_once():
    # a cancelled job whose Teardown request is still on its way when DWS reports PreRun again
    j = job(JobPhase.PROLOG, exception=JobException("cancel"), **recorded(State.TEARDOWN))
    actions = decide(j, wf(State.PRERUN, ready=False), POLICY, NOW)
    assert act.SetDesiredState(State.TEARDOWN, hurry=True) in actions
    assert not [e for e in of(actions, act.PostEvent) if e.name == "dws-state"]


# ----------------------------------------------------------------------------- unreadable


PROBLEM = "status.drivers: not a list"


def test_an_unreadable_workflow_holds_the_job_until_its_states_deadline():
    j = job(JobPhase.PROLOG, **recorded(State.SETUP, NOW + 100))
    assert lc.decide_unreadable(j, NAME, PROBLEM, NOW - 5, POLICY, NOW) == [act.WakeAt(NOW + 100)]


def test_an_unreadable_workflow_past_the_deadline_fails_the_job_and_asks_teardown():
    j = job(JobPhase.PROLOG, **recorded(State.PRERUN, NOW - 1))
    actions = lc.decide_unreadable(j, NAME, PROBLEM, NOW - 50, POLICY, NOW)
    assert tears_down(actions)
    assert kinds(actions) == ["SetDesiredState", "RaiseException", "FinishProlog"]
    (note,) = [a.note for a in of(actions, act.RaiseException)]
    assert note.startswith("PreRun failed: the workflow cannot be read: status.drivers")
    (state,) = of(actions, act.PostEvent)  # the reason is kept with Teardown, before it
    assert state.wait and state.context["reason"] == note


def test_an_unreadable_workflow_before_any_state_is_bounded_by_proposals_timeout():
    j = job(JobPhase.DEPEND, proposal_recorded=False)
    limit = POLICY.timeout("proposal").default
    actions = lc.decide_unreadable(j, NAME, PROBLEM, NOW, POLICY, NOW)
    assert actions == [act.WakeAt(NOW + limit)]
    late = lc.decide_unreadable(j, NAME, PROBLEM, NOW, POLICY, NOW + limit)
    assert tears_down(late) and of(late, act.RaiseException)


def test_a_workflow_unreadable_past_teardowns_deadline_is_deleted_and_the_job_let_go():
    j = job(
        JobPhase.EPILOG,
        started=True,
        exception=JobException("dws", 0, "PreRun failed: ..."),
        **recorded(State.TEARDOWN, NOW - 1),
    )
    actions = lc.decide_unreadable(j, NAME, PROBLEM, NOW - 500, POLICY, NOW)
    (event,) = of(actions, act.PostEvent)
    assert event.name == "dws-teardown-failed" and event.wait
    assert event.context["workflow"] == NAME and PROBLEM in event.context["reason"]
    assert kinds(actions) == ["DeleteWorkflow", "FinishEpilog"]
    again = dataclasses.replace(j, teardown_failed=True)  # recorded once
    assert kinds(lc.decide_unreadable(again, NAME, PROBLEM, NOW - 500, POLICY, NOW)) == [
        "DeleteWorkflow",
        "FinishEpilog",
    ]
    assert not of(lc.decide_unreadable(again, NAME, PROBLEM, 0, POLICY, NOW), act.PostEvent)


def test_an_orphans_unreadable_workflow_is_left_alone():
    gone = JobView(42, JobPhase.GONE, userid=-1, groupid=-1)
    assert lc.decide_unreadable(gone, NAME, PROBLEM, NOW - 1e6, POLICY, NOW) == []


def test_an_unreadable_problem_is_shown_readable_and_bounded():
    j = job(JobPhase.RUN, started=True, **recorded(State.PRERUN, NOW - 1))
    actions = lc.decide_unreadable(j, NAME, "\x1b]0;pwned\x07" + "x" * 5000, 0, POLICY, NOW)
    (note,) = [a.note for a in of(actions, act.RaiseException)]
    assert "\x1b" not in note and "\x07" not in note and len(note) < 1000
