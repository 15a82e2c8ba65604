# SPDX-License-Identifier: LGPL-3.0-only
"""The actions of an early release (flux_dws.core.release): hold and give back a released
job's ssd parts in Fluxion, mark the workflow released, and save how DataOut and Teardown
ended in the job's KVS once the job is inactive.

None of them may wedge a workflow: a part that cannot be marked is retried (the nodes stay
held until it is: nothing is given back that Fluxion could over-commit); an outcome that can
never be saved (the job purged from the KVS, a plugin too old) is logged and the workflow
goes on.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

from flux_dws.base.jobid import f58
from flux_dws.core.copies import copy_records
from flux_dws.core.release import (
    RELEASE_ANNOTATION,
    RELEASE_KEY,
    HoldStorage,
    MarkReleased,
    RecordRelease,
    ReturnStorage,
    failed_reason,
)
from flux_dws.core.states import State
from flux_dws.flux.transport import RpcError
from flux_dws.k8s.records import data_movements_or_why
from flux_dws.service.executor import ActionExecutor
from flux_dws.service.failures import error_text
from flux_dws.service.jobs import Done, Seen, Tracked

log = logging.getLogger("flux-dws")

#: Plugin errors that say the outcome can never be saved (not worth a retry).
_UNSAVABLE = frozenset({errno.ENOSYS, errno.EPROTO, errno.EINVAL, errno.ENOENT, errno.E2BIG})


def _mark(x: ActionExecutor, tracked: Tracked, paths: tuple[str, ...], hold: bool, done: Done):
    word = "holding" if hold else "giving back"
    if x.health is None:
        log.warning(
            "job %s: %s %d ssd part(s) in Fluxion, but this service cannot mark them",
            f58(tracked.jobid),
            word,
            len(paths),
        )
        done(None)
        return
    log.info(
        "job %s workflow %s: %s %d ssd part(s) in Fluxion (%s)",
        f58(tracked.jobid),
        x.workflow_name(tracked),
        word,
        len(paths),
        "until Teardown is done" if hold else "Teardown is over",
    )
    x.health.nodes.hold_parts(paths, hold, lambda e: done(e and f"{word} ssd parts: {e}"))


def hold_storage(
    x: ActionExecutor, tracked: Tracked, action: HoldStorage, seen: Seen, done: Done
) -> None:
    _mark(x, tracked, action.paths, True, done)


def return_storage(
    x: ActionExecutor, tracked: Tracked, action: ReturnStorage, seen: Seen, done: Done
) -> None:
    _mark(x, tracked, action.paths, False, done)


def mark_released(
    x: ActionExecutor, tracked: Tracked, action: MarkReleased, seen: Seen, done: Done
) -> None:
    wf = seen.workflow
    assert wf is not None
    log.info(
        "job %s workflow %s: nodes go back to the scheduler now; DataOut and Teardown go on",
        f58(tracked.jobid),
        wf.name,
    )
    x.call(
        tracked,
        "marking the workflow released",
        done,
        x.adopt(tracked),
        x.kube.annotate_workflow,
        wf.name,
        RELEASE_ANNOTATION,
        action.mark.to_annotation(),
    )


def record_release(
    x: ActionExecutor, tracked: Tracked, action: RecordRelease, seen: Seen, done: Done
) -> None:
    wf = seen.workflow
    assert wf is not None
    jobid = tracked.jobid
    key = f"{RELEASE_KEY}.{action.state.lower()}"
    what = f"release {action.state}"

    def read() -> tuple[list[dict[str, Any]], str]:
        if action.state != State.DATAOUT.value:
            return [], ""
        cache = x.records.movements if x.records is not None else None
        return data_movements_or_why(x.kube, wf.name, wf.namespace, cache, wf.resource_version)

    def settle(result: Any, exc: BaseException | None) -> None:
        if exc is not None:
            if not x.attempts.failed(jobid, what):
                done(f"reading data movements: {error_text(exc)}")
                return
            result = ([], f"could not read the NnfDataMovements: {error_text(exc)}")
        objects, problem = result
        value: dict[str, Any] = {"workflow": wf.name, **action.outcome}
        if action.state == State.DATAOUT.value:
            records = copy_records(State.DATAOUT, wf.directives, objects, problem=problem)
            value["copies"] = [r.to_event() for r in records]
            if value.get("result") == "FAILED":
                value["reason"] = failed_reason(action.outcome, records, jobid)
        said = value.get("reason") or action.outcome.get("message")  # "<State> failed: ..."
        log.info(
            "job %s workflow %s (released early): %s",
            f58(jobid),
            wf.name,
            said or f"{action.state} {action.outcome.get('status')}",
        )

        def stored(_response: Any, error: RpcError | None) -> None:
            retry = error is not None and error.errnum not in _UNSAVABLE
            if retry and not x.attempts.failed(jobid, what):
                done(f"save: {error}")
                return
            if error is not None:
                log.error(
                    "job %s workflow %s: could not save the %s outcome in the job's KVS "
                    "(%s): %s; going on",
                    f58(jobid),
                    wf.name,
                    action.state,
                    key,
                    error,
                )
            x.attempts.succeeded(jobid, what)
            done(None)

        x.jm.save(jobid, key, value, stored)

    x.worker.submit(read, on_done=settle)


class StorageHeld:
    """Tells the jobtap plugin that the ssd parts of jobs released early are held again in
    Fluxion (``storage-held``, doc/protocol.rst), so it lets the #DW jobs it kept from the
    scheduler since its load go on (after an instance restart, Fluxion has those parts up
    until the service marks them down; jobtap/holds.c).

    Said once the parts are held after the first workflow list (``holds_ready``), and again
    after every snapshot (a reloaded plugin starts with its gate closed); a failed request is
    tried again every ``[dws] heartbeat`` until answered.  A plugin without the method
    (ENOSYS) keeps no job back: nothing to tell it."""

    def __init__(self, *, loop: Any, jm: Any, every: float) -> None:
        self.loop = loop
        self.jm = jm
        self.every = every
        self.ready = False  # the parts are held (or nothing can be marked)
        self.synced = False  # the plugin's snapshot has arrived since the last telling
        self.told = False  # the plugin answered since its last snapshot
        self._retry: Any = None
        self._stopped = False

    def holds_ready(self) -> None:
        self.ready = True
        self._tell()

    def snapshot(self) -> None:
        self.synced, self.told = True, False
        self._tell()

    def stop(self) -> None:
        self._stopped = True
        if self._retry is not None:
            self._retry.cancel()

    def _tell(self) -> None:
        if self._stopped or not (self.ready and self.synced) or self.told:
            return
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

        def answered(_response: Any, error: RpcError | None) -> None:
            if error is None or error.errnum == errno.ENOSYS:
                if error is None:
                    log.info("told the plugin that released jobs' storage is held again")
                self.told = True
                return
            log.warning("telling the plugin released jobs' storage is held: %s", error)
            if not self._stopped:
                self._retry = self.loop.call_later(self.every, self._tell)

        self.jm.storage_held(answered)
