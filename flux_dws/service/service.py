# SPDX-License-Identifier: LGPL-3.0-only
"""The flux-dws service: job records + workflow events + timers -> decide() -> actions.

One process per Flux instance.  Everything runs on one loop thread; Kubernetes calls run on a
worker pool and the workflow watch on its own thread, and both hand their results back to the
loop, so a slow API call never holds up another job.  Each job's actions run one after
another (a job never has two chains in flight); jobs proceed independently.

The service remembers nothing that matters: records come from the jobtap plugin (with every
dws-* event flux-dws posted on the job), workflows from Kubernetes.  What it keeps in memory
is a cache of those, plus what it read from Proposal, which it reads again after a restart.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from flux_dws.base.loop import Loop, Timer
from flux_dws.core import lifecycle as lc
from flux_dws.core.identity import JOBID_LABEL, owned_jobid
from flux_dws.core.lifecycle import JobPhase
from flux_dws.core.policy import Policy
from flux_dws.core.reconcile import startup_order
from flux_dws.core.states import State
from flux_dws.core.window import ProposalWindow
from flux_dws.core.workflow import view_workflow
from flux_dws.flux.jobmanager import JobManager
from flux_dws.flux.records import job_view, parse_request
from flux_dws.flux.resource import NodeControl
from flux_dws.k8s import KubeClient, KubeWorker, WorkflowWatch
from flux_dws.service.actions import RETRY_MAX, RETRY_MIN, ActionRunner, Halt, Tracked, _name
from flux_dws.service.healthwatch import HealthMonitor
from flux_dws.service.notify import Notifier
from flux_dws.service.presence import Presence
from flux_dws.service.recording import RecordRunner
from flux_dws.service.upkeep import Upkeep

log = logging.getLogger("flux-dws")


def worker_for(policy: Policy) -> KubeWorker:
    """The pool for Kubernetes calls: ``[dws] api-threads``, of which a third (at least one)
    may take non-urgent calls and the rest only a job's next step.

    Few threads on purpose: a thread holding its answer competes with the event loop for
    Python's GIL, so with a quick API server more threads make every decision wait
    (bench/bench_service.py, 1000 jobs at once: 16 threads gave reaction p50 0.8 s, 4 gave
    9 ms, 3 gave 6 ms, at about the same throughput).  A slow API server wants more.
    """
    normal = max(1, policy.api_threads // 3)
    return KubeWorker(policy.api_threads, reserved=policy.api_threads - normal)


@dataclass
class Metrics:
    """Figures for benchmarks and `flux dws` status: reactions and requests."""

    # (next state, seconds from the observation that allowed it to the patch being sent)
    reactions: list[tuple[State, float]] = field(default_factory=list)
    actions: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)


class Service(Presence, RecordRunner, ActionRunner):
    """Drive every #DW job's workflow; see the module docstring."""

    def __init__(
        self,
        *,
        policy: Policy,
        loop: Loop,
        jobmanager: JobManager,
        kube: KubeClient,
        owner_uid: int,
        worker: KubeWorker | None = None,
        nodes: NodeControl | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.policy = policy
        self.loop = loop
        self.jm = jobmanager
        self.kube = kube
        self.owner_uid = owner_uid
        self.worker = worker or worker_for(policy)
        self.jobs: dict[int, Tracked] = {}
        self.metrics = Metrics()
        self.synced = False  # the plugin's snapshot has arrived
        self.listed = False  # the first list of our workflows has been delivered
        self._api_alarm: Timer | None = None
        self._watch: WorkflowWatch | None = None
        self._cancel_records: Callable[[], None] | None = None
        self._records_retry = RETRY_MIN
        self._rabbits: dict[str, str] | None = None
        self._gids: dict[int, int] = {}
        self._stopped = False
        # Watch events waiting for the loop, newest per workflow: under a backlog only the
        # latest version of each workflow is worth parsing and deciding on.
        self._inbox: dict[tuple[str, str], tuple[str, dict[str, Any], float]] = {}
        self._inbox_lock = threading.Lock()
        self._inbox_queued = False
        self.window = ProposalWindow(policy.max_proposals)
        self.superseded = False  # another service took the job stream: this one stopped
        # rabbit and node health (service.healthwatch); None where Flux's nodes are not ours
        self.health: HealthMonitor | None = None
        if nodes is not None:
            self.health = HealthMonitor(
                policy=policy, loop=loop, worker=self.worker, kube=kube, nodes=nodes
            )
        self.reconciled_at: float | None = None  # the first full decision pass
        self.last_reconcile = 0.0  # seconds the last full pass took on the loop
        self._init_presence()
        self.upkeep = Upkeep(self, notifier)

    # ------------------------------------------------------------------ start / stop

    def start(self) -> None:
        """Subscribe to job records and workflow events (call on the loop's thread)."""
        self._watch = WorkflowWatch(
            self.kube,
            self._on_workflow_event_thread,
            on_health=lambda up, _since: self.upkeep.health.note(up, "workflow watch failed"),
            on_listed=lambda: self.loop.call_soon(self._on_listed),
        )
        self._watch.start()
        self._watch_records()
        self._heartbeat()
        if self.health is not None:
            self.health.start()
        self.upkeep.start()

    def stop(self) -> None:
        """Stop watching; in-flight Kubernetes calls finish on their own."""
        if not self._stopped:
            self.upkeep.stop("stopping")
        self._stopped = True
        if self._cancel_records:
            self._cancel_records()
        if self._watch:
            self._watch.stop()
        if self.health is not None:
            self.health.stop()
        self.worker.stop()
        for tracked in self.jobs.values():
            if tracked.timer:
                tracked.timer.cancel()

    # ------------------------------------------------------------------ observations

    def _on_records(self, records: list[dict[str, Any]], snapshot: bool) -> None:
        self._records_retry = RETRY_MIN
        self._unloaded_since = None
        if snapshot and self.role != "active":
            log.info(
                "active: this service (pid %d) is the active flux-dws service for this instance%s",
                os.getpid(),
                f", taking over from {self.peer}" if self.role == "standby" else "",
            )
            self.role = "active"
        if snapshot:
            held = {int(r["id"]) for r in records}
            for jobid, tracked in list(self.jobs.items()):
                if jobid not in held and tracked.record is not None:
                    tracked.record = None  # not held any more: an orphan if a workflow is left
            if not self.synced:
                log.info("job snapshot: %d #DW job(s) held by the plugin", len(records))
            self.synced = True
        seen = time.monotonic()
        for record in records:
            tracked = self._tracked(int(record["id"]))
            if record.get("phase") == "gone":
                tracked.record = None
            else:  # a record sent before the plugin saw our posts must not undo them
                dws = {**(record.get("dws") or {}), **tracked.posting}
                tracked.record = {**record, "dws": dws} if tracked.posting else record
            tracked.observed = seen
        if snapshot:
            self._kick_all()
        else:
            for record in records:
                self._kick(int(record["id"]))

    def _on_listed(self) -> None:
        """Every workflow of ours is known: decisions may start (a job whose workflow is not
        listed now really has none, rather than one not seen yet)."""
        if self.listed:
            return
        self.listed = True
        log.info("workflow list: %d workflow(s) of this instance", self._count_workflows())
        self._kick_all()

    def _count_workflows(self) -> int:
        return sum(1 for t in self.jobs.values() if t.workflow is not None)

    def _kick_all(self) -> None:
        """Decide for every job: in-flight ones first, then new ones in submit order."""
        began = time.perf_counter()
        order = startup_order(
            (t.jobid, t.workflow is not None, float((t.record or {}).get("t_submit", 0.0)))
            for t in self.jobs.values()
        )
        for jobid in order:
            self._kick(jobid)
        if self.synced and self.listed:
            self.last_reconcile = time.perf_counter() - began
            if self.reconciled_at is None:
                self.reconciled_at = time.time()

    def _on_workflow_event_thread(self, kind: str, obj: dict[str, Any]) -> None:
        """Called on the watch thread: stamp the time and leave the event in the inbox.

        Events for one workflow (name and uid) that the loop has not reached yet collapse
        into the newest, keeping the first one's time; one drain per batch is queued.  The
        order of first arrival is kept, so a DELETED and a re-creation stay in order.
        """
        meta = obj.get("metadata") or {}
        key = (str(meta.get("name", "")), str(meta.get("uid", "")))
        seen = time.monotonic()
        with self._inbox_lock:
            waiting = self._inbox.get(key)
            self._inbox[key] = (kind, obj, waiting[2] if waiting else seen)
            if self._inbox_queued:
                return
            self._inbox_queued = True
        self.loop.call_soon(self._drain_inbox)

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            inbox, self._inbox, self._inbox_queued = self._inbox, {}, False
        for kind, obj, seen in inbox.values():
            self._on_workflow_event(kind, obj, seen)

    def _on_workflow_event(self, kind: str, obj: dict[str, Any], seen: float) -> None:
        jobid = owned_jobid(obj, self.kube.identity)
        if jobid is None:
            log.warning(
                "workflow %s carries this instance's label but its name, %s label or "
                "spec.jobID disagree; leaving it alone",
                _name(obj),
                JOBID_LABEL,
            )
            return
        tracked = self._tracked(jobid)
        tracked.unreadable = ""
        if kind == "DELETED":
            tracked.workflow, tracked.raw = None, None
        else:
            try:
                tracked.workflow, tracked.raw = view_workflow(obj), obj
            except ValueError as exc:  # never "gone": the job is held until it can be read
                tracked.unreadable, tracked.raw = str(exc), obj
        tracked.observed = seen
        self._kick(jobid)

    def inbox_depth(self) -> int:
        with self._inbox_lock:
            return len(self._inbox)

    def _tracked(self, jobid: int) -> Tracked:
        if jobid not in self.jobs:
            self.jobs[jobid] = Tracked(jobid)
        return self.jobs[jobid]

    # ------------------------------------------------------------------ deciding

    def _kick(self, jobid: int) -> None:
        """Decide again for ``jobid`` now, or as soon as its current chain ends."""
        tracked = self.jobs.get(jobid)
        if tracked is None or self._stopped:
            return
        if tracked.busy:
            tracked.dirty = True
            return
        self._decide(tracked)

    def view(self, tracked: Tracked) -> lc.JobView | None:
        """The JobView for a tracked job (GONE for an orphan); None until both the job snapshot
        and the first workflow list are in, since either alone could make a job look orphaned
        or its workflow look vanished."""
        if not (self.synced and self.listed):
            return None
        if tracked.record is None:
            return lc.JobView(tracked.jobid, JobPhase.GONE, userid=-1, groupid=-1)
        if tracked.request is None:
            tracked.request = parse_request(tracked.record, self.policy, owner_uid=self.owner_uid)
        return job_view(
            tracked.record,
            tracked.request,
            groupid=self._groupid(int(tracked.record["userid"])),
            proposal=tracked.proposal,
            failures=tracked.failures,
        )

    def _decide(self, tracked: Tracked) -> None:
        job = self.view(tracked)
        if job is None or self._unreadable(tracked):
            return
        if job.phase is JobPhase.GONE and tracked.workflow is None:
            self._forget(tracked)
            return
        now = self.loop.time()
        actions = lc.decide(job, tracked.workflow, self.policy, now)
        if tracked.timer:
            tracked.timer.cancel()
            tracked.timer = None
        wakes = [a for a in actions if isinstance(a, lc.WakeAt)]
        if wakes:
            tracked.timer = self.loop.call_at(wakes[0].time, self._kick, tracked.jobid)
        chain = [a for a in actions if not isinstance(a, lc.WakeAt)]
        if not self._in_window(tracked, job, chain):
            return
        if chain:
            tracked.busy, tracked.dirty = True, False
            self._run_chain(tracked, chain, 0)

    def _forget(self, tracked: Tracked) -> None:
        if tracked.timer:
            tracked.timer.cancel()
        self.jobs.pop(tracked.jobid, None)
        self._wake(self.window.leave(tracked.jobid))

    def _in_window(self, tracked: Tracked, job: lc.JobView, chain: list[Any]) -> bool:
        """Keep the Proposal window (flux_dws.core.window) up to date; False if the job must
        wait in DEPEND for a slot before creating its workflow."""
        jobid, window = tracked.jobid, self.window
        depend = job.phase is JobPhase.DEPEND
        if depend and tracked.workflow is not None:
            window.entered(jobid)
        elif depend and any(isinstance(a, lc.CreateWorkflow) for a in chain):
            if not window.ask(jobid):
                if len(window.waiting) == 1:
                    log.info(
                        "job %d: %d workflow(s) in Proposal ([dws] max-proposals); new #DW "
                        "jobs wait in DEPEND, in submit order, for a slot",
                        jobid,
                        len(window.holders),
                    )
                return False
        elif jobid in window.waiting or (jobid in window.holders and not depend):
            # Released, gone, or no longer creating (cancelled while it waited).  A holder
            # still in DEPEND without a workflow keeps its slot: its create is retried.
            self._wake(window.leave(jobid))
        return True

    def _wake(self, jobids: list[int]) -> None:
        for jobid in jobids:
            self.loop.call_soon(self._kick, jobid)

    def _run_chain(self, tracked: Tracked, chain: list[Any], index: int) -> None:
        if index == len(chain):
            tracked.busy, tracked.retry, tracked.failing_since = False, 0.0, None
            if tracked.dirty:
                self._kick(tracked.jobid)
            return
        action = chain[index]
        name = type(action).__name__
        self.metrics.actions[name] += 1

        def done(error: str | Halt | None) -> None:
            if error is None:
                self._run_chain(tracked, chain, index + 1)
            elif isinstance(error, Halt):
                tracked.dirty = True
                self._run_chain(tracked, chain, len(chain))
            else:
                self._chain_failed(tracked, name, error)

        handler = getattr(self, f"_do_{name}")
        try:
            handler(tracked, action, done)
        except Exception as exc:  # a bug must not wedge the job: log and retry later
            log.exception("job %d: %s raised", tracked.jobid, name)
            self._chain_failed(tracked, name, str(exc))

    def _chain_failed(self, tracked: Tracked, name: str, error: str) -> None:
        self.metrics.failures[name] += 1
        self.note_error(f"job {tracked.jobid}: {name} failed: {error}")
        tracked.retry = min(max(tracked.retry * 2, RETRY_MIN), RETRY_MAX)
        log.warning(
            "job %d workflow %s: %s failed: %s; retrying in %.1fs",
            tracked.jobid,
            self._wf_name(tracked),
            name,
            error,
            tracked.retry,
        )
        tracked.busy = False
        if tracked.timer:
            tracked.timer.cancel()
        tracked.timer = self.loop.call_later(tracked.retry, self._kick, tracked.jobid)


__all__ = ["Service", "Metrics", "Tracked"]
