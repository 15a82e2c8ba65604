# SPDX-License-Identifier: LGPL-3.0-only
"""Early release end to end: the service, kubeapi, dwssim (DataOut delayed) and a job-manager
(fakeflux; a real Flux instance scheduled by Fluxion where flux-core and Fluxion are).

With ``[dws] release-nodes = "after-unmount"`` a job is inactive, its nodes free, while its
DataOut still runs; how DataOut and Teardown ended is in the job's KVS (dws.release.*).
"""

from __future__ import annotations

import io
import json

import pytest

from flux_dws.base.jobid import f58
from flux_dws.cli import main
from flux_dws.cli.sources import StackSource
from flux_dws.core.release import RELEASE_ANNOTATION
from flux_dws.core.states import State
from flux_dws.testing.stack import Stack
from tests.waiting import wait_for

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
COPY_OUT = "#DW copy_out source=$DW_JOB_scratch/out destination=/lus/out"
COPY_OUT_FAILS = "#DW copy_out source=$DW_JOB_scratch/missing destination=/lus/out"
DATAOUT_SECONDS = 3.0
RABBITS = {"rabbit-0": ["compute-01", "compute-02"]}


@pytest.fixture(scope="module", params=["fakeflux", "flux", "fluxion"])
def early(request):
    """fakeflux; real Flux with sched-simple (no rabbits in the graph: the nodes go back and
    nothing stands for the rabbit capacity); real Flux with Fluxion scheduling rabbits."""
    from conftest import _fluxion_missing, _real_flux_missing

    config: dict = {"heartbeat": "2s", "release-nodes": "after-unmount", "health-interval": "0.5s"}
    delays = {State.DATAOUT: DATAOUT_SECONDS, State.TEARDOWN: 1.0}
    kw: dict = {}
    if request.param != "fakeflux":
        missing = (_fluxion_missing if request.param == "fluxion" else _real_flux_missing)()
        if missing:
            pytest.skip(missing)
        kw = {"backend": "flux"}
    if request.param == "fluxion":
        config["rabbit-scheduling"] = True
        kw["rabbits"] = RABBITS
    with Stack(config, hosts=2, delays=delays, capacity=36 * 2**30, **kw) as running:
        yield running


def workflow_of(stack, jobid):
    name = f"fluxjob-{stack.identity}-{jobid}"
    return next((w for w in stack.workflows() if w["metadata"]["name"] == name), None)


def system_status(stack) -> dict[str, str]:
    obj = stack.api.store.get("systemstatuses", "default", "default")
    return dict((obj.get("data") or {}).get("nodes") or {})


def gone(stack, jobid) -> bool:
    return workflow_of(stack, jobid) is None


def test_nodes_run_another_job_while_dataout_goes_on(early):
    first = early.submit([JOBDW, COPY_OUT], nnodes=2)
    info = early.wait(first)
    assert info.result == "COMPLETED" and info.attach_status == 0
    (release,) = info.events("dws-release")
    assert release["context"]["drained"] == []
    wf = workflow_of(early, first)
    assert wf is not None and wf["spec"]["desiredState"] == "DataOut"
    assert RELEASE_ANNOTATION in wf["metadata"]["annotations"]
    # the same two nodes run a plain job while the first job's DataOut is still going
    plain = early.flux.submit({}, nnodes=2)
    assert early.wait(plain).result == "COMPLETED"
    assert workflow_of(early, first) is not None
    wait_for(lambda: gone(early, first), timeout=60)
    dataout = json.loads(early.saved(first, "dws.release.dataout"))
    assert dataout["status"] == "done"
    assert [c["status"] for c in dataout["copies"]] == ["Success"]
    assert json.loads(early.saved(first, "dws.release.teardown"))["status"] == "done"


def test_dataout_failure_after_release_is_saved_for_the_user(early):
    jobid = early.submit([JOBDW, COPY_OUT_FAILS])
    info = early.wait(jobid)
    assert info.result == "COMPLETED"  # the job ended before DataOut did
    wait_for(lambda: gone(early, jobid), timeout=60)
    dataout = json.loads(early.saved(jobid, "dws.release.dataout"))
    assert dataout["status"] == "failed"
    assert dataout["copies"][0]["status"] == "Failed"
    assert "missing" in dataout["copies"][0]["message"]
    # Flux's result stays COMPLETED (the job is inactive: no memo can be set on it): the
    # saved outcome carries the job's real result and why, in the one form of every failure
    lead = f"DataOut failed: {COPY_OUT_FAILS}: "
    assert dataout["result"] == "FAILED" and dataout["reason"].startswith(lead)
    assert "Failed to open $DW_JOB_scratch/missing" in dataout["reason"]
    assert dataout["reason"].endswith(f"; check the paths; flux dws status {f58(jobid)}")
    assert json.loads(early.saved(jobid, "dws.release.teardown"))["status"] == "done"
    # what `flux dws status JOBID` shows the user: FAILED, and why
    text = status_of(early, jobid)
    lines = text.splitlines()
    assert "STATE     INACTIVE (FAILED); flux jobs shows COMPLETED" in lines[1]
    assert "RELEASED" in text and "TEARDOWN   done" in text
    assert f"DATAOUT    {dataout['reason']}" in lines
    assert "copy_out #1: Failed" in text
    assert json.loads(status_of(early, jobid, "--json"))["outcome"] == "FAILED"


def status_of(stack, jobid, *options):
    """What `flux dws status JOBID` prints."""
    out = io.StringIO()
    code = main(
        ["status", *options, f58(jobid)],
        out=out,
        err=io.StringIO(),
        source_factory=lambda: StackSource(stack),
        environ={},
    )
    assert code == 0
    return out.getvalue()


def test_a_node_whose_unmount_hangs_is_drained_alone(early):
    hosts = list(early.hosts)
    early.sim.faults.hang_unmount(hosts[1])
    try:
        jobid = early.submit(JOBDW, nnodes=2, timeouts={"postrun": "2s"})
        info = early.wait(jobid)
    finally:
        early.sim.faults.hang_unmount(hosts[1], False)
    assert "still mounted on " + hosts[1] in info.exception["note"]
    (release,) = info.events("dws-release")
    assert release["context"]["drained"] == [hosts[1]]
    drained = early.flux.drained()
    assert hosts[1] in drained and hosts[0] not in drained
    assert "workflow fluxjob-" in drained[hosts[1]] and "PostRun" in drained[hosts[1]]
    # a drain for a failed unmount makes the node Disabled for NNF, which then skips it
    wait_for(lambda: system_status(early).get(hosts[1]) == "Disabled", timeout=30)
    early.flux.undrain(hosts[1])
    # Enabled again before the next job: else nnf-sos would skip (not unmount) it there
    wait_for(lambda: system_status(early).get(hosts[1]) == "Enabled", timeout=30)
    wait_for(lambda: gone(early, jobid), timeout=60)
    assert json.loads(early.saved(jobid, "dws.release.teardown"))["status"] == "done"


def test_a_job_asking_for_the_safe_behaviour_is_held_until_teardown(early):
    jobid = early.submit([JOBDW, COPY_OUT], release="after-teardown")
    info = early.wait(jobid)
    assert not info.events("dws-release")
    assert gone(early, jobid)  # the job ended only once its workflow was gone
    assert [e["context"]["status"] for e in info.events("dws-datamovement")] == ["Success"]


def test_a_job_needing_the_same_rabbit_waits_for_the_first_ones_teardown(early):
    """Under Fluxion the first job's ssd parts stay down until its Teardown is done: a
    second job that needs most of the rabbit is allocated only after that."""
    if not early.policy.rabbit_scheduling:
        pytest.skip("only Fluxion schedules rabbits")
    big = "#DW jobdw type=xfs capacity=20GiB name=scratch"
    first = early.submit([big, COPY_OUT])
    early.wait(first)
    assert early.flux.job_R(first)  # allocated with its ssd parts
    second = early.submit(big)
    wait_for(lambda: gone(early, first), timeout=60)
    info = early.wait(second)
    # COMPLETED: dwssim found the rabbit's capacity free at Setup (before the ssd parts were
    # held, the second job was allocated at once and failed "insufficient capacity")
    assert info.result == "COMPLETED"
    alloc = info.events("alloc")[0]["timestamp"]
    dataout = json.loads(early.saved(first, "dws.release.dataout"))
    assert alloc > dataout["at"]  # not while the first one's DataOut went on


@pytest.mark.parametrize("during", [State.DATAOUT, State.TEARDOWN])
def test_service_killed_after_the_release_converges(early, during):
    jobid = early.submit([JOBDW, COPY_OUT])
    early.wait(jobid)
    if during is State.TEARDOWN:
        early.wait_workflow(jobid, State.TEARDOWN, timeout=60)
    early.kill_service()
    early.start_service()
    wait_for(lambda: gone(early, jobid), timeout=60)
    assert json.loads(early.saved(jobid, "dws.release.teardown"))["status"] == "done"


def test_instance_restart_during_dataout_converges():
    """The instance (and its service) restarts while a released job's DataOut goes on: the
    job is inactive in the restarted instance, its workflow carries the mark, and the new
    service finishes DataOut and Teardown and saves both outcomes."""
    from conftest import _real_flux_missing

    missing = _real_flux_missing()
    if missing:
        pytest.skip(missing)
    config = {"heartbeat": "1s", "release-nodes": "after-unmount"}
    delays = {State.DATAOUT: 8.0, State.TEARDOWN: 1.0}
    options = {"persist": True}
    with Stack(config, hosts=2, delays=delays, backend="flux", realflux=options) as stack:
        jobid = stack.submit([JOBDW, COPY_OUT])
        assert stack.wait(jobid, timeout=60).events("dws-release")
        assert workflow_of(stack, jobid)["spec"]["desiredState"] == "DataOut"
        stack.flux.shutdown()
        stack.flux.service_exit(30)
        stack.flux.restart()
        stack.flux.start_service()
        wait_for(lambda: gone(stack, jobid), timeout=90)
        assert json.loads(stack.saved(jobid, "dws.release.dataout"))["status"] == "done"
        assert json.loads(stack.saved(jobid, "dws.release.teardown"))["status"] == "done"


def test_after_an_instance_restart_no_dw_job_is_scheduled_before_the_holds_are_back():
    """Fluxion forgets, when the instance restarts, that a released job's ssd parts are down.
    A #DW job queued for that rabbit (in SCHED) goes back to PRIORITY at the restart, and the
    plugin keeps it there (dws-waiting) until the restarted service has held the parts
    again: it is not allocated while no service runs, and runs only after the first job's
    Teardown.  (Before, it went straight back to Fluxion, with the parts up; in this
    instance Fluxion 0.54 then denied it as unsatisfiable at once, as it does any job
    pending at the restart, #DW or not.)"""
    import time

    from conftest import _fluxion_missing

    missing = _fluxion_missing()
    if missing:
        pytest.skip(missing)
    config = {"heartbeat": "1s", "release-nodes": "after-unmount", "rabbit-scheduling": True}
    delays = {State.DATAOUT: 12.0, State.TEARDOWN: 1.0}
    big = "#DW jobdw type=xfs capacity=20GiB name=scratch"
    options = {"persist": True}
    kw = {"rabbits": RABBITS, "capacity": 36 * 2**30, "realflux": options}
    with Stack(config, hosts=2, delays=delays, backend="flux", **kw) as stack:
        first = stack.submit([big, COPY_OUT])
        assert stack.wait(first, timeout=60).events("dws-release")
        second = stack.submit(big)
        stack.flux.wait(second, "SCHED", timeout=60)  # waits for the first one's parts
        stack.flux.shutdown()
        stack.flux.service_exit(30)
        stack.flux.restart()
        kept_or_run = ("dws-waiting", "alloc")
        wait_for(lambda: any(map(stack.flux.info(second).events, kept_or_run)), timeout=30)
        time.sleep(3.0)  # no service yet: the job stays unallocated however long it waits
        info = stack.flux.info(second)
        assert not info.events("alloc")
        assert info.state == "PRIORITY"
        (waiting,) = info.events("dws-waiting")
        assert "released early" in waiting["context"]["reason"]
        stack.flux.start_service()
        wait_for(lambda: gone(stack, first), timeout=90)
        info = stack.wait(second, timeout=90)
        assert info.result == "COMPLETED"
        teardown = json.loads(stack.saved(first, "dws.release.teardown"))
        assert teardown["status"] == "done"
        assert info.events("alloc")[0]["timestamp"] > teardown["at"]


def test_service_killed_again_and_again_through_the_release_converges(early):
    """SIGKILL the service every half second while jobs go through PostRun, the release,
    DataOut and Teardown: each job is released once, every workflow ends, both outcomes are
    saved, and no node is left drained."""
    import time

    jobs = [early.submit([JOBDW, COPY_OUT]) for _ in range(3)]
    for _ in range(6):
        time.sleep(0.5)
        early.kill_service()
        early.start_service()
    for jobid in jobs:
        info = early.wait(jobid, timeout=90)
        assert len(info.events("dws-release")) == 1
        assert len(info.events("epilog-finish")) == 1
        wait_for(lambda j=jobid: gone(early, j), timeout=90)
        assert json.loads(early.saved(jobid, "dws.release.dataout"))["status"] == "done"
        assert json.loads(early.saved(jobid, "dws.release.teardown"))["status"] == "done"
    assert early.flux.drained() == {}


def test_dataout_is_asked_only_once_flux_holds_the_release():
    """The workflow leaves PostRun only once Flux has answered the dws-release post: a
    service killed between the two would otherwise restart with the workflow in DataOut and
    no release on the job, end DataOut the usual way and never save its outcome (seen once
    in test_service_killed_again_and_again_through_the_release_converges)."""
    import threading
    import time

    config = {"heartbeat": "2s", "release-nodes": "after-unmount", "health-interval": "0.5s"}
    with Stack(config, hosts=2, delays={State.DATAOUT: 1.0}) as stack:
        assert stack.service is not None
        jm = stack.service.executor.jm
        real_post = jm.post
        held: list = []
        posted = threading.Event()

        def post(jobid, name, context, on_done):
            if name != "dws-release" or held:
                return real_post(jobid, name, context, on_done)

            def answered(*answer):
                held.append((on_done, answer))
                posted.set()

            return real_post(jobid, name, context, answered)

        jm.post = post
        jobid = stack.submit([JOBDW, COPY_OUT])
        assert posted.wait(60)
        time.sleep(1.0)  # the chain, were it not waiting, would have asked DataOut by now
        assert workflow_of(stack, jobid)["spec"]["desiredState"] == "PostRun"
        assert not stack.flux.info(jobid).events("epilog-finish")
        on_done, answer = held[0]
        stack.service.loop.call_soon(on_done, *answer)
        wait_for(lambda: gone(stack, jobid), timeout=60)

        def saved() -> dict | None:  # its own post: it may land just after the delete
            try:
                return json.loads(stack.saved(jobid, "dws.release.dataout"))
            except FileNotFoundError:
                return None

        assert wait_for(saved, "the saved DataOut outcome", timeout=30)["status"] == "done"


def test_a_restarted_service_never_marks_a_held_part_up():
    """A service restarted during a released job's DataOut reads every workflow's release
    mark before its first health pass: that pass marks the rabbit's pool up but never the part
    the released job holds (Fluxion would give it to a queued job), which goes up only once
    Teardown is done.  The workflow list is slowed so that, were the pass not waiting for it,
    it would come first."""
    import dataclasses

    from flux_dws.core.release import read_mark

    config = {"heartbeat": "2s", "release-nodes": "after-unmount", "health-interval": "0.5s"}
    delays = {State.DATAOUT: DATAOUT_SECONDS, State.TEARDOWN: 1.0}
    held, free = "/cluster/rabbit-0/ssd0", "/cluster/rabbit-0/ssd1"
    with Stack(config, hosts=2, delays=delays, rabbits=RABBITS) as stack:
        jobid = stack.submit([JOBDW, COPY_OUT])
        assert stack.wait(jobid).events("dws-release")
        stack.kill_service()
        # as a Fluxion-scheduled release leaves it: the mark names the part, held down
        wf = workflow_of(stack, jobid)
        meta = wf["metadata"]
        mark = read_mark(meta["annotations"])
        assert mark is not None and wf["spec"]["desiredState"] == "DataOut"
        meta["annotations"][RELEASE_ANNOTATION] = dataclasses.replace(
            mark, ssd=(held,)
        ).to_annotation()
        stack.api.store.replace("workflows", meta["namespace"], meta["name"], wf)
        stack.flux.fluxion = True  # the next service's nodes see Fluxion loaded
        fluxion = stack.flux.ssd
        fluxion.parts = {"rabbit-0": (held, free)}
        fluxion.vertices.update({held: False, free: True})
        stack.api.faults.set(latency=2.0, plurals=["workflows"], verbs=["list"])
        service = stack.start_service()
        wait_for(lambda: service.listed, timeout=30)
        stack.api.faults.clear()
        wait_for(lambda: service.health.passes >= 1, timeout=30)
        assert (free, True) in fluxion.set_status  # the pass marked the pool up...
        assert fluxion.vertices[held] is False  # ...but not the held part
        wait_for(lambda: gone(stack, jobid), timeout=60)
        ups = [up for path, up in fluxion.set_status if path == held]
        assert ups[0] is False and ups[-1] is True and ups == sorted(ups)  # up only at the end
        assert json.loads(stack.saved(jobid, "dws.release.teardown"))["status"] == "done"
