# SPDX-License-Identifier: LGPL-3.0-only
"""The action executor: runs one action's handler and turns how it ended into an outcome.

The loop (flux_dws.service.service) decides and hands each action of a job's chain to
``run``, with the handler flux_dws.service.dispatch names for it.  A handler is a generator of
steps (flux_dws.service.outcome): this module carries each out, Kubernetes calls on the
worker pool (their results come back on the loop's thread, the pool's ``deliver``) and
job-manager requests as asynchronous RPCs answered on the loop, and sends the answer back
into the handler.  Whatever the handler returns, or an exception it let escape (mapped by
``outcome_of``, in one place), reaches the loop as one outcome.  So every callback here runs
on the loop, and nothing here writes a job's facts: the loop does, from the outcome.
"""

from __future__ import annotations

import logging
import pwd
from collections.abc import Generator, Sequence
from typing import Any, Callable

from flux_dws.base.jobid import f58
from flux_dws.base.loop import Loop
from flux_dws.core.policy import Policy
from flux_dws.core.storage import ComputeLayout, StorageError, compute_layout
from flux_dws.flux.jobmanager import SETTLED_ERRNOS, JobManager
from flux_dws.k8s import KubeClient, KubeWorker
from flux_dws.k8s.recordcache import RecordCache
from flux_dws.service.healthwatch import HealthMonitor
from flux_dws.service.jobs import Attempts, Metrics, Seen
from flux_dws.service.outcome import (
    DONE,
    Call,
    Handler,
    Outcome,
    Retry,
    Rpc,
    Step,
    Wait,
    call,
    outcome_of,
)
from flux_dws.service.persistentpush import PersistentPush
from flux_dws.service.placements import Placements

log = logging.getLogger("flux-dws")

#: Record reads that fail this many times in a row are given up (noted in the record) so
#: the job goes on: a record is worth a short wait, never a wedged job.
RECORD_ATTEMPTS = 5

#: How an outcome reaches the loop: for the action's own chain, or (a detached request
#: that failed later) for the job.
Settle = Callable[[Outcome], None]
Report = Callable[[int, Outcome], None]


class ActionExecutor:
    """The parts a handler needs, and the driver of its steps; see the module."""

    def __init__(
        self,
        *,
        policy: Policy,
        loop: Loop,
        worker: KubeWorker,
        kube: KubeClient,
        jm: JobManager,
        metrics: Metrics,
        report: Report,
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
        self.metrics = metrics
        self.report = report
        self.health = health
        self.persistent = persistent  # the persistentdw a job may not use (service.persistentpush)
        self.records = records  # watched pods and NnfDataMovements (k8s.recordcache)
        # where exclusive allocations are, for the Servers plan (service.placements)
        self.placements = placements if placements is not None else Placements()
        self.gids: dict[int, int] = {}  # primary groups found (failed lookups are not kept)
        # The SystemConfiguration's nodes: each one's rabbit, and its externalComputeNodes
        self.rabbits: ComputeLayout | None = None
        self.attempts = Attempts(RECORD_ATTEMPTS)
        self._group_lookups: dict[int, list[Callable[[int | str], None]]] = {}

    # ------------------------------------------------------------------ running a handler

    def run(self, handler: Handler, action: Any, seen: Seen, settle: Settle) -> None:
        """Run ``handler`` for ``action``; ``settle`` gets its outcome, once, on the loop."""
        try:
            result = handler(self, action, seen)
        except Exception as exc:
            settle(self._bug(seen, action, exc))
            return
        if isinstance(result, Generator):
            _Steps(self, result, seen, action, settle).advance(None, None, "")
        else:
            settle(result)

    def _bug(self, seen: Seen, action: Any, exc: BaseException) -> Outcome:
        """A handler raised on its own (not a call's error): a bug must not wedge the job."""
        name = type(action).__name__
        log.error("job %s: %s raised", f58(seen.job.jobid), name, exc_info=exc)
        return Retry(f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ shared reads

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

    def layout(
        self, hosts: Sequence[str], what: str, required: bool = False
    ) -> Generator[Step, Any, ComputeLayout]:
        """The nodes' layout (node -> rabbit, external nodes) for ``hosts``: the cached one
        when it covers them all, else the SystemConfiguration read anew on a worker and kept.
        ``required`` (storage is to be placed): no SystemConfiguration is a StorageError that
        says so, not a compute node that no rabbit serves."""
        cached = self.rabbits
        if cached is not None and cached.covers(hosts):
            return cached
        config = yield call(self.kube.read_system_configuration, what=what)
        if config is None and required:
            raise StorageError(
                "no SystemConfiguration 'default' yet: DWS has not said which rabbit "
                "serves which compute node"
            )
        self.rabbits = layout = compute_layout(config)
        return layout

    def forget(self, jobid: int) -> None:
        """The service forgets the job: so does everything kept for it here."""
        self.attempts.forget(jobid)

    def workflow_name(self, seen: Seen) -> str:
        return seen.workflow.name if seen.workflow else self.kube.workflow_name(seen.job.jobid)


def primary_group(userid: int) -> int | str:
    """The primary gid of ``userid`` from the passwd database, or why it cannot be had.

    May block (NSS, LDAP): call it on a worker thread, never on the loop.
    """
    try:
        return pwd.getpwuid(userid).pw_gid
    except KeyError:
        return f"uid {userid} has no passwd entry, so its primary group is unknown"
    except (OverflowError, TypeError, ValueError) as exc:
        return f"uid {userid} is not a valid user id ({exc})"
    except OSError as exc:  # NSS trouble (e.g. an LDAP server down)
        return f"looking up uid {userid} failed: {exc}"


class _Steps:
    """One handler in flight: each step carried out, its answer sent back in."""

    __slots__ = ("x", "gen", "seen", "action", "settle")

    def __init__(
        self,
        x: ActionExecutor,
        gen: Generator[Step, Any, Outcome],
        seen: Seen,
        action: Any,
        settle: Settle,
    ) -> None:
        self.x, self.gen, self.seen, self.action, self.settle = x, gen, seen, action, settle

    def advance(self, value: Any, thrown: BaseException | None, what: str) -> None:
        try:
            step = self.gen.throw(thrown) if thrown is not None else self.gen.send(value)
        except StopIteration as stop:
            self.settle(stop.value if stop.value is not None else DONE)
            return
        except Exception as exc:
            # the call's own error, not caught by the handler; else the handler's bug
            mine = exc is not thrown
            self.settle(self.x._bug(self.seen, self.action, exc) if mine else outcome_of(exc, what))
            return
        self.start(step)

    def start(self, step: Step) -> None:
        if isinstance(step, Call):
            self._call(step)
        elif isinstance(step, Rpc):
            self._rpc(step)
        elif isinstance(step, Wait):
            step.start(lambda value: self.advance(value, None, ""))
        else:
            self.advance(None, TypeError(f"not a step: {step!r}"), "")

    def _call(self, step: Call) -> None:
        detached, jobid = step.detached, self.seen.job.jobid

        def answered(result: Any, exc: BaseException | None) -> None:
            if detached is None:
                self.advance(result, exc, step.what)
            else:
                self.x.report(jobid, detached(result, exc))

        try:
            self.x.worker.submit(
                step.fn,
                *step.args,
                on_done=answered,
                urgent=step.lane == "urgent",
                soon=step.lane == "soon",
                **step.kwargs,
            )
        except RuntimeError as exc:  # the service stopped while the handler waited
            self.advance(None, exc, step.what)
            return
        if detached is not None:
            self.advance(None, None, "")

    def _rpc(self, step: Rpc) -> None:
        jobid = self.seen.job.jobid

        def failed(error: Any) -> bool:
            if error is None:
                return False
            if getattr(error, "errnum", None) in SETTLED_ERRNOS:
                log.debug("job %s: %s already settled: %s", f58(jobid), step.what, error)
                return False
            return True

        if step.detached is None:
            step.start(
                lambda response, error: self.advance(
                    None if failed(error) else response,
                    error if failed(error) else None,
                    step.what,
                )
            )
            return
        detached = step.detached

        def later(_response: Any, error: Any) -> None:
            outcome = detached(f"{step.what}: {error}" if failed(error) else None)
            if outcome is not None:
                self.x.report(jobid, outcome)

        step.start(later)
        self.advance(None, None, "")


__all__ = ["RECORD_ATTEMPTS", "ActionExecutor"]
