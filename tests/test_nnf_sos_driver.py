# SPDX-License-Identifier: LGPL-3.0-only
"""nnf-sos, the real NNF driver on mock hardware, beside the real DWS: jobs end to end.

``Stack(dws="real", nnf="sos")``: kubeapi serves DWS's and nnf-sos's own CRDs, DWS's manager
and test driver run, and nnf-sos runs as its deployment does in kind (ENVIRONMENT=kind,
nnf-ec's -mock): its storage controller and a node controller for the rabbit
(flux_dws.testing.nnfsos.NnfSos).  nnf-sos makes the DirectiveBreakdowns, allocates the
Servers' storage, reports the rabbit's Storage (capacity), makes NnfStorage, NnfAccess and
the ClientMounts, and writes the job's environment; the compute nodes' clientmountd is not
run, so dwssim plays it (flux_dws.testing.dwssim.computemounts).  The flux-dws service runs
each job against fakeflux.  Where the binaries, CRDs or nnf-sos's config/examples are absent,
these tests skip with one line (nnfsos.nnf_sos_problem); the first tests need none.
"""

from __future__ import annotations

import pytest
from waiting import wait_for

from flux_dws.core.identity import workflow_name
from flux_dws.core.states import State
from flux_dws.testing.dwssim.computemounts import FINALIZER, next_step
from flux_dws.testing.kubeapi import ApiError
from flux_dws.testing.nnfsos import lustre_problem, nnf_sos_problem
from flux_dws.testing.stack import Stack

RABBIT = "rabbit-0"
COMPUTES = ["compute-01", "compute-02"]
JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
NNF_KINDS = ("directivebreakdowns", "servers", "nnfstorages", "nnfaccesses")


# ---- the compute side dwssim plays (nnf-sos's clientmountd), no binaries needed ------------


def test_clientmountd_steps_as_nnf_sos_reconciles_a_clientmount():
    """nnf_clientmount_controller.go's Reconcile: status sized and reset, then the finalizer,
    then every mount ready; an unmount resets again; a delete takes the finalizer off."""
    mount = {
        "metadata": {"name": "m", "namespace": "compute-01"},
        "spec": {"desiredState": "mounted", "mounts": [{}, {}]},
    }
    reset = next_step(mount)
    assert reset["status"] == {
        "mounts": [{"state": "mounted", "ready": False}] * 2,
        "allReady": False,
    }
    held = next_step(reset)
    assert held["metadata"]["finalizers"] == [FINALIZER] and held["status"] == reset["status"]
    ready = next_step(held)
    assert ready["status"]["allReady"] and all(m["ready"] for m in ready["status"]["mounts"])
    assert next_step(ready) is None  # nothing more to do
    unmount = {**ready, "spec": {**ready["spec"], "desiredState": "unmounted"}}
    assert next_step(unmount)["status"]["mounts"][0] == {"state": "unmounted", "ready": False}
    deleted = {**ready, "metadata": {**ready["metadata"], "deletionTimestamp": "now"}}
    assert next_step(deleted)["metadata"]["finalizers"] == []
    assert next_step({**mount, "spec": {"desiredState": "mounted"}}) is None  # no mounts


# ---- nnf-sos beside the real DWS ---------------------------------------------------------


@pytest.fixture(scope="module")
def stack():
    if nnf_sos_problem():
        pytest.skip(nnf_sos_problem())
    with Stack(hosts=len(COMPUTES), dws="real", nnf="sos", rabbits={RABBIT: COMPUTES}) as running:
        yield running


def names(info) -> list[str]:
    return [e["name"] for e in info.eventlog]


def states_entered(info) -> list[str]:
    return [e["context"]["state"] for e in info.events("dws-state")]


def get(stack, plural: str, name: str, namespace: str = "default") -> dict | None:
    try:
        return stack.api.store.get(plural, namespace, name)
    except ApiError:
        return None


def assert_clean(stack, info) -> None:
    """The workflow, its Computes and every object nnf-sos made for it are gone."""
    assert info.state == "INACTIVE" and not info.holds, info.holds
    assert not stack.left_behind(info.id)
    name = f"{workflow_name(stack.identity, info.id)}-0"
    for plural in NNF_KINDS:
        wait_for(lambda p=plural: get(stack, p, name) is None, f"{plural} {name} to go", 60)
    mounts, _ = stack.api.store.list("clientmounts", None)
    assert [m["metadata"]["name"] for m in mounts if name in m["metadata"]["name"]] == []


def path_of(stack, uid: str) -> str:
    """Where nnf-sos mounts a job's storage on a compute: COMPUTE_MOUNT_PREFIX/<uid>-<index>."""
    return stack.nnf_sos.storage.env["COMPUTE_MOUNT_PREFIX"] + f"/{uid}-0"


def test_nnf_sos_reports_the_rabbit_storage_dws_made(stack):
    """DWS's SystemConfiguration controller makes the Storage; nnf-sos's Storage controller
    fills its status from the mock NnfNode: capacity, drives, the computes it serves."""
    storage = stack.api.store.get("storages", "default", RABBIT)
    owners = storage["metadata"].get("ownerReferences") or []
    assert [o["kind"] for o in owners] == ["SystemConfiguration"]
    assert storage["metadata"]["labels"]["dataworkflowservices.github.io/storage"] == "Rabbit"
    status = storage["status"]
    assert (status["status"], status["type"]) == ("Ready", "NVMe")
    assert status["capacity"] > 0 and status["devices"]
    assert all(d["model"].startswith("MOCK-") for d in status["devices"])
    assert {c["name"] for c in status["access"]["computes"]} == set(COMPUTES)
    assert status["access"]["servers"] == [{"name": RABBIT, "status": "Ready"}]


def test_an_xfs_job_runs_its_whole_lifecycle_on_nnf_sos(stack):
    jobid = stack.submit(JOBDW, runtime=None)  # finished below, once read while it runs
    name = workflow_name(stack.identity, jobid)
    stack.wait_event(jobid, "start", timeout=120)  # PreRun done: the job's tasks run
    try:
        uid = stack.api.store.get("workflows", stack.policy.namespace, name)["metadata"]["uid"]
        # Proposal: nnf-sos's DirectiveBreakdown asks for xfs on each compute's rabbit
        breakdown = wait_for(
            lambda: get(stack, "directivebreakdowns", f"{name}-0"), "breakdown", 60
        )
        storage = breakdown["status"]["storage"]
        assert storage["lifetime"] == "job"
        [aset] = storage["allocationSets"]
        assert (aset["label"], aset["allocationStrategy"]) == ("xfs", "AllocatePerCompute")
        # nnf-sos pads the capacity with the default NnfStorageProfile's
        # (getScaledAndPaddedCapacity)
        profile = stack.api.store.get("nnfstorageprofiles", "nnf-system", "default")
        assert profile["data"]["xfsStorage"]["allocationPadding"] == "300MiB"
        assert aset["minimumCapacity"] == 10 * 1024**3 + 300 * 1024**2
        # Setup: nnf-sos allocated what flux-dws put in the Servers, on the rabbit
        servers = get(stack, "servers", f"{name}-0")
        assert [s["name"] for s in servers["spec"]["allocationSets"][0]["storage"]] == [RABBIT]
        assert servers["status"]["ready"] is True
        [allocated] = servers["status"]["allocationSets"]
        assert set(allocated["storage"]) == {RABBIT}
        assert get(stack, "nnfstorages", f"{name}-0") is not None
        # PreRun: a ClientMount per compute node, mounted (the compute side played by dwssim)
        mounts, _ = stack.api.store.list("clientmounts", None)
        mine = [m for m in mounts if m["metadata"]["namespace"] in COMPUTES]
        assert len(mine) == 1 and name in mine[0]["metadata"]["name"]  # the job's one node
        assert mine[0]["spec"]["mounts"][0]["mountPath"] == path_of(stack, uid)
        assert mine[0]["status"]["allReady"] is True
    finally:
        stack.flux.finish(jobid)
    info = stack.wait(jobid, timeout=120)
    assert (info.result, info.exception) == ("COMPLETED", None), info.exception
    assert states_entered(info) == [s.value for s in State]
    # nnf-sos's addComputesEnv: DW_JOB_<name>, DW_JOB_<TYPE>, DW_JOBS as name:path
    env = info.events("dws-environment")[0]["context"]["env"]
    path = env["DW_JOB_scratch"]
    assert path == path_of(stack, uid)
    assert env["DW_JOB_XFS"] == path and env["DW_JOBS"] == f"scratch:{path}"
    assert_clean(stack, info)


def test_persistent_storage_is_made_used_and_destroyed_by_nnf_sos(stack):
    """create_persistent, persistentdw and destroy_persistent jobs: nnf-sos's
    PersistentStorageInstance and NnfStorage outlive the first job and go with the last."""
    made = stack.wait(
        stack.submit("#DW create_persistent type=xfs capacity=1GiB name=keep"), timeout=120
    )
    assert (made.result, made.exception) == ("COMPLETED", None), made.exception
    psi = wait_for(
        lambda: get(stack, "persistentstorageinstances", "keep"),
        "the PersistentStorageInstance",
        60,
    )
    assert psi["spec"]["fsType"] == "xfs" and psi["status"]["state"] == "Active"
    assert get(stack, "nnfstorages", "keep") is not None  # nnf-sos's storage outlives the job
    used = stack.wait(stack.submit("#DW persistentdw name=keep", runtime=0.05), timeout=120)
    assert (used.result, used.exception) == ("COMPLETED", None), used.exception
    env = used.events("dws-environment")[0]["context"]["env"]
    assert env["DW_PERSISTENTS"] == f"keep:{env['DW_PERSISTENT_keep']}"
    # addComputesEnv's DW_PERSISTENT_<TYPE> for a persistentdw, which has no type= word
    assert env["DW_PERSISTENT_"] == env["DW_PERSISTENT_keep"]
    gone = stack.wait(stack.submit("#DW destroy_persistent name=keep"), timeout=120)
    assert (gone.result, gone.exception) == ("COMPLETED", None), gone.exception
    wait_for(lambda: get(stack, "persistentstorageinstances", "keep") is None, "keep to go", 60)
    wait_for(lambda: get(stack, "nnfstorages", "keep") is None, "its NnfStorage to go", 60)


# ---- data movement: nnf-sos's NnfDataMovements, finished by dwssim playing nnf-dm ----------


def lustre(stack) -> None:
    """A global Lustre file system mounted at /lus, as a site's admin describes it; nnf-sos
    refuses a copy_in/copy_out path outside every one (findLustreFileSystemForPath)."""
    if lustre_problem():
        pytest.skip(lustre_problem())
    if get(stack, "lustrefilesystems", "lus") is None:
        spec = {"name": "lus", "mgsNids": "10.0.0.1@tcp", "mountRoot": "/lus"}
        stack.api.store.create(
            "lustrefilesystems",
            "default",
            {
                "apiVersion": "lus.cray.hpe.com/v1beta1",
                "kind": "LustreFileSystem",
                "metadata": {"name": "lus", "namespace": "default"},
                "spec": spec,
            },
        )


COPY_IN = "#DW copy_in source=/lus/in destination=$DW_JOB_scratch/in"
COPY_OUT = "#DW copy_out source=$DW_JOB_scratch/out destination=/lus/out"


def test_copy_in_and_out_run_through_nnf_sos_data_movements(stack):
    lustre(stack)
    info = stack.wait(stack.submit([JOBDW, COPY_IN, COPY_OUT], runtime=0.05), timeout=120)
    assert (info.result, info.exception) == ("COMPLETED", None), info.exception
    assert states_entered(info) == [s.value for s in State]
    assert_clean(stack, info)


def test_a_copy_in_that_fails_fails_the_job_in_datain_with_nnf_sos_message(stack):
    lustre(stack)
    copy = "#DW copy_in source=/lus/missing/in destination=$DW_JOB_scratch/in"
    info = stack.wait(stack.submit([JOBDW, copy], runtime=0.05), timeout=120)
    assert info.result == "FAILED" and "start" not in names(info)
    note = info.exception["note"]
    assert note.startswith("DataIn failed: "), note
    assert "Failed to open /lus/missing/in" in note, note
    assert states_entered(info)[-1] == "Teardown"
    assert_clean(stack, info)


def test_a_copy_from_outside_every_lustre_fails_in_proposal(stack):
    """nnf-sos checks a global path in Proposal (nnf_workflow_controller_helpers.go)."""
    lustre(stack)
    copy = "#DW copy_in source=/elsewhere/in destination=$DW_JOB_scratch/in"
    info = stack.wait(stack.submit([JOBDW, copy], runtime=0.05), timeout=120)
    assert info.result == "FAILED" and "start" not in names(info)
    note = info.exception["note"]
    assert note.startswith("Proposal failed: "), note
    assert "global Lustre file system containing '/elsewhere/in' not found" in note, note
    assert_clean(stack, info)
