# SPDX-License-Identifier: LGPL-3.0-only
"""``[dws] soft-drain``: a rabbit going down marks its nodes with Fluxion's ``badrabbit``
property (flux-coral2's soft drain, which HPE's ``nnf rabbit state`` lists) instead of
draining them, and #DW jobs are released with the constraint that avoids them.

The pure rules first, then the service on fakeflux (as if Fluxion were loaded) + kubeapi +
dwssim; tests/test_fluxion_health.py runs it on real Flux with Fluxion.
"""

from __future__ import annotations

import pytest

from flux_dws.core.policy import policy_from_table
from flux_dws.core.rabbits import node_paths
from flux_dws.core.softdrain import AVOID, CONSTRAINTS_KEY, changes, with_avoid
from flux_dws.testing.stack import Stack
from tests.waiting import wait_for

RABBITS = {"rabbit-0": ["compute-01", "compute-02"], "rabbit-1": ["compute-03", "compute-04"]}
HOSTS = ["compute-01", "compute-02", "compute-03", "compute-04"]
XFS = "#DW jobdw type=xfs capacity=10GiB name=scratch"
WAIT = 60.0


def test_changes_mark_the_new_and_clear_the_recovered():
    assert changes({"compute-03": "why"}, set(), HOSTS) == (("compute-03",), ())
    assert changes({"compute-03": "why"}, {"compute-03"}, HOSTS) == ((), ())
    assert changes({}, {"compute-03", "gone"}, HOSTS) == ((), ("compute-03",))
    # not known (a fresh service): every host not wanted is cleared once
    assert changes({"compute-04": "why"}, None, HOSTS) == (
        ("compute-04",),
        ("compute-01", "compute-02", "compute-03"),
    )
    assert changes({"not-ours": "why"}, set(), HOSTS) == ((), ())  # only Flux's own hosts


def test_the_job_keeps_its_own_constraints():
    assert with_avoid(None) == AVOID
    assert with_avoid({}) == AVOID
    own = {"properties": ["bigmem"]}
    assert with_avoid(own) == {"and": [own, AVOID]}
    assert with_avoid(with_avoid(own)) == {"and": [own, AVOID]}  # never added twice
    assert with_avoid("junk") == AVOID


def test_off_by_default_and_a_boolean():
    assert policy_from_table({}).soft_drain is False
    assert policy_from_table({"soft-drain": True}).soft_drain is True
    with pytest.raises(ValueError, match="soft-drain"):
        policy_from_table({"soft-drain": "yes"})


@pytest.fixture(scope="module")
def stack():
    config = {"heartbeat": "0.5s", "health-interval": "0.2s", "soft-drain": True}
    with Stack(config, hosts=4, rabbits=RABBITS, identity="soft") as running:
        running.service.health.nodes.fluxion = True  # as if Fluxion were loaded
        yield running


def test_a_down_rabbit_marks_its_nodes_and_drains_none(stack):
    nodes = stack.service.health.nodes
    stack.set_rabbit("rabbit-1", "Offline")
    wait_for(lambda: nodes.badrabbit == {"compute-03", "compute-04"}, "marked badrabbit", WAIT)
    wait_for(lambda: nodes.rabbits.get("rabbit-1") is False, "its pool down", WAIT)
    assert not stack.flux.drained()
    calls = nodes.property_calls
    passes = stack.service.health.passes
    wait_for(lambda: stack.service.health.passes > passes + 2, "quiet passes", WAIT)
    assert nodes.property_calls == calls  # marked once, not on every pass
    stack.set_rabbit("rabbit-1", "Ready")
    wait_for(lambda: not nodes.badrabbit, "the property cleared", WAIT)
    assert not stack.flux.drained()


def test_a_down_link_marks_only_its_node(stack):
    nodes = stack.service.health.nodes
    stack.set_rabbit("rabbit-0", "Ready", links={"compute-02": "Offline"})
    wait_for(lambda: nodes.badrabbit == {"compute-02"}, "compute-02 marked", WAIT)
    assert not stack.flux.drained()
    stack.set_rabbit("rabbit-0", "Ready", links={"compute-02": "Ready"})
    wait_for(lambda: not nodes.badrabbit, "the property cleared", WAIT)


def test_dw_jobs_are_released_with_the_constraint_their_own_kept(stack):
    plain = stack.submit(XFS)
    info = stack.wait(plain, timeout=WAIT)
    assert info.result == "COMPLETED", info.exception
    assert info.jobspec["attributes"]["system"]["constraints"] == AVOID
    own = {"properties": ["bigmem"]}
    jobid = stack.flux.submit({"dw": XFS, "constraints": own}, nnodes=1, runtime=0.0)
    info = stack.wait(jobid, timeout=WAIT)
    assert info.result == "COMPLETED", info.exception
    assert info.jobspec["attributes"]["system"]["constraints"] == {"and": [own, AVOID]}
    (release,) = [e for e in info.eventlog if e["name"] == "jobspec-update"][:1]
    assert release["context"][CONSTRAINTS_KEY] == {"and": [own, AVOID]}


def test_a_fresh_service_clears_a_mark_left_behind(stack):
    stack.kill_service()
    stack.flux.badrabbit.add("compute-01")  # an earlier service's mark; its rabbit is fine
    stack.flux.fluxion = True  # the next service's first pass already sees Fluxion
    try:
        stack.start_service()
        wait_for(lambda: not stack.flux.badrabbit, "the stale mark cleared", WAIT)
    finally:
        stack.flux.fluxion = False


def test_node_paths_come_from_the_graph_fluxion_holds():
    """FluxNodes marks the node vertices whose paths Fluxion's own JGF gives (the name left
    out where it is basename + id, as Fluxion's writer does)."""
    graph = {
        "graph": {
            "nodes": [
                {"metadata": {"type": "cluster", "paths": {"containment": "/cluster0"}}},
                {
                    "metadata": {
                        "type": "node",
                        "paths": {"containment": "/cluster0/rabbit-0/compute-01"},
                    }
                },
                {
                    "metadata": {
                        "type": "node",
                        "name": "login",
                        "paths": {"containment": "/cluster0/login"},
                    }
                },
                {"metadata": {"type": "ssd", "paths": {"containment": "/cluster0/rabbit-0/ssd0"}}},
                {"metadata": {"type": "node", "paths": {"containment": 7}}},
            ]
        }
    }
    assert node_paths({"scheduling": graph}) == {
        "compute-01": "/cluster0/rabbit-0/compute-01",
        "login": "/cluster0/login",
    }
    assert node_paths({"scheduling": "junk"}) == {}
