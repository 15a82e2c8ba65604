# SPDX-License-Identifier: LGPL-3.0-only
"""User containers run by nnf-sos, the real NNF driver, beside the real DWS.

``Stack(dws="real", nnf="sos")`` as in tests/test_nnf_sos_driver.py.  For a ``#DW container``
directive nnf-sos pins the profile in Proposal, makes a headless Service and a batch Job per
rabbit (or an MPIJob) in PreRun and waits for them to run, then in PostRun waits for them to
end and reads their result; in Teardown it deletes them.  No kubelet, Job controller or MPI
operator runs here: dwssim plays them (flux_dws.testing.dwssim.workloads), running each
container as its image says (dwssim's behaviour profiles), with its exit code and log.  The
flux-dws service runs each job against fakeflux and reads the pods and their logs as it does on
a real system.  Where the binaries are absent these tests skip with one line.
"""

from __future__ import annotations

import json

import pytest
from waiting import wait_for

from flux_dws.base.jobid import f58
from flux_dws.cli import main
from flux_dws.cli.sources import StackSource
from flux_dws.core.identity import workflow_name
from flux_dws.core.output import OUTPUT_KEY
from flux_dws.core.states import State
from flux_dws.testing.dwssim.containers import PROFILE_NAMESPACE, container_profile
from flux_dws.testing.nnfsos import nnf_sos_problem
from flux_dws.testing.stack import Stack

RABBIT = "rabbit-0"
COMPUTES = ["compute-01", "compute-02"]
GFS2 = "#DW jobdw type=gfs2 capacity=10GiB name=shared"
#: what nnf-sos makes for a container directive, each named after the workflow
CONTAINER_KINDS = ("jobs", "mpijobs", "pods", "services", "nnfcontainerprofiles")


def container(profile: str) -> list[str]:
    """A gfs2 jobdw (nnf-sos mounts only gfs2, lustre or raw storage in a container) and a
    container using it under a storage name its profile lists."""
    return [GFS2, f"#DW container name=app profile={profile} DW_JOB_local_storage=shared"]


@pytest.fixture(scope="module")
def stack():
    if nnf_sos_problem():
        pytest.skip(nnf_sos_problem())
    with Stack(hosts=len(COMPUTES), dws="real", nnf="sos", rabbits={RABBIT: COMPUTES}) as running:
        # profiles whose timeouts a test can wait for (dwssim's own wait 300 s)
        for name, behavior, data in (
            ("never-start-1s", "never-start", {"preRunTimeoutSeconds": 1}),
            ("hang-1s", "hang", {"postRunTimeoutSeconds": 1}),
        ):
            profile = container_profile(name, behavior, **data)
            running.api.store.create("nnfcontainerprofiles", PROFILE_NAMESPACE, profile)
        yield running


def run(stack, directives: list[str], **options):
    """Submit the job and wait for its end.  nnf-sos's Setup reads the Servers from its cache;
    flux-dws asks for Setup only once that cache has them (core.rabbits.servers_awaiting_nnf),
    so no job here may lose that race."""
    return stack.wait(stack.submit(directives, **options), timeout=180)


def started(stack, directives: list[str], **options) -> int:
    """Submit the job and wait until its tasks start."""
    jobid = stack.submit(directives, **options)
    stack.wait_event(jobid, "start", timeout=120)
    return jobid


def names(info) -> list[str]:
    return [e["name"] for e in info.eventlog]


def states_entered(info) -> list[str]:
    return [e["context"]["state"] for e in info.events("dws-state")]


def note(info) -> str:
    return (info.exception or {}).get("note", "")


def mine(stack, plural: str, name: str) -> list[str]:
    items, _ = stack.api.store.list(plural, stack.policy.namespace)
    return [i["metadata"]["name"] for i in items if i["metadata"]["name"].startswith(name)]


def assert_clean(stack, info) -> None:
    """The workflow is gone, and every Job, MPIJob, pod, Service and pinned profile with it."""
    assert info.state == "INACTIVE" and not info.holds, info.holds
    assert not stack.left_behind(info.id)
    name = workflow_name(stack.identity, info.id)
    for plural in CONTAINER_KINDS:
        wait_for(lambda p=plural: not mine(stack, p, name), f"{plural} of {name} to go", 60)


def logs(stack, jobid: int) -> tuple[int, str]:
    """What ``flux dws logs ID`` prints."""
    import io

    out, err = io.StringIO(), io.StringIO()
    code = main(["logs", str(jobid)], out=out, err=err, source_factory=lambda: StackSource(stack))
    return code, out.getvalue() + err.getvalue()


def test_a_container_job_runs_and_completes_under_nnf_sos(stack):
    # runs until finished below: the container runs until PostRun, and is read running here
    # (a runtime of its own would be a race between these reads and its end)
    jobid = started(stack, container("ok"), runtime=None)  # PreRun done: nnf-sos saw it ready
    name = workflow_name(stack.identity, jobid)
    try:
        # nnf-sos's Job for the rabbit, owned by the workflow; its controller's pod, Running
        [job] = [
            j
            for j in stack.api.store.list("jobs", "default")[0]
            if j["metadata"]["name"] == f"{name}-{RABBIT}"
        ]
        assert [o["kind"] for o in job["metadata"]["ownerReferences"]] == ["Workflow"]
        assert job["status"]["ready"] == 1
        [pod] = [
            p
            for p in stack.api.store.list("pods", "default")[0]
            if p["metadata"]["name"].startswith(job["metadata"]["name"])
        ]
        assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] == RABBIT
        assert pod["metadata"]["labels"]["nnf.cray.hpe.com/container"] == name
        assert mine(stack, "services", name) == [name]  # nnf-sos's headless Service
    finally:
        stack.flux.finish(jobid)
    info = stack.wait(jobid, timeout=120)
    assert (info.result, info.exception) == ("COMPLETED", None), info.exception
    assert states_entered(info) == [s.value for s in State]
    env = info.events("dws-environment")[0]["context"]["env"]
    # nnf-sos's addEnvVars: the rabbits the containers run on, by hostname
    assert env["NNF_CONTAINER_HOSTNAMES"] == RABBIT
    assert (env["NNF_CONTAINER_SUBDOMAIN"], env["NNF_CONTAINER_DOMAIN"]) == (
        name,
        "default.svc.cluster.local",
    )
    (outcome,) = info.events("dws-container")
    assert outcome["context"]["state"] == "exited"
    ran = {(c["name"], c["exit_code"]) for c in outcome["context"]["containers"]}
    assert ran == {("user-init-passwd", 0), ("ok-app", 0)}  # nnf-sos's init container too
    saved = json.loads(stack.saved(jobid, OUTPUT_KEY))
    [app] = [c for c in saved["containers"] if c["name"] == "ok-app"]
    assert app["log"].endswith("done: exiting 0\n")
    code, out = logs(stack, jobid)
    assert code == 0 and "done: exiting 0" in out, out
    assert_clean(stack, info)


def test_a_container_that_exits_nonzero_fails_the_job_in_postrun(stack):
    """The Job's pod fails; the Job controller retries it retryLimit (6) times and gives up;
    nnf-sos fails PostRun with the Job's condition, which the user reads on the job."""
    info = run(stack, container("exit-nonzero"), runtime=0.05)
    assert "start" in names(info), note(info)
    assert (info.exception or {}).get("type") == "dws" and info.attach_status != 0
    assert note(info).startswith("PostRun failed: "), note(info)
    reason = (
        "container job Failed (BackoffLimitExceeded): Job has reached the specified backoff limit"
    )
    assert reason in note(info), note(info)
    assert f"flux dws logs {f58(info.id)}" in note(info)
    entered = states_entered(info)
    assert "DataOut" not in entered and entered[-1] == "Teardown"
    outcome = info.events("dws-container")[0]["context"]
    assert (outcome["state"], outcome["phase"]) == ("failed", "PostRun")
    codes = [c["exit_code"] for c in outcome["containers"] if c["name"] == "exit-nonzero-app"]
    assert codes == [1] * 7  # the first pod and its six retries, each kept (restartPolicy Never)
    code, out = logs(stack, info.id)
    assert code == 0 and "No such file or directory" in out, out
    assert_clean(stack, info)


def test_an_mpi_container_that_crashes_fails_after_its_retries(stack):
    """dwssim's crash-loop profile is an MPI one: nnf-sos makes an MPIJob; its launcher Job's
    pods crash until the back-off limit; nnf-sos words the MPIJob's Failed condition."""
    info = run(stack, container("crash-loop"), runtime=0.05)
    name = workflow_name(stack.identity, info.id)
    assert "start" in names(info), (note(info), names(info))
    assert "failed to run successfully after 7 attempts" in note(info), note(info)
    outcome = info.events("dws-container")[0]["context"]
    assert outcome["detail"].endswith(
        "container MPIJob Failed (BackoffLimitExceeded/): "
        "Job has reached the specified backoff limit: "
    )
    launchers = {c["pod"] for c in outcome["containers"] if c["name"] == "crash-loop-launcher"}
    assert len(launchers) == 7 and all(p.startswith(f"{name}-launcher-") for p in launchers)
    env = info.events("dws-environment")[0]["context"]["env"]
    # nnf-sos: the launcher's rabbit (its Job's nodeSelector), and the MPI hostnames
    assert env["NNF_CONTAINER_LAUNCHER"] == RABBIT
    assert env["NNF_CONTAINER_HOSTNAMES"] == f"{name}-launcher,{name}-worker-0"
    assert "DataOut" not in states_entered(info)
    assert_clean(stack, info)


def test_a_container_that_never_starts_fails_prerun_at_its_profile_timeout(stack):
    """nnf-sos sets the Job's deadline once preRunTimeoutSeconds have passed; the Job
    controller fails it and removes its pod; the job never runs."""
    info = run(stack, container("never-start-1s"), runtime=0.05)
    assert info.result == "FAILED" and "start" not in names(info)
    assert note(info).startswith("PreRun failed: "), note(info)
    assert "user container(s) failed to start after 1 seconds" in note(info), note(info)
    outcome = info.events("dws-container")[0]["context"]
    assert outcome["phase"] == "PreRun"
    entered = states_entered(info)
    assert "PostRun" not in entered and entered[-1] == "Teardown"
    assert_clean(stack, info)


def test_a_container_that_hangs_fails_postrun_at_its_profile_timeout(stack):
    info = run(stack, container("hang-1s"), runtime=0.05)
    assert "start" in names(info), note(info)
    assert "user container(s) failed to complete after 1 seconds" in note(info), note(info)
    outcome = info.events("dws-container")[0]["context"]
    assert outcome["state"] == "timed-out" and outcome["phase"] == "PostRun"
    assert outcome["detail"].endswith(
        "container job Failed (DeadlineExceeded): Job was active longer than specified deadline"
    )
    # the Job controller deleted the pod at the deadline; it is still stopping (a hung
    # container is killed at the end of the pod's grace period, 30 s) when flux-dws reads it
    [app] = [c for c in outcome["containers"] if c["name"] == "hang-1s-app"]
    assert (app["exit_code"], app["reason"]) == (None, "")
    saved = json.loads(stack.saved(info.id, OUTPUT_KEY))
    [log] = [c for c in saved["containers"] if c["name"] == "hang-1s-app"]
    assert log["state"] == "running" and log["log"] == "hang-1s-app: starting\n"
    assert "DataOut" not in states_entered(info)
    assert_clean(stack, info)


def test_a_storage_its_profile_does_not_list_fails_the_job_in_proposal(stack):
    """nnf-sos's validateContainerDirective (dwssim says the same: tests/test_dwssim.py)."""
    dw = [GFS2, "#DW container name=app profile=ok DW_JOB_data=shared"]
    info = run(stack, dw)
    assert info.result == "FAILED" and "start" not in names(info)
    assert note(info).startswith("Proposal failed: "), note(info)
    assert "storage 'DW_JOB_data' not found in container profile 'ok'" in note(info), note(info)
    assert_clean(stack, info)
