# SPDX-License-Identifier: LGPL-3.0-only
"""Failure notes read one way: ``<State> failed: [<directive>: ]<reason>; <next step>``, whether
DWS put the failure in status.message ("Internal error: ...") or only in a driver's error
("internal error: ..."), and through decide() for every kind of failure it raises."""

from __future__ import annotations

import re

import pytest

from flux_dws.base.jobid import f58
from flux_dws.core import lifecycle as lc
from flux_dws.core.lifecycle import JobPhase, JobView, decide
from flux_dws.core.messages import directive_index, dws_reason, failure_note, next_step
from flux_dws.core.policy import Policy
from flux_dws.core.states import State
from flux_dws.core.workflow import view_workflow

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
    raised = [a for a in decide(job, wf, Policy(), 0.0) if isinstance(a, lc.RaiseException)]
    assert len(raised) == 1
    note = raised[0].note
    assert FORM.match(note)
    assert note.startswith(f"PostRun failed: {CONTAINER}: ")
    assert "rror: " not in note  # no "Internal error:" / "internal error:" left
    assert note.endswith(f"; the containers' output: flux dws logs {JOB}")
