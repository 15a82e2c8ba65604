# SPDX-License-Identifier: LGPL-3.0-only
"""Early release: node-seconds a #DW job's nodes are given back per job, for a copy_out of a
given duration.

    python bench/bench_release.py [--copy-out 5] [--nodes 2] [--backends fakeflux,fluxion]

For each backend (fakeflux; a real Flux instance scheduled by Fluxion, with rabbits, where
flux-core and Fluxion are installed; sched-simple with ``flux``), the same job
(``jobdw`` + ``copy_out``, dwssim's DataOut delayed by ``--copy-out`` seconds) runs once with
``[dws] release-nodes = "after-teardown"`` and once with ``"after-unmount"``.  A job holds its
nodes from its ``alloc`` event to its ``free`` event; node-seconds = nodes x that time.  The
saving is the difference: about nodes x (DataOut + Teardown), less the extra ClientMount read.
Prints figures; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flux_dws.core.states import State  # noqa: E402
from flux_dws.testing.fluxsetup import fluxion_installed, real_flux_problem  # noqa: E402
from flux_dws.testing.stack import Stack  # noqa: E402

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
COPY_OUT = "#DW copy_out source=$DW_JOB_scratch/out destination=/lus/out"


def held(info: Any) -> float:
    """Seconds from the job's alloc to its free (its nodes were the job's)."""
    times = {e["name"]: e["timestamp"] for e in info.eventlog if e["name"] in ("alloc", "free")}
    return times["free"] - times["alloc"]


def one(backend: str, release: str, copy_out: float, nodes: int) -> float:
    config: dict[str, Any] = {"heartbeat": "2s", "release-nodes": release}
    kw: dict[str, Any] = {}
    if backend != "fakeflux":
        kw["backend"] = "flux"
    if backend == "fluxion":
        config["rabbit-scheduling"] = True
        kw["rabbits"] = {"rabbit-0": [f"compute-{i:02d}" for i in range(1, nodes + 1)]}
    delays = {State.DATAOUT: copy_out}
    with Stack(config, hosts=nodes, delays=delays, **kw) as stack:
        jobid = stack.submit([JOBDW, COPY_OUT], nnodes=nodes)
        return held(stack.wait(jobid, timeout=120 + 2 * copy_out)) * nodes


def skipped(backend: str) -> str | None:
    if backend == "fakeflux":
        return None
    problem = real_flux_problem()
    if problem:
        return f"skipped: {problem}"
    if backend == "fluxion" and not fluxion_installed():
        return "skipped: Fluxion (flux-sched) is not installed"
    return None


def measure(
    copy_out: float = 5.0, nodes: int = 2, backends: tuple[str, ...] = ("fakeflux", "fluxion")
) -> dict[str, Any]:
    """backend -> {"held_after_teardown", "held_after_unmount", "saved"} node-seconds, or
    {"skipped": why}."""
    results: dict[str, Any] = {"copy_out": copy_out, "nodes": nodes}
    for backend in backends:
        why = skipped(backend)
        if why:
            results[backend] = {"skipped": why}
            continue
        safe = one(backend, "after-teardown", copy_out, nodes)
        early = one(backend, "after-unmount", copy_out, nodes)
        results[backend] = {
            "held_after_teardown": safe,
            "held_after_unmount": early,
            "saved": safe - early,
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copy-out", type=float, default=5.0, help="DataOut's duration, seconds")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--backends", default="fakeflux,fluxion")
    args = parser.parse_args()
    got = measure(args.copy_out, args.nodes, tuple(args.backends.split(",")))
    print(f"copy_out of {got['copy_out']:g} s, {got['nodes']}-node job")
    for backend in args.backends.split(","):
        r = got[backend]
        if "skipped" in r:
            print(f"{backend:9} {r['skipped']}")
            continue
        print(
            f"{backend:9} held {r['held_after_teardown']:.1f} node-s after Teardown, "
            f"{r['held_after_unmount']:.1f} node-s with early release: "
            f"{r['saved']:.1f} node-s saved per job"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
