# SPDX-License-Identifier: LGPL-3.0-only
"""fakeflux: Flux's job-manager + the dws jobtap plugin, driven over the protocol by hand.

Each test plays the flux-dws service: a Loop on its own thread, a Transport from
``FakeFlux.connect``, and the requests of doc/protocol.rst.
"""

from __future__ import annotations

import errno
import queue
import threading
from typing import Any

import pytest

from flux_dws.base.loop import Loop
from flux_dws.flux.transport import RpcError
from flux_dws.testing.fakeflux import FakeFlux, SubmitError
from flux_dws.testing.fakeflux.jobs import node_resources
from flux_dws.testing.fakeflux.plugin import job_text

DW = {"dw": "#DW jobdw type=xfs capacity=10GiB name=scratch", "dw_timeout": {"prerun": "10m"}}
HOSTS = ["compute-01", "compute-02"]
TIMEOUT = 5.0


class FakeClock:
    """A clock the test moves, so timers fire when the test says, not after real waiting."""

    def __init__(self) -> None:
        self.now = 1_764_450_000.0

    def __call__(self) -> float:
        return self.now


class Watch:
    """One ``watch`` stream's responses, in order."""

    def __init__(self, client: Client, service: bool) -> None:
        self.responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.latest: dict[int, dict[str, Any]] = {}
        self.cancel = client.transport.stream(
            "watch", {"service": service}, lambda p, e: self.responses.put((p, e))
        )

    def next(self) -> dict[str, Any]:
        payload, err = self.responses.get(timeout=TIMEOUT)
        if err is not None:
            raise err
        for record in payload.get("jobs", []):
            self.latest[record["id"]] = record
        return payload

    def snapshot(self) -> list[dict[str, Any]]:
        payload = self.next()
        assert payload["snapshot"] is True
        return payload["jobs"]

    def until(self, jobid: int, phase: str) -> dict[str, Any]:
        """Read updates until the job's record shows ``phase``; return that record."""
        while self.latest.get(jobid, {}).get("phase") != phase:
            assert self.next()["snapshot"] is False
        return self.latest[jobid]

    def drain(self, ff: FakeFlux) -> list[dict[str, Any]]:
        """Every update sent so far (the job-manager's pending flushes included)."""
        ff.loop.run_sync(lambda: None)
        ff.loop.run_sync(lambda: None)
        updates = []
        while not self.responses.empty():
            updates.append(self.next())
        return updates


class Client:
    """The service side: its loop, its transport, blocking helpers for the tests."""

    def __init__(self, ff: FakeFlux, userid: int | None = None) -> None:
        self.loop = Loop(name="client").start_thread()
        self.transport = ff.connect(self.loop, userid=userid)

    def call(self, method: str, payload: dict[str, Any]) -> dict[str, Any]:
        done = threading.Event()
        box: list[Any] = []

        def on_done(response: Any, err: Any) -> None:
            box.append((response, err))
            done.set()

        self.transport.rpc(method, payload, on_done)
        assert done.wait(TIMEOUT), f"no response to {method}"
        response, err = box[0]
        if err is not None:
            raise err
        return response

    def fails(self, method: str, payload: dict[str, Any]) -> RpcError:
        with pytest.raises(RpcError) as caught:
            self.call(method, payload)
        return caught.value

    def watch(self, service: bool = True) -> Watch:
        return Watch(self, service)

    def close(self) -> None:
        self.transport.close()
        self.loop.stop()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ff(clock: FakeClock):
    fake = FakeFlux(HOSTS, clock=clock).start()
    yield fake
    fake.stop()


@pytest.fixture
def service(ff: FakeFlux):
    client = Client(ff)
    yield client
    client.close()


def run_to_prolog(client: Client, ff: FakeFlux, **submit: Any) -> int:
    jobid = ff.submit(DW, **submit)
    client.call("release", {"id": jobid, "update": {}})
    ff.wait_event(jobid, "prolog-start", TIMEOUT)
    return jobid


def run_to_epilog(client: Client, ff: FakeFlux, env: dict[str, str], **submit: Any) -> int:
    jobid = run_to_prolog(client, ff, **submit)
    client.call("prolog-finish", {"id": jobid, "success": True, "env": env})
    ff.wait_event(jobid, "epilog-start", TIMEOUT)
    return jobid


# ----------------------------------------------------------------------------- jobs without #DW


def test_job_without_dw_runs_unheld_and_is_not_listed(ff: FakeFlux, service: Client) -> None:
    watch = service.watch()
    assert watch.snapshot() == []
    jobid = ff.submit({"duration": 60})
    info = ff.wait(jobid, timeout=TIMEOUT)
    assert info.event_names() == [
        "submit", "validate", "depend", "priority", "alloc", "start", "finish", "release",
        "free", "clean",
    ]  # fmt: skip
    assert info.result == "COMPLETED" and info.holds == set() and info.env == {}
    assert info.events("finish")[0]["context"] == {"status": 0}
    assert info.events("release")[0]["context"] == {"ranks": "all", "final": True}
    assert service.call("list", {})["jobs"] == []
    assert watch.drain(ff) == []
    err = service.fails("post", {"id": jobid, "name": "dws-state", "context": {}})
    assert err.errnum == errno.ENOENT


def test_submit_event_and_ids_follow_flux(ff: FakeFlux) -> None:
    first = ff.submit({}, userid=4242, runtime=None)
    second = ff.submit({}, runtime=None)
    assert second > first > 0
    submit = ff.info(first).events("submit")[0]["context"]
    assert submit["userid"] == 4242 and submit["urgency"] == 16 and submit["flags"] == 0
    assert ff.info(first).events("priority")[0]["context"] == {"priority": 16}


# ----------------------------------------------------------------------------- the #DW life cycle


def test_dw_job_lifecycle_over_the_protocol(ff: FakeFlux, service: Client) -> None:
    watch = service.watch()
    assert watch.snapshot() == []
    jobid = ff.submit(DW, userid=1001, nnodes=2, runtime=None)

    record = watch.until(jobid, "depend")
    submitted = ff.info(jobid).events("submit")[0]
    assert record == {
        "id": jobid,
        "userid": 1001,
        "t_submit": submitted["timestamp"],
        "phase": "depend",
        "attributes": DW,
        "hosts": [],
        "rabbits": {},
        "ssd": [],
        "resources": node_resources(2),
        "started": False,
        "exception": None,
        "dws": {},
    }
    assert ff.info(jobid).holds == {"dependency:dws"}
    assert not ff.info(jobid).events("dws-waiting")  # the service is connected

    service.call("post", {"id": jobid, "name": "dws-state", "context": {"state": "Proposal"}})
    service.call("post", {"id": jobid, "name": "dws-state", "context": {"state": "Setup"}})
    watch.drain(ff)
    assert watch.latest[jobid]["dws"] == {"dws-state": {"state": "Setup"}}

    storage = {"nodes": [{"name": "rabbit-01", "count": 1}]}
    service.call("release", {"id": jobid, "update": {"attributes.system.dw_storage": storage}})
    record = watch.until(jobid, "prolog")
    assert record["hosts"] == HOSTS and record["started"] is False
    info = ff.info(jobid)
    assert info.events("jobspec-update")[0]["context"] == {"attributes.system.dw_storage": storage}
    assert info.jobspec["attributes"]["system"]["dw_storage"] == storage
    assert info.state == "RUN" and info.holds == {"prolog:dws"} and not info.events("start")
    assert record["attributes"] == DW  # the record keeps the attributes as submitted

    env = {"DW_JOB_scratch": "/mnt/nnf/abc-0"}
    service.call("prolog-finish", {"id": jobid, "success": True, "env": env})
    record = watch.until(jobid, "run")
    assert record["started"] is True and record["dws"]["dws-environment"] == {"env": env}
    info = ff.info(jobid)
    assert info.env == env and info.holds == set()
    assert info.events("prolog-finish")[0]["context"] == {"description": "dws", "status": 0}

    ff.finish(jobid)
    record = watch.until(jobid, "epilog")
    assert ff.info(jobid).holds == {"epilog:dws"} and record["exception"] is None
    service.call("epilog-finish", {"id": jobid})
    assert watch.until(jobid, "gone")["id"] == jobid

    info = ff.wait(jobid, timeout=TIMEOUT)
    assert info.result == "COMPLETED"
    assert info.event_names() == [
        "submit", "validate", "dependency-add", "dws-state", "dws-state", "jobspec-update",
        "dependency-remove", "depend", "priority", "alloc", "prolog-start", "dws-environment",
        "prolog-finish", "start", "finish", "epilog-start", "release", "epilog-finish", "free",
        "clean",
    ]  # fmt: skip
    assert info.events("epilog-finish")[0]["context"] == {"description": "dws", "status": 0}
    assert service.call("list", {})["jobs"] == []


def test_a_finished_job_enters_the_epilog_phase_at_its_release(
    ff: FakeFlux, service: Client, clock: FakeClock
) -> None:
    """Between "finish" and "release" the epilog has not started: the record still says run,
    so no service finishes an epilog that then starts and holds the job for ever."""
    ff.release_delay = 5.0
    watch = service.watch()
    watch.snapshot()
    jobid = run_to_prolog(service, ff, runtime=None)
    service.call("prolog-finish", {"id": jobid, "success": True})
    ff.finish(jobid)
    watch.drain(ff)
    # Held from "finish" (a release may never come), but still "run" until the shells go.
    assert ff.info(jobid).state == "CLEANUP" and ff.info(jobid).holds == {"epilog:dws"}
    assert watch.latest[jobid]["phase"] == "run"
    assert service.fails("epilog-finish", {"id": jobid}).errnum == errno.EINVAL

    clock.now += 5
    ff.loop.run_sync(lambda: None)
    watch.until(jobid, "epilog")
    assert ff.info(jobid).holds == {"epilog:dws"}
    service.call("epilog-finish", {"id": jobid})
    info = ff.wait(jobid, timeout=TIMEOUT)
    assert info.result == "COMPLETED"
    assert info.event_names()[-6:] == [
        "finish", "epilog-start", "release", "epilog-finish", "free", "clean",
    ]  # fmt: skip


def test_snapshot_and_list_describe_every_held_job(ff: FakeFlux, service: Client) -> None:
    plain = ff.submit({})
    ff.wait(plain, timeout=TIMEOUT)
    waiting = ff.submit(DW)
    in_prolog = run_to_prolog(service, ff)
    running = ff.submit(DW, runtime=None)
    service.call("release", {"id": running})  # no update: no jobspec-update event
    ff.wait_event(running, "prolog-start", TIMEOUT)
    service.call("prolog-finish", {"id": running, "success": True})
    ff.wait_event(running, "start", TIMEOUT)
    queued = ff.submit(DW)  # both hosts are busy once released
    service.call("release", {"id": queued, "update": {}})

    snapshot = service.watch().snapshot()
    phases = {r["id"]: r["phase"] for r in snapshot}
    assert phases == {waiting: "depend", in_prolog: "prolog", running: "run", queued: "sched"}
    assert [r["id"] for r in snapshot] == sorted(phases)
    assert plain not in phases
    assert service.call("list", {})["jobs"] == snapshot
    assert not ff.info(running).events("jobspec-update")
    assert ff.info(running).env == {}
    assert {r["id"]: r["dws"] for r in snapshot}[running]["dws-environment"] == {"env": {}}


# ----------------------------------------------------------------------------- exceptions


def test_cancel_in_depend_holds_the_epilog_then_canceled(ff: FakeFlux, service: Client) -> None:
    watch = service.watch()
    watch.snapshot()
    jobid = ff.submit(DW)
    watch.until(jobid, "depend")
    ff.cancel(jobid, "changed my mind")
    record = watch.until(jobid, "epilog")
    assert record["exception"] == {"type": "cancel", "severity": 0, "note": "changed my mind"}
    info = ff.info(jobid)
    assert info.state == "CLEANUP" and info.holds == {"epilog:dws"}
    assert info.exception is not None and info.exception["userid"] == ff.owner_uid
    assert service.fails("release", {"id": jobid}).errnum == errno.EINVAL
    service.call("epilog-finish", {"id": jobid})
    info = ff.wait(jobid, timeout=TIMEOUT)
    assert info.result == "CANCELED"
    assert info.event_names()[-4:] == ["exception", "epilog-start", "epilog-finish", "clean"]
    assert not info.events("alloc") and not info.events("free")


def test_cancel_in_sched_never_allocates(ff: FakeFlux, service: Client) -> None:
    blocker = ff.submit({}, nnodes=2, runtime=None)
    ff.wait(blocker, "RUN", TIMEOUT)
    jobid = ff.submit(DW)
    service.call("release", {"id": jobid})
    ff.wait(jobid, "SCHED", TIMEOUT)
    ff.cancel(jobid)
    ff.wait_event(jobid, "epilog-start", TIMEOUT)
    service.call("epilog-finish", {"id": jobid})
    ff.finish(blocker)
    info = ff.wait(jobid, timeout=TIMEOUT)
    assert info.result == "CANCELED" and not info.events("alloc") and info.hosts == []
    assert ff.wait(blocker, timeout=TIMEOUT).result == "COMPLETED"


def test_exception_during_prolog_waits_for_prolog_finish(ff: FakeFlux, service: Client) -> None:
    watch = service.watch()
    watch.snapshot()
    jobid = run_to_prolog(service, ff)
    service.call("raise", {"id": jobid, "type": "dws", "severity": 0, "note": "PreRun failed"})
    record = watch.until(jobid, "prolog")
    watch.drain(ff)
    record = watch.latest[jobid]
    assert record["phase"] == "prolog" and record["exception"]["type"] == "dws"
    info = ff.info(jobid)
    assert info.state == "CLEANUP" and info.holds == {"prolog:dws"}  # as Flux: CLEANUP at once
    assert service.fails("epilog-finish", {"id": jobid}).errnum == errno.EINVAL

    service.call("prolog-finish", {"id": jobid, "success": False})
    watch.until(jobid, "epilog")
    info = ff.info(jobid)
    assert info.events("prolog-finish")[0]["context"]["status"] == 1
    assert not info.events("start") and not info.events("dws-environment")
    service.call("epilog-finish", {"id": jobid})
    info = ff.wait(jobid, timeout=TIMEOUT)
    assert info.result == "FAILED"
    assert info.event_names()[-4:] == ["epilog-start", "epilog-finish", "free", "clean"]


def test_cancel_while_running_kills_the_tasks(ff: FakeFlux, service: Client) -> None:
    jobid = run_to_prolog(service, ff, runtime=None)
    service.call("prolog-finish", {"id": jobid, "success": True, "env": {}})
    ff.wait_event(jobid, "start", TIMEOUT)
    ff.cancel(jobid)
    ff.wait_event(jobid, "release", TIMEOUT)
    service.call("epilog-finish", {"id": jobid})
    info = ff.wait(jobid, timeout=TIMEOUT)
    assert info.result == "CANCELED"
    assert info.events("finish")[0]["context"] == {"status": 9}
    names = info.event_names()
    assert names.index("exception") < names.index("epilog-start") < names.index("release")
    assert names.index("finish") < names.index("release")


@pytest.mark.parametrize(
    ("kind", "exit_status", "result", "finish_status"),
    [("timeout", 0, "TIMEOUT", 9), ("dws", 0, "FAILED", 9), (None, 3, "FAILED", 3 << 8)],
)
def test_results(
    ff: FakeFlux, service: Client, kind: str, exit_status: int, result: str, finish_status: int
) -> None:
    jobid = run_to_prolog(service, ff, runtime=None, exit_status=exit_status)
    service.call("prolog-finish", {"id": jobid, "success": True, "env": {}})
    ff.wait_event(jobid, "start", TIMEOUT)
    if kind is None:
        ff.finish(jobid, exit_status)
    else:
        ff.raise_exception(jobid, kind, 0, f"{kind} happened")
    ff.wait_event(jobid, "release", TIMEOUT)
    service.call("epilog-finish", {"id": jobid})
    info = ff.wait(jobid, timeout=TIMEOUT)
    assert info.result == result
    assert info.events("finish")[0]["context"]["status"] == finish_status


def test_runtime_ends_the_tasks_with_the_exit_status(ff: FakeFlux) -> None:
    ok, bad = ff.submit({}), ff.submit({}, exit_status=1)
    assert ff.wait(ok, timeout=TIMEOUT).result == "COMPLETED"
    info = ff.wait(bad, timeout=TIMEOUT)
    assert info.result == "FAILED" and info.events("finish")[0]["context"] == {"status": 256}


def test_failed_prolog_without_exception_still_starts_as_flux_does(
    ff: FakeFlux, service: Client
) -> None:
    jobid = run_to_prolog(service, ff)
    service.call("prolog-finish", {"id": jobid, "success": False})
    ff.wait_event(jobid, "epilog-start", TIMEOUT)
    assert ff.info(jobid).events("start")


def test_non_fatal_exception_changes_nothing(ff: FakeFlux, service: Client) -> None:
    jobid = ff.submit(DW)
    service.call("raise", {"id": jobid, "type": "dws", "severity": 1, "note": "slow"})
    info = ff.info(jobid)
    assert info.state == "DEPEND" and info.exception is None
    assert info.events("exception")[0]["context"]["severity"] == 1


def test_plain_job_cancelled_while_running_has_no_epilog(ff: FakeFlux) -> None:
    jobid = ff.submit({}, runtime=None)
    ff.wait(jobid, "RUN", TIMEOUT)
    ff.cancel(jobid)
    info = ff.wait(jobid, timeout=TIMEOUT)
    assert info.result == "CANCELED" and not info.events("epilog-start")
    with pytest.raises(OSError) as caught:
        ff.cancel(jobid)
    assert caught.value.errno == errno.EINVAL


# ----------------------------------------------------------------------------- protocol errors


def test_duplicate_and_late_requests_fail_without_touching_the_job(
    ff: FakeFlux, service: Client
) -> None:
    jobid = ff.submit(DW, runtime=None)
    assert service.fails("prolog-finish", {"id": jobid, "success": True}).errnum == errno.EINVAL
    service.call("release", {"id": jobid, "update": {}})
    err = service.fails("release", {"id": jobid, "update": {}})
    assert (
        err.errnum == errno.EINVAL
        and err.message == f"job {job_text(jobid)} is not waiting for its workflow"
    )
    ff.wait_event(jobid, "prolog-start", TIMEOUT)
    service.call("prolog-finish", {"id": jobid, "success": True, "env": {}})
    err = service.fails("prolog-finish", {"id": jobid, "success": True, "env": {}})
    assert err.errnum == errno.EINVAL and "prolog" in err.message
    assert service.fails("epilog-finish", {"id": jobid}).errnum == errno.EINVAL
    ff.finish(jobid)
    ff.wait_event(jobid, "epilog-start", TIMEOUT)
    service.call("raise", {"id": jobid, "type": "dws", "severity": 0, "note": "teardown failed"})
    err = service.fails("raise", {"id": jobid, "type": "dws", "severity": 0, "note": "again"})
    assert err.errnum == errno.EINVAL and "already" in err.message
    service.call("epilog-finish", {"id": jobid})
    info = ff.wait(jobid, timeout=TIMEOUT)
    assert service.fails("epilog-finish", {"id": jobid}).errnum == errno.EINVAL
    assert service.fails("release", {"id": jobid}).errnum == errno.EINVAL
    err = service.fails("raise", {"id": jobid, "type": "dws", "severity": 1, "note": ""})
    assert err.errnum == errno.EINVAL and "inactive" in err.message
    err = service.fails("post", {"id": jobid, "name": "dws-state", "context": {}})
    assert err.errnum == errno.ENOENT
    assert ff.info(jobid).eventlog == info.eventlog
    # Flux fixes the result at "finish"; the epilog's exception still fails `flux run`
    assert info.result == "COMPLETED" and info.attach_status == 1


@pytest.mark.parametrize(
    ("method", "payload", "errnum"),
    [
        ("post", {"id": "{ID}", "name": "state", "context": {}}, errno.EINVAL),
        ("post", {"id": "{ID}", "name": "dws-", "context": {}}, errno.EINVAL),
        ("post", {"id": "{ID}", "name": "dws-state", "context": []}, errno.EPROTO),
        ("post", {"id": 12345, "name": "dws-state", "context": {}}, errno.ENOENT),
        ("release", {"id": "{ID}", "update": {"system.dw_storage": {}}}, errno.EPROTO),
        ("release", {"id": "5"}, errno.EPROTO),
        ("release", {"id": 12345}, errno.ENOENT),
        ("prolog-finish", {"id": "{ID}"}, errno.EPROTO),
        ("prolog-finish", {"id": "{ID}", "success": True, "env": {"X": 1}}, errno.EPROTO),
        ("raise", {"id": "{ID}", "type": "two words", "severity": 0}, errno.EPROTO),
        ("raise", {"id": "{ID}", "type": "dws", "severity": 8}, errno.EPROTO),
        ("frobnicate", {}, errno.ENOSYS),
    ],
)
def test_malformed_requests(
    ff: FakeFlux, service: Client, method: str, payload: dict[str, Any], errnum: int
) -> None:
    jobid = ff.submit(DW)
    payload = {k: jobid if v == "{ID}" else v for k, v in payload.items()}
    err = service.fails(method, payload)
    assert err.errnum == errnum and "\n" not in err.message and err.message
    assert ff.info(jobid).event_names() == ["submit", "validate", "dependency-add", "dws-waiting"]


@pytest.mark.parametrize(
    ("method", "payload", "message"),
    [
        ("post", {"name": "state"}, "job-manager.dws.post: event name state must be dws-<name>"),
        ("post", {"name": "dws-"}, "job-manager.dws.post: event name dws- must be dws-<name>"),
        ("post", {}, "job-manager.dws.post: name must be dws-<name>"),
        (
            "save",
            {"key": "eventlog", "value": {}},
            "job-manager.dws.save: key eventlog must be dws.<name>[.<name>...]",
        ),
        ("save", {"value": {}}, "job-manager.dws.save: key must be dws.<name>[.<name>...]"),
    ],
)
def test_bad_names_get_the_c_plugins_words(
    ff: FakeFlux, service: Client, method: str, payload: dict[str, Any], message: str
) -> None:
    """The same texts as jobtap/methods.c and jobtap/save.c (t/t0001-dws-jobtap.t)."""
    err = service.fails(method, {"id": ff.submit(DW), **payload})
    assert err.errnum == errno.EINVAL and err.message == message


SNAPSHOT_SHAPE = (
    "job-manager.dws.persistent: storage must be a list of at most 4096 entries and unknown a"
    " string of at most 512 bytes"
)
ENTRY_SHAPE = (
    "job-manager.dws.persistent: entry 0 must have a name (at most 63 of [A-Za-z0-9._-]), an"
    " owner uid, refusal and others (text or null)"
)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"storage": 5, "unknown": "x"}, SNAPSHOT_SHAPE),
        ({"storage": []}, SNAPSHOT_SHAPE),
        ({"storage": [{}] * 4097, "unknown": "x"}, SNAPSHOT_SHAPE),
        ({"storage": [], "unknown": "x" * 513}, SNAPSHOT_SHAPE),
        ({"storage": [{"name": "a b", "owner": 1}], "unknown": "x"}, ENTRY_SHAPE),
        ({"storage": [{"name": "a", "owner": "me"}], "unknown": "x"}, ENTRY_SHAPE),
        ({"storage": [{"name": "a" * 64, "owner": 1}], "unknown": "x"}, ENTRY_SHAPE),
        (
            {"storage": [{"name": "a", "owner": 1, "others": "x" * 513}], "unknown": "x"},
            ENTRY_SHAPE,
        ),
    ],
)
def test_malformed_persistent_snapshots_get_the_c_plugins_words(
    ff: FakeFlux, service: Client, payload: dict[str, Any], message: str
) -> None:
    """As jobtap/persistent.c (t/t0001-dws-jobtap.t); the last good snapshot is kept."""
    good = {"storage": [{"name": "a", "owner": 1, "others": "no"}], "unknown": "@NAME@?"}
    assert service.call("persistent", good) == {}
    err = service.fails("persistent", payload)
    assert err.errnum == errno.EPROTO and err.message == message
    with pytest.raises(SubmitError, match="^no$"):
        ff.submit({"dw": "#DW persistentdw name=a"})
    with pytest.raises(SubmitError, match="^b[?]$"):
        ff.submit({"dw": "#DW persistentdw name=b"})


def test_job_ids_in_messages_are_f58_as_the_broker_writes_them(
    ff: FakeFlux, service: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLUX_F58_FORCE_ASCII", raising=False)
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    assert job_text(58) == "ƒ21"
    monkeypatch.setenv("LC_ALL", "C")
    assert job_text(58) == "f21"
    monkeypatch.setenv("LC_ALL", "en_US.UTF-8")
    monkeypatch.setenv("FLUX_F58_FORCE_ASCII", "1")
    assert job_text(58) == "f21"
    assert job_text(-1) == "-1"
    assert service.fails("release", {"id": -1}).message == "job -1 is not held by the dws plugin"
    err = service.fails("release", {"id": 12345})
    assert err.errnum == errno.ENOENT and err.message == "job f4fr is not held by the dws plugin"


@pytest.mark.parametrize(
    ("method", "payload"),
    [
        ("list", {}),
        ("release", {"id": "{ID}", "update": {}}),
        ("prolog-finish", {"id": "{ID}", "success": True}),
        ("epilog-finish", {"id": "{ID}"}),
        ("raise", {"id": "{ID}", "type": "dws", "severity": 0, "note": "x"}),
        ("post", {"id": "{ID}", "name": "dws-state", "context": {}}),
    ],
)
def test_non_owner_gets_eperm(ff: FakeFlux, method: str, payload: dict[str, Any]) -> None:
    jobid = ff.submit(DW)
    stranger = Client(ff, userid=ff.owner_uid + 1)
    try:
        payload = {k: jobid if v == "{ID}" else v for k, v in payload.items()}
        assert stranger.fails(method, payload).errnum == errno.EPERM
        box: queue.Queue[Any] = queue.Queue()
        stranger.transport.stream("watch", {"service": True}, lambda p, e: box.put((p, e)))
        payload, err = box.get(timeout=TIMEOUT)
        assert payload is None and err.errnum == errno.EPERM
    finally:
        stranger.close()
    assert ff.info(jobid).event_names() == ["submit", "validate", "dependency-add", "dws-waiting"]


def test_a_guest_is_refused_before_its_payload_is_read(ff: FakeFlux) -> None:
    """As in the C plugin: the role first, so a guest's payload that jansson would refuse, or
    a method that does not exist, still gets EPERM (nothing of it was parsed)."""
    stranger = Client(ff, userid=ff.owner_uid + 1)
    try:
        assert stranger.fails("post", {"id": 1, "name": "x\0"}).errnum == errno.EPERM
        assert stranger.fails("nosuch", {}).errnum == errno.EPERM
    finally:
        stranger.close()


def test_fakeflux_refuses_integers_jansson_cannot_hold(service: Client) -> None:
    """flux-core's json_loads refuses an integer outside int64 ("too big integer"): EPROTO."""
    assert service.fails("release", {"id": 1, "update": {"n": 2**63}}).errnum == errno.EPROTO
    assert service.fails("release", {"id": 1, "update": {"n": -(2**63) - 1}}).errnum == errno.EPROTO


def test_watch_needs_a_streaming_request(service: Client) -> None:
    assert service.fails("watch", {"service": True}).errnum == errno.EPROTO


# ----------------------------------------------------------------------------- service presence


def test_dws_waiting_while_no_service_watches(ff: FakeFlux) -> None:
    before = ff.submit(DW)
    assert ff.info(before).events("dws-waiting")[0]["context"] == {
        "reason": "flux-dws service is not running"
    }
    tool = Client(ff)
    tool.watch(service=False).snapshot()  # a `flux dws` command is not the service
    assert ff.info(ff.submit(DW)).events("dws-waiting")

    service = Client(ff)
    watch = service.watch()
    assert [r["dws"] for r in watch.snapshot()][0] == {
        "dws-waiting": {"reason": "flux-dws service is not running"}
    }
    during = ff.submit(DW)
    assert not ff.info(during).events("dws-waiting")
    assert not ff.info(ff.submit({})).events("dws-waiting")

    service.close()  # the service goes away
    ff.loop.run_sync(lambda: None)
    after = ff.submit(DW)
    assert ff.info(after).events("dws-waiting")
    assert ff.info(before).state == "DEPEND"  # waiting never kills a job
    tool.close()


def test_service_wait_expiry_raises_a_dws_exception(clock: FakeClock) -> None:
    with FakeFlux(HOSTS, service_wait=60, clock=clock) as ff:
        abandoned = ff.submit(DW)
        rescued = ff.submit(DW)
        service = Client(ff)
        service.watch().snapshot()
        seen = ff.submit(DW)
        service.close()
        ff.loop.run_sync(lambda: None)
        late = ff.submit(DW)
        ff.cancel(abandoned)  # already dead: the timer finds nothing to do
        clock.now += 61
        ff.loop.run_sync(lambda: None)
        ff.loop.run_sync(lambda: None)

        # the service left with rescued and seen in DEPEND: they were told again and their
        # service-wait started then, like late's, so all three ran out together
        for jobid in (late, rescued, seen):
            info = ff.info(jobid)
            assert info.state == "CLEANUP" and info.holds == {"epilog:dws"}
            exc = info.exception
            assert exc is not None and exc["type"] == "dws" and exc["severity"] == 0
            assert "service" in exc["note"] and "1m" in exc["note"]
        assert ff.info(rescued).event_names().count("dws-waiting") == 2
        assert ff.info(seen).event_names().count("dws-waiting") == 1
        assert len(ff.info(abandoned).events("exception")) == 1


# ----------------------------------------------------------------------------- watch streams


def test_gone_is_sent_once_to_watchers_that_knew_the_job(ff: FakeFlux, service: Client) -> None:
    early = service.watch()
    early.snapshot()
    jobid = run_to_epilog(service, ff, {"X": "1"})
    late_client = Client(ff)
    late = late_client.watch(service=False)
    assert [r["phase"] for r in late.snapshot()] == ["epilog"]
    service.call("epilog-finish", {"id": jobid})
    ff.wait(jobid, timeout=TIMEOUT)
    assert early.until(jobid, "gone")["phase"] == "gone"
    assert late.until(jobid, "gone")["id"] == jobid
    assert early.drain(ff) == [] and late.drain(ff) == []

    third = Client(ff)
    assert third.watch(service=False).snapshot() == []
    for client in (late_client, third):
        client.close()


def test_a_second_service_watch_waits_as_a_standby_and_takes_over(
    ff: FakeFlux, service: Client
) -> None:
    first = service.watch()
    first.snapshot()
    restarted = Client(ff)
    second = restarted.watch()
    standby = second.next()  # not a snapshot: the plugin keeps it as a standby
    assert standby["standby"] is True and "since" in standby["active"]
    told = first.next()  # the active one hears that a standby waits
    assert told["snapshot"] is False and told["jobs"] == [] and "since" in told["standby_waiting"]
    jobid = ff.submit(DW)
    assert first.until(jobid, "depend")["id"] == jobid  # the first one stays active
    assert service.call("heartbeat", {}) == {}
    service.close()  # the active service goes away: the standby gets the snapshot
    assert second.snapshot()[0]["id"] == jobid
    assert not ff.info(jobid).events("dws-waiting")  # a service was there all along
    restarted.close()


def test_cancelled_and_closed_streams_go_quiet(ff: FakeFlux, service: Client) -> None:
    watch = service.watch()
    watch.snapshot()
    watch.cancel()
    ff.submit(DW)
    assert watch.drain(ff) == []

    other = Client(ff)
    quiet = other.watch(service=False)
    quiet.snapshot()
    other.transport.close()
    ff.submit(DW)
    assert quiet.drain(ff) == []
    err = other.fails("list", {})
    assert err.errnum == errno.ENOTCONN
    other.loop.stop()


@pytest.mark.parametrize("hang_up", ["cancel", "close"])
def test_no_callback_runs_after_the_client_hung_up(ff: FakeFlux, hang_up: str) -> None:
    client_loop = Loop(name="idle-client")  # not running yet: responses wait in its queue
    transport = ff.connect(client_loop)
    seen: list[Any] = []
    cancel = transport.stream("watch", {"service": True}, lambda p, e: seen.append((p, e)))
    transport.rpc("list", {}, lambda p, e: seen.append((p, e)))
    ff.loop.run_sync(lambda: None)  # both answered, the answers queued on the client's loop
    if hang_up == "cancel":
        cancel()
        expected = [([], None)]  # the other request still gets its answer
    else:
        transport.close()
        expected = []
    client_loop.start_thread()
    client_loop.run_sync(lambda: None)
    assert [(p["jobs"], e) for p, e in seen] == expected
    client_loop.stop()


def test_gone_is_not_sent_to_a_watcher_that_never_saw_the_job(
    ff: FakeFlux, service: Client
) -> None:
    jobid = run_to_epilog(service, ff, {})
    newcomer = Client(ff)
    done: queue.Queue[Any] = queue.Queue()
    service.transport.rpc("epilog-finish", {"id": jobid}, lambda p, e: done.put(e))
    watch = newcomer.watch()  # read by the job-manager before it sends the job's last record
    assert done.get(timeout=TIMEOUT) is None
    assert watch.snapshot() == [] and watch.drain(ff) == []
    assert ff.wait(jobid, timeout=TIMEOUT).state == "INACTIVE"
    newcomer.close()


def test_stop_ends_the_streams(clock: FakeClock) -> None:
    ff = FakeFlux(HOSTS, clock=clock).start()
    client = Client(ff)
    watch = client.watch()
    watch.snapshot()
    ff.stop()
    with pytest.raises(RpcError) as caught:
        watch.next()
    assert caught.value.errnum == errno.ENOSYS
    client.close()


# ----------------------------------------------------------------------------- scheduling


def test_fifo_among_jobs_that_fit(ff: FakeFlux, service: Client) -> None:
    first = ff.submit({}, runtime=None)
    wide = ff.submit({}, nnodes=2, runtime=None)
    narrow = ff.submit(DW, runtime=None)
    service.call("release", {"id": narrow})
    ff.wait(first, "RUN", TIMEOUT)
    ff.wait_event(narrow, "prolog-start", TIMEOUT)  # skipped past the wide job, which waits
    assert ff.info(first).hosts == ["compute-01"] and ff.info(narrow).hosts == ["compute-02"]
    assert ff.info(wide).state == "SCHED"

    later = ff.submit({}, runtime=None)
    ff.finish(first)
    ff.wait(first, timeout=TIMEOUT)
    info = ff.wait(later, "RUN", TIMEOUT)  # fits in the freed host; the wide job still waits
    assert info.hosts == ["compute-01"] and ff.info(wide).state == "SCHED"

    service.call("prolog-finish", {"id": narrow, "success": True})
    ff.finish(later)
    ff.wait_event(narrow, "start", TIMEOUT)
    ff.finish(narrow)
    ff.wait_event(narrow, "epilog-start", TIMEOUT)
    assert ff.info(wide).state == "SCHED"  # the epilog still holds compute-02
    service.call("epilog-finish", {"id": narrow})
    assert ff.wait(wide, "RUN", TIMEOUT).hosts == HOSTS


# ----------------------------------------------------------------------------- submit-time checks


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"dw": ""}, "attributes.system.dw must be a non-empty string or list of strings"),
        ({"dw": []}, "attributes.system.dw must be a non-empty string or list of strings"),
        ({"dw": ["#DW a", 3]}, "attributes.system.dw must be a non-empty string or list"),
        ({"dw": {"a": 1}}, "attributes.system.dw must be a non-empty string or list"),
        ({"dw_timeout": {"prerun": "1m"}}, "attributes.system.dw_timeout requires"),
        ({"dw": "#DW x", "dw_timeout": "10m"}, "attributes.system.dw_timeout must be a table"),
        ({"dw": "#DW x", "dw_timeout": {"prerun": -1}}, "attributes.system.dw_timeout.prerun"),
        ({"dw": "#DW x", "dw_timeout": {"setup": True}}, "attributes.system.dw_timeout.setup"),
        ({"dw": "#DW x", "dw_timeout": {"setup": None}}, "attributes.system.dw_timeout.setup"),
        ({"dw": "#DW x", "bad": {1, 2}}, "not valid JSON"),
    ],
)
def test_submit_refuses_malformed_attributes(
    ff: FakeFlux, attributes: dict[str, Any], message: str
) -> None:
    with pytest.raises(SubmitError) as caught:
        ff.submit(attributes)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert ff.jobs() == []


def test_submit_accepts_well_formed_attributes(ff: FakeFlux) -> None:
    for attributes in (
        {"dw": ["#DW jobdw type=xfs capacity=1GiB name=a", "#DW copy_in source=/a dest=$X"]},
        {"dw": "#DW x", "dw_timeout": {"prerun": 0, "setup": 2.5, "teardown": "1h"}},
    ):
        assert ff.info(ff.submit(attributes)).state == "DEPEND"


def test_validator_runs_first_and_sees_the_submitter(clock: FakeClock) -> None:
    calls: list[tuple[dict[str, Any], int]] = []

    def validator(attributes: dict[str, Any], userid: int, resources: Any) -> str | None:
        calls.append((attributes, userid))
        return "dw: directive 1: unknown command 'jbdw'" if "jbdw" in attributes["dw"] else None

    with FakeFlux(HOSTS, clock=clock, validator=validator) as ff:
        with pytest.raises(SubmitError, match="directive 1: unknown command 'jbdw'"):
            ff.submit({"dw": "#DW jbdw"}, userid=77)
        assert calls == [({"dw": "#DW jbdw"}, 77)]
        with pytest.raises(SubmitError, match="dw must be"):
            ff.submit({"dw": ""})
        assert ff.jobs() == []
        assert ff.info(ff.submit(DW)).state == "DEPEND"


def test_submit_refuses_unsatisfiable_jobs(ff: FakeFlux) -> None:
    with pytest.raises(SubmitError, match="unsatisfiable request: 3 nodes"):
        ff.submit({}, nnodes=3)
    assert ff.jobs() == []


# ----------------------------------------------------------------------------- user-side errors


def test_user_side_errors(ff: FakeFlux) -> None:
    jobid = ff.submit(DW)
    with pytest.raises(OSError) as caught:
        ff.finish(jobid)
    assert caught.value.errno == errno.EINVAL
    with pytest.raises(OSError) as caught:
        ff.info(jobid + 1)
    assert caught.value.errno == errno.ENOENT
    with pytest.raises(TimeoutError, match=r"DEPEND after submit, validate, dependency-add"):
        ff.wait(jobid, "RUN", timeout=0.05)
    with pytest.raises(ValueError, match="unknown job state"):
        ff.wait(jobid, "RUNNING")


def test_jobs_already_waiting_are_told_when_the_service_goes(ff: FakeFlux) -> None:
    service = Client(ff)
    service.watch().snapshot()
    jobid = ff.submit(DW)
    ff.wait_event(jobid, "dependency-add", timeout=TIMEOUT)
    assert "dws-waiting" not in ff.info(jobid).event_names()
    service.close()  # the service dies with the job in DEPEND
    ff.wait_event(jobid, "dws-waiting", timeout=TIMEOUT)
    assert ff.info(jobid).event_names().count("dws-waiting") == 1


def test_a_scheduling_pass_looks_at_the_drains_once_not_per_job_and_host(clock: FakeClock) -> None:
    """bench_elcap: with 11,520 hosts and 2,000 held jobs in this process, a pass that read
    the drained hosts for every job and every free host held the GIL for seconds, and the
    service's start-up reconcile with it."""
    hosts = [f"compute-{i:02d}" for i in range(1, 9)]
    with FakeFlux(hosts, clock=clock) as ff:
        held = [ff.submit(DW, runtime=None) for _ in range(5)]  # in DEPEND: never scheduled
        looked = []
        real = ff.drains.drained_hosts

        def drained_hosts() -> set[str]:
            looked.append(1)
            return real()

        ff.drains.drained_hosts = drained_hosts  # type: ignore[method-assign]
        ff.loop.run_sync(ff._schedule)
        assert looked == [] and all(ff.info(j).state == "DEPEND" for j in held)
        assert ff._queued == set()  # a pass goes over the jobs waiting for it, no others
        ff.drain("compute-01", "bad")
        plain = ff.submit({}, runtime=None)
        ff.wait_event(plain, "alloc", TIMEOUT)
        assert len(looked) <= 2 and ff.info(plain).hosts == ["compute-02"]


def test_the_scheduler_skips_drained_hosts_and_gives_freed_ones_in_submit_order(
    ff: FakeFlux,
) -> None:
    ff.drain("compute-01", "bad disk")
    first, second, third = (ff.submit({}, runtime=None) for _ in range(3))
    assert ff.wait(first, "RUN", timeout=TIMEOUT).hosts == ["compute-02"]
    assert {ff.info(second).state, ff.info(third).state} == {"SCHED"}
    ff.undrain("compute-01")
    assert ff.wait(second, "RUN", timeout=TIMEOUT).hosts == ["compute-01"]
    assert ff.info(third).state == "SCHED"
    ff.finish(first)
    assert ff.wait(third, "RUN", timeout=TIMEOUT).hosts == ["compute-02"]
    for job in (second, third):
        ff.finish(job)
        ff.wait(job, timeout=TIMEOUT)
