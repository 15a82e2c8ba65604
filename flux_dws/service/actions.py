# SPDX-License-Identifier: LGPL-3.0-only
"""What each lifecycle action does: the service's hands.

The event loop (flux_dws.service.service) decides; this module executes one action of a job's
chain and reports how it ended through ``done``: None (go on), a one-line error (retry later)
or HALT (the job was failed here; decide again).  Kubernetes calls run on the worker pool
and hand their results back to the loop; job-manager requests are asynchronous RPCs.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from flux_dws.base.loop import Timer
from flux_dws.base.sanitize import one_line
from flux_dws.core import lifecycle as lc
from flux_dws.core.health import Failures, mount_failures, setup_failures
from flux_dws.core.jobenv import TOKEN_VARIABLE, token_value_problem
from flux_dws.core.jobspec import min_allocations
from flux_dws.core.lifecycle import ProposalInfo
from flux_dws.core.request import DwRequest
from flux_dws.core.states import State
from flux_dws.core.storage import StorageError, needs_from_breakdowns, plan_servers, rabbit_map
from flux_dws.core.workflow import WorkflowView, view_workflow
from flux_dws.flux.jobmanager import SETTLED_ERRNOS
from flux_dws.flux.transport import RpcError
from flux_dws.k8s import WorkflowRejected
from flux_dws.k8s.resources import container_timeouts
from flux_dws.service.failures import RETRY_MAX as RETRY_MAX  # re-exported for the service
from flux_dws.service.failures import RETRY_MIN, FailureRules, primary_group
from flux_dws.service.failures import _error_text as _error_text  # and for record_actions

log = logging.getLogger("flux-dws")


class Halt:
    """What an action reports when it ended the job's chain on purpose (it failed the job):
    the rest of the chain was decided for a job that no longer exists as such."""


HALT = Halt()
#: An action's outcome: None (go on), a one-line error (retry later), or HALT (decide again).
Done = Callable[[Union[str, Halt, None]], None]


@dataclass
class Tracked:
    """What the service knows about one job (or one orphaned workflow)."""

    jobid: int
    record: dict[str, Any] | None = None
    workflow: WorkflowView | None = None
    raw: dict[str, Any] | None = None
    proposal: ProposalInfo | None = None
    failures: Failures | None = None  # which nodes failed Setup/PreRun (lc.ReadFailures)
    request: tuple[DwRequest | None, str] | None = None  # parsed once: attributes never change
    deleted: str = ""  # uid of the workflow already deleted (its DELETED event may lag)
    posting: dict[str, dict[str, Any]] = field(default_factory=dict)  # events not yet answered
    busy: bool = False  # an action chain is in flight
    dirty: bool = False  # something changed while busy: decide again after
    timer: Timer | None = None
    retry: float = 0.0
    observed: float = 0.0  # monotonic time of the last observation (job record or workflow)
    failing_since: float | None = None  # loop time a chain's call first failed (transient)
    patch_failing_since: float | None = None  # the same for desiredState patches
    async_retry: float = 0.0  # backoff of the calls sent outside the chain (patches, posts)
    unreadable: str = ""  # why the latest version of the workflow could not be read
    alarmed: str = ""  # the unreadable problem already reported


class ActionRunner(FailureRules):
    """The ``_do_<Action>`` handlers of the service, and the helpers they share.

    A mixin of Service: handlers read and update the service's tracked jobs and use its loop,
    worker, job manager and Kubernetes client.
    """

    def _kube_then(
        self,
        tracked: Tracked,
        what: str,
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
                self._call_failed(tracked, what, exc, done)
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
        if action.groupid < 0:
            found = primary_group(action.userid)
            if isinstance(found, str):
                self._fail_job(tracked, f"cannot set the workflow's groupID: {found}", done)
            else:  # found now: decide again with it
                self._gids[action.userid] = found
                done(HALT)
            return

        def created(obj: dict[str, Any] | None, exc: BaseException | None) -> None:
            self.loop.call_soon(settle, obj, exc)

        def settle(obj: dict[str, Any] | None, exc: BaseException | None) -> None:
            if isinstance(exc, WorkflowRejected):
                self._fail_job(tracked, f"DWS rejected the job's directives: {exc.message}", done)
            elif exc is not None:
                self._call_failed(tracked, "creating the job's workflow", exc, done)
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
                self._assign_nodes(wf.name, proposal, action.assign, action.rabbits)
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
                tracked.patch_failing_since, tracked.async_retry = None, 0.0
                adopt(result)
                return
            if tracked.workflow is asked:  # nothing newer came: back to what was known
                tracked.workflow = wf
            if isinstance(exc, StorageError):
                self._fail_job(
                    tracked, f"cannot place the job's storage: {exc}", self._retry_on_error(tracked)
                )
                return
            self._patch_failed(tracked, wf.name, action.state, exc)

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

    def _assign_nodes(
        self,
        name: str,
        proposal: ProposalInfo,
        hosts: Sequence[str],
        allocated: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Computes and Servers for the job's nodes (on a worker: reads, then writes).

        The rabbits are those Fluxion allocated, when the job's R names them; otherwise the
        SystemConfiguration's.  The storage plan comes first, so a job whose storage cannot
        be placed (StorageError) has nothing written for it.
        """
        rabbits: Mapping[str, str] = dict(allocated)
        if not rabbits:
            if self._rabbits is None or any(h not in self._rabbits for h in hosts):
                self._rabbits = rabbit_map(self.kube.read_system_configuration())
            rabbits = self._rabbits
        least = min_allocations(self.policy.storage_limits)
        plan = plan_servers(proposal.needs, hosts, rabbits, least)
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
                self._call_failed(tracked, "reading the Proposal", exc, done)
            else:
                tracked.proposal = result
                tracked.dirty = True
                done(None)

        self.worker.submit(read, on_done=store)

    def _fail_job(self, tracked: Tracked, note: str, done: Done) -> None:
        """A definitive failure found while acting: the job gets it as its exception, and
        the rest of the chain is dropped (the next decision sees the exception)."""
        log.error("job %d: %s", tracked.jobid, one_line(note))
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
            problem = token_value_problem(token, action.token_secret or ("?", "?"))
            if problem and (action.token_required or token):
                self._fail_job(tracked, f"PreRun: {problem}", done)
                return None
            if token:
                env[TOKEN_VARIABLE] = token
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
        self._kube_then(
            tracked, "reading the workflow token", sent, send, self.kube.read_token, namespace, name
        )

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
            one_line(action.note),
        )

        def raised(error: str | None) -> None:
            fatal = action.severity == 0
            if error is None and fatal and not (tracked.record or {}).get("exception"):
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
            if error is None:
                tracked.async_retry = 0.0
            if error is None or tracked.record is None:
                return
            log.warning(
                "job %d: posting %s failed: %s; will retry", tracked.jobid, action.name, error
            )  # with backoff: a post Flux refuses must not be sent again every half second
            dws = dict(tracked.record.get("dws") or {})
            if dws.get(action.name) is context:
                if before is None:
                    dws.pop(action.name)
                else:
                    dws[action.name] = before
                self._update_record(tracked, dws=dws)
            self._retry_later(tracked)

        self.jm.post(tracked.jobid, action.name, context, self._flux_done(posted, "post", tracked))
        done(None)

    def _do_DeleteWorkflow(self, tracked: Tracked, action: lc.DeleteWorkflow, done: Done) -> None:
        wf = tracked.workflow
        if wf is None:  # gone while the chain ran (the watch said so): nothing to delete
            done(None)
            return
        if tracked.deleted == wf.uid:  # done already; waiting for the watch to say so
            done(None)
            return
        log.info(
            "job %d: deleting workflow %s (%s)", tracked.jobid, wf.name, wf.desired_state.value
        )

        def deleted(_result: Any) -> None:
            tracked.deleted = wf.uid

        self._kube_then(
            tracked, "deleting the workflow", done, deleted, self.kube.delete_workflow, wf.name
        )

    # ------------------------------------------------------------------ health

    def _do_ReadFailures(self, tracked: Tracked, action: lc.ReadFailures, done: Done) -> None:
        wf, proposal = tracked.workflow, tracked.proposal
        assert wf is not None
        hosts = tuple((tracked.record or {}).get("hosts") or ())
        needs = proposal.needs if proposal is not None else ()

        def read() -> Failures:
            if action.state is State.PRERUN:
                return mount_failures(self.kube.list_clientmounts(wf.name, wf.namespace), hosts)
            if self._rabbits is None or any(h not in self._rabbits for h in hosts):
                self._rabbits = rabbit_map(self.kube.read_system_configuration())
            refs = sorted({n.servers for n in needs})
            servers = [self.kube.read_servers(ns, name) for ns, name in refs]
            return setup_failures(servers, self._rabbits, hosts)

        def store(result: Failures) -> str | None:
            log.warning(
                "job %d workflow %s: %s failed on node(s) %s",
                tracked.jobid,
                wf.name,
                result.state,
                ", ".join(result.nodes) or "(none identified)",
            )
            tracked.failures = result
            tracked.dirty = True
            return None

        self._kube_then(tracked, "reading the failed nodes", done, store, read)

    def _do_DrainNodes(self, tracked: Tracked, action: lc.DrainNodes, done: Done) -> None:
        health = getattr(self, "health", None)
        if health is None:
            log.warning(
                "job %d: would drain %s (%s), but this service cannot drain nodes",
                tracked.jobid,
                ",".join(action.hosts),
                action.reason,
            )
            done(None)
            return
        health.drain_for_job(action.hosts, action.reason, lambda e: done(e and f"drain: {e}"))

    def _do_ForceReady(self, tracked: Tracked, action: lc.ForceReady, done: Done) -> None:
        wf = tracked.workflow
        assert wf is not None
        log.info(
            "job %d workflow %s: forcing %s ready without the failed nodes; Computes: %s",
            tracked.jobid,
            wf.name,
            wf.desired_state.value,
            ",".join(action.computes),
        )

        def force() -> Any:
            self.kube.patch_computes(wf.name, list(action.computes))
            return self.kube.force_ready(wf.name)

        self._kube_then(
            tracked, "forcing the state ready", done, self._adopt(tracked), force, urgent=True
        )

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
        """The owner's primary group for the workflow's groupID (never from user input);
        -1 when it cannot be found (the create then fails the job).  Only found groups are
        cached: a lookup that failed (say, the directory service was down) is tried again."""
        gid = self._gids.get(userid)
        if gid is None:
            found = primary_group(userid)
            if isinstance(found, str):
                return -1
            gid = self._gids[userid] = found
        return gid


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", "?"))


def _rv(version: Any) -> int:
    """A resourceVersion (parsed or raw) as a number, to order versions (0 if it has none)."""
    try:
        return int(version or 0)
    except (TypeError, ValueError):
        return 0
