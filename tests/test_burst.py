# SPDX-License-Identifier: LGPL-3.0-only
"""A burst of #DW jobs larger than [dws] max-proposals: DWS sees it a few jobs at a time.

fakeflux + kubeapi + dwssim + the real service, with a slow Proposal so the window fills.
"""

from __future__ import annotations

import threading
import time

from flux_dws.core.identity import JOBID_LABEL
from flux_dws.testing.stack import Stack

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
LIMIT, JOBS = 2, 6


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of [start, end] intervals that overlap at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = current = 0
    for _, step in edges:
        current += step
        most = max(most, current)
    return most


def test_a_burst_creates_at_most_max_proposals_workflows_at_once_in_submit_order():
    config = {"max-proposals": LIMIT}
    with Stack(config, hosts=JOBS, delays={"Proposal": 0.2}, time_scale=0.01) as stack:
        watch = stack.api.store.watch("workflows", stack.policy.namespace, shared=True)
        created: dict[int, float] = {}  # jobid -> when its workflow was seen created
        order: list[int] = []
        stop = threading.Event()

        def record() -> None:  # until stopped and every event already queued is read
            while True:
                event = watch.next(0.1)
                if event is None and stop.is_set():
                    return
                if event is not None and event[0] == "ADDED":
                    jobid = int(event[1]["metadata"]["labels"][JOBID_LABEL])
                    created.setdefault(jobid, time.time())
                    order.append(jobid)

        recorder = threading.Thread(target=record, daemon=True)
        recorder.start()
        ids = [stack.submit(JOBDW, runtime=0.05) for _ in range(JOBS)]
        infos = [stack.wait(jobid, timeout=60) for jobid in ids]
        stop.set()
        recorder.join(30)
        watch.close()
        assert [info.result for info in infos] == ["COMPLETED"] * JOBS
        assert sorted(order) == sorted(ids)  # one workflow each
        assert set(order[:LIMIT]) == set(ids[:LIMIT])  # the first to ask went first
        released = {info.id: info.events("dependency-remove")[0]["timestamp"] for info in infos}
        # From creation to release to the scheduler, a job holds a Proposal slot.
        assert most_at_once([(created[j], released[j]) for j in ids]) <= LIMIT
        assert stack.workflows_left() == []


def test_without_a_limit_the_whole_burst_is_in_proposal_together():
    """The same burst with max-proposals = 0: what the limit above prevents."""
    config = {"max-proposals": 0}
    with Stack(config, hosts=JOBS, delays={"Proposal": 0.2}, time_scale=0.01) as stack:
        ids = [stack.submit(JOBDW, runtime=0.05) for _ in range(JOBS)]
        infos = [stack.wait(jobid, timeout=60) for jobid in ids]
        first_release = min(info.events("dependency-remove")[0]["timestamp"] for info in infos)
        workflows_before = [
            info for info in infos if info.events("dws-workflow")[0]["timestamp"] < first_release
        ]
        assert len(workflows_before) == JOBS
