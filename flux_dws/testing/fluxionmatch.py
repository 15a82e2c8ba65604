# SPDX-License-Identifier: LGPL-3.0-only
"""Real Fluxion loading an R and matching one jobspec, for bench/bench_fluxion.py and tests.

A one-broker Flux instance (``flux start -s1``) whose R is the one given: sched-fluxion-resource
is loaded alone (``match-format=rv1`` and whatever else is asked), then each match is an
allocate RPC followed by a cancel, so every match sees the same empty graph.

The graph's load is timed on its own.  sched-fluxion-resource tells the broker it is running
*before* it reads its graph (flux-sched 0.54, resource/modules/resource.cpp ``mod_main``:
``flux_module_set_running``, then ``init_resource_graph``, then the reactor), so module.load
returns at once and the first request waits for the whole load: the resource.acquire
response carrying R, the graph's reader, the traverser's initialisation.  A
``stats-get`` request sent right after module.load is answered once that is over: its wall
time is the load, and every match after it is a match alone.  Used only where flux-core and
Fluxion are installed; nothing here imports ``flux``.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flux_dws.flux.bindings import flux_command

#: Run inside the instance by flux-core's own Python.
MATCHER = r"""
import json, sys, time, flux
h = flux.Flux()
jobspec, count, args = json.load(open(sys.argv[1])), int(sys.argv[2]), json.loads(sys.argv[3])
for name in ("sched-fluxion-qmanager", "sched-fluxion-feasibility", "sched-fluxion-resource"):
    h.rpc("module.remove", {"name": name}).get()
h.rpc("module.remove", {"name": "resource"}).get()
h.rpc("module.load", {"path": "resource", "args": ["monitor-force-up", "noverify"]}).get()
start = time.perf_counter()
h.rpc("module.load", {"path": "sched-fluxion-resource", "args": args}).get()
stats = h.rpc("sched-fluxion-resource.stats-get", {}).get()
load = time.perf_counter() - start
times, first = [], None
for jobid in range(1, count + 1):
    start = time.perf_counter()
    r = h.rpc("sched-fluxion-resource.match",
              {"cmd": "allocate", "jobid": jobid, "jobspec": json.dumps(jobspec)}).get()
    times.append(time.perf_counter() - start)
    first = first or r
    h.rpc("sched-fluxion-resource.cancel", {"jobid": jobid}).get()
print(json.dumps({"load": load, "stats": stats, "times": times, "first": first}))
"""


def fluxion_match(
    R: Mapping[str, Any],
    jobspec: Mapping[str, Any],
    count: int,
    args: Sequence[str] = ("match-format=rv1",),
    timeout: float = 1800,
) -> dict[str, Any]:
    """``load`` (seconds from module.load until the graph is loaded), ``stats`` (Fluxion's
    stats-get answer then: ``V``, ``E``, ``load-time``...), ``times`` (seconds per match) and
    ``first`` (the first match's response: its ``R``).  RuntimeError if the instance fails."""
    flux = flux_command()
    if flux is None:
        raise RuntimeError("flux-core is not installed")
    with tempfile.TemporaryDirectory(prefix="flux-dws-fluxion-") as tmp:
        workdir = Path(tmp)
        (workdir / "R.json").write_text(json.dumps(R))
        (workdir / "jobspec.json").write_text(json.dumps(jobspec))
        (workdir / "matcher.py").write_text(MATCHER)
        conf = workdir / "conf"
        conf.mkdir()
        (conf / "r.toml").write_text(
            f'[resource]\nnoverify = true\npath = "{workdir / "R.json"}"\n'
        )
        out = subprocess.run(
            [flux, "start", "-s1", f"--config-path={conf}", "flux", "python"]
            + [str(workdir / "matcher.py"), str(workdir / "jobspec.json"), str(count)]
            + [json.dumps(list(args))],
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
        if out.returncode != 0:
            raise RuntimeError(f"matching failed: {out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def node_jobspec(nnodes: int) -> dict[str, Any]:
    """A jobspec of ``nnodes`` nodes, one core each, as the benchmarks and tests match."""
    return {
        "version": 1,
        "resources": [
            {
                "type": "node",
                "count": nnodes,
                "with": [
                    {
                        "type": "slot",
                        "count": 1,
                        "label": "task",
                        "with": [{"type": "core", "count": 1}],
                    }
                ],
            }
        ],
        "tasks": [{"command": ["true"], "slot": "task", "count": {"per_slot": 1}}],
        "attributes": {"system": {"duration": 0}},
    }
