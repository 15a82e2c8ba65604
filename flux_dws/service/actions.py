# SPDX-License-Identifier: LGPL-3.0-only
"""What each workflow and job action does: one handler per lifecycle action.

Each handler is ``handler(x, action, seen)``: ``x`` the ActionExecutor (the service's parts,
flux_dws.service.executor), ``seen`` the inputs the decision was made from
(flux_dws.service.jobs.Seen).  It yields the steps it needs (flux_dws.service.outcome) and
returns one outcome; it neither fails the job nor writes its facts.
flux_dws.service.dispatch maps every action type to its handler.  The record actions
(copies, container output) are in flux_dws.service.recording, the early release's in
flux_dws.service.release.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Generator, Mapping, Sequence
from typing import Any, Callable

from flux_dws.base import untrusted
from flux_dws.base.hostlist import encode_hostlist
from flux_dws.base.jobid import f58
from flux_dws.base.untrusted import name_of
from flux_dws.core import actions as act
from flux_dws.core.failing import Refusal
from flux_dws.core.health import Failures, mount_failures, setup_failures, unmount_failures
from flux_dws.core.jobenv import TOKEN_VARIABLE, token_value_problem
from flux_dws.core.jobspec import min_allocations
from flux_dws.core.jobview import ProposalInfo
from flux_dws.core.persistent import persistent_names
from flux_dws.core.rabbits import servers_awaiting_nnf
from flux_dws.core.states import State
from flux_dws.core.storage import ComputeLayout, StorageError, needs_from_breakdowns, plan_servers
from flux_dws.flux.jobmanager import SETTLED_ERRNOS
from flux_dws.k8s import KubeClient, KubeError, WorkflowRejected
from flux_dws.k8s.resources import container_timeouts
from flux_dws.service.executor import ActionExecutor
from flux_dws.service.jobs import Seen
from flux_dws.service.outcome import (
    DONE,
    Adopted,
    AskAnswered,
    Asking,
    Delivered,
    FailuresRead,
    Learned,
    Outcome,
    Posted,
    ProposalRead,
    RecordChanged,
    Refused,
    Retry,
    Rpc,
    Step,
    Unposted,
    Wait,
    WorkflowDeleted,
    call,
    error_text,
    outcome_of,
)

log = logging.getLogger("flux-dws")

Steps = Generator[Step, Any, Outcome]


def create_workflow(x: ActionExecutor, action: act.CreateWorkflow, seen: Seen) -> Steps:
    waited = yield from _inputs_of_create(x, action)
    if waited is not None:
        return waited
    try:
        obj = yield call(
            x.kube.create_workflow,
            what="creating the job's workflow",
            jobid=seen.job.jobid,
            userid=action.userid,
            groupid=action.groupid,
            directives=list(action.directives),
        )
    except WorkflowRejected as exc:
        return Refused(Refusal(f"DWS rejected the job's directives: {exc.message}"))
    log.info("job %s: created workflow %s in Proposal", f58(seen.job.jobid), name_of(obj))
    return Learned((Adopted(obj, created=True),))


def _inputs_of_create(
    x: ActionExecutor, action: act.CreateWorkflow
) -> Generator[Step, Any, Outcome | None]:
    """None when the workflow can be created now; else the outcome: the owner's group or the
    persistent storage was waited for (decide again with it), or the job may not have it."""
    if action.groupid < 0:  # not known yet: look it up on a worker (NSS may block)
        gid = yield Wait(lambda answer: x.look_up_group(action.userid, answer))
        if isinstance(gid, int):
            return Learned(again=True)  # decide again with it
        return Refused(Refusal(f"cannot set the workflow's groupID: {gid}", step=""))
    # The plugin checks persistentdw at submit when it has the service's snapshot; a job
    # submitted without one fails here, before its workflow, in the same words.
    persistent = x.persistent
    if persistent is None:
        return None
    if not persistent.ready() and any(persistent_names(d) for d in action.directives):
        yield Wait(lambda answer: persistent.when_ready(lambda: answer(None)))
        return Learned(again=True)  # decided again once the storage is listed
    refused = persistent.refusal(action.directives, action.userid)
    if refused is None:
        return None
    directive, why = refused
    return Refused(Refusal(why, state=State.PROPOSAL, directive=directive, step=""))


def set_desired_state(x: ActionExecutor, action: act.SetDesiredState, seen: Seen) -> Steps:
    """Place the storage (for Setup), then send the writes and the patch, and go on at once:
    DWS often reports the new state (watch) before the patch's own answer is read, and the
    job must not sit busy meanwhile.  The view says it was asked until the answer comes
    (not settled, so nothing advances on it)."""
    name = x.workflow_name(seen)
    try:
        plan, notes, allocated = yield from _place(x, seen, action)
    except StorageError as exc:
        return Refused(Refusal(f"cannot place the job's storage: {exc}", state=action.state))
    _log_asking(seen, name, action)
    wf = seen.workflow
    asked = dataclasses.replace(wf, desired_state=action.state, hurry=action.hurry) if wf else None
    asking = Asking(asked, wf)
    yield call(
        _assign_and_ask,
        *(x.kube, name, action, plan, notes),
        what=f"asking for {action.state.value}",
        lane="urgent",
        detached=_asked(x, seen, action, asking, plan, allocated),
    )
    return Learned((asking,))


def _asked(
    x: ActionExecutor,
    seen: Seen,
    action: act.SetDesiredState,
    asking: Asking,
    plan: Mapping,
    allocated: Mapping[str, str],
) -> Callable[[Any, BaseException | None], Outcome]:
    """What the patch's answer reports, on the loop."""
    jobid, what = seen.job.jobid, f"asking for {action.state.value}"

    def answered(result: Any, exc: BaseException | None) -> Outcome:
        x.placements.settle(plan, exc is None)
        if exc is not None:
            undo = AskAnswered(asking)
            if isinstance(exc, KubeError) and exc.status == 404:  # gone: the watch says so
                return Retry(f"{what}: {error_text(exc)}", facts=(undo,))
            failed = outcome_of(exc, what)
            assert isinstance(failed, Retry)
            return Retry(failed.why, failed.failure, (undo,))
        obj, sent_at = result
        if seen.observed:
            x.metrics.reactions.append((action.state, sent_at - seen.observed))
        if allocated:  # the rabbits the job got, on the job for flux jobs -o
            memo = {"rabbits": encode_hostlist(sorted(set(allocated.values())))}
            x.jm.memo(jobid, memo, _memo_answered(jobid))
        return Learned((AskAnswered(asking, obj),))

    return answered


def _memo_answered(jobid: int) -> Callable[[Any, Any], None]:
    """A memo that did not land is only a lost annotation: said, never retried."""

    def answered(_response: Any, error: Any) -> None:
        if error is not None and getattr(error, "errnum", None) not in SETTLED_ERRNOS:
            log.warning("job %s: the rabbits memo was not set: %s", f58(jobid), error)

    return answered


def _log_asking(seen: Seen, name: str, action: act.SetDesiredState) -> None:
    wf = seen.workflow
    log.info(
        "job %s workflow %s: %s -> %s%s",
        f58(seen.job.jobid),
        name,
        wf.desired_state.value if wf is not None else "(unreadable)",
        action.state.value,
        " (hurry)" if action.hurry else "",
    )


def _place(x: ActionExecutor, seen: Seen, action: act.SetDesiredState):
    """Where the job's storage goes: the plan (on the loop, with the pure planner), each
    Servers' annotations, and the rabbit of each node (nothing without ``assign``).

    The rabbits are those Fluxion allocated, when the job's R names them; otherwise the
    SystemConfiguration's, with its externalComputeNodes (no rabbit; Lustre only).  Sets with
    an exclusive colocation key keep off the rabbits where other Servers hold it
    (flux_dws.service.placements).  A StorageError says it cannot be placed."""
    proposal = seen.job.proposal
    # No view at all: a workflow never read well, sent to Teardown past its deadline by name.
    assert (seen.workflow is not None and proposal is not None) or not action.assign
    if not action.assign or proposal is None:
        return {}, {}, {}
    layout = ComputeLayout(dict(action.rabbits))  # those Fluxion allocated, if any
    # A job with no allocation sets (#DW container, test-driver directives) needs no rabbit.
    if not layout.rabbits and proposal.needs:
        layout = yield from x.layout(action.assign, f"asking for {action.state.value}", True)
    listed: Sequence[Any] = ()
    if x.placements.must_list(proposal.needs):
        listed, _ = yield call(x.kube.list_servers, what="listing Servers")
    least = min_allocations(x.policy.storage_limits)

    def planner(taken: Mapping[str, frozenset[str]]) -> dict:
        needs, hosts = proposal.needs, action.assign
        return plan_servers(needs, hosts, layout.rabbits, least, layout.external, taken)

    plan, notes = x.placements.plan(proposal.needs, planner, listed)
    return plan, notes, dict(layout.rabbits)


def _assign_and_ask(
    kube: KubeClient,
    name: str,
    action: act.SetDesiredState,
    plan: Mapping[tuple[str, str], list],
    notes: Mapping[tuple[str, str], Any],
) -> tuple[Any, float]:
    """On a worker: Computes and Servers for the job's nodes (``action.assign``), then the
    state, in one go; returns the patched workflow and when the patch was sent."""
    if action.assign:
        kube.patch_computes(name, list(action.assign))
        for (namespace, server), sets in plan.items():
            servers = kube.patch_servers(server, namespace, sets, notes.get((namespace, server)))
            _await_nnf(kube, name, servers)
    sent_at = time.monotonic()
    return kube.set_desired_state(name, action.state, hurry=action.hurry), sent_at


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


def _read_proposal(kube: KubeClient, raw: Mapping[str, Any]) -> ProposalInfo:
    """On a worker: the storage needs of the breakdowns and the pinned profile's timeouts."""
    needs = needs_from_breakdowns(kube.read_breakdowns(raw))
    profile = kube.read_container_profile(raw)
    timeouts: dict[str, float] = {}
    if profile is not None:
        limits = container_timeouts(profile)
        timeouts = {"prerun": limits.prerun, "postrun": limits.postrun}
    return ProposalInfo(needs=needs, container_timeouts=timeouts)


def read_proposal(x: ActionExecutor, action: act.ReadProposal, seen: Seen) -> Steps:
    assert seen.raw is not None
    try:
        info = yield call(_read_proposal, x.kube, seen.raw, what="reading the Proposal")
    except StorageError as exc:
        return Refused(Refusal(f"cannot size the job's storage: {exc}"))
    return Learned((ProposalRead(info),))


def release_dependency(x: ActionExecutor, action: act.ReleaseDependency, seen: Seen) -> Steps:
    jobid = seen.job.jobid
    log.info("job %s: Proposal ready; releasing the job to the scheduler", f58(jobid))
    yield Rpc(lambda done: x.jm.release(jobid, action.jobspec_update, done), "release")
    return Learned((RecordChanged({"phase": "sched"}),))


def finish_prolog(x: ActionExecutor, action: act.FinishProlog, seen: Seen) -> Steps:
    jobid = seen.job.jobid
    if not action.success:
        yield Rpc(lambda done: x.jm.prolog_finish(jobid, False, {}, done), "prolog-finish")
        return Learned((RecordChanged({"phase": "epilog"}),))
    env = dict(action.env)
    token = None
    if action.token_secret is not None:
        namespace, name = action.token_secret
        token = yield call(x.kube.read_token, namespace, name, what="reading the workflow token")
    problem = token_value_problem(token, action.token_secret or ("?", "?"))
    if problem and (action.token_required or token):
        return Refused(Refusal(problem, state=State.PRERUN))
    if token:
        env[TOKEN_VARIABLE] = token
    log.info("job %s: PreRun ready; starting the job with %d variables", f58(jobid), len(env))
    yield Rpc(lambda done: x.jm.prolog_finish(jobid, True, env, done), "prolog-finish")
    return Learned((RecordChanged({"phase": "run", "started": True}),))


def finish_epilog(x: ActionExecutor, action: act.FinishEpilog, seen: Seen) -> Steps:
    jobid = seen.job.jobid
    log.info("job %s: workflow gone; finishing the epilog", f58(jobid))
    yield Rpc(lambda done: x.jm.epilog_finish(jobid, done), "epilog-finish")
    return Learned((RecordChanged({"phase": "gone"}),))


def raise_exception(x: ActionExecutor, action: act.RaiseException, seen: Seen) -> Steps:
    jobid = seen.job.jobid
    log.info(
        "job %s workflow %s: raising %s exception: %s",
        f58(jobid),
        x.workflow_name(seen),
        action.type,
        untrusted.text(action.note, None),
    )
    yield Rpc(
        lambda done: x.jm.raise_exception(jobid, action.type, action.severity, action.note, done),
        "raise",
    )
    if action.severity != 0:
        return DONE
    exception = {"type": action.type, "severity": action.severity, "note": action.note}
    return Learned((RecordChanged({"exception": exception}),))


def post_event(x: ActionExecutor, action: act.PostEvent, seen: Seen) -> Steps:
    """Post, and go on at once; with ``wait``, only once Flux has taken it (e.g. an abort's
    reason before Teardown is asked, or dws-release before DataOut).  Requests to the plugin
    are handled in the order sent, so the event lands before anything the chain asks next.
    The record takes the event now (``Posted``); a post Flux refuses is undone and the job
    decided again later, which posts anew."""
    jobid, context = seen.job.jobid, dict(action.context)

    def send(done: Any) -> None:
        x.jm.post(jobid, action.name, context, done)

    if not action.wait:
        yield Rpc(send, "post", detached=_post_answered(action.name, context))
        return Learned((Posted(action.name, context),))
    yield Rpc(send, "post")
    return Learned((Posted(action.name, context), Delivered(action.name, context)))


def _post_answered(name: str, context: Mapping[str, Any]) -> Any:
    """What a post sent without waiting reports when Flux answers it."""

    def answered(why: str | None) -> Outcome:
        if why is None:
            return Learned((Delivered(name, context),))
        return Retry(f"posting {name} failed: {why}", facts=(Unposted(name, context),))

    return answered


def delete_workflow(x: ActionExecutor, action: act.DeleteWorkflow, seen: Seen) -> Steps:
    jobid, wf = seen.job.jobid, seen.workflow
    if seen.unreadable and seen.raw is not None:  # past its deadline, deleted by name
        name = x.workflow_name(seen)
        log.info("job %s: deleting workflow %s (unreadable)", f58(jobid), name)
        yield call(x.kube.delete_workflow, name, None, what="deleting the workflow")
        return DONE
    if wf is None or seen.deleted == wf.uid:  # gone, or deleted: the watch will say so
        return DONE
    log.info("job %s: deleting workflow %s (%s)", f58(jobid), wf.name, wf.desired_state.value)
    meta = {"finalizers": list(wf.finalizers), "resourceVersion": wf.resource_version}
    yield call(x.kube.delete_workflow, wf.name, {"metadata": meta}, what="deleting the workflow")
    return Learned((WorkflowDeleted(wf.uid),))


def read_failures(x: ActionExecutor, action: act.ReadFailures, seen: Seen) -> Steps:
    wf, job = seen.workflow, seen.job
    assert wf is not None
    hosts = job.hosts
    what = "reading the failed nodes"
    if action.state is State.PRERUN:
        mounts = yield call(x.kube.list_clientmounts, wf.name, wf.namespace, what=what)
        result = mount_failures(mounts, hosts)
    elif action.state in (State.POSTRUN, State.TEARDOWN):  # early release; Teardown drain
        mounts = yield call(x.kube.list_clientmounts, wf.name, wf.namespace, what=what)
        result = unmount_failures(mounts, hosts, action.state.value)
    else:
        layout = yield from x.layout(hosts, what)
        needs = job.proposal.needs if job.proposal is not None else ()
        refs = sorted({n.servers for n in needs})
        servers = yield call(_read_all_servers, x.kube, refs, what=what)
        result = setup_failures(servers, layout.rabbits, hosts)
    _log_failures(job.jobid, wf.name, result)
    return Learned((FailuresRead(result),))


def _read_all_servers(kube: KubeClient, refs: Sequence[tuple[str, str]]) -> list:
    return [kube.read_servers(namespace, name) for namespace, name in refs]


def _log_failures(jobid: int, workflow: str, result: Failures) -> None:
    if result.state == State.POSTRUN.value and not result.nodes:
        log.info("job %s workflow %s: every ClientMount reads unmounted", f58(jobid), workflow)
        return
    log.warning(
        "job %s workflow %s: %s failed on node(s) %s",
        f58(jobid),
        workflow,
        result.state,
        ", ".join(result.nodes) or "(none identified)",
    )


def drain_nodes(x: ActionExecutor, action: act.DrainNodes, seen: Seen) -> Steps:
    health = x.health
    if health is None:
        log.warning(
            "job %s: would drain %s (%s), but this service cannot drain nodes",
            f58(seen.job.jobid),
            ",".join(action.hosts),
            action.reason,
        )
        return DONE
    error = yield Wait(lambda answer: health.drain_for_job(action.hosts, action.reason, answer))
    return Retry(f"drain: {error}") if error else DONE


def force_ready(x: ActionExecutor, action: act.ForceReady, seen: Seen) -> Steps:
    wf = seen.workflow
    assert wf is not None
    log.info(
        "job %s workflow %s: forcing %s ready without the failed nodes; Computes: %s",
        f58(seen.job.jobid),
        wf.name,
        wf.desired_state.value,
        ",".join(action.computes),
    )
    obj = yield call(
        _force, x.kube, wf.name, action.computes, what="forcing the state ready", lane="urgent"
    )
    return Learned((Adopted(obj),))


def _force(kube: KubeClient, name: str, computes: Sequence[str]) -> Any:
    kube.patch_computes(name, list(computes))
    return kube.force_ready(name)


__all__ = [
    "create_workflow",
    "delete_workflow",
    "drain_nodes",
    "finish_epilog",
    "finish_prolog",
    "force_ready",
    "post_event",
    "raise_exception",
    "read_failures",
    "read_proposal",
    "release_dependency",
    "set_desired_state",
]
