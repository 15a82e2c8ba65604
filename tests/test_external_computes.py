# SPDX-License-Identifier: LGPL-3.0-only
"""Jobs on DWS's externalComputeNodes: compute nodes the SystemConfiguration lists outside
every rabbit's computesAccess.

DWS's own controllers treat such a node as any other (Computes only lists names); nnf-sos
makes it a namespace for its ClientMounts and mounts Lustre on it over the network, but a
per-compute file system (xfs, gfs2, raw) needs the node's own rabbit.  A job without storage
runs there; xfs on one is refused naming it; Lustre reaches it.  Each runs on dwssim, on the
real DWS (dwssim playing only nnf-sos's driver beside it) and on the real DWS under real Flux.
"""

from __future__ import annotations

import pytest

from flux_dws.base.jobid import f58
from flux_dws.core.identity import workflow_name
from flux_dws.testing.realdws import BACKENDS, backend_options, backend_problem
from flux_dws.testing.stack import Stack

LUSTRE = "#DW jobdw type=lustre capacity=10GiB name=lus"
XFS = "#DW jobdw type=xfs capacity=10GiB name=scratch"


def note(info) -> str:
    return (info.exception or {}).get("note", "")


def assert_clean(stack, info) -> None:
    assert info.state == "INACTIVE" and not info.holds, info.holds
    assert not stack.left_behind(info.id)


@pytest.fixture(scope="module", params=BACKENDS)
def stack(request):
    """Two nodes, compute-02 an externalComputeNode, on each DWS and job-manager."""
    if backend_problem(request.param):
        pytest.skip(backend_problem(request.param))
    with Stack(hosts=2, external=["compute-02"], **backend_options(request.param)) as running:
        yield running


def test_a_job_without_storage_runs_on_an_external_node(stack):
    config = stack.api.store.get("systemconfigurations", "default", "default")
    assert config["spec"]["externalComputeNodes"] == [{"name": "compute-02"}]
    info = stack.wait(stack.submit(["#DW Proposal action=complete"], nnodes=2))
    assert info.result == "COMPLETED" and info.attach_status == 0, info.exception
    assert_clean(stack, info)


def test_xfs_on_an_external_node_fails_before_the_job_starts_naming_it(stack):
    info = stack.wait(stack.submit(XFS, nnodes=2))
    assert info.result == "FAILED" and "start" not in [e["name"] for e in info.eventlog]
    assert note(info) == (
        "Setup failed: cannot place the job's storage: compute node compute-02 is one of the"
        " SystemConfiguration's externalComputeNodes: no rabbit is attached to it, so it"
        f" cannot have xfs storage (only Lustre reaches it); flux dws status {f58(info.id)}"
    )
    assert_clean(stack, info)


def test_lustre_is_mounted_on_an_external_node_and_placed_on_the_other_nodes_rabbit(stack):
    store = stack.api.store
    start = store.resource_version
    jobid = stack.submit(LUSTRE, nnodes=2)
    info = stack.wait(jobid)
    assert info.result == "COMPLETED" and info.attach_status == 0, info.exception
    assert_clean(stack, info)
    name = workflow_name(stack.identity, jobid)
    placed, mounted = set(), set()
    for plural in ("servers", "clientmounts"):
        watch = store.watch(plural, resource_version=start)
        while (event := watch.next(0)) is not None:
            obj = event[1]
            if plural == "servers" and obj["metadata"]["name"].startswith(name):
                for aset in (obj.get("spec") or {}).get("allocationSets") or []:
                    placed |= {entry["name"] for entry in aset["storage"]}
            elif plural == "clientmounts" and name in obj["metadata"]["name"]:
                mounted.add(obj["metadata"]["namespace"])
        watch.close()
    assert placed == {"rabbit-0"}
    assert mounted == {"compute-01", "compute-02"}
