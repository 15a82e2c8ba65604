# SPDX-License-Identifier: LGPL-3.0-only
"""A restarted service acts while its workflow list is still paging, and safely.

With 10,000 workflows in flight the list takes seconds: a held job whose workflow came on a
page already is decided at once; a job whose workflow may be on a later page waits for the
whole list (deciding it would create a second workflow, or take it for vanished), and so
does the orphan sweep.  kubeapi holds back every page but the first (faults.hold_pages), so
the test sees what the service does in between.
"""

from __future__ import annotations

import pytest
from waiting import wait_for

from flux_dws.core.identity import INSTANCE_LABEL, JOBID_LABEL, workflow_name
from flux_dws.core.states import State
from flux_dws.k8s import KubeClient
from flux_dws.testing.stack import Stack

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
ORPHAN = 1  # "fluxjob-test-1" sorts before every job's workflow: the first page's


def orphan_workflow(identity: str) -> dict:
    """A workflow of this instance whose job it does not hold."""
    return {
        "apiVersion": "dataworkflowservices.github.io/v1alpha7",
        "kind": "Workflow",
        "metadata": {
            "name": workflow_name(identity, ORPHAN),
            "labels": {INSTANCE_LABEL: identity, JOBID_LABEL: str(ORPHAN)},
        },
        "spec": {
            "desiredState": "Proposal",
            "wlmID": "flux",
            "jobID": ORPHAN,
            "userID": 1001,
            "groupID": 1001,
            "dwDirectives": [JOBDW],
        },
    }


@pytest.fixture
def paged(monkeypatch):
    """Workflows listed two to a page; a stack with three jobs cancelled (in Setup) while no
    service ran, each needing its Teardown, and an orphan."""
    monkeypatch.setattr(KubeClient, "_page_size", 2)
    with Stack(hosts=4) as stack:
        jobs = [stack.submit([JOBDW, "#DW Setup action=wait"], runtime=0.05) for _ in range(3)]
        for jobid in jobs:
            stack.wait_workflow(jobid, State.SETUP)
        stack.kill_service()
        for jobid in jobs:
            stack.cancel(jobid)
        stack.api.store.create("workflows", stack.policy.namespace, orphan_workflow(stack.identity))
        yield stack, sorted(jobs, key=lambda j: workflow_name(stack.identity, j))


def workflow_of(stack: Stack, jobid: int) -> dict | None:
    name = workflow_name(stack.identity, jobid)
    found = [w for w in stack.workflows() if w["metadata"]["name"] == name]
    return found[0] if found else None


def test_a_job_on_the_first_page_is_decided_before_the_last_page_is_served(paged):
    stack, (first, *later) = paged  # page 1: the orphan and `first`; pages 2 and 3: `later`
    api = stack.api
    held = api.faults.hold_pages("workflows")
    api.reset_counts()
    stack.start_service()
    try:
        wait_for(
            lambda: (workflow_of(stack, first) or {})["spec"]["desiredState"] == "Teardown",
            what="Teardown for the job whose workflow is on the first page",
            timeout=30,
        )
        assert api.faults.pages_waiting("workflows") == 1  # page 2 asked, still held
        # not seen yet: not decided (no second workflow, not taken for vanished)
        for jobid in later:
            assert workflow_of(stack, jobid)["spec"]["desiredState"] == "Setup"
            assert stack.wait(jobid, "CLEANUP").exception["type"] == "cancel"  # no dws one
        # the orphan on the first page waits for the whole list
        orphan = workflow_of(stack, ORPHAN)
        assert orphan["spec"]["desiredState"] == "Proposal"
        assert not orphan["metadata"].get("deletionTimestamp")
        assert api.request_counts().get(("create", "workflows"), 0) == 0
        assert api.request_counts().get(("delete", "workflows"), 0) == 0
    finally:
        held.set()
    for jobid in (first, *later):
        info = stack.wait(jobid)
        assert info.result == "CANCELED"
        assert info.events("dws-state")[-1]["context"]["state"] == "Teardown"
    wait_for(lambda: workflow_of(stack, ORPHAN) is None, what="the orphan swept", timeout=30)
    assert stack.workflows_left() == []
    assert api.request_counts().get(("create", "workflows"), 0) == 0  # never a second workflow
