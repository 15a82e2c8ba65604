# SPDX-License-Identifier: LGPL-3.0-only
"""N concurrent #DW jobs through the real service (fakeflux + kubeapi + dwssim, zero delays).

    python bench/bench_service.py [-n 1000] [--containers 0.2]
    python bench/bench_service.py -n 1000 --compare /path/to/other/checkout [--rounds 2]

Prints, never asserts: per-transition reaction time (the observation that allows the next
state -- the workflow's ready state from the watch, or the job's allocation or end from the
plugin -- to the next desiredState patch sent, including the Computes and Servers patches that
must precede it) p50/p99, jobs completed per second, Kubernetes requests per job
by verb (the service's own client only), and memory per tracked workflow.  The service runs
in a process of its own, as under real Flux; kubeapi + dwssim in a second and fakeflux with
this driver in a third, all on this machine's cores (``--in-process``: all in one process).

``--compare`` runs this checkout and another one (e.g. a worktree of 3ce06cc) alternately,
each round in fresh processes, and prints one row per run; the service's CPU is then measured
the same way for both (its process's rusage as it exits, start-up included), so that the
comparison holds whatever each checkout's own figures report.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flux_dws.testing.fakeflux.remote import rss_mib, service_figures  # noqa: E402
from flux_dws.testing.stack import Stack  # noqa: E402

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
CONTAINER = [
    "#DW jobdw type=gfs2 capacity=10GiB name=shared",
    "#DW container name=app profile=ok DW_JOB_local_storage=shared",
]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def measure(
    jobs: int = 1000, containers: float = 0.2, timeout: float = 600.0, in_process: bool = False
) -> dict:
    """Run the jobs; the figures, as data (bench/run collects them into one table).

    By default the service runs in a process of its own, as under real Flux (so its memory
    and CPU are its own), kubeapi + dwssim in another, and fakeflux with this driver in this
    one; ``in_process`` puts all of them in this process.
    """
    stack = Stack(
        hosts=jobs,
        time_scale=0.001,
        api_process=not in_process,
        service_process=not in_process,
    )
    with stack:
        gc.collect()
        before = rss_mib()
        start = time.monotonic()
        every = int(1 / containers) if containers else 0
        ids = [
            stack.submit(CONTAINER if every and i % every == 0 else JOBDW, runtime=0.5)
            for i in range(jobs)
        ]
        submitted = time.monotonic() - start
        peak_tracked, peak_rss = 0, before
        pending = set(ids)
        deadline = start + timeout
        while pending and time.monotonic() < deadline:  # light polling: not to steal CPU
            if stack.service is not None and len(stack.service.jobs) >= peak_tracked:
                peak_tracked, peak_rss = len(stack.service.jobs), max(peak_rss, rss_mib())
            states = stack.flux.states()
            pending = {j for j in pending if states[j] != "INACTIVE"}
            time.sleep(0.5)
        elapsed = time.monotonic() - start
        results = [str(stack.flux.info(j).result) for j in ids]
        if stack.service is not None:
            figures = service_figures(stack.service)
            figures.update(peak_tracked=peak_tracked, baseline_mib=before, rss_at_peak_mib=peak_rss)
        else:
            figures = stack.stop_service()
        left = len(stack.workflows())
    reactions = [seconds * 1000 for _, seconds in figures["reactions"]]
    by_state: dict[str, list[float]] = {}
    for state, seconds in figures["reactions"]:
        by_state.setdefault(state, []).append(seconds * 1000)
    counts = figures["requests"]
    done = jobs - len(pending)
    peak = max(figures["peak_tracked"], 1)
    return {
        "jobs": jobs,
        "service": "in this process" if in_process else "a process of its own",
        "submit_s": submitted,
        "finished": done,
        "elapsed_s": elapsed,
        "jobs_per_s": done / elapsed,
        "results": {r: results.count(r) for r in sorted(set(results))},
        "reaction_p50_ms": statistics.median(reactions) if reactions else None,
        "reaction_p99_ms": percentile(reactions, 99) if reactions else None,
        "reaction_max_ms": max(reactions) if reactions else None,
        "transitions": len(reactions),
        "reaction_by_state_ms": {
            state: (statistics.median(ms), percentile(ms, 99)) for state, ms in by_state.items()
        },
        "requests_per_job": {v: round(n / jobs, 2) for v, n in sorted(counts.items())},
        "requests_total": sum(counts.values()),
        "list_calls": counts.get("list", 0),
        "record_reads": figures.get("record_reads", {}),
        "actions_per_job": {k: round(v / jobs, 2) for k, v in sorted(figures["actions"].items())},
        "peak_tracked": figures["peak_tracked"],
        "kib_per_workflow": (figures["rss_at_peak_mib"] - figures["baseline_mib"]) * 1024 / peak,
        "workflows_left": left,
        "cpu_ms_per_job": figures["cpu_s"] * 1000 / jobs if "cpu_s" in figures else None,
        "cpu_by_thread_s": figures.get("cpu_by_thread", {}),
    }


#: Runs one checkout's own bench_service.measure() in a fresh process, with that checkout
#: first on sys.path, and adds the service process's CPU as its parent saw it exit (wait4).
RUNNER = r"""
import json, os, sys
checkout, jobs = sys.argv[1], int(sys.argv[2])
sys.path[:0] = [checkout, os.path.join(checkout, "bench")]
usage = {}
def waitpid(pid, options, _wait4=os.wait4):
    found, status, rusage = _wait4(pid, options)
    if found:
        usage[found] = rusage.ru_utime + rusage.ru_stime
    return found, status
os.waitpid = waitpid
import subprocess
services = []
class Popen(subprocess.Popen):
    def __init__(self, args, *a, **kw):
        super().__init__(args, *a, **kw)
        if any("fakeflux.remote" in str(arg) for arg in args):
            services.append(self.pid)
subprocess.Popen = Popen
import bench_service
figures = bench_service.measure(jobs=jobs)
figures["service_cpu_s"] = sum(usage.get(pid, 0.0) for pid in services)
print("FIGURES " + json.dumps(figures, default=str))
"""


def run_checkout(checkout: str, jobs: int) -> dict:
    """bench_service.measure() of ``checkout``, in a process of its own."""
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, checkout, str(jobs)],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith("FIGURES "):
            return json.loads(line[len("FIGURES ") :])
    raise RuntimeError(f"{checkout}: no figures (exit {out.returncode}): {out.stderr[-2000:]}")


def compare(other: str, jobs: int, rounds: int) -> list[dict]:
    """Rounds of (this checkout, ``other``), alternating; one row of figures per run."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = []
    for round_ in range(1, rounds + 1):
        for label, checkout in (("this", here), ("other", os.path.abspath(other))):
            f = run_checkout(checkout, jobs)
            rows.append(
                {
                    "run": f"{label} ({checkout}), run {round_}",
                    "reaction_p50_ms": f["reaction_p50_ms"],
                    "reaction_p99_ms": f["reaction_p99_ms"],
                    "list_calls": f["list_calls"],
                    "requests_per_job": round(f["requests_total"] / jobs, 2),
                    "cpu_ms_per_job": f["service_cpu_s"] * 1000 / jobs,
                    "kib_per_workflow": f["kib_per_workflow"],
                    "finished": f["finished"],
                }
            )
            print(format_row(rows[-1]), flush=True)
    return rows


def format_row(r: dict) -> str:
    return (
        f"| {r['run']} | {r['reaction_p50_ms']:.1f} ms | {r['reaction_p99_ms']:.0f} ms | "
        f"{r['list_calls']} | {r['requests_per_job']} | {r['cpu_ms_per_job']:.1f} ms | "
        f"{r['kib_per_workflow']:.1f} KiB | {r['finished']} |"
    )


COMPARE_HEADER = (
    "| run | reaction p50 | reaction p99 | list calls | requests per job | service CPU per job"
    " (start-up incl.) | memory per workflow | jobs finished |\n|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--jobs", type=int, default=1000)
    parser.add_argument("--containers", type=float, default=0.2, help="share with a container")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the service and kubeapi + dwssim in this process (default: each their own)",
    )
    parser.add_argument("--compare", metavar="CHECKOUT", help="also run this other checkout")
    parser.add_argument("--rounds", type=int, default=2, help="with --compare: rounds of both")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.compare:
        print(COMPARE_HEADER, flush=True)
        compare(args.compare, args.jobs, args.rounds)
        return
    f = measure(args.jobs, args.containers, args.timeout, args.in_process)
    print(
        f"jobs: {f['jobs']} submitted in {f['submit_s']:.1f}s, "
        f"{f['finished']} finished in {f['elapsed_s']:.1f}s"
    )
    print(f"results: {f['results']}")
    print(f"throughput: {f['jobs_per_s']:.1f} jobs/s (whole stack on one machine)")
    if f["reaction_p50_ms"] is not None:
        print(
            f"reaction (workflow change seen -> next desiredState patch sent): "
            f"p50 {f['reaction_p50_ms']:.2f} ms, p99 {f['reaction_p99_ms']:.2f} ms, "
            f"max {f['reaction_max_ms']:.1f} ms over {f['transitions']} transitions"
        )
        for state, (p50, p99) in f["reaction_by_state_ms"].items():
            print(f"  -> {state}: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    print(
        f"Kubernetes requests per job by verb: {f['requests_per_job']} "
        f"(total {f['requests_total']})"
    )
    print(f"actions per job: {f['actions_per_job']}")
    print(f"list calls: {f['list_calls']} (start-up, and records' reads the watches missed)")
    print(f"records' reads (watched copy / listed instead): {f['record_reads']}")
    print(
        f"memory: peak {f['peak_tracked']} tracked workflows, "
        f"{f['kib_per_workflow']:.1f} KiB per workflow (RSS growth of the process the service "
        f"runs in: {f['service']})"
    )
    print(f"workflows left behind: {f['workflows_left']}")
    if f["cpu_ms_per_job"] is not None:
        print(f"service CPU per job: {f['cpu_ms_per_job']:.2f} ms (user + system, its own process)")
        print(f"  CPU seconds by thread: {f['cpu_by_thread_s']}")


if __name__ == "__main__":
    main()
