# SPDX-License-Identifier: LGPL-3.0-only
"""Rabbit scheduling costs: the jobspec rewrite, the graph, and Fluxion's match time.

    python bench/bench_fluxion.py [--nodes 1000] [--rabbits 250] [--matches 50]

Prints figures; never passes or fails on time.  The rewrite (flux_dws.core.jobspec.release_update)
and the graph (flux_dws.core.rabbits.resource_graph) are timed in this process.  Fluxion's match
time is measured in a one-broker Flux instance whose R holds ``--nodes`` nodes, once without
rabbits (a plain ``node`` jobspec) and once with ``--rabbits`` rabbits (the rewritten jobspec,
SSD under each node's rabbit): each match is an allocate RPC to sched-fluxion-resource,
followed by a cancel, so every match sees the same empty graph.  The graph's load (the first
request after module.load waits for all of it: flux_dws.testing.fluxionmatch) is its own
figure, apart from the first match.  Skipped, with one line, where flux-core or Fluxion is not
installed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flux_dws.core.jobspec import release_update  # noqa: E402
from flux_dws.core.rabbits import GIB, RabbitPool, resource_graph  # noqa: E402
from flux_dws.core.storage import ACROSS_SERVERS, PER_COMPUTE, AllocationNeed  # noqa: E402
from flux_dws.flux.bindings import flux_command  # noqa: E402
from flux_dws.testing.fluxionmatch import fluxion_match, node_jobspec  # noqa: E402
from flux_dws.testing.fluxsetup import fluxion_installed, plain_R  # noqa: E402

JOB_NODES = 4
SSD_PER_NODE = 60  # GiB
#: sched-fluxion-resource's options, as doc/guide/admin.rst recommends them (with and without
#: rabbits alike): Fluxion's defaults otherwise.
FLUXION_ARGS = ("match-format=rv1",)


def hosts(count: int) -> list[str]:
    return [f"node{i:04d}" for i in range(1, count + 1)]


def rabbits_for(names: list[str], count: int) -> dict[str, RabbitPool]:
    per = max(1, len(names) // count)
    return {
        f"rabbit-{r:03d}": RabbitPool(
            f"rabbit-{r:03d}", tuple(names[r * per : (r + 1) * per]), 32 * 2**40, "Ready", True
        )
        for r in range(count)
    }


def needs() -> list[AllocationNeed]:
    return [
        AllocationNeed("bd-0", ("default", "s0"), "xfs", PER_COMPUTE, SSD_PER_NODE * GIB),
        AllocationNeed("bd-1", ("default", "s1"), "ost", ACROSS_SERVERS, 100 * GIB),
    ]


def time_rewrite(count: int) -> float:
    """ms per job for the jobspec update at dependency release (rabbit scheduling on)."""
    resources, wanted = node_jobspec(JOB_NODES)["resources"], needs()
    start = time.perf_counter()
    for _ in range(count):
        release_update(resources, wanted, {}, True)
    return (time.perf_counter() - start) * 1000 / count


def match_times(R: dict[str, Any], jobspec: dict[str, Any], count: int) -> dict[str, float]:
    """ms: the graph's load (``load``), then the matches (``first``, ``p50``, ``max``)."""
    got = fluxion_match(R, jobspec, count, FLUXION_ARGS)
    times = got["times"]
    return {
        "load": got["load"] * 1000,
        "first": times[0] * 1000,
        "p50": statistics.median(times[1:] or times) * 1000,
        "max": max(times[1:] or times) * 1000,
    }


def measure(
    nodes: int = 1000, rabbits: int = 250, matches: int = 50, job_nodes: int = JOB_NODES
) -> dict[str, Any]:
    """``job_nodes``: the size of the job matched (bench/bench_elcap.py tries several)."""
    names = hosts(nodes)
    plain = plain_R(names)
    inventory = rabbits_for(names, rabbits)
    start = time.perf_counter()
    graph = resource_graph(plain, inventory)
    graph_ms = (time.perf_counter() - start) * 1000
    result: dict[str, Any] = {
        "nodes": nodes,
        "rabbits": rabbits,
        "rewrite_ms_per_job": time_rewrite(2000),
        "graph_ms": graph_ms,
        "graph_vertices": len(graph["scheduling"]["graph"]["nodes"]),
        "match_plain_ms": None,
        "match_rabbits_ms": None,
        "skipped": "",
    }
    if flux_command() is None or not fluxion_installed():
        result["skipped"] = "flux-core or Fluxion not installed: match time not measured"
        return result
    rewritten = node_jobspec(job_nodes)
    rewritten["resources"] = release_update(rewritten["resources"], needs(), {}, True)["resources"]
    for key, R, jobspec in (
        ("match_plain_ms", plain, node_jobspec(job_nodes)),
        ("match_rabbits_ms", graph, rewritten),
    ):
        result[key] = match_times(R, jobspec, matches)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rabbits", type=int, default=250)
    parser.add_argument("--matches", type=int, default=50)
    args = parser.parse_args()
    figures = measure(args.nodes, args.rabbits, args.matches)
    print(f"nodes {figures['nodes']}, rabbits {figures['rabbits']}, {JOB_NODES}-node job")
    print(f"jobspec rewrite: {figures['rewrite_ms_per_job']:.3f} ms per job")
    print(f"rabbit graph: {figures['graph_ms']:.0f} ms for {figures['graph_vertices']} vertices")
    if figures["skipped"]:
        print(figures["skipped"])
        return 0
    plain, rabbit = figures["match_plain_ms"], figures["match_rabbits_ms"]
    print(f"{'Fluxion (allocate RPC)':24} {'load':>10} {'first':>10} {'p50':>10} {'max':>10}")
    for label, row in (("without rabbits", plain), ("with rabbits", rabbit)):
        print(
            f"{label:24} {row['load']:>8.0f}ms {row['first']:>8.2f}ms {row['p50']:>8.2f}ms "
            f"{row['max']:>8.2f}ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
