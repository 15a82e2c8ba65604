# SPDX-License-Identifier: LGPL-3.0-only
"""`flux dws rabbits`: a saved system of three rabbits (one Offline and disabled, one holding
persistent storage, one a job's allocation), read as an admin would read it, and the live API
through kubeapi with dwssim's rabbits."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flux_dws.base.hostlist import encode_hostlist, expand_hostlist
from flux_dws.base.jobid import f58
from flux_dws.cli import main
from flux_dws.core.rabbits import rabbit_inventory, servers_held
from flux_dws.core.rabbitview import rabbit_rows, with_drains
from flux_dws.testing.dwssim import seed

SAVED = Path(__file__).parent / "data" / "rabbits-3.json"
GIB = 2**30
TIB = 2**40
JOBID = "245379072"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["rabbits", *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_the_saved_system_reads_as_the_admin_expects() -> None:
    code, out, err = run("--from-file", str(SAVED))
    assert code == 0, err
    assert out.splitlines() == [
        "NAME         STATE    STATUS        TOTAL ALLOCATED PERSISTENT     FREE    DRIFT NODES",
        "rabbit-1     Enabled  Ready          4TiB    400GiB      64GiB   3.5TiB        - "
        "compute-[01-04]",
        "rabbit-2     Enabled  Ready          4TiB         0     1.1TiB   2.9TiB        - "
        "compute-[05-08]",
        "rabbit-3     Disabled Offline        4TiB         0          0        0        - "
        "compute-[09-12]",
    ]


def test_json_gives_bytes_that_add_up_on_the_ready_rabbits() -> None:
    code, out, _ = run("--from-file", str(SAVED), "--json")
    assert code == 0
    rabbits = {r["name"]: r for r in json.loads(out)}
    one, two, three = rabbits["rabbit-1"], rabbits["rabbit-2"], rabbits["rabbit-3"]
    assert one["capacity"] == {
        "total": 4 * TIB,
        "allocated": 400 * GIB,
        "persistent": 64 * GIB,  # the system storage on every rabbit
        "free": 4 * TIB - 464 * GIB,
    }
    assert two["capacity"]["persistent"] == TIB + 64 * GIB  # the persistent instance + system
    assert two["capacity"]["allocated"] == 0
    assert (three["usable"], three["state"], three["status"]) == (False, "Disabled", "Offline")
    assert three["capacity"]["free"] == 0
    assert three["reasons"] == [
        "disabled: NVMe switch replaced, ticket 4411",
        "rabbit-3 is not responding",
    ]


def test_a_job_shows_the_rabbits_it_got_with_its_allocation() -> None:
    code, out, err = run("--from-file", str(SAVED), "-j", JOBID)
    assert code == 0, err
    assert out.splitlines() == [
        "NAME         STATUS     JOB-ALLOC     FREE NODES",
        "rabbit-1     Ready         400GiB   3.5TiB compute-[01-04]",
    ]
    code, again, _ = run("--from-file", str(SAVED), "-j", f58(int(JOBID)))
    assert (code, again) == (0, out)  # the f58 form names the same job
    code, out, err = run("--from-file", str(SAVED), "-j", "1234")
    assert (code, out) == (1, "")
    assert (
        err == f"flux-dws rabbits: job {f58(1234)} has no workflow (not a #DW job, or it is gone)\n"
    )


def test_a_node_is_served_by_one_rabbit_and_the_reasons_show() -> None:
    code, out, _ = run("--from-file", str(SAVED), "-n", "compute-10", "-o", "{name} {reasons}")
    assert code == 0
    assert out.splitlines()[1:] == [
        "rabbit-3 disabled: NVMe switch replaced, ticket 4411; rabbit-3 is not responding"
    ]
    code, _, err = run("--from-file", str(SAVED), "-n", "compute-99")
    assert (code, err) == (1, "flux-dws rabbits: no rabbit serves compute-99\n")


def test_an_external_compute_node_is_said_to_be_one(tmp_path: Path) -> None:
    saved = json.loads(SAVED.read_text())
    (config,) = [i for i in saved["items"] if i["kind"] == "SystemConfiguration"]
    config["spec"]["externalComputeNodes"] = [{"name": "login-01"}]
    path = tmp_path / "external.json"
    path.write_text(json.dumps(saved))
    code, _, err = run("--from-file", str(path), "-n", "login-01")
    assert (code, err) == (
        1,
        "flux-dws rabbits: no rabbit serves login-01: it is one of the SystemConfiguration's"
        " externalComputeNodes\n",
    )


def test_formats_presets_states_and_bad_fields() -> None:
    code, out, _ = run("--from-file", str(SAVED), "-o", "down", "-s", "offline", "-H")
    assert code == 0
    assert out.split()[:4] == ["rabbit-3", "Disabled", "Offline", "compute-[09-12]"]
    code, _, err = run("--from-file", str(SAVED), "-o", "{name} {size}")
    assert code == 1
    assert err.startswith("flux-dws rabbits: unknown field 'size' in format")


def test_a_saved_file_without_rabbits_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(json.dumps({"kind": "List", "items": [{"kind": "Pod"}]}))
    code, _, err = run("--from-file", str(tmp_path / "x.json"))
    assert code == 1
    assert err == ("flux-dws rabbits: the saved file holds no SystemConfiguration and no Storage\n")


def test_the_total_is_the_one_device_sum_and_drives_all_at_0_fall_back_as_in_the_graph():
    """rabbitview sums the drives with core.rabbits.device_capacity, as the graph does: when
    every drive reports 0 (nnf-sos's figure for a drive that is not Ready) there is no
    device total, and status.capacity is the total, as rabbit-graph sizes the pool."""
    config = {"spec": {"storageNodes": [{"name": "r", "computesAccess": [{"name": "c1"}]}]}}

    def storage(status: str, devices: list[int], capacity: int) -> dict:
        return {
            "metadata": {"name": "r"},
            "status": {
                "status": status,
                "capacity": capacity,
                "devices": [{"capacity": size} for size in devices],
            },
        }

    def view(obj: dict) -> tuple[int, int]:
        (row,) = rabbit_rows(config, [obj])
        return row.total, row.free

    assert view(storage("Ready", [4 * GIB, 6 * GIB], 7 * GIB)) == (10 * GIB, 7 * GIB)
    zeros = storage("Ready", [0, 0], 5 * GIB)
    assert view(zeros) == (5 * GIB, 5 * GIB)
    assert rabbit_inventory(config, [zeros])["r"].gib == 5  # the graph: the same figure
    assert view(storage("Offline", [0, 0], 5 * GIB)) == (5 * GIB, 0)
    assert view(storage("Offline", [3 * GIB, 0], 0)) == (3 * GIB, 0)


@pytest.mark.parametrize(
    "bad",
    [
        {"spec": {"allocationSets": "x"}},
        {"spec": {"allocationSets": [{"allocationSize": -5, "storage": [{"name": "r"}]}]}},
        {"spec": {"allocationSets": [{"allocationSize": "1", "storage": [{"name": 3}]}]}},
        {"spec": None},
        None,
    ],
)
def test_untrusted_servers_read_as_nothing(bad) -> None:
    assert sum(servers_held(bad).values()) == 0
    rows = rabbit_rows(None, [{"metadata": {"name": "r"}, "status": {"capacity": "x"}}], [bad])
    assert [(r.name, r.total, r.free) for r in rows] == [("r", 0, 0)]


@given(st.lists(st.sampled_from(["n1", "n01", "n09", "n10", "n100", "login", "a-b2c"]), max_size=6))
def test_encoded_hostlists_expand_to_the_same_hosts(hosts: list[str]) -> None:
    assert sorted(expand_hostlist(encode_hostlist(hosts)) if hosts else []) == sorted(set(hosts))


def test_encode_hostlist_is_compact() -> None:
    assert encode_hostlist(["compute-09", "compute-10", "compute-11", "x"]) == "compute-[09-11],x"


def test_live_api_through_kubeapi(kubeapi) -> None:
    seed(
        kubeapi.store,
        rabbits={"rabbit-a": ["c1", "c2"], "rabbit-b": ["c3"]},
        capacity={"rabbit-a": 10 * GIB, "rabbit-b": 20 * GIB},
    )
    kubeapi.store.create(
        "servers",
        "default",
        {
            "metadata": {
                "name": "wf-0",
                "labels": {
                    "dataworkflowservices.github.io/owner.kind": "Workflow",
                    "dataworkflowservices.github.io/owner.name": "wf",
                },
            },
            "spec": {
                "allocationSets": [
                    {"label": "xfs", "allocationSize": 2 * GIB, "storage": [{"name": "rabbit-a"}]}
                ]
            },
        },
    )
    storage = kubeapi.store.get("storages", "default", "rabbit-a")  # nnf-sos: free space left
    storage["status"]["capacity"] = 8 * GIB
    kubeapi.store.replace("storages", "default", "rabbit-a", storage)
    code, out, err = run("--kubeconfig", kubeapi.kubeconfig, "--json")
    assert code == 0, err
    rows = {r["name"]: r["capacity"] for r in json.loads(out)}
    assert rows["rabbit-a"] == {
        "total": 10 * GIB,
        "allocated": 2 * GIB,
        "persistent": 0,
        "free": 8 * GIB,
    }
    assert rows["rabbit-b"]["free"] == 20 * GIB


def test_live_api_shows_the_capacity_drift_alarm(kubeapi, tmp_path: Path) -> None:
    """A rabbit with less free than its Servers explain: DRIFT shows what the service alarms
    (core.health.capacity_drifts), against --capacity-drift or the config's [dws] key."""
    seed(kubeapi.store, rabbits={"rabbit-a": ["c1"], "rabbit-b": ["c2"]}, capacity=100 * GIB)
    storage = kubeapi.store.get("storages", "default", "rabbit-a")
    storage["status"]["capacity"] = 70 * GIB  # 30 GiB gone, and no Servers holds any
    kubeapi.store.replace("storages", "default", "rabbit-a", storage)
    live = ("--kubeconfig", kubeapi.kubeconfig)
    code, out, err = run(*live, "--json")  # the default threshold, 64 GiB: no alarm
    assert code == 0, err
    assert [r["drift"] for r in json.loads(out)] == [None, None]
    code, out, err = run(*live, "--json", "--capacity-drift", "8GiB")
    assert code == 0, err
    drift = {r["name"]: r["drift"] for r in json.loads(out)}
    assert drift["rabbit-a"] == {
        "total": 100 * GIB,
        "expected": 100 * GIB,
        "free": 70 * GIB,
        "missing": 30 * GIB,
    }
    assert drift["rabbit-b"] is None
    (tmp_path / "dws.toml").write_text('[dws]\ncapacity-drift = "16GiB"\n')
    code, out, err = run(*live, "--config", str(tmp_path / "dws.toml"), "-o", "{name} {drift}")
    assert code == 0, err
    assert out.splitlines() == ["NAME DRIFT", "rabbit-a 30GiB", "rabbit-b -"]
    code, _, err = run(*live, "--capacity-drift", "lots")
    assert (code, err) == (
        1,
        "flux-dws rabbits: --capacity-drift: [dws] capacity-drift: size 'lots' is not a size"
        " (e.g. 10GiB, 100GB)\n",
    )


def test_flux_drains_are_shown_per_rabbit_readable_and_only_its_own_nodes() -> None:
    rows = rabbit_rows(
        {"spec": {"storageNodes": [{"name": "r1", "computesAccess": [{"name": "c1"}]}]}},
        [{"metadata": {"name": "r1"}, "spec": {"state": "Enabled"}}],
    )
    assert rows[0].drained is None  # not read: a saved file says nothing of Flux
    (row,) = with_drains(rows, {"c1": "fan \x1b]0;owned\x07 failure", "c9": "elsewhere"})
    assert row.drained == {"c1": "fan \\x1b]0;owned\\x07 failure"}


def test_a_saved_system_says_nothing_of_flux_drains() -> None:
    code, out, err = run("--from-file", str(SAVED), "--json")
    assert code == 0, err
    assert {r["name"]: r["drained"] for r in json.loads(out)} == {
        "rabbit-1": None,
        "rabbit-2": None,
        "rabbit-3": None,
    }


@pytest.fixture(scope="module")
def flux_stack():
    from conftest import _real_flux_missing

    from flux_dws.testing.stack import Stack

    missing = _real_flux_missing()
    if missing:
        pytest.skip(missing)
    with Stack(hosts=4, backend="flux", config={"heartbeat": "2s"}) as running:
        yield running


def test_on_real_flux_a_drained_node_shows_on_the_rabbit_that_serves_it(flux_stack) -> None:
    """An admin's `flux resource drain` of one node shows on its rabbit alone, reason and all
    (made readable), through the command as `flux dws rabbits` runs it in the instance."""
    stack = flux_stack
    rabbit, hosts = sorted(stack.rabbits.items())[-1]
    host = hosts[-1]
    stack.flux.drain(host, "fan \x1b[31mfailure")
    try:
        env = stack.flux._env()  # noqa: SLF001 (the instance's environment)
        argv = [sys.executable, "-m", "flux_dws", "rabbits", "--kubeconfig", stack.kubeconfig]
        done = subprocess.run([*argv, "--json"], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        drained = {r["name"]: r["drained"] for r in json.loads(done.stdout)}
        assert drained.pop(rabbit) == {host: "fan \\x1b[31mfailure"}
        assert all(d == {} for d in drained.values())
        table = subprocess.run(
            [*argv, "-n", host, "-Ho", "{name} {drained}"], env=env, capture_output=True, text=True
        )
        assert table.stdout.split() == [rabbit, host], table.stderr
    finally:
        stack.flux.undrain(host)
    gone = dict(env, FLUX_URI="local:///nonexistent/flux-dws-test")
    done = subprocess.run(
        [*argv, "-Ho", "{name} {drained}"], env=gone, capture_output=True, text=True
    )
    assert done.returncode == 0  # the rabbits still show; one line says why DRAINED is -
    assert done.stderr.startswith("flux dws rabbits: cannot read Flux's drains: ")
    assert len(done.stderr.splitlines()) == 1
    assert {line.split()[1] for line in done.stdout.splitlines()} == {"-"}
