# SPDX-License-Identifier: LGPL-3.0-only
"""What each workflow and job action does: one handler per lifecycle action.

Each handler is ``handler(x, tracked, action, seen, done)``: ``x`` is the ActionExecutor (the
service's hands, flux_dws.service.executor), ``seen`` the inputs the decision was made from
(flux_dws.service.jobs.Seen), ``done`` how the action ended.  flux_dws.service.dispatch maps
every action type to its handler.  The record actions (copies, container output) are in
flux_dws.service.recording.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.hostlist import encode_hostlist
from flux_dws.base.jobid import f58
from flux_dws.base.untrusted import name_of
from flux_dws.core import actions as act
from flux_dws.core.health import Failures, mount_failures, setup_failures, unmount_failures
from flux_dws.core.jobenv import TOKEN_VARIABLE, token_value_problem
from flux_dws.core.jobspec import min_allocations
from flux_dws.core.jobview import ProposalInfo
from flux_dws.core.persistent import persistent_names
from flux_dws.core.rabbits import servers_awaiting_nnf
from flux_dws.core.states import State
from flux_dws.core.storage import ComputeLayout, StorageError, needs_from_breakdowns, plan_servers
from flux_dws.k8s import KubeClient, WorkflowRejected
from flux_dws.k8s.resources import container_timeouts
from flux_dws.service.executor import ActionExecutor
from flux_dws.service.jobs import HALT, Done, Seen, Tracked

log = logging.getLogger("flux-dws")


def create_workflow(
    x: ActionExecutor, tracked: Tracked, action: act.CreateWorkflow, seen: Seen, done: Done
) -> None:
    jobid = tracked.jobid
    if action.groupid < 0:  # not known yet: look it up on a worker (NSS may block)

        def found(gid: int | str) -> None:
            if isinstance(gid, int):
                done(HALT)  # decide again with it
            else:
                x.fail_job(tracked, f"cannot set the workflow's groupID: {gid}", done, step="")

        x.look_up_group(action.userid, found)
        return
    # The plugin checks persistentdw at submit when it has the service's snapshot; a job
    # submitted without one fails here, before its workflow, in the same words.
    persistent = x.persistent
    waiting = persistent is not None and not persistent.ready()
    if waiting and any(persistent_names(d) for d in action.directives):
        assert persistent is not None
        persistent.when_ready(lambda: done(HALT))  # decided again once the storage is listed
        return
    refused = persistent.refusal(action.directives, action.userid) if persistent else None
    if refused is not None:
        directive, why = refused
        x.fail_job(tracked, why, done, state=State.PROPOSAL, directive=directive, step="")
        return

    def settle(obj: dict[str, Any] | None, exc: BaseException | None) -> None:
        if isinstance(exc, WorkflowRejected):
            x.fail_job(tracked, f"DWS rejected the job's directives: {exc.message}", done)
        elif exc is not None:
            x.call_failed(tracked, "creating the job's workflow", exc, done)
        else:
            assert obj is not None
            x.adopt(tracked, created=True)(obj)
            log.info("job %s: created workflow %s in Proposal", f58(jobid), name_of(obj))
            done(None)

    x.worker.submit(
        x.kube.create_workflow,
        jobid=jobid,
        userid=action.userid,
        groupid=action.groupid,
        directives=list(action.directives),
        on_done=settle,
    )


def set_desired_state(
    x: ActionExecutor, tracked: Tracked, action: act.SetDesiredState, seen: Seen, done: Done
) -> None:
    wf, proposal = seen.workflow, seen.job.proposal
    # No view at all: a workflow never read well, sent to Teardown past its deadline by name.
    assert (wf is not None or not action.assign) and (proposal is not None or not action.assign)
    name = wf.name if wf is not None else x.workflow_name(tracked)
    observed = seen.observed
    # A job with no allocation sets (#DW container, test-driver directives) needs no rabbit.
    placing = bool(action.assign and proposal and proposal.needs and not action.rabbits)
    rabbits = x.rabbits_for(action.assign, required=True) if placing else None
    sent: dict[str, Any] = {}  # written on the worker before the patch, read after delivery

    def patch() -> Any:
        if action.assign:  # one worker job: the state change follows without a loop trip
            assert proposal is not None
            layout = ComputeLayout(dict(action.rabbits))  # those Fluxion allocated, if any
            if not layout.rabbits and rabbits is not None:
                layout = sent["rabbits"] = rabbits()
            allocated = dict(layout.rabbits)
            _assign_nodes(x, name, proposal, action.assign, layout)
            sent["allocated"] = allocated
        sent["at"] = time.monotonic()
        return x.kube.set_desired_state(name, action.state, hurry=action.hurry)

    # Take the patch as done in the cached view and end the chain now: DWS often reports
    # the new state (watch) before this worker has read the patch's own response, and the
    # job must not sit busy meanwhile.  The view is not settled, so nothing advances on it.
    asked = None
    if wf is not None:
        asked = dataclasses.replace(wf, desired_state=action.state, hurry=action.hurry)
        tracked.workflow = asked
    adopt = x.adopt(tracked)

    def settle(result: Any, exc: BaseException | None) -> None:
        x.keep_rabbits(sent.get("rabbits"))
        if observed and "at" in sent:
            x.metrics.reactions.append((action.state, sent["at"] - observed))
        if exc is None:
            tracked.patch_failing_since, tracked.async_retry = None, 0.0
            if sent.get("allocated"):  # the rabbits the job got, on the job for flux jobs -o
                memo = {"rabbits": encode_hostlist(sorted(set(sent["allocated"].values())))}
                x.jm.memo(tracked.jobid, memo, x.flux_done(_memo_done(tracked), "memo", tracked))
            adopt(result)
            return
        if asked is not None and tracked.workflow is asked:  # nothing newer came: as known
            tracked.workflow = wf
        if isinstance(exc, StorageError):
            note = f"cannot place the job's storage: {exc}"
            x.fail_job(tracked, note, x.retry_on_error(tracked), state=action.state)
            return
        x.patch_failed(tracked, name, f"asking for {action.state.value}", exc)

    x.worker.submit(patch, on_done=settle, urgent=True)
    # Logged once the patch is handed over: writing the line may let other threads run.
    log.info(
        "job %s workflow %s: %s -> %s%s",
        f58(tracked.jobid),
        name,
        wf.desired_state.value if wf is not None else "(unreadable)",
        action.state.value,
        " (hurry)" if action.hurry else "",
    )
    done(None)


def _assign_nodes(
    x: ActionExecutor,
    name: str,
    proposal: ProposalInfo,
    hosts: Sequence[str],
    layout: ComputeLayout,
) -> None:
    """Computes and Servers for the job's nodes (on a worker).

    The rabbits are those Fluxion allocated, when the job's R names them; otherwise the
    SystemConfiguration's, with its externalComputeNodes (no rabbit; Lustre only).  The storage
    plan comes first, so a job whose storage cannot be placed (StorageError) has nothing written
    for it.  Sets with an exclusive colocation key keep off the rabbits where other Servers
    hold it (flux_dws.service.placements).
    """
    least = min_allocations(x.policy.storage_limits)

    def planner(taken: Mapping[str, frozenset[str]]) -> dict:
        needs, rabbits = proposal.needs, layout.rabbits
        return plan_servers(needs, hosts, rabbits, least, layout.external, taken)

    plan, notes = x.placements.plan(proposal.needs, planner)
    written = False
    try:
        x.kube.patch_computes(name, list(hosts))
        patched = [
            x.kube.patch_servers(server, namespace, sets, notes.get((namespace, server)))
            for (namespace, server), sets in plan.items()
        ]
        written = True
    finally:
        x.placements.settle(plan, written)
    for servers in patched:
        _await_nnf(x.kube, name, servers)


#: How long Setup waits for nnf-sos to show it has read a Servers' new spec, polling from
#: NNF_POLL doubling: a cache is milliseconds behind, so the bound is only for a stalled one.
NNF_WAIT = 5.0
NNF_POLL = 0.02


def _await_nnf(kube: KubeClient, workflow: str, servers: dict) -> None:
    """Wait (bounded) until nnf-sos's cache has the Servers' spec (core.rabbits.
    servers_awaiting_nnf): asked for earlier, its Setup can fail the job on the old spec."""
    deadline = time.monotonic() + NNF_WAIT
    delay = NNF_POLL
    meta = untrusted.mapping(servers.get("metadata"))
    namespace, name = untrusted.field(meta.get("namespace")), untrusted.field(meta.get("name"))
    while servers_awaiting_nnf(servers):
        if time.monotonic() + delay > deadline:
            log.warning(
                "workflow %s: nnf-sos has not shown it read Servers %s/%s within %gs;"
                " asking for Setup anyway",
                workflow,
                namespace,
                name,
                NNF_WAIT,
            )
            return
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
        servers = kube.read_servers(namespace, name) or {}


def read_proposal(
    x: ActionExecutor, tracked: Tracked, action: act.ReadProposal, seen: Seen, done: Done
) -> None:
    raw = seen.raw
    assert raw is not None

    def read() -> ProposalInfo:
        needs = needs_from_breakdowns(x.kube.read_breakdowns(raw))
        profile = x.kube.read_container_profile(raw)
        timeouts: dict[str, float] = {}
        if profile is not None:
            limits = container_timeouts(profile)
            timeouts = {"prerun": limits.prerun, "postrun": limits.postrun}
        return ProposalInfo(needs=needs, container_timeouts=timeouts)

    def settle(result: Any, exc: BaseException | None) -> None:
        if isinstance(exc, StorageError):
            x.fail_job(tracked, f"cannot size the job's storage: {exc}", done)
        elif exc is not None:
            x.call_failed(tracked, "reading the Proposal", exc, done)
        else:
            tracked.proposal = result
            tracked.dirty = True
            done(None)

    x.worker.submit(read, on_done=settle)


def release_dependency(
    x: ActionExecutor, tracked: Tracked, action: act.ReleaseDependency, seen: Seen, done: Done
) -> None:
    log.info("job %s: Proposal ready; releasing the job to the scheduler", f58(tracked.jobid))
    finished = x.then_record(tracked, done, phase="sched")
    x.jm.release(tracked.jobid, action.jobspec_update, x.flux_done(finished, "release", tracked))


def finish_prolog(
    x: ActionExecutor, tracked: Tracked, action: act.FinishProlog, seen: Seen, done: Done
) -> None:
    jobid = tracked.jobid
    if action.success:
        finished = x.then_record(tracked, done, phase="run", started=True)
    else:
        finished = x.then_record(tracked, done, phase="epilog")
    on_done = x.flux_done(finished, "prolog-finish", tracked)
    if not action.success:
        x.jm.prolog_finish(jobid, False, {}, on_done)
        return
    env = dict(action.env)

    def send(token: str | None) -> str | None:
        problem = token_value_problem(token, action.token_secret or ("?", "?"))
        if problem and (action.token_required or token):
            x.fail_job(tracked, problem, done, state=State.PRERUN)
            return None
        if token:
            env[TOKEN_VARIABLE] = token
        log.info("job %s: PreRun ready; starting the job with %d variables", f58(jobid), len(env))
        x.jm.prolog_finish(jobid, True, env, on_done)
        return None

    if action.token_secret is None:
        send(None)
        return

    def sent(error: Any) -> None:
        if error is not None:
            done(error)

    namespace, name = action.token_secret
    x.call(tracked, "reading the workflow token", sent, send, x.kube.read_token, namespace, name)


def finish_epilog(
    x: ActionExecutor, tracked: Tracked, action: act.FinishEpilog, seen: Seen, done: Done
) -> None:
    log.info("job %s: workflow gone; finishing the epilog", f58(tracked.jobid))
    finished = x.then_record(tracked, done, phase="gone")
    x.jm.epilog_finish(tracked.jobid, x.flux_done(finished, "epilog-finish", tracked))


def raise_exception(
    x: ActionExecutor, tracked: Tracked, action: act.RaiseException, seen: Seen, done: Done
) -> None:
    x.raise_exception(tracked, action, done)


def post_event(
    x: ActionExecutor, tracked: Tracked, action: act.PostEvent, seen: Seen, done: Done
) -> None:
    x.post_event(tracked, action, done)


def delete_workflow(
    x: ActionExecutor, tracked: Tracked, action: act.DeleteWorkflow, seen: Seen, done: Done
) -> None:
    wf = tracked.workflow
    if tracked.unreadable and tracked.raw is not None:  # past its deadline, deleted by name
        name = x.workflow_name(tracked)
        log.info("job %s: deleting workflow %s (unreadable)", f58(tracked.jobid), name)
        x.call(tracked, "deleting the workflow", done, None, x.kube.delete_workflow, name, None)
        return
    if wf is None:  # gone while the chain ran (the watch said so): nothing to delete
        done(None)
        return
    if tracked.deleted == wf.uid:  # done already; waiting for the watch to say so
        done(None)
        return
    log.info(
        "job %s: deleting workflow %s (%s)", f58(tracked.jobid), wf.name, wf.desired_state.value
    )

    def deleted(_result: Any) -> None:
        tracked.deleted = wf.uid

    seen = {"metadata": {"finalizers": list(wf.finalizers), "resourceVersion": wf.resource_version}}
    x.call(tracked, "deleting the workflow", done, deleted, x.kube.delete_workflow, wf.name, seen)


def read_failures(
    x: ActionExecutor, tracked: Tracked, action: act.ReadFailures, seen: Seen, done: Done
) -> None:
    wf, job = seen.workflow, seen.job
    assert wf is not None
    hosts = job.hosts
    needs = job.proposal.needs if job.proposal is not None else ()
    rabbits = x.rabbits_for(hosts)
    used: dict[str, ComputeLayout] = {}  # written on the worker, read after delivery

    def read() -> Failures:
        if action.state is State.PRERUN:
            return mount_failures(x.kube.list_clientmounts(wf.name, wf.namespace), hosts)
        if action.state in (State.POSTRUN, State.TEARDOWN):  # early release; Teardown drain
            mounts = x.kube.list_clientmounts(wf.name, wf.namespace)
            return unmount_failures(mounts, hosts, action.state.value)
        used["rabbits"] = layout = rabbits()
        refs = sorted({n.servers for n in needs})
        servers = [x.kube.read_servers(ns, name) for ns, name in refs]
        return setup_failures(servers, layout.rabbits, hosts)

    def store(result: Failures) -> str | None:
        x.keep_rabbits(used.get("rabbits"))
        if result.state == State.POSTRUN.value and not result.nodes:
            log.info(
                "job %s workflow %s: every ClientMount reads unmounted", f58(tracked.jobid), wf.name
            )
            tracked.failures, tracked.dirty = result, True
            return None
        log.warning(
            "job %s workflow %s: %s failed on node(s) %s",
            f58(tracked.jobid),
            wf.name,
            result.state,
            ", ".join(result.nodes) or "(none identified)",
        )
        tracked.failures = result
        tracked.dirty = True
        return None

    x.call(tracked, "reading the failed nodes", done, store, read)


def drain_nodes(
    x: ActionExecutor, tracked: Tracked, action: act.DrainNodes, seen: Seen, done: Done
) -> None:
    if x.health is None:
        log.warning(
            "job %s: would drain %s (%s), but this service cannot drain nodes",
            f58(tracked.jobid),
            ",".join(action.hosts),
            action.reason,
        )
        done(None)
        return
    x.health.drain_for_job(action.hosts, action.reason, lambda e: done(e and f"drain: {e}"))


def force_ready(
    x: ActionExecutor, tracked: Tracked, action: act.ForceReady, seen: Seen, done: Done
) -> None:
    wf = seen.workflow
    assert wf is not None
    log.info(
        "job %s workflow %s: forcing %s ready without the failed nodes; Computes: %s",
        f58(tracked.jobid),
        wf.name,
        wf.desired_state.value,
        ",".join(action.computes),
    )

    def force() -> Any:
        x.kube.patch_computes(wf.name, list(action.computes))
        return x.kube.force_ready(wf.name)

    x.call(tracked, "forcing the state ready", done, x.adopt(tracked), force, urgent=True)


def _memo_done(tracked: Tracked) -> Done:
    """A memo that did not land is only a lost annotation: said, never retried."""

    def done(error: Any) -> None:
        if error is not None:
            log.warning("job %s: the rabbits memo was not set: %s", f58(tracked.jobid), error)

    return done
