# SPDX-License-Identifier: LGPL-3.0-only
"""Hypothesis fuzzing of every function that reads a DWS or NNF object (issue 12, part B).

Anything from Kubernetes may hold any JSON value anywhere.  Each reader either returns or
raises ValueError (DwsError, StorageError) whose message is one line, jansson-safe and
bounded; no other exception, and nothing that Flux would refuse.  Objects are drawn two
ways: arbitrary JSON, and a well-formed object with one place replaced by junk (which gets
much deeper into the readers).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from waiting import wait_for

from flux_dws.base.fsd import parse_fsd
from flux_dws.base.untrusted import jansson_problem, json_safe
from flux_dws.base.untrusted import text as one_line
from flux_dws.cli.inventory import list_rows
from flux_dws.cli.logsview import driver_errors
from flux_dws.cli.views import read_workflow
from flux_dws.core.actions import FinishProlog, RaiseException
from flux_dws.core.colocation import ANNOTATION, servers_exclusive
from flux_dws.core.identity import owned_jobid
from flux_dws.core.jobenv import env_problem, token_problem, token_required
from flux_dws.core.jobview import JobPhase, JobView
from flux_dws.core.lifecycle import decide
from flux_dws.core.policy import Policy
from flux_dws.core.storage import needs_from_breakdowns, plan_servers, rabbit_map
from flux_dws.core.workflow import parse_time, view_workflow
from flux_dws.k8s.errors import status_body_message
from flux_dws.k8s.resources import (
    breakdown_refs,
    container_profile_name,
    container_timeouts,
    decode_token,
    finalizer_removal_patch,
)
from flux_dws.testing.kubeapi.errors import ApiError
from flux_dws.testing.stack import Stack

JOBDW_GOOD = "#DW jobdw type=xfs capacity=1GiB name=good"
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TEXT = st.text(
    alphabet=st.characters(codec=None, exclude_categories=()), max_size=30
) | st.sampled_from(["", "\x00", "a\x00b", "\ud800", "Pending", "\n\x1b[2J", "３０m", "1e400s"])
SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | TEXT
)
JSON = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)

WORKFLOW: dict[str, Any] = {
    "apiVersion": "dataworkflowservices.github.io/v1alpha7",
    "kind": "Workflow",
    "metadata": {
        "name": "fluxjob-test-42",
        "namespace": "default",
        "uid": "u-1",
        "resourceVersion": "7",
        "labels": {
            "flux-dws.flux-framework.org/instance": "test",
            "flux-dws.flux-framework.org/jobid": "42",
        },
        "finalizers": ["flux-dws.flux-framework.org/workflow"],
    },
    "spec": {
        "desiredState": "PreRun",
        "wlmID": "flux",
        "jobID": "42",
        "userID": 1000,
        "groupID": 1000,
        "dwDirectives": [
            "#DW jobdw type=gfs2 capacity=10GiB name=shared requires=copy-offload",
            "#DW container name=app profile=p DW_JOB_local_storage=shared",
        ],
        "hurry": False,
    },
    "status": {
        "state": "PreRun",
        "ready": True,
        "status": "Completed",
        "message": "DW Directive 1: User error: boom",
        "env": {"DW_WORKFLOW_NAME": "fluxjob-test-42", "DW_JOB_shared": "/mnt/nnf/x-0"},
        "requires": ["copy-offload"],
        "workflowToken": {"secretName": "fluxjob-test-42-token", "secretNamespace": "default"},
        "desiredStateChange": "2026-03-01T12:00:00.123456Z",
        "readyChange": "2026-03-01T12:00:01Z",
        "elapsedTimeLastState": "1s",
        "drivers": [
            {
                "driverID": "nnf",
                "taskID": "t",
                "dwdIndex": 1,
                "watchState": "PreRun",
                "completed": True,
                "status": "Completed",
                "message": "",
                "error": "",
                "lastHB": 3,
            }
        ],
        "directiveBreakdowns": [{"name": "fluxjob-test-42-0", "namespace": "default"}],
        "containers": [{"state": "running"}],
    },
}

BREAKDOWN: dict[str, Any] = {
    "metadata": {"name": "fluxjob-test-42-0", "namespace": "default"},
    "status": {
        "ready": True,
        "storage": {
            "lifetime": "job",
            "reference": {"kind": "Servers", "name": "fluxjob-test-42-0", "namespace": "default"},
            "allocationSets": [
                {
                    "allocationStrategy": "AllocatePerCompute",
                    "minimumCapacity": 10737418240,
                    "label": "gfs2",
                    "constraints": {"count": 2},
                },
                {
                    "allocationStrategy": "AllocateSingleServer",
                    "minimumCapacity": 1073741824,
                    "label": "mgt",
                    "constraints": {"colocation": [{"type": "exclusive", "key": "lustre-mgt"}]},
                },
            ],
        },
    },
}

SYSTEM_CONFIGURATION: dict[str, Any] = {
    "spec": {"storageNodes": [{"name": "rabbit-0", "computesAccess": [{"name": "n0", "index": 0}]}]}
}


def paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON object (keys and list positions)."""
    found = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            found += paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found += paths(value, (*prefix, i))
    return found


@st.composite
def mutated(draw: Callable, base: dict[str, Any]) -> Any:
    """``base`` with one place replaced by junk (or removed)."""
    obj = copy.deepcopy(base)
    where = draw(st.sampled_from(paths(obj)))
    junk = draw(JSON)
    if not where:
        return junk
    parent = obj
    for key in where[:-1]:
        parent = parent[key]
    if draw(st.booleans()) and isinstance(parent, dict):
        del parent[where[-1]]
    else:
        parent[where[-1]] = junk
    return obj


def objects(base: dict[str, Any]) -> st.SearchStrategy:
    return mutated(base) | JSON


def check_error(exc: BaseException) -> None:
    """A refusal is a ValueError with one bounded, jansson-safe line."""
    assert isinstance(exc, ValueError), f"{type(exc).__name__}: {exc}"
    message = str(exc)
    assert "\n" not in message and "\x00" not in message
    assert len(message) < 1200, len(message)


def reads(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the property under test
        check_error(exc)
        return None


@FUZZ
@given(objects(WORKFLOW))
def test_view_workflow_returns_or_names_the_field(obj):
    view = reads(view_workflow, obj)
    if view is not None:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in view.env.items())


JOB = JobView(42, JobPhase.PROLOG, userid=1000, groupid=1000, started=False)


@FUZZ
@given(objects(WORKFLOW))
def test_decisions_on_any_readable_workflow_send_only_what_flux_accepts(obj):
    """Whatever a readable workflow says, the job is told in text Flux accepts."""
    view = reads(view_workflow, obj)
    if view is None:
        return
    actions = decide(JOB, view, Policy(), 1e9)
    for action in actions:
        if isinstance(action, RaiseException):
            assert jansson_problem(json_safe(action.note)) is None
            assert one_line(action.note)
        if isinstance(action, FinishProlog) and action.success:
            assert env_problem(action.env) is None
            if action.token_secret is not None:
                assert action.token_secret == (view.namespace, f"{view.name}-token")


SERVERS_OBJECT: dict[str, Any] = {
    "metadata": {
        "name": "fluxjob-test-42-0",
        "namespace": "default",
        "annotations": {ANNOTATION: '{"mgtmdt": ["lustre-mgt"], "mdt": [""]}'},
    },
    "spec": {
        "allocationSets": [
            {"label": "mgtmdt", "allocationSize": 1, "storage": [{"name": "rabbit-0"}]},
            {
                "label": "mdt",
                "allocationSize": 1,
                "storage": [{"name": "n0", "allocationCount": 2}],
            },
        ]
    },
}


@FUZZ
@given(
    st.lists(objects(BREAKDOWN), max_size=3), st.lists(TEXT, max_size=3), objects(SERVERS_OBJECT)
)
def test_breakdowns_give_needs_or_a_storage_error(breakdowns, hosts, servers):
    needs = reads(needs_from_breakdowns, breakdowns)
    taken = servers_exclusive(servers)  # never raises: a Servers is only read
    assert all(isinstance(k, str) for keys in taken.values() for k in keys)
    if needs:
        reads(plan_servers, needs, hosts or ["n0"], {"n0": "rabbit-0"}, None, (), taken)


@FUZZ
@given(objects(WORKFLOW))
def test_workflow_companion_readers(obj):
    if isinstance(obj, dict):
        reads(breakdown_refs, obj)
        reads(container_profile_name, obj)
        reads(finalizer_removal_patch, obj)
        reads(owned_jobid, obj, "test")


@FUZZ
@given(objects(SYSTEM_CONFIGURATION))
def test_system_configuration_reader(obj):
    mapping = reads(rabbit_map, obj if isinstance(obj, dict) else None)
    if mapping is not None:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items())


@FUZZ
@given(JSON)
def test_profile_secret_and_status_readers(value):
    profile = {"data": value} if not isinstance(value, dict) else {"data": value}
    timeouts = reads(container_timeouts, profile)
    if timeouts is not None:
        assert timeouts.prerun >= 0 and timeouts.postrun >= 0
    token = reads(decode_token, value if isinstance(value, dict) else None)
    assert token is None or isinstance(token, str)
    reads(status_body_message, value if isinstance(value, str) else None)
    reads(parse_time, value if isinstance(value, str) else None)


@FUZZ
@given(st.dictionaries(TEXT, TEXT, max_size=4), st.lists(TEXT, max_size=3), JSON)
def test_env_and_token_checks(env, requires, named):
    problem = reads(env_problem, env)
    if problem is not None:
        assert "\x00" not in problem and "\n" not in problem
    needed = token_required(requires, [f"#DW jobdw requires={r}" for r in requires])
    pair = tuple(named[:2]) if isinstance(named, list) and len(named) >= 2 else None
    if pair is not None and not all(isinstance(p, str) for p in pair):
        pair = None
    reads(token_problem, pair, "wf", "default", needed)


@FUZZ
@given(SCALAR)
def test_durations(value):
    seconds = reads(parse_fsd, value)
    if seconds is not None:
        assert seconds >= 0


@FUZZ
@given(st.lists(objects(WORKFLOW), max_size=3))
def test_flux_dws_list_shows_every_workflow_even_unreadable_ones(objs):
    """`flux dws list` reads raw workflows too: each gets a row, none raises."""
    mappings = [o for o in objs if isinstance(o, dict)]
    rows = list_rows(mappings, 1e9)
    assert len(rows) == len(mappings)
    for obj in mappings:
        view, problem = read_workflow(obj)
        assert (view is None) == bool(problem)
        assert len(driver_errors(view)) <= len(view.drivers if view else ())


# ---------------------------------------------------------------------------- the service

STATUS_KEYS = (
    "message",
    "env",
    "status",
    "state",
    "ready",
    "drivers",
    "workflowToken",
    "requires",
    "desiredStateChange",
    "elapsedTimeLastState",
    "containers",
    "directiveBreakdowns",
)


class Corruptor:
    """A kubeapi admission hook that, once, puts ``junk`` at ``status.<key>`` of the target
    job's workflow when PreRun is ready (as a buggy controller would), keeping the original
    status so that it can be put back."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.target = ""
        self.key, self.junk = "", None
        self.original: dict | None = None

    def aim(self, target: str, key: str, junk: Any) -> None:
        with self.lock:
            self.target, self.key, self.junk, self.original = target, key, junk, None

    def __call__(self, operation: str, old: dict | None, new: dict) -> dict:
        with self.lock:
            lines = (new.get("spec") or {}).get("dwDirectives") or []
            status = new.get("status")
            if (
                self.target
                and self.original is None
                and any(self.target in str(line) for line in lines)
                and isinstance(status, dict)
                and status.get("state") == "PreRun"
                and status.get("ready") is True
            ):
                self.original = copy.deepcopy(status)
                status[self.key] = copy.deepcopy(self.junk)
            return new


@pytest.fixture(scope="module")
def corrupted_stack():
    with Stack(hosts=4) as stack:
        corruptor = Corruptor()
        assert stack.api is not None
        stack.api.store.add_admission("workflows", corruptor)
        yield stack, corruptor


SERVICE_FUZZ = settings(  # each example is a few jobs through the service: few, unshrunk
    max_examples=8,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@SERVICE_FUZZ
@given(key=st.sampled_from(STATUS_KEYS), junk=JSON)
@example(key="env", junk={"odd": -6433})  # an object over an object: the restore must replace
def test_one_bad_workflow_among_good_ones(corrupted_stack, key, junk):
    """The good jobs complete; the bad one completes (harmless junk), fails with a reason,
    or is held with a dws-workflow-unreadable event naming the field until its workflow is
    readable again.  Nothing is left behind either way."""
    stack, corruptor = corrupted_stack
    test_one_bad_workflow_among_good_ones.count = (
        getattr(test_one_bad_workflow_among_good_ones, "count", 0) + 1
    )
    target = f"name=odd{test_one_bad_workflow_among_good_ones.count}"
    corruptor.aim(target, key, junk)
    good = [stack.submit(JOBDW_GOOD, runtime=0.0) for _ in range(2)]
    bad = stack.submit(
        f"#DW jobdw type=xfs capacity=1GiB {target}", runtime=0.0, timeouts={"prerun": "3s"}
    )
    for jobid in good:
        assert stack.wait(jobid, timeout=60).result == "COMPLETED"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = stack.flux.info(bad)
        if info.state == "INACTIVE" or info.events("dws-workflow-unreadable"):
            break
        time.sleep(0.05)
    held = info.events("dws-workflow-unreadable")
    if held:
        assert "status." in held[0]["context"]["problem"]
        assert info.exception is None  # held, not failed as if its workflow were gone
        assert corruptor.original is not None
        name = f"fluxjob-{stack.identity}-{bad}"
        # a JSON patch of that one key: a merge patch would merge a junk object into the
        # original one and keep the junk's own keys (seen with env={"...": -6433})
        key = corruptor.key
        if key in corruptor.original:
            restore = [{"op": "add", "path": f"/status/{key}", "value": corruptor.original[key]}]
        else:
            restore = [{"op": "remove", "path": f"/status/{key}"}]
        store = stack.api.store
        hooks = store._hooks["workflows"]
        with store._lock:  # as an admin fixing it by hand: no webhook compares with the junk
            saved, hooks[:] = list(hooks), []
            try:
                store.patch("workflows", "default", name, restore)
            except ApiError as exc:  # the controller's next write put a readable status
                if exc.code not in (404, 422):  # back first (or removed the key): the job went on
                    raise
            finally:
                hooks[:] = saved
    info = stack.wait(bad, timeout=60)
    if info.result != "COMPLETED":
        assert (info.exception or {}).get("note"), info.eventlog
        assert jansson_problem(info.exception) is None
    assert not info.holds
    mine = f"fluxjob-{stack.identity}-{bad}"
    wait_for(lambda: not [w for w in stack.workflows() if w["metadata"]["name"] == mine])


class Spoiler:
    """A kubeapi admission hook that, from the moment the target job's workflow reaches
    ``state``, puts ``junk`` at ``status.<key>`` on every write (a controller that keeps
    writing what flux-dws cannot read)."""

    def __init__(self, target: str, state: str, key: str, junk: Any) -> None:
        self.target, self.state, self.key, self.junk = target, state, key, junk
        self.spoiling = False

    def __call__(self, operation: str, old: dict | None, new: dict) -> dict:
        lines = (new.get("spec") or {}).get("dwDirectives") or []
        status = new.get("status")
        if not any(self.target in str(line) for line in lines) or not isinstance(status, dict):
            return new
        self.spoiling = self.spoiling or status.get("state") == self.state
        if self.spoiling:
            status[self.key] = copy.deepcopy(self.junk)
        return new


def test_a_workflow_that_stays_unreadable_fails_its_job_at_the_deadline_and_leaves_nothing():
    """Held while it may still become readable, never past its state's deadline: the job
    fails naming the problem, Teardown is asked, and when even Teardown cannot be seen to end
    by its deadline the workflow is deleted and the job let go.  The next job runs."""
    with Stack(hosts=2) as stack:
        assert stack.api is not None
        spoiler = Spoiler("name=spoilt", "PreRun", "elapsedTimeLastState", {"junk": 1})
        stack.api.store.add_admission("workflows", spoiler)
        timeouts = {"prerun": "2s", "teardown": "2s"}
        bad = stack.submit("#DW jobdw type=xfs capacity=1GiB name=spoilt", timeouts=timeouts)
        info = stack.wait(bad, timeout=60)
        assert info.events("dws-workflow-unreadable")
        note = (info.exception or {}).get("note", "")
        assert note.startswith(
            "PreRun failed: the workflow cannot be read: workflow default/fluxjob-"
        ), info.eventlog
        assert "status.elapsedTimeLastState" in note
        (failed,) = info.events("dws-teardown-failed")
        assert "cannot be read" in failed["context"]["reason"]
        assert not info.holds
        mine = f"fluxjob-{stack.identity}-{bad}"
        wait_for(lambda: not [w for w in stack.workflows() if w["metadata"]["name"] == mine])
        good = stack.submit(JOBDW_GOOD, runtime=0.0)
        assert stack.wait(good, timeout=60).result == "COMPLETED"
