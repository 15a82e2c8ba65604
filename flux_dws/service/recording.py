# SPDX-License-Identifier: LGPL-3.0-only
"""The actions that put what happened to a job's data and containers on the job.

``RecordCopies``: read the workflow's NnfDataMovements (flux_dws.k8s.recordreads, from the
watched copy of flux_dws.k8s.recordcache once it has caught up with the workflow), post one
``dws-datamovement`` event per copy directive and fail the job when a copy failed.
``SaveOutput``: read the container pods and the tails of their logs, save them in the job's
KVS directory through the plugin's ``save`` method, then post ``dws-container``.

Neither may wedge a job: what Kubernetes refuses for good (RBAC, a pod already gone, a
container that never started) is written into the record as words; only transient failures
(API unreachable) end the chain with a Retry, and the service tries again later, up to
RECORD_ATTEMPTS failures in a row of the same read.  A plugin too old to ``save`` (ENOSYS)
or one that refuses the document is noted the same way.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Generator, Mapping
from typing import Any, Callable

from flux_dws.base.jobid import f58
from flux_dws.core import actions as act
from flux_dws.core.copies import EVENT, UNKNOWN, copy_error, copy_records, summary
from flux_dws.core.failing import Refusal
from flux_dws.core.output import OUTPUT_KEY, SavedOutput
from flux_dws.flux.transport import RpcError
from flux_dws.k8s import recordcache
from flux_dws.k8s.recordreads import collect_output, data_movements_or_why
from flux_dws.service.actions import post_event
from flux_dws.service.executor import ActionExecutor
from flux_dws.service.jobs import Seen
from flux_dws.service.outcome import (
    Call,
    Fact,
    Learned,
    Outcome,
    Refused,
    Retry,
    Rpc,
    Step,
    Wait,
    call,
    error_text,
)

log = logging.getLogger("flux-dws")

#: Plugin errors that say the output can never be saved this way (not worth a retry).
UNSAVABLE = frozenset({errno.ENOSYS, errno.EPROTO, errno.EINVAL, errno.ENOENT, errno.E2BIG})

Steps = Generator[Step, Any, Outcome]


def read_or_go_on(
    x: ActionExecutor, jobid: int, key: str, step: Call, fallback: Callable[[str], Any]
) -> Generator[Step, Any, Any]:
    """What ``step`` reads, or, when it failed: a Retry, until it has failed RECORD_ATTEMPTS
    times in a row (for this job and ``key``), then ``fallback(error)``: a record is worth a
    short wait, never a wedged job."""
    try:
        result = yield step
    except Exception as exc:
        text = error_text(exc)
        if not x.attempts.failed(jobid, key):
            return Retry(f"{step.what}: {text}")
        log.error("job %s: %s: %s; going on without it", f58(jobid), step.what, text)
        return fallback(text)
    x.attempts.succeeded(jobid, key)
    return result


def movements_of(x: ActionExecutor, seen: Seen, lane: str = "normal") -> Call:
    """The step that reads the workflow's NnfDataMovements (from the watched copy once it has
    caught up with the workflow, flux_dws.k8s.recordcache)."""
    wf = seen.workflow
    assert wf is not None
    cache = x.records.movements if x.records is not None else None
    args = (x.kube, wf.name, wf.namespace, cache, wf.resource_version)
    return call(data_movements_or_why, *args, what="reading data movements", lane=lane)


def no_movements(text: str) -> tuple[list, str]:
    return [], f"could not read the NnfDataMovements: {text}"


def record_copies(x: ActionExecutor, action: act.RecordCopies, seen: Seen) -> Steps:
    wf, jobid = seen.workflow, seen.job.jobid
    assert wf is not None
    step = movements_of(x, seen, lane="soon")  # soon: the next state waits for it
    read = yield from read_or_go_on(x, jobid, f"copies {action.state.value}", step, no_movements)
    if isinstance(read, Retry):
        return read
    objects, problem = read
    records = copy_records(action.state, wf.directives, objects, problem=problem)
    records = [r for r in records if r.index in action.indices]
    facts: list[Fact] = []
    for record in records:
        log.info("job %s workflow %s: %s", f58(jobid), wf.name, _copy_line(action, record))
        posted = yield from post_event(x, act.PostEvent(EVENT, record.to_event()), seen)
        facts += posted.facts
    return _copies_outcome(seen, records, facts)


def _copy_line(action: act.RecordCopies, record: Any) -> str:
    return f"{action.state.value} directive {record.index}: {summary(record)}"


def _copies_outcome(seen: Seen, records: list, facts: list[Fact]) -> Outcome:
    """A failed copy fails the job, naming the directive and its first error; Unknown
    (nothing found) fails nothing: the workflow's own message says more."""
    failed = next((r for r in records if r.failed and r.status != UNKNOWN), None)
    if failed is not None and seen.job.exception is None:
        refusal = Refusal(copy_error(failed), state=failed.state, directive=failed.directive)
        return Refused(refusal, tuple(facts))
    return Learned(tuple(facts))


def save_output(x: ActionExecutor, action: act.SaveOutput, seen: Seen) -> Steps:
    wf, jobid = seen.workflow, seen.job.jobid
    assert wf is not None
    saved = yield from _collect(x, seen)
    if isinstance(saved, Retry):
        return saved
    problem = yield from _save(x, jobid, saved)
    if isinstance(problem, Retry):
        return problem
    context = {**action.event, **saved.event_summary()}
    if problem:
        context["output"] = problem
    _log_output(jobid, wf.name, context, saved)
    return (yield from post_event(x, act.PostEvent("dws-container", context), seen))


def _collect(x: ActionExecutor, seen: Seen) -> Generator[Step, Any, Any]:
    """The containers' exit codes and log tails (or why there are none), or a Retry."""
    wf, limit = seen.workflow, x.policy.container_log_size
    assert wf is not None
    cache = x.records.pods if x.records is not None else None
    if cache is not None and wf.namespace == x.kube.namespace:
        # The pod watch must reach the workflow's version (recordcache), for CATCH_UP at most,
        # waited for holding no thread (catch_up=0 below: behind, it lists).
        yield Wait(lambda answer: _when_current(x, cache, wf.resource_version, answer))
    # Soon: the job's Teardown waits for this (core.lifecycle); behind new jobs' creates and
    # reads it waited a quarter second at 1000 jobs (bench_service).
    args = (x.kube, wf.name, wf.namespace, limit, cache, wf.resource_version, 0.0)
    step = call(collect_output, *args, what="reading container output", lane="soon")

    def none(text: str) -> SavedOutput:
        return SavedOutput(note=f"no container output: {text}", limit=limit)

    return (yield from read_or_go_on(x, seen.job.jobid, "output", step, none))


def _save(x: ActionExecutor, jobid: int, saved: SavedOutput) -> Generator[Step, Any, Any]:
    """Save the output in the job's KVS: "" (saved, or nothing to keep), the words for an
    output that can never be saved, or a Retry."""
    if not saved.containers:  # nothing to keep: say why on the event alone
        return ""
    document = saved.to_json()
    try:
        yield Rpc(
            lambda done: x.jm.save(jobid, OUTPUT_KEY, document, done, limit=saved.text_limit),
            "save",
        )
    except RpcError as error:
        if error.errnum not in UNSAVABLE and not x.attempts.failed(jobid, "save"):
            return Retry(f"save: {error}")
        x.attempts.succeeded(jobid, "save")
        return f"not saved: {error.message}"
    x.attempts.succeeded(jobid, "save")
    return ""


def _log_output(jobid: int, workflow: str, context: Mapping[str, Any], saved: SavedOutput) -> None:
    codes = ", ".join(
        f"{c.status.pod}/{c.status.name}={c.status.exit_code}" for c in saved.containers
    )
    log.info(
        "job %s workflow %s: container output: %s%s",
        f58(jobid),
        workflow,
        context["output"],
        f" (exit codes {codes})" if codes else "",
    )


def _when_current(x: ActionExecutor, cache: Any, version: str, answer: Any) -> None:
    """``answer()`` once the pod watch has reached ``version``, or CATCH_UP has passed."""
    answered = False

    def once() -> None:
        nonlocal answered
        if not answered:
            answered = True
            timer.cancel()
            answer(None)

    timer = x.loop.call_later(recordcache.CATCH_UP, once)
    cache.when_current(version, lambda: x.loop.call_soon(once))
