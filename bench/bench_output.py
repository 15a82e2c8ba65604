# SPDX-License-Identifier: LGPL-3.0-only
"""Cost of saving a job's container output: pods listed, log tails read, over HTTP.

    python bench/bench_output.py [--pods 16] [--log-kib 256] [--limit-kib 64] [--repeat 5]

Prints figures; never passes or fails on time.  Each container's log holds ``--log-kib`` of
80-byte lines; flux_dws.k8s.recordreads.collect_output lists the workflow's pods and reads the
last ``--limit-kib`` of each log from kubeapi with the real kubernetes client, as the service
does once a job's containers end (before Teardown, on a worker thread).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flux_dws.core.output import CONTAINER_LABEL  # noqa: E402
from flux_dws.k8s import KubeClient  # noqa: E402
from flux_dws.k8s.recordreads import collect_output  # noqa: E402
from flux_dws.testing.kubeapi import KubeApi  # noqa: E402
from flux_dws.testing.kubeapi.podlog import logs_of  # noqa: E402

WORKFLOW = "fluxjob-bench-1"


def measure(pods: int = 16, log_kib: int = 256, limit_kib: int = 64, repeat: int = 5) -> dict:
    with KubeApi() as api, tempfile.TemporaryDirectory() as tmp:
        kubeconfig = api.write_kubeconfig(os.path.join(tmp, "kubeconfig"))
        line = "x" * 79 + "\n"
        text = line * (log_kib * 1024 // len(line))
        for i in range(pods):
            name = f"{WORKFLOW}-rabbit-{i}"
            api.store.create(
                "pods",
                "default",
                {
                    "metadata": {"name": name, "labels": {CONTAINER_LABEL: WORKFLOW}},
                    "spec": {"containers": [{"name": "app"}]},
                    "status": {
                        "containerStatuses": [
                            {"name": "app", "state": {"terminated": {"exitCode": 1}}}
                        ]
                    },
                },
            )
            logs_of(api.store).write("default", name, "app", text)
        kube = KubeClient.connect(namespace="default", identity="bench", kubeconfig=kubeconfig)
        try:
            seconds = []
            for _ in range(repeat):
                api.reset_counts()
                start = time.perf_counter()
                saved = collect_output(kube, WORKFLOW, "default", limit_kib * 1024)
                seconds.append(time.perf_counter() - start)
            document = json.dumps(saved.to_json())
        finally:
            kube.close()
        counts = api.request_counts()
    return {
        "pods": pods,
        "collect_ms_median": statistics.median(seconds) * 1000,
        "requests": sum(counts.values()),
        "saved_kib": len(document) / 1024,
        "all_truncated": all(c.truncated for c in saved.containers),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=16)
    parser.add_argument("--log-kib", type=int, default=256)
    parser.add_argument("--limit-kib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    figures = measure(args.pods, args.log_kib, args.limit_kib, args.repeat)
    for key, value in figures.items():
        print(f"{key:20} {value:.1f}" if isinstance(value, float) else f"{key:20} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
