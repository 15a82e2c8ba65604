# SPDX-License-Identifier: LGPL-3.0-only
"""A job as Flux's job-manager keeps it, and the snapshot tests get of it.

``Job`` is mutable and touched only on the job-manager's loop thread; ``JobInfo`` is the frozen
copy handed to other threads, so a test never races the job-manager.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from flux_dws.flux import results

#: Flux job states in the order a job passes through them (RFC 21).
STATES: tuple[str, ...] = ("NEW", "DEPEND", "PRIORITY", "SCHED", "RUN", "CLEANUP", "INACTIVE")
#: The urgency (and so the priority) Flux gives a job unless the user says otherwise.
DEFAULT_URGENCY = 16
#: Wait status of tasks killed by SIGKILL, as the exec system reports it in "finish".
KILLED_STATUS = 9


def state_rank(state: str) -> int:
    """Position of ``state`` in :data:`STATES`; ValueError names an unknown state."""
    try:
        return STATES.index(state)
    except ValueError:
        raise ValueError(f"unknown job state {state!r} (one of {', '.join(STATES)})") from None


def wait_status(exit_code: int) -> int:
    """The wait(2) status of tasks that exited with ``exit_code`` (what "finish" carries)."""
    return (exit_code & 0xFF) << 8


class FluidGenerator:
    """Flux-style job IDs (FLUIDs): ms timestamp << 24 | generator << 10 | sequence.

    IDs grow with submit order, as Flux's do, so sorting by ID is sorting by submit order.
    """

    def __init__(self, epoch: float) -> None:
        self._epoch = epoch
        self._last_ms = -1
        self._seq = 0

    def next(self, now: float) -> int:
        ms = max(int((now - self._epoch) * 1000) + 1, self._last_ms)
        if ms == self._last_ms:
            self._seq += 1
            if self._seq > 0x3FF:
                ms, self._seq = ms + 1, 0
        else:
            self._seq = 0
        self._last_ms = ms
        return (ms << 24) | self._seq


@dataclass
class Job:
    """One job's state inside the job-manager (loop thread only)."""

    id: int
    userid: int
    t_submit: float
    jobspec: dict[str, Any]  # updated by jobspec-update events
    submitted: dict[str, Any]  # attributes.system as submitted
    nnodes: int
    runtime: float | None
    exit_code: int
    state: str = "NEW"
    eventlog: list[dict[str, Any]] = field(default_factory=list)
    dependencies: list[str] = field(default_factory=list)
    prologs: list[str] = field(default_factory=list)
    epilogs: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    has_resources: bool = False
    alloc_queued: bool = False
    started: bool = False
    start_pending: bool = False  # tasks started and the exec system has not released them
    finish_status: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    exception: dict[str, Any] | None = None  # context of the first fatal exception
    result: str | None = None
    timers: list[Any] = field(default_factory=list)  # the runtime timer, cancelled on exit
    kvs: dict[str, str] = field(default_factory=dict)  # the job's KVS directory: key -> value

    @property
    def system(self) -> dict[str, Any]:
        """The jobspec's attributes.system table (after any jobspec-update)."""
        return self.jobspec.setdefault("attributes", {}).setdefault("system", {})

    def holds(self) -> set[str]:
        held = {f"prolog:{d}" for d in self.prologs} | {f"epilog:{d}" for d in self.epilogs}
        if self.state == "DEPEND":
            held |= {f"dependency:{d}" for d in self.dependencies}
        return held

    def last_context(self, name: str) -> dict[str, Any] | None:
        for entry in reversed(self.eventlog):
            if entry["name"] == name:
                return entry["context"]
        return None


def job_result(job: Job) -> str:
    """The result ``flux jobs`` shows for an inactive job (flux_dws.flux.results)."""
    return results.job_result(job.eventlog)


def apply_jobspec_update(jobspec: dict[str, Any], update: dict[str, Any]) -> None:
    """Set each dotted key of a jobspec-update event (``attributes.system.x``) in ``jobspec``."""
    for key, value in update.items():
        *path, last = key.split(".")
        node = jobspec
        for part in path:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[last] = copy.deepcopy(value)


def node_resources(nnodes: int) -> list[dict[str, Any]]:
    """The resources `flux run -N nnodes -n nnodes` asks for (RFC 14)."""
    task = {"type": "slot", "count": 1, "label": "task", "with": [{"type": "core", "count": 1}]}
    return [{"type": "node", "count": nnodes, "with": [task]}]


@dataclass(frozen=True)
class JobInfo:
    """A copy of one job as the job-manager saw it at one instant."""

    id: int
    userid: int
    state: str
    result: str | None
    eventlog: list[dict[str, Any]]
    hosts: list[str]
    env: dict[str, str]  # the environment the tasks started with
    exception: dict[str, Any] | None  # context of the first fatal exception
    holds: set[str]  # e.g. {"dependency:dws", "prolog:dws", "epilog:dws"}
    jobspec: dict[str, Any]  # with every jobspec-update applied

    def events(self, name: str) -> list[dict[str, Any]]:
        """Eventlog entries called ``name``, oldest first."""
        return [e for e in self.eventlog if e["name"] == name]

    def event_names(self) -> list[str]:
        return [e["name"] for e in self.eventlog]

    @property
    def attach_status(self) -> int:
        """The exit code `flux run` / `flux job attach` gives (flux_dws.flux.results)."""
        return results.attach_status(self.eventlog)

    @classmethod
    def of(cls, job: Job) -> JobInfo:
        return cls(
            id=job.id,
            userid=job.userid,
            state=job.state,
            result=job.result,
            eventlog=copy.deepcopy(job.eventlog),
            hosts=list(job.hosts),
            env=dict(job.env),
            exception=copy.deepcopy(job.exception),
            holds=job.holds(),
            jobspec=copy.deepcopy(job.jobspec),
        )
