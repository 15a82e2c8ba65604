# SPDX-License-Identifier: LGPL-3.0-only
"""Watch event latency and API requests per workflow lifecycle, against kubeapi over HTTP.

    python bench/bench_watch.py [-n 200] [--latency 0.0] [--error-rate 0.0]

Prints figures; never passes or fails on time.  Latency is measured from just before an object
is written to the API server's store to the moment WorkflowWatch hands the event to on_event,
one write at a time (so it is the delivery latency, not queueing).  The existing Flux
integration polls every 5 s, so its latency is 0-5 s (2.5 s on average).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flux_dws.core.identity import INSTANCE_LABEL, JOBID_LABEL  # noqa: E402
from flux_dws.core.states import STATE_ORDER, State  # noqa: E402
from flux_dws.k8s import KubeClient, WorkflowWatch  # noqa: E402
from flux_dws.testing.kubeapi import KubeApi  # noqa: E402

NS = "default"
IDENTITY = "bench"
DIRECTIVES = ["#DW jobdw type=xfs capacity=10GiB name=scratch"]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def measure_latency(api: KubeApi, kube: KubeClient, count: int) -> list[float]:
    arrived: dict[str, float] = {}
    cond = threading.Condition()

    def on_event(kind: str, obj: dict) -> None:
        with cond:
            arrived[obj["metadata"]["resourceVersion"]] = time.perf_counter()
            cond.notify_all()

    watch = WorkflowWatch(kube, on_event)
    watch.start()
    name = f"fluxjob-{IDENTITY}-latency"
    try:
        base = api.store.create(
            "workflows",
            NS,
            {
                "metadata": {"name": name, "labels": {INSTANCE_LABEL: IDENTITY, JOBID_LABEL: "0"}},
                "spec": {
                    "desiredState": "Proposal",
                    "wlmID": "flux",
                    "jobID": "0",
                    "userID": 1,
                    "groupID": 1,
                    "dwDirectives": DIRECTIVES,
                },
            },
        )
        wait_for(cond, arrived, base["metadata"]["resourceVersion"])
        latencies = []
        for i in range(count):
            start = time.perf_counter()
            obj = api.store.patch(
                "workflows", NS, name, {"metadata": {"annotations": {"bench": str(i)}}}
            )
            rv = obj["metadata"]["resourceVersion"]
            wait_for(cond, arrived, rv)
            latencies.append(arrived[rv] - start)
        return latencies
    finally:
        watch.stop()
        api.store.patch("workflows", NS, name, {"metadata": {"finalizers": []}})
        api.store.delete("workflows", NS, name)


def wait_for(cond: threading.Condition, arrived: dict, rv: str, timeout: float = 30.0) -> None:
    with cond:
        if not cond.wait_for(lambda: rv in arrived, timeout):
            raise SystemExit(f"event for resourceVersion {rv} never arrived")


def one_lifecycle(api: KubeApi, kube: KubeClient, jobid: int) -> Counter:
    """Requests for create, 6 desiredState moves, Computes, Servers, delete (DWS played
    in-process: its writes are not counted)."""
    before = Counter(kube.request_counts())
    kube.create_workflow(jobid=jobid, userid=1, groupid=1, directives=DIRECTIVES)
    name = kube.workflow_name(jobid)
    api.store.create("computes", NS, {"metadata": {"name": name}, "data": []})
    api.store.create("servers", NS, {"metadata": {"name": f"{name}-0"}, "spec": {}})
    for previous, state in zip(STATE_ORDER, STATE_ORDER[1:]):
        api.store.patch(
            "workflows",
            NS,
            name,
            {"status": {"state": previous.value, "ready": True, "status": "Completed"}},
        )
        if state is State.SETUP:
            kube.patch_servers(
                f"{name}-0",
                NS,
                [{"label": "xfs", "allocationSize": 1 << 30, "storage": []}],
            )
        kube.set_desired_state(name, state)
        if state is State.SETUP:
            kube.patch_computes(name, ["node1", "node2"])
    kube.delete_workflow(name)
    return Counter(kube.request_counts()) - before


def measure(n: int = 200, latency: float = 0.0, error_rate: float = 0.0) -> dict:
    """The figures, as data (bench/run collects them into one table)."""
    with KubeApi() as api, tempfile.TemporaryDirectory() as tmp:
        kubeconfig = api.write_kubeconfig(os.path.join(tmp, "kubeconfig"))
        kube = KubeClient.connect(namespace=NS, identity=IDENTITY, kubeconfig=kubeconfig)
        api.faults.set(latency=latency, error_rate=error_rate, retry_after=0)
        ms = [x * 1000 for x in measure_latency(api, kube, n)]
        counts = one_lifecycle(api, kube, jobid=1)
        kube.close()
    return {
        "writes": len(ms),
        "watch_p50_ms": percentile(ms, 50),
        "watch_p99_ms": percentile(ms, 99),
        "watch_max_ms": max(ms),
        "watch_mean_ms": statistics.mean(ms),
        "lifecycle_requests": dict(sorted(counts.items())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="writes to time (default 200)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added per request")
    parser.add_argument("--error-rate", type=float, default=0.0, help="share of 5xx/429 answers")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    figures = measure(args.n, args.latency, args.error_rate)
    print(f"watch latency, write -> on_event, {figures['writes']} writes:")
    print(
        f"  p50 {figures['watch_p50_ms']:.2f} ms   p99 {figures['watch_p99_ms']:.2f} ms"
        f"   max {figures['watch_max_ms']:.2f} ms   mean {figures['watch_mean_ms']:.2f} ms"
    )
    print("  (the existing Flux integration polls every 5 s: 2500 ms on average)")
    counts = figures["lifecycle_requests"]
    print("API requests for one workflow lifecycle (create, 6 states, computes, servers,")
    print("delete), by verb:")
    for verb, count in counts.items():
        print(f"  {verb:8} {count}")
    print(f"  {'total':8} {sum(counts.values())}")


if __name__ == "__main__":
    main()
