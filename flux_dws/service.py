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

import dataclasses
import errno
import logging
import pwd
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from flux_dws import lifecycle as lc
from flux_dws.admission import ProposalWindow
from flux_dws.flux.jobmanager import SETTLED_ERRNOS, JobManager
from flux_dws.flux.records import job_view, parse_request
from flux_dws.flux.transport import RpcError
from flux_dws.fsd import format_fsd
from flux_dws.identity import JOBID_LABEL, owned_jobid
from flux_dws.k8s import KubeClient, KubeError, KubeWorker, WorkflowRejected, WorkflowWatch
from flux_dws.k8s.resources import container_timeouts
from flux_dws.lifecycle import JobPhase, ProposalInfo
from flux_dws.loop import Loop, Timer
from flux_dws.policy import Policy
from flux_dws.reconcile import startup_order
from flux_dws.request import DwRequest
from flux_dws.states import State
from flux_dws.storage import StorageError, needs_from_breakdowns, plan_servers, rabbit_map
from flux_dws.workflow import WorkflowView, view_workflow

log = logging.getLogger("flux-dws")

RETRY_MIN = 0.5  # seconds before retrying a job whose action failed; doubles up to RETRY_MAX
RETRY_MAX = 60.0
WATCH_RETRY_MAX = 30.0


class Halt:
    """What an action reports when it ended the job's chain on purpose (it failed the job):
    the rest of the chain was decided for a job that no longer exists as such."""


HALT = Halt()
#: An action's outcome: None (go on), a one-line error (retry later), or HALT (decide again).
Done = Callable[[Union[str, Halt, None]], None]


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
class Tracked:
    """What the service knows about one job (or one orphaned workflow)."""

    jobid: int
    record: dict[str, Any] | None = None
    workflow: WorkflowView | None = None
    raw: dict[str, Any] | None = None
    proposal: ProposalInfo | None = None
    request: tuple[DwRequest | None, str] | None = None  # parsed once: attributes never change
    deleted: str = ""  # uid of the workflow already deleted (its DELETED event may lag)
    posting: dict[str, dict[str, Any]] = field(default_factory=dict)  # events not yet answered
    busy: bool = False  # an action chain is in flight
    dirty: bool = False  # something changed while busy: decide again after
    timer: Timer | None = None
    retry: float = 0.0
    observed: float = 0.0  # monotonic time of the last observation (job record or workflow)


@dataclass
class Metrics:
    """Figures for benchmarks and `flux dws` status: reactions and requests."""

    # (next state, seconds from the observation that allowed it to the patch being sent)
    reactions: list[tuple[State, float]] = field(default_factory=list)
    actions: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)


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
        worker: KubeWorker | None = None,
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
        self._api_down_since: float | None = None
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

    # ------------------------------------------------------------------ start / stop

    def start(self) -> None:
        """Subscribe to job records and workflow events (call on the loop's thread)."""
        self._watch = WorkflowWatch(
            self.kube,
            self._on_workflow_event_thread,
            on_health=lambda up, since: self.loop.call_soon(self._on_health, up, since),
            on_listed=lambda: self.loop.call_soon(self._on_listed),
        )
        self._watch.start()
        self._watch_records()
        self._heartbeat()

    def stop(self) -> None:
        """Stop watching; in-flight Kubernetes calls finish on their own."""
        self._stopped = True
        if self._cancel_records:
            self._cancel_records()
        if self._watch:
            self._watch.stop()
        self.worker.stop()
        for tracked in self.jobs.values():
            if tracked.timer:
                tracked.timer.cancel()

    def _heartbeat(self) -> None:
        if self._stopped:
            return

        def answered(_response: Any, error: RpcError | None) -> None:
            if error is not None:
                log.warning("heartbeat to the dws jobtap plugin failed: %s", error)

        self.jm.heartbeat(answered)
        self.loop.call_later(self.policy.heartbeat, self._heartbeat)

    def _watch_records(self) -> None:
        self._cancel_records = self.jm.watch(self._on_records, self._on_records_lost)

    def _on_records_lost(self, error: RpcError) -> None:
        if self._stopped:
            return
        if error.errnum == errno.ECANCELED:  # the plugin gave the stream to a newer service
            log.error(
                "another flux-dws service took over this instance's jobs (%s); stopping this one",
                error.message,
            )
            self.superseded = True
            self.stop()
            self.loop.stop()
            return
        delay = self._records_retry
        self._records_retry = min(delay * 2, WATCH_RETRY_MAX)
        log.error(
            "lost the job stream from the dws jobtap plugin (%s); jobs stay held; "
            "reconnecting in %.1fs",
            error,
            delay,
        )
        self.loop.call_later(delay, self._watch_records)

    # ------------------------------------------------------------------ observations

    def _on_records(self, records: list[dict[str, Any]], snapshot: bool) -> None:
        self._records_retry = RETRY_MIN
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
        order = startup_order(
            (t.jobid, t.workflow is not None, float((t.record or {}).get("t_submit", 0.0)))
            for t in self.jobs.values()
        )
        for jobid in order:
            self._kick(jobid)

    def _on_health(self, connected: bool, since: float) -> None:
        """The watch found the API reachable or not: alarm if it stays down too long."""
        if connected:
            if self._api_down_since is not None:
                log.info("Kubernetes API reachable again; carrying on")
            self._api_down_since = None
            if self._api_alarm:
                self._api_alarm.cancel()
                self._api_alarm = None
            return
        if self._api_down_since is not None:
            return
        self._api_down_since = since
        log.warning(
            "Kubernetes API unreachable; %d job(s) stay held, none is killed; "
            "alarm if still down in %s",
            len(self.jobs),
            format_fsd(self.policy.api_alarm),
        )
        self._api_alarm = self.loop.call_at(since + self.policy.api_alarm, self._raise_api_alarm)

    def _raise_api_alarm(self) -> None:
        since = self._api_down_since
        if since is None:
            return
        held = [t.jobid for t in self.jobs.values() if t.record is not None]
        log.error(
            "Kubernetes API unreachable for more than %s: %d #DW job(s) held and waiting; "
            "check the API server and the kubeconfig",
            format_fsd(self.policy.api_alarm),
            len(held),
        )
        context = {"since": since, "note": "Kubernetes API unreachable; the job waits"}
        for jobid in held:
            self.jm.post(jobid, "dws-api-unreachable", context, lambda _r, _e: None)

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
        if kind == "DELETED":
            tracked.workflow, tracked.raw = None, None
        else:
            try:
                tracked.workflow, tracked.raw = view_workflow(obj), obj
            except ValueError as exc:
                log.error("job %d: workflow %s is malformed: %s", jobid, _name(obj), exc)
                return
        tracked.observed = seen
        self._kick(jobid)

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
        )

    def _decide(self, tracked: Tracked) -> None:
        job = self.view(tracked)
        if job is None:
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
        """Keep the Proposal window (flux_dws.admission) up to date; False if the job must
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
            tracked.busy, tracked.retry = False, 0.0
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

    # ------------------------------------------------------------------ executing

    def _kube_then(
        self,
        done: Done,
        then: Callable[[Any], str | None] | None,
        fn: Callable[..., Any],
        *args: Any,
        urgent: bool = False,
        **kwargs: Any,
    ) -> None:
        def finished(result: Any, exc: BaseException | None) -> None:
            self.loop.call_soon(settle, result, exc)

        def settle(result: Any, exc: BaseException | None) -> None:
            if exc is not None:
                done(_error_text(exc))
            else:
                done(then(result) if then else None)

        self.worker.submit(fn, *args, on_done=finished, urgent=urgent, **kwargs)

    def _flux_done(self, done: Done, method: str, tracked: Tracked) -> Callable[..., None]:
        """A job-manager callback: "already done" errors count as success."""

        def on_done(_response: Any, error: RpcError | None) -> None:
            if error is None:
                done(None)
            elif error.errnum in SETTLED_ERRNOS:
                log.debug("job %d: %s already settled: %s", tracked.jobid, method, error.message)
                done(None)
            else:
                done(f"{method}: {error}")

        return on_done

    def _do_CreateWorkflow(self, tracked: Tracked, action: lc.CreateWorkflow, done: Done) -> None:
        jobid = tracked.jobid

        def created(obj: dict[str, Any] | None, exc: BaseException | None) -> None:
            self.loop.call_soon(settle, obj, exc)

        def settle(obj: dict[str, Any] | None, exc: BaseException | None) -> None:
            if isinstance(exc, WorkflowRejected):
                self._fail_job(tracked, f"DWS rejected the job's directives: {exc.message}", done)
            elif exc is not None:
                done(str(exc))
            else:
                assert obj is not None
                self._adopt(tracked, created=True)(obj)
                log.info("job %d: created workflow %s in Proposal", jobid, _name(obj))
                done(None)

        self.worker.submit(
            self.kube.create_workflow,
            jobid=jobid,
            userid=action.userid,
            groupid=action.groupid,
            directives=list(action.directives),
            on_done=created,
        )

    def _do_SetDesiredState(self, tracked: Tracked, action: lc.SetDesiredState, done: Done) -> None:
        wf, proposal = tracked.workflow, tracked.proposal
        assert wf is not None and (proposal is not None or not action.assign)
        observed = tracked.observed

        def patch() -> Any:
            if action.assign:  # one worker job: the state change follows without a loop trip
                assert proposal is not None
                self._assign_nodes(wf.name, proposal, action.assign)
            if observed:
                self.metrics.reactions.append((action.state, time.monotonic() - observed))
            return self.kube.set_desired_state(wf.name, action.state, hurry=action.hurry)

        # Take the patch as done in the cached view and end the chain now: DWS often reports
        # the new state (watch) before this worker has read the patch's own response, and the
        # job must not sit busy meanwhile.  The view is not settled, so nothing advances on it.
        asked = dataclasses.replace(wf, desired_state=action.state, hurry=action.hurry)
        tracked.workflow = asked
        adopt = self._adopt(tracked)

        def finished(result: Any, exc: BaseException | None) -> None:
            self.loop.call_soon(settle, result, exc)

        def settle(result: Any, exc: BaseException | None) -> None:
            if exc is None:
                adopt(result)
                return
            if tracked.workflow is asked:  # nothing newer came: back to what was known
                tracked.workflow = wf
            if isinstance(exc, StorageError):
                self._fail_job(
                    tracked, f"cannot place the job's storage: {exc}", self._retry_on_error(tracked)
                )
                return
            log.warning(
                "job %d workflow %s: asking for %s failed: %s; retrying in %.1fs",
                tracked.jobid,
                wf.name,
                action.state.value,
                _error_text(exc),
                RETRY_MIN,
            )
            self.loop.call_later(RETRY_MIN, self._kick, tracked.jobid)

        self.worker.submit(patch, on_done=finished, urgent=True)
        # Logged once the patch is handed over: writing the line may let other threads run.
        log.info(
            "job %d workflow %s: %s -> %s%s",
            tracked.jobid,
            wf.name,
            wf.desired_state.value,
            action.state.value,
            " (hurry)" if action.hurry else "",
        )
        done(None)

    def _assign_nodes(self, name: str, proposal: ProposalInfo, hosts: Sequence[str]) -> None:
        """Computes and Servers for the job's nodes (on a worker: reads, then writes).

        The storage plan comes first, so a job whose storage cannot be placed (StorageError)
        has nothing written for it.
        """
        if self._rabbits is None or any(h not in self._rabbits for h in hosts):
            self._rabbits = rabbit_map(self.kube.read_system_configuration())
        plan = plan_servers(proposal.needs, hosts, self._rabbits)
        self.kube.patch_computes(name, list(hosts))
        for (namespace, server), sets in plan.items():
            self.kube.patch_servers(server, namespace, sets)

    def _retry_on_error(self, tracked: Tracked) -> Done:
        """For an action run outside any chain: decide the job again later if it failed."""

        def retry(error: str | Halt | None) -> None:
            if error is not None and not isinstance(error, Halt):
                self.loop.call_later(RETRY_MIN, self._kick, tracked.jobid)
            else:
                self._kick(tracked.jobid)

        return retry

    def _adopt(self, tracked: Tracked, created: bool = False) -> Callable[[Any], str | None]:
        """Take a returned workflow as the latest view, so the next decision need not wait.

        Only a newer version of the workflow the service knows, or the one it just created:
        a response that arrives after the watch reported the workflow deleted must not bring
        it back.
        """

        def adopt(obj: Any) -> str | None:
            if not isinstance(obj, dict):
                return None
            known = tracked.workflow
            if known is None and not created:
                return None
            meta = obj.get("metadata") or {}
            if known is not None and (
                known.uid != (meta.get("uid") or "")
                or _rv(meta.get("resourceVersion")) <= _rv(known.resource_version)
            ):
                return None  # another workflow, or not newer than what we know
            try:
                tracked.workflow, tracked.raw = view_workflow(obj), obj
            except ValueError:
                return None
            tracked.dirty = True
            return None

        return adopt

    def _do_ReadProposal(self, tracked: Tracked, action: lc.ReadProposal, done: Done) -> None:
        raw = tracked.raw
        assert raw is not None

        def read() -> ProposalInfo:
            needs = needs_from_breakdowns(self.kube.read_breakdowns(raw))
            profile = self.kube.read_container_profile(raw)
            timeouts: dict[str, float] = {}
            if profile is not None:
                limits = container_timeouts(profile)
                timeouts = {"prerun": limits.prerun, "postrun": limits.postrun}
            return ProposalInfo(needs=needs, container_timeouts=timeouts)

        def store(result: Any, exc: BaseException | None) -> None:
            self.loop.call_soon(settle, result, exc)

        def settle(result: Any, exc: BaseException | None) -> None:
            if isinstance(exc, StorageError):
                self._fail_job(tracked, f"cannot size the job's storage: {exc}", done)
            elif exc is not None:
                done(str(exc))
            else:
                tracked.proposal = result
                tracked.dirty = True
                done(None)

        self.worker.submit(read, on_done=store)

    def _fail_job(self, tracked: Tracked, note: str, done: Done) -> None:
        """A definitive failure found while acting: the job gets it as its exception, and
        the rest of the chain is dropped (the next decision sees the exception)."""
        log.error("job %d: %s", tracked.jobid, note)
        action = lc.RaiseException(note)

        def raised(error: str | Halt | None) -> None:
            done(HALT if error is None else error)

        self._do_RaiseException(tracked, action, raised)

    def _do_ReleaseDependency(
        self, tracked: Tracked, action: lc.ReleaseDependency, done: Done
    ) -> None:
        log.info("job %d: Proposal ready; releasing the job to the scheduler", tracked.jobid)
        self.jm.release(
            tracked.jobid,
            action.jobspec_update,
            self._flux_done(self._then_record(tracked, done, phase="sched"), "release", tracked),
        )

    def _do_FinishProlog(self, tracked: Tracked, action: lc.FinishProlog, done: Done) -> None:
        jobid = tracked.jobid
        if action.success:
            finished = self._then_record(tracked, done, phase="run", started=True)
        else:
            finished = self._then_record(tracked, done, phase="epilog")
        on_done = self._flux_done(finished, "prolog-finish", tracked)
        if not action.success:
            self.jm.prolog_finish(jobid, False, {}, on_done)
            return
        env = dict(action.env)

        def send(token: str | None) -> str | None:
            if token:
                env["DW_WORKFLOW_TOKEN"] = token
            log.info("job %d: PreRun ready; starting the job with %d variables", jobid, len(env))
            self.jm.prolog_finish(jobid, True, env, on_done)
            return None

        if action.token_secret is None:
            send(None)
            return

        def sent(error: str | None) -> None:
            if error is not None:
                done(error)

        namespace, name = action.token_secret
        self._kube_then(sent, send, self.kube.read_token, namespace, name)

    def _do_FinishEpilog(self, tracked: Tracked, action: lc.FinishEpilog, done: Done) -> None:
        log.info("job %d: workflow gone; finishing the epilog", tracked.jobid)
        finished = self._then_record(tracked, done, phase="gone")
        self.jm.epilog_finish(tracked.jobid, self._flux_done(finished, "epilog-finish", tracked))

    def _do_RaiseException(self, tracked: Tracked, action: lc.RaiseException, done: Done) -> None:
        log.info(
            "job %d workflow %s: raising %s exception: %s",
            tracked.jobid,
            self._wf_name(tracked),
            action.type,
            action.note,
        )

        def raised(error: str | None) -> None:
            if error is None and not (tracked.record or {}).get("exception"):
                exc = {"type": action.type, "severity": action.severity, "note": action.note}
                self._update_record(tracked, exception=exc)
            done(error)

        self.jm.raise_exception(
            tracked.jobid,
            action.type,
            action.severity,
            action.note,
            self._flux_done(raised, "raise", tracked),
        )

    def _do_PostEvent(self, tracked: Tracked, action: lc.PostEvent, done: Done) -> None:
        """Post without waiting for the answer: the chain goes on at once.

        Requests to the plugin are handled in the order sent, so the event still lands before
        anything the chain asks next.  The record takes the event now (the next decision sees
        it); should the post fail, that is undone and the job decided again, which posts anew.
        """
        if tracked.record is None:
            done(None)
            return
        before = (tracked.record.get("dws") or {}).get(action.name)
        context = dict(action.context)
        tracked.posting[action.name] = context
        self._update_record(
            tracked, dws={**(tracked.record.get("dws") or {}), action.name: context}
        )

        def posted(error: str | Halt | None) -> None:
            if tracked.posting.get(action.name) is context:
                del tracked.posting[action.name]
            if error is None or tracked.record is None:
                return
            log.warning(
                "job %d: posting %s failed: %s; will retry", tracked.jobid, action.name, error
            )
            dws = dict(tracked.record.get("dws") or {})
            if dws.get(action.name) is context:
                if before is None:
                    dws.pop(action.name)
                else:
                    dws[action.name] = before
                self._update_record(tracked, dws=dws)
            self.loop.call_later(RETRY_MIN, self._kick, tracked.jobid)

        self.jm.post(tracked.jobid, action.name, context, self._flux_done(posted, "post", tracked))
        done(None)

    def _do_DeleteWorkflow(self, tracked: Tracked, action: lc.DeleteWorkflow, done: Done) -> None:
        wf = tracked.workflow
        assert wf is not None
        if tracked.deleted == wf.uid:  # done already; waiting for the watch to say so
            done(None)
            return
        log.info(
            "job %d: deleting workflow %s (%s)", tracked.jobid, wf.name, wf.desired_state.value
        )

        def deleted(_result: Any) -> None:
            tracked.deleted = wf.uid

        self._kube_then(done, deleted, self.kube.delete_workflow, wf.name)

    # ------------------------------------------------------------------ helpers

    def _update_record(self, tracked: Tracked, **changes: Any) -> None:
        """Apply what an action just did to the cached record, ahead of the plugin's update.

        The plugin's own record follows on the job stream; until then the next decision
        sees the effect (an out-of-date record arriving later only costs a repeated,
        harmless request).  A "gone" job is forgotten once its workflow is gone too.
        """
        if tracked.record is None:
            return
        if changes.get("phase") == "gone":
            tracked.record = None
        else:
            tracked.record = {**tracked.record, **changes}
        tracked.dirty = True

    def _then_record(self, tracked: Tracked, done: Done, **changes: Any) -> Done:
        def finished(error: str | None) -> None:
            if error is None:
                self._update_record(tracked, **changes)
            done(error)

        return finished

    def _wf_name(self, tracked: Tracked) -> str:
        return tracked.workflow.name if tracked.workflow else self.kube.workflow_name(tracked.jobid)

    def _groupid(self, userid: int) -> int:
        """The owner's primary group for the workflow's groupID (never from user input)."""
        if userid not in self._gids:
            try:
                self._gids[userid] = pwd.getpwuid(userid).pw_gid
            except KeyError:
                self._gids[userid] = userid
        return self._gids[userid]


def _error_text(exc: BaseException) -> str:
    """A failed call, in one line: Kubernetes errors say enough; others get their type."""
    return str(exc) if isinstance(exc, KubeError) else f"{type(exc).__name__}: {exc}"


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", "?"))


def _rv(version: Any) -> int:
    """A resourceVersion (parsed or raw) as a number, to order versions (0 if it has none)."""
    try:
        return int(version or 0)
    except (TypeError, ValueError):
        return 0


__all__ = ["Service", "Metrics", "Tracked"]
