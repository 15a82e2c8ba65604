# SPDX-License-Identifier: LGPL-3.0-only
"""Restarts: the service is killed (as SIGKILL would) and started again with jobs in flight.

Runs against every job-manager backend (fakeflux, and real Flux where installed).  What must hold:
a restarted service enforces the same deadlines, picks up jobs that arrived or changed while it
was down, sweeps only its own orphans, and never touches another instance's workflows.
"""

from __future__ import annotations

import time

from flux_dws.core.identity import FINALIZER, INSTANCE_LABEL, JOBID_LABEL
from flux_dws.core.states import State
from tests.waiting import wait_for

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"


def exception_note(info) -> str:
    return (info.exception or {}).get("note", "")


def test_deadline_set_before_a_restart_is_kept(stack):
    """The restarted service enforces the deadline recorded before it died, not a fresh one.

    The service stays down until the deadline has passed, so a service that keeps it fails
    the job as soon as it is back; one that started a fresh 4 s timer would fail it 4 s
    after.  "As soon as it is back" is measured from the restarted service's first act (a
    marker job's workflow), not from the clock, so a slow restart on a loaded machine
    cannot fail the test.
    """
    jobid = stack.submit([JOBDW, "#DW PreRun action=wait"], timeouts={"prerun": "4s"})
    stack.wait_workflow(jobid, State.PRERUN)
    deadline, give_up = None, time.monotonic() + 30
    while deadline is None:  # the PreRun dws-state is posted right after asking for PreRun
        assert time.monotonic() < give_up, "no dws-state event for PreRun"
        for event in stack.wait(jobid, "RUN").events("dws-state"):
            if event["context"]["state"] == "PreRun":
                deadline = event["context"]["deadline"]
    stack.kill_service()
    while time.time() <= deadline + 0.5:  # down until the deadline is behind us
        time.sleep(0.1)
    assert stack.wait(jobid, "RUN").exception is None  # nobody enforced it meanwhile
    stack.start_service()
    marker = stack.submit(JOBDW, runtime=0.05)
    back = stack.wait_event(marker, "dws-workflow")["timestamp"]
    info = stack.wait(jobid)
    assert "PreRun failed: did not complete within 4s" in exception_note(info)
    (raised,) = [e for e in info.eventlog if e["name"] == "exception"]
    assert raised["timestamp"] > deadline
    # the old deadline, at once: a fresh 4 s from the restart would come 4 s after `back`
    assert raised["timestamp"] < back + 2.0
    assert [e["context"]["state"] for e in info.events("dws-state")].count("PreRun") == 1
    assert stack.wait(marker).result == "COMPLETED"


def test_job_submitted_while_the_service_is_down_waits_then_runs(stack):
    stack.kill_service()
    jobid = stack.submit(JOBDW, runtime=0.05)
    stack.wait_event(jobid, "dws-waiting")
    time.sleep(0.5)
    assert "dws-workflow" not in stack.wait(jobid, "DEPEND").event_names()
    stack.start_service()
    info = stack.wait(jobid)
    assert info.result == "COMPLETED"
    assert stack.workflows_left() == []


def test_job_cancelled_while_the_service_is_down_is_torn_down_after(stack):
    jobid = stack.submit([JOBDW, "#DW Setup action=wait"], runtime=0.05)
    stack.wait_workflow(jobid, State.SETUP)
    stack.kill_service()
    stack.cancel(jobid)
    time.sleep(0.3)
    assert stack.wait(jobid, "CLEANUP").holds == {"prolog:dws"}  # held, not killed
    stack.start_service()
    info = stack.wait(jobid)
    assert info.result == "CANCELED"
    assert info.events("dws-state")[-1]["context"]["state"] == "Teardown"
    wait_for(  # the workflow's delete may still be under way (the real DWS's finalizer)
        lambda: (
            not [w for w in stack.workflows() if w["metadata"]["labels"][JOBID_LABEL] == str(jobid)]
        ),
        "its workflow deleted",
    )


def test_restart_in_every_hold_ends_every_job(stack):
    depend = stack.submit([JOBDW, "#DW Proposal action=wait"], timeouts={"proposal": "3s"})
    prolog = stack.submit([JOBDW, "#DW DataIn action=wait"], timeouts={"datain": "3s"})
    epilog = stack.submit([JOBDW, "#DW DataOut action=wait"], timeouts={"dataout": "3s"})
    stack.wait_workflow(depend, State.PROPOSAL)
    stack.wait_workflow(prolog, State.DATAIN)
    stack.wait_workflow(epilog, State.DATAOUT)
    stack.kill_service()
    stack.start_service()
    for jobid, state in ((depend, "Proposal"), (prolog, "DataIn"), (epilog, "DataOut")):
        info = stack.wait(jobid)
        assert info.attach_status != 0 and info.exception["type"] == "dws", (jobid, info.exception)
        assert f"{state} failed: did not complete within 3s" in exception_note(info)
        assert not info.holds
        assert len([e for e in info.eventlog if e["name"] == "exception"]) == 1
    assert stack.workflows_left() == []


def test_orphans_of_this_instance_are_swept_and_others_left_alone(stack):
    if stack.api is None:
        return
    store, namespace = stack.api.store, stack.policy.namespace
    ours = _workflow(f"fluxjob-{stack.identity}-999999", stack.identity, "999999")
    theirs = _workflow(f"fluxjob-{stack.identity}-999998", "another-cluster", "999998")
    unlabelled = _workflow("fluxjob-unlabelled-1", None, "1")
    stack.kill_service()
    for obj in (ours, theirs, unlabelled):
        store.create("workflows", namespace, obj)
    names = (theirs["metadata"]["name"], unlabelled["metadata"]["name"])
    before = {name: _ours_to_change(store.get("workflows", namespace, name)) for name in names}
    stack.start_service()
    deadline = time.monotonic() + 30
    while any(w["metadata"]["name"] == ours["metadata"]["name"] for w in stack.workflows()):
        assert time.monotonic() < deadline, "our orphan was not swept"
        time.sleep(0.05)
    for name, fields in before.items():  # dwssim (DWS) may work on them; flux-dws must not
        assert _ours_to_change(store.get("workflows", namespace, name)) == fields


def _ours_to_change(obj: dict) -> tuple:
    """What flux-dws writes on a workflow: its spec, labels, finalizers, existence."""
    meta = obj["metadata"]
    ours = FINALIZER in (meta.get("finalizers") or [])
    return (obj["spec"], meta.get("labels"), ours, meta.get("deletionTimestamp"))


def _workflow(name: str, instance: str | None, jobid: str) -> dict:
    labels = {JOBID_LABEL: jobid}
    if instance:
        labels[INSTANCE_LABEL] = instance
    return {
        "apiVersion": "dataworkflowservices.github.io/v1alpha7",
        "kind": "Workflow",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "desiredState": "Proposal",
            "wlmID": "flux",
            "jobID": jobid,
            "userID": 1001,
            "groupID": 1001,
            "dwDirectives": [JOBDW],
        },
    }
