# SPDX-License-Identifier: LGPL-3.0-only
"""El Capitan's shape: 11,520 compute nodes, 720 rabbits of 16, a ~22 TiB Storage each.

    python bench/bench_elcap.py [--nodes 11520] [--per-rabbit 16] [--reconcile 2000]

Prints figures, never asserts (issue 23, goal 3):

- ``flux dws rabbit-graph`` (the real command, in a process of its own) writing the JGF from a
  saved SystemConfiguration + Storages and the instance's R: wall time and peak RSS;
- one health pass over every rabbit and node (flux_dws.core.health: every Storage read,
  the SystemConfiguration mapped, the drain plan, the node states, the SystemStatus patch):
  CPU time in steady state and with one rabbit down, and how many nodes that patch carries;
- the service's start-up reconcile with ``--reconcile`` workflows in flight on this system
  (bench/bench_reconcile.py with this many compute nodes and their rabbits);
- real Fluxion (bench/bench_fluxion.py at this size) where flux-core and Fluxion are
  installed: the graph's load, the first match after it and p50, with and without rabbits,
  for 4, 64 and 1024-node jobs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from flux_dws.core import health  # noqa: E402
from flux_dws.core.storage import rabbit_map  # noqa: E402
from flux_dws.testing.dwssim.companions import (  # noqa: E402
    group_computes,
    storage_resource,
    system_configuration,
)
from flux_dws.testing.fluxsetup import plain_R  # noqa: E402

NODES = 11520
PER_RABBIT = 16
CAPACITY = 22 * 2**40  # bytes: about what one El Capitan rabbit's Storage reports
JOB_SIZES = (4, 64, 1024)


def compute_names(count: int) -> list[str]:
    return [f"elcap{i:05d}" for i in range(1, count + 1)]


def system(nodes: int, per_rabbit: int) -> tuple[list[str], dict[str, Any], list[dict]]:
    """(hosts, SystemConfiguration, Storages), as DWS would show them."""
    hosts = compute_names(nodes)
    mapping = group_computes(hosts, per_rabbit)
    storages = [storage_resource(r, served, CAPACITY) for r, served in mapping.items()]
    return hosts, system_configuration(mapping), storages


def graph_run(hosts: list[str], config: dict, storages: list[dict]) -> dict[str, Any]:
    """``flux dws rabbit-graph`` from saved objects: wall seconds, peak RSS, output size."""
    with tempfile.TemporaryDirectory(prefix="elcap-") as tmp:
        saved, rfile, out = (os.path.join(tmp, n) for n in ("saved.json", "R.json", "jgf.json"))
        Path(saved).write_text(json.dumps({"kind": "List", "items": [config, *storages]}))
        Path(rfile).write_text(json.dumps(plain_R(hosts)))
        cmd = [sys.executable, "-m", "flux_dws", "rabbit-graph", "-R", rfile]
        cmd += ["--from-file", saved, "-o", out]
        # Started from a small process: Linux keeps a process's peak RSS across exec, and a
        # child forked from this one (which holds El Capitan's objects) would start with it.
        measured = subprocess.run(
            [sys.executable, "-c", _MEASURE, json.dumps(cmd)],
            cwd=HERE.parent,
            capture_output=True,
            text=True,
            check=False,
        )
        usage = json.loads(measured.stdout.strip().splitlines()[-1])
        message = measured.stderr.strip()
        size = os.path.getsize(out) if os.path.exists(out) else 0
    return {
        "graph_s": usage["wall_s"],
        "graph_cpu_s": usage["cpu_s"],
        "graph_peak_mib": usage["maxrss_kib"] / 1024,  # Linux: KiB
        "graph_mib": size / 2**20,
        "graph_exit": usage["exit"],
        "graph_summary": message.splitlines()[-1] if message else "",
    }


#: Runs the command given as JSON and prints its wall and CPU seconds, peak RSS and exit.
_MEASURE = """
import json, os, subprocess, sys, time
start = time.monotonic()
proc = subprocess.Popen(json.loads(sys.argv[1]))
_, status, usage = os.wait4(proc.pid, 0)
print(json.dumps({
    "wall_s": time.monotonic() - start,
    "cpu_s": usage.ru_utime + usage.ru_stime,
    "maxrss_kib": usage.ru_maxrss,
    "exit": os.waitstatus_to_exitcode(status),
}))
"""


def parse(storages: list[dict]) -> tuple[health.RabbitHealth, ...]:
    """Every Storage as health reads it (healthwatch does this per watch event, not per pass)."""
    return tuple(r for r in map(health.rabbit_health, storages) if r)


def health_pass(
    hosts: list[str], config: dict, storages: list[dict], status: Any, drained: dict[int, str]
) -> tuple[float, dict[str, Any] | None, health.DrainPlan]:
    """One pass of flux_dws.core.health as healthwatch runs it, from the watched Storages:
    CPU seconds, the SystemStatus patch, the plan."""
    rabbits = parse(storages)
    start = time.process_time()
    served = rabbit_map(config)
    ranks = dict(enumerate(hosts))  # one rank per host, as on El Capitan
    plan = health.plan_drains(rabbits, served, ranks, drained, drain_nodes=True)
    now = {**drained, **plan.drain}
    for rank in plan.undrain:
        now.pop(rank, None)
    wanted = health.node_states(hosts, {ranks[r]: why for r, why in now.items()}, ())
    patch = health.system_status_patch(status, wanted)
    return time.process_time() - start, patch, plan


def health_figures(hosts: list[str], config: dict, storages: list[dict]) -> dict[str, Any]:
    """Steady state (SystemStatus already current) and one rabbit Offline."""
    _, first, _ = health_pass(hosts, config, storages, None, {})
    status = {"data": {"nodes": dict((first or {}).get("data", {}).get("nodes", {}))}}
    steady = [health_pass(hosts, config, storages, status, {})[0] for _ in range(5)]
    down = [dict(s) for s in storages]
    down[0] = dict(down[0], status=dict(down[0].get("status") or {}, status="Offline"))
    passes = [health_pass(hosts, config, down, status, {}) for _ in range(3)]
    cpu = min(p[0] for p in passes)  # as the steady figure: the least of a few
    _, patch, plan = passes[-1]
    start = time.process_time()
    parse(storages)
    return {
        "health_parse_cpu_ms": (time.process_time() - start) * 1000,
        "health_pass_cpu_ms": min(steady) * 1000,
        "health_pass_down_cpu_ms": cpu * 1000,
        "health_steady_patch": None,
        "health_down_patch_nodes": len((patch or {}).get("data", {}).get("nodes", {})),
        "health_down_drains": len(plan.drain),
    }


def load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def measure(
    nodes: int = NODES, per_rabbit: int = PER_RABBIT, reconcile: int = 2000, matches: int = 20
) -> dict[str, Any]:
    hosts, config, storages = system(nodes, per_rabbit)
    figures: dict[str, Any] = {"nodes": nodes, "rabbits": len(storages)}
    figures.update(graph_run(hosts, config, storages))
    figures.update(health_figures(hosts, config, storages))
    steady = health_pass(hosts, config, storages, None, {})[1]
    status = {"data": {"nodes": dict((steady or {}).get("data", {}).get("nodes", {}))}}
    figures["health_steady_patch"] = health_pass(hosts, config, storages, status, {})[1]
    if reconcile:
        r = load("bench_reconcile").measure(reconcile, hosts=nodes)
        figures.update(
            reconcile_jobs=reconcile,
            reconcile_first_action_s=r["first_action_s"],
            reconcile_all_s=r["reconciled_s"],
            reconcile_kib_per_workflow=r["kib_per_workflow"],
        )
    fluxion = load("bench_fluxion")
    figures["fluxion"] = {}
    for size in JOB_SIZES if matches else ():
        f = fluxion.measure(nodes=nodes, rabbits=len(storages), matches=matches, job_nodes=size)
        if f["skipped"]:
            figures["fluxion_skipped"] = f["skipped"]
            break
        figures["fluxion"][size] = {"plain": f["match_plain_ms"], "rabbits": f["match_rabbits_ms"]}
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--per-rabbit", type=int, default=PER_RABBIT)
    parser.add_argument("--reconcile", type=int, default=2000, help="workflows; 0: skip")
    parser.add_argument("--matches", type=int, default=20, help="per job size; 0: skip Fluxion")
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    f = measure(args.nodes, args.per_rabbit, args.reconcile, args.matches)
    print(f"El Capitan shape: {f['nodes']} nodes, {f['rabbits']} rabbits of {args.per_rabbit}")
    print(
        f"rabbit-graph: {f['graph_s']:.2f} s wall, {f['graph_cpu_s']:.2f} s CPU, peak RSS "
        f"{f['graph_peak_mib']:.0f} MiB, JGF {f['graph_mib']:.1f} MiB (exit {f['graph_exit']}): "
        f"{f['graph_summary']}   [goal < 3 s, < 500 MiB]"
    )
    print(
        f"health pass: {f['health_pass_cpu_ms']:.1f} ms CPU steady, "
        f"{f['health_pass_down_cpu_ms']:.1f} ms with a rabbit down [goal < 50 ms]; SystemStatus "
        f"patch: {f['health_steady_patch']} in steady state, {f['health_down_patch_nodes']} "
        f"nodes with one rabbit down ({f['health_down_drains']} drains); reading all "
        f"{f['rabbits']} Storages (once, at the watch's list): {f['health_parse_cpu_ms']:.1f} ms"
    )
    if "reconcile_jobs" in f:
        print(
            f"reconcile {f['reconcile_jobs']} workflows: first action "
            f"{f['reconcile_first_action_s']}, all {f['reconcile_all_s']} s, "
            f"{f['reconcile_kib_per_workflow']:.1f} KiB per workflow"
        )
    if f.get("fluxion_skipped"):
        print(f"fluxion: {f['fluxion_skipped']}")
    for size, m in f["fluxion"].items():
        print(f"fluxion {size}-node job: without rabbits {m['plain']}, with {m['rabbits']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
