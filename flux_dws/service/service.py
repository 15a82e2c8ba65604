# SPDX-License-Identifier: LGPL-3.0-only
"""The flux-dws service: job records + workflow events + timers -> decide() -> actions.

One process per Flux instance.  Everything runs on one loop thread; Kubernetes calls run on a
worker pool and the workflow watch on its own thread, and both hand their results back to the
loop, so a slow API call never holds up another job.  Each job's actions run one after
another (a job never has two chains in flight); jobs proceed independently.

The service is composed of parts, each given its dependencies in its constructor: the action
executor (flux_dws.service.executor, with the handlers that flux_dws.service.dispatch names),
presence (the job stream, heartbeats, standby), upkeep (the housekeeping tick) and the health
monitor.  This module keeps the loop's own work: observations in, decisions, action chains,
the Proposal window, and the one writer of each job's facts: what an action reports
(flux_dws.service.outcome) is written here, and a failure is judged by the core
(flux_dws.core.failing), never by the handler that met it.

The service remembers nothing that matters: records come from the jobtap plugin (with every
dws-* event flux-dws posted on the job), workflows from Kubernetes.  What it keeps in memory
is a cache of those, plus what it read from Proposal, which it reads again after a restart.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.frozen import share_strings_with
from flux_dws.base.jobid import f58
from flux_dws.base.loop import Loop
from flux_dws.base.untrusted import name_of
from flux_dws.core import actions as act
from flux_dws.core import failing
from flux_dws.core import lifecycle as lc
from flux_dws.core.identity import JOBID_LABEL, owned_jobid
from flux_dws.core.jobview import JobPhase, JobView
from flux_dws.core.policy import Policy
from flux_dws.core.reconcile import may_decide, startup_order, waits_for_list
from flux_dws.core.release import held_parts
from flux_dws.core.states import State
from flux_dws.core.window import ProposalWindow
from flux_dws.core.workflow import read_from, view_of
from flux_dws.flux.jobmanager import JobManager
from flux_dws.flux.jobrecords import job_view, parse_request
from flux_dws.flux.resource import NodeControl
from flux_dws.k8s import KubeClient, KubeWorker, WorkflowWatch
from flux_dws.k8s.recordcache import RecordCache
from flux_dws.service import dispatch
from flux_dws.service.collector import StartupCollector
from flux_dws.service.executor import ActionExecutor
from flux_dws.service.facts import learn, version_number
from flux_dws.service.healthwatch import HealthMonitor
from flux_dws.service.inbox import Inbox
from flux_dws.service.jobs import Metrics, Seen, Tracked
from flux_dws.service.notify import Notifier
from flux_dws.service.outcome import (
    Done,
    Fact,
    Learned,
    Outcome,
    Refused,
    Retry,
)
from flux_dws.service.persistentpush import PersistentPush
from flux_dws.service.placements import Placements
from flux_dws.service.presence import Presence
from flux_dws.service.release import StorageHeld
from flux_dws.service.upkeep import Upkeep

log = logging.getLogger("flux-dws")


def worker_for(policy: Policy, loop: Loop) -> KubeWorker:
    """The pool for Kubernetes calls: ``[dws] api-threads``, of which a third (at least one)
    may take non-urgent calls and the rest only a job's next step; results come back on
    ``loop``.

    Few threads on purpose: a thread holding its answer competes with the event loop for
    Python's GIL, so with a quick API server more threads make every decision wait
    (bench/bench_service.py, 1000 jobs at once: 16 threads gave reaction p50 0.8 s, 4 gave
    9 ms, 3 gave 6 ms, at about the same throughput).  A slow API server wants more.
    """
    normal = max(1, policy.api_threads // 3)
    return KubeWorker(
        policy.api_threads, reserved=policy.api_threads - normal, deliver=loop.call_soon
    )


class Service:
    """Drive every #DW job's workflow; see the module docstring."""

    def __init__(
        self,
        *,
        policy: Policy,
        loop: Loop,
        jobmanager: JobManager,
        kube: KubeClient,
        owner_uid: int,
        nodes: NodeControl | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.policy = policy
        self.loop = loop
        self.jm = jobmanager
        self.kube = kube
        self.owner_uid = owner_uid
        self.worker = worker_for(policy, loop)
        self.jobs: dict[int, Tracked] = {}
        self.metrics = Metrics()
        self.synced = False  # the plugin's snapshot has arrived
        self.listed = False  # the first list of our workflows has been delivered
        self._watch: WorkflowWatch | None = None
        self._stopped = False
        # Watch events waiting for the loop, newest per workflow (service.inbox)
        self.inbox = Inbox(loop, lambda kind, obj, seen: self._on_workflow_event(kind, obj, seen))
        self.window = ProposalWindow(policy.max_proposals)
        self.reconciled_at: float | None = None  # the first full decision pass
        # Python's collector waits until then (service.collector)
        self.collector = StartupCollector(loop)
        self.last_reconcile = 0.0  # seconds the last full pass took on the loop
        # rabbit and node health (service.healthwatch); None where Flux's nodes are not ours
        self.health: HealthMonitor | None = None
        # where exclusive allocations are (service.placements): health's Servers watch tells
        # it; without one, every Servers is listed when a job needs it
        self.placements = Placements()
        if nodes is not None:
            self.health = HealthMonitor(
                policy=policy,
                loop=loop,
                worker=self.worker,
                kube=kube,
                nodes=nodes,
                placements=self.placements,
            )
        # the plugin keeps #DW jobs from the scheduler until told (service.release)
        self.held = StorageHeld(loop=loop, jm=jobmanager, every=policy.heartbeat)
        # persistent storage for the plugin's submit check (service.persistentpush)
        self.persistent = PersistentPush(policy=policy, loop=loop, kube=kube, jm=jobmanager)
        # the pods and NnfDataMovements the job's records read, watched (k8s.recordcache)
        self.records = RecordCache(kube)
        self.presence = Presence(
            policy=policy,
            loop=loop,
            jm=jobmanager,
            on_records=self._on_records,
            on_gone=self._instance_gone,
            held=self.held_jobs,
            ready=lambda: self.reconciled_at is not None,
            status=lambda: self.upkeep.status_line(),
            rabbits=self.health.report if self.health is not None else None,
        )
        self.upkeep = Upkeep(
            policy=policy,
            loop=loop,
            kube=kube,
            worker=self.worker,
            presence=self.presence,
            watched=self,
            notifier=notifier,
        )
        self.executor = ActionExecutor(
            policy=policy,
            loop=loop,
            worker=self.worker,
            kube=kube,
            jm=jobmanager,
            metrics=self.metrics,
            report=self._report,
            health=self.health,
            persistent=self.persistent,
            records=self.records,
            placements=self.placements,
        )

    # ------------------------------------------------------------------ start / stop

    def start(self) -> None:
        """Subscribe to job records and workflow events (call on the loop's thread)."""
        self.collector.pause()
        self._watch = WorkflowWatch(
            self.kube,
            self._on_workflow_event_thread,
            on_health=lambda up, _since: self.upkeep.health.note(up, "workflow watch failed"),
            on_listed=lambda: self.loop.call_soon(self._on_listed),
        )
        self._watch.start()
        self.presence.start()
        self.persistent.start()
        self.records.start()
        if self.health is not None:
            self.health.start()
        self.upkeep.start()

    def stop(self) -> None:
        """Stop watching; in-flight Kubernetes calls finish on their own."""
        if not self._stopped:
            self.upkeep.stop("stopping")
        self._stopped = True
        self.presence.stop()
        self.persistent.stop()
        self.records.stop()
        self.held.stop()
        if self._watch:
            self._watch.stop()
        if self.health is not None:
            self.health.stop()
        self.worker.stop()
        self.collector.stop()
        for tracked in self.jobs.values():
            if tracked.timer:
                tracked.timer.cancel()

    def _instance_gone(self) -> None:
        self.stop()
        self.loop.stop()

    # ------------------------------------------------------------------ what upkeep reads

    def held_jobs(self) -> list[int]:
        """The jobs the plugin holds now."""
        return [t.jobid for t in self.jobs.values() if t.record is not None]

    def watch_counts(self) -> tuple[int, int]:
        """The workflow watch's restarts and re-lists."""
        watch = self._watch
        return (watch.restarts, watch.relists) if watch else (0, 0)

    def proposals_waiting(self) -> int:
        return len(self.window.waiting)

    def capacity_missing(self) -> dict[str, int]:
        if self.health is None:
            return {}
        return {rabbit: d.missing for rabbit, d in self.health.drifts.items()}

    # ------------------------------------------------------------------ observations

    def _on_records(self, records: list[dict[str, Any]], snapshot: bool) -> None:
        if snapshot:
            held = {int(r["id"]) for r in records}
            for jobid, tracked in list(self.jobs.items()):
                if jobid not in held and tracked.record is not None:
                    tracked.record = None  # not held any more: an orphan if a workflow is left
            if not self.synced:
                log.info("job snapshot: %d #DW job(s) held by the plugin", len(records))
            self.synced = True
            self.held.snapshot()
        seen = time.monotonic()
        for record in records:
            tracked = self._tracked(int(record["id"]))
            if record.get("phase") == "gone":
                tracked.record = None
            else:
                share_strings_with(record, tracked.record)  # held: one copy of each text
                # a record sent before the plugin saw our posts must not undo them
                posting = {name: context for name, (context, _) in tracked.posting.items()}
                dws = {**(record.get("dws") or {}), **posting}
                tracked.record = {**record, "dws": dws} if tracked.posting else record
            tracked.observed = seen
        if snapshot:
            self._kick_all()
        else:
            for record in records:
                self._kick(int(record["id"]))

    def _on_listed(self) -> None:
        """Every workflow of ours is known: the jobs that waited for the whole list are
        decided now (a job whose workflow is not listed now really has none, rather than
        one on a later page), and orphans swept (core.reconcile.waits_for_list)."""
        if self.listed:
            return
        self.listed = True
        log.info("workflow list: %d workflow(s) of this instance", self._count_workflows())
        if self.health is not None:  # before any pass may mark a pool up (healthwatch)
            listed = (t.raw for t in self.jobs.values() if t.raw is not None)
            self.health.hold_first(held_parts(listed), lambda _e: self.held.holds_ready())
        else:
            self.held.holds_ready()  # nothing of Fluxion is ours to mark
        self._kick_all(waiting=True)

    def _count_workflows(self) -> int:
        return sum(1 for t in self.jobs.values() if t.workflow is not None)

    def _kick_all(self, *, waiting: bool = False) -> None:
        """Decide for every job (``waiting``: every job that waited for the whole workflow
        list, the others were decided as their workflow came): in-flight ones first, then new
        ones in submit order."""
        began = time.perf_counter()
        jobs = self.jobs.values()
        if waiting:
            jobs = [t for t in jobs if waits_for_list(t.record is not None, _seen(t))]
        order = startup_order(
            (t.jobid, t.workflow is not None, float((t.record or {}).get("t_submit", 0.0)))
            for t in jobs
        )
        for jobid in order:
            self._kick(jobid)
        if self.synced and self.listed:
            self.last_reconcile = time.perf_counter() - began
            if self.reconciled_at is None:
                self.reconciled_at = time.time()
                self.loop.call_soon(self.collector.settle)

    def _on_workflow_event_thread(self, kind: str, obj: dict[str, Any]) -> None:
        """Called on the watch thread: the event waits in the inbox for the loop."""
        self.inbox.put(kind, obj)

    def _on_workflow_event(self, kind: str, obj: dict[str, Any], seen: float) -> None:
        jobid = owned_jobid(obj, self.kube.identity)
        if jobid is None:
            log.warning(
                "workflow %s carries this instance's label but its name, %s label or "
                "spec.jobID disagree; leaving it alone",
                name_of(obj),
                JOBID_LABEL,
            )
            return
        tracked = self._tracked(jobid)
        known, meta = tracked.workflow, untrusted.mapping(obj.get("metadata"))
        if (
            kind != "DELETED"
            and known is not None
            and known.uid == meta.get("uid")
            and version_number(meta.get("resourceVersion")) < version_number(known.resource_version)
        ):  # older than a version adopted from a response (the watch lags): it would undo it
            return
        if kind == "DELETED":
            tracked.workflow, tracked.raw, tracked.unreadable = None, None, ""
        elif not tracked.unreadable and read_from(known, obj):
            pass  # the version a response gave already (executor.adopt): the view stands
        else:
            tracked.unreadable = ""
            try:
                tracked.workflow, tracked.raw = view_of(obj)
            except ValueError as exc:  # never "gone": the job is held until it can be read
                tracked.unreadable, tracked.raw = str(exc), obj
        tracked.observed = seen
        self._kick(jobid)

    def inbox_depth(self) -> int:
        return self.inbox.depth()

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

    def view(self, tracked: Tracked) -> JobView | None:
        """The JobView for a tracked job (GONE for an orphan); None until it may be decided:
        after the job snapshot, and, while the first workflow list is still paging, only for
        a held job whose workflow came on a page already (core.reconcile.may_decide): either
        observation alone could make a job look orphaned or its workflow look vanished.

        The owner's primary group is the one found earlier, or -1: the lookup itself (which
        may block on NSS) runs on a worker when the workflow is to be created.
        """
        held = tracked.record is not None
        if not may_decide(synced=self.synced, listed=self.listed, held=held, seen=_seen(tracked)):
            return None
        if tracked.record is None:
            return JobView(tracked.jobid, JobPhase.GONE, userid=-1, groupid=-1)
        if tracked.request is None:
            tracked.request = parse_request(tracked.record, self.policy, owner_uid=self.owner_uid)
        return job_view(
            tracked.record,
            tracked.request,
            groupid=self.executor.gids.get(int(tracked.record["userid"]), -1),
            proposal=tracked.proposal,
            failures=tracked.failures,
            refusal=tracked.refusal,
        )

    def _decide(self, tracked: Tracked) -> None:
        job = self.view(tracked)
        if job is None:
            return
        now = self.loop.time()
        if tracked.unreadable:
            self._hold_unreadable(tracked, job, now)
            return
        tracked.unreadable_since, tracked.alarmed = None, ""
        if job.phase is JobPhase.GONE and tracked.workflow is None:
            self._forget(tracked)
            return
        self._act(tracked, job, lc.decide(job, tracked.workflow, self.policy, now))

    def _act(
        self, tracked: Tracked, job: JobView, actions: list[Any], *, window: bool = True
    ) -> None:
        """Set the job's timer from the decision's WakeAt and run the rest as one chain;
        ``window``: keep the Proposal window up to date first (a held job keeps no slot)."""
        if tracked.timer:
            tracked.timer.cancel()
            tracked.timer = None
        wakes = [a for a in actions if isinstance(a, act.WakeAt)]
        if wakes:
            tracked.timer = self.loop.call_at(wakes[0].time, self._kick, tracked.jobid)
        chain = [a for a in actions if not isinstance(a, act.WakeAt)]
        if window and not self._in_window(tracked, job, chain):
            return
        if chain:
            seen = Seen(
                job,
                tracked.workflow,
                tracked.raw,
                tracked.observed,
                deleted=tracked.deleted,
                unreadable=tracked.unreadable,
            )
            tracked.busy, tracked.dirty = True, False
            self._run_chain(tracked, chain, seen, 0)

    def _hold_unreadable(self, tracked: Tracked, job: JobView, now: float) -> None:
        """The workflow's latest version cannot be read: hold the job, but not past the
        deadline of its state (``lc.decide_unreadable``).

        Such a workflow is neither gone nor understood: deciding from it could fail the job
        or leak its storage, so nothing else is done until a readable version arrives.  The
        admin (log) and the job (a dws-workflow-unreadable event) are told once per problem.
        """
        if tracked.unreadable_since is None:
            tracked.unreadable_since = now
        # A held job keeps no Proposal slot ([dws] max-proposals): the others go on.  It takes
        # one again (even past the limit) once its workflow can be read.
        self._wake(self.window.leave(tracked.jobid))
        name = name_of(tracked.raw or {})
        if tracked.alarmed != tracked.unreadable:
            tracked.alarmed = tracked.unreadable
            log.error(
                "job %s workflow %s: cannot read the workflow: %s; the job stays held and the "
                "workflow is kept until a readable version arrives or its state's deadline "
                "passes (fix the object, or upgrade flux-dws if DWS added a value)",
                f58(tracked.jobid),
                name,
                tracked.unreadable,
            )
            if tracked.record is not None:
                context = {"workflow": name, "problem": tracked.unreadable}
                self.jm.post(tracked.jobid, "dws-workflow-unreadable", context, _ignore)
        since = tracked.unreadable_since
        actions = lc.decide_unreadable(job, name, tracked.unreadable, since, self.policy, now)
        if any(not isinstance(a, act.WakeAt) for a in actions):
            ending = job.posted_state is State.TEARDOWN
            log.error(
                "job %s workflow %s: still unreadable past the deadline of %s: %s",
                f58(tracked.jobid),
                name,
                (job.posted_state or State.PROPOSAL).value,
                "deleting the workflow and letting the job go"
                if ending
                else "failing the job and asking for Teardown",
            )
        self._act(tracked, job, actions, window=False)

    def _forget(self, tracked: Tracked) -> None:
        if tracked.timer:
            tracked.timer.cancel()
        self.jobs.pop(tracked.jobid, None)
        self.executor.forget(tracked.jobid)
        self._wake(self.window.leave(tracked.jobid))

    def _in_window(self, tracked: Tracked, job: JobView, chain: list[Any]) -> bool:
        """Keep the Proposal window (flux_dws.core.window) up to date; False if the job must
        wait in DEPEND for a slot before creating its workflow."""
        jobid, window = tracked.jobid, self.window
        depend = job.phase is JobPhase.DEPEND
        if depend and tracked.workflow is not None:
            window.entered(jobid)
        elif depend and any(isinstance(a, act.CreateWorkflow) for a in chain):
            if not window.ask(jobid):
                if len(window.waiting) == 1:
                    log.info(
                        "job %s: %d workflow(s) in Proposal ([dws] max-proposals); new #DW "
                        "jobs wait in DEPEND, in submit order, for a slot",
                        f58(jobid),
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

    def _run_chain(self, tracked: Tracked, chain: list[Any], seen: Seen, index: int) -> None:
        if index == len(chain):
            tracked.busy = False
            if not (tracked.posting or tracked.asking):  # what is in flight may yet fail:
                tracked.retry, tracked.failing_since = 0.0, None  # its clock stands till then
            if tracked.dirty:
                self._kick(tracked.jobid)
            return
        action = chain[index]
        name = type(action).__name__
        self.metrics.actions[name] += 1

        def settle(outcome: Outcome) -> None:
            try:
                go_on = self._settle(tracked, name, outcome)
            except Exception as exc:  # a bug must not wedge the job: log and retry later
                log.exception("job %s: settling %s raised", f58(tracked.jobid), name)
                self._chain_failed(tracked, name, f"{type(exc).__name__}: {exc}")
                return
            if go_on:
                self._run_chain(tracked, chain, seen, index + 1)
            elif tracked.busy and not self._stopped:  # decide again at once, from the facts
                tracked.dirty = True
                self._run_chain(tracked, chain, seen, len(chain))

        try:
            self.executor.run(dispatch.handler_for(action), action, seen, settle)
        except Exception as exc:  # (the executor catches its handlers' own bugs)
            log.exception("job %s: %s raised", f58(tracked.jobid), name)
            self._chain_failed(tracked, name, f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ outcomes

    def _settle(self, tracked: Tracked, name: str, outcome: Outcome) -> bool:
        """Write what an action of the job's chain reported; True: go on with the chain.
        A Retry ends the chain (retried later, with backoff: ``busy`` is cleared); a
        refusal or a call the core gives up on becomes the job's refusal, which the next
        decision raises."""
        if isinstance(outcome, Done):
            return True
        self._learn(tracked, outcome.facts)
        if isinstance(outcome, Learned):
            return not outcome.again
        if not self._refused(tracked, outcome):
            assert isinstance(outcome, Retry)
            self._chain_failed(tracked, name, outcome.why)
        return False

    def _report(self, jobid: int, outcome: Outcome) -> None:
        """An outcome that came after its chain (a patch or a post sent without waiting):
        its facts are written and a failure judged as in a chain; the job is decided again
        now, or after a backoff."""
        tracked = self.jobs.get(jobid)
        if tracked is None or self._stopped or isinstance(outcome, Done):
            return
        try:
            self._learn(tracked, outcome.facts)
        except Exception:  # a bug must not wedge the job: decide again later
            log.exception("job %s: writing what a detached call reported raised", f58(jobid))
        if isinstance(outcome, (Refused, Retry)) and not self._refused(tracked, outcome):
            assert isinstance(outcome, Retry)  # a Refused always is
            tracked.retry = failing.backoff(tracked.retry)
            log.warning(
                "job %s workflow %s: %s; retrying in %.1fs",
                f58(jobid),
                self._workflow_name(tracked),
                outcome.why,
                tracked.retry,
            )
            self.loop.call_later(tracked.retry, self._kick, jobid)
            return
        self._kick(jobid)

    def _refused(self, tracked: Tracked, outcome: Refused | Retry) -> bool:
        """Whether ``outcome`` fails the job: a refusal, or a call the core gives up on
        (core.failing.give_up); if so it is the job's refusal now, which decide() raises."""
        if isinstance(outcome, Refused):
            refusal: failing.Refusal | None = outcome.refusal
        else:
            refusal = self._give_up(tracked, outcome.failure) if outcome.failure else None
        if refusal is None:
            return False
        self._refuse(tracked, refusal)
        return True

    def _give_up(self, tracked: Tracked, failure: failing.CallFailure) -> failing.Refusal | None:
        """The core's verdict on a Kubernetes call that failed (flux_dws.core.failing)."""
        now = self.loop.time()
        if tracked.failing_since is None:
            tracked.failing_since = now
        job = self.view(tracked)
        if job is None:
            return None
        since = now - tracked.failing_since
        refusal = failing.give_up(job, tracked.workflow, failure, since, self.policy)
        if refusal is not None:
            tracked.failing_since = None
        return refusal

    def _refuse(self, tracked: Tracked, refusal: failing.Refusal) -> None:
        """The job can never go on: the next decision fails it (core.lifecycle.decide)."""
        job = self.view(tracked)
        if job is not None and job.exception is None:
            note = failing.refusal_note(job, tracked.workflow, refusal)
            log.error("job %s: %s", f58(tracked.jobid), untrusted.text(note, None))
        tracked.refusal = refusal
        tracked.dirty = True

    def _learn(self, tracked: Tracked, facts: tuple[Fact, ...]) -> None:
        """Write facts an action reported into the job's entry (service.facts)."""
        learn(tracked, facts)

    def _workflow_name(self, tracked: Tracked) -> str:
        return tracked.workflow.name if tracked.workflow else self.kube.workflow_name(tracked.jobid)

    def _chain_failed(self, tracked: Tracked, name: str, error: str) -> None:
        self.metrics.failures[name] += 1
        self.presence.note_error(f"job {f58(tracked.jobid)}: {name} failed: {error}")
        tracked.retry = failing.backoff(tracked.retry)
        log.warning(
            "job %s workflow %s: %s failed: %s; retrying in %.1fs",
            f58(tracked.jobid),
            self._workflow_name(tracked),
            name,
            error,
            tracked.retry,
        )
        tracked.busy = False
        if tracked.timer:
            tracked.timer.cancel()
        tracked.timer = self.loop.call_later(tracked.retry, self._kick, tracked.jobid)


def _seen(tracked: Tracked) -> bool:
    """The job's workflow has been read (readable or not)."""
    return tracked.workflow is not None or bool(tracked.unreadable)


def _ignore(_response: Any, _error: Any) -> None:
    """An answer nobody waits for (an alarm event: the log line already said it)."""


__all__ = ["Service"]
