# SPDX-License-Identifier: LGPL-3.0-only
"""The dws jobtap plugin's job records, in Python (jobtap/records.c): where the plugin holds a
job (its phase, doc/protocol.rst "Phases") and the record it describes the job with to the
service (doc/protocol.rst "Job records"), from fakeflux's job alone.
"""

from __future__ import annotations

import json
from typing import Any

from flux_dws.testing.fakeflux.checks import DW_KEY, RELEASE_KEY, TIMEOUT_KEY, TOLERANCE_KEY
from flux_dws.testing.fakeflux.jobs import Job

#: The plugin's name: its dependency, prolog and epilog actions are all called this.
NAME = "dws"
EVENT_PREFIX = "dws-"


def ours_posted(job: Job, name: str) -> bool:
    """The plugin's own ``name`` event (prolog-start, epilog-start) is on the job's eventlog."""
    return any(e["name"] == name and e["context"].get("description") == NAME for e in job.eventlog)


def shells_gone(job: Job) -> bool:
    """The job never started, or its shells are gone (a final ``release``).  fakeflux has
    no instance restart; the C plugin also counts a job started before its broker."""
    return not job.started or any(
        e["name"] == "release" and e["context"].get("final") for e in job.eventlog
    )


def job_phase(job: Job) -> str:
    """Where the plugin holds the job (doc/protocol.rst, Phases)."""
    if job.state == "INACTIVE":
        return "gone"
    if job.prologs:
        return "prolog"
    if job.state == "CLEANUP" and ours_posted(job, "epilog-start") and shells_gone(job):
        return "epilog"  # held from "finish", but torn down only once the shells are gone
    if job.started:
        return "run"
    if job.state == "RUN":  # once the dws prolog finished, the tasks are starting
        return "run" if ours_posted(job, "prolog-start") else "prolog"
    if job.state == "DEPEND" and NAME in job.dependencies:
        return "depend"
    return "sched"


def job_record(job: Job) -> dict[str, Any]:
    """The job as the plugin describes it to watchers (doc/protocol.rst, Job records)."""
    exc = job.exception
    dws: dict[str, Any] = {}
    for entry in job.eventlog:
        if entry["name"].startswith(EVENT_PREFIX):
            dws[entry["name"]] = entry["context"]
    record = {
        "id": job.id,
        "userid": job.userid,
        "t_submit": job.t_submit,
        "phase": job_phase(job),
        "attributes": {
            k: job.submitted[k]
            for k in (DW_KEY, TIMEOUT_KEY, TOLERANCE_KEY, RELEASE_KEY, "constraints")
            if k in job.submitted
        },
        "hosts": job.hosts,
        "rabbits": {},  # fakeflux does not schedule rabbits (no Fluxion graph)
        "ssd": [],
        "resources": job.jobspec.get("resources", []),
        "started": job.started,
        "exception": None if exc is None else {k: exc[k] for k in ("type", "severity", "note")},
        "dws": dws,
    }
    # a copy the job cannot change afterwards (what crosses is JSON anyway): json is much
    # quicker than copy.deepcopy, which made a 10,000-job snapshot take seconds
    return json.loads(json.dumps(record))
