# SPDX-License-Identifier: LGPL-3.0-only
"""The actions that put what happened to a job's data and containers on the job.

``RecordCopies``: read the workflow's NnfDataMovements (flux_dws.k8s.records, from the
watched copy of flux_dws.k8s.recordcache once it has caught up with the workflow), post one
``dws-datamovement`` event per copy directive and fail the job when a copy failed.
``SaveOutput``: read the container pods and the tails of their logs, save them in the job's
KVS directory through the plugin's ``save`` method, then post ``dws-container``.

Neither may wedge a job: what Kubernetes refuses for good (RBAC, a pod already gone, a
container that never started) is written into the record as words; only transient failures
(API unreachable) end the chain with an error, and the service tries again later, up to
RECORD_ATTEMPTS failures in a row of the same read.  A plugin too old to ``save`` (ENOSYS)
or one that refuses the document is noted the same way.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

from flux_dws.base.jobid import f58
from flux_dws.base.loop import Timer
from flux_dws.core import actions as act
from flux_dws.core.copies import EVENT, UNKNOWN, copy_error, copy_records, summary
from flux_dws.core.output import OUTPUT_KEY, SavedOutput
from flux_dws.flux.transport import RpcError
from flux_dws.k8s import recordcache
from flux_dws.k8s.records import collect_output, data_movements_or_why
from flux_dws.service.executor import ActionExecutor
from flux_dws.service.failures import error_text
from flux_dws.service.jobs import Done, Seen, Tracked

log = logging.getLogger("flux-dws")

#: Plugin errors that say the output can never be saved this way (not worth a retry).
_UNSAVABLE = frozenset({errno.ENOSYS, errno.EPROTO, errno.EINVAL, errno.ENOENT, errno.E2BIG})


def record_copies(
    x: ActionExecutor, tracked: Tracked, action: act.RecordCopies, seen: Seen, done: Done
) -> None:
    wf = seen.workflow
    assert wf is not None
    what = f"copies {action.state.value}"

    def read() -> tuple[list[dict[str, Any]], str]:
        cache = x.records.movements if x.records is not None else None
        return data_movements_or_why(x.kube, wf.name, wf.namespace, cache, wf.resource_version)

    def settle(result: Any, exc: BaseException | None) -> None:
        if exc is not None:
            text = error_text(exc)
            if not x.attempts.failed(tracked.jobid, what):
                done(f"reading data movements: {text}")
                return
            log.error(
                "job %s: reading data movements: %s; recording the copies without it",
                f58(tracked.jobid),
                text,
            )
            result = ([], f"could not read the NnfDataMovements: {text}")
        else:
            x.attempts.succeeded(tracked.jobid, what)
        objects, problem = result
        records = copy_records(action.state, wf.directives, objects, problem=problem)
        records = [r for r in records if r.index in action.indices]
        for record in records:
            log.info(
                "job %s workflow %s: %s directive %d: %s",
                f58(tracked.jobid),
                wf.name,
                action.state.value,
                record.index,
                summary(record),
            )
            x.post_event(tracked, act.PostEvent(EVENT, record.to_event()), lambda _error: None)
        # Unknown (nothing found) fails nothing: the workflow's own message says more.
        failed = next((r for r in records if r.failed and r.status != UNKNOWN), None)
        if failed is not None and not (tracked.record or {}).get("exception"):
            reason = copy_error(failed)
            x.fail_job(tracked, reason, done, state=failed.state, directive=failed.directive)
        else:
            done(None)

    x.worker.submit(read, on_done=settle, soon=True)  # the next state waits for it, as below


def save_output(
    x: ActionExecutor, tracked: Tracked, action: act.SaveOutput, seen: Seen, done: Done
) -> None:
    wf = seen.workflow
    assert wf is not None
    jobid = tracked.jobid
    limit = x.policy.container_log_size

    def settle(saved: SavedOutput | None, exc: BaseException | None) -> None:
        if exc is not None:
            text = error_text(exc)
            if not x.attempts.failed(jobid, "output"):
                done(f"reading container output: {text}")
                return
            log.error("job %s: reading container output: %s; going on without it", f58(jobid), text)
            saved = SavedOutput(note=f"no container output: {text}", limit=limit)
        else:
            x.attempts.succeeded(jobid, "output")
        assert saved is not None
        if not saved.containers:  # nothing to keep: say why on the event alone
            post(saved, "")
            return

        def stored(_response: Any, error: RpcError | None) -> None:
            retry = error is not None and error.errnum not in _UNSAVABLE
            if retry and not x.attempts.failed(jobid, "save"):
                done(f"save: {error}")
                return
            x.attempts.succeeded(jobid, "save")
            post(saved, f"not saved: {error.message}" if error is not None else "")

        x.jm.save(jobid, OUTPUT_KEY, saved.to_json(), stored, limit=saved.text_limit)

    def post(saved: SavedOutput, problem: str) -> None:
        context = {**action.event, **saved.event_summary()}
        if problem:
            context["output"] = problem
        codes = ", ".join(
            f"{c.status.pod}/{c.status.name}={c.status.exit_code}" for c in saved.containers
        )
        log.info(
            "job %s workflow %s: container output: %s%s",
            f58(jobid),
            wf.name,
            context["output"],
            f" (exit codes {codes})" if codes else "",
        )
        x.post_event(tracked, act.PostEvent("dws-container", context), done)

    cache = x.records.pods if x.records is not None else None
    started = False
    timer: Timer | None = None

    def collect() -> None:
        # Soon: the job's Teardown waits for this (core.lifecycle); behind new jobs' creates
        # and reads it waited a quarter second at 1000 jobs (bench_service).  The pod watch
        # is waited for before, holding no thread (catch_up=0 here: behind, it lists).
        nonlocal started
        if started:
            return
        started = True
        if timer is not None:
            timer.cancel()
        try:
            x.worker.submit(
                collect_output,
                x.kube,
                wf.name,
                wf.namespace,
                limit,
                cache,
                wf.resource_version,
                0.0,
                on_done=settle,
                soon=True,
            )
        except RuntimeError as exc:  # the service stopped while the watch was waited for
            settle(None, exc)

    if cache is None or wf.namespace != x.kube.namespace:
        collect()
        return
    # The pod watch must reach the workflow's version (recordcache), for CATCH_UP at most.
    timer = x.loop.call_later(recordcache.CATCH_UP, collect)
    cache.when_current(wf.resource_version, lambda: x.loop.call_soon(collect))
