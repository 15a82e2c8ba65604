# SPDX-License-Identifier: LGPL-3.0-only
"""dwssim: the DWS + NNF simulator, driven as a WLM drives DWS, against the in-process store.

A test creates workflows with store.create, moves them with merge patches of desiredState,
writes Computes and Servers, and reads what the simulator wrote: statuses, messages, driver
entries, companions.  Container timeouts run at time_scale 0.001 (300 s -> 0.3 s).
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux_dws.core.states import State
from flux_dws.core.storage import needs_from_breakdowns, plan_servers, rabbit_map
from flux_dws.testing.dwssim import (
    BEHAVIOR_ANNOTATION,
    FINALIZER,
    PROFILES,
    RESTRICTED_USER_ID,
    Behavior,
    DwsSim,
    container_profile,
    go_duration,
    resolve_delays,
    seed,
)
from flux_dws.testing.dwssim.status import (
    FORCED_READY_MESSAGE,
    enter_state,
    force_ready,
    roll_up,
)
from flux_dws.testing.kubeapi import ApiError, Store

NS = "default"
COMPUTES = ("node0", "node1", "node2")
SCALE = 0.001
WAIT = 60.0  # generous bound for the simulator to act; never an assertion on speed
UID, GID = 1000, 1000
GFS2 = "#DW jobdw type=gfs2 capacity=10GiB name=scratch"


# ---------------------------------------------------------------------------- harness


@pytest.fixture
def store() -> Store:
    s = Store()
    seed(s, COMPUTES, rabbits={"rabbit-0": ["node0", "node1"], "rabbit-1": ["node2"]})
    return s


@pytest.fixture
def sim(store: Store) -> Iterator[DwsSim]:
    with DwsSim(store, time_scale=SCALE, seed=7) as running:
        yield running


def create(store: Store, name: str, directives: list[str], uid: int = UID) -> dict[str, Any]:
    return store.create(
        "workflows",
        NS,
        {
            "apiVersion": "dataworkflowservices.github.io/v1alpha7",
            "kind": "Workflow",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "desiredState": "Proposal",
                "wlmID": "flux",
                "jobID": 42,
                "userID": uid,
                "groupID": GID,
                "dwDirectives": directives,
            },
        },
    )


def wait_for(
    store: Store, name: str, check: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    while True:
        try:
            wf = store.get("workflows", NS, name)
        except ApiError as exc:
            if exc.code != 404:
                raise
            wf = {}
        if check(wf):
            return wf
        if time.monotonic() > deadline:
            raise AssertionError(f"workflow {name}: never {what}; last status {wf.get('status')}")
        time.sleep(0.002)


def settled(state: str) -> Callable[[dict[str, Any]], bool]:
    """The state is reached and the simulator has decided: ready, or failed."""

    def check(wf: dict[str, Any]) -> bool:
        status = wf.get("status") or {}
        return status.get("state") == state and (
            status.get("ready") or status.get("status") in ("Error", "TransientCondition")
        )

    return check


def move(store: Store, name: str, state: str) -> dict[str, Any]:
    """Set desiredState as a WLM does, and wait until the simulator has settled it."""
    store.patch("workflows", NS, name, {"spec": {"desiredState": state}})
    return wait_for(store, name, settled(state), f"settled in {state}")


def allocate(store: Store, name: str, hosts: tuple[str, ...] = COMPUTES) -> None:
    """What flux-dws does after Proposal: fill the Servers from the breakdowns, name the nodes."""
    wf = store.get("workflows", NS, name)
    breakdowns = [
        store.get("directivebreakdowns", ref["namespace"], ref["name"])
        for ref in wf["status"].get("directiveBreakdowns") or []
    ]
    config = store.get("systemconfigurations", "default", "default")
    plan = plan_servers(needs_from_breakdowns(breakdowns), hosts, rabbit_map(config))
    for (namespace, servers), sets in plan.items():
        store.patch("servers", namespace, servers, {"spec": {"allocationSets": sets}})
    store.patch("computes", NS, name, {"data": [{"name": h} for h in hosts]})


def run_to(store: Store, name: str, last: str, hosts: tuple[str, ...] = COMPUTES) -> dict:
    """Proposal (already requested) through ``last``, allocating after Proposal."""
    wf = wait_for(store, name, settled("Proposal"), "settled in Proposal")
    for state in ("Setup", "DataIn", "PreRun", "PostRun", "DataOut", "Teardown"):
        if state == "Setup":
            allocate(store, name, hosts)
        wf = move(store, name, state)
        if state == last or not wf["status"]["ready"]:
            return wf
    return wf


def entry(wf: dict[str, Any], index: int, state: str) -> dict[str, Any]:
    (found,) = [
        d for d in wf["status"]["drivers"] if d["dwdIndex"] == index and d["watchState"] == state
    ]
    return found


def exists(store: Store, plural: str, name: str, namespace: str = NS) -> bool:
    try:
        store.get(plural, namespace, name)
    except ApiError as exc:
        assert exc.code == 404
        return False
    return True


# ---------------------------------------------------------------------------- the states


def test_a_jobdw_workflow_goes_through_every_state(store: Store, sim: DwsSim) -> None:
    wf = create(store, "wf-all", ["#DW jobdw type=xfs capacity=1GiB name=my-scratch"])
    uid = wf["metadata"]["uid"]
    wf = wait_for(store, "wf-all", settled("Proposal"), "ready in Proposal")
    status = wf["status"]
    assert (status["ready"], status["status"]) == (True, "Completed")
    assert "message" not in status  # omitempty, as DWS writes it
    assert FINALIZER in wf["metadata"]["finalizers"]
    assert status["computes"] == {"kind": "Computes", "name": "wf-all", "namespace": NS}
    computes = store.get("computes", NS, "wf-all")
    assert computes["data"] == []
    assert computes["metadata"]["ownerReferences"][0]["uid"] == uid
    assert status["directiveBreakdowns"] == [
        {"kind": "DirectiveBreakdown", "name": "wf-all-0", "namespace": NS}
    ]
    bd = store.get("directivebreakdowns", NS, "wf-all-0")
    assert bd["spec"] == {
        "directive": "#DW jobdw type=xfs capacity=1GiB name=my-scratch",
        "userID": UID,
    }
    storage = bd["status"]["storage"]
    assert storage["lifetime"] == "job"
    assert storage["reference"] == {"kind": "Servers", "name": "wf-all-0", "namespace": NS}
    (aset,) = storage["allocationSets"]
    assert (aset["allocationStrategy"], aset["label"], aset["minimumCapacity"]) == (
        "AllocatePerCompute",
        "xfs",
        1024**3,
    )
    assert store.get("servers", NS, "wf-all-0")["spec"] == {}

    allocate(store, "wf-all")
    for state in ("Setup", "DataIn", "PreRun", "PostRun", "DataOut", "Teardown"):
        wf = move(store, "wf-all", state)
        status = wf["status"]
        assert (status["ready"], status["status"]) == (True, "Completed")
        assert "message" not in status  # omitempty, as DWS writes it
        assert status["readyChange"] >= status["desiredStateChange"]
        assert status["elapsedTimeLastState"].endswith("s")
        drivers = [d for d in status["drivers"] if d["watchState"] == state]
        assert all(d["completed"] and d["completeTime"] for d in drivers)
        if state == "Setup":
            servers = store.get("servers", NS, "wf-all-0")
            assert servers["status"]["ready"] is True
            labels = [s["label"] for s in servers["status"]["allocationSets"]]
            assert labels == ["xfs"]
            assert set(servers["status"]["allocationSets"][0]["storage"]) == {
                "rabbit-0",
                "rabbit-1",
            }
        if state == "PreRun":
            assert status["env"]["DW_JOB_my_scratch"] == f"/mnt/nnf/{uid}-0"
            # nnf-sos's addComputesEnv: name:path pairs, and the first of each type
            assert status["env"]["DW_JOBS"] == f"my-scratch:/mnt/nnf/{uid}-0"
            assert status["env"]["DW_JOB_XFS"] == f"/mnt/nnf/{uid}-0"
            assert status["env"]["DW_WORKFLOW_NAME"] == "wf-all"


def test_state_entry_resets_status_and_force_ready(store: Store, sim: DwsSim) -> None:
    create(store, "wf-entry", ["#DW Setup action=wait"])
    wait_for(store, "wf-entry", settled("Proposal"), "ready in Proposal")
    watch = store.watch("workflows", NS, resource_version=store.resource_version)
    try:
        change = {"spec": {"desiredState": "Setup", "forceReady": True}}
        store.patch("workflows", NS, "wf-entry", change)
        seen = []
        while len(seen) < 10:
            event = watch.next(timeout=WAIT)
            assert event is not None, "no state change seen"
            seen.append(event[1])
            if event[1]["status"]["state"] == "Setup":
                break
    finally:
        watch.close()
    entered = seen[-1]
    assert entered["status"]["ready"] is False
    assert entered["status"]["status"] == "DriverWait"
    assert "message" not in entered["status"]
    assert entered["status"]["desiredStateChange"] > seen[0]["status"]["desiredStateChange"]
    assert entered["spec"]["forceReady"] is False
    time.sleep(0.05)
    assert store.get("workflows", NS, "wf-entry")["status"]["ready"] is False


def test_nothing_advances_without_the_wlm(store: Store, sim: DwsSim) -> None:
    create(store, "wf-still", [GFS2])
    before = wait_for(store, "wf-still", settled("Proposal"), "ready in Proposal")
    time.sleep(0.2)  # several simulator cycles
    after = store.get("workflows", NS, "wf-still")
    assert after["spec"]["desiredState"] == "Proposal"
    assert after["status"] == before["status"]


def test_a_state_without_driver_entries_is_ready_at_once(store: Store, sim: DwsSim) -> None:
    create(store, "wf-empty", ["#DW Teardown action=wait"])
    wait_for(store, "wf-empty", settled("Proposal"), "ready in Proposal")
    for state in ("Setup", "DataIn", "PreRun", "PostRun", "DataOut"):
        assert move(store, "wf-empty", state)["status"]["status"] == "Completed"
    wf = store.patch("workflows", NS, "wf-empty", {"spec": {"desiredState": "Teardown"}})
    wf = wait_for(store, "wf-empty", lambda w: w["status"]["state"] == "Teardown", "in Teardown")
    time.sleep(0.05)
    wf = store.get("workflows", NS, "wf-empty")
    assert (wf["status"]["ready"], wf["status"]["status"]) == (False, "DriverWait")


# ---------------------------------------------------------------------------- test directives


def test_action_wait_holds_the_state_until_force_ready(store: Store, sim: DwsSim) -> None:
    create(store, "wf-wait", ["#DW DataIn action=wait"])
    wait_for(store, "wf-wait", settled("Proposal"), "ready in Proposal")
    move(store, "wf-wait", "Setup")
    store.patch("workflows", NS, "wf-wait", {"spec": {"desiredState": "DataIn"}})
    wf = wait_for(store, "wf-wait", lambda w: w["status"]["state"] == "DataIn", "in DataIn")
    time.sleep(0.05)
    wf = store.get("workflows", NS, "wf-wait")
    assert (wf["status"]["ready"], wf["status"]["status"]) == (False, "DriverWait")
    assert entry(wf, 0, "DataIn")["completed"] is False

    store.patch("workflows", NS, "wf-wait", {"spec": {"forceReady": True}})
    wf = wait_for(store, "wf-wait", settled("DataIn"), "forced ready")
    assert wf["status"]["status"] == "Completed"
    assert wf["status"]["message"] == FORCED_READY_MESSAGE
    assert entry(wf, 0, "DataIn")["completed"] is False
    wf = move(store, "wf-wait", "PreRun")
    assert wf["spec"]["forceReady"] is False


@pytest.mark.parametrize(
    ("severity", "driver_status", "workflow_status"),
    [
        ("Minor", "Running", "DriverWait"),
        ("Major", "TransientCondition", "TransientCondition"),
        ("Fatal", "Error", "Error"),
    ],
)
def test_action_error_maps_severity(
    store: Store, sim: DwsSim, severity: str, driver_status: str, workflow_status: str
) -> None:
    name = f"wf-{severity.lower()}"
    directives = [GFS2, f"#DW Setup action=error message=disk_full severity={severity}"]
    create(store, name, directives)
    wait_for(store, name, settled("Proposal"), "ready in Proposal")
    allocate(store, name)
    store.patch("workflows", NS, name, {"spec": {"desiredState": "Setup"}})
    wf = wait_for(
        store,
        name,
        lambda w: entry(w, 1, "Setup")["status"] == driver_status,
        f"{severity} error reported",
    )
    wf = wait_for(store, name, lambda w: w["status"]["status"] == workflow_status, "rolled up")
    assert wf["status"]["ready"] is False
    assert wf["status"]["message"] == "DW Directive 1: Reported error: disk_full"
    failing = entry(wf, 1, "Setup")
    assert (failing["message"], failing["error"]) == ("Reported error: disk_full", "disk full")
    assert entry(wf, 0, "Setup")["completed"] is True


def test_teardown_from_error_completes_and_ends_the_workflow(store: Store, sim: DwsSim) -> None:
    create(store, "wf-err", ["#DW PreRun action=error message=boom severity=Fatal", GFS2])
    wf = run_to(store, "wf-err", "PreRun")
    assert (wf["status"]["state"], wf["status"]["status"]) == ("PreRun", "Error")
    wf = move(store, "wf-err", "Teardown")
    assert (wf["status"]["ready"], wf["status"]["status"]) == (True, "Completed")
    with pytest.raises(ApiError) as refused:
        store.patch("workflows", NS, "wf-err", {"spec": {"desiredState": "PostRun"}})
    assert refused.value.code == 403


# ---------------------------------------------------------------------------- storage


def test_lustre_breakdown_asks_for_targets(store: Store, sim: DwsSim) -> None:
    create(store, "wf-lus", ["#DW jobdw type=lustre capacity=100GB name=big"])
    wait_for(store, "wf-lus", settled("Proposal"), "ready in Proposal")
    bd = store.get("directivebreakdowns", NS, "wf-lus-0")
    sets = {s["label"]: s for s in bd["status"]["storage"]["allocationSets"]}
    assert sets["ost"]["allocationStrategy"] == "AllocateAcrossServers"
    assert sets["ost"]["minimumCapacity"] == 100 * 1000**3
    assert sets["mgtmdt"]["allocationStrategy"] == "AllocateAcrossServers"  # as nnf-sos
    assert sets["mgtmdt"]["constraints"]["count"] == 1
    assert sets["mgtmdt"]["constraints"]["colocation"] == [
        {"type": "exclusive", "key": "lustre-mgt"}
    ]
    assert sets["ost"]["constraints"]["scale"] == 5  # nnf-sos's default profile
    # one compute location per set, as nnf-sos: network, and near the OSTs at best
    ost, mgtmdt = bd["status"]["compute"]["constraints"]["location"]
    network = {"type": "network", "priority": "mandatory"}
    assert ost["access"] == [network, {"type": "physical", "priority": "bestEffort"}]
    assert mgtmdt["access"] == [network]
    assert mgtmdt["reference"] == {
        "kind": "Servers",
        "name": "wf-lus-0",
        "namespace": NS,
        "fieldPath": "servers.spec.allocationSets[1]",
    }
    wf = run_to(store, "wf-lus", "PreRun")
    assert wf["status"]["ready"] is True


def _persistent(store: Store, name: str, uid: int, annotations: dict | None = None) -> None:
    """A PersistentStorageInstance as nnf-sos leaves it after a create_persistent."""
    store.create(
        "persistentstorageinstances",
        NS,
        {
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"name": name, "fsType": "xfs", "userID": uid, "state": "Active"},
            "status": {"state": "Active"},
        },
    )


def test_persistentdw_has_no_storage_request_and_its_own_env(store: Store, sim: DwsSim) -> None:
    _persistent(store, "shared-data", UID)
    wf = create(store, "wf-per", ["#DW persistentdw name=shared-data"])
    wait_for(store, "wf-per", settled("Proposal"), "ready in Proposal")
    assert "storage" not in store.get("directivebreakdowns", NS, "wf-per-0")["status"]
    assert not exists(store, "servers", "wf-per-0")
    done = run_to(store, "wf-per", "PreRun")
    assert done["status"]["env"]["DW_PERSISTENT_shared_data"] == (
        f"/mnt/nnf/{wf['metadata']['uid']}-0"
    )
    assert "DW_JOBS" not in done["status"]["env"]
    assert done["status"]["env"]["DW_PERSISTENTS"] == (
        f"shared-data:/mnt/nnf/{wf['metadata']['uid']}-0"
    )
    consumers = store.get("persistentstorageinstances", NS, "shared-data")["spec"]
    assert consumers["consumerReferences"] == [
        {"kind": "Workflow", "name": "wf-per-0", "namespace": NS}
    ]


@pytest.mark.parametrize(
    ("owner", "annotations", "message"),
    [
        (UID + 1, {}, "User ID does not match existing persistent storage"),
        (UID + 1, {"dataworkflowservices.github.io/ignore-uid": "True"}, None),  # any case
        (UID + 1, {"dataworkflowservices.github.io/ignore-uid": "no"}, "User ID does not match"),
        (None, {}, "PersistentStorageInstance 'other-data' not found"),
    ],
)
def test_persistentdw_follows_nnf_sos_uid_rule(store, sim, owner, annotations, message) -> None:
    if owner is not None:
        _persistent(store, "other-data", owner, annotations)
    create(store, "wf-uid", ["#DW persistentdw name=other-data"])
    wf = wait_for(store, "wf-uid", settled("Proposal"), "Proposal decided")
    if message is None:
        assert wf["status"]["ready"] is True
    else:
        assert wf["status"]["status"] == "Error"
        assert message in wf["status"]["message"]


def test_setup_without_allocation_is_a_fatal_wlm_error(store: Store, sim: DwsSim) -> None:
    create(store, "wf-noalloc", [GFS2])
    wait_for(store, "wf-noalloc", settled("Proposal"), "ready in Proposal")
    wf = move(store, "wf-noalloc", "Setup")
    assert wf["status"]["status"] == "Error"
    assert wf["status"]["message"] == "DW Directive 0: WLM error: invalid Rabbit allocations"
    assert (
        "Servers resource default/wf-noalloc-0 has no allocation sets"
        in (entry(wf, 0, "Setup")["error"])
    )


def test_copy_offload_gets_a_token_secret(store: Store, sim: DwsSim) -> None:
    create(store, "wf-token", [GFS2 + " requires=copy-offload"])
    wf = wait_for(store, "wf-token", settled("Proposal"), "ready in Proposal")
    assert wf["status"]["requires"] == ["copy-offload"]
    assert store.get("directivebreakdowns", NS, "wf-token-0")["status"]["requires"] == [
        "copy-offload"
    ]
    wf = run_to(store, "wf-token", "PreRun")
    assert wf["status"]["workflowToken"] == {
        "secretName": "wf-token-token",
        "secretNamespace": NS,
    }
    secret = store.get("secrets", NS, "wf-token-token")
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) == 64 and int(token, 16) >= 0
    assert "DW_WORKFLOW_TOKEN" not in wf["status"]["env"]


# ---------------------------------------------------------------------------- containers


def container_job(store: Store, name: str, profile: str, uid: int = UID) -> dict[str, Any]:
    return create(
        store,
        name,
        [GFS2, f"#DW container name=my-app profile={profile} DW_JOB_local_storage=scratch"],
        uid=uid,
    )


def test_ok_container_runs_and_exits(store: Store, sim: DwsSim) -> None:
    container_job(store, "wf-ok", "red-rock-slushy")
    wait_for(store, "wf-ok", settled("Proposal"), "ready in Proposal")
    pinned = store.get("nnfcontainerprofiles", NS, "wf-ok-1")
    assert pinned["data"]["pinned"] is True
    assert pinned["metadata"]["ownerReferences"][0]["name"] == "wf-ok"
    wf = run_to(store, "wf-ok", "PreRun")
    env = wf["status"]["env"]
    assert env["NNF_CONTAINER_SUBDOMAIN"] == "wf-ok"
    assert env["NNF_CONTAINER_DOMAIN"] == "default.svc.cluster.local"
    assert env["NNF_CONTAINER_HOSTNAMES"] == "rabbit-0,rabbit-1"
    assert "NNF_CONTAINER_LAUNCHER" not in env
    for state in ("PostRun", "DataOut", "Teardown"):
        assert move(store, "wf-ok", state)["status"]["status"] == "Completed"


def test_exit_nonzero_is_fatal_with_an_empty_user_message(store: Store, sim: DwsSim) -> None:
    container_job(store, "wf-exit", "exit-nonzero")
    wf = run_to(store, "wf-exit", "PostRun")
    assert (wf["status"]["state"], wf["status"]["status"]) == ("PostRun", "Error")
    assert wf["status"]["message"] == "DW Directive 1: Internal error: "
    failing = entry(wf, 1, "PostRun")
    assert failing["status"] == "Error"
    assert failing["error"] == (
        "internal error: container job Failed (BackoffLimitExceeded): "
        "Job has reached the specified backoff limit"
    )


@pytest.mark.parametrize(("retry_limit", "attempts"), [(None, 7), (2, 3)])
def test_crash_loop_fails_after_retry_limit_plus_one(
    store: Store, sim: DwsSim, retry_limit: Any, attempts: int
) -> None:
    extra = {} if retry_limit is None else {"retryLimit": retry_limit}
    store.create(
        "nnfcontainerprofiles", "nnf-system", container_profile("loop", "crash-loop", **extra)
    )
    container_job(store, "wf-loop", "loop")
    wf = run_to(store, "wf-loop", "PostRun")
    # nnf-sos: the rabbit its launcher Job runs on (the Job's nodeSelector, the first rabbit)
    assert wf["status"]["env"]["NNF_CONTAINER_LAUNCHER"] == "rabbit-0"
    assert wf["status"]["env"]["NNF_CONTAINER_HOSTNAMES"] == (
        "wf-loop-launcher,wf-loop-worker-0,wf-loop-worker-1"
    )
    assert wf["status"]["status"] == "Error"
    assert wf["status"]["message"] == (
        f"DW Directive 1: Internal error: user container(s) failed to run successfully after "
        f"{attempts} attempts"
    )
    # the MPIJob's Failed condition, as mpi-operator (v2beta1, which nnf-sos builds with) sets
    # it from its launcher Job's: the reason and message of the last failed launcher pod
    # (none for a container that exits with an error) appended
    assert entry(wf, 1, "PostRun")["error"] == (
        "internal error: container MPIJob Failed (BackoffLimitExceeded/): "
        "Job has reached the specified backoff limit: "
    )


def test_never_start_times_out_in_prerun(store: Store, sim: DwsSim) -> None:
    container_job(store, "wf-nostart", "never-start")
    wf = run_to(store, "wf-nostart", "PreRun")
    assert (wf["status"]["state"], wf["status"]["status"]) == ("PreRun", "Error")
    assert wf["status"]["message"] == (
        "DW Directive 1: Internal error: user container(s) failed to start after 300 seconds"
    )
    assert entry(wf, 1, "PreRun")["error"] == "internal error: job(s) timeout set"
    assert not any(k.startswith("NNF_CONTAINER_HOST") for k in wf["status"]["env"])


def test_hang_times_out_in_postrun(store: Store, sim: DwsSim) -> None:
    store.create(
        "nnfcontainerprofiles",
        "nnf-system",
        container_profile("slow", "hang", postRunTimeoutSeconds=120),
    )
    container_job(store, "wf-hang", "slow")
    wf = run_to(store, "wf-hang", "PostRun")
    assert (wf["status"]["state"], wf["status"]["status"]) == ("PostRun", "Error")
    assert wf["status"]["message"] == (
        "DW Directive 1: Internal error: user container(s) failed to complete after 120 seconds"
    )
    assert "DeadlineExceeded" in entry(wf, 1, "PostRun")["error"]


def test_post_run_timeout_zero_does_not_wait(store: Store, sim: DwsSim) -> None:
    store.create(
        "nnfcontainerprofiles",
        "nnf-system",
        container_profile("nowait", "hang", postRunTimeoutSeconds=0),
    )
    container_job(store, "wf-nowait", "nowait")
    wf = run_to(store, "wf-nowait", "PostRun")
    assert (wf["status"]["ready"], wf["status"]["status"]) == (True, "Completed")


def test_pre_run_timeout_zero_waits_for_ever(store: Store, sim: DwsSim) -> None:
    store.create(
        "nnfcontainerprofiles",
        "nnf-system",
        container_profile("patient", "never-start", preRunTimeoutSeconds=0),
    )
    container_job(store, "wf-patient", "patient")
    run_to(store, "wf-patient", "DataIn")
    store.patch("workflows", NS, "wf-patient", {"spec": {"desiredState": "PreRun"}})
    wait_for(store, "wf-patient", lambda w: entry(w, 0, "PreRun")["completed"], "jobdw done")
    time.sleep(300 * SCALE * 2)  # twice the default timeout, scaled
    wf = store.get("workflows", NS, "wf-patient")
    assert (wf["status"]["ready"], wf["status"]["status"]) == (False, "DriverWait")


def test_start_failure_fails_prerun_at_its_timeout_as_nnf_sos_does(
    store: Store, sim: DwsSim
) -> None:
    """nnf-sos has no check for an image that cannot be pulled: the pods wait in ErrImagePull
    (what flux-dws reads and shows) and PreRun fails at preRunTimeoutSeconds."""
    container_job(store, "wf-pull", "start-fail")
    wf = run_to(store, "wf-pull", "PreRun")
    assert (wf["status"]["state"], wf["status"]["status"]) == ("PreRun", "Error")
    assert wf["status"]["message"] == (
        "DW Directive 1: Internal error: user container(s) failed to start after 300 seconds"
    )
    assert entry(wf, 1, "PreRun")["error"] == "internal error: job(s) timeout set"
    pods, _ = store.list("pods", NS)
    waiting = [
        c["state"]["waiting"]["reason"]
        for p in pods
        if p["metadata"]["name"].startswith("wf-pull")
        for c in p["status"].get("containerStatuses") or []
        if "waiting" in c.get("state", {})
    ]
    assert waiting and set(waiting) == {"ErrImagePull"}


def test_restricted_profile_refuses_other_users(store: Store, sim: DwsSim) -> None:
    container_job(store, "wf-denied", "restricted")
    wf = wait_for(store, "wf-denied", settled("Proposal"), "settled in Proposal")
    assert wf["status"]["status"] == "Error"
    assert wf["status"]["message"] == (
        f"DW Directive 1: User error: container profile 'restricted' is restricted to UserID "
        f"{RESTRICTED_USER_ID}"
    )
    assert not exists(store, "nnfcontainerprofiles", "wf-denied-1")
    container_job(store, "wf-allowed", "restricted", uid=RESTRICTED_USER_ID)
    wf = wait_for(store, "wf-allowed", settled("Proposal"), "settled in Proposal")
    assert wf["status"]["status"] == "Completed"


def test_unknown_profile_is_a_user_error(store: Store, sim: DwsSim) -> None:
    container_job(store, "wf-noprof", "no-such-profile")
    wf = wait_for(store, "wf-noprof", settled("Proposal"), "settled in Proposal")
    assert wf["status"]["message"] == (
        "DW Directive 1: User error: container profile 'no-such-profile' not found"
    )


@pytest.mark.parametrize(
    "directives, message",
    [
        (
            [GFS2, "#DW container name=app profile=ok DW_JOB_data=scratch"],
            "storage 'DW_JOB_data' not found in container profile 'ok'",
        ),
        (
            [GFS2, "#DW container name=app profile=ok DW_GLOBAL_lus=/lus/x"],
            "storage 'DW_GLOBAL_lus' is not present in the container profile",
        ),
    ],
)
def test_container_storage_is_checked_in_proposal_as_nnf_sos_does(
    store: Store, sim: DwsSim, directives: list[str], message: str
) -> None:
    """nnf-sos's validateContainerDirective: the storage is named as its profile lists it."""
    create(store, "wf-storage", directives)
    wf = wait_for(store, "wf-storage", settled("Proposal"), "settled in Proposal")
    assert wf["status"]["message"] == f"DW Directive 1: User error: {message}"
    assert not exists(store, "nnfcontainerprofiles", "wf-storage-1")


def test_a_storage_the_profile_needs_must_be_given(store: Store, sim: DwsSim) -> None:
    profile = container_profile("needs", "ok")
    profile["data"]["storages"][0]["optional"] = False
    store.create("nnfcontainerprofiles", "nnf-system", profile)
    create(store, "wf-needs", [GFS2, "#DW container name=app profile=needs"])
    wf = wait_for(store, "wf-needs", settled("Proposal"), "settled in Proposal")
    assert wf["status"]["message"] == (
        "DW Directive 1: User error: storage 'DW_JOB_local_storage' in container profile "
        "'needs' is not optional: storage argument not found in the supplied arguments"
    )


def test_ports_are_granted_in_setup_and_released_in_teardown(store: Store, sim: DwsSim) -> None:
    wf = container_job(store, "wf-ports", "with-ports")
    run_to(store, "wf-ports", "Setup")
    wf = store.get("workflows", NS, "wf-ports")
    assert wf["status"]["env"]["NNF_CONTAINER_PORTS"] == "30000,30001"
    assert sim.ports_in_use == {wf["metadata"]["uid"]: (30000, 30001)}
    move(store, "wf-ports", "Teardown")
    assert sim.ports_in_use == {}


def test_too_few_ports_fail_setup(store: Store) -> None:
    with DwsSim(store, time_scale=SCALE, ports=range(40000, 40001)):
        container_job(store, "wf-noports", "with-ports")
        wf = run_to(store, "wf-noports", "Setup")
    assert wf["status"]["status"] == "Error"
    assert wf["status"]["message"] == (
        "DW Directive 1: Internal error: could not request ports for container workflow: "
        "InsufficientResources"
    )


def test_empty_computes_fail_container_prerun(store: Store, sim: DwsSim) -> None:
    container_job(store, "wf-nohosts", "ok")
    run_to(store, "wf-nohosts", "DataIn")
    store.patch("computes", NS, "wf-nohosts", {"data": []})
    wf = move(store, "wf-nohosts", "PreRun")
    assert wf["status"]["status"] == "Error"
    assert wf["status"]["message"] == (
        "DW Directive 1: WLM error: unable to create/update Container Jobs"
    )
    assert entry(wf, 1, "PreRun")["error"] == (
        "wlm error: error obtaining the target NNF nodes for containers: "
        "the Computes resources does not specify any compute nodes"
    )


def test_every_seeded_profile_names_a_behaviour(store: Store) -> None:
    assert set(PROFILES.values()) == set(Behavior)
    for name, behavior in PROFILES.items():
        profile = store.get("nnfcontainerprofiles", "nnf-system", name)
        assert profile["metadata"]["annotations"][BEHAVIOR_ANNOTATION] == behavior.value
    config = store.get("systemconfigurations", "default", "default")
    assert config["spec"]["storageNodes"][0] == {
        "name": "rabbit-0",
        "type": "Rabbit",
        "computesAccess": [{"name": "node0", "index": 0}, {"name": "node1", "index": 1}],
    }


# ---------------------------------------------------------------------------- deletion, restart


def test_deleting_removes_companions_and_the_finalizer(store: Store, sim: DwsSim) -> None:
    container_job(store, "wf-del", "ok")
    run_to(store, "wf-del", "PreRun")
    store.patch("workflows", NS, "wf-del", {"metadata": {"finalizers": [FINALIZER, "wlm/hold"]}})
    wf = move(store, "wf-del", "Teardown")
    store.delete("workflows", NS, "wf-del")
    time.sleep(0.05)
    assert exists(store, "computes", "wf-del"), "cleaned up before the other finalizer went"
    held = store.get("workflows", NS, "wf-del")
    store.replace(
        "workflows",
        NS,
        "wf-del",
        dict(held, metadata=dict(held["metadata"], finalizers=[FINALIZER])),
    )
    wait_for(store, "wf-del", lambda w: not w, "deleted")
    for plural, name in [
        ("computes", "wf-del"),
        ("directivebreakdowns", "wf-del-0"),
        ("servers", "wf-del-0"),
        ("nnfcontainerprofiles", "wf-del-1"),
    ]:
        assert not exists(store, plural, name), f"{plural} {name} left behind"
    assert wf["status"]["ready"]


def test_a_restarted_simulator_carries_on(store: Store) -> None:
    with DwsSim(store, time_scale=SCALE):
        create(store, "wf-restart", [GFS2])
        wait_for(store, "wf-restart", settled("Proposal"), "ready in Proposal")
    allocate(store, "wf-restart")
    store.patch("workflows", NS, "wf-restart", {"spec": {"desiredState": "Setup"}})
    with DwsSim(store, time_scale=SCALE):
        wf = wait_for(store, "wf-restart", settled("Setup"), "ready in Setup")
    assert wf["status"]["status"] == "Completed"


class InterferingStore:
    """The real store, with another writer changing each workflow just before our replace."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.interfered = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def replace(self, plural: str, namespace: str, name: str, obj: dict, **kw: Any) -> dict:
        if plural == "workflows" and self.interfered < 3:
            self.interfered += 1
            label = {"metadata": {"labels": {f"other-{self.interfered}": "x"}}}
            self.store.patch(plural, namespace, name, label)
        return self.store.replace(plural, namespace, name, obj, **kw)


def test_conflicting_writes_are_read_again_not_overwritten(store: Store) -> None:
    meddler = InterferingStore(store)
    with DwsSim(meddler, time_scale=SCALE):
        create(store, "wf-409", [GFS2])
        wf = wait_for(store, "wf-409", settled("Proposal"), "ready in Proposal")
    assert meddler.interfered == 3
    assert set(wf["metadata"]["labels"]) >= {"other-1", "other-2", "other-3"}
    assert FINALIZER in wf["metadata"]["finalizers"]


def test_writes_are_counted_by_kind(store: Store, sim: DwsSim) -> None:
    create(store, "wf-count", [GFS2])
    run_to(store, "wf-count", "Setup")
    writes = sim.writes
    assert writes["computes"] == 1
    assert writes["directivebreakdowns"] == 1
    assert writes["servers"] == 2  # created in Proposal, status in Setup
    assert writes["workflows"] >= 4  # entry and drivers, in each of two states


# ---------------------------------------------------------------------------- delays


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def test_drivers_wait_for_the_state_delay(store: Store) -> None:
    clock = ManualClock()
    with DwsSim(store, delays={"Proposal": 100.0}, clock=clock):
        create(store, "wf-delay", [GFS2])
        wait_for(store, "wf-delay", lambda w: w["status"].get("state") == "Proposal", "entered")
        time.sleep(0.1)
        assert store.get("workflows", NS, "wf-delay")["status"]["ready"] is False
        clock.advance(100.0)
        wf = wait_for(store, "wf-delay", settled("Proposal"), "ready after the delay")
    assert wf["status"]["status"] == "Completed"


def test_delays_are_checked() -> None:
    assert resolve_delays(2.5)[State.TEARDOWN] == 2.5
    resolved = resolve_delays({"prerun": 3, State.SETUP: 1})
    assert (resolved[State.PRERUN], resolved[State.SETUP], resolved[State.DATAIN]) == (3, 1, 0)
    with pytest.raises(ValueError, match="PostRun"):
        resolve_delays({"PostRun": -1})
    with pytest.raises(ValueError, match="unknown workflow state"):
        resolve_delays({"Running": 1})


# ---------------------------------------------------------------------------- pure rules


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.000001, "1µs"),
        (0.0015, "1.5ms"),
        (0.294183, "294.183ms"),
        (1.5, "1.5s"),
        (90, "1m30s"),
        (3600, "1h0m0s"),
        (3723.25, "1h2m3.25s"),
    ],
)
def test_elapsed_time_is_a_go_duration(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


_STATUSES = (
    "Pending",
    "Queued",
    "Running",
    "DriverWait",
    "Completed",
    "TransientCondition",
    "Error",
)
_RANK = {"Completed": 1, "TransientCondition": 3, "Error": 4}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(_STATUSES), st.booleans(), st.sampled_from(["", "m1", "m2"])),
        max_size=6,
    )
)
def test_roll_up_takes_the_highest_priority_entry(entries: list) -> None:
    drivers = [
        {
            "dwdIndex": i,
            "watchState": "Setup",
            "status": status,
            "completed": completed,
            "message": message,
        }
        for i, (status, completed, message) in enumerate(entries)
    ]
    drivers.append({"dwdIndex": 99, "watchState": "PreRun", "status": "Error", "message": "x"})
    wf = {"spec": {}, "status": {"state": "Setup", "ready": False, "drivers": drivers}}
    now = datetime.datetime.now(datetime.timezone.utc)
    status = roll_up(wf, now)["status"]
    mine = drivers[:-1]
    ranked = sorted(mine, key=lambda d: _RANK.get(d["status"], 2), reverse=True)
    top_rank = _RANK.get(ranked[0]["status"], 2) if ranked else 0
    looked_at = [d for d in ranked if _RANK.get(d["status"], 2) == top_rank]
    looked_at += [d for d in ranked if _RANK.get(d["status"], 2) < top_rank][:1]
    # DWS's loop: an incomplete top entry, or the first one below the top, clears ready
    assert status["ready"] == all(d["completed"] for d in looked_at)
    if not mine:
        assert (status["status"], status.get("message", "absent")) == ("Completed", "absent")
        return
    top = max(_RANK.get(d["status"], 2) for d in mine)
    leaders = [d for d in mine if _RANK.get(d["status"], 2) == top]
    expected = {1: "Completed", 2: "DriverWait", 3: "TransientCondition", 4: "Error"}[top]
    assert status["status"] == expected
    with_text = [d for d in leaders if d["message"]]
    assert status.get("message", "absent") == (
        f"DW Directive {with_text[-1]['dwdIndex']}: {with_text[-1]['message']}"
        if with_text
        else "absent"
    )


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["enter", "force", "roll"]),
    st.fixed_dictionaries(
        {"state": st.sampled_from(["Proposal", "Setup"]), "ready": st.booleans()},
        optional={"env": st.just({"A": "1"}), "drivers": st.just([{"watchState": "Setup"}])},
    ),
)
def test_status_rules_never_change_the_workflow_they_are_given(rule: str, status: dict) -> None:
    """The simulator hands them the stored objects themselves (shared reads)."""
    wf = {"metadata": {"name": "w"}, "spec": {"desiredState": "Setup", "forceReady": True}}
    wf["status"] = status
    before = json.dumps(wf)
    now = datetime.datetime.now(datetime.timezone.utc)
    changed = {"enter": enter_state, "force": force_ready, "roll": roll_up}[rule](wf, now)
    assert json.dumps(wf) == before
    assert changed["status"] is not wf["status"]
    if rule == "enter":
        assert changed["spec"]["forceReady"] is False and changed["status"]["state"] == "Setup"


def test_the_simulator_never_changes_the_objects_it_reads(store: Store, sim: DwsSim) -> None:
    """It reads shared (stored) objects: every version committed must still equal its text."""
    start = store.resource_version
    container_job(store, "wf-ro", "with-ports")
    create(store, "wf-ro2", ["#DW jobdw type=xfs capacity=1GiB name=s1 requires=copy-offload"])
    for name in ("wf-ro", "wf-ro2"):
        run_to(store, name, "Teardown")
    store.patch("workflows", NS, "wf-ro", {"spec": {"forceReady": True}})
    store.delete("workflows", NS, "wf-ro")
    wait_for(store, "wf-ro", lambda w: not w, "deleted")
    plurals = ("workflows", "computes", "servers", "directivebreakdowns", "secrets")
    for plural in (*plurals, "nnfcontainerprofiles"):
        # A replay hands out each version as committed (shared) and decoded from its text.
        committed = store.watch(plural, resource_version=start, shared=True)
        encoded = store.watch(plural, resource_version=start)
        seen = 0
        while (event := committed.next(0)) is not None:
            assert event == encoded.next(0), f"{plural}: {event[1]['metadata']}"
            seen += 1
        assert encoded.next(0) is None and (seen or plural == "nnfcontainerprofiles"), plural


def test_a_deleted_workflow_leaves_nothing_in_the_simulator(store: Store, sim: DwsSim) -> None:
    container_job(store, "wf-gone", "with-ports")
    wf = run_to(store, "wf-gone", "PreRun")
    uid = wf["metadata"]["uid"]
    assert sim.ports_in_use.get(uid)
    store.delete("workflows", NS, "wf-gone")
    wait_for(store, "wf-gone", lambda w: not w, "deleted")
    deadline = time.monotonic() + WAIT
    while uid in sim._entered and time.monotonic() < deadline:  # the DELETED event is async
        time.sleep(0.002)
    assert uid not in sim._entered and uid not in sim._parsed
    assert uid not in sim.ports_in_use


# ---------------------------------------------------------------------------- simulation mode


def test_simulation_mode_serves_a_dws_system_over_http(tmp_path: Any) -> None:
    """python -m flux_dws.testing.dwssim, driven with the real kubernetes client."""
    kubernetes = pytest.importorskip("kubernetes")
    kubeconfig = str(tmp_path / "kubeconfig")
    command = [sys.executable, "-m", "flux_dws.testing.dwssim", "--no-delays", "--computes", "2"]
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen(
        [*command, "--kubeconfig", kubeconfig],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        assert proc.stdout.readline().strip() == kubeconfig
        client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
        api = kubernetes.client.CustomObjectsApi(client)
        group, version = "dataworkflowservices.github.io", "v1alpha7"
        body = {
            "apiVersion": f"{group}/{version}",
            "kind": "Workflow",
            "metadata": {"name": "wf-http"},
            "spec": {
                "desiredState": "Proposal",
                "wlmID": "flux",
                "jobID": 7,
                "userID": UID,
                "groupID": GID,
                "dwDirectives": ["#DW container name=my-app profile=ok"],
            },
        }
        api.create_namespaced_custom_object(group, version, NS, "workflows", body)
        deadline = time.monotonic() + WAIT
        while True:
            wf = api.get_namespaced_custom_object(group, version, NS, "workflows", "wf-http")
            if wf["status"].get("ready") or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert (wf["status"]["state"], wf["status"]["status"]) == ("Proposal", "Completed")
        pinned = api.get_namespaced_custom_object(
            "nnf.cray.hpe.com", "v1alpha10", NS, "nnfcontainerprofiles", "wf-http-0"
        )
        assert pinned["data"]["pinned"] is True
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0


# ---------------------------------------------------------------------------- beside real DWS


def test_beside_the_real_dws_only_nnf_entries_are_driven_and_dws_rolls_up(store: Store) -> None:
    """``workflow_controller=False`` plays nnf-sos's driver alone, as beside the real DWS
    manager: it completes its own entries of the state DWS entered, and writes nothing of
    DWS's (finalizer, roll-up) nor the test driver's entries; a deleted workflow's NNF
    objects go with it."""
    create(store, "wf-drv", [GFS2, "#DW Proposal action=complete"])
    wf = store.get("workflows", NS, "wf-drv")
    now = datetime.datetime.now(datetime.timezone.utc)
    store.replace("workflows", NS, "wf-drv", enter_state(wf, now))  # as DWS enters Proposal

    def nnf_done(w: dict[str, Any]) -> bool:
        entries = (w.get("status") or {}).get("drivers") or []
        return any(e["driverID"] == "nnf" and e.get("completed") for e in entries)

    with DwsSim(store, time_scale=SCALE, workflow_controller=False):
        done = wait_for(store, "wf-drv", nnf_done, "had its nnf entry completed")
        time.sleep(0.05)  # a roll-up would follow the entry's write at once
        done = store.get("workflows", NS, "wf-drv")
        status = done["status"]
        assert (status["state"], status["ready"], status["status"]) == (
            "Proposal",
            False,
            "DriverWait",
        )
        tester = [e for e in status["drivers"] if e["driverID"] == "tester"]
        assert [e["completed"] for e in tester] == [False]
        assert FINALIZER not in done["metadata"].get("finalizers", [])
        assert store.get("directivebreakdowns", NS, "wf-drv-0")
        store.delete("workflows", NS, "wf-drv")
        deadline = time.monotonic() + WAIT
        while exists(store, "directivebreakdowns", "wf-drv-0") and time.monotonic() < deadline:
            time.sleep(0.01)
    assert not exists(store, "directivebreakdowns", "wf-drv-0")
    assert not exists(store, "servers", "wf-drv-0")
