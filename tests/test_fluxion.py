# SPDX-License-Identifier: LGPL-3.0-only
"""Rabbit-aware scheduling on a real Flux instance scheduled by Fluxion.

The instance's R holds two rabbits of 100 GiB, each serving two compute nodes, and a fifth
node no rabbit serves (flux_dws.core.rabbits.resource_graph); dwssim holds each rabbit to its
capacity, so a scheduler that ignored it would fail jobs in Setup.  Skipped, with one line,
where flux-core or Fluxion (flux-sched) is not installed.
"""

from __future__ import annotations

import io
import json
import time

import pytest

from flux_dws.base.hostlist import expand_hostlist
from flux_dws.cli import main
from flux_dws.core.rabbits import GIB, allocated_rabbits
from flux_dws.flux.bindings import flux_command
from flux_dws.testing.fluxsetup import fluxion_installed

if flux_command() is None:
    pytest.skip("flux-core is not installed: Fluxion scheduling skipped", allow_module_level=True)
if not fluxion_installed():
    pytest.skip(
        "Fluxion (flux-sched) is not installed: rabbit scheduling skipped", allow_module_level=True
    )

from flux_dws.testing.stack import Stack  # noqa: E402
from tests.waiting import wait_for  # noqa: E402

RABBITS = {"rabbit-0": ["compute-01", "compute-02"], "rabbit-1": ["compute-03", "compute-04"]}
XFS_60 = "#DW jobdw type=xfs capacity=60GiB name=scratch"


@pytest.fixture(scope="module")
def stack():
    config = {"heartbeat": "2s", "rabbit-scheduling": True}
    # Proposal takes a second, so a restart can land between the workflow and the release.
    with Stack(
        hosts=5,
        backend="flux",
        config=config,
        rabbits=RABBITS,
        capacity=100 * GIB,
        delays={"Proposal": 1.0},
    ) as running:
        yield running


def events(info, name: str) -> list[dict]:
    return [e for e in info.eventlog if e["name"] == name]


def test_jobs_share_rabbits_by_capacity_and_none_fails_in_setup(stack):
    jobs = [stack.submit(XFS_60, nnodes=2, runtime=1.0) for _ in range(3)]
    infos = [stack.wait(j, timeout=120) for j in jobs]
    for info in infos:
        assert info.result == "COMPLETED", (info.exception, stack.flux.service_log()[-2000:])
    for jobid in jobs:
        placed = allocated_rabbits(stack.flux.job_R(jobid))
        # 60 GiB on each of two nodes cannot come from one 100 GiB rabbit: one node on each
        assert sorted(placed) == ["rabbit-0", "rabbit-1"], placed
        assert all(len(hosts) == 1 for hosts in placed.values())
    # two jobs never held 60 GiB of the same 100 GiB rabbit at once: they ran one by one
    spans = sorted(
        (events(i, "alloc")[0]["timestamp"], events(i, "free")[0]["timestamp"]) for i in infos
    )
    for (_, first_free), (second_alloc, _) in zip(spans, spans[1:]):
        assert second_alloc >= first_free


def test_the_jobspec_is_rewritten_once_with_ssd_per_node(stack):
    jobid = stack.submit(XFS_60, nnodes=2, runtime=0.0)
    info = stack.wait(jobid, timeout=120)
    updates = [e for e in events(info, "jobspec-update") if "resources" in e["context"]]
    assert len(updates) == 1
    slot = updates[0]["context"]["resources"][0]
    assert (slot["type"], slot["count"], slot["label"]) == ("slot", 2, "rabbit")
    assert slot["with"][1] == {"type": "ssd", "count": 60, "exclusive": True}


def test_more_than_any_rabbit_has_is_refused_with_a_clear_message(stack):
    jobid = stack.submit("#DW jobdw type=xfs capacity=200GiB name=scratch", nnodes=1)
    info = stack.wait(jobid, timeout=120)
    assert info.result != "COMPLETED"
    note = (info.exception or {}).get("note", "")
    assert "unsatisfiable" in note.lower(), info.exception
    # failed before it started: no epilog waits for its workflow's Teardown and delete
    wait_for(
        lambda: not [w for w in stack.workflows() if w["spec"]["jobID"] in (jobid, str(jobid))],
        "its workflow deleted",
    )


def test_a_node_without_a_rabbit_is_never_given_to_a_dw_job_but_runs_others(stack):
    from flux.job import JobspecV1, submit

    dw_job = stack.submit("#DW jobdw type=xfs capacity=1GiB name=scratch", nnodes=4)
    info = stack.wait(dw_job, timeout=120)
    assert info.result == "COMPLETED", info.exception
    hosts = {h for hs in allocated_rabbits(stack.flux.job_R(dw_job)).values() for h in hs}
    assert hosts == {"compute-01", "compute-02", "compute-03", "compute-04"}
    # a fifth #DW node cannot be found: compute-05 has no rabbit
    too_wide = stack.submit("#DW jobdw type=xfs capacity=1GiB name=scratch", nnodes=5)
    assert "unsatisfiable" in ((stack.wait(too_wide, timeout=120).exception or {}).get("note", ""))
    handle = stack.flux._handle
    plain = int(submit(handle, JobspecV1.from_command(["true"], num_nodes=5, num_tasks=5)))
    assert stack.wait(plain, timeout=120).result == "COMPLETED"
    nodelist = stack.flux.job_R(plain)["execution"]["nodelist"]
    assert "compute-05" in [h for entry in nodelist for h in expand_hostlist(entry)]


def test_servers_name_exactly_the_rabbits_in_the_jobs_R(stack):
    jobid = stack.submit(XFS_60, nnodes=2, runtime=None)
    stack.wait_event(jobid, "start", timeout=120)  # PreRun was ready: Setup had its Servers
    try:
        placed = allocated_rabbits(stack.flux.job_R(jobid))
        name = f"fluxjob-{stack.identity}-{jobid}"
        servers = stack.api.store.get("servers", "default", f"{name}-0")
        named = {s["name"] for aset in servers["spec"]["allocationSets"] for s in aset["storage"]}
        assert named == set(placed)
        # the plugin recorded them on the job (flux jobs -o '{user.rabbits}')
        memos = [e["context"] for e in stack.flux.eventlog(jobid) if e["name"] == "memo"]
        assert {"rabbits": "rabbit-[0-1]"} in memos
        # and flux dws rabbits -j names the same rabbits, with the job's 60 GiB on each
        out, err = io.StringIO(), io.StringIO()
        argv = ["rabbits", "-j", str(jobid), "--kubeconfig", stack.kubeconfig, "--json"]
        assert main(argv, out=out, err=err) == 0, err.getvalue()
        got = {r["name"]: r["allocation"] for r in json.loads(out.getvalue())}
        assert got == {rabbit: 60 * GIB for rabbit in placed}
    finally:
        stack.cancel(jobid)
        stack.wait(jobid, timeout=120)


def test_a_restart_between_proposal_and_release_does_not_rewrite_twice(stack):
    jobid = stack.submit(XFS_60, nnodes=2, runtime=0.0)
    stack.wait_event(jobid, "dws-workflow", timeout=60)
    stack.kill_service()
    assert not [e for e in stack.flux.eventlog(jobid) if e["name"] == "jobspec-update"]
    time.sleep(1.5)  # Proposal is ready while no service runs
    stack.start_service()
    info = stack.wait(jobid, timeout=120)
    assert info.result == "COMPLETED", info.exception
    assert len([e for e in events(info, "jobspec-update") if "resources" in e["context"]]) == 1


def test_a_chassis_request_gets_its_nodes_and_ssd_from_one_rabbit(stack):
    """Jobspecs written for the existing integration's graph (rabbit = chassis) still work."""
    from flux.job import Jobspec, submit

    task = {"type": "slot", "count": 1, "label": "task", "with": [{"type": "core", "count": 1}]}
    resources = [
        {"type": "chassis", "count": 1, "with": [{"type": "node", "count": 2, "with": [task]}]}
    ]
    jobspec = Jobspec(
        resources,
        [{"command": ["true"], "slot": "task", "count": {"per_slot": 1}}],
        version=1,
        attributes={
            "system": {"duration": 0, "dw": "#DW jobdw type=xfs capacity=30GiB name=scratch"}
        },
    )
    jobid = int(submit(stack.flux._handle, jobspec))
    info = stack.wait(jobid, timeout=120)
    assert info.result == "COMPLETED", (info.exception, stack.flux.service_log()[-2000:])
    update = [e for e in events(info, "jobspec-update") if "resources" in e["context"]][0]
    assert update["context"]["resources"][0]["with"][-1]["count"] == 60  # 30 GiB x 2 nodes
    placed = allocated_rabbits(stack.flux.job_R(jobid))
    assert len(placed) == 1 and len(next(iter(placed.values()))) == 2, placed


def test_a_lustre_job_over_two_rabbits_reserves_its_mdt_where_servers_put_it(stack):
    """issue 21: 120 GiB of OSTs over 2 nodes (too much for one 100 GiB rabbit, so one node
    on each) and the 32 GiB MDT on one of them.  Reserving only 60 + 16 GiB a node left
    Fluxion 24 GiB free on each rabbit where DWS had 8 on the MDT's: a 20 GiB job placed
    there failed in Setup.  Now each node reserves 60 + 32 and the small jobs wait."""
    lustre = stack.submit(
        "#DW jobdw type=lustre capacity=120GiB name=scratch", nnodes=2, runtime=None
    )
    stack.wait_event(lustre, "start", timeout=120)
    small = []
    try:
        assert sorted(allocated_rabbits(stack.flux.job_R(lustre))) == ["rabbit-0", "rabbit-1"]
        updates = [e for e in stack.flux.eventlog(lustre) if e["name"] == "jobspec-update"]
        slot = next(e["context"]["resources"][0] for e in updates if "resources" in e["context"])
        assert slot["with"][1]["count"] >= 60 + 32
        small = [stack.submit(XFS_20, nnodes=1, runtime=0.0) for _ in range(2)]
        time.sleep(2.0)  # room for Fluxion to place them now, were its pools too large
    finally:
        stack.cancel(lustre)
        stack.wait(lustre, timeout=120)
    for jobid in small:
        info = stack.wait(jobid, timeout=120)
        assert info.result == "COMPLETED", (info.exception, stack.flux.service_log()[-2000:])


XFS_20 = "#DW jobdw type=xfs capacity=20GiB name=scratch"


def test_a_users_own_ssd_is_replaced_so_fluxion_holds_what_dws_allocates(stack):
    """issue 22: the rewrite is the only source of ssd.  A #DW job that asks for 90 GiB of
    ssd itself beside each node gets the rewrite's 30 GiB instead, so on each rabbit Fluxion
    holds what Servers asks DWS to allocate there (rounded up to whole parts of the pool:
    rabbit-graph --chunks), not the user's figure; a job without #DW that asks for ssd is
    refused at submit, naming the rule."""
    from flux_dws.core.jobspec import OWN_SSD
    from flux_dws.core.rabbits import servers_held, ssd_parts
    from flux_dws.testing.fakeflux import SubmitError

    node_and_ssd = [
        {"type": "node", "count": 1, "with": [{"type": "core", "count": 1}]},
        {"type": "ssd", "count": 90},
    ]
    own = [{"type": "slot", "count": 2, "label": "task", "with": node_and_ssd}]
    jobid = stack.submit(
        "#DW jobdw type=xfs capacity=30GiB name=scratch", nnodes=2, runtime=None, resources=own
    )
    try:
        stack.wait_event(jobid, "start", timeout=120)
        R = stack.flux.job_R(jobid)
        parts = ssd_parts(R)
        name = f"fluxjob-{stack.identity}-{jobid}"
        allocated = servers_held(stack.api.store.get("servers", "default", f"{name}-0"))
        nodes = allocated_rabbits(R)
        assert set(allocated) == set(parts) == set(nodes)
        for rabbit, rabbit_parts in parts.items():
            held = sum(gib for _, gib in rabbit_parts) * GIB
            biggest = max(gib for _, gib in rabbit_parts) * GIB
            assert allocated[rabbit] == len(nodes[rabbit]) * 30 * GIB
            assert allocated[rabbit] <= held < allocated[rabbit] + len(nodes[rabbit]) * biggest
    finally:
        stack.cancel(jobid)
        stack.wait(jobid, timeout=120)
    with pytest.raises(SubmitError) as refused:
        stack.flux.submit({}, nnodes=2, resources=own)
    assert OWN_SSD in str(refused.value)
