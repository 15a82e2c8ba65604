# SPDX-License-Identifier: LGPL-3.0-only
"""Chaos on a real Flux instance: the real jobtap plugin, the service as a real process killed
with SIGKILL at random moments, Kubernetes API faults, and another instance's workflows in the
same namespace.  Skipped where flux-core is not installed (tests/test_chaos.py runs the larger
version against fakeflux everywhere).

    FLUX_DWS_FLUX_CHAOS_JOBS=40 FLUX_DWS_CHAOS_SEED=5 python -m pytest tests/test_chaos_flux.py -s
"""

from __future__ import annotations

import os
import random
import time

import pytest

from flux_dws.core.identity import INSTANCE_LABEL, JOBID_LABEL
from flux_dws.testing.fluxsetup import real_flux_problem

PROBLEM = real_flux_problem()
pytestmark = [
    pytest.mark.realflux,
    pytest.mark.skipif(PROBLEM is not None, reason=f"real Flux skipped: {PROBLEM}"),
]

JOBS = int(os.environ.get("FLUX_DWS_FLUX_CHAOS_JOBS", "40"))
SEED = int(os.environ.get("FLUX_DWS_CHAOS_SEED", "5"))
KILLS = 10
GFS2 = "#DW jobdw type=gfs2 capacity=1GiB name=shared"
JOBDW = "#DW jobdw type=xfs capacity=1GiB name=scratch"

# kind -> (directives, what the user's `flux run` reports, a substring of the dws note)
KINDS = {
    "ok": ([JOBDW], 0, ""),
    "container-ok": (
        [GFS2, "#DW container name=app profile=ok DW_JOB_local_storage=shared"],
        0,
        "",
    ),
    "never-start": (
        [GFS2, "#DW container name=app profile=never-start DW_JOB_local_storage=shared"],
        1,
        "failed to start after",
    ),
    "crash-loop": (
        [GFS2, "#DW container name=app profile=crash-loop DW_JOB_local_storage=shared"],
        1,
        "failed to run successfully",
    ),
    "setup-error": ([JOBDW, "#DW Setup action=error message=boom severity=Fatal"], 1, "Setup"),
    "cancel": ([JOBDW, "#DW PreRun action=wait"], 1, ""),
}


def other_instance_workflow(jobid: int) -> dict:
    """A workflow of another instance sharing the namespace, named like one of ours."""
    return {
        "apiVersion": "dataworkflowservices.github.io/v1alpha7",
        "kind": "Workflow",
        "metadata": {
            "name": f"fluxjob-other-{jobid}",
            "labels": {INSTANCE_LABEL: "other", JOBID_LABEL: str(jobid)},
        },
        "spec": {
            "desiredState": "Proposal",
            "wlmID": "flux",
            "jobID": str(jobid),
            "userID": 1001,
            "groupID": 1001,
            "dwDirectives": [JOBDW],
        },
    }


def test_real_flux_jobs_end_as_their_story_says_through_kills_and_faults():
    from flux_dws.testing.stack import Stack

    rng = random.Random(SEED)
    kinds = [rng.choice(sorted(KINDS)) for _ in range(JOBS)]
    with Stack(
        hosts=4, delays=0.05, time_scale=0.01, backend="flux", config={"heartbeat": "1s"}
    ) as stack:
        assert stack.api is not None
        store, namespace = stack.api.store, stack.policy.namespace
        others = [
            store.create("workflows", namespace, other_instance_workflow(900000 + i))
            for i in range(3)
        ]
        stack.api.faults.set(error_rate=0.05, error_codes=(500, 503, 429), latency=0.003)
        ids = {}
        kills = 0
        for i, kind in enumerate(kinds):
            ids[stack.submit(KINDS[kind][0], runtime=0.2)] = kind
            if i % max(1, JOBS // KILLS) == 0 and kills < KILLS:
                time.sleep(rng.uniform(0.0, 1.5))
                stack.kill_service()  # SIGKILL
                time.sleep(rng.uniform(0.0, 1.0))
                stack.start_service()
                kills += 1
        for jobid, kind in ids.items():  # wherever they are by now: queued, held or waiting
            if kind == "cancel":
                stack.cancel(jobid)
        stack.api.faults.clear()
        infos = {jobid: stack.wait(jobid, timeout=240) for jobid in ids}
        left = stack.workflows_left()  # a job failed before it started: Teardown may still run
        after = [store.get("workflows", namespace, o["metadata"]["name"]) for o in others]
    print(f"\nreal Flux chaos: {JOBS} jobs, {kills} SIGKILLs, kinds {sorted(set(kinds))}")
    problems = []
    for jobid, info in infos.items():
        kind = ids[jobid]
        _, failed, reason = KINDS[kind]
        note = (info.exception or {}).get("note", "")
        dws = [e for e in info.events("exception") if e["context"]["type"] == "dws"]
        if (info.attach_status != 0) != bool(failed):
            problems.append(f"{jobid} {kind}: flux run exit {info.attach_status}, note {note!r}")
        if reason and reason not in note:
            problems.append(f"{jobid} {kind}: note {note!r} lacks {reason!r}")
        if len(dws) > 1 or len(info.events("jobspec-update")) > 1:
            problems.append(f"{jobid} {kind}: an action took visible effect twice")
        if info.holds:
            problems.append(f"{jobid} {kind}: still held {info.holds}")
    assert not problems, "\n".join(problems)
    assert left == [], f"workflows left behind: {left}"
    for before, now in zip(others, after):
        assert (
            now["spec"] == before["spec"]
            and now["metadata"]["labels"] == before["metadata"]["labels"]
        ), "another instance's workflow was touched"
