# SPDX-License-Identifier: LGPL-3.0-only
"""Failure notes read one way: ``<State> failed: [<directive>: ]<reason>; <next step>``, whether
DWS put the failure in status.message ("Internal error: ...") or only in a driver's error
("internal error: ..."), and through decide() for every kind of failure it raises."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_lifecycle import CONTAINER as LC_CONTAINER
from test_lifecycle import EVENTS, GFS2, POLICY, World, job, recorded, request, step, wf
from test_lifecycle import JOBDW as LC_JOBDW
from test_lifecycle import NOW as T
from test_untrusted import unknown_uid

from flux_dws.base.jobid import f58
from flux_dws.cli import main as cli_main
from flux_dws.cli.sources import StackSource
from flux_dws.core import actions as act
from flux_dws.core.containeroutcome import ContainerOutcome, ContainerState
from flux_dws.core.health import Failures
from flux_dws.core.jobview import JobPhase, JobView, ProposalInfo
from flux_dws.core.lifecycle import decide
from flux_dws.core.messages import directive_index, dws_reason, failure_note, next_step
from flux_dws.core.policy import Policy, policy_from_table
from flux_dws.core.release import RELEASE_ANNOTATION, RecordRelease, ReleaseMark
from flux_dws.core.request import request_from_attributes
from flux_dws.core.states import State, Status
from flux_dws.core.storage import AllocationNeed
from flux_dws.core.workflow import view_workflow
from flux_dws.testing.fakeflux import FakeFlux
from flux_dws.testing.kubeapi import ApiError
from flux_dws.testing.stack import Stack

JOBID = 83969966080
JOB = f58(JOBID)
CONTAINER = "#DW container name=my-app profile=red-rock-slushy DW_JOB_local=my-gfs2"
JOBDW = "#DW jobdw type=gfs2 capacity=100GiB name=my-gfs2"
#: One form for all: the state, "failed:", then the rest.
FORM = re.compile(r"^(Proposal|Setup|DataIn|PreRun|PostRun|DataOut|Teardown) failed: \S")


@pytest.mark.parametrize(
    "text",
    [
        "DW Directive 1: Internal error: user container(s) failed to run successfully",
        "internal error: user container(s) failed to run successfully",
        "Internal error: user container(s) failed to run successfully",
        "User error: user container(s) failed to run successfully",
        "WLM error: user container(s) failed to run successfully",
        "user container(s) failed to run successfully",
    ],
)
def test_dws_prefixes_are_dropped_however_dws_wrote_them(text: str) -> None:
    assert dws_reason(text) == "user container(s) failed to run successfully"


def test_the_directive_index_is_read_from_the_message() -> None:
    assert directive_index("DW Directive 3: User error: x") == 3
    assert directive_index("User error: x") is None


@pytest.mark.parametrize(
    ("reason", "step"),
    [
        ("user container(s) failed to run successfully after 7 attempts", f"flux dws logs {JOB}"),
        ("container job Failed (BackoffLimitExceeded): limit", f"flux dws logs {JOB}"),
        ("user container(s) failed to start after 300 seconds", "container profile's image"),
        ("rabbit-1: insufficient capacity available", "flux dws rabbits"),
        ("User ID does not match existing persistent storage", "flux dws persistent share"),
        ("PersistentStorageInstance 'data' not found", "flux dws persistent list"),
        ("disk on fire", f"flux dws status {JOB}"),
    ],
)
def test_each_reason_gets_a_next_step(reason: str, step: str) -> None:
    assert step in next_step(reason, JOBID)
    note = failure_note("PostRun", reason, JOBID)
    assert FORM.match(note) and note.endswith(next_step(reason, JOBID))


def test_a_note_is_one_line_whatever_dws_said() -> None:
    note = failure_note("Setup", "bad\nthing\x00\udcff", JOBID, directive=JOBDW + "\n#DW x")
    assert "\n" not in note and "\x00" not in note
    assert note.startswith(f"Setup failed: {JOBDW} #DW x: bad")


def _workflow(state: str, message: str, drivers: list[dict]) -> dict:
    return {
        "apiVersion": "dataworkflowservices.github.io/v1alpha7",
        "kind": "Workflow",
        "metadata": {"name": "fluxjob-x", "namespace": "default", "uid": "u1"},
        "spec": {
            "desiredState": state,
            "dwDirectives": [JOBDW, CONTAINER],
            "jobID": str(JOBID),
            "userID": 1001,
            "groupID": 1001,
            "wlmID": "flux",
        },
        "status": {
            "state": state,
            "ready": False,
            "status": "Error",
            "message": message,
            "drivers": drivers,
        },
    }


def _driver(state: str, index: int, message: str, error: str) -> dict:
    return {
        "driverID": "nnf",
        "dwdIndex": index,
        "watchState": state,
        "status": "Error",
        "completed": False,
        "message": message,
        "error": error,
    }


@pytest.mark.parametrize(
    "message, driver_message, driver_error",
    [
        (  # the user text in status.message
            "DW Directive 1: Internal error: user container(s) failed to run successfully",
            "Internal error: user container(s) failed to run successfully",
            "internal error: container MPIJob Failed (BackoffLimitExceeded): MPIJob x failed",
        ),
        (  # no user text: only the driver's debug error says what happened
            "DW Directive 1: Internal error: ",
            "Internal error: ",
            "internal error: container job Failed (BackoffLimitExceeded): Job has reached the"
            " specified backoff limit",
        ),
    ],
)
def test_container_failures_read_the_same_way_from_decide(
    message: str, driver_message: str, driver_error: str
) -> None:
    obj = _workflow("PostRun", message, [_driver("PostRun", 1, driver_message, driver_error)])
    wf = view_workflow(obj)
    job = JobView(
        jobid=JOBID,
        phase=JobPhase.EPILOG,
        userid=1001,
        groupid=1001,
        started=True,
        workflow_created=True,
        proposal_recorded=True,
        posted_state=State.POSTRUN,
    )
    raised = [a for a in decide(job, wf, Policy(), 0.0) if isinstance(a, act.RaiseException)]
    assert len(raised) == 1
    note = raised[0].note
    assert FORM.match(note)
    assert note.startswith(f"PostRun failed: {CONTAINER}: ")
    assert "rror: " not in note  # no "Internal error:" / "internal error:" left
    assert note.endswith(f"; the containers' output: flux dws logs {JOB}")


# ---------------------------------------------------------------- every failure, one form
#
# Every text that tells a user a workflow failed starts "<State> failed: ": the job's exception
# notes (fatal or not), Teardown's and an early release's reasons, a failed container's note,
# the outcome saved for a job released early.  The cases below are each path of decide() that
# produces one; the model after them finds any path they miss.

HUGE = 5_000_000 * 2**40  # twice this passes int64: the job's storage cannot be scheduled
HUGE_NEED = AllocationNeed("bd", ("default", "srv"), "xfs", "AllocatePerCompute", HUGE)
NODES = [{"type": "node", "count": 2, "with": [{"type": "slot", "count": 1, "label": "task"}]}]
MARK = ReleaseMark(ssd=("/c/rabbit-0/ssd0",), dataout=3600.0, teardown=1800.0)
EARLY = policy_from_table({"release-nodes": "after-unmount"})
TOLERANT = policy_from_table({"failure-tolerance-max": 1})
GONE = JobView(42, JobPhase.GONE, userid=-1, groupid=-1)
FAILED_CONTAINER = ContainerOutcome(
    ContainerState.FAILED, State.POSTRUN, "Internal error: it crashed", "internal error: x", 0
)


def _released(view):
    return dataclasses.replace(view, annotations={RELEASE_ANNOTATION: MARK.to_annotation()})


def _late_unmount():
    system = {"dw": [LC_JOBDW]}
    asked = request_from_attributes(system, EARLY, userid=1001, owner_uid=1001)
    stuck = Failures("PostRun", ("n2",), {"n2": "unmount failed: busy"})
    return job(
        JobPhase.EPILOG,
        request=asked,
        hosts=("n1", "n2"),
        started=True,
        failures=stuck,
        **recorded(State.POSTRUN, T - 1),
    )


def _tolerant(allowed: int):
    system = {"dw": [LC_JOBDW], "dw_failure_tolerance": allowed}
    asked = request_from_attributes(system, TOLERANT, userid=1001, owner_uid=1001)
    setup = Failures("Setup", ("c2",), {"c2": "could not create file system"})
    return job(
        JobPhase.PROLOG,
        request=asked,
        hosts=("c1", "c2"),
        failures=setup,
        **recorded(State.SETUP, T + 100),
    )


ERROR = dict(ready=False, status=Status.ERROR)
PATHS = {
    "a state's error": (
        job(JobPhase.PROLOG, **recorded(State.DATAIN, T + 100)),
        wf(State.DATAIN, message="DW Directive 0: User error: disk_on_fire", **ERROR),
        POLICY,
    ),
    "a deadline": (
        job(JobPhase.PROLOG, **recorded(State.PRERUN, T - 1)),
        wf(State.PRERUN, ready=False),
        POLICY,
    ),
    "a TransientCondition too long": (
        job(
            JobPhase.PROLOG,
            transient=(State.DATAIN, T - 100),
            **recorded(State.DATAIN, T + 100),
        ),
        wf(State.DATAIN, ready=False, status=Status.TRANSIENT, message="rabbit_busy"),
        POLICY,
    ),
    "a container": (
        job(JobPhase.EPILOG, started=True, **recorded(State.POSTRUN, T + 100)),
        dataclasses.replace(
            wf(State.POSTRUN, container=FAILED_CONTAINER, **ERROR),
            directives=(CONTAINER,),
        ),
        POLICY,
    ),
    "a workflow ahead of its job": (
        job(JobPhase.RUN, started=True, **recorded(State.POSTRUN)),
        wf(State.POSTRUN),
        POLICY,
    ),
    "an environment the job cannot have": (
        job(JobPhase.PROLOG, **recorded(State.PRERUN, T + 100)),
        wf(State.PRERUN, env={"BAD=NAME": "x"}),
        POLICY,
    ),
    "storage that cannot be scheduled": (
        job(
            JobPhase.DEPEND,
            resources=NODES,
            proposal=ProposalInfo(needs=(HUGE_NEED, HUGE_NEED)),
            **recorded(State.PROPOSAL, T + 100),
        ),
        wf(State.PROPOSAL),
        POLICY,
    ),
    "an invalid request": (
        job(request=None, request_error="system.dw: bad", workflow_created=False),
        None,
        POLICY,
    ),
    "a workflow never created": (job(JobPhase.SCHED, workflow_created=False), None, POLICY),
    "a workflow deleted outside flux-dws": (
        job(JobPhase.PROLOG, **recorded(State.PRERUN, T + 100)),
        None,
        POLICY,
    ),
    "a prolog let go without a reason": (
        job(JobPhase.PROLOG, **recorded(State.TEARDOWN, T + 100)),
        None,
        POLICY,
    ),
    "a job torn down before it ran, without a reason": (
        job(JobPhase.SCHED, **recorded(State.TEARDOWN, T + 100)),
        None,
        POLICY,
    ),
    "more failed nodes than tolerated": (
        _tolerant(0),
        wf(State.SETUP, message="DW Directive 0: could not create file system", **ERROR),
        TOLERANT,
    ),
    "failed nodes tolerated (severity 1)": (
        _tolerant(1),
        wf(State.SETUP, message="DW Directive 0: could not create file system", **ERROR),
        TOLERANT,
    ),
    "fenced computes": (
        job(JobPhase.PROLOG, hosts=("c1", "c2"), **recorded(State.PRERUN, T + 100)),
        wf(State.PRERUN, message="compute nodes [c2] were fenced during the job", **ERROR),
        POLICY,
    ),
    "an unmount too late for the early release": (
        _late_unmount(),
        wf(State.POSTRUN, ready=False),
        EARLY,
    ),
    "Teardown's error": (
        job(JobPhase.EPILOG, started=True, **recorded(State.TEARDOWN, T + 100)),
        wf(State.TEARDOWN, message="umount hung", **ERROR),
        POLICY,
    ),
    "Teardown's deadline": (
        job(JobPhase.EPILOG, started=True, **recorded(State.TEARDOWN, T - 1)),
        wf(State.TEARDOWN, ready=False),
        POLICY,
    ),
    "DataOut's error after the release": (
        GONE,
        _released(wf(State.DATAOUT, message="DW Directive 0: Internal error: copy", **ERROR)),
        EARLY,
    ),
    "DataOut's deadline after the release": (
        GONE,
        _released(wf(State.DATAOUT, ready=False, since=T - 4000)),
        EARLY,
    ),
    "Teardown's deadline after the release": (
        GONE,
        _released(wf(State.TEARDOWN, ready=False, since=T - 2000)),
        EARLY,
    ),
}


def failure_texts(actions: list[act.Action]) -> list[str]:
    """Every text in ``actions`` that tells a user something failed."""
    texts = []
    for action in actions:
        if isinstance(action, act.RaiseException):
            texts.append(action.note)
        elif isinstance(action, act.PostEvent) and action.name in ("dws-teardown-failed",):
            texts.append(action.context["reason"])
        elif isinstance(action, act.PostEvent) and action.context.get("reason"):
            texts.append(action.context["reason"])  # dws-state Teardown, dws-release
        elif isinstance(action, act.SaveOutput) and "note" in action.event:
            texts.append(action.event["note"])
        elif isinstance(action, RecordRelease) and action.outcome.get("status") == "failed":
            texts.append(action.outcome["message"])
    return texts


@pytest.mark.parametrize("path", PATHS)
def test_every_failure_decide_finds_reads_one_way(path: str) -> None:
    view, workflow, policy = PATHS[path]
    texts = failure_texts(decide(view, workflow, policy, T))
    assert texts, "no failure found"
    for text in texts:
        assert FORM.match(text), text
        assert not re.search(r"(?i)\b(user|wlm|internal) error: ", text), text  # DWS's prefix


class _Checked(World):
    """The lifecycle model (tests/test_lifecycle.py), checking every failure text."""

    def apply(self, action: act.Action) -> None:
        for text in failure_texts([action]):
            assert FORM.match(text), text
        super().apply(action)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(EVENTS, max_size=60), st.sampled_from([(LC_JOBDW,), (GFS2, LC_CONTAINER)]))
# a Teardown past its deadline reads which nodes still hold a mount (ReadFailures(Teardown))
@example(["service", "dws-ok", "dws-ok", "service", "service", "alloc"], (LC_JOBDW,))
def test_any_observation_sequence_fails_jobs_in_the_one_form(events, lines) -> None:
    world = _Checked(job(workflow_created=False, proposal_recorded=False, request=request(*lines)))
    for event in events:
        step(world, event)
    for _ in range(50):
        world.service()
        world.flux("time")


# ------------------------------------------------------------ through the service and the CLI

XFS = "#DW jobdw type=xfs capacity=1GiB name={}"
CRASH = [
    "#DW jobdw type=gfs2 capacity=10GiB name=shared",
    "#DW container name=app profile=crash-loop DW_JOB_local_storage=shared",
]


def _cli(stack: Stack, *argv: str) -> str:
    out = io.StringIO()
    code = cli_main(
        list(argv), out=out, err=io.StringIO(), source_factory=lambda: StackSource(stack)
    )
    assert code == 0
    return out.getvalue()


def test_every_failure_the_service_and_plugin_raise_reads_one_way() -> None:
    """The failures the service finds itself (DWS's admission, the passwd lookup, a create
    Kubernetes refuses for good or keeps refusing, an environment, a copy, a workflow deleted
    by hand) and those DWS reports, through kubeapi, dwssim and fakeflux; then what ``flux
    dws status`` and ``flux dws logs`` show of a failed container; then the plugin's
    service-wait."""
    with Stack(hosts=2, config={"restrict-persistent": False}) as stack:
        assert stack.api is not None
        stack.reject_directives_containing("name=forbidden", "refused by the site's rules")

        def admit(operation: str, old: dict | None, new: dict) -> dict:
            lines = " ".join((new.get("spec") or {}).get("dwDirectives") or [])
            status = new.get("status") or {}
            if operation == "CREATE" and "name=huge" in lines:
                raise ApiError(413, "RequestEntityTooLarge", "Request entity too large: limit 3MB")
            if operation == "CREATE" and "name=sad" in lines:
                raise ApiError(503, "ServiceUnavailable", "etcd is sad")
            if "name=badenv" in lines and status.get("state") == "PreRun":
                status.setdefault("env", {})["BAD=NAME"] = "x"
            return new

        stack.api.store.add_admission("workflows", admit)
        jobs = {
            "Proposal failed: DWS rejected the job's directives: ": stack.submit(
                XFS.format("forbidden")
            ),
            "Proposal failed: cannot set the workflow's groupID: uid ": stack.submit(
                XFS.format("scratch"), userid=unknown_uid()
            ),
            "Proposal failed: creating the job's workflow: ": stack.submit(XFS.format("huge")),
            "Proposal failed: creating the job's workflow kept failing for 2s: ": stack.submit(
                XFS.format("sad"), timeouts={"proposal": "2s"}
            ),
            "PreRun failed: variable name 'BAD=NAME' ": stack.submit(XFS.format("badenv")),
            "DataIn failed: #DW copy_in source=/lus/missing/in destination=$DW_JOB_scratch/in: ": (
                stack.submit(
                    [
                        XFS.format("scratch"),
                        "#DW copy_in source=/lus/missing/in destination=$DW_JOB_scratch/in",
                    ]
                )
            ),
            f"PostRun failed: {CRASH[1]}: ": stack.submit(CRASH, runtime=0.05),
        }
        deleted = stack.submit([XFS.format("scratch"), "#DW PreRun action=wait"])
        stack.wait_workflow(deleted, State.PRERUN)
        stack.delete_workflow_behind_our_back(deleted)
        jobs["PreRun failed: the job's workflow was deleted outside flux-dws"] = deleted
        for lead, jobid in jobs.items():
            note = (stack.wait(jobid, timeout=60).exception or {}).get("note", "")
            assert FORM.match(note) and note.startswith(lead), note
            assert not re.search(r"(?i)\b(user|wlm|internal) error: ", note), note
        crashed = jobs[f"PostRun failed: {CRASH[1]}: "]
        status = _cli(stack, "status", str(crashed))
        logs = _cli(stack, "logs", str(crashed))
        note = stack.flux.info(crashed).exception["note"]
    # the container's failure leads in the one form; DWS's detail follows, without its
    # "internal error:" (nor status.message's "Internal error:")
    assert f"CONTAINER  {note}" in status.splitlines()
    assert f"{f58(crashed)}: container {note}" in logs.splitlines()
    assert "DETAIL     container MPIJob Failed (BackoffLimitExceeded/): " in status
    assert "  detail: container MPIJob Failed (BackoffLimitExceeded/): " in logs
    assert "error:" not in (status + logs).lower()
    with FakeFlux(service_wait=0.05) as flux:
        jobid = flux.submit({"dw": XFS.format("scratch")}, runtime=0.0)
        note = flux.wait_event(jobid, "exception", timeout=60)["context"]["note"]
    assert note == (
        "Proposal failed: flux-dws service is not running after waiting 50ms ([dws]"
        " service-wait): storage not set up; submit the job again once the service is back"
    )
