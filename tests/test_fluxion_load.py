# SPDX-License-Identifier: LGPL-3.0-only
"""Real Fluxion loads the graph flux-dws writes, as the admin guide configures it, and matches
a job with storage in it (issue 23, goal 3).

The graph leaves out every vertex key Fluxion fills in itself (flux_dws.core.rabbits), which
halves its load at El Capitan's size; a Fluxion that no longer fills them in, or a graph
writer that drops one it needs, fails here.  Nothing is timed.
"""

from __future__ import annotations

import json

import pytest

from flux_dws.core.jobspec import release_update
from flux_dws.core.rabbits import GIB, RabbitPool, allocated_rabbits, resource_graph, ssd_parts
from flux_dws.core.storage import PER_COMPUTE, AllocationNeed
from flux_dws.testing.fluxsetup import plain_R

pytestmark = pytest.mark.realflux

HOSTS = [f"compute-{i:02d}" for i in range(1, 7)]
#: What doc/guide/admin.rst has sched-fluxion-resource load (bench/bench_fluxion.py too).
ARGS = ("match-format=rv1",)


@pytest.fixture
def fluxion():
    from conftest import _fluxion_missing

    missing = _fluxion_missing()
    if missing:
        pytest.skip(missing)


def jobspec(nnodes: int, gib: int) -> dict:
    from flux_dws.testing.fluxionmatch import node_jobspec

    need = AllocationNeed("bd", ("default", "s"), "xfs", PER_COMPUTE, gib * GIB)
    spec = node_jobspec(nnodes)
    return {**spec, "resources": release_update(spec["resources"], [need], {}, True)["resources"]}


def test_fluxion_loads_the_graph_and_gives_storage_from_the_nodes_rabbit(fluxion):
    from flux_dws.testing.fluxionmatch import fluxion_match

    rabbits = {
        "rabbit-0": RabbitPool("rabbit-0", tuple(HOSTS[:2]), 100 * GIB, "Ready", True),
        "rabbit-1": RabbitPool("rabbit-1", tuple(HOSTS[2:4]), 100 * GIB, "Offline", True),
    }
    graph = resource_graph(plain_R(HOSTS, cores="0-1"), rabbits)
    got = fluxion_match(graph, jobspec(2, 10), 2, ARGS, timeout=300)
    # every vertex and edge loaded
    assert got["stats"]["V"] == len(graph["scheduling"]["graph"]["nodes"])
    assert got["stats"]["E"] == len(graph["scheduling"]["graph"]["edges"])
    # the nodes and their SSD from the one Ready rabbit, the first, though Fluxion's default
    # policy tries high ids first: rabbit-1's pool is down (status, the one key its parts
    # carry besides size and unit), and nodes without a rabbit have no SSD at all
    R = got["first"]["R"]
    R = R if isinstance(R, dict) else json.loads(R)
    assert allocated_rabbits(R) == {"rabbit-0": HOSTS[:2]}
    pool = dict(ssd_parts(graph)["rabbit-0"])
    taken = ssd_parts(R)["rabbit-0"]
    assert {path for path, _ in taken} <= pool.keys()
    assert all(gib == pool[path] for path, gib in taken)  # Fluxion read each part's size
    assert sum(gib for _, gib in taken) >= 2 * 10
