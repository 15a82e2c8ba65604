# SPDX-License-Identifier: LGPL-3.0-only
"""``[dws] soft-drain`` on a real Flux instance scheduled by Fluxion.

A compute node whose link to its rabbit goes down gets Fluxion's ``badrabbit`` property (what
HPE's ``nnf rabbit state`` finds with ``flux ion-resource find property=badrabbit``), is not
drained, and no new #DW job is placed on it; a job without #DW still uses it; the property
comes off when the link is Ready.  Skipped, with one line, where flux-core or Fluxion
(flux-sched) is not installed.
"""

from __future__ import annotations

import pytest

from flux_dws.base.hostlist import expand_hostlist
from flux_dws.core.rabbits import GIB, node_paths
from flux_dws.testing.realflux import flux_command, fluxion_installed

if flux_command() is None:
    pytest.skip("flux-core is not installed: soft drain skipped", allow_module_level=True)
if not fluxion_installed():
    pytest.skip(
        "Fluxion (flux-sched) is not installed: soft drain skipped", allow_module_level=True
    )

from waiting import wait_for  # noqa: E402

from flux_dws.testing.stack import Stack  # noqa: E402

RABBITS = {"rabbit-0": ["compute-01", "compute-02"], "rabbit-1": ["compute-03", "compute-04"]}
XFS = "#DW jobdw type=xfs capacity=10GiB name=scratch"
WAIT = 120.0


@pytest.fixture(scope="module")
def stack():
    config = {
        "heartbeat": "2s",
        "rabbit-scheduling": True,
        "health-interval": "1s",
        "soft-drain": True,
    }
    with Stack(
        hosts=4, backend="flux", config=config, rabbits=RABBITS, capacity=100 * GIB
    ) as running:
        yield running


def marked(stack) -> set[str]:
    """Node vertices with the badrabbit property, as `nnf rabbit state` finds them."""
    handle = stack.flux._handle
    found = handle.rpc(
        "sched-fluxion-resource.find", {"criteria": "property=badrabbit", "format": "jgf"}
    ).get()
    return set(node_paths({"scheduling": (found or {}).get("R")}))


def test_a_down_link_marks_its_node_which_no_dw_job_gets(stack):
    from flux.job import JobspecV1, submit

    stack.set_rabbit("rabbit-0", "Ready", links={"compute-02": "Offline"})
    wait_for(lambda: marked(stack) == {"compute-02"}, "compute-02 marked badrabbit", WAIT)
    assert not stack.flux.drained()
    job = stack.submit(XFS, nnodes=3)
    info = stack.wait(job, timeout=WAIT)
    assert info.result == "COMPLETED", info.exception
    nodelist = stack.flux.job_R(job)["execution"]["nodelist"]
    assert "compute-02" not in {h for entry in nodelist for h in expand_hostlist(entry)}
    handle = stack.flux._handle
    plain = int(submit(handle, JobspecV1.from_command(["true"], num_nodes=4, num_tasks=4)))
    assert stack.wait(plain, timeout=WAIT).result == "COMPLETED"  # not drained: still runs
    stack.set_rabbit("rabbit-0", "Ready", links={"compute-02": "Ready"})
    wait_for(lambda: not marked(stack), "the property cleared", WAIT)
