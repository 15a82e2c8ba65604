# SPDX-License-Identifier: LGPL-3.0-only
"""Data from Kubernetes is untrusted: each bad object fails its own job clearly, or holds it,
and never wedges a job or the service (issue 12, part B).

Scenarios run the real service against kubeapi + dwssim + fakeflux; the bad data is put in
by admission hooks on kubeapi's store, as a misbehaving controller would write it.
"""

from __future__ import annotations

import copy
import dataclasses
import errno
import os
import pwd
import threading
from typing import Any

import pytest
from waiting import wait_for

from flux_dws.base.errors import PolicyError
from flux_dws.base.loop import Loop
from flux_dws.base.untrusted import jansson_problem, json_safe
from flux_dws.base.untrusted import text as one_line
from flux_dws.core.actions import RaiseException
from flux_dws.core.failing import give_up
from flux_dws.core.jobview import JobException, JobPhase, JobView
from flux_dws.core.lifecycle import decide
from flux_dws.core.policy import Policy, policy_from_table
from flux_dws.core.request import MAX_DIRECTIVE_BYTES, request_from_attributes
from flux_dws.core.states import State
from flux_dws.core.storage import (
    BreakdownPending,
    StorageError,
    breakdown_error,
    needs_from_breakdowns,
)
from flux_dws.flux.jobmanager import JobManager
from flux_dws.flux.jobrecords import job_view
from flux_dws.flux.transport import RpcError
from flux_dws.k8s.calls import merge_patch_kwargs
from flux_dws.k8s.errors import KubeError, NameTaken, is_permanent
from flux_dws.service.outcome import Retry, outcome_of
from flux_dws.testing.fakeflux import FakeFlux
from flux_dws.testing.kubeapi import ApiError
from flux_dws.testing.stack import Stack
from flux_dws.validator import validate_attributes

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
PRERUN_FATAL = "#DW PreRun action=error message=boom severity=Fatal"


@pytest.fixture(params=["fake", "flux"])
def backend(request) -> str:
    """fakeflux always; a real Flux instance (jansson, the C plugin) where flux-core is."""
    if request.param == "flux":
        from flux_dws.flux.bindings import flux_command

        if flux_command() is None:
            pytest.skip("flux-core is not installed: real Flux skipped")
    return request.param


def note(info: Any) -> str:
    return (info.exception or {}).get("note", "")


def assert_clean(stack: Stack, info: Any) -> None:
    """Nothing held, and the workflow goes (the job may end as soon as flux-dws has let go of
    it, while DWS still finishes deleting it)."""
    assert info.state == "INACTIVE"
    assert not info.holds, info.holds
    mine = f"fluxjob-{stack.identity}-{info.id}"
    wait_for(
        lambda: not [w for w in stack.workflows() if w["metadata"]["name"] == mine],
        what=f"workflow {mine} to be deleted",
    )


def on_workflows(stack: Stack, change: Any) -> None:
    """Let ``change(operation, new)`` rewrite every workflow write (as a buggy controller)."""
    assert stack.api is not None

    def hook(operation: str, old: dict | None, new: dict) -> dict:
        change(operation, new)
        return new

    stack.api.store.add_admission("workflows", hook)


# ---------------------------------------------------------------------------- sanitize


def test_one_line_escapes_controls_and_cuts_short():
    assert one_line("a\nb\x00c\x1b[1m\u0085") == "a\\nb\\x00c\\x1b[1m\\x85"
    assert one_line("x" * 100, 10) == "xxxxxxx..."
    assert one_line("\ud800") == "\ufffd"


def test_json_safe_leaves_nothing_jansson_refuses():
    payload = {"a\x00": ["\x00", "\udfff", float("nan"), {"k": float("inf")}], "n": 1}
    assert jansson_problem(payload) is not None
    assert jansson_problem(json_safe(payload)) is None
    assert json_safe({"ok": "plain text"}) == {"ok": "plain text"}


def rpc(flux: FakeFlux, method: str, payload: dict) -> tuple[Any, RpcError | None]:
    """One request to fakeflux's plugin, as the instance owner, waited for."""
    loop = Loop()
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    result: list[Any] = []
    done = threading.Event()
    conn = flux.connect(loop, userid=flux.owner_uid)

    def answered(response: Any, error: RpcError | None) -> None:
        result.extend([response, error])
        done.set()

    try:
        loop.call_soon(conn.rpc, method, payload, answered)
        assert done.wait(10)
    finally:
        conn.close()
        loop.call_soon(loop.stop)
        thread.join(5)
    return result[0], result[1]


def test_fakeflux_refuses_what_jansson_refuses_and_the_job_manager_client_does_not_send_it():
    flux = FakeFlux(["node1"], owner_uid=os.getuid()).start()
    try:
        jobid = flux.submit({"dw": JOBDW}, runtime=0.0)
        _, error = rpc(flux, "raise", {"id": jobid, "type": "dws", "severity": 1, "note": "a\x00b"})
        assert error is not None and error.errnum == errno.EPROTO
        _, error = rpc(flux, "post", {"id": jobid, "name": "dws-x", "context": {"v": float("nan")}})
        assert error is not None and error.errnum == errno.EPROTO
        sent: list[dict] = []

        class Recorder:
            def rpc(self, method: str, payload: dict, on_done: Any) -> None:
                sent.append(payload)

        jm = JobManager(Recorder())  # type: ignore[arg-type]
        jm.raise_exception(jobid, "dws", 0, "bad\x00 news\nhere", lambda *_: None)
        jm.post(jobid, "dws-x", {"m": "a\x00\x1b", "f": float("nan")}, lambda *_: None)
        jm.prolog_finish(jobid, True, {"A": "x\x00"}, lambda *_: None)
        assert all(jansson_problem(p) is None for p in sent)
        assert sent[0]["note"] == "bad\\x00 news\\nhere"
        assert sent[1]["context"]["m"] == "a\\x00\\x1b"
    finally:
        flux.stop()


# ---------------------------------------------------------------------------- errors


def test_permanent_and_transient_failures():
    from kubernetes.client.exceptions import ApiTypeError

    assert is_permanent(ApiTypeError("Got an unexpected keyword argument '_content_type'"))
    assert is_permanent(NameTaken("create", "workflow", "default/x"))
    for status in (400, 403, 404, 413, 422):
        assert is_permanent(KubeError("create", "workflow", "x", "no", status=status))
    for status in (None, 409, 429, 500, 503):
        assert not is_permanent(KubeError("create", "workflow", "x", "no", status=status))
    assert not is_permanent(ConnectionResetError())


def test_merge_patch_keyword_only_where_the_client_takes_it():
    from flux_dws.k8s.calls import MERGE_PATCH

    def old(group, version, namespace, plural, name, body, **kwargs): ...  # noqa: ANN001
    def new(group, version, namespace, plural, name, body, _content_type=None): ...  # noqa: ANN001

    assert merge_patch_kwargs(old) == {}
    assert merge_patch_kwargs(new) == {"_content_type": MERGE_PATCH}


# ---------------------------------------------------------------------------- breakdowns


def breakdown(status: Any) -> dict:
    return {"metadata": {"name": "bd-0"}, "status": status}


def test_breakdown_error_object_shows_the_user_message_not_the_debug_one():
    error = {
        "userMessage": "storage profile not found",
        "debugMessage": "secret internal detail",
        "type": "User",
        "severity": "Fatal",
    }
    with pytest.raises(StorageError) as info:
        needs_from_breakdowns([breakdown({"error": error})])
    assert "User error: storage profile not found" in str(info.value)
    assert "secret internal detail" not in str(info.value)
    assert "no user message" in breakdown_error({"debugMessage": "x", "type": "Internal"})


def ready_breakdown(error: Any, ready: bool = True) -> dict:
    storage = {
        "reference": {"namespace": "default", "name": "bd-0"},
        "allocationSets": [
            {"label": "xfs", "allocationStrategy": "AllocatePerCompute", "minimumCapacity": 1024}
        ],
    }
    return breakdown({"ready": ready, "storage": storage, "error": error})


def test_a_recoverable_breakdown_error_on_a_ready_breakdown_is_not_a_failure():
    """nnf-sos sets a Minor error on a DirectiveBreakdown already ready when a later reconcile
    trips on its own cache ("servers ... already exists") and clears it on the next one: the
    job failed in Proposal with "Internal error" about one nnf-sos job in five."""
    minor = {"type": "Internal", "severity": "Minor", "debugMessage": "already exists"}
    (need,) = needs_from_breakdowns([ready_breakdown(minor)])
    assert (need.label, need.capacity) == ("xfs", 1024)
    with pytest.raises(BreakdownPending, match="'bd-0' is not ready: Internal error"):
        needs_from_breakdowns([ready_breakdown({**minor, "severity": "Major"}, ready=False)])
    for fatal in ({**minor, "severity": "Fatal"}, {"type": "Internal"}, "broken"):
        with pytest.raises(StorageError):  # Fatal, or no severity DWS would write: as before
            needs_from_breakdowns([ready_breakdown(fatal)])


def test_a_pending_breakdown_is_retried_within_the_state_timeout_not_failed():
    policy = Policy()
    job = JobView(1, JobPhase.DEPEND, userid=1, groupid=1)
    pending = BreakdownPending("DirectiveBreakdown 'bd-0' is not ready: Internal error")

    def verdict(exc: BaseException, failing_for: float) -> str | None:
        outcome = outcome_of(exc, "reading the Proposal")
        assert isinstance(outcome, Retry) and outcome.failure is not None
        refusal = give_up(job, None, outcome.failure, failing_for, policy)
        return refusal.reason if refusal is not None else None

    assert verdict(pending, 1.0) is None
    late = verdict(pending, 1e9)
    assert late and late.startswith("reading the Proposal kept failing for 10m:")
    assert verdict(ValueError("x"), 1.0) == "reading the Proposal: ValueError: x"  # permanent
    # a job that failed already keeps retrying: its workflow must still go
    failed = dataclasses.replace(job, exception=JobException("cancel"))
    assert give_up(failed, None, outcome_of(ValueError("x"), "x").failure, 1e9, policy) is None


@pytest.mark.parametrize(
    "status,field",
    [
        ("not a map", "status"),
        ({"storage": []}, "storage"),
        ({"storage": {"reference": {"name": "s"}, "allocationSets": {"a": 1}}}, "allocationSets"),
        ({"storage": {"reference": {"name": "s"}, "allocationSets": ["x"]}}, "allocationSets[0]"),
        ({"storage": {"reference": {"name": 5}}}, "reference"),
        (
            {
                "storage": {
                    "reference": {"name": "s"},
                    "allocationSets": [
                        {
                            "allocationStrategy": "AllocatePerCompute",
                            "minimumCapacity": 1,
                            "constraints": {"count": "2"},
                        }
                    ],
                }
            },
            "count",
        ),
    ],
)
def test_breakdown_fields_of_the_wrong_type_name_the_field(status, field):
    with pytest.raises(StorageError) as info:
        needs_from_breakdowns([breakdown(status)])
    assert field in str(info.value)


# ---------------------------------------------------------------------------- scenarios


def test_nul_and_controls_in_a_dws_message_fail_the_job_with_it_escaped_and_tear_down(backend):
    def poison(_op: str, wf: dict) -> None:
        status = wf.get("status") or {}
        if "boom" in (status.get("message") or ""):
            status["message"] = status["message"].replace("boom", "bo\x00om\n\x1b[2J")
        for driver in status.get("drivers") or []:
            if "boom" in (driver.get("message") or ""):
                driver["message"] = driver["message"].replace("boom", "bo\x00om\n\x1b[2J")

    with Stack(hosts=2, backend=backend) as stack:
        on_workflows(stack, poison)
        info = stack.wait(stack.submit([JOBDW, PRERUN_FATAL]), timeout=60)
        assert info.exception and info.exception["type"] == "dws"
        assert "bo\\x00om\\n\\x1b[2J" in note(info)
        assert [e["context"]["state"] for e in info.events("dws-state")][-1] == "Teardown"
        assert_clean(stack, info)


def test_an_unreadable_workflow_holds_the_job_then_it_goes_on(backend):
    broken = threading.Event()
    broken.set()

    def pending(_op: str, wf: dict) -> None:
        status = wf.get("status") or {}
        if broken.is_set() and status.get("state") == "Proposal" and status.get("ready"):
            status["status"] = "Pending"  # not a value this flux-dws knows

    with Stack(hosts=2, backend=backend) as stack:
        on_workflows(stack, pending)
        jobid = stack.submit(JOBDW, runtime=0.0)
        event = stack.wait_event(jobid, "dws-workflow-unreadable", timeout=60)
        assert "status.status" in event["context"]["problem"]
        assert "'Pending'" in event["context"]["problem"]
        # held, not taken as deleted: the job has no exception and its workflow is kept
        assert stack.wait(jobid, "DEPEND", timeout=60).exception is None
        assert [w for w in stack.workflows() if w["metadata"]["name"].endswith(f"-{jobid}")]
        broken.clear()
        assert stack.api is not None
        name = f"fluxjob-{stack.identity}-{jobid}"
        stack.api.store.patch("workflows", "default", name, {"status": {"status": "Completed"}})
        info = stack.wait(jobid, timeout=60)
        assert info.result == "COMPLETED", info.exception
        assert_clean(stack, info)


def test_an_unreadable_workflow_at_start_up_is_not_taken_as_deleted():
    broken = threading.Event()

    def pending(_op: str, wf: dict) -> None:
        if broken.is_set():  # a newer DWS, say, with a status value this flux-dws lacks
            (wf.get("status") or {})["status"] = "Pending"

    with Stack(hosts=2) as stack:
        on_workflows(stack, pending)
        jobid = stack.submit(JOBDW, runtime=None)  # runs until cancelled below
        stack.wait(jobid, "RUN", timeout=60)
        stack.kill_service()
        assert stack.api is not None
        name = f"fluxjob-{stack.identity}-{jobid}"
        broken.set()
        stack.api.store.patch("workflows", "default", name, {"metadata": {"labels": {"x": "1"}}})
        stack.start_service()
        event = stack.wait_event(jobid, "dws-workflow-unreadable", timeout=60)
        assert "status.status" in event["context"]["problem"]
        assert stack.flux.info(jobid).exception is None
        broken.clear()
        stack.api.store.patch("workflows", "default", name, {"status": {"status": "Completed"}})
        stack.cancel(jobid)
        info = stack.wait(jobid, timeout=60)
        assert "deleted outside" not in note(info)
        assert_clean(stack, info)


def test_a_permanent_create_error_fails_the_job_at_once_and_frees_its_proposal_slot():
    with Stack(hosts=2, config={"max-proposals": 1}) as stack:
        assert stack.api is not None

        def refuse(operation: str, old: dict | None, new: dict) -> None:
            lines = (new.get("spec") or {}).get("dwDirectives") or []
            if operation == "CREATE" and any("name=huge" in line for line in lines):
                raise ApiError(413, "RequestEntityTooLarge", "Request entity too large: limit 3MB")

        stack.api.store.add_admission("workflows", refuse)
        bad = stack.submit("#DW jobdw type=xfs capacity=10GiB name=huge")
        good = stack.submit(JOBDW, runtime=0.0)
        info = stack.wait(bad, timeout=60)
        assert "Request entity too large" in note(info), note(info)
        assert stack.wait(good, timeout=60).result == "COMPLETED"


def test_transient_create_errors_are_bounded_by_the_proposal_timeout():
    with Stack(hosts=2) as stack:
        assert stack.api is not None

        def unavailable(operation: str, old: dict | None, new: dict) -> None:
            if operation == "CREATE":
                raise ApiError(503, "ServiceUnavailable", "etcd is sad")

        stack.api.store.add_admission("workflows", unavailable)
        info = stack.wait(stack.submit(JOBDW, timeouts={"proposal": "2s"}), timeout=60)
        assert "kept failing for 2s" in note(info) and "etcd is sad" in note(info)
        assert not info.holds


def unknown_uid() -> int:
    uid = 3_999_000
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


def test_a_user_without_a_group_is_failed_never_given_gid_equal_uid():
    with Stack(hosts=2, config={"restrict-persistent": False}) as stack:
        uid = unknown_uid()
        info = stack.wait(stack.submit(JOBDW, userid=uid), timeout=60)
        assert "no passwd entry" in note(info), note(info)
        assert stack.workflows_left() == []
        assert stack.service is not None and uid not in stack.service.executor.gids  # not cached


@pytest.mark.parametrize(
    "env,named",
    [({"BAD=NAME": "x"}, "BAD=NAME"), ({"1ST": "x"}, "1ST"), ({"DW_JOB_x": "a\x00b"}, "DW_JOB_x")],
)
def test_a_bad_environment_variable_fails_the_job_naming_it(env, named, backend):
    def add_env(_op: str, wf: dict) -> None:
        status = wf.get("status") or {}
        if status.get("state") == "PreRun":
            status.setdefault("env", {}).update(env)

    with Stack(hosts=2, backend=backend) as stack:
        on_workflows(stack, add_env)
        info = stack.wait(stack.submit(JOBDW), timeout=60)
        assert named in note(info), note(info)
        assert "start" not in [e["name"] for e in info.eventlog]
        assert_clean(stack, info)


def test_a_token_secret_elsewhere_than_dws_puts_it_fails_the_copy_offload_job():
    def elsewhere(_op: str, wf: dict) -> None:
        token = (wf.get("status") or {}).get("workflowToken")
        if token:
            token["secretNamespace"] = "kube-system"

    with Stack(hosts=2) as stack:
        on_workflows(stack, elsewhere)
        info = stack.wait(stack.submit(f"{JOBDW} requires=copy-offload"), timeout=60)
        assert "workflowToken" in note(info) and "kube-system" in note(info), note(info)
        assert "DW_WORKFLOW_TOKEN" not in (info.env or {})
        assert_clean(stack, info)


def test_a_copy_offload_job_whose_token_is_missing_fails_instead_of_starting():
    with Stack(hosts=2) as stack:
        assert stack.api is not None

        def no_token(operation: str, old: dict | None, new: dict) -> dict:
            new.pop("data", None)  # the Secret is there, its token is not
            return new

        stack.api.store.add_admission("secrets", no_token)
        info = stack.wait(stack.submit(f"{JOBDW} requires=copy-offload"), timeout=60)
        assert "copy-offload" in note(info) and "token" in note(info), note(info)
        assert "start" not in [e["name"] for e in info.eventlog]
        assert_clean(stack, info)


def test_one_bad_workflow_among_good_ones_fails_only_its_own_job():
    def bad_for_one(_op: str, wf: dict) -> None:
        status = wf.get("status") or {}
        lines = (wf.get("spec") or {}).get("dwDirectives") or []
        if status.get("state") == "PreRun" and any("name=odd" in line for line in lines):
            status.setdefault("env", {})["no good"] = "\x00"

    with Stack(hosts=4) as stack:
        on_workflows(stack, bad_for_one)
        good = [stack.submit(JOBDW, runtime=0.0) for _ in range(3)]
        bad = stack.submit("#DW jobdw type=xfs capacity=10GiB name=odd", runtime=0.0)
        for jobid in good:
            info = stack.wait(jobid, timeout=60)
            assert info.result == "COMPLETED", info.exception
            assert_clean(stack, info)
        info = stack.wait(bad, timeout=60)
        assert "'no good'" in note(info), note(info)
        assert_clean(stack, info)


def test_a_name_taken_by_a_workflow_that_is_not_ours_fails_the_job_clearly():
    with Stack(hosts=2) as stack:
        assert stack.api is not None
        store = stack.api.store
        squatted = threading.Event()

        def squat(operation: str, old: dict | None, new: dict) -> None:
            """Someone else's workflow takes the name just before ours is created."""
            if operation != "CREATE" or squatted.is_set():
                return
            squatted.set()
            foreign = copy.deepcopy(new)
            foreign["metadata"]["labels"] = {"flux-dws.flux-framework.org/instance": "other"}
            foreign["metadata"].pop("finalizers", None)
            store.create("workflows", "default", foreign)
            raise ApiError(409, "AlreadyExists", "workflows already exists")

        store.add_admission("workflows", squat)
        info = stack.wait(stack.submit(JOBDW), timeout=60)
        assert "already exists and is not this instance's" in note(info), note(info)
        assert not info.holds
        (foreign,) = store.list("workflows", "default")[0]
        assert foreign["metadata"]["labels"] == {"flux-dws.flux-framework.org/instance": "other"}


def test_a_client_that_refuses_the_call_fails_the_job_at_once_not_after_endless_retries():
    """What kubernetes 33.1.0 did with ``_content_type``: the client itself refuses the patch
    (ApiTypeError before any request).  No retry can help: the job fails with the reason."""
    with Stack(hosts=2) as stack:
        assert stack.service is not None
        kube = stack.service.kube
        kube._merge_patch = {"_no_such_keyword": "x"}  # the real client refuses it
        before = kube.request_counts().get("patch", 0)
        jobid = stack.submit(JOBDW, runtime=0.0)
        event = stack.wait_event(jobid, "exception", timeout=60)
        assert "_no_such_keyword" in event["context"]["note"], event
        assert kube.request_counts().get("patch", 0) - before <= 4
        kube._merge_patch = merge_patch_kwargs(kube._custom.patch_namespaced_custom_object)
        info = stack.wait(jobid, timeout=60)
        assert_clean(stack, info)


def test_teardown_is_asked_even_when_flux_refuses_the_exception():
    with Stack(hosts=2) as stack:
        assert stack.service is not None
        jm = stack.service.jm
        real_raise = jm.raise_exception

        def refused(jobid: int, type_: str, severity: int, note_: str, on_done: Any) -> None:
            stack.service.loop.call_soon(on_done, None, RpcError(errno.EPROTO, "refused"))

        jm.raise_exception = refused  # type: ignore[method-assign]
        jobid = stack.submit([JOBDW, PRERUN_FATAL])
        stack.wait_workflow(jobid, State.TEARDOWN, timeout=60)
        jm.raise_exception = real_raise  # type: ignore[method-assign]
        info = stack.wait(jobid, timeout=60)
        assert "Reported error: boom" in note(info), note(info)
        assert_clean(stack, info)


# ---------------------------------------------------------------------------- lifecycle


def recorded_teardown(phase: JobPhase, reason: str) -> JobView:
    request = request_from_attributes({"dw": JOBDW}, Policy(), userid=1, owner_uid=1)
    return JobView(
        7,
        phase,
        userid=1,
        groupid=1,
        request=request,
        workflow_created=True,
        posted_state=State.TEARDOWN,
        teardown_reason=reason,
    )


@pytest.mark.parametrize("phase", [JobPhase.DEPEND, JobPhase.SCHED, JobPhase.PROLOG])
def test_a_job_torn_down_before_it_ran_is_failed_with_the_recorded_reason(phase):
    """The raise was refused before Teardown; once the workflow is gone the job still gets
    the reason recorded with Teardown, and is never left waiting."""
    job = recorded_teardown(phase, "PreRun failed: disk on fire")
    actions = decide(job, None, Policy(), 1e9)
    raised = [a for a in actions if isinstance(a, RaiseException)]
    assert [r.note for r in raised] == ["PreRun failed: disk on fire"]
    bare = decide(recorded_teardown(phase, ""), None, Policy(), 1e9)
    assert any(isinstance(a, RaiseException) for a in bare)


def test_the_teardown_reason_is_read_back_from_the_job_record():
    record = {
        "id": 7,
        "userid": 1,
        "phase": "prolog",
        "dws": {"dws-state": {"state": "Teardown", "deadline": None, "reason": "why"}},
    }
    view = job_view(record, (None, "x"), groupid=1)
    assert view.teardown_reason == "why"


# ---------------------------------------------------------------------------- size limits


def refused(system: dict, table: dict | None = None) -> str | None:
    return validate_attributes(system, policy_from_table(table or {}), userid=5, owner_uid=5)


def test_size_limits_have_sane_defaults_and_are_refused_at_submit():
    many = [JOBDW.replace("scratch", f"s{i}") for i in range(101)]
    assert "101 #DW directives" in refused({"dw": many})
    assert "max-directives" in refused({"dw": many})
    assert refused({"dw": many[:100]}) is None
    huge = "#DW jobdw type=xfs capacity=10GiB name=" + "a" * 1_000_000
    problem = refused({"dw": huge})
    assert "max-directives-bytes" in problem and len(problem) < 200
    assert "max-directives-bytes" in refused({"dw": [JOBDW] * 100_000})


def test_size_limits_follow_the_site_config():
    three = [JOBDW.replace("scratch", name) for name in ("aa", "bb", "cc")]
    assert refused({"dw": three[:2]}, {"max-directives": 2}) is None
    assert "limit of 2" in refused({"dw": three}, {"max-directives": 2})
    assert refused({"dw": JOBDW}, {"max-directives-bytes": 100}) is None
    long_name = JOBDW.replace("scratch", "n" * 80)
    assert "limit of 100" in refused({"dw": long_name}, {"max-directives-bytes": 100})


def test_one_directive_may_not_exceed_its_own_limit():
    table = {"max-directives-bytes": 1024 * 1024}  # the most a site may allow
    name = "n" * (MAX_DIRECTIVE_BYTES + 1)
    problem = refused({"dw": f"#DW jobdw type=xfs capacity=1GiB name={name}"}, table)
    assert problem is not None and "one directive" in problem


@pytest.mark.parametrize(
    "key,value", [("max-directives", 0), ("max-directives-bytes", 10), ("max-directives", "9")]
)
def test_size_limit_keys_are_checked(key, value):
    with pytest.raises(PolicyError, match=f"\\[dws\\] {key}"):
        policy_from_table({key: value})


@pytest.mark.parametrize(
    "change,expected",
    [
        (
            {
                "error": {
                    "userMessage": "no such storage profile",
                    "debugMessage": 'nnfstorageprofiles.nnf.cray.hpe.com "x" not found',
                    "type": "User",
                    "severity": "Fatal",
                }
            },
            "User error: no such storage profile",
        ),
        ({"storage": {"reference": {"name": "s"}, "allocationSets": "many"}}, "allocationSets"),
    ],
)
def test_a_bad_directive_breakdown_fails_the_job_clearly_instead_of_retrying(change, expected):
    def spoil(operation: str, old: dict | None, new: dict) -> dict:
        if isinstance(new.get("status"), dict):
            new["status"].update(copy.deepcopy(change))
        return new

    with Stack(hosts=2) as stack:
        assert stack.api is not None
        stack.api.store.add_admission("directivebreakdowns", spoil)
        info = stack.wait(stack.submit(JOBDW), timeout=60)
        assert expected in note(info), note(info)
        assert "debugMessage" not in note(info) and "not found" not in note(info)
        assert_clean(stack, info)


def test_a_state_change_that_keeps_failing_transiently_fails_the_job_after_the_state_timeout():
    with Stack(hosts=2) as stack:
        assert stack.api is not None

        def no_setup(operation: str, old: dict | None, new: dict) -> None:
            if operation == "UPDATE" and (new.get("spec") or {}).get("desiredState") == "Setup":
                raise ApiError(503, "ServiceUnavailable", "webhook backend down")

        stack.api.store.add_admission("workflows", no_setup)
        info = stack.wait(stack.submit(JOBDW, timeouts={"proposal": "2s"}), timeout=90)
        assert "asking for Setup kept failing for 2s" in note(info), note(info)
        assert "webhook backend down" in note(info)
        assert_clean(stack, info)


def test_a_job_held_for_an_unreadable_workflow_keeps_no_proposal_slot():
    broken = threading.Event()
    broken.set()

    def pending(_op: str, wf: dict) -> None:
        lines = (wf.get("spec") or {}).get("dwDirectives") or []
        status = wf.get("status") or {}
        if broken.is_set() and any("name=odd" in line for line in lines) and status.get("ready"):
            status["status"] = "Pending"

    with Stack(hosts=2, config={"max-proposals": 1}) as stack:
        on_workflows(stack, pending)
        held = stack.submit("#DW jobdw type=xfs capacity=1GiB name=odd", runtime=0.0)
        stack.wait_event(held, "dws-workflow-unreadable", timeout=60)
        other = stack.submit(JOBDW, runtime=0.0)
        assert stack.wait(other, timeout=60).result == "COMPLETED"
        broken.clear()
        assert stack.api is not None
        name = f"fluxjob-{stack.identity}-{held}"
        stack.api.store.patch("workflows", "default", name, {"status": {"status": "Completed"}})
        info = stack.wait(held, timeout=60)
        assert info.result == "COMPLETED", info.exception
        assert_clean(stack, info)
