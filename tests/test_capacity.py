# SPDX-License-Identifier: LGPL-3.0-only
"""Capacity truth: a rabbit's pool is its drives' total less persistent and system storage
(never Storage ``status.capacity``, which nnf-sos fills with what is still free), and a rabbit
with less free space than its Servers explain (a leak) is alarmed and kept from new jobs.

Pure rules first, then the service on fakeflux + kubeapi + dwssim.
"""

from __future__ import annotations

import io

import pytest

from flux_dws.cli import main as cli_main
from flux_dws.cli.sources import StackSource
from flux_dws.core.health import capacity_drifts
from flux_dws.core.rabbits import (
    GIB,
    OWNER_KIND_LABEL,
    outside_allocations,
    rabbit_inventory,
    servers_held,
)
from flux_dws.testing.dwssim.capacity import outside_servers
from flux_dws.testing.dwssim.companions import storage_resource, system_configuration
from flux_dws.testing.stack import Stack
from tests.waiting import wait_for

RABBITS = {"rabbit-0": ["compute-01", "compute-02"], "rabbit-1": ["compute-03", "compute-04"]}
WAIT = 60.0


def _storage(rabbit: str, total: int, free: int) -> dict:
    obj = storage_resource(rabbit, RABBITS[rabbit], total)
    obj["status"]["capacity"] = free
    return obj


def _workflow_servers(rabbit: str, size: int) -> dict:
    obj = outside_servers("fluxjob-1-0", rabbit, size, "Workflow")
    return obj


def test_pool_is_the_drives_total_less_persistent_and_system_storage():
    config = system_configuration(RABBITS)
    storages = [_storage("rabbit-0", 1000 * GIB, 300 * GIB), _storage("rabbit-1", 1000 * GIB, 10)]
    servers = [
        outside_servers("pers", "rabbit-0", 100 * GIB, "PersistentStorageInstance"),
        outside_servers("sys", "rabbit-0", 50 * GIB, "NnfSystemStorage"),
        _workflow_servers("rabbit-0", 550 * GIB),  # a job's: Flux schedules that itself
    ]
    rabbits = rabbit_inventory(config, storages, servers)
    assert rabbits["rabbit-0"].gib == 850  # not 300 (free) and not 1000 (total)
    assert rabbits["rabbit-0"].outside == 150 * GIB
    assert rabbits["rabbit-0"].free == 300 * GIB
    assert rabbits["rabbit-1"].gib == 1000  # however little is free now
    # without devices (an older Storage), status.capacity is the only figure there is
    bare = _storage("rabbit-1", 1000 * GIB, 400 * GIB)
    bare["status"]["devices"] = []
    assert rabbit_inventory(config, [bare])["rabbit-1"].gib == 400


def test_servers_held_is_untrusted():
    assert servers_held({"spec": {"allocationSets": "x"}}) == {}
    junk = {"spec": {"allocationSets": [5, {"allocationSize": -1, "storage": [{"name": "r"}]}]}}
    assert servers_held(junk) == {"r": 0}
    labels = {"metadata": {"labels": {OWNER_KIND_LABEL: 7}}}
    assert outside_allocations([labels, None, "x"]) == {}


def test_drift_is_a_shortfall_beyond_the_threshold():
    storages = [_storage("rabbit-0", 1000 * GIB, 300 * GIB), _storage("rabbit-1", 1000 * GIB, 0)]
    servers = [_workflow_servers("rabbit-0", 600 * GIB), _workflow_servers("rabbit-1", 990 * GIB)]
    drifts = capacity_drifts(storages, servers, 64 * GIB)
    assert set(drifts) == {"rabbit-0"}  # rabbit-1 misses 10 GiB: within the threshold
    assert drifts["rabbit-0"].missing == 100 * GIB
    # a Servers not yet allocated (more free than expected) is no alarm
    assert capacity_drifts([_storage("rabbit-0", 1000 * GIB, 1000 * GIB)], servers, 0) == {}
    # a rabbit that is down reports nothing free: no alarm (its whole pool is down anyway)
    offline = _storage("rabbit-1", 1000 * GIB, 0)
    offline["status"]["status"] = "Offline"
    assert capacity_drifts([offline], [], 0) == {}
    # malformed Storage: skipped
    assert capacity_drifts([{"metadata": {"name": "r"}, "status": {"capacity": "x"}}], [], 0) == {}


def _health(stack: Stack) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = cli_main(["status"], out=out, err=err, source_factory=lambda: StackSource(stack))
    assert code == 0, err.getvalue()
    return out.getvalue()


@pytest.fixture(scope="module")
def stack():
    config = {"heartbeat": "0.5s", "health-interval": "0.2s", "capacity-drift": "8GiB"}
    with Stack(config, hosts=4, rabbits=RABBITS, capacity=100 * GIB, identity="cap") as running:
        yield running


def test_dwssim_publishes_free_capacity_as_nnf_sos_does(stack):
    passes = stack.service.health.passes
    stack.sim.add_outside_storage("sys-0", "rabbit-1", 30 * GIB)
    wait_for(lambda: stack.service.health.passes > passes + 1, "a pass after it", WAIT)
    assert not stack.service.health.drifts  # its Servers explain it (seen by the watch)
    storage = stack.api.store.get("storages", "default", "rabbit-1")
    assert storage["status"]["capacity"] == 70 * GIB
    assert sum(d["capacity"] for d in storage["status"]["devices"]) == 100 * GIB
    config = stack.api.store.get("systemconfigurations", "default", "default")
    servers, _ = stack.api.store.list("servers", None)
    pools = rabbit_inventory(config, [storage], servers)
    assert pools["rabbit-1"].gib == 70
    jobid = stack.submit("#DW jobdw type=xfs capacity=10GiB name=scratch", nnodes=1)
    assert stack.wait(jobid, timeout=WAIT).result == "COMPLETED"
    storage = stack.api.store.get("storages", "default", "rabbit-1")
    assert storage["status"]["capacity"] == 70 * GIB  # freed again at Teardown
    assert not stack.service.health.drifts  # system storage has Servers: no drift


def test_a_leak_is_alarmed_within_a_pass_and_kept_from_fluxion(stack):
    nodes = stack.service.health.nodes
    nodes.fluxion = True  # as if Fluxion were loaded
    passes = stack.service.health.passes
    stack.sim.leak("rabbit-0", 40 * GIB)
    wait_for(lambda: stack.service.health.passes > passes + 1, "a pass after the leak", WAIT)
    drift = stack.service.health.drifts["rabbit-0"]
    assert drift.missing == 40 * GIB
    assert nodes.rabbits["rabbit-0"] is True and nodes.held["rabbit-0"] == 40 * GIB
    wait_for(lambda: "CAPACITY DRIFT" in _health(stack), "flux dws status shows it", WAIT)
    assert "rabbit-0 CAPACITY DRIFT: 40.0 GiB" in _health(stack)
    stack.sim.unleak()
    wait_for(lambda: not stack.service.health.drifts, "the drift cleared", WAIT)
    wait_for(lambda: nodes.held.get("rabbit-0") == 0, "its pool given back", WAIT)


def test_simulator_command_line_sets_capacities_status_and_faults(tmp_path):
    from flux_dws.testing.dwssim.__main__ import build, parse_args
    from flux_dws.testing.kubeapi.server import KubeApi

    argv = ["--computes", "4", "--per-rabbit", "2", "--capacity", "2TiB"]
    argv += ["--capacity", "rabbit-1=500GiB", "--rabbit-status", "rabbit-1=Offline"]
    argv += ["--fail-mount", "compute-02", "--hang-unmount", "compute-03"]
    store, sim = build(parse_args(argv), {})
    r0 = store.get("storages", "default", "rabbit-0")
    r1 = store.get("storages", "default", "rabbit-1")
    assert sum(d["capacity"] for d in r0["status"]["devices"]) == 2 * 2**40
    assert r1["status"]["capacity"] == 500 * GIB and r1["status"]["status"] == "Offline"
    assert sim.faults.mount == {"compute-02"} and sim.faults.unmount == {"compute-03"}
    with pytest.raises(ValueError, match="no such rabbit: rabbit-9"):
        build(parse_args(["--computes", "2", "--capacity", "rabbit-9=1TiB"]), {})
    with pytest.raises(SystemExit):
        parse_args(["--rabbit-status", "rabbit-0=Sleepy"])
    # the kubeconfig it writes is the instance owner's alone
    path = tmp_path / "kubeconfig"
    path.write_text("old")
    path.chmod(0o644)
    KubeApi(store).write_kubeconfig(str(path))
    assert path.stat().st_mode & 0o777 == 0o600


def test_flux_dws_status_shows_down_rabbits_drift_and_drained_nodes():
    from flux_dws.cli.servicestatus import build_service_status, render_service_status

    report = {
        "started": 1.0,
        "ready": True,
        "rabbits": {
            "down": {"rabbit-1": "Offline"},
            "drift": {"rabbit-0": {"total": 100 * GIB, "expected": 90 * GIB, "free": 50 * GIB}},
            "drained": {"compute-01": "bad DIMM", "compute-02": "bad DIMM", "x": 5},
        },
    }
    answer = {"jobs": [], "service": {"active": {"pid": 1, "report": report}}}
    lines = render_service_status(build_service_status(answer, 10.0), 10.0, str)
    text = "\n".join(lines)
    assert "rabbit-1 DOWN (Offline)" in text
    assert "rabbit-0 CAPACITY DRIFT: 40.0 GiB less free" in text
    assert any("compute-01,compute-02" in line and "bad DIMM" in line for line in lines)
    junk = {"jobs": [], "service": {"active": {"report": {"rabbits": {"drift": {"r": 5}}}}}}
    assert "CAPACITY" not in "\n".join(
        render_service_status(build_service_status(junk, 1.0), 1.0, str)
    )
