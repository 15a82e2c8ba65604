# SPDX-License-Identifier: LGPL-3.0-only
"""The lifecycle against the real DWS: HPE's DWS manager and DWS's test driver on kubeapi.

Every scenario runs three times, on dwssim ("sim") and on the real DWS ("real", where the
binaries are built: flux_dws.testing.realdws says where they are looked for) with fakeflux,
and on the real DWS under real Flux ("real-flux", where flux-core is installed too: its
job-manager, the dws jobtap plugin and the service as a process, so a kill is a SIGKILL).
All must end the same way: what the real one does is what dwssim is held to.  Every case
runs on real Flux, as each takes about a second there (the burst of fifty, about forty).
Test-driver directives (``#DW <State> action=complete|wait|error``) are the real test
driver's; ``#DW jobdw`` is dwssim's NNF driver's, which beside the real DWS plays only
nnf-sos's driver entries (``DwsSim(workflow_controller=False)``) while DWS rolls them up.
"""

from __future__ import annotations

import time

import pytest

from flux_dws.core.identity import workflow_name
from flux_dws.core.states import State
from flux_dws.testing.dwssim.companions import WORKFLOW_NAME_LABEL
from flux_dws.testing.kubeapi import ApiError
from flux_dws.testing.realdws import BACKENDS, backend_options, backend_problem
from flux_dws.testing.stack import Stack

STATES = list(State)
JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
BEFORE_TEARDOWN = STATES[:-1]


@pytest.fixture(scope="module", params=BACKENDS)
def dws(request):
    """One stack per DWS and job-manager: dwssim's controller or the real DWS manager and
    test driver, with fakeflux; and the real DWS under a real Flux instance (flux-core's
    job-manager, the dws jobtap plugin, the service as a process of its own)."""
    if backend_problem(request.param):
        pytest.skip(backend_problem(request.param))
    with Stack(hosts=4, **backend_options(request.param)) as running:
        yield running


@pytest.fixture
def stack(dws):
    yield dws
    if not dws.service_running():  # a test that killed it failed before restarting it
        dws.start_service()


def names(info) -> list[str]:
    return [e["name"] for e in info.eventlog]


def states_entered(info) -> list[str]:
    return [e["context"]["state"] for e in info.events("dws-state")]


def note(info) -> str:
    return (info.exception or {}).get("note", "")


def assert_clean(stack, info) -> None:
    """The job holds nothing and its workflow (and the Computes DWS made) are gone."""
    assert info.state == "INACTIVE" and not info.holds, info.holds
    left = stack.left_behind(info.id)
    assert not left, f"left behind for {workflow_name(stack.identity, info.id)}: {left}"


def complete_waiting_driver(stack, jobid: int, state: State) -> None:
    """What an external process does for ``action=wait``: mark the driver entry done."""
    stack.wait_workflow(jobid, state)
    name = workflow_name(stack.identity, jobid)
    store = stack.api.store
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        obj = store.get("workflows", stack.policy.namespace, name)
        drivers = (obj.get("status") or {}).get("drivers") or []
        entries = [d for d in drivers if d.get("watchState") == state.value]
        if entries and obj["status"].get("state") == state.value:
            for entry in entries:
                entry.update(completed=True, status="Completed")
                entry.pop("error", None)  # a driver clears its error as it completes
                entry.pop("message", None)
                entry["completeTime"] = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
            try:
                store.replace("workflows", stack.policy.namespace, name, obj)
                return
            except ApiError as exc:
                if exc.code != 409:
                    raise
        time.sleep(0.05)
    raise TimeoutError(f"no {state.value} driver entry to complete on {name}")


def test_every_state_completing(stack):
    jobid = stack.submit([f"#DW {s.value} action=complete" for s in STATES], runtime=0.05)
    info = stack.wait(jobid)
    assert info.result == "COMPLETED" and info.attach_status == 0, info.exception
    assert states_entered(info) == [s.value for s in STATES]
    assert_clean(stack, info)


@pytest.mark.parametrize("state", BEFORE_TEARDOWN, ids=lambda s: s.value)
def test_wait_then_completed_by_the_test(stack, state):
    jobid = stack.submit([f"#DW {state.value} action=wait"], runtime=0.05)
    complete_waiting_driver(stack, jobid, state)
    info = stack.wait(jobid)
    assert info.result == "COMPLETED" and info.attach_status == 0, info.exception
    assert states_entered(info) == [s.value for s in STATES]
    assert_clean(stack, info)


@pytest.mark.parametrize("state", STATES, ids=lambda s: s.value)
def test_fatal_error_in_each_state(stack, state):
    jobid = stack.submit(
        [f"#DW {state.value} action=error message=disk_on_fire severity=Fatal"], runtime=0.05
    )
    info = stack.wait(jobid)
    ran = "start" in names(info)
    entered = states_entered(info)
    assert entered[-1] == "Teardown"
    if state is State.TEARDOWN:
        assert info.result == "COMPLETED" and info.events("dws-teardown-failed")
    else:
        assert ran == (state in (State.POSTRUN, State.DATAOUT))
        assert info.attach_status != 0 and info.exception["type"] == "dws"
        assert note(info).startswith(f"{state.value} failed: "), note(info)
        assert "Reported error: disk_on_fire" in note(info), note(info)
        # a failure before DataOut skips it: nothing is copied out of a failed job
        assert ("DataOut" in entered) == (state is State.DATAOUT)
    assert_clean(stack, info)


def wait_driver_status(stack, jobid: int, status: str) -> dict:
    """The first driver entry of the job's workflow whose status is ``status``, once one is."""
    name = workflow_name(stack.identity, jobid)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            obj = stack.api.store.get("workflows", stack.policy.namespace, name)
        except ApiError:  # not created yet
            obj = {}
        for entry in (obj.get("status") or {}).get("drivers") or []:
            if entry.get("status") == status:
                return entry
        time.sleep(0.05)
    raise TimeoutError(f"no driver entry of {name} became {status}")


def test_major_error_is_a_transient_condition_that_clears(stack):
    jobid = stack.submit(
        ["#DW Setup action=error message=flaky severity=Major"],
        timeouts={"transient": "60s"},
        runtime=0.05,
    )
    stack.wait_event(jobid, "dws-transient")
    complete_waiting_driver(stack, jobid, State.SETUP)
    info = stack.wait(jobid)
    assert info.result == "COMPLETED" and info.attach_status == 0, info.exception
    assert_clean(stack, info)


def test_major_error_past_the_grace_period_fails_the_job(stack):
    jobid = stack.submit(
        ["#DW PreRun action=error message=flaky severity=Major"], timeouts={"transient": "1s"}
    )
    info = stack.wait(jobid)
    assert info.result == "FAILED"
    assert "TransientCondition for more than 1s" in note(info), note(info)
    assert "start" not in names(info)
    assert_clean(stack, info)


def test_minor_error_leaves_the_driver_running_until_it_clears(stack):
    """DWS's Minor severity is status Running with the error recorded: not a failure."""
    jobid = stack.submit(["#DW DataIn action=error message=slow_disk severity=Minor"])
    entry = wait_driver_status(stack, jobid, "Running")
    assert (entry["message"], entry["error"]) == ("Reported error: slow_disk", "slow disk")
    complete_waiting_driver(stack, jobid, State.DATAIN)
    info = stack.wait(jobid)
    assert info.result == "COMPLETED" and not info.events("dws-transient"), info.exception
    assert_clean(stack, info)


def test_minor_error_that_never_clears_ends_at_the_state_timeout(stack):
    jobid = stack.submit(["#DW DataIn action=error message=slow_disk"], timeouts={"datain": "1s"})
    info = stack.wait(jobid)
    assert info.result == "FAILED"
    assert "DataIn failed: did not complete within 1s" in note(info), note(info)
    assert_clean(stack, info)


def test_several_directives_at_once_the_last_fatal_is_reported(stack):
    jobid = stack.submit(
        [
            "#DW Proposal action=complete",
            "#DW Setup action=complete",
            "#DW Setup action=error message=first severity=Fatal",
            "#DW Setup action=error message=second severity=Fatal",
            "#DW Teardown action=complete",
        ]
    )
    info = stack.wait(jobid)
    assert info.result == "FAILED"
    assert note(info).startswith("Setup failed: "), note(info)
    assert "Reported error: second" in note(info) and "first" not in note(info), note(info)
    assert_clean(stack, info)


def nnf_objects_left(stack, jobid: int) -> list[str]:
    """nnf-sos's objects of the job's workflow still in the API server, by plural."""
    selector = f"{WORKFLOW_NAME_LABEL}={workflow_name(stack.identity, jobid)}"
    plurals = ("directivebreakdowns", "servers", "clientmounts")
    return [p for p in plurals if stack.api.store.list(p, None, selector)[0]]


def test_jobdw_storage_through_the_nnf_driver(stack):
    """#DW jobdw: on the real DWS, dwssim plays only nnf-sos's driver (the breakdown, the
    Servers status, the ClientMounts) and DWS rolls its entries up, as on a real system."""
    jobid = stack.submit([JOBDW, "#DW DataIn action=complete"], runtime=0.05)
    info = stack.wait(jobid)
    assert info.result == "COMPLETED" and info.attach_status == 0, info.exception
    assert states_entered(info) == [s.value for s in STATES]
    assert info.env["DW_JOB_scratch"].startswith("/mnt/nnf/"), info.env
    assert_clean(stack, info)
    assert not nnf_objects_left(stack, jobid)


def test_jobdw_whose_rabbit_fails_setup_fails_with_nnf_sos_message(stack):
    stack.sim.faults.fail_setup("rabbit-0")
    try:
        info = stack.wait(stack.submit(JOBDW, runtime=0.05))
    finally:
        stack.sim.faults.fail_setup("rabbit-0", False)
    assert info.result == "FAILED" and "start" not in names(info)
    assert note(info).startswith("Setup failed: "), note(info)
    assert "could not create file system on rabbit(s) rabbit-0" in note(info), note(info)
    assert states_entered(info)[-1] == "Teardown"
    assert_clean(stack, info)
    assert not nnf_objects_left(stack, info.id)


@pytest.mark.parametrize("state", BEFORE_TEARDOWN, ids=lambda s: s.value)
def test_cancel_while_waiting_reaches_teardown(stack, state):
    jobid = stack.submit([f"#DW {state.value} action=wait"], runtime=0.05)
    stack.wait_workflow(jobid, state)
    stack.cancel(jobid)
    info = stack.wait(jobid)
    assert info.exception["type"] == "cancel"
    assert states_entered(info)[-1] == "Teardown"
    assert_clean(stack, info)


def test_service_killed_mid_run_picks_up_where_it_stopped(stack):
    jobid = stack.submit(["#DW PreRun action=wait"], runtime=0.05)
    stack.wait_workflow(jobid, State.PRERUN)
    stack.kill_service()
    complete_waiting_driver(stack, jobid, State.PRERUN)
    stack.start_service()
    info = stack.wait(jobid)
    assert info.result == "COMPLETED" and info.attach_status == 0, info.exception
    assert states_entered(info)[-1] == "Teardown"
    assert_clean(stack, info)


def test_a_burst_of_fifty_jobs_all_end_clean(stack):
    directives = [
        ["#DW Proposal action=complete"],
        ["#DW Setup action=error message=burst severity=Fatal"],
        ["#DW PostRun action=complete", "#DW DataOut action=complete"],
    ]
    jobs = [stack.submit(directives[i % 3], runtime=0.01) for i in range(50)]
    infos = [stack.wait(jobid, timeout=300) for jobid in jobs]
    results = [info.result for info in infos]
    assert results == [("FAILED" if i % 3 == 1 else "COMPLETED") for i in range(50)]
    for info in infos:
        assert_clean(stack, info)


@pytest.mark.parametrize(
    "directive,driven",
    [
        ("#DW Proposal action=complete", ()),
        (JOBDW, (State.SETUP, State.PRERUN, State.POSTRUN, State.TEARDOWN)),
    ],
    ids=["test-driver", "nnf-driver"],
)
def test_the_workflow_goes_through_the_versions_real_dws_writes(stack, directive, driven):
    """Real DWS's writes, one by one: its finalizer, then each state's entry (not ready,
    DriverWait) before the roll-up, and status.computes in a write of its own: 27 versions
    for a job whose only directive completes, status.message never written empty.  A
    driver's write is its own, and DWS rolls it up in the next: one more version in each
    state after Proposal where the NNF driver has an entry (a jobdw: 31)."""
    start = stack.api.store.resource_version
    jobid = stack.submit([directive], runtime=0.05)
    info = stack.wait(jobid)
    assert_clean(stack, info)
    watch = stack.api.store.watch("workflows", resource_version=start)
    seen = []
    while (event := watch.next(0)) is not None:
        if event[1]["metadata"]["name"] == workflow_name(stack.identity, jobid):
            status = event[1].get("status") or {}
            assert "message" not in status, status
            seen.append((status.get("state"), status.get("ready"), status.get("status")))
    watch.close()
    entry = [(None, False, None)] * 2 + [("Proposal", False, "DriverWait")] * 3
    expected = [*entry, ("Proposal", True, "Completed"), ("Proposal", True, "Completed")]
    for state in STATES[1:]:
        expected += [(state.value, False, "DriverWait")] * (2 if state in driven else 1)
        expected += [(state.value, True, "Completed")]
        expected += [(state.value, True, "Completed")]
    expected += [("Teardown", True, "Completed")] * 2  # the service's last patch, the delete
    assert seen == expected
