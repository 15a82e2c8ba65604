# SPDX-License-Identifier: LGPL-3.0-only
"""A Lustre ``#DW jobdw`` on nnf-sos, the real NNF driver on mock hardware, beside the real DWS.

``Stack(dws="real", nnf="sos")`` as in tests/test_nnf_sos_driver.py.  With the default
storage profile (nnf-sos's config/examples, ``combinedMgtMdt``) nnf-sos breaks a Lustre
jobdw into OSTs across the servers and one combined MGT/MDT, makes an NnfStorage of type
lustre with an NnfLustreMGT for its MGS, an NnfNodeStorage and NnfNodeBlockStorage per
target on the rabbit (in kind mode, pkg/filesystem/kind.go: directories for the targets, the
mock NID ``1.2.3.4@tcp`` for the MGS), and ClientMounts of type lustre on the computes.
The first test needs no binaries.
"""

from __future__ import annotations

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
from flux_dws.testing.realdws import lustre_problem, nnf_sos_problem
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
        assert status["ready"] is True and status["mgsAddress"] == "1.2.3.4@tcp"
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
            assert (lustre["fileSystemName"], lustre["mgsAddresses"]) == (fsname, "1.2.3.4@tcp")
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
