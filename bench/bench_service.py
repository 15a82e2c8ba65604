"""N concurrent #DW jobs through the real service (fakeflux + kubeapi + dwssim, zero delays).

    python bench/bench_service.py [-n 1000] [--containers 0.2]

Prints, never asserts: per-transition reaction time (workflow change seen by the watch ->
next desiredState patch sent) p50/p99, jobs completed per second, Kubernetes requests per job
by verb (the service's own client only), and memory per tracked workflow.  Everything runs in
one process on this machine, so the simulator and the API server share its two cores.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flux_dws.testing.stack import Stack  # noqa: E402

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
CONTAINER = [
    "#DW jobdw type=gfs2 capacity=10GiB name=shared",
    "#DW container name=app profile=ok DW_JOB_data=shared",
]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def rss_mib() -> float:
    """Current resident set size (Linux /proc), MiB."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--jobs", type=int, default=1000)
    parser.add_argument("--containers", type=float, default=0.2, help="share with a container")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run kubeapi + dwssim in this process (default: a process of their own)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with Stack(hosts=args.jobs, time_scale=0.001, api_process=not args.in_process) as stack:
        assert stack.service is not None
        gc.collect()
        before = rss_mib()
        start = time.monotonic()
        every = int(1 / args.containers) if args.containers else 0
        jobs = [
            stack.submit(CONTAINER if every and i % every == 0 else JOBDW, runtime=0.5)
            for i in range(args.jobs)
        ]
        submitted = time.monotonic() - start
        peak_tracked, peak_rss = 0, before
        pending = set(jobs)
        deadline = start + args.timeout
        while pending and time.monotonic() < deadline:
            service = stack.service
            if len(service.jobs) >= peak_tracked:
                peak_tracked, peak_rss = len(service.jobs), max(peak_rss, rss_mib())
            done = {j for j in pending if stack.flux.info(j).state == "INACTIVE"}
            pending -= done
            time.sleep(0.2)
        elapsed = time.monotonic() - start
        results = [stack.flux.info(j).result for j in jobs]
        service = stack.service
        reactions = [r * 1000 for r in service.metrics.reactions]
        counts = service.kube.request_counts()
        actions = dict(service.metrics.actions)
        left = len(stack.workflows())

    completed = len(jobs) - len(pending)
    print(
        f"jobs: {len(jobs)} submitted in {submitted:.1f}s, {completed} finished in {elapsed:.1f}s"
    )
    print(f"results: { {r: results.count(r) for r in sorted(set(map(str, results)))} }")
    print(f"throughput: {completed / elapsed:.1f} jobs/s (whole stack on one machine)")
    if reactions:
        print(
            f"reaction (workflow change seen -> next desiredState patch sent): "
            f"p50 {statistics.median(reactions):.2f} ms, p99 {percentile(reactions, 99):.2f} ms, "
            f"max {max(reactions):.1f} ms over {len(reactions)} transitions"
        )
    per_job = {verb: round(n / len(jobs), 2) for verb, n in sorted(counts.items())}
    print(f"Kubernetes requests per job by verb: {per_job} (total {sum(counts.values())})")
    print(f"actions per job: { {k: round(v / len(jobs), 2) for k, v in sorted(actions.items())} }")
    print(f"list calls: {counts.get('list', 0)} (start-up only)")
    print(
        f"memory: peak {peak_tracked} tracked workflows, process RSS +{peak_rss - before:.1f} MiB "
        f"= {(peak_rss - before) * 1024 / max(peak_tracked, 1):.1f} KiB per workflow "
        f"(includes fakeflux)"
    )
    print(f"workflows left behind: {left}")


if __name__ == "__main__":
    main()
