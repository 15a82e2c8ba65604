# SPDX-License-Identifier: LGPL-3.0-only
"""A Lustre ``#DW jobdw`` on nnf-sos, the real NNF driver on mock hardware, beside the real DWS.

``Stack(dws="real", nnf="sos")`` as in tests/test_nnf_sos_driver.py.  With the default
storage profile (nnf-sos's config/examples, ``combinedMgtMdt``) nnf-sos breaks a Lustre
jobdw into OSTs across the servers and one combined MGT/MDT, makes an NnfStorage of type
lustre with an NnfLustreMGT for its MGS, an NnfNodeStorage and NnfNodeBlockStorage per
target on the rabbit (in kind mode, pkg/filesystem/kind.go: directories for the targets; the
MGS at the rabbit's own NID, flux_dws.testing.nnfmock), and ClientMounts of type lustre on
the computes.  The first test needs no binaries.
"""

from __future__ import annotations

import os

import pytest
from waiting import wait_for

from flux_dws.core.identity import workflow_name
from flux_dws.core.jobspec import min_allocations, reserved_gib
from flux_dws.core.rabbits import GIB
from flux_dws.core.states import State
from flux_dws.core.storage import (
    ACROSS_SERVERS,
    NNF_LUSTRE_MIN_ALLOCATION,
    AllocationNeed,
    plan_servers,
)
from flux_dws.testing.nnfmock import rabbit_nids
from flux_dws.testing.nnfsos import lustre_problem, nnf_sos_problem
from flux_dws.testing.stack import Stack
from tests.test_nnf_sos_driver import COMPUTES, RABBIT, get, path_of, states_entered

LUSTRE = "#DW jobdw type=lustre capacity=1GiB name=lus"
WORKFLOW_LABEL = "dataworkflowservices.github.io/workflow.name"
#: What nnf-sos makes for a Lustre jobdw, all labelled with the workflow's name.
LUSTRE_KINDS = (
    "directivebreakdowns",
    "servers",
    "nnfstorages",
    "nnflustremgts",
    "nnfnodestorages",
    "nnfnodeblockstorages",
    "nnfaccesses",
    "clientmounts",
)


# ---- what nnf-sos allocates for a small Lustre target, no binaries needed -------------------


def test_a_small_lustre_target_is_planned_and_reserved_as_nnf_sos_allocates_it():
    """nnf-sos raises every Lustre allocation under 4,000,000,000 bytes to that
    (minimumLustreAllocationSizeInBytes, nnf_storage_controller.go), whatever the Servers say:
    the Servers and each node's reservation in Fluxion must say so too, or the rabbit holds
    more than Fluxion and the capacity check think."""
    least = min_allocations({})
    assert {least[label] for label in ("ost", "mdt", "mgt", "mgtmdt")} == {
        NNF_LUSTRE_MIN_ALLOCATION
    }
    assert least["xfs"] == least["gfs2"] == least["raw"] == 0
    needs = [
        AllocationNeed("bd", ("default", "srv"), "ost", ACROSS_SERVERS, GIB),
        AllocationNeed("bd", ("default", "srv"), "mgtmdt", ACROSS_SERVERS, 5 * GIB, count=1),
    ]
    plan = plan_servers(needs, ["c1", "c2"], {"c1": "rb", "c2": "rb"}, least)
    ost, mgtmdt = plan["default", "srv"]
    assert (ost["allocationSize"], ost["storage"]) == (
        NNF_LUSTRE_MIN_ALLOCATION,
        [{"name": "rb", "allocationCount": 1}],
    )
    assert mgtmdt["allocationSize"] == 5 * GIB  # over the floor: as the breakdown asks
    # each node reserves an OST of its own (one per rabbit, were they on two) and the whole
    # MGT/MDT: 4,000,000,000 bytes + 5 GiB is 8.7 GiB, where 1 GiB + 5 GiB was 6
    assert reserved_gib(needs, 2, {}) == 9


# ---- nnf-sos beside the real DWS ---------------------------------------------------------


def test_two_lustre_jobs_at_once_on_the_same_rabbits_keep_their_mgts_apart():
    """nnf-sos's breakdown gives the MGT/MDT the exclusive key ``lustre-mgt``: two Lustre jobs
    running at once, each with a node on both rabbits, get their MGTs on different rabbits,
    and nnf-sos makes both (with the MGTs on one rabbit, it failed the second job Fatal:
    "multiple MGTs found for address").  Each rabbit has an LNet address of its own, as on a
    real system (flux_dws.testing.nnfmock); its own stack, started before the module's."""
    if nnf_sos_problem():
        pytest.skip(nnf_sos_problem())
    rabbits = {"rabbit-0": ["compute-01", "compute-03"], "rabbit-1": ["compute-02", "compute-04"]}
    with Stack(hosts=4, dws="real", nnf="sos", rabbits=rabbits) as two:
        jobs = [two.submit(LUSTRE, nnodes=2, runtime=None) for _ in range(2)]
        try:
            for jobid in jobs:
                two.wait_event(jobid, "start", timeout=120)
            names = [workflow_name(two.identity, jobid) for jobid in jobs]
            mgts = {}
            for name in names:
                planned = {
                    a["label"]: a
                    for a in get(two, "servers", f"{name}-0")["spec"]["allocationSets"]
                }
                assert {e["name"] for e in planned["ost"]["storage"]} == set(rabbits)
                [mgt] = made_for(two, "nnflustremgts", name)
                mgts[mgt["metadata"]["namespace"]] = mgt["spec"]["addresses"]
                assert [e["name"] for e in planned["mgtmdt"]["storage"]] == [
                    mgt["metadata"]["namespace"]
                ]
            nids = rabbit_nids(list(rabbits))
            assert mgts == {rabbit: [nid] for rabbit, nid in nids.items()}
        finally:
            for jobid in jobs:
                two.flux.finish(jobid)
        for jobid in jobs:
            info = two.wait(jobid, timeout=120)
            assert (info.result, info.exception) == ("COMPLETED", None), info.exception
            assert not two.left_behind(jobid)
        with open(os.path.join(two._tmp.name, "nnf-sos-storage.log"), errors="replace") as log:
            assert "multiple MGTs" not in log.read()


@pytest.fixture(scope="module")
def stack():
    if nnf_sos_problem():
        pytest.skip(nnf_sos_problem())
    with Stack(hosts=len(COMPUTES), dws="real", nnf="sos", rabbits={RABBIT: COMPUTES}) as running:
        yield running


def made_for(stack, plural: str, name: str) -> list[dict]:
    """The objects of one kind nnf-sos made for workflow ``name``, in every namespace."""
    return stack.api.store.list(plural, None, f"{WORKFLOW_LABEL}={name}")[0]


def test_a_lustre_job_runs_its_whole_lifecycle_on_nnf_sos(stack):
    jobid = stack.submit(LUSTRE, nnodes=2, runtime=None)
    name = workflow_name(stack.identity, jobid)
    stack.wait_event(jobid, "start", timeout=120)  # PreRun done: the job's tasks run
    try:
        uid = stack.api.store.get("workflows", stack.policy.namespace, name)["metadata"]["uid"]
        # Proposal: OSTs across the servers and one combined MGT/MDT, sized by the profile
        breakdown = get(stack, "directivebreakdowns", f"{name}-0")
        sets = {a["label"]: a for a in breakdown["status"]["storage"]["allocationSets"]}
        assert set(sets) == {"ost", "mgtmdt"}
        assert (sets["ost"]["allocationStrategy"], sets["ost"]["minimumCapacity"]) == (
            "AllocateAcrossServers",
            GIB,
        )
        profile = stack.api.store.get("nnfstorageprofiles", "nnf-system", "default")
        assert profile["data"]["lustreStorage"]["mdtOptions"]["capacity"] == "5GiB"
        mgtmdt = sets["mgtmdt"]
        assert (mgtmdt["allocationStrategy"], mgtmdt["minimumCapacity"]) == (
            "AllocateAcrossServers",
            5 * GIB,
        )
        assert mgtmdt["constraints"]["count"] == 1
        assert mgtmdt["constraints"]["colocation"] == [{"type": "exclusive", "key": "lustre-mgt"}]
        # Setup: nnf-sos took the Servers flux-dws planned on the rabbit, and allocated on it
        # exactly what they say: the 1 GiB OST as 4,000,000,000 bytes, nnf-sos's least
        servers = get(stack, "servers", f"{name}-0")
        assert servers["status"]["ready"] is True
        planned = {a["label"]: a for a in servers["spec"]["allocationSets"]}
        assert planned["ost"]["allocationSize"] == NNF_LUSTRE_MIN_ALLOCATION
        for aset in planned.values():
            assert aset["storage"] == [{"name": RABBIT, "allocationCount": 1}]
        blocks = made_for(stack, "nnfnodeblockstorages", name)
        allocated = {
            b["metadata"]["labels"]["nnf.cray.hpe.com/allocationset"]: [
                a["capacity"] for a in b["spec"]["allocations"]
            ]
            for b in blocks
        }
        assert allocated == {label: [a["allocationSize"]] for label, a in planned.items()}
        assert {b["metadata"]["namespace"] for b in blocks} == {RABBIT}
        # the NnfStorage of type lustre: its MGS (the mock NID) and file system name
        storage = get(stack, "nnfstorages", f"{name}-0")
        assert storage["spec"]["fileSystemType"] == "lustre"
        status = storage["status"]
        nid = rabbit_nids(list(stack.rabbits))[RABBIT]  # the rabbit's own (testing.nnfmock)
        assert status["ready"] is True and status["mgsAddress"] == nid
        assert status["lustreComponents"]["mgtmdts"] == [RABBIT]
        assert status["lustreComponents"]["osts"] == [RABBIT]
        fsname = status["fileSystemName"]
        assert fsname
        [mgt] = made_for(stack, "nnflustremgts", name)
        assert mgt["metadata"]["namespace"] == RABBIT
        assert mgt["spec"]["addresses"] == [status["mgsAddress"]]
        targets = made_for(stack, "nnfnodestorages", name)
        assert sorted(t["spec"]["lustreStorage"]["targetType"] for t in targets) == [
            "mgtmdt",
            "ost",
        ]
        # PreRun: each compute mounts the file system over the network, as lustre
        mounts = [m for m in made_for(stack, "clientmounts", name) if m["spec"]["node"] in COMPUTES]
        assert sorted(m["spec"]["node"] for m in mounts) == COMPUTES
        for mount in mounts:
            [spec] = mount["spec"]["mounts"]
            assert spec["type"] == "lustre" and spec["mountPath"] == path_of(stack, uid)
            lustre = spec["device"]["lustre"]
            assert (lustre["fileSystemName"], lustre["mgsAddresses"]) == (fsname, nid)
            assert mount["status"]["allReady"] is True
        # every kind the end checks carries the workflow's label, so "none left" means it
        assert [p for p in LUSTRE_KINDS if not made_for(stack, p, name)] == []
    finally:
        stack.flux.finish(jobid)
    info = stack.wait(jobid, timeout=120)
    assert (info.result, info.exception) == ("COMPLETED", None), info.exception
    assert states_entered(info) == [s.value for s in State]
    # nnf-sos's addComputesEnv: DW_JOB_<name>, DW_JOB_<TYPE>, DW_JOBS as name:path
    env = info.events("dws-environment")[0]["context"]["env"]
    path = path_of(stack, uid)
    assert env["DW_JOB_lus"] == env["DW_JOB_LUSTRE"] == path
    assert env["DW_JOBS"] == f"lus:{path}"
    # nothing left behind: the workflow, its Computes, and everything nnf-sos made for it
    assert not info.holds and not stack.left_behind(jobid)
    for plural in LUSTRE_KINDS:
        wait_for(lambda p=plural: not made_for(stack, p, name), f"{plural} of {name} to go", 60)
    if not lustre_problem():  # LustreFileSystem served: a jobdw makes none (only an admin)
        assert stack.api.store.list("lustrefilesystems", None)[0] == []
