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
from collections.abc import Generator
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
from flux_dws.core.workflow import WorkflowView
from flux_dws.flux.transport import RpcError
from flux_dws.service.executor import ActionExecutor
from flux_dws.service.jobs import Seen
from flux_dws.service.outcome import (
    DONE,
    Adopted,
    Learned,
    Outcome,
    Retry,
    Rpc,
    Step,
    Wait,
    call,
)
from flux_dws.service.recording import UNSAVABLE, movements_of, no_movements, read_or_go_on

log = logging.getLogger("flux-dws")


Steps = Generator[Step, Any, Outcome]


def _mark(x: ActionExecutor, seen: Seen, paths: tuple[str, ...], hold: bool) -> Steps:
    word = "holding" if hold else "giving back"
    health = x.health
    if health is None:
        log.warning(
            "job %s: %s %d ssd part(s) in Fluxion, but this service cannot mark them",
            f58(seen.job.jobid),
            word,
            len(paths),
        )
        return DONE
    log.info(
        "job %s workflow %s: %s %d ssd part(s) in Fluxion (%s)",
        f58(seen.job.jobid),
        x.workflow_name(seen),
        word,
        len(paths),
        "until Teardown is done" if hold else "Teardown is over",
    )
    error = yield Wait(lambda answer: health.nodes.hold_parts(paths, hold, answer))
    return Retry(f"{word} ssd parts: {error}") if error else DONE


def hold_storage(x: ActionExecutor, action: HoldStorage, seen: Seen) -> Steps:
    return (yield from _mark(x, seen, action.paths, True))


def return_storage(x: ActionExecutor, action: ReturnStorage, seen: Seen) -> Steps:
    return (yield from _mark(x, seen, action.paths, False))


def mark_released(x: ActionExecutor, action: MarkReleased, seen: Seen) -> Steps:
    wf = seen.workflow
    assert wf is not None
    log.info(
        "job %s workflow %s: nodes go back to the scheduler now; DataOut and Teardown go on",
        f58(seen.job.jobid),
        wf.name,
    )
    obj = yield call(
        x.kube.annotate_workflow,
        wf.name,
        RELEASE_ANNOTATION,
        action.mark.to_annotation(),
        what="marking the workflow released",
    )
    return Learned((Adopted(obj),))


def record_release(x: ActionExecutor, action: RecordRelease, seen: Seen) -> Steps:
    wf, jobid = seen.workflow, seen.job.jobid
    assert wf is not None
    what = f"release {action.state}"
    read: Any = ([], "")
    if action.state == State.DATAOUT.value:
        read = yield from read_or_go_on(x, jobid, what, movements_of(x, seen), no_movements)
        if isinstance(read, Retry):
            return read
    value = released_outcome(wf, action, jobid, *read)
    said = value.get("reason") or action.outcome.get("message")  # "<State> failed: ..."
    said = said or f"{action.state} {action.outcome.get('status')}"
    log.info("job %s workflow %s (released early): %s", f58(jobid), wf.name, said)
    return (yield from _save_outcome(x, seen, action, value))


def _save_outcome(
    x: ActionExecutor, seen: Seen, action: RecordRelease, value: dict[str, Any]
) -> Steps:
    """Save it in the job's KVS; one that can never be saved is logged and let go."""
    jobid, what = seen.job.jobid, f"release {action.state}"
    key = f"{RELEASE_KEY}.{action.state.lower()}"
    try:
        yield Rpc(lambda done: x.jm.save(jobid, key, value, done), "save")
    except RpcError as error:
        if error.errnum not in UNSAVABLE and not x.attempts.failed(jobid, what):
            return Retry(f"save: {error}")
        log.error(
            "job %s workflow %s: could not save the %s outcome in the job's KVS (%s): %s; going on",
            *(f58(jobid), x.workflow_name(seen), action.state, key, error),
        )
    x.attempts.succeeded(jobid, what)
    return DONE


def released_outcome(
    wf: WorkflowView, action: RecordRelease, jobid: int, objects: list, problem: str
) -> dict[str, Any]:
    """What is saved of how DataOut or Teardown ended for a job released early."""
    value: dict[str, Any] = {"workflow": wf.name, **action.outcome}
    if action.state == State.DATAOUT.value:
        records = copy_records(State.DATAOUT, wf.directives, objects, problem=problem)
        value["copies"] = [r.to_event() for r in records]
        if value.get("result") == "FAILED":
            value["reason"] = failed_reason(action.outcome, records, jobid)
    return value


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
