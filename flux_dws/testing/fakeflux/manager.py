# SPDX-License-Identifier: LGPL-3.0-only
"""FakeFlux: Flux's job-manager, scheduler and exec system in one thread, dws plugin loaded.

The state machine follows flux-core's job-manager (RFC 21): every change to a job is an event
appended to its eventlog; the event moves the job's state, the plugin's callbacks run, then
the job-manager takes the action the new state calls for (post ``depend``, queue an alloc
request, start the tasks, free the resources, post ``clean``).  Any place where a scenario
behaves differently under a real Flux instance is a bug here.
"""

from __future__ import annotations

import copy
import errno
import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Callable, Optional

from flux_dws.base.loop import Loop
from flux_dws.testing.fakeflux.checks import shallow_check
from flux_dws.testing.fakeflux.connection import Connection
from flux_dws.testing.fakeflux.jobs import (
    DEFAULT_URGENCY,
    KILLED_STATUS,
    FluidGenerator,
    Job,
    JobInfo,
    apply_jobspec_update,
    job_result,
    node_resources,
    state_rank,
    wait_status,
)
from flux_dws.testing.fakeflux.nodes import DrainSet, FakeNodes, SsdVertices
from flux_dws.testing.fakeflux.plugin import DwsPlugin

log = logging.getLogger("flux-dws.testing.fakeflux.manager")

DEFAULT_HOSTS: tuple[str, ...] = ("compute-01", "compute-02", "compute-03", "compute-04")
#: Job states in which each job-manager event is legal (flux-core's event_job_update).
_LEGAL_IN: dict[str, frozenset[str]] = {
    "validate": frozenset({"NEW"}),
    "depend": frozenset({"DEPEND"}),
    "priority": frozenset({"PRIORITY", "SCHED"}),
    "alloc": frozenset({"SCHED"}),
    "start": frozenset({"RUN"}),
    "finish": frozenset({"RUN", "CLEANUP"}),
    "release": frozenset({"RUN", "CLEANUP"}),
    "free": frozenset({"CLEANUP"}),
    "clean": frozenset({"CLEANUP"}),
}
_FATAL_MOVES_TO_CLEANUP = frozenset({"DEPEND", "PRIORITY", "SCHED", "RUN"})

#: (attributes.system, the submitting userid, the jobspec's resources) -> why it is refused.
Validator = Callable[[Mapping[str, Any], int, Any], Optional[str]]


class SubmitError(Exception):
    """The job was refused at submit (as ``flux job submit`` fails); str() is one line."""


class FakeFlux:
    """An in-memory Flux instance: submit jobs, watch them run, connect a flux-dws service."""

    def __init__(
        self,
        hosts: Sequence[str] = DEFAULT_HOSTS,
        *,
        owner_uid: int | None = None,
        service_wait: float = math.inf,
        validator: Validator | None = None,
        clock: Callable[[], float] = time.time,
        release_delay: float = 0.0,
    ) -> None:
        if not hosts or len(set(hosts)) != len(hosts):
            raise ValueError(f"hosts must be distinct names, at least one: {list(hosts)}")
        if not service_wait >= 0:
            raise ValueError(f"service_wait must be >= 0 seconds, not {service_wait}")
        self.hosts: tuple[str, ...] = tuple(hosts)
        self.owner_uid: int = os.getuid() if owner_uid is None else owner_uid
        self.service_wait = float(service_wait)
        if not release_delay >= 0:
            raise ValueError(f"release_delay must be >= 0 seconds, not {release_delay}")
        #: Seconds from a job's "finish" to its "release": flux-core's exec system releases
        #: only after the job shells exit and the job's KVS namespace is copied back.
        self.release_delay = float(release_delay)
        self.validator = validator
        self.loop = Loop(clock, name="fakeflux")
        self._jobs: dict[int, Job] = {}
        self._free: set[str] = set(self.hosts)
        self._queued: set[int] = set()  # jobs waiting for the scheduler (alloc_queued)
        self.drains = DrainSet(self.hosts, clock)  # the resource module's drained nodes
        # what a Fluxion would hold across service restarts: hosts with the badrabbit property
        self.badrabbit: set[str] = set()
        self.fluxion = False  # each service's FakeNodes starts with this (a test may set it)
        self.ssd = SsdVertices()  # what a Fluxion would hold of the rabbits' ssd vertices
        self._ids = FluidGenerator(clock())
        self._plugin = DwsPlugin(self)
        self._sched_pending = False
        self._changes = threading.Condition()
        self._generation = 0
        self._running = False

    # ------------------------------------------------------------------ life cycle

    def start(self) -> FakeFlux:
        if not self._running:
            self._running = True
            self.loop.start_thread()
        return self

    def stop(self) -> None:
        """Unload the plugin (ending every watch stream) and stop the job-manager's thread."""
        if self._running:
            self._running = False
            self.loop.run_sync(self._plugin.shutdown)
            self.loop.stop()
            self.loop.join(10.0)

    def __enter__(self) -> FakeFlux:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ user side (any thread)

    def submit(
        self,
        attributes: Mapping[str, Any],
        *,
        userid: int | None = None,
        nnodes: int = 1,
        runtime: float | None = 0.0,
        exit_status: int = 0,
        resources: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        """Submit a job whose jobspec's attributes.system is ``attributes``; return its ID.

        ``runtime`` is how long its tasks run (None: until :meth:`finish`); ``exit_status``
        the exit code they end with.  ``resources`` is the jobspec's resources as a user wrote
        them (default: ``flux run -N nnodes``'s); the fake scheduler gives the job ``nnodes``
        nodes either way.  SubmitError when the validator, the plugin's checks or the
        scheduler refuse the job: then no job exists.
        """
        userid = self.owner_uid if userid is None else userid
        if runtime is not None and not runtime >= 0:
            raise ValueError(f"runtime must be >= 0 seconds or None, not {runtime}")
        if not 0 <= exit_status <= 255:
            raise ValueError(f"exit_status must be an exit code 0-255, not {exit_status}")
        if not isinstance(attributes, Mapping):
            raise SubmitError("jobspec attributes.system must be a table")
        try:
            system = json.loads(json.dumps(dict(attributes)))
        except (TypeError, ValueError) as exc:
            raise SubmitError(f"jobspec attributes.system is not valid JSON: {exc}") from None
        wanted = node_resources(nnodes) if resources is None else json.loads(json.dumps(resources))
        problem = (
            self.validator(copy.deepcopy(system), userid, copy.deepcopy(wanted))
            if self.validator
            else None
        )
        problem = problem or shallow_check(system)
        problem = problem or self.loop.run_sync(self._plugin.persistent_check, system, userid)
        if problem:
            raise SubmitError(problem)
        if not isinstance(nnodes, int) or not 1 <= nnodes <= len(self.hosts):
            raise SubmitError(
                f"unsatisfiable request: {nnodes} nodes requested, the instance has "
                f"{len(self.hosts)}"
            )
        return self.loop.run_sync(
            self._submit, system, userid, nnodes, runtime, exit_status, wanted
        )

    def cancel(self, jobid: int, note: str = "") -> None:
        """``flux cancel``: a fatal ``cancel`` exception."""
        self.raise_exception(jobid, "cancel", 0, note)

    def raise_exception(self, jobid: int, type: str, severity: int, note: str) -> None:
        """``flux job raise`` by the instance owner; OSError for an unknown or inactive job."""
        if not 0 <= severity <= 7:
            raise ValueError(f"severity must be 0-7, not {severity}")
        self.loop.run_sync(self._owner_raise, jobid, type, severity, note)

    def finish(self, jobid: int, status: int = 0) -> None:
        """Make the running tasks of ``jobid`` exit with exit code ``status``."""
        self.loop.run_sync(self._owner_finish, jobid, status)

    def info(self, jobid: int) -> JobInfo:
        """A copy of the job now; OSError(ENOENT) for an unknown ID."""
        return self.loop.run_sync(self._info, jobid)

    def kvs_lookup(self, jobid: int, key: str, *, userid: int | None = None) -> str:
        """``job-info.lookup`` of one key in the job's KVS directory, as ``userid`` (the
        instance owner by default): only the job's owner and the instance owner may read it
        (PermissionError otherwise); FileNotFoundError for a key that is not there."""
        userid = self.owner_uid if userid is None else userid

        def look() -> str:
            job = self._job(jobid)
            if userid not in (job.userid, self.owner_uid):
                raise PermissionError(errno.EPERM, "access is restricted to job/instance owner")
            if key not in job.kvs:
                raise FileNotFoundError(errno.ENOENT, f"{key}: key not found")
            return job.kvs[key]

        return self.loop.run_sync(look)

    def jobs(self) -> list[JobInfo]:
        """Every job ever submitted, in submit order."""
        return self.loop.run_sync(lambda: [JobInfo.of(j) for _, j in sorted(self._jobs.items())])

    def states(self) -> dict[int, str]:
        """Every job's state, cheaply (no copies of eventlogs): for benchmarks that poll."""
        return self.loop.run_sync(lambda: {i: j.state for i, j in self._jobs.items()})

    def wait(self, jobid: int, state: str = "INACTIVE", timeout: float = 30.0) -> JobInfo:
        """Wait until the job is in ``state`` or a later one; TimeoutError shows its last events."""
        rank = state_rank(state)
        return self._wait_for(jobid, lambda info: state_rank(info.state) >= rank, state, timeout)

    def wait_event(self, jobid: int, name: str, timeout: float = 30.0) -> dict[str, Any]:
        """``flux job wait-event``: the first ``name`` event; LookupError if the job ends first."""

        def posted(info: JobInfo) -> bool:
            if info.events(name):
                return True
            if info.state == "INACTIVE":
                ended = info.exception or {}
                raise LookupError(
                    f"job {jobid} became inactive without a {name} event "
                    f"({ended.get('type', 'no')} exception: {ended.get('note', '')!r})"
                )
            return False

        return self._wait_for(jobid, posted, f"a {name} event", timeout).events(name)[0]

    def dws_list(self) -> dict[str, Any]:
        """The plugin's ``list`` response, as the instance owner gets it."""
        return self.loop.run_sync(
            lambda: {"jobs": self._plugin._records(), "service": self._plugin.service_info()}
        )

    def connect(self, client_loop: Loop, *, userid: int | None = None) -> Connection:
        """A connection for a client (the flux-dws service) whose callbacks run on client_loop."""
        userid = self.owner_uid if userid is None else userid
        return Connection(self.loop, self._plugin, client_loop, userid)

    def nodes(self, client_loop: Loop) -> FakeNodes:
        """The resource module's drain/undrain/status for a client on ``client_loop``."""
        return FakeNodes(self, client_loop)

    def drain(self, targets: str, reason: str = "", mode: str | None = None) -> None:
        """``flux resource drain [--update|--force] targets reason`` (DrainError if refused)."""
        self.loop.run_sync(self.drains.drain, targets, reason, mode)

    def undrain(self, targets: str, mode: str | None = None) -> None:
        """``flux resource undrain``; a freed node may take a waiting job."""
        self.loop.run_sync(self.undrain_on_loop, targets, mode)

    def undrain_on_loop(self, targets: str, mode: str | None = None) -> None:
        """undrain() for callers on the job-manager's own thread (the resource module)."""
        self.drains.undrain(targets, mode)
        self._request_schedule()

    def drained(self) -> dict[str, str]:
        """``flux resource drain``: drained host -> reason."""
        return self.loop.run_sync(lambda: self.drains.status().drained_hosts())

    def drained_ranks(self) -> dict[int, str]:
        """Drained rank -> reason (as flux-core keeps them)."""
        return self.loop.run_sync(lambda: dict(self.drains.status().drained))

    def _wait_for(
        self, jobid: int, done: Callable[[JobInfo], bool], what: str, timeout: float
    ) -> JobInfo:
        deadline = time.monotonic() + timeout
        while True:
            with self._changes:
                generation = self._generation
            info = self.info(jobid)
            if done(info):
                return info
            with self._changes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    events = ", ".join(info.event_names()[-8:])
                    raise TimeoutError(
                        f"job {jobid} did not reach {what} within {timeout}s: it is {info.state}"
                        f" after {events}"
                    )
                self._changes.wait_for(partial(self._changed_since, generation), remaining)

    def _changed_since(self, generation: int) -> bool:
        return self._generation != generation

    # ------------------------------------------------------------------ jobtap API (loop only)

    def lookup(self, jobid: int) -> Job | None:
        return self._jobs.get(jobid)

    def active_jobs(self) -> list[Job]:
        return [j for _, j in sorted(self._jobs.items()) if j.state not in ("NEW", "INACTIVE")]

    def post_event(self, job: Job, name: str, context: dict[str, Any]) -> None:
        self._post(job, name, context)

    def kvs_put(self, job: Job, key: str, text: str) -> None:
        job.kvs[key] = text

    def dependency_add(self, job: Job, description: str) -> None:
        if description not in job.dependencies:
            self._post(job, "dependency-add", {"description": description})

    def dependency_remove(self, job: Job, description: str) -> None:
        self._post(job, "dependency-remove", {"description": description})

    def prolog_start(self, job: Job, description: str) -> None:
        self._post(job, "prolog-start", {"description": description})

    def prolog_finish(self, job: Job, description: str, status: int) -> None:
        self._post(job, "prolog-finish", {"description": description, "status": status})

    def epilog_start(self, job: Job, description: str) -> None:
        self._post(job, "epilog-start", {"description": description})

    def epilog_finish(self, job: Job, description: str, status: int) -> None:
        self._post(job, "epilog-finish", {"description": description, "status": status})

    def raise_exception_on(
        self, job: Job, type: str, severity: int, note: str, userid: int
    ) -> None:
        context = {"type": type, "severity": severity, "note": note, "userid": userid}
        self._post(job, "exception", context)

    # ------------------------------------------------------------------ the state machine

    def _submit(
        self,
        system: dict[str, Any],
        userid: int,
        nnodes: int,
        runtime: float | None,
        code: int,
        resources: list[dict[str, Any]],
    ) -> int:
        now = self.loop.time()
        job = Job(
            id=self._ids.next(now),
            userid=userid,
            t_submit=now,
            jobspec={
                "version": 1,
                "resources": resources,
                "attributes": {"system": system},
            },
            submitted=copy.deepcopy(system),
            nnodes=nnodes,
            runtime=runtime,
            exit_code=code,
        )
        self._jobs[job.id] = job
        submit = {"userid": userid, "urgency": DEFAULT_URGENCY, "flags": 0, "version": 1}
        self._post(job, "submit", submit)
        job.t_submit = job.eventlog[0]["timestamp"]
        self._post(job, "validate", {})
        return job.id

    def _post(self, job: Job, name: str, context: dict[str, Any]) -> None:
        """Append an event: update the job, run the plugin's callbacks, take the next action."""
        if job.state == "INACTIVE" or job.state not in _LEGAL_IN.get(name, {job.state}):
            raise RuntimeError(f"fakeflux: job {job.id}: {name} event is illegal in {job.state}")
        entry = {"timestamp": self.loop.time(), "name": name, "context": copy.deepcopy(context)}
        old_state = job.state
        job.eventlog.append(entry)
        self._update(job, name, entry["context"])
        log.debug("job %d: %s %s -> %s", job.id, name, json.dumps(context), job.state)
        self._plugin.job_event(job, entry)
        if job.state != old_state:
            self._plugin.job_state(job)
        self._action(job)
        with self._changes:
            self._generation += 1
            self._changes.notify_all()

    def _update(self, job: Job, name: str, context: dict[str, Any]) -> None:
        """What the event does to the job (flux-core's event_job_update)."""
        if name == "validate":
            job.state = "DEPEND"
        elif name == "dependency-add":
            job.dependencies.append(context["description"])
        elif name == "dependency-remove":
            job.dependencies.remove(context["description"])
        elif name == "depend":
            job.state = "PRIORITY"
        elif name == "priority" and job.state == "PRIORITY":
            job.state = "SCHED"
        elif name == "jobspec-update":
            apply_jobspec_update(job.jobspec, context)
        elif name == "exception" and context["severity"] == 0:
            if job.exception is None:
                job.exception = context
            if job.state in _FATAL_MOVES_TO_CLEANUP:
                job.state = "CLEANUP"
        elif name == "alloc":
            job.has_resources, job.state = True, "RUN"
        elif name in ("prolog-start", "epilog-start"):
            _actions(job, name).append(context["description"])
        elif name in ("prolog-finish", "epilog-finish"):
            _actions(job, name).remove(context["description"])
        elif name == "start":
            job.started = True
        elif name == "finish":
            job.finish_status = context["status"]
            job.state = "CLEANUP"
        elif name == "release" and context["final"]:
            job.start_pending = False
        elif name == "free":
            job.has_resources = False
            self._free.update(job.hosts)
            self._request_schedule()
        elif name == "clean":
            job.state = "INACTIVE"
            job.result = job_result(job)

    def _action(self, job: Job) -> None:
        """What the job-manager does next in the job's state (flux-core's event_job_action)."""
        if job.state == "DEPEND" and not job.dependencies:
            self._post(job, "depend", {})
        elif job.state == "PRIORITY":
            self._post(job, "priority", {"priority": DEFAULT_URGENCY})
        elif job.state == "SCHED" and not job.alloc_queued:
            job.alloc_queued = True
            self._queued.add(job.id)
            self._request_schedule()
        elif job.state == "RUN" and not (job.started or job.start_pending or job.prologs):
            self._start_tasks(job)
        elif job.state == "CLEANUP":
            job.alloc_queued = False
            if job.start_pending and job.finish_status is None:
                self._tasks_exit(job, KILLED_STATUS)  # the exception kills the tasks
            elif job.start_pending or job.prologs or job.epilogs:
                pass  # the exec system or a prolog/epilog action still holds the job
            elif job.has_resources:
                self._post(job, "free", {})
            else:
                self._post(job, "clean", {})

    def _request_schedule(self) -> None:
        if not self._sched_pending:
            self._sched_pending = True
            self.loop.call_soon(self._schedule)

    def _schedule(self) -> None:
        """The scheduler: allocate waiting jobs in submit order, each one that fits now."""
        self._sched_pending = False
        # The free hosts not drained: found when a job may take them, not for every job and
        # host (at El Capitan's size that held this process's GIL for seconds, bench_elcap).
        usable: list[str] | None = None
        for jobid in sorted(self._queued):  # not every job: thousands wait in DEPEND
            job = self._jobs.get(jobid)
            if job is None or job.state != "SCHED" or not job.alloc_queued:
                self._queued.discard(jobid)
                continue
            if usable is None:
                drained = self.drains.drained_hosts()
                usable = [h for h in self.hosts if h in self._free and h not in drained]
            if job.nnodes > len(usable):
                continue
            job.hosts = usable[: job.nnodes]
            self._free.difference_update(job.hosts)
            job.alloc_queued = False
            self._queued.discard(jobid)
            usable = None  # the alloc event may change what is free or drained
            self._post(job, "alloc", {})

    def _start_tasks(self, job: Job) -> None:
        """The exec system starts the tasks, with the environment the dws-env shell plugin sets."""
        environment = job.last_context("dws-environment")
        job.env = dict(environment["env"]) if environment else {}
        job.start_pending = True
        self._post(job, "start", {})
        if job.runtime is not None:
            job.timers.append(
                self.loop.call_later(job.runtime, self._tasks_exit, job, wait_status(job.exit_code))
            )

    def _tasks_exit(self, job: Job, status: int) -> None:
        """The tasks exited with wait status ``status``: the exec system finishes and releases."""
        if not job.start_pending or job.finish_status is not None:
            return  # already finished (a runtime timer racing an exception or finish())
        for timer in job.timers:
            timer.cancel()
        self._post(job, "finish", {"status": status})
        if self.release_delay > 0:
            self.loop.call_later(self.release_delay, self._release, job)
        else:
            self._release(job)

    def _release(self, job: Job) -> None:
        self._post(job, "release", {"ranks": "all", "final": True})

    # ------------------------------------------------------------------ owner requests

    def _job(self, jobid: int) -> Job:
        job = self._jobs.get(jobid)
        if job is None:
            raise OSError(errno.ENOENT, f"unknown job {jobid}")
        return job

    def _info(self, jobid: int) -> JobInfo:
        return JobInfo.of(self._job(jobid))

    def _owner_raise(self, jobid: int, type: str, severity: int, note: str) -> None:
        job = self._job(jobid)
        if job.state == "INACTIVE":
            raise OSError(errno.EINVAL, f"job {jobid} is inactive")
        self.raise_exception_on(job, type, severity, note, self.owner_uid)

    def _owner_finish(self, jobid: int, code: int) -> None:
        job = self._job(jobid)
        if not job.start_pending or job.finish_status is not None:
            raise OSError(errno.EINVAL, f"job {jobid} has no running tasks ({job.state})")
        self._tasks_exit(job, wait_status(code))


def _actions(job: Job, event: str) -> list[str]:
    return job.prologs if event.startswith("prolog") else job.epilogs
