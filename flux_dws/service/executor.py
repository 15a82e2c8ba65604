# SPDX-License-Identifier: LGPL-3.0-only
"""The action executor: what every action's code shares, and the service's hands.

The event loop (flux_dws.service.service) decides; the handlers (flux_dws.service.actions and
flux_dws.service.recording, dispatched by flux_dws.service.dispatch) carry out one action of
a job's chain through the ActionExecutor, and report how it ended through ``done``: None (go
on), a one-line error (retry later) or HALT (the job was failed here; decide again).

Kubernetes calls run on the worker pool, whose results arrive on the loop's thread (the
pool's ``deliver``); job-manager requests are asynchronous RPCs answered on the loop.  So
every callback here runs on the loop, and only the loop touches the service's state.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Callable

from flux_dws.base import untrusted
from flux_dws.base.jobid import f58
from flux_dws.base.loop import Loop
from flux_dws.core import actions as act
from flux_dws.core.messages import failure_note
from flux_dws.core.policy import Policy
from flux_dws.core.states import State
from flux_dws.core.storage import ComputeLayout, StorageError, compute_layout
from flux_dws.core.workflow import view_of
from flux_dws.flux.jobmanager import SETTLED_ERRNOS, JobManager
from flux_dws.flux.transport import RpcError
from flux_dws.k8s import KubeClient, KubeError, KubeWorker
from flux_dws.k8s.recordcache import RecordCache
from flux_dws.service.failures import (
    RETRY_MIN,
    FailureRules,
    backoff,
    error_text,
    primary_group,
)
from flux_dws.service.healthwatch import HealthMonitor
from flux_dws.service.jobs import HALT, Attempts, Done, Halt, Metrics, Tracked
from flux_dws.service.persistentpush import PersistentPush
from flux_dws.service.placements import Placements

log = logging.getLogger("flux-dws")

#: Record reads that fail this many times in a row are given up (noted in the record) so
#: the job goes on: a record is worth a short wait, never a wedged job.
RECORD_ATTEMPTS = 5


class ActionExecutor:
    """The parts an action's code needs, and the steps they share; see the module."""

    def __init__(
        self,
        *,
        policy: Policy,
        loop: Loop,
        worker: KubeWorker,
        kube: KubeClient,
        jm: JobManager,
        rules: FailureRules,
        metrics: Metrics,
        kick: Callable[[int], None],
        health: HealthMonitor | None = None,
        persistent: PersistentPush | None = None,
        records: RecordCache | None = None,
        placements: Placements | None = None,
    ) -> None:
        self.policy = policy
        self.loop = loop
        self.worker = worker
        self.kube = kube
        self.jm = jm
        self.rules = rules
        self.metrics = metrics
        self.kick = kick
        self.health = health
        self.persistent = persistent  # the persistentdw a job may not use (service.persistentpush)
        self.records = records  # watched pods and NnfDataMovements (k8s.recordcache)
        # where exclusive allocations are, for the Servers plan (service.placements)
        self.placements = placements if placements is not None else Placements(kube)
        self.gids: dict[int, int] = {}  # primary groups found (failed lookups are not kept)
        # The SystemConfiguration's nodes: each one's rabbit, and its externalComputeNodes
        self.rabbits: ComputeLayout | None = None
        self.attempts = Attempts(RECORD_ATTEMPTS)
        self._group_lookups: dict[int, list[Callable[[int | str], None]]] = {}

    def look_up_group(self, userid: int, found: Callable[[int | str], None]) -> None:
        """The primary group of ``userid``, looked up on a worker (NSS may block): ``found``
        gets the gid (kept for later decisions) or why there is none (not kept, so the next
        job tries again).  Jobs of one user asking at once share one lookup."""
        waiting = self._group_lookups.get(userid)
        if waiting is not None:
            waiting.append(found)
            return
        self._group_lookups[userid] = [found]

        def settle(gid: int | str | None, exc: BaseException | None) -> None:
            answer = gid if gid is not None else f"looking up uid {userid} failed: {exc}"
            if isinstance(answer, int):
                self.gids[userid] = answer
            for callback in self._group_lookups.pop(userid, []):
                callback(answer)

        self.worker.submit(primary_group, userid, on_done=settle)

    def forget(self, jobid: int) -> None:
        """The service forgets the job: so does everything kept for it here."""
        self.attempts.forget(jobid)

    # ------------------------------------------------------------------ calls

    def call(
        self,
        tracked: Tracked,
        what: str,
        done: Done,
        then: Callable[[Any], str | None] | None,
        fn: Callable[..., Any],
        *args: Any,
        urgent: bool = False,
    ) -> None:
        """Run ``fn(*args)`` on a worker; on the loop, ``done(then(result))`` or the failure
        judged by the rules (flux_dws.service.failures)."""

        def settle(result: Any, exc: BaseException | None) -> None:
            if exc is not None:
                self.call_failed(tracked, what, exc, done)
            else:
                done(then(result) if then else None)

        self.worker.submit(fn, *args, on_done=settle, urgent=urgent)

    def call_failed(self, tracked: Tracked, what: str, exc: BaseException, done: Done) -> None:
        """A Kubernetes call of the job's chain failed: fail the job if the rules say so, else
        report the error (the chain is retried later, with backoff)."""
        now = self.loop.time()
        if tracked.failing_since is None:
            tracked.failing_since = now
        why = self.rules.give_up(tracked, what, exc, now - tracked.failing_since)
        if why is None:
            done(error_text(exc))
            return
        tracked.failing_since = None
        self.fail_job(tracked, why, done)

    def patch_failed(self, tracked: Tracked, name: str, what: str, exc: BaseException) -> None:
        """A call sent outside the chain (a desiredState patch) failed: as call_failed, but
        the retry is a later decision (the job's chain may be busy with something else)."""
        now = self.loop.time()
        if tracked.patch_failing_since is None:
            tracked.patch_failing_since = now
        gone = isinstance(exc, KubeError) and exc.status == 404  # the watch will say so
        since = now - tracked.patch_failing_since
        why = None if gone else self.rules.give_up(tracked, what, exc, since)
        if why is not None:
            tracked.patch_failing_since = None
            self.fail_job(tracked, why, self.retry_on_error(tracked))
            return
        delay = self.retry_later(tracked)
        log.warning(
            "job %s workflow %s: %s failed: %s; retrying in %.1fs",
            f58(tracked.jobid),
            name,
            what,
            error_text(exc),
            delay,
        )

    def retry_later(self, tracked: Tracked) -> float:
        """Decide for the job again after a backoff and return the delay.  For calls sent
        outside the job's chain (a patch, a post): the chain has ended by then, so their
        backoff is their own, reset only when one succeeds."""
        tracked.async_retry = backoff(tracked.async_retry)
        self.loop.call_later(tracked.async_retry, self.kick, tracked.jobid)
        return tracked.async_retry

    def retry_on_error(self, tracked: Tracked) -> Done:
        """For an action run outside any chain: decide the job again (later if it failed)."""

        def retry(error: str | Halt | None) -> None:
            if error is not None and not isinstance(error, Halt):
                self.loop.call_later(RETRY_MIN, self.kick, tracked.jobid)
            else:
                self.kick(tracked.jobid)

        return retry

    def flux_done(self, done: Done, method: str, tracked: Tracked) -> Callable[..., None]:
        """A job-manager callback: "already done" errors count as success."""

        def on_done(_response: Any, error: RpcError | None) -> None:
            if error is None:
                done(None)
            elif error.errnum in SETTLED_ERRNOS:
                log.debug(
                    "job %s: %s already settled: %s", f58(tracked.jobid), method, error.message
                )
                done(None)
            else:
                done(f"{method}: {error}")

        return on_done

    # ------------------------------------------------------------------ the job

    def fail_job(
        self,
        tracked: Tracked,
        reason: str,
        done: Done,
        *,
        state: State | None = None,
        directive: str = "",
        step: str | None = None,
    ) -> None:
        """A definitive failure found while acting: the job gets it as its exception, in the
        one form (flux_dws.core.messages: ``state``, else the state the workflow is in, then
        ``directive`` and ``reason``), and the rest of the chain is dropped (the next decision
        sees the exception)."""
        state = state or (tracked.workflow.desired_state if tracked.workflow else State.PROPOSAL)
        note = failure_note(state.value, reason, tracked.jobid, directive=directive, step=step)
        log.error("job %s: %s", f58(tracked.jobid), untrusted.text(note, None))

        def raised(error: str | Halt | None) -> None:
            done(HALT if error is None else error)

        self.raise_exception(tracked, act.RaiseException(note), raised)

    def raise_exception(self, tracked: Tracked, action: act.RaiseException, done: Done) -> None:
        log.info(
            "job %s workflow %s: raising %s exception: %s",
            f58(tracked.jobid),
            self.workflow_name(tracked),
            action.type,
            untrusted.text(action.note, None),
        )

        def raised(error: str | Halt | None) -> None:
            fatal = action.severity == 0
            if error is None and fatal and not (tracked.record or {}).get("exception"):
                exc = {"type": action.type, "severity": action.severity, "note": action.note}
                self.update_record(tracked, exception=exc)
            done(error)

        self.jm.raise_exception(
            tracked.jobid,
            action.type,
            action.severity,
            action.note,
            self.flux_done(raised, "raise", tracked),
        )

    def post_event(self, tracked: Tracked, action: act.PostEvent, done: Done) -> None:
        """Post without waiting for the answer: the chain goes on at once (unless the action
        says ``wait``: then only once Flux has taken it).

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
        self.update_record(tracked, dws={**(tracked.record.get("dws") or {}), action.name: context})

        def posted(error: str | Halt | None, *, in_chain: bool = False) -> None:
            if tracked.posting.get(action.name) is context:
                del tracked.posting[action.name]
            if error is None:
                tracked.async_retry = 0.0
            if error is None or tracked.record is None:
                return
            dws = dict(tracked.record.get("dws") or {})
            if dws.get(action.name) is context:
                if before is None:
                    dws.pop(action.name)
                else:
                    dws[action.name] = before
                self.update_record(tracked, dws=dws)
            if in_chain:  # the chain's own failure logs it and retries with backoff
                return
            log.warning(
                "job %s: posting %s failed: %s; will retry", f58(tracked.jobid), action.name, error
            )  # with backoff: a post Flux refuses must not be sent again every half second
            self.retry_later(tracked)

        if not action.wait:
            self.jm.post(
                tracked.jobid, action.name, context, self.flux_done(posted, "post", tracked)
            )
            done(None)
            return

        def recorded(error: str | Halt | None) -> None:
            posted(error, in_chain=True)
            done(error)

        # e.g. an abort's reason before Teardown is asked (a never-start job once ended as
        # "workflow ended before the job could start" in the chaos test), or dws-release
        # before DataOut (else DataOut's outcome was never saved: tests/test_release_scenarios)
        self.jm.post(tracked.jobid, action.name, context, self.flux_done(recorded, "post", tracked))

    def update_record(self, tracked: Tracked, **changes: Any) -> None:
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

    def then_record(self, tracked: Tracked, done: Done, **changes: Any) -> Done:
        def finished(error: str | Halt | None) -> None:
            if error is None:
                self.update_record(tracked, **changes)
            done(error)

        return finished

    # ------------------------------------------------------------------ the workflow

    def adopt(self, tracked: Tracked, created: bool = False) -> Callable[[Any], str | None]:
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
                or version_number(meta.get("resourceVersion"))
                <= version_number(known.resource_version)
            ):
                return None  # another workflow, or not newer than what we know
            try:
                tracked.workflow, tracked.raw = view_of(obj)
            except ValueError:
                return None
            tracked.dirty = True
            return None

        return adopt

    def workflow_name(self, tracked: Tracked) -> str:
        return tracked.workflow.name if tracked.workflow else self.kube.workflow_name(tracked.jobid)

    def rabbits_for(
        self, hosts: Sequence[str], required: bool = False
    ) -> Callable[[], ComputeLayout]:
        """A worker-side reader of the nodes' layout (node -> rabbit, external nodes) for
        ``hosts``: the cached one when it covers them all, else the SystemConfiguration read
        anew.  The worker only reads; the layout it used comes back with its result and is
        kept by ``keep_rabbits`` on the loop.
        ``required`` (storage is to be placed): no SystemConfiguration is a StorageError that
        says so, not a compute node that no rabbit serves."""
        cached = self.rabbits

        def read() -> ComputeLayout:
            if cached is not None and cached.covers(hosts):
                return cached
            config = self.kube.read_system_configuration()
            if config is None and required:
                raise StorageError(
                    "no SystemConfiguration 'default' yet: DWS has not said which rabbit "
                    "serves which compute node"
                )
            return compute_layout(config)

        return read

    def keep_rabbits(self, rabbits: ComputeLayout | None) -> None:
        """On the loop: keep the layout a worker read (flux_dws.service.executor.rabbits_for)."""
        if rabbits is not None:
            self.rabbits = rabbits


def version_number(version: Any) -> int:
    """A resourceVersion (parsed or raw) as a number, to order versions (0 if it has none)."""
    try:
        return int(version or 0)
    except (TypeError, ValueError):
        return 0
