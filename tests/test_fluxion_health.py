# SPDX-License-Identifier: LGPL-3.0-only
"""A rabbit that goes down, on a real Flux instance scheduled by Fluxion.

The service marks a down rabbit's ``ssd`` pool down in Fluxion, so no new #DW job gets its
nodes, while jobs without #DW still run there (nodes are not drained: ``drain-compute-nodes``
is off, its default).  When the rabbit is Ready again its pool comes back.  A job the size of
the whole system, queued before a rabbit outage, is not rejected as unsatisfiable and runs once
the rabbit is back.  With ``[dws] soft-drain`` a node whose link to its rabbit is down gets
Fluxion's ``badrabbit`` property (what HPE's ``nnf rabbit state`` finds with ``flux
ion-resource find property=badrabbit``) instead of a drain, and no new #DW job lands on it.
Skipped, with one line, where flux-core or Fluxion (flux-sched) is not
installed.
"""

from __future__ import annotations

import pytest

from flux_dws.base.hostlist import expand_hostlist
from flux_dws.core.rabbits import GIB, allocated_rabbits, node_paths
from flux_dws.flux.bindings import flux_command
from flux_dws.testing.fluxsetup import fluxion_installed

if flux_command() is None:
    pytest.skip("flux-core is not installed: Fluxion health skipped", allow_module_level=True)
if not fluxion_installed():
    pytest.skip(
        "Fluxion (flux-sched) is not installed: rabbit pools skipped", allow_module_level=True
    )

from waiting import wait_for  # noqa: E402

from flux_dws.testing.stack import Stack  # noqa: E402

RABBITS = {"rabbit-0": ["compute-01", "compute-02"], "rabbit-1": ["compute-03", "compute-04"]}
XFS = "#DW jobdw type=xfs capacity=10GiB name=scratch"
WAIT = 120.0
CONFIG = {"heartbeat": "2s", "rabbit-scheduling": True, "health-interval": "1s"}


def _running(**extra):
    config = {**CONFIG, **extra}
    return Stack(hosts=4, backend="flux", config=config, rabbits=RABBITS, capacity=100 * GIB)


@pytest.fixture(scope="module")
def stack():
    with _running() as running:
        yield running


def _find(stack, criteria: str):
    """Fluxion's vertices that match ``criteria``, as JGF (sched-fluxion-resource.find)."""
    handle = stack.flux._handle
    return handle.rpc("sched-fluxion-resource.find", {"criteria": criteria, "format": "jgf"}).get()


def down_pools(stack) -> set[str]:
    """Paths of the ssd vertices Fluxion holds down now."""
    text = str(_find(stack, "status=down"))
    return {rabbit for rabbit in RABBITS if f"/{rabbit}/ssd" in text}


def test_a_down_rabbit_gets_no_new_dw_job_but_its_nodes_still_run_others(stack):
    from flux.job import JobspecV1, submit

    stack.set_rabbit("rabbit-1", "Offline")
    wait_for(lambda: "rabbit-1" in down_pools(stack), "rabbit-1's pool down in Fluxion", WAIT)
    assert not stack.flux.drained()  # drain-compute-nodes is off: nothing drained

    dw_job = stack.submit(XFS, nnodes=2)
    info = stack.wait(dw_job, timeout=WAIT)
    assert info.result == "COMPLETED", info.exception
    assert set(allocated_rabbits(stack.flux.job_R(dw_job))) == {"rabbit-0"}

    handle = stack.flux._handle
    plain = int(submit(handle, JobspecV1.from_command(["true"], num_nodes=4, num_tasks=4)))
    assert stack.wait(plain, timeout=WAIT).result == "COMPLETED"

    wide = stack.submit(XFS, nnodes=3)  # needs rabbit-1: waits for it, does not fail
    stack.wait(wide, state="SCHED", timeout=WAIT)
    assert stack.flux.info(wide).state == "SCHED"
    stack.set_rabbit("rabbit-1", "Ready")
    wait_for(lambda: "rabbit-1" not in down_pools(stack), "rabbit-1's pool up again", WAIT)
    info = stack.wait(wide, timeout=WAIT)
    assert info.result == "COMPLETED", info.exception
    assert set(allocated_rabbits(stack.flux.job_R(wide))) == {"rabbit-0", "rabbit-1"}


def test_a_whole_system_job_queued_before_an_outage_runs_after_it(stack):
    from flux.job import JobspecV1, submit

    handle = stack.flux._handle
    blocker = stack.submit(XFS, nnodes=4, runtime=None)  # holds every node until cancelled
    stack.wait(blocker, state="RUN", timeout=WAIT)
    whole = int(submit(handle, JobspecV1.from_command(["true"], num_nodes=4, num_tasks=4)))
    whole_dw = stack.submit(XFS, nnodes=4)
    stack.wait(whole_dw, state="SCHED", timeout=WAIT)
    stack.set_rabbit("rabbit-1", "Offline")
    wait_for(lambda: "rabbit-1" in down_pools(stack), "rabbit-1's pool down in Fluxion", WAIT)

    seen = stack.health_passes()  # as the service reports them: Servers are watched, not listed
    wait_for(lambda: stack.health_passes() > seen + 2, "health passes during the outage", WAIT)
    assert not stack.flux.drained()
    for queued in (whole, whole_dw):  # waiting, not rejected as unsatisfiable
        assert stack.flux.info(queued).state == "SCHED", stack.flux.info(queued)
    stack.set_rabbit("rabbit-1", "Ready")
    wait_for(lambda: "rabbit-1" not in down_pools(stack), "rabbit-1's pool up again", WAIT)
    stack.cancel(blocker)
    assert stack.wait(whole, timeout=WAIT).result == "COMPLETED"
    info = stack.wait(whole_dw, timeout=WAIT)
    assert info.result == "COMPLETED", info.exception


@pytest.fixture(scope="module")
def soft_stack():
    with _running(**{"soft-drain": True}) as running:
        yield running


def marked(stack) -> set[str]:
    """Node vertices with the badrabbit property, as `nnf rabbit state` finds them."""
    return set(node_paths({"scheduling": (_find(stack, "property=badrabbit") or {}).get("R")}))


def test_soft_drain_marks_a_down_link_node_which_no_dw_job_gets(soft_stack):
    stack = soft_stack
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
