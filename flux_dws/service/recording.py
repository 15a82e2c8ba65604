# SPDX-License-Identifier: LGPL-3.0-only
"""The actions that put what happened to a job's data and containers on the job.

``RecordCopies``: read the workflow's NnfDataMovements (flux_dws.k8s.records), post one
``dws-datamovement`` event per copy directive and fail the job when a copy failed.
``SaveOutput``: read the container pods and the tails of their logs, save them in the job's
KVS directory through the plugin's ``save`` method, then post ``dws-container``.

Neither may wedge a job: what Kubernetes refuses for good (RBAC, a pod already gone, a
container that never started) is written into the record as words; only transient failures
(API unreachable) end the chain with an error, and the service tries again later.  A plugin
too old to ``save`` (ENOSYS) or one that refuses the document is noted the same way.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

from flux_dws.core import lifecycle as lc
from flux_dws.core.copies import EVENT, UNKNOWN, copy_records, failure_note, summary
from flux_dws.core.output import OUTPUT_KEY, SavedOutput
from flux_dws.flux.transport import RpcError
from flux_dws.k8s import KubeError
from flux_dws.k8s.records import collect_output, permanent, read_data_movements
from flux_dws.service.actions import Done, Tracked, _error_text

log = logging.getLogger("flux-dws")

#: Plugin errors that say the output can never be saved this way (not worth a retry).
_UNSAVABLE = frozenset({errno.ENOSYS, errno.EPROTO, errno.EINVAL, errno.ENOENT, errno.E2BIG})
#: Reads that fail this many times in a row are given up (noted in the record) so the job
#: goes on: a record is worth a short wait, never a wedged job.
ATTEMPTS = 5


class RecordRunner:
    """``_do_RecordCopies`` and ``_do_SaveOutput``; a mixin of Service, beside ActionRunner."""

    def _give_up(self, tracked: Tracked, what: str) -> bool:
        """Count one more failure of ``what`` for the job; True once it is time to stop."""
        failures: dict[tuple[int, str], int] = self.__dict__.setdefault("_record_failures", {})
        key = (tracked.jobid, what)
        failures[key] = failures.get(key, 0) + 1
        if failures[key] < ATTEMPTS:
            return False
        del failures[key]
        return True

    def _do_RecordCopies(self, tracked: Tracked, action: lc.RecordCopies, done: Done) -> None:
        wf = tracked.workflow
        assert wf is not None

        def read() -> tuple[list[dict[str, Any]], str]:
            try:
                return read_data_movements(self.kube, wf.name, wf.namespace), ""
            except KubeError as exc:
                if not permanent(exc):
                    raise
                return [], f"could not read the NnfDataMovements: {exc}"

        def finished(result: Any, exc: BaseException | None) -> None:
            self.loop.call_soon(settle, result, exc)

        def settle(result: Any, exc: BaseException | None) -> None:
            if exc is not None:
                error = f"reading data movements: {_error_text(exc)}"
                if not self._give_up(tracked, "copies"):
                    done(error)
                    return
                log.error("job %d: %s; recording the copies without it", tracked.jobid, error)
                result = ([], f"could not read the NnfDataMovements: {_error_text(exc)}")
            objects, problem = result
            records = copy_records(action.state, wf.directives, objects, problem=problem)
            records = [r for r in records if r.index in action.indices]
            for record in records:
                log.info(
                    "job %d workflow %s: %s directive %d: %s",
                    tracked.jobid,
                    wf.name,
                    action.state.value,
                    record.index,
                    summary(record),
                )
                event = lc.PostEvent(EVENT, record.to_event())
                self._do_PostEvent(tracked, event, lambda _error: None)
            # Unknown (nothing found) fails nothing: the workflow's own message says more.
            failed = next((r for r in records if r.failed and r.status != UNKNOWN), None)
            if failed is not None and not (tracked.record or {}).get("exception"):
                self._fail_job(tracked, failure_note(failed), done)
            else:
                done(None)

        self.worker.submit(read, on_done=finished)

    def _do_SaveOutput(self, tracked: Tracked, action: lc.SaveOutput, done: Done) -> None:
        wf = tracked.workflow
        assert wf is not None
        jobid = tracked.jobid
        limit = self.policy.container_log_size

        def finished(result: Any, exc: BaseException | None) -> None:
            self.loop.call_soon(settle, result, exc)

        def settle(saved: SavedOutput | None, exc: BaseException | None) -> None:
            if exc is not None:
                error = f"reading container output: {_error_text(exc)}"
                if not self._give_up(tracked, "output"):
                    done(error)
                    return
                log.error("job %d: %s; going on without it", jobid, error)
                saved = SavedOutput(note=f"no container output: {_error_text(exc)}", limit=limit)
            assert saved is not None
            if not saved.containers:  # nothing to keep: say why on the event alone
                post(saved, "")
                return

            def stored(_response: Any, error: RpcError | None) -> None:
                retry = error is not None and error.errnum not in _UNSAVABLE
                if retry and not self._give_up(tracked, "save"):
                    done(f"save: {error}")
                    return
                post(saved, f"not saved: {error.message}" if error is not None else "")

            self.jm.save(jobid, OUTPUT_KEY, saved.to_json(), stored)

        def post(saved: SavedOutput, problem: str) -> None:
            context = {**action.event, **saved.event_summary()}
            if problem:
                context["output"] = problem
            codes = ", ".join(
                f"{c.status.pod}/{c.status.name}={c.status.exit_code}" for c in saved.containers
            )
            log.info(
                "job %d workflow %s: container output: %s%s",
                jobid,
                wf.name,
                context["output"],
                f" (exit codes {codes})" if codes else "",
            )
            self._do_PostEvent(tracked, lc.PostEvent("dws-container", context), done)

        self.worker.submit(
            collect_output, self.kube, wf.name, wf.namespace, limit, on_done=finished
        )
