# SPDX-License-Identifier: LGPL-3.0-only
"""The dws jobtap plugin, in Python: what jobtap/ (dws-jobtap.so) does inside the job-manager.

It holds #DW jobs at DEPEND (dependency ``dws``), in the prolog and in the epilog (actions
``dws``), describes them as job records, and serves ``job-manager.dws.*`` exactly as
doc/protocol.rst says.  It reaches the job-manager only through the small jobtap-like API of
:class:`JobManager`, so the C plugin can follow this file call for call.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from flux_dws.base.fsd import format_fsd
from flux_dws.base.jobid import f58
from flux_dws.base.loop import Loop, Timer
from flux_dws.core.messages import failure_note
from flux_dws.core.persistent import NAME_MARK
from flux_dws.core.states import State
from flux_dws.flux.transport import RpcError
from flux_dws.testing.fakeflux.checks import (
    is_dw_job,
)
from flux_dws.testing.fakeflux.jobrecords import (
    EVENT_PREFIX,
    NAME,
    job_record,
    ours_posted,
    shells_gone,
)
from flux_dws.testing.fakeflux.jobs import Job

log = logging.getLogger("flux-dws.testing.fakeflux.plugin")

WAITING_REASON = "flux-dws service is not running"
#: The next step of a service-wait note (jobtap/dws-jobtap.h SERVICE_WAIT_STEP).
SERVICE_WAIT_STEP = "submit the job again once the service is back"
#: What ``save`` may write: keys under the job directory's ``dws`` subtree, bounded values.
SAVE_KEY = re.compile(r"^dws(\.[A-Za-z0-9_-]+)+$")
SAVE_KEY_MAX = 128
SAVE_VALUE_MAX = 64 * 1024 * 1024


class JobManager(Protocol):
    """What the plugin may ask of the job-manager (the jobtap API it uses)."""

    loop: Loop
    owner_uid: int
    service_wait: float

    def lookup(self, jobid: int) -> Job | None: ...
    def active_jobs(self) -> list[Job]: ...
    def post_event(self, job: Job, name: str, context: dict[str, Any]) -> None: ...
    def kvs_put(self, job: Job, key: str, text: str) -> None: ...
    def dependency_add(self, job: Job, description: str) -> None: ...
    def dependency_remove(self, job: Job, description: str) -> None: ...
    def prolog_start(self, job: Job, description: str) -> None: ...
    def prolog_finish(self, job: Job, description: str, status: int) -> None: ...
    def epilog_start(self, job: Job, description: str) -> None: ...
    def epilog_finish(self, job: Job, description: str, status: int) -> None: ...
    def raise_exception_on(
        self, job: Job, type: str, severity: int, note: str, userid: int
    ) -> None: ...


@dataclass
class Request:
    """One request message: who sent it, what it says, and how to answer it."""

    method: str
    userid: int
    payload: dict[str, Any]
    streaming: bool
    respond: Callable[[dict[str, Any]], None]
    fail: Callable[[RpcError], None]
    client: object = None  # the connection it came on
    channel: object = None  # its response channel, which the client may cancel


@dataclass
class Watcher:
    """A ``watch`` stream and the record it was last sent for each job."""

    request: Request
    service: bool
    sent: dict[int, dict[str, Any]] = field(default_factory=dict)
    who: dict[str, Any] = field(default_factory=dict)  # a service's pid, host, active since
    heard: float = 0.0  # the active service's last heartbeat
    report: dict[str, Any] | None = None  # ... and the report it carried


def job_text(jobid: int) -> str:
    """The job ID as the C plugin writes it into log messages and error texts: f58, as
    flux_job_id_encode() gives it in the broker ("ƒ" in a UTF-8 locale unless
    FLUX_F58_FORCE_ASCII is set, else "f"); a negative ID (never a job) in decimal."""
    if jobid < 0:
        return str(jobid)
    if os.environ.get("FLUX_F58_FORCE_ASCII"):
        return f58(jobid, "f")
    name = os.environ.get("LC_ALL") or os.environ.get("LC_CTYPE") or os.environ.get("LANG") or ""
    return f58(jobid, "ƒ" if "utf8" in name.lower().replace("-", "") else "f")


def who_text(who: Mapping[str, Any]) -> str:
    """A service watch's sender in the plugin's logs (who_text() in jobtap/service.c)."""
    pid, host = who.get("pid", 0), who.get("host")
    if pid <= 0:
        return "a service that gave no pid"
    return f"pid {pid} on {host[:64]}" if host else f"pid {pid}"


def service_who(payload: Mapping[str, Any], since: float) -> dict[str, Any]:
    """What a service watch says about its sender, checked, for the standby's logs."""
    who: dict[str, Any] = {"since": since}
    pid, host = payload.get("pid"), payload.get("host")
    if _is_int(pid) and pid > 0:
        who["pid"] = pid
    if isinstance(host, str) and 0 < len(host) <= 255:
        who["host"] = host
    return who


class DwsPlugin:
    """The plugin's state: watchers, records not yet sent, service-wait timers."""

    def __init__(self, jm: JobManager) -> None:
        self.jm = jm
        self.watchers: list[Watcher] = []
        self.standbys: list[Watcher] = []  # service watches waiting for the active one to go
        self._dirty: dict[int, Job] = {}
        self._flush_pending = False
        self._wait_timers: dict[int, Timer] = {}
        self._told: set[int] = set()  # jobs told dws-waiting since a service last watched
        self._methods: dict[str, Callable[[Request], dict[str, Any] | None]] = {
            "watch": self._watch,
            "list": self._list,
            "release": self._release,
            "prolog-finish": self._prolog_finish,
            "epilog-finish": self._epilog_finish,
            "raise": self._raise,
            "post": self._post,
            "memo": self._memo,
            "heartbeat": self._heartbeat,
            "save": self._save,
            "persistent": self._persistent,
            "storage-held": self._storage_held,
        }
        # Whether the service said storage-held since the load.  fakeflux has no Fluxion to
        # forget the holds, so it keeps no job from its scheduler for it (the real plugin's
        # gate, jobtap/holds.c, is tested on real Flux: tests/test_release_scenarios.py).
        self.storage_held = False
        self._storage: dict[str, dict[str, Any]] | None = None  # the service's, or none yet
        self._unknown = ""

    # ------------------------------------------------------------------ job callbacks

    def job_state(self, job: Job) -> None:
        """``job.state.*``: the job just entered ``job.state``."""
        if not is_dw_job(job.submitted):
            return
        if job.state == "DEPEND":
            self._hold_in_depend(job)
        elif job.state == "RUN":
            self.jm.prolog_start(job, NAME)
        elif job.state == "CLEANUP":
            self._cancel_wait(job.id)
            if not job.prologs:  # held from here, whatever follows (release may never come)
                self._start_epilog(job)
        self._changed(job)

    def job_event(self, job: Job, entry: Mapping[str, Any]) -> None:
        """``job.event.*``: ``entry`` was just posted to the job's eventlog."""
        if not is_dw_job(job.submitted):
            return
        name = entry["name"]
        if name == "release" and entry["context"].get("final"):
            self._start_epilog(job)  # started at CLEANUP already; now phase epilog
        elif name == "prolog-finish" and job.state == "CLEANUP" and not job.started:
            self._start_epilog(job)  # exception during the prolog: the job never ran
        self._changed(job)

    def _hold_in_depend(self, job: Job) -> None:
        self.jm.dependency_add(job, NAME)
        if self._service_connected():
            return
        self._told.add(job.id)
        self.jm.post_event(job, "dws-waiting", {"reason": WAITING_REASON})
        if math.isfinite(self.jm.service_wait):
            timer = self.jm.loop.call_later(self.jm.service_wait, self._service_wait_over, job.id)
            self._wait_timers[job.id] = timer

    def _service_wait_over(self, jobid: int) -> None:
        self._wait_timers.pop(jobid, None)
        job = self.jm.lookup(jobid)
        if job is None or job.state != "DEPEND" or self._service_connected():
            return
        wait = format_fsd(self.jm.service_wait)
        why = f"{WAITING_REASON} after waiting {wait} ([dws] service-wait): storage not set up"
        note = failure_note(State.PROPOSAL.value, why, jobid, step=SERVICE_WAIT_STEP)
        log.warning("dws: job %s: %s; raising a dws exception", job_text(jobid), note)
        self.jm.raise_exception_on(job, NAME, 0, note, self.jm.owner_uid)

    def _cancel_wait(self, jobid: int) -> None:
        timer = self._wait_timers.pop(jobid, None)
        if timer is not None:
            timer.cancel()

    def _start_epilog(self, job: Job) -> None:
        if not ours_posted(job, "epilog-start"):
            self.jm.epilog_start(job, NAME)

    def _service_connected(self) -> bool:
        return any(w.service for w in self.watchers)

    # ------------------------------------------------------------------ watch updates

    def _changed(self, job: Job) -> None:
        self._dirty[job.id] = job
        if not self._flush_pending:
            self._flush_pending = True
            self.jm.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Send each watcher the records that changed since it last heard of them."""
        self._flush_pending = False
        dirty, self._dirty = self._dirty, {}
        records = [job_record(job) for _, job in sorted(dirty.items())]
        for watcher in list(self.watchers):
            changed = []
            for record in records:
                last = watcher.sent.get(record["id"])
                if record == last or (last is None and record["phase"] == "gone"):
                    continue
                changed.append(record)
                if record["phase"] == "gone":
                    del watcher.sent[record["id"]]
                else:
                    watcher.sent[record["id"]] = record
            if changed:
                watcher.request.respond({"snapshot": False, "jobs": changed})

    def disconnect(self, client: object, channel: object | None = None) -> None:
        """The client went away (``channel`` None) or cancelled one stream."""
        had_service = self._service_connected()

        def kept(w: Watcher) -> bool:
            return w.request.client is not client or (
                channel is not None and w.request.channel is not channel
            )

        self.watchers = [w for w in self.watchers if kept(w)]
        self.standbys = [w for w in self.standbys if kept(w)]
        if had_service and not self._service_connected():
            if self.standbys:
                self._promote(self.standbys.pop(0))
            else:
                self._service_gone()

    def _service_gone(self) -> None:
        """Tell every job waiting in DEPEND that no service runs, once since it left.

        The C plugin gets here after three missed heartbeats (it cannot see disconnects);
        fakeflux sees the disconnect itself.  The persistent storage snapshot is stale now.
        """
        self._storage = None
        for job in self.jm.active_jobs():
            if not is_dw_job(job.submitted) or job.state != "DEPEND":
                continue
            if NAME not in job.dependencies or job.id in self._told:
                continue
            self._told.add(job.id)
            self.jm.post_event(job, "dws-waiting", {"reason": WAITING_REASON})
            if math.isfinite(self.jm.service_wait) and job.id not in self._wait_timers:
                timer = self.jm.loop.call_later(
                    self.jm.service_wait, self._service_wait_over, job.id
                )
                self._wait_timers[job.id] = timer

    def shutdown(self) -> None:
        """The job-manager is going away: end every stream, as unloading the plugin does."""
        for watcher in self.watchers + self.standbys:
            watcher.request.fail(RpcError(errno.ENOSYS, "job-manager.dws: plugin unloaded"))
        self.watchers, self.standbys = [], []
        for jobid in list(self._wait_timers):
            self._cancel_wait(jobid)

    # ------------------------------------------------------------------ methods

    @staticmethod
    def refused(method: str) -> RpcError:
        """A guest's request, refused before its payload is read (as the C plugin does)."""
        return RpcError(
            errno.EPERM, f"job-manager.dws.{method}: only the instance owner may use this method"
        )

    def handle(self, req: Request) -> None:
        """Answer one ``job-manager.dws.<method>`` request."""
        try:
            if req.userid != self.jm.owner_uid:
                raise self.refused(req.method)
            method = self._methods.get(req.method)
            if method is None:
                raise RpcError(errno.ENOSYS, f"job-manager.dws.{req.method}: no such method")
            response = method(req)
        except RpcError as err:
            req.fail(err)
            return
        if response is not None:
            req.respond(response)

    def _watch(self, req: Request) -> None:
        if not req.streaming:
            raise RpcError(errno.EPROTO, "job-manager.dws.watch: a streaming request is required")
        service = req.payload.get("service", False)
        if not isinstance(service, bool):
            raise RpcError(errno.EPROTO, "job-manager.dws.watch: service must be true or false")
        watcher = Watcher(req, service)
        if service:
            watcher.who = service_who(req.payload, self.jm.loop.time())
            active = next((w for w in self.watchers if w.service), None)
            if active is not None:  # one active service: this one waits as a standby
                self.standbys.append(watcher)
                req.respond({"standby": True, "active": active.who})
                active.request.respond(
                    {"snapshot": False, "jobs": [], "standby_waiting": watcher.who}
                )
                log.info(
                    "dws: a second flux-dws service (%s) waits as a standby", who_text(watcher.who)
                )
                return
        self._promote(watcher)

    def _promote(self, watcher: Watcher) -> None:
        """Start ``watcher``'s stream with the snapshot; a service one becomes the active."""
        records = self._records()
        watcher.sent = {r["id"]: r for r in records}
        if watcher.service:
            watcher.who["since"] = self.jm.loop.time()
        watcher.request.respond({"snapshot": True, "jobs": records})
        self.watchers.append(watcher)
        if watcher.service:
            self._told.clear()
            for jobid in list(self._wait_timers):
                self._cancel_wait(jobid)

    def _list(self, req: Request) -> dict[str, Any]:
        return {"jobs": self._records(), "service": self.service_info()}

    def _heartbeat(self, req: Request) -> dict[str, Any]:
        """The service says it is alive.  Real Flux never tells a jobtap plugin that a client
        disconnected, so the C plugin counts a service gone after three [dws] heartbeats of
        silence; in-process, fakeflux sees the disconnect itself and needs no timer.  The
        active service's report is kept for ``list``."""
        report = req.payload.get("report")
        active = next((w for w in self.watchers if w.service), None)
        if active is not None and active.request.client is req.client:
            active.heard = self.jm.loop.time()
            if isinstance(report, dict):
                active.report = report
        return {}

    def service_info(self) -> dict[str, Any]:
        """``list``'s ``service``: the active service (or null) and how many standbys wait."""
        active = next((w for w in self.watchers if w.service), None)
        persistent = None if self._storage is None else len(self._storage)
        if active is None:
            return {"active": None, "standbys": len(self.standbys), "persistent": persistent}
        described = {
            **active.who,
            "heard": self.jm.loop.time() - (active.heard or active.who.get("since", 0.0)),
            "report": active.report,
        }
        return {"active": described, "standbys": len(self.standbys), "persistent": persistent}

    def _records(self) -> list[dict[str, Any]]:
        return [job_record(job) for job in self.jm.active_jobs() if is_dw_job(job.submitted)]

    def _release(self, req: Request) -> dict[str, Any]:
        job = self._dw_job(req)
        update = req.payload.get("update", {})
        if not isinstance(update, dict) or not all(
            isinstance(k, str) and (k.startswith("attributes.") or k == "resources") for k in update
        ):
            raise RpcError(
                errno.EPROTO,
                "job-manager.dws.release: update must map attributes.* keys (or resources) to"
                " values",
            )
        if job.state != "DEPEND" or NAME not in job.dependencies:
            raise RpcError(errno.EINVAL, f"job {job_text(job.id)} is not waiting for its workflow")
        if update:
            self.jm.post_event(job, "jobspec-update", update)
        self.jm.dependency_remove(job, NAME)
        return {}

    def _prolog_finish(self, req: Request) -> dict[str, Any]:
        job = self._dw_job(req)
        success = req.payload.get("success")
        env = req.payload.get("env", {})
        if not isinstance(success, bool):
            raise RpcError(errno.EPROTO, "job-manager.dws.prolog-finish: success must be a boolean")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise RpcError(
                errno.EPROTO, "job-manager.dws.prolog-finish: env must map names to strings"
            )
        if NAME not in job.prologs:
            raise RpcError(errno.EINVAL, f"job {job_text(job.id)} has no active dws prolog")
        if success:
            self.jm.post_event(job, "dws-environment", {"env": env})
        self.jm.prolog_finish(job, NAME, 0 if success else 1)
        return {}

    def _epilog_finish(self, req: Request) -> dict[str, Any]:
        job = self._dw_job(req)
        if NAME not in job.epilogs:
            raise RpcError(errno.EINVAL, f"job {job_text(job.id)} has no active dws epilog")
        if not shells_gone(job):
            raise RpcError(errno.EINVAL, f"job {job_text(job.id)} is still running its tasks")
        self.jm.epilog_finish(job, NAME, 0)
        return {}

    def _raise(self, req: Request) -> dict[str, Any]:
        job = self._dw_job(req)
        type_ = req.payload.get("type")
        severity = req.payload.get("severity", 0)
        note = req.payload.get("note", "")
        if not isinstance(type_, str) or not type_ or any(c.isspace() for c in type_):
            raise RpcError(errno.EPROTO, "job-manager.dws.raise: type must be one word")
        if not _is_int(severity) or not 0 <= severity <= 7 or not isinstance(note, str):
            raise RpcError(
                errno.EPROTO, "job-manager.dws.raise: severity must be 0-7 and note a string"
            )
        if job.state == "INACTIVE":
            raise RpcError(errno.EINVAL, f"job {job_text(job.id)} is inactive")
        if severity == 0 and job.exception is not None:
            first = job.exception["type"]
            raise RpcError(
                errno.EINVAL, f"job {job_text(job.id)} already has a fatal {first} exception"
            )
        self.jm.raise_exception_on(job, type_, severity, note, req.userid)
        if severity == 0:  # the plugin's memo: the result flux-core cannot change after finish
            self.jm.post_event(job, "memo", {"dws": {"result": "FAILED", "reason": note}})
        return {}

    def _memo(self, req: Request) -> dict[str, Any]:
        job = self._dw_job(req)
        memo = req.payload.get("memo")
        if not isinstance(memo, dict) or not memo:
            raise RpcError(errno.EPROTO, "job-manager.dws.memo: memo must be a non-empty object")
        if job.state == "INACTIVE":
            raise RpcError(errno.ENOENT, f"job {job_text(job.id)} is not held by the dws plugin")
        self.jm.post_event(job, "memo", dict(memo))
        return {}

    def _post(self, req: Request) -> dict[str, Any]:
        job = self._dw_job(req)
        name = req.payload.get("name")
        context = req.payload.get("context", {})
        if not isinstance(name, str) or not name.startswith(EVENT_PREFIX) or name == EVENT_PREFIX:
            if not isinstance(name, str):
                raise RpcError(
                    errno.EINVAL, f"job-manager.dws.post: name must be {EVENT_PREFIX}<name>"
                )
            raise RpcError(
                errno.EINVAL,
                f"job-manager.dws.post: event name {name[:64]} must be {EVENT_PREFIX}<name>",
            )
        if not isinstance(context, dict):
            raise RpcError(errno.EPROTO, "job-manager.dws.post: context must be an object")
        if job.state == "INACTIVE":
            raise RpcError(errno.ENOENT, f"job {job_text(job.id)} is not held by the dws plugin")
        self.jm.post_event(job, name, context)
        return {}

    def _storage_held(self, req: Request) -> dict[str, Any]:
        """The service holds the ssd parts of jobs released early again (doc/protocol.rst)."""
        self.storage_held = True
        return {}

    def _persistent(self, req: Request) -> dict[str, Any]:
        """The service's persistent storage, which job.validate checks persistentdw against."""
        storage, unknown = req.payload.get("storage"), req.payload.get("unknown")
        if (
            not isinstance(storage, list)
            or len(storage) > PERSISTENT_MAX
            or not _text(unknown, null=False)
        ):
            raise RpcError(
                errno.EPROTO,
                f"job-manager.dws.persistent: storage must be a list of at most {PERSISTENT_MAX}"
                f" entries and unknown a string of at most {PERSISTENT_TEXT} bytes",
            )
        snapshot = {}
        for index, entry in enumerate(storage):
            entry = entry if isinstance(entry, dict) else {}
            name, owner = entry.get("name"), entry.get("owner")
            if not (
                isinstance(name, str)
                and PERSISTENT_NAME.match(name)
                and (owner is None or _is_int(owner))
                and _text(entry.get("refusal"))
                and _text(entry.get("others"))
            ):
                raise RpcError(
                    errno.EPROTO,
                    f"job-manager.dws.persistent: entry {index} must have a name (at most 63"
                    " of [A-Za-z0-9._-]), an owner uid, refusal and others (text or null)",
                )
            snapshot[name] = entry
        self._storage, self._unknown = snapshot, unknown
        return {}

    def persistent_check(self, system: dict[str, Any], userid: int) -> str | None:
        """job.validate: why user's persistentdw may not run (the service's words), or None."""
        if self._storage is None:
            return None
        dw = system.get("dw")
        lines = dw.split("\n") if isinstance(dw, str) else dw if isinstance(dw, list) else []
        for line in lines:
            words = line.split() if isinstance(line, str) else []
            if words[:2] != ["#DW", "persistentdw"]:
                continue
            names = [w[5:] for w in words[2:] if w.startswith("name=") and len(w) > 5]
            if not names or not PERSISTENT_NAME.match(names[-1]):
                continue
            name = names[-1]
            entry = self._storage.get(name)
            if entry is None:
                return self._unknown.replace(NAME_MARK, name, 1)
            mine = _is_int(entry.get("owner")) and entry["owner"] == userid
            text = entry.get("refusal" if mine else "others")
            if text is not None:
                return text
        return None

    def _save(self, req: Request) -> dict[str, Any]:
        job = self._dw_job(req)
        key = req.payload.get("key")
        value = req.payload.get("value")
        if not isinstance(key, str):
            raise RpcError(errno.EINVAL, "job-manager.dws.save: key must be dws.<name>[.<name>...]")
        if len(key) > SAVE_KEY_MAX or not SAVE_KEY.fullmatch(key):
            raise RpcError(
                errno.EINVAL,
                f"job-manager.dws.save: key {key[:140]} must be dws.<name>[.<name>...]",
            )
        if not isinstance(value, dict):
            raise RpcError(errno.EPROTO, "job-manager.dws.save: value must be an object")
        if job.state == "INACTIVE" and not key.startswith("dws.release."):  # early release
            raise RpcError(errno.ENOENT, f"job {job_text(job.id)} is not held by the dws plugin")
        text = json.dumps(value, separators=(",", ":"))
        if len(text) > SAVE_VALUE_MAX:
            raise RpcError(errno.E2BIG, f"job {job_text(job.id)}: {key} is larger than 64MiB")
        self.jm.kvs_put(job, key, text)
        return {}

    def _dw_job(self, req: Request) -> Job:
        """The #DW job the request names (inactive ones too); ENOENT for any other."""
        jobid = req.payload.get("id")
        if not _is_int(jobid):
            raise RpcError(errno.EPROTO, f"job-manager.dws.{req.method}: id must be a job ID")
        job = self.jm.lookup(jobid)
        if job is None or not is_dw_job(job.submitted):
            raise RpcError(errno.ENOENT, f"job {job_text(jobid)} is not held by the dws plugin")
        return job


PERSISTENT_MAX = 4096
PERSISTENT_TEXT = 512
PERSISTENT_NAME = re.compile(r"^[A-Za-z0-9._-]{1,63}$")


def _text(value: object, null: bool = True) -> bool:
    if value is None:
        return null
    return isinstance(value, str) and len(value.encode()) <= PERSISTENT_TEXT and "\0" not in value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
