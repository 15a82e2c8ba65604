# SPDX-License-Identifier: LGPL-3.0-only
"""flux_dws.core.workflow: Workflow dict -> WorkflowView, and the container outcome."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flux_dws.core.containeroutcome import ContainerOutcome, ContainerState, container_outcome
from flux_dws.core.states import STATE_ORDER, State, Status
from flux_dws.core.workflow import WorkflowView, parse_time, view_workflow
from flux_dws.core.workflowstatus import DriverStatus
from flux_dws.testing.ruleset import watched_states

JOBDW = "#DW jobdw type=gfs2 capacity=10GiB name=scratch"
CONTAINER = "#DW container name=my-container profile=red-rock-slushy DW_JOB_local_storage=scratch"
COPY_OUT = "#DW copy_out source=$DW_JOB_scratch/out destination=/lus/home/alice/out"
T0 = "2026-03-01T12:00:00.123456Z"
T0_EPOCH = datetime.datetime(2026, 3, 1, 12, 0, 0, 123456, datetime.timezone.utc).timestamp()

# The exact upstream texts (dws-api.md section 4), as a driver entry's message / error.
START_TIMEOUT = "User error: user container(s) failed to start after 300 seconds"
COMPLETE_TIMEOUT = "User error: user container(s) failed to complete after 60 seconds"
MPI_FAILURE = "User error: user container(s) failed to run successfully after 7 attempts"
NO_COMPUTES = "WLM error: the Computes resources does not specify any compute nodes"
PORTS = "WLM error: could not request ports for container workflow: InsufficientResources"
POD_DETAIL = (
    "internal error: container job batch (BackoffLimitExceeded): "
    "Job has reached the specified backoff limit"
)


def make_workflow(
    state: State | None = State.PROPOSAL,
    *,
    ready: bool = False,
    directives: tuple[str, ...] = (JOBDW, CONTAINER),
    version: str = "v1alpha7",
    desired: State | None = None,
) -> dict[str, Any]:
    """A Workflow as the API server returns it after DWS has worked on it up to ``state``.

    Driver entries are the ones the mutating webhook adds; those of earlier states are
    completed, those of ``state`` are completed when ``ready``.  state=None: not yet seen by
    the controller (no status at all).
    """
    name = "fluxjob-host-1a2b3c4d-4242"
    obj: dict[str, Any] = {
        "apiVersion": f"dataworkflowservices.github.io/{version}",
        "kind": "Workflow",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": "0d7e1f0a-5b44-4c8e-9a3e-2f6c1b9d8e77",
            "resourceVersion": "18734",
            "generation": 2,
            "creationTimestamp": "2026-03-01T11:59:58Z",
            "labels": {"flux-dws.flux-framework.org/instance": "host-1a2b3c4d"},
            "finalizers": ["flux-dws.flux-framework.org/finalizer"],
        },
        "spec": {
            "desiredState": (desired or state or State.PROPOSAL).value,
            "wlmID": "flux",
            "jobID": 4242,
            "userID": 1001,
            "groupID": 1001,
            "dwDirectives": list(directives),
            "hurry": False,
            "forceReady": False,
        },
    }
    if state is None:
        return obj
    drivers = []
    for index, directive in enumerate(directives):
        for driver_id, watch in watched_states(directive):
            done = watch.index < state.index or (watch is state and ready)
            entry = {
                "driverID": driver_id,
                "taskID": "",
                "dwdIndex": index,
                "watchState": watch.value,
                "lastHB": 0,
                "completed": done,
                "status": "Completed" if done else "Pending",
            }
            if done:
                entry["completeTime"] = T0
            drivers.append(entry)
    obj["status"] = {
        "state": state.value,
        "ready": ready,
        "status": "Completed" if ready else "DriverWait",
        "message": "",
        "drivers": drivers,
        "env": {"DW_WORKFLOW_NAME": name, "DW_WORKFLOW_NAMESPACE": "default"},
        "computes": {"name": name, "namespace": "default", "kind": "Computes"},
        "desiredStateChange": T0,
        "elapsedTimeLastState": "294.183ms" if ready else "",
    }
    if ready:
        obj["status"]["readyChange"] = "2026-03-01T12:00:00.417639Z"
    return obj


def driver_error(
    obj: dict[str, Any], index: int, state: State, message: str, error: str = ""
) -> dict[str, Any]:
    """What DWS shows when the driver for directive ``index`` fails fatally in ``state``."""
    for entry in obj["status"]["drivers"]:
        if entry["dwdIndex"] == index and entry["watchState"] == state.value:
            entry.update(status="Error", completed=False, message=message, error=error)
    if obj["status"]["state"] == state.value:
        obj["status"].update(
            ready=False, status="Error", message=f"DW Directive {index}: {message}"
        )
    return obj


def advance(obj: dict[str, Any], state: State) -> dict[str, Any]:
    """The WLM moved desiredState on (e.g. to Teardown after an error): DWS resets the status."""
    obj["spec"]["desiredState"] = state.value
    obj["status"].update(state=state.value, ready=False, status="DriverWait", message="")
    return obj


# --------------------------------------------------------------------------- timestamps


@pytest.mark.parametrize(
    "text, expected",
    [
        (T0, T0_EPOCH),
        ("2026-03-01T12:00:00Z", T0_EPOCH - 0.123456),
        ("2026-03-01t12:00:00.123456z", T0_EPOCH),
        ("2026-03-01T13:30:00.123456+01:30", T0_EPOCH),
        ("2026-03-01T07:00:00.123456-05:00", T0_EPOCH),
        ("2026-03-01T12:00:00.123456789Z", T0_EPOCH + 0.000000789),
        ("1970-01-01T00:00:00Z", 0.0),
    ],
)
def test_parse_time_reads_rfc3339(text: str, expected: float) -> None:
    assert parse_time(text) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("text", [None, ""])
def test_parse_time_absent_is_none(text: str | None) -> None:
    assert parse_time(text) is None


@pytest.mark.parametrize(
    "text",
    [
        "yesterday",
        "2026-03-01",
        "2026-03-01T12:00:00",
        "2026-13-01T12:00:00Z",
        "2026-02-30T12:00:00Z",
        "2026-03-01T25:00:00Z",
        "2026-03-01T12:00:00+24:00",
        "2026-03-01T12:00:00.Z",
        "0000-01-01T00:00:00Z",
        1772366400,
    ],
)
def test_parse_time_rejects_non_rfc3339(text: Any) -> None:
    with pytest.raises(ValueError, match="timestamp") as info:
        parse_time(text)
    assert "\n" not in str(info.value)


@given(
    st.datetimes(
        min_value=datetime.datetime(1971, 1, 1),
        max_value=datetime.datetime(2200, 1, 1),
        timezones=st.timezones(),
    )
)
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_parse_time_agrees_with_datetime(moment: datetime.datetime) -> None:
    offset = moment.utcoffset()
    assert offset is not None
    if offset.seconds % 60 or offset.microseconds:  # RFC 3339 offsets are whole minutes
        return
    text = moment.isoformat(timespec="microseconds")
    assert parse_time(text) == pytest.approx(moment.timestamp(), abs=1e-6)


# --------------------------------------------------------------------------- the view


def test_view_carries_every_field() -> None:
    obj = make_workflow(State.PRERUN, ready=True)
    obj["spec"]["hurry"] = True
    obj["status"]["env"]["DW_JOB_scratch"] = "/mnt/nnf/0d7e1f0a-0"
    obj["status"]["workflowToken"] = {"secretName": "tok", "secretNamespace": "nnf-system"}
    obj["metadata"]["deletionTimestamp"] = "2026-03-01T12:05:00Z"
    view = view_workflow(obj)
    meta, spec, status = obj["metadata"], obj["spec"], obj["status"]
    assert (view.name, view.namespace, view.uid) == (meta["name"], "default", meta["uid"])
    assert view.resource_version == meta["resourceVersion"]
    assert view.jobid == str(spec["jobID"])
    assert view.desired_state is State.PRERUN and view.state is State.PRERUN
    assert view.ready is True and view.status is Status.COMPLETED
    assert view.directives == tuple(spec["dwDirectives"])
    assert dict(view.env) == status["env"]
    assert view.hurry is True
    assert view.desired_state_change == pytest.approx(T0_EPOCH)
    assert view.ready_change == pytest.approx(T0_EPOCH + 0.417639 - 0.123456)
    assert view.elapsed_time_last_state == "294.183ms"
    assert view.token_secret == ("nnf-system", "tok")
    assert view.deleting is True
    assert view.finalizers == tuple(meta["finalizers"])
    assert dict(view.labels) == meta["labels"]
    assert len(view.drivers) == len(status["drivers"])
    first, raw = view.drivers[0], status["drivers"][0]
    assert first == DriverStatus(
        driver_id=raw["driverID"],
        task_id="",
        dwd_index=raw["dwdIndex"],
        watch_state=State(raw["watchState"]),
        completed=raw["completed"],
        status=raw["status"],
        message="",
        error="",
        last_hb=0,
    )


def test_view_is_immutable_and_detached_from_the_dict() -> None:
    obj = make_workflow(State.SETUP)
    view = view_workflow(obj)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.ready = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        view.env["X"] = "y"  # type: ignore[index]
    obj["status"]["env"]["LATE"] = "1"
    obj["metadata"]["labels"]["late"] = "1"
    assert "LATE" not in view.env and "late" not in view.labels
    assert hash(view) == hash(view_workflow(make_workflow(State.SETUP)))


def test_string_job_id_is_kept() -> None:
    obj = make_workflow()
    obj["spec"]["jobID"] = "ƒ2Kqz5"
    assert view_workflow(obj).jobid == "ƒ2Kqz5"


def test_token_secret_needs_both_names() -> None:
    obj = make_workflow(State.PRERUN, ready=True)
    obj["status"]["workflowToken"] = {"secretName": "tok"}
    assert view_workflow(obj).token_secret is None


@pytest.mark.parametrize("version", ["v1alpha6", "v1alpha7"])
def test_served_versions_read_the_same(version: str) -> None:
    obj = driver_error(make_workflow(State.POSTRUN), 1, State.POSTRUN, MPI_FAILURE)
    other = copy.deepcopy(obj)
    other["apiVersion"] = obj["apiVersion"].rsplit("/", 1)[0] + "/" + version
    assert view_workflow(other) == view_workflow(obj)


def test_list_items_without_kind_are_accepted() -> None:
    """Some list responses omit kind/apiVersion on their items."""
    obj = make_workflow(State.SETUP)
    del obj["kind"], obj["apiVersion"]
    assert view_workflow(obj).state is State.SETUP


def test_missing_status_before_the_controller_has_run() -> None:
    view = view_workflow(make_workflow(None))
    assert view.desired_state is State.PROPOSAL
    assert (view.state, view.status, view.ready) == (None, None, False)
    assert (view.drivers, dict(view.env), view.message) == ((), {}, "")
    assert view.desired_state_change is None and view.token_secret is None
    assert not (view.settled or view.complete or view.failed or view.transient)
    assert view.container == ContainerOutcome(ContainerState.PENDING, dwd_index=1)


def test_empty_status_state_is_none() -> None:
    obj = make_workflow(State.PROPOSAL)
    obj["status"].update(state="", status="")
    view = view_workflow(obj)
    assert view.state is None and view.status is None and not view.settled


@pytest.mark.parametrize("state, status", list(itertools.product(STATE_ORDER, list(Status))))
@pytest.mark.parametrize("caught_up", [True, False])
def test_every_state_and_status(state: State, status: Status, caught_up: bool) -> None:
    ready = status is Status.COMPLETED
    obj = make_workflow(state, ready=ready)
    obj["status"]["status"] = status.value
    if status in (Status.ERROR, Status.TRANSIENT):
        obj["status"]["message"] = "DW Directive 0: User error: something broke"
    if status is Status.ERROR:  # as DWS rolls it up: from a driver entry in Error
        driver_error(obj, 0, state, "User error: something broke", "user error: broke")
    desired = state if caught_up else state.next() or State.TEARDOWN
    obj["spec"]["desiredState"] = desired.value
    view = view_workflow(obj)
    settled = state is desired
    assert (view.state, view.status, view.desired_state) == (state, status, desired)
    assert view.settled is settled
    assert view.complete is (settled and ready)
    assert view.failed is (settled and status is Status.ERROR)
    assert view.transient is (settled and status is Status.TRANSIENT)
    assert view.user_message == obj["status"]["message"].replace("DW Directive 0: ", "")


@pytest.mark.parametrize(
    "message, expected",
    [
        (f"DW Directive 3: {MPI_FAILURE}", MPI_FAILURE),
        ("Forced Ready", "Forced Ready"),
        ("", ""),
        ("DW Directive 12:   spaced", "spaced"),
    ],
)
def test_user_message_drops_the_directive_prefix(message: str, expected: str) -> None:
    obj = make_workflow(State.SETUP)
    obj["status"]["message"] = message
    assert view_workflow(obj).user_message == expected


# --------------------------------------------------------------------------- container outcome


@pytest.mark.parametrize("state", STATE_ORDER)
def test_no_container_directive_is_none(state: State) -> None:
    obj = make_workflow(state, directives=(JOBDW, COPY_OUT))
    if state in (State.PRERUN, State.POSTRUN):
        driver_error(obj, 0, state, START_TIMEOUT, "boom")
    assert view_workflow(obj).container == ContainerOutcome(ContainerState.NONE)


def test_container_directive_is_found_by_its_command_word() -> None:
    lookalike = "#DW jobdw type=xfs capacity=1GiB name=container"
    assert container_outcome((lookalike, COPY_OUT), ()).state is ContainerState.NONE
    spaced = "#DW   container  name=c profile=p"
    assert container_outcome((lookalike, spaced), ()).dwd_index == 1


@pytest.mark.parametrize("state", [State.PROPOSAL, State.SETUP, State.DATAIN, State.PRERUN])
def test_pending_until_prerun_is_ready(state: State) -> None:
    ready = state is not State.PRERUN  # earlier states done; PreRun still starting
    outcome = view_workflow(make_workflow(state, ready=ready)).container
    assert outcome == ContainerOutcome(ContainerState.PENDING, dwd_index=1)


@pytest.mark.parametrize(
    "state, ready, expected",
    [
        (State.PRERUN, True, ContainerState.STARTED),
        (State.POSTRUN, False, ContainerState.STARTED),
        (State.POSTRUN, True, ContainerState.EXITED),
        (State.DATAOUT, False, ContainerState.EXITED),
        (State.TEARDOWN, True, ContainerState.EXITED),
    ],
)
def test_started_then_exited(state: State, ready: bool, expected: ContainerState) -> None:
    outcome = view_workflow(make_workflow(state, ready=ready)).container
    assert outcome == ContainerOutcome(expected, dwd_index=1)
    assert not outcome.state.is_failure


@pytest.mark.parametrize(
    "phase, message, error, expected",
    [
        (State.PRERUN, NO_COMPUTES, "wlm error: computes empty", ContainerState.START_FAILED),
        (State.PRERUN, START_TIMEOUT, "", ContainerState.TIMED_OUT),
        (State.POSTRUN, COMPLETE_TIMEOUT, "", ContainerState.TIMED_OUT),
        (State.POSTRUN, MPI_FAILURE, "user error: mpijob failed", ContainerState.FAILED),
    ],
)
@pytest.mark.parametrize("position", [1, 0, 2])
def test_upstream_failures(
    phase: State, message: str, error: str, expected: ContainerState, position: int
) -> None:
    directives = [JOBDW, COPY_OUT]
    directives.insert(position, CONTAINER)
    obj = make_workflow(phase, directives=tuple(directives))
    view = view_workflow(driver_error(obj, position, phase, message, error))
    assert view.failed
    assert view.container == ContainerOutcome(expected, phase, message, error, position)
    assert view.container.state.is_failure


@pytest.mark.parametrize("message", ["", "Internal error: "])
def test_pod_failure_with_empty_user_message_reports_the_error(message: str) -> None:
    obj = driver_error(make_workflow(State.POSTRUN), 1, State.POSTRUN, message, POD_DETAIL)
    outcome = view_workflow(obj).container
    assert outcome == ContainerOutcome(
        ContainerState.FAILED, State.POSTRUN, POD_DETAIL, POD_DETAIL, 1
    )


def test_failure_is_remembered_after_teardown() -> None:
    obj = driver_error(make_workflow(State.POSTRUN), 1, State.POSTRUN, MPI_FAILURE, "detail")
    before = view_workflow(obj).container
    after = view_workflow(advance(obj, State.TEARDOWN)).container
    assert after == before and after.reason == MPI_FAILURE


def test_reason_falls_back_to_the_rolled_up_message() -> None:
    obj = driver_error(make_workflow(State.PRERUN), 1, State.PRERUN, START_TIMEOUT)
    for entry in obj["status"]["drivers"]:
        entry["message"] = ""
    outcome = view_workflow(obj).container
    assert (outcome.state, outcome.reason) == (ContainerState.TIMED_OUT, START_TIMEOUT)


def test_rolled_up_message_alone_is_enough() -> None:
    obj = driver_error(make_workflow(State.POSTRUN), 1, State.POSTRUN, MPI_FAILURE)
    obj["status"]["drivers"] = []
    outcome = view_workflow(obj).container
    assert outcome == ContainerOutcome(ContainerState.FAILED, State.POSTRUN, MPI_FAILURE, "", 1)


def test_rolled_up_message_of_another_directive_is_not_the_containers() -> None:
    obj = driver_error(make_workflow(State.POSTRUN), 0, State.POSTRUN, "User error: mount failed")
    view = view_workflow(obj)
    assert view.failed
    assert view.container == ContainerOutcome(ContainerState.STARTED, dwd_index=1)


def test_setup_failure_is_not_a_container_outcome() -> None:
    view = view_workflow(driver_error(make_workflow(State.SETUP), 1, State.SETUP, PORTS))
    assert view.failed and view.user_message == PORTS
    assert view.container == ContainerOutcome(ContainerState.PENDING, dwd_index=1)


def test_container_outcome_is_a_pure_function_of_parts() -> None:
    drivers = (DriverStatus("nnf", "", 0, State.PRERUN, False, "Error", START_TIMEOUT, "x", 0),)
    outcome = container_outcome((CONTAINER,), drivers, State.PRERUN, Status.ERROR, "")
    assert outcome == ContainerOutcome(
        ContainerState.TIMED_OUT, State.PRERUN, START_TIMEOUT, "x", 0
    )
    assert container_outcome((JOBDW,), drivers) == ContainerOutcome(ContainerState.NONE)


def test_container_state_failures() -> None:
    failures = {s for s in ContainerState if s.is_failure}
    assert failures == {
        ContainerState.START_FAILED,
        ContainerState.FAILED,
        ContainerState.TIMED_OUT,
    }


# --------------------------------------------------------------------------- status.containers


@pytest.mark.parametrize(
    "containers, state, expected",
    [
        ([{"name": "my-container", "state": "Running"}], ContainerState.STARTED, None),
        ({"my-container": {"phase": "Succeeded"}}, ContainerState.EXITED, None),
        ({"state": "waiting"}, ContainerState.PENDING, None),
        (
            [{"state": "Running"}, {"state": "Pending"}],
            ContainerState.PENDING,
            None,
        ),
        (
            [{"state": "exited"}, {"state": "failed", "message": "exit 3", "phase": "PostRun"}],
            ContainerState.FAILED,
            (State.POSTRUN, "exit 3"),
        ),
        (
            {"state": "timed-out", "reason": START_TIMEOUT},
            ContainerState.TIMED_OUT,
            (State.PRERUN, START_TIMEOUT),
        ),
        (
            [{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}],
            ContainerState.FAILED,
            (State.POSTRUN, "OOMKilled"),
        ),
        ([{"state": {"terminated": {"exitCode": 0}}}], ContainerState.EXITED, None),
        (
            [{"state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}}],
            ContainerState.FAILED,
            (State.POSTRUN, "back-off"),
        ),
        ([{"exitCode": 0}], ContainerState.EXITED, None),
    ],
)
def test_future_containers_field_is_preferred(
    containers: Any, state: ContainerState, expected: tuple[State, str] | None
) -> None:
    obj = make_workflow(State.POSTRUN)  # drivers alone would say STARTED
    obj["status"]["containers"] = containers
    outcome = view_workflow(obj).container
    assert outcome.state is state and outcome.dwd_index == 1
    if expected is not None:
        assert (outcome.phase, outcome.reason) == expected


def test_future_field_failure_in_prerun_is_a_start_failure() -> None:
    obj = make_workflow(State.PRERUN)
    obj["status"]["containers"] = [{"state": "Failed", "error": "image not found"}]
    outcome = view_workflow(obj).container
    assert outcome == ContainerOutcome(
        ContainerState.START_FAILED, State.PRERUN, "image not found", "image not found", 1
    )


def test_future_field_phase_word_wins_over_the_workflow_state() -> None:
    obj = advance(make_workflow(State.PRERUN), State.TEARDOWN)
    obj["status"]["containers"] = {"c": {"status": "Failed", "phase": "PreRun", "reason": "bad"}}
    outcome = view_workflow(obj).container
    assert outcome == ContainerOutcome(ContainerState.START_FAILED, State.PRERUN, "bad", "", 1)


@pytest.mark.parametrize(
    "containers",
    [{}, [], "Running", 42, [1, "x", None], {"state": "sideways"}, {"a": {"b": "c"}}],
)
def test_unreadable_future_field_falls_back_to_drivers(containers: Any) -> None:
    obj = driver_error(make_workflow(State.POSTRUN), 1, State.POSTRUN, MPI_FAILURE, "d")
    expected = view_workflow(obj).container
    obj["status"]["containers"] = containers
    assert view_workflow(obj).container == expected


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12)
    | st.sampled_from(["Running", "failed", "PreRun", "exitCode", "terminated", "waiting"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(
        st.sampled_from(["state", "phase", "status", "message", "reason", "error", "exitCode",
                         "terminated", "waiting", "running", "name"]) | st.text(max_size=6),
        inner,
        max_size=4,
    ),
    max_leaves=12,
)  # fmt: skip


@given(JSON)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_future_field_never_breaks_the_view(containers: Any) -> None:
    obj = make_workflow(State.POSTRUN)
    obj["status"]["containers"] = containers
    outcome = view_workflow(obj).container
    assert outcome.dwd_index == 1
    assert outcome.state.is_failure == (outcome.phase is not None)


# --------------------------------------------------------------------------- bad objects


def _set(path: str, value: Any) -> Any:
    def mutate(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = obj
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if value is _DELETE:
            del target[last]
        elif isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return mutate


_DELETE = object()


@pytest.mark.parametrize(
    "mutate, field",
    [
        (_set("kind", "Pod"), "kind"),
        (_set("apiVersion", "v1"), "apiVersion"),
        (_set("apiVersion", 7), "apiVersion"),
        (_set("metadata", _DELETE), "metadata"),
        (_set("metadata", []), "metadata"),
        (_set("metadata.name", _DELETE), "metadata.name"),
        (_set("metadata.name", ""), "metadata.name"),
        (_set("metadata.labels", {"a": 1}), "metadata.labels"),
        (_set("metadata.finalizers", "x"), "metadata.finalizers"),
        (_set("spec", _DELETE), "spec"),
        (_set("spec.desiredState", _DELETE), "spec.desiredState"),
        (_set("spec.desiredState", "Running"), "spec.desiredState"),
        (_set("spec.jobID", _DELETE), "spec.jobID"),
        (_set("spec.jobID", True), "spec.jobID"),
        (_set("spec.jobID", [1]), "spec.jobID"),
        (_set("spec.dwDirectives", [JOBDW, 3]), "spec.dwDirectives[1]"),
        (_set("spec.hurry", "yes"), "spec.hurry"),
        (_set("status", "Ready"), "status"),
        (_set("status.state", "Done"), "status.state"),
        (_set("status.ready", "true"), "status.ready"),
        (_set("status.status", "Broken"), "status.status"),
        (_set("status.message", ["a"]), "status.message"),
        (_set("status.env", {"DW_X": None, "DW_Y": 3}), "status.env"),
        (_set("status.drivers", {}), "status.drivers"),
        (_set("status.drivers.0", "nnf"), "status.drivers[0]"),
        (_set("status.drivers.2.dwdIndex", _DELETE), "status.drivers[2].dwdIndex"),
        (_set("status.drivers.2.dwdIndex", "1"), "status.drivers[2].dwdIndex"),
        (_set("status.drivers.3.watchState", "Later"), "status.drivers[3].watchState"),
        (_set("status.drivers.0.completed", 1), "status.drivers[0].completed"),
        (_set("status.drivers.0.lastHB", 1.5), "status.drivers[0].lastHB"),
        (_set("status.desiredStateChange", "noon"), "status.desiredStateChange"),
        (_set("status.workflowToken", "tok"), "status.workflowToken"),
        (_set("status.workflowToken", {"secretName": 5}), "status.workflowToken.secretName"),
    ],
)
def test_bad_objects_raise_one_line_naming_the_field(mutate: Any, field: str) -> None:
    obj = make_workflow(State.PRERUN)
    mutate(obj)
    with pytest.raises(ValueError) as info:
        view_workflow(obj)
    text = str(info.value)
    assert field in text and "\n" not in text


@pytest.mark.parametrize("obj", [None, [], "Workflow", 3])
def test_non_mappings_are_not_workflows(obj: Any) -> None:
    with pytest.raises(ValueError, match="not a Workflow"):
        view_workflow(obj)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found += _paths(child, (*prefix, i))
    return found


_TEMPLATE = driver_error(make_workflow(State.POSTRUN), 1, State.POSTRUN, MPI_FAILURE, "x")
_TEMPLATE["status"]["workflowToken"] = {"secretName": "t", "secretNamespace": "n"}
_PATHS = _paths(_TEMPLATE)
_MUTATION = st.tuples(st.sampled_from(_PATHS), st.booleans(), JSON)


@given(st.lists(_MUTATION, min_size=1, max_size=4))
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_random_mutations_raise_only_value_error(mutations: list[tuple]) -> None:
    obj = copy.deepcopy(_TEMPLATE)
    for path, delete, value in mutations:
        parent: Any = obj
        for key in path[:-1]:
            try:
                parent = parent[key]
            except (KeyError, IndexError, TypeError):
                break
        else:
            try:
                if delete:
                    del parent[path[-1]]
                else:
                    parent[path[-1]] = value
            except (KeyError, IndexError, TypeError):
                pass
    try:
        view = view_workflow(obj)
    except ValueError as e:
        assert "\n" not in str(e) and str(e)
        return
    assert isinstance(view, WorkflowView)
    _ = (view.settled, view.complete, view.failed, view.transient, view.user_message)
    assert view.container.state.is_failure == (view.container.phase is not None)


# nnf-sos's handleWorkflowError for a plain Go error: its controller requeues and clears it
ALREADY_EXISTS = 'nnfcontainerprofiles.nnf.cray.hpe.com "fluxjob-1-1" already exists'


@pytest.mark.parametrize("state", [State.PROPOSAL, State.PRERUN, State.POSTRUN])
def test_an_unclassified_error_the_driver_retries_is_waited_for_not_failed(state: State) -> None:
    """Seen under nnf-sos: Proposal re-ran on a stale cache and its Create of the pinned
    profile found it there (1 job in 30 under load).  DWS rolls it up as Error; nnf-sos's next
    pass clears it."""
    obj = make_workflow(state)
    view = view_workflow(
        driver_error(obj, 1, state, f"Internal error: {ALREADY_EXISTS}", ALREADY_EXISTS)
    )
    assert view.retrying and view.transient and not view.failed
    assert not view.container.state.is_failure


@pytest.mark.parametrize(
    "message, error",
    [
        # a classified (ResourceError) Fatal: its error is "<type> error: <detail>"
        ("Internal error: ", f"internal error: {ALREADY_EXISTS}"),
        ("Internal error: no storage", "internal error: no storage"),
        ("User error: no space left", "user error: no space left"),
        # nothing in error: nothing says the driver retries
        ("Internal error: ", ""),
    ],
)
def test_a_classified_or_unexplained_error_still_fails_at_once(message: str, error: str) -> None:
    view = view_workflow(driver_error(make_workflow(State.SETUP), 0, State.SETUP, message, error))
    assert view.failed and not view.retrying and not view.transient


def test_an_error_status_whose_entry_the_driver_has_reset_is_a_stale_roll_up() -> None:
    """nnf-sos's retry resets its entry (Running, then Completed) before DWS rolls the status
    up again: for a moment the status says Error and no entry does."""
    obj = make_workflow(State.PROPOSAL)
    driver_error(obj, 1, State.PROPOSAL, f"Internal error: {ALREADY_EXISTS}", ALREADY_EXISTS)
    for entry in obj["status"]["drivers"]:
        if entry["status"] == "Error":
            entry.update(status="Running", message="", error="")
    view = view_workflow(obj)
    assert view.retrying and not view.failed


def test_one_classified_error_beside_a_retried_one_fails() -> None:
    obj = make_workflow(State.PRERUN)
    driver_error(obj, 1, State.PRERUN, f"Internal error: {ALREADY_EXISTS}", ALREADY_EXISTS)
    driver_error(obj, 0, State.PRERUN, "User error: mount failed", "user error: mount failed")
    view = view_workflow(obj)
    assert view.failed and not view.retrying


# ---- reading fast: the same as reading field by field ---------------------------------------

_DRIVER_VALUES = st.one_of(
    st.none(),
    st.sampled_from(["", "nnf", "PreRun", "prerun", "Later", "Completed"]),
    st.integers(-2, 2),
    st.booleans(),
    st.just(1.5),
    st.just([]),
)
_DRIVER_KEYS = ("driverID", "taskID", "dwdIndex", "watchState", "completed", "status")
_DRIVER_KEYS += ("message", "error", "lastHB", "other")


def _read_driver(read: Any, entry: Any) -> Any:
    try:
        return read("workflow w", 2, entry)
    except ValueError as exc:
        return ("error", str(exc))


@given(st.dictionaries(st.sampled_from(_DRIVER_KEYS), _DRIVER_VALUES) | _DRIVER_VALUES)
def test_driver_entry_read_inline_as_field_by_field(entry: Any) -> None:
    from flux_dws.core.workflow import _driver, _driver_checked

    assert _read_driver(_driver, entry) == _read_driver(_driver_checked, entry)


def test_a_view_is_known_read_from_its_own_version_only() -> None:
    from flux_dws.core.workflow import read_from

    obj = make_workflow(State.SETUP, ready=True)
    view = view_workflow(obj)
    assert read_from(view, copy.deepcopy(obj))
    newer = copy.deepcopy(obj)
    newer["metadata"]["resourceVersion"] = "43"
    assert not read_from(view, newer)
    other = copy.deepcopy(obj)
    other["metadata"]["uid"] = "another"
    assert not read_from(view, other)
    # a view whose desiredState was set ahead of the watch (a patch in flight) is not
    asked = dataclasses.replace(view, desired_state=State.DATAIN)
    assert not read_from(asked, obj)
    assert not read_from(dataclasses.replace(view, hurry=True), obj)
    assert not read_from(None, obj)
