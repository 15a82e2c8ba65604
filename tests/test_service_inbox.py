# SPDX-License-Identifier: LGPL-3.0-only
"""The service's watch inbox: a backlog of watch events costs one decision per workflow.

Under load the loop falls behind the watch; only the newest version of each workflow is worth
parsing and deciding on, and events must still be taken in the order they first arrived.
"""

from __future__ import annotations

import os

import pytest

from flux_dws.base.loop import Loop
from flux_dws.core.identity import INSTANCE_LABEL, JOBID_LABEL, workflow_name
from flux_dws.core.policy import policy_from_table
from flux_dws.flux.jobmanager import JobManager
from flux_dws.k8s import KubeClient
from flux_dws.service.service import Service
from flux_dws.testing.fakeflux import FakeFlux

IDENTITY = "inbox"


def workflow(jobid: int, rv: int, state: str = "Proposal", uid: str = "") -> dict:
    name = workflow_name(IDENTITY, jobid)
    return {
        "apiVersion": "dataworkflowservices.github.io/v1alpha7",
        "kind": "Workflow",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid or f"uid-{jobid}",
            "resourceVersion": str(rv),
            "labels": {INSTANCE_LABEL: IDENTITY, JOBID_LABEL: str(jobid)},
        },
        "spec": {"jobID": jobid, "desiredState": state, "dwDirectives": []},
        "status": {"state": state, "ready": False, "status": "DriverWait"},
    }


@pytest.fixture
def service(kubeapi):
    loop = Loop(name="inbox-test")  # never started: the test runs its callbacks
    flux = FakeFlux(["compute-01"], owner_uid=os.getuid())
    kube = KubeClient.connect(namespace="default", identity=IDENTITY, kubeconfig=kubeapi.kubeconfig)
    svc = Service(
        policy=policy_from_table({"instance": IDENTITY, "api-threads": 2}),
        loop=loop,
        jobmanager=JobManager(flux.connect(loop)),
        kube=kube,
        owner_uid=os.getuid(),
    )
    handled: list[tuple[str, str, str]] = []
    handle = svc._on_workflow_event

    def counted(kind, obj, seen):
        meta = obj["metadata"]
        handled.append((kind, meta["uid"], meta["resourceVersion"]))
        handle(kind, obj, seen)

    svc._on_workflow_event = counted
    svc.handled = handled
    yield svc
    svc.worker.stop()
    kube.close()


def test_a_backlog_is_decided_once_per_workflow_on_its_newest_version(service):
    for rv in (10, 11, 12):
        service._on_workflow_event_thread("MODIFIED", workflow(1, rv))
    service._on_workflow_event_thread("ADDED", workflow(2, 13))
    service._on_workflow_event_thread("MODIFIED", workflow(1, 14, state="Setup"))
    service.loop.run_pending()
    assert service.handled == [("MODIFIED", "uid-1", "14"), ("ADDED", "uid-2", "13")]
    assert service.jobs[1].workflow.resource_version == "14"
    assert service.jobs[1].workflow.state.value == "Setup"


def test_a_deletion_and_a_re_creation_both_arrive_in_order(service):
    service._on_workflow_event_thread("MODIFIED", workflow(3, 20))
    service._on_workflow_event_thread("DELETED", workflow(3, 21))
    service._on_workflow_event_thread("ADDED", workflow(3, 22, uid="uid-3-again"))
    service.loop.run_pending()
    assert service.handled == [("DELETED", "uid-3", "21"), ("ADDED", "uid-3-again", "22")]
    assert service.jobs[3].workflow.uid == "uid-3-again"


def test_events_after_a_drain_are_drained_again(service):
    service._on_workflow_event_thread("MODIFIED", workflow(4, 30))
    service.loop.run_pending()
    service._on_workflow_event_thread("MODIFIED", workflow(4, 31))
    service.loop.run_pending()
    assert [rv for _, _, rv in service.handled] == ["30", "31"]


def test_a_watch_event_older_than_the_known_version_is_ignored(service):
    """The service adopts a workflow from its own patch's response, ahead of the watch; the
    watch's older event must not undo it (it once undid a release mark, and a released job's
    workflow was swept to Teardown before DataOut's outcome was saved)."""
    service._on_workflow_event_thread("MODIFIED", workflow(5, 50, state="PostRun"))
    service.loop.run_pending()
    service._on_workflow_event_thread("MODIFIED", workflow(5, 49, state="PreRun"))
    service.loop.run_pending()
    assert service.jobs[5].workflow.resource_version == "50"
    assert service.jobs[5].workflow.state.value == "PostRun"
    # A re-created workflow (another uid) counts from its own versions; a deletion always counts.
    service._on_workflow_event_thread("ADDED", workflow(5, 7, uid="uid-5-again"))
    service.loop.run_pending()
    assert (service.jobs[5].workflow.uid, service.jobs[5].workflow.resource_version) == (
        "uid-5-again",
        "7",
    )
    service._on_workflow_event_thread("DELETED", workflow(5, 6, uid="uid-5-again"))
    service.loop.run_pending()
    assert service.jobs[5].workflow is None


def test_a_handler_that_raises_for_one_workflow_loses_no_other_event(caplog):
    """A bug met while handling one workflow's event (seen: a fact the loop could not write)
    must not drop the rest of the batch: a workflow missing from the first list is taken for
    deleted, and its job failed."""
    from flux_dws.service.inbox import Inbox

    loop = Loop()
    handled: list[str] = []

    def handle(kind: str, obj: dict, seen: float) -> None:
        name = obj["metadata"]["name"]
        if name.endswith("-2"):
            raise KeyError("a bug")
        handled.append(name)

    inbox = Inbox(loop, handle)
    for jobid in (1, 2, 3):
        inbox.put("ADDED", workflow(jobid, 10 + jobid))
    loop.run_pending()
    assert handled == [workflow_name(IDENTITY, 1), workflow_name(IDENTITY, 3)]
    assert inbox.depth() == 0
    assert f"workflow {workflow_name(IDENTITY, 2)}: handling its ADDED event failed" in caplog.text
