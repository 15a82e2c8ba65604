# SPDX-License-Identifier: LGPL-3.0-only
"""Rabbit and node health through the real service: drains, SystemStatus, failure tolerance,
failed Teardown, and a service restart in the middle.

Runs on fakeflux always and on a real Flux instance (drains through flux-core's resource
module) where flux-core is installed.  Four computes, two to a rabbit:
rabbit-0 serves compute-01/02, rabbit-1 serves compute-03/04.
"""

from __future__ import annotations

import io
import time
from typing import Any

import pytest

from flux_dws.base.jobid import f58
from flux_dws.cli import main as cli_main
from flux_dws.cli.sources import StackSource
from flux_dws.testing.stack import Stack
from tests.waiting import wait_for

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
CONFIG = {
    "heartbeat": "2s",
    "health-interval": "0.2s",
    "failure-tolerance-max": 2,
    "drain-compute-nodes": True,  # not the default: the drains are what is tested here
}
OFFLINE = "dws: rabbit rabbit-0 is Offline"
WAIT = 60.0


def _real_flux_missing() -> str | None:
    from flux_dws.flux.bindings import flux_command

    if flux_command() is None:
        return "flux-core is not installed (no flux on PATH or /opt/flux/bin): real Flux skipped"
    return None


@pytest.fixture(scope="module", params=["fakeflux", "flux"])
def _health_stack(request):
    backend = "fake"
    if request.param == "flux":
        missing = _real_flux_missing()
        if missing:
            pytest.skip(missing)
        backend = "flux"
    rabbits = {"rabbit-0": ["compute-01", "compute-02"], "rabbit-1": ["compute-03", "compute-04"]}
    with Stack(CONFIG, hosts=4, rabbits=rabbits, backend=backend, identity="health") as stack:
        yield stack


@pytest.fixture
def stack(_health_stack):
    """The module's stack, put back as it was after each test: rabbits Ready, no faults,
    no drains."""
    stack = _health_stack
    yield stack
    if not stack.service_running():
        stack.start_service()
    assert stack.sim is not None
    stack.sim.faults.setup.clear()
    stack.sim.faults.mount.clear()
    stack.sim.faults.unmount.clear()
    for rabbit in stack.rabbits:
        stack.set_rabbit(rabbit, "Ready", enabled=True)
    wait_for(lambda: not _ours(stack), "flux-dws's rabbit drains undone", WAIT)
    if stack.flux.drained():
        stack.flux.undrain(",".join(stack.hosts), "update")


def _ours(stack: Stack) -> dict[str, str]:
    return {h: r for h, r in stack.flux.drained().items() if r.startswith("dws: rabbit")}


def _status(stack: Stack, jobid: int) -> str:
    """What `flux dws status JOBID` prints."""
    out, err = io.StringIO(), io.StringIO()
    code = cli_main(
        ["status", str(jobid)], out=out, err=err, source_factory=lambda: StackSource(stack)
    )
    assert code == 0, err.getvalue()
    return out.getvalue()


def _system_status(stack: Stack) -> dict[str, str]:
    assert stack.api is not None
    try:
        obj = stack.api.store.get("systemstatuses", "default", "default")
    except Exception:
        return {}
    return dict((obj.get("data") or {}).get("nodes") or {})


def _settled(stack: Stack, drained: dict[str, str]) -> Any:
    return lambda: stack.flux.drained() == drained


def test_offline_rabbit_drains_its_nodes_leaves_admin_drain_and_undrains(stack):
    stack.flux.drain("compute-02", "bad DIMM")  # the admin's own drain
    stack.set_rabbit("rabbit-0", "Offline")
    expected = {"compute-01": OFFLINE, "compute-02": "bad DIMM"}
    wait_for(_settled(stack, expected), "rabbit-0's nodes drained", WAIT)
    if stack.backend == "flux":
        table = stack.flux.drain_table()
        assert "rabbit rabbit-0 is Offline" in table and "bad DIMM" in table
    # NNF's rule: neither the admin's drain nor a rabbit drain makes a live node Disabled
    wait_for(
        lambda: (
            _system_status(stack)
            == {
                "compute-01": "Enabled",
                "compute-02": "Enabled",
                "compute-03": "Enabled",
                "compute-04": "Enabled",
            }
        ),
        "SystemStatus in step with Flux",
        WAIT,
    )
    stack.set_rabbit("rabbit-0", "Ready")
    wait_for(_settled(stack, {"compute-02": "bad DIMM"}), "only the admin's drain left", WAIT)
    wait_for(
        lambda: _system_status(stack).get("compute-01") == "Enabled", "compute-01 Enabled", WAIT
    )
    assert _system_status(stack)["compute-02"] == "Enabled"  # an admin drain: NNF unmounts it


def test_a_down_link_drains_only_that_node(stack):
    stack.set_rabbit("rabbit-1", "Degraded", links={"compute-04": "Offline"})
    expected = {"compute-04": "dws: rabbit rabbit-1 link to compute-04 is Offline"}
    wait_for(_settled(stack, expected), "compute-04 drained", WAIT)
    stack.set_rabbit("rabbit-1", "Disabled", enabled=False)
    reason = "dws: rabbit rabbit-1 is Disabled by an admin (spec.state)"
    wait_for(
        _settled(stack, {"compute-03": reason, "compute-04": reason}), "rabbit-1 disabled", WAIT
    )


def test_restart_in_the_middle_converges_without_flapping(stack):
    stack.kill_service()
    stack.set_rabbit("rabbit-1", "Offline")
    stack.start_service()
    expected = {h: "dws: rabbit rabbit-1 is Offline" for h in ("compute-03", "compute-04")}
    wait_for(_settled(stack, expected), "drains after a restart", WAIT)
    stack.restart_service()  # a restart with everything in place changes nothing
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert stack.flux.drained() == expected
        time.sleep(0.05)
    stack.kill_service()
    stack.set_rabbit("rabbit-1", "Ready")
    stack.start_service()
    wait_for(_settled(stack, {}), "undrained after a restart", WAIT)


def test_one_failed_mount_is_tolerated_and_its_node_drained(stack):
    stack.sim.faults.fail_mount("compute-03")
    jobid = stack.submit(JOBDW, nnodes=4, tolerance=1)
    info = stack.wait(jobid, timeout=WAIT)
    assert info.result == "COMPLETED", info.exception
    (tolerated,) = info.events("dws-tolerated")
    assert tolerated["context"]["nodes"] == ["compute-03"]
    assert tolerated["context"]["state"] == "PreRun"
    notes = [e["context"] for e in info.events("exception")]
    assert [(n["severity"], "compute-03" in n["note"]) for n in notes] == [(1, True)]
    drained = stack.flux.drained()
    assert drained["compute-03"].startswith(f"dws: job {f58(jobid)}: PreRun failed on this node")
    assert set(drained) == {"compute-03"}
    # deleted with the workflow; nothing left behind (the job ends once flux-dws's finalizer
    # is off: DWS's own finalizer, which deletes the Computes, may still be running)
    wait_for(lambda: not stack.api.store.list("computes", "default")[0], "Computes gone", WAIT)
    assert "TOLERANCE  1 node(s) allowed, 1 used; PreRun: compute-03" in _status(stack, jobid)


def test_tolerance_zero_fails_the_job_naming_the_node(stack):
    stack.sim.faults.fail_mount("compute-02")
    jobid = stack.submit(JOBDW, nnodes=4)
    info = stack.wait(jobid, timeout=WAIT)
    assert info.result == "FAILED"
    note = info.exception["note"]
    assert "PreRun failed" in note and "compute-02" in note and "dw_failure_tolerance=0" in note
    assert not info.events("dws-tolerated")
    assert not stack.flux.drained()


def test_failed_setup_of_one_rabbit_tolerated_for_its_two_nodes(stack):
    stack.sim.faults.fail_setup("rabbit-1")
    jobid = stack.submit(JOBDW, nnodes=4, tolerance=2)
    info = stack.wait(jobid, timeout=WAIT)
    assert info.result == "COMPLETED", info.exception
    (tolerated,) = info.events("dws-tolerated")
    assert tolerated["context"]["nodes"] == ["compute-03", "compute-04"]
    assert tolerated["context"]["state"] == "Setup"
    assert set(stack.flux.drained()) == {"compute-03", "compute-04"}


def test_failed_teardown_drains_only_the_node_still_mounted(stack):
    stack.sim.faults.hang_unmount("compute-02")
    # the hung unmount holds PostRun (as in nnf-sos) until its timeout; Teardown then fails
    jobid = stack.submit(JOBDW, nnodes=4, timeouts={"postrun": "2s"})  # every node
    info = stack.wait(jobid, timeout=WAIT)
    (failed,) = info.events("dws-teardown-failed")
    hosts = failed["context"]["drained"]
    assert hosts == ["compute-02"]
    drained = stack.flux.drained()
    assert set(drained) == {"compute-02"}
    reason = drained["compute-02"]
    assert reason.startswith(f"dws: job {f58(jobid)}: unmount failed (workflow fluxjob-health-")
    shown = _status(stack, jobid)
    assert "TEARDOWN" in shown and "drained compute-02" in shown
    # our drain for a failed unmount makes the node Disabled for DWS; the others stay Enabled
    wait_for(
        lambda: _system_status(stack).get("compute-02") == "Disabled",
        "compute-02 Disabled in SystemStatus",
        WAIT,
    )
    assert _system_status(stack)["compute-01"] == "Enabled"


def test_an_offline_broker_is_disabled_for_dws(stack):
    if stack.backend != "fake":
        pytest.skip("fakeflux can take a broker offline; a real one would have to die")
    stack.flux.drains.offline.add(2)  # compute-03's rank
    try:
        wait_for(
            lambda: _system_status(stack).get("compute-03") == "Disabled",
            "compute-03 Disabled",
            WAIT,
        )
    finally:
        stack.flux.drains.offline.discard(2)
    wait_for(lambda: _system_status(stack).get("compute-03") == "Enabled", "Enabled again", WAIT)


def test_a_disabled_compute_is_not_unmounted_and_fails_nothing(stack):
    """nnf-sos skips a Disabled compute's unmount: a stuck mount there does not fail Teardown."""
    if stack.backend != "fake":
        pytest.skip("fakeflux can take a broker offline; a real one would have to die")
    stack.flux.drains.offline.add(3)  # compute-04's rank
    stack.sim.faults.hang_unmount("compute-04")
    try:
        wait_for(lambda: _system_status(stack).get("compute-04") == "Disabled", "Disabled", WAIT)
        jobid = stack.submit(JOBDW, nnodes=4)
        info = stack.wait(jobid, timeout=WAIT)
        assert info.result == "COMPLETED", info.exception
        assert not info.events("dws-teardown-failed")
    finally:
        stack.flux.drains.offline.discard(3)


def test_fluxion_pool_follows_the_rabbit_and_steady_state_writes_nothing(stack):
    if stack.backend != "fake":
        pytest.skip("on real Flux, pools are marked in tests/test_fluxion_health.py (Fluxion)")
    nodes = stack.service.health.nodes
    nodes.fluxion = True  # as if Fluxion were loaded
    stack.set_rabbit("rabbit-1", "Failed")
    wait_for(lambda: nodes.rabbits.get("rabbit-1") is False, "rabbit-1's pool down", WAIT)
    stack.set_rabbit("rabbit-1", "Ready")
    wait_for(lambda: nodes.rabbits.get("rabbit-1") is True, "rabbit-1's pool up", WAIT)
    wait_for(_settled(stack, {}), "undrained", WAIT)
    passes = stack.service.health.passes
    wait_for(lambda: stack.service.health.passes > passes + 1, "a pass after settling", WAIT)
    before = dict(stack.api.request_counts())
    writes = {k: v for k, v in before.items() if k[0] in ("patch", "create", "update")}
    assert ("patch", "systemstatuses") in writes  # SystemStatus was written as drains changed
    later = stack.service.health.passes
    wait_for(lambda: stack.service.health.passes >= later + 3, "three quiet passes", WAIT)
    after = stack.api.request_counts()
    assert {k: after.get(k) for k in writes} == writes  # no write when nothing changed
    # Storage is watched: the passes (the resync) read the watched copy, never a list
    assert after.get(("list", "storages")) == before.get(("list", "storages"))


def test_steady_state_passes_list_no_servers(stack):
    """Servers are watched like Storage: after the start-up list, a health pass (capacity
    drift included) reads the watched copy and lists nothing."""
    wait_for(lambda: stack.health_passes() >= 1, "a reported pass", WAIT)
    lists = stack.api.request_counts().get(("list", "servers"), 0)
    assert lists >= 1  # the watch's start-up list
    later = stack.health_passes()
    wait_for(lambda: stack.health_passes() >= later + 3, "three more passes", WAIT)
    assert stack.api.request_counts().get(("list", "servers"), 0) == lists


def test_a_rabbit_going_down_is_acted_on_without_waiting_for_the_resync():
    """health-interval of an hour: only the Storage watch can start the pass that drains the
    rabbit's nodes, and none of it lists Storage again."""
    rabbits = {"rabbit-0": ["compute-01", "compute-02"], "rabbit-1": ["compute-03", "compute-04"]}
    config = {**CONFIG, "health-interval": "1h"}
    with Stack(config, hosts=4, rabbits=rabbits, identity="health-watch") as stack:
        health = stack.service.health
        wait_for(lambda: health.passes >= 1, "the first pass (after the first list)", WAIT)
        lists = stack.api.request_counts().get(("list", "storages"))
        stack.set_rabbit("rabbit-1", "Offline")
        wait_for(lambda: set(_ours(stack)) == {"compute-03", "compute-04"}, "drained", WAIT)
        stack.set_rabbit("rabbit-1", "Ready")
        wait_for(lambda: not _ours(stack), "undrained", WAIT)
        assert stack.api.request_counts().get(("list", "storages")) == lists


def test_a_pass_over_many_rabbits_at_once_completes():
    """1,100 rabbits whose pools Fluxion marks at once (fakeflux answers synchronously): one
    step per rabbit, each started from the loop, not nested in the last one's callback."""
    rabbits = {f"rabbit-{i}": [f"compute-{i + 1:02d}"] for i in range(1100)}
    config = {**CONFIG, "health-interval": "1h"}
    with Stack(config, hosts=1100, rabbits=rabbits, identity="health-many") as stack:
        health = stack.service.health
        health.nodes.fluxion = True  # as if Fluxion were loaded: every pool is marked
        stack.set_rabbit("rabbit-7", "Offline")  # a Storage change: a pass at once
        wait_for(lambda: health.nodes.rabbits.get("rabbit-7") is False, "rabbit-7 down", WAIT)
        wait_for(lambda: len(health.nodes.rabbits) == 1100, "every pool marked", WAIT)
        assert health.last_error is None


def test_a_fresh_system_whose_storage_has_no_status_drains_nothing(stack):
    """DWS creates the Storage objects bare; until nnf-sos reports, no node is drained."""
    if stack.backend != "fake":
        pytest.skip("pools are watched through fakeflux's stand-in for Fluxion here")
    nodes = stack.service.health.nodes
    nodes.fluxion = True
    store = stack.api.store
    saved = {}
    for rabbit in stack.rabbits:
        current = store.get("storages", "default", rabbit)
        saved[rabbit] = current["status"]
        bare = {k: v for k, v in current.items() if k != "status"}
        store.replace("storages", "default", rabbit, bare)
    try:
        wait_for(
            lambda: all(nodes.rabbits.get(r) is False for r in stack.rabbits), "pools down", WAIT
        )
        passes = stack.service.health.passes
        wait_for(lambda: stack.service.health.passes > passes + 1, "two more passes", WAIT)
        assert not stack.flux.drained()
    finally:
        for rabbit, status in saved.items():
            current = store.get("storages", "default", rabbit)
            store.replace("storages", "default", rabbit, {**current, "status": status})
    wait_for(lambda: all(nodes.rabbits.get(r) for r in stack.rabbits), "pools up", WAIT)


def test_a_compute_fenced_during_the_job_fails_it_and_is_drained(stack):
    if stack.backend != "fake":
        pytest.skip("the job's hosts are read from fakeflux")
    jobid = stack.submit(JOBDW, nnodes=2, runtime=None)
    stack.wait_event(jobid, "start", timeout=WAIT)
    victim = stack.flux.info(jobid).hosts[0]
    rabbit = "rabbit-0" if victim in ("compute-01", "compute-02") else "rabbit-1"
    stack.set_rabbit(rabbit, "Ready", links={victim: "Fenced"})
    stack.flux.finish(jobid)  # its tasks end once the fence is in place, not after a runtime
    info = stack.wait(jobid, timeout=WAIT)
    assert info.exception is not None, info.result
    note = info.exception["note"]
    assert "were fenced during the job" in note and victim in note
    assert victim in stack.flux.drained()
