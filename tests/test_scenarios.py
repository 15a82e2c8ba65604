# SPDX-License-Identifier: LGPL-3.0-only
"""User-level scenarios: #DW jobs through the real service, kubeapi, dwssim and a job-manager.

The job-manager side is the ``stack`` fixture (tests/conftest.py): fakeflux always, and a real
Flux instance with the jobtap plugin where flux-core is installed.  They run on the real DWS too
(``ON_REAL_DWS``: the "realdws" and "realdws-flux" backends, where its binaries are built): DWS's
manager and test driver roll the workflows up, with dwssim as the NNF driver (containers, data
movement, storage), so each container, copy, timeout and cancel ends as it does on a real DWS.
Every scenario checks what a user would see (result, exception note, eventlog, environment) and
that nothing is left behind: no workflow in Kubernetes and no hold on the job.
"""

from __future__ import annotations

import pytest

from flux_dws.core.states import State
from flux_dws.testing.dwssim import seed
from flux_dws.testing.stack import Stack

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
GFS2 = "#DW jobdw type=gfs2 capacity=10GiB name=shared"
COPY_IN = "#DW copy_in source=/lus/in destination=$DW_JOB_scratch/in"
COPY_OUT = "#DW copy_out source=$DW_JOB_scratch/out destination=/lus/out"
ON_REAL_DWS = True  # tests/conftest.py: the stack runs on the real DWS backends too


def container(profile: str) -> list[str]:
    return [GFS2, f"#DW container name=app profile={profile} DW_JOB_local_storage=shared"]


def names(info) -> list[str]:
    return [e["name"] for e in info.eventlog]


def states_entered(info) -> list[str]:
    return [e["context"]["state"] for e in info.events("dws-state")]


def exception_note(info) -> str:
    return (info.exception or {}).get("note", "")


def assert_failed(info, ran: bool) -> None:
    """The job failed as a user sees it: `flux run` exits non-zero, with a dws exception.

    Flux fixes a job's result at its finish event, so a failure after the tasks ended
    (PostRun, DataOut) leaves the result COMPLETED while `flux run` still fails.
    """
    assert info.attach_status != 0
    assert (info.exception or {}).get("type") == "dws", info.exception
    assert info.result == ("COMPLETED" if ran else "FAILED")


def assert_clean(stack, info) -> None:
    """Nothing leaked: the workflow is gone and the job holds nothing."""
    assert info.state == "INACTIVE"
    assert not info.holds, info.holds
    # the real DWS deletes the workflow (and its Computes) as its finalizer runs, after the
    # service's delete: stack.left_behind waits a while for that
    assert not stack.left_behind(info.id)
    assert (
        len(
            [
                e
                for e in info.eventlog
                if e["name"] == "exception"
                and e["context"]["severity"] == 0
                and e["context"]["type"] == "dws"
            ]
        )
        <= 1
    )


def test_happy_path_with_storage_and_copies(stack):
    jobid = stack.submit([JOBDW, COPY_IN, COPY_OUT], runtime=0.05)
    info = stack.wait(jobid)
    assert info.result == "COMPLETED"
    assert states_entered(info) == [s.value for s in State]
    assert info.env["DW_JOB_scratch"].startswith("/mnt/nnf/")
    assert info.env["DW_WORKFLOW_NAME"] == f"fluxjob-{stack.identity}-{jobid}"
    update = info.events("jobspec-update")[0]["context"]
    assert update["attributes.system.dw_storage"]["per_compute"] == {"xfs": 10 * 2**30}
    timeouts = info.events("dws-workflow")[0]["context"]["timeouts"]
    assert set(timeouts) >= {"proposal", "prerun", "postrun", "teardown", "transient"}
    assert names(info).index("dws-environment") < names(info).index("start")
    assert_clean(stack, info)


def test_copy_offload_gives_the_job_its_workflow_token(stack):
    info = stack.wait(stack.submit(f"{JOBDW} requires=copy-offload", runtime=0.05))
    assert info.result == "COMPLETED"
    assert info.env.get("DW_WORKFLOW_TOKEN"), sorted(info.env)
    assert "DW_WORKFLOW_TOKEN" in info.events("dws-environment")[0]["context"]["env"]
    assert_clean(stack, info)


def test_user_timeouts_are_shown_on_the_job(stack):
    jobid = stack.submit(JOBDW, timeouts={"prerun": "7m", "transient": "45s"})
    info = stack.wait(jobid)
    timeouts = info.events("dws-workflow")[0]["context"]["timeouts"]
    assert timeouts["prerun"] == "7m" and timeouts["transient"] == "45s"
    prerun = [e for e in info.events("dws-state") if e["context"]["state"] == "PreRun"][0]
    assert prerun["context"]["timeout"] == "7m"
    assert prerun["context"]["deadline"] == pytest.approx(prerun["timestamp"] + 420, abs=5)


def test_container_success(stack):
    info = stack.wait(stack.submit(container("ok"), runtime=0.05))
    assert info.result == "COMPLETED"
    (outcome,) = info.events("dws-container")
    assert outcome["context"]["state"] == "exited"
    proposal = info.events("dws-proposal")[0]["context"]
    assert set(proposal["container_timeouts"]) == {"prerun", "postrun"}
    assert_clean(stack, info)


@pytest.mark.parametrize(
    "profile,reason",
    [
        ("never-start", "failed to start after"),
        ("start-fail", "PreRun failed"),
    ],
)
def test_container_that_fails_to_start_cancels_the_job_before_it_runs(stack, profile, reason):
    info = stack.wait(stack.submit(container(profile), runtime=0.05))
    assert_failed(info, ran=False)
    assert "start" not in names(info)
    assert reason in exception_note(info)
    assert info.events("dws-container")[0]["context"]["phase"] == "PreRun"
    assert "PostRun" not in states_entered(info) and "DataOut" not in states_entered(info)
    assert states_entered(info)[-1] == "Teardown"
    assert_clean(stack, info)


@pytest.mark.parametrize(
    "profile,reason",
    [
        ("exit-nonzero", "container job"),
        ("crash-loop", "failed to run successfully after 7 attempts"),
        ("hang", "failed to complete after"),
    ],
)
def test_container_that_fails_in_postrun_fails_the_job_and_skips_dataout(stack, profile, reason):
    info = stack.wait(stack.submit(container(profile), runtime=0.05))
    assert "start" in names(info)
    assert_failed(info, ran=True)
    assert reason in exception_note(info), exception_note(info)
    outcome = info.events("dws-container")[0]["context"]
    assert outcome["phase"] == "PostRun" and outcome["state"] in ("failed", "timed-out")
    assert "DataOut" not in states_entered(info)
    assert_clean(stack, info)


@pytest.mark.parametrize(
    "state", [State.PROPOSAL, State.SETUP, State.DATAIN, State.PRERUN, State.POSTRUN, State.DATAOUT]
)
def test_error_in_each_state_fails_the_job_with_the_message(stack, state):
    jobid = stack.submit(
        [JOBDW, f"#DW {state.value} action=error message=disk_on_fire severity=Fatal"],
        runtime=0.05,
    )
    info = stack.wait(jobid)
    ran = "start" in names(info)
    assert ran == (state in (State.POSTRUN, State.DATAOUT))
    assert_failed(info, ran)
    assert f"{state.value} failed" in exception_note(info)
    assert "disk on fire" in exception_note(info) or "disk_on_fire" in exception_note(info)
    assert states_entered(info)[-1] == "Teardown"
    assert_clean(stack, info)


def test_transient_condition_past_the_grace_period_fails_the_job(stack):
    jobid = stack.submit(
        [JOBDW, "#DW Setup action=error message=flaky severity=Major"],
        timeouts={"transient": "1s"},
    )
    info = stack.wait(jobid)
    assert info.result == "FAILED"
    assert "TransientCondition for more than 1s" in exception_note(info)
    assert info.events("dws-transient")
    assert_clean(stack, info)


@pytest.mark.parametrize(
    "state", [State.PROPOSAL, State.SETUP, State.DATAIN, State.PRERUN, State.POSTRUN, State.DATAOUT]
)
def test_state_timeout_fails_the_job_naming_the_state(stack, state):
    jobid = stack.submit(
        [JOBDW, f"#DW {state.value} action=wait"], timeouts={state.key: "1s"}, runtime=0.05
    )
    info = stack.wait(jobid)
    assert_failed(info, ran=state in (State.POSTRUN, State.DATAOUT))
    assert f"{state.value} failed: did not complete within 1s" in exception_note(info)
    assert_clean(stack, info)


def test_teardown_that_never_completes_is_given_up_without_holding_the_job(stack):
    jobid = stack.submit([JOBDW, "#DW Teardown action=wait"], timeouts={"teardown": "1s"})
    info = stack.wait(jobid)
    assert info.result == "COMPLETED" and info.attach_status == 0
    (failed,) = info.events("dws-teardown-failed")
    assert not info.holds
    # [dws] drain-on-teardown-failure: the job's node is drained (where the service can drain
    # nodes: not with the service in a process of its own over fakeflux's socket)
    drained = failed["context"]["drained"]
    if drained:
        assert set(drained) <= set(stack.flux.drained())
        stack.flux.undrain(",".join(drained))


@pytest.mark.parametrize(
    "where", [State.PROPOSAL, State.SETUP, State.PRERUN, "run", State.POSTRUN, State.DATAOUT]
)
def test_one_cancel_ends_the_job_and_its_workflow(stack, where):
    if where == "run":
        jobid = stack.submit(JOBDW, runtime=None)
        stack.wait(jobid, "RUN")
        stack.wait_event(jobid, "start")
    else:
        jobid = stack.submit([JOBDW, f"#DW {where.value} action=wait"], runtime=0.05)
        stack.wait_workflow(jobid, where)
    stack.cancel(jobid)
    info = stack.wait(jobid)
    # after the tasks ended, Flux keeps the result they earned; `flux run` reports the cancel
    after_tasks = where in (State.POSTRUN, State.DATAOUT)
    assert info.result == ("COMPLETED" if after_tasks else "CANCELED")
    assert info.attach_status != 0 and info.exception["type"] == "cancel"
    assert states_entered(info)[-1] == "Teardown"
    assert "DataOut" not in states_entered(info) or where is State.DATAOUT
    (teardown,) = [e for e in info.events("dws-state") if e["context"]["state"] == "Teardown"]
    assert teardown
    assert_clean(stack, info)


def test_job_cancelled_while_waiting_for_resources_never_starts(stack):
    blocker = stack.submit(
        "#DW jobdw type=xfs capacity=1GiB name=blocker", runtime=None, nnodes=len(stack.hosts)
    )
    stack.wait_event(blocker, "start")
    jobid = stack.submit(JOBDW)
    stack.wait_event(jobid, "jobspec-update")
    stack.cancel(jobid)
    info = stack.wait(jobid)
    assert info.result == "CANCELED" and "alloc" not in names(info)
    assert_clean(stack, info)
    stack.cancel(blocker)
    assert_clean(stack, stack.wait(blocker))


@pytest.fixture
def slow_release(stack):
    """The exec system releases a finished job 0.5 s after its "finish" (fakeflux only).

    Flux releases only once the job shells exited and the job's namespace is copied back; on
    a busy system that gap outlasts a quick Teardown.
    """
    if stack.backend == "flux":
        pytest.skip("a real Flux instance times its own release")
    stack.flux.release_delay = 0.5
    yield stack
    stack.flux.release_delay = 0.0


def test_cancelled_job_torn_down_before_its_release_still_ends(slow_release):
    stack = slow_release
    jobid = stack.submit(JOBDW, runtime=None)
    stack.wait_event(jobid, "start")
    stack.cancel(jobid)
    info = stack.wait(jobid)
    assert info.result == "CANCELED"
    # held from CLEANUP; the epilog finishes only once the shells are gone
    order = names(info)
    assert order.index("epilog-start") < order.index("release") < order.index("epilog-finish")
    assert_clean(stack, info)


def test_postrun_waits_for_the_release_of_a_finished_job(slow_release):
    stack = slow_release
    info = stack.wait(stack.submit(JOBDW, runtime=0.05))
    assert info.result == "COMPLETED"
    (postrun,) = [e for e in info.events("dws-state") if e["context"]["state"] == "PostRun"]
    assert names(info).index("release") < info.eventlog.index(postrun)
    assert_clean(stack, info)


def test_job_on_a_node_no_rabbit_serves_fails_before_it_starts():
    """Storage cannot be placed near a node missing from the SystemConfiguration: the job
    fails before its tasks start, with the node named, and nothing is left behind."""
    with Stack(hosts=2) as stack:
        seed(stack.api.store, rabbits={"rabbit-1": [stack.hosts[0]]})
        info = stack.wait(stack.submit(JOBDW, nnodes=2))
        assert info.result == "FAILED" and "start" not in names(info)
        assert exception_note(info).startswith("Setup failed: cannot place the job's storage: ")
        assert f"no rabbit serves compute node {stack.hosts[1]}" in exception_note(info)
        assert states_entered(info)[-1] == "Teardown"
        assert_clean(stack, info)


def test_workflow_deleted_behind_our_back_fails_the_job_and_releases_it(stack):
    jobid = stack.submit([JOBDW, "#DW PreRun action=wait"])
    stack.wait_workflow(jobid, State.PRERUN)
    stack.delete_workflow_behind_our_back(jobid)
    info = stack.wait(jobid)
    assert info.result == "FAILED"
    assert "deleted outside flux-dws" in exception_note(info)
    assert_clean(stack, info)


def test_webhook_rejection_fails_the_job_with_the_webhook_message(stack):
    stack.reject_directives_containing("forbidden-name", "name 'forbidden-name' is reserved")
    info = stack.wait(stack.submit("#DW jobdw type=xfs capacity=1GiB name=forbidden-name"))
    assert info.result == "FAILED"
    assert exception_note(info).startswith("Proposal failed: DWS rejected the job's directives: ")
    assert "is reserved" in exception_note(info)
    assert "dws-workflow" not in names(info)
    assert_clean(stack, info)


@pytest.mark.parametrize(
    "dw,timeouts,message",
    [
        ("#DW jobdw type=xfs capacity=10XB name=s", None, "capacity"),
        (JOBDW, {"prerun": "100d"}, "exceeds the site maximum"),
        (JOBDW, {"bogus": "1m"}, "bogus"),
        ("#DW container name=app profile=ok DW_JOB_x=nosuch", None, "DW_JOB_x"),
    ],
)
def test_bad_requests_are_refused_at_submit(stack, dw, timeouts, message):
    with pytest.raises(Exception) as refused:
        stack.submit(dw, timeouts=timeouts)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)
    assert stack.workflows_left() == []
