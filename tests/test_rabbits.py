# SPDX-License-Identifier: LGPL-3.0-only
"""Rabbit scheduling, pure parts: hostlists, the resource graph, the jobspec rewrite, the
Servers plan from an allocation, and the site's storage limits."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flux_dws.base.errors import PolicyError
from flux_dws.base.hostlist import HostlistError, encode_idset, expand_hostlist, expand_idset
from flux_dws.cli import main
from flux_dws.core.jobspec import (
    NO_LIMIT,
    StorageLimit,
    bytes_per_node,
    min_allocations,
    rabbit_resources,
    release_update,
)
from flux_dws.core.policy import policy_from_table
from flux_dws.core.rabbits import (
    GIB,
    RabbitError,
    allocated_rabbits,
    excluded_hosts,
    rabbit_inventory,
    resource_graph,
)
from flux_dws.core.storage import (
    ACROSS_SERVERS,
    JOBSPEC_STORAGE_KEY,
    PER_COMPUTE,
    SINGLE_SERVER,
    AllocationNeed,
    StorageError,
    plan_servers,
)
from flux_dws.testing.dwssim import DwsSim, seed
from flux_dws.testing.dwssim.companions import storage_resource, system_configuration
from flux_dws.testing.kubeapi import Store
from flux_dws.validator import validate_attributes

MAPPING = {"rabbit-0": ["compute-01", "compute-02"], "rabbit-1": ["compute-03", "compute-04"]}
R = {
    "version": 1,
    "execution": {
        "R_lite": [{"rank": "0-5", "children": {"core": "0-1"}}],
        "starttime": 0.0,
        "expiration": 0.0,
        "nodelist": ["compute-[01-06]"],
        "properties": {"debug": "5", "batch": "0-4"},
    },
}


def objects(capacity: int = 100 * GIB, status: str = "Ready") -> tuple[dict, list[dict]]:
    storages = [storage_resource(r, c, capacity) for r, c in MAPPING.items()]
    storages[1]["status"]["status"] = status
    return system_configuration(MAPPING), storages


def need(label: str, strategy: str, gib: float, count: int | None = None) -> AllocationNeed:
    return AllocationNeed("bd", ("default", "srv"), label, strategy, int(gib * GIB), count)


# ---- hostlists ------------------------------------------------------------------------------


def test_hostlist_expands_ranges_with_padding() -> None:
    assert expand_hostlist("node[08-11],login1,x[1,3-4]y") == [
        "node08",
        "node09",
        "node10",
        "node11",
        "login1",
        "x1y",
        "x3y",
        "x4y",
    ]


@pytest.mark.parametrize("bad", ["node[1-", "node]1[", "node[3-1]", "node[a]", "node[１]"])
def test_bad_hostlists_are_refused_naming_them(bad: str) -> None:
    with pytest.raises(HostlistError):
        expand_hostlist(bad)


@given(st.sets(st.integers(0, 500)))
def test_idset_round_trips(ids: set[int]) -> None:
    assert expand_idset(encode_idset(ids)) == sorted(ids)


# ---- the graph ------------------------------------------------------------------------------


def vertices(graph: dict) -> dict[str, dict]:
    return {v["metadata"]["paths"]["containment"]: v for v in graph["scheduling"]["graph"]["nodes"]}


def pool(found: dict[str, dict], rabbit: str) -> list[dict]:
    return [
        v["metadata"]
        for path, v in found.items()
        if path.startswith(f"/cluster0/{rabbit}/") and v["metadata"]["type"] == "ssd"
    ]


def test_graph_puts_nodes_and_one_ssd_pool_under_each_rabbit() -> None:
    graph = resource_graph(R, rabbit_inventory(*objects()), chunks=3)
    found = vertices(graph)
    # 100 GiB in 3 parts that differ by at most one GiB
    assert sorted(m["size"] for m in pool(found, "rabbit-0")) == [33, 33, 34]
    assert {m["unit"] for m in pool(found, "rabbit-1")} == {"GiB"}
    assert len({m["name"] for m in pool(found, "rabbit-0") + pool(found, "rabbit-1")}) == 6
    assert found["/cluster0/rabbit-0/compute-02"]["metadata"]["rank"] == 1
    assert found["/cluster0/rabbit-1/compute-03"]["metadata"]["type"] == "node"
    # nodes no rabbit serves stay under the cluster, and their cores with them
    assert found["/cluster0/compute-05"]["metadata"]["rank"] == 4
    assert found["/cluster0/compute-06/core1"]["metadata"]["rank"] == 5
    # properties (queues) are kept on the nodes
    assert found["/cluster0/compute-05"]["metadata"]["properties"] == {"batch": ""}
    assert found["/cluster0/compute-06"]["metadata"]["properties"] == {"debug": ""}
    assert graph["execution"] == R["execution"]
    # every edge joins vertices that exist, parent path to child path
    ids = {v["id"]: path for path, v in found.items()}
    for edge in graph["scheduling"]["graph"]["edges"]:
        assert ids[edge["target"]].rsplit("/", 1)[0] == ids[edge["source"]]


def test_graph_is_deterministic_whatever_the_input_order() -> None:
    config, storages = objects()
    reordered = dict(config, spec={"storageNodes": list(reversed(config["spec"]["storageNodes"]))})
    one = resource_graph(R, rabbit_inventory(config, storages))
    two = resource_graph(R, rabbit_inventory(reordered, list(reversed(storages))))
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)


def test_a_pool_has_at_least_one_part_per_node() -> None:
    found = vertices(resource_graph(R, rabbit_inventory(*objects()), chunks=1))
    assert [m["size"] for m in pool(found, "rabbit-0")] == [50, 50]


def test_a_rabbit_that_is_not_ready_has_its_pool_down() -> None:
    found = vertices(resource_graph(R, rabbit_inventory(*objects(status="Offline"))))
    assert {m.get("status", 0) for m in pool(found, "rabbit-0")} == {0}
    assert {m["status"] for m in pool(found, "rabbit-1")} == {1}


def test_the_graph_leaves_out_what_fluxion_fills_in() -> None:
    """Fluxion's JGF reader defaults these (apply_defaults; an edge is containment): written
    out, they made El Capitan's graph load about twice as long (issue 23, goal 3)."""
    graph = resource_graph(R, rabbit_inventory(*objects(status="Offline")))["scheduling"]
    defaults = {"rank": -1, "exclusive": False, "unit": "", "size": 1, "status": 0}
    for vertex in graph["graph"]["nodes"]:
        meta = vertex["metadata"]
        assert not {"uniq_id", "basename"} & meta.keys(), meta
        assert not [k for k, v in defaults.items() if k in meta and meta[k] == v], meta
    assert all(edge.keys() == {"source", "target"} for edge in graph["graph"]["edges"])
    found = vertices({"scheduling": graph})
    # what is not a default is kept: a node's rank, a core's exclusivity, a pool's size
    assert found["/cluster0/rabbit-0/compute-02"]["metadata"]["rank"] == 1
    assert found["/cluster0/compute-06/core1"]["metadata"]["exclusive"] is True
    assert {m["unit"] for m in pool(found, "rabbit-0")} == {"GiB"}


@pytest.mark.parametrize(
    "break_it, words",
    [
        (lambda c, s: c["spec"].update(storageNodes="x"), "storageNodes is not a list"),
        (lambda c, s: s[0]["status"].update(capacity="lots"), "is not a byte count"),
        (lambda c, s: s[0].update(metadata={}), "without a metadata.name"),
    ],
)
def test_bad_objects_from_kubernetes_are_one_line_errors(break_it, words: str) -> None:
    config, storages = objects()
    break_it(config, storages)
    with pytest.raises(RabbitError, match=words):
        rabbit_inventory(config, storages)


def test_a_node_served_by_two_rabbits_is_refused() -> None:
    config, storages = objects()
    config["spec"]["storageNodes"][1]["computesAccess"].append({"name": "compute-01", "index": 9})
    with pytest.raises(RabbitError, match="compute-01 is served by both"):
        resource_graph(R, rabbit_inventory(config, storages))


def test_allocated_rabbits_read_from_the_job_r() -> None:
    graph = resource_graph(R, rabbit_inventory(*objects()))
    assert allocated_rabbits(graph) == {
        "rabbit-0": ["compute-01", "compute-02"],
        "rabbit-1": ["compute-03", "compute-04"],
    }
    assert allocated_rabbits(R) is None
    assert allocated_rabbits({"scheduling": {"graph": {"nodes": "junk"}}}) is None


# ---- the jobspec ----------------------------------------------------------------------------

NODE_REQUEST = [
    {"type": "node", "count": 4, "with": [{"type": "slot", "count": 1, "label": "task"}]}
]


def test_rewrite_gives_each_node_its_share_under_a_rabbit_slot() -> None:
    needs = [
        need("xfs", PER_COMPUTE, 60),
        need("ost", ACROSS_SERVERS, 100),
        need("mgt", SINGLE_SERVER, 1),
    ]
    rewritten = rabbit_resources(NODE_REQUEST, needs, {})
    assert rewritten == [
        {
            "type": "slot",
            "count": 4,
            "label": "rabbit",
            "with": [
                {"type": "node", "count": 1, "with": NODE_REQUEST[0]["with"]},
                # 60 per node + ceil(100/4)=25 + the whole MGT, on any node's rabbit: 1 GiB
                # asked, 4,000,000,000 bytes as nnf-sos allocates it (3.7 GiB)
                {"type": "ssd", "count": 60 + 25 + 4, "exclusive": True},
            ],
        }
    ]
    assert NODE_REQUEST[0]["count"] == 4  # the input is not changed


def test_a_slot_or_chassis_of_nodes_gets_their_ssd_beside_them() -> None:
    inner = [{"type": "slot", "count": 1, "label": "task"}]
    needs = [need("xfs", PER_COMPUTE, 10), need("ost", ACROSS_SERVERS, 60)]
    for kind in ("slot", "chassis"):
        top = {"type": kind, "count": 3, "with": [{"type": "node", "count": 2, "with": inner}]}
        rewritten = rabbit_resources([top], needs, {})
        # 6 nodes: 10 GiB each + 60/6 of Lustre = 20 GiB a node, 40 beside each pair
        assert rewritten == [
            {**top, "with": [*top["with"], {"type": "ssd", "count": 40, "exclusive": True}]}
        ]
        assert rabbit_resources(rewritten, needs, {}) is None


def test_rewrite_is_done_once() -> None:
    rewritten = rabbit_resources(NODE_REQUEST, [need("xfs", PER_COMPUTE, 10)], {})
    assert rabbit_resources(rewritten, [need("xfs", PER_COMPUTE, 10)], {}) is None


def test_rewrite_needs_a_node_count() -> None:
    with pytest.raises(StorageError, match="whole nodes"):
        rabbit_resources([{"type": "slot", "count": 4}], [need("xfs", PER_COMPUTE, 1)], {})


def test_minimum_allocation_raises_each_allocation() -> None:
    limits = {"xfs": StorageLimit(None, 50 * GIB)}
    per_node = bytes_per_node([need("xfs", PER_COMPUTE, 1), need("raw", PER_COMPUTE, 1)], 2, limits)
    assert per_node == {"xfs": 50 * GIB, "raw": GIB}


def test_release_update_checks_limits_even_without_rabbit_scheduling() -> None:
    limits = {"xfs": StorageLimit(100 * GIB)}
    ok = release_update(NODE_REQUEST, [need("xfs", PER_COMPUTE, 100)], limits, False)
    assert set(ok) == {JOBSPEC_STORAGE_KEY}
    with pytest.raises(
        StorageError, match="xfs storage of 101 GiB per node is over the site maximum of 100 GiB"
    ):
        release_update(NODE_REQUEST, [need("xfs", PER_COMPUTE, 101)], limits, False)
    update = release_update(NODE_REQUEST, [need("xfs", PER_COMPUTE, 100)], limits, True)
    assert update["resources"][0]["with"][1] == {"type": "ssd", "count": 100, "exclusive": True}


# ---- Servers from the allocation ------------------------------------------------------------


def placed(plan: dict) -> list[tuple[str, int, list]]:
    return [(s["label"], s["allocationSize"], s["storage"]) for s in plan[("default", "srv")]]


def test_per_compute_is_one_allocation_per_node_on_its_rabbit() -> None:
    hosts = ["a1", "a2", "a3", "b1"]
    rabbits = {"a1": "ra", "a2": "ra", "a3": "ra", "b1": "rb"}
    plan = plan_servers([need("xfs", PER_COMPUTE, 10)], hosts, rabbits)
    assert placed(plan) == [
        (
            "xfs",
            10 * GIB,
            [{"name": "ra", "allocationCount": 3}, {"name": "rb", "allocationCount": 1}],
        )
    ]


def test_across_servers_is_weighted_by_the_jobs_nodes_per_rabbit() -> None:
    hosts = ["a1", "a2", "a3", "a4", "b1", "b2"]
    rabbits = {h: "r" + h[0] for h in hosts}
    plan = plan_servers([need("ost", ACROSS_SERVERS, 60)], hosts, rabbits)
    # gcd(4, 2) = 2 nodes per allocation: 3 allocations of 60 * 2 / 6 = 20 GiB
    assert placed(plan) == [
        (
            "ost",
            20 * GIB,
            [{"name": "ra", "allocationCount": 2}, {"name": "rb", "allocationCount": 1}],
        )
    ]


def test_a_count_larger_than_the_rabbits_wraps_onto_those_with_most_nodes() -> None:
    hosts = ["a1", "a2", "b1", "c1"]
    rabbits = {h: "r" + h[0] for h in hosts}
    plan = plan_servers([need("mdt", ACROSS_SERVERS, 8, count=5)], hosts, rabbits)
    label, size, storage = placed(plan)[0]
    assert size == -(-8 * GIB // 5)
    assert storage == [
        {"name": "ra", "allocationCount": 2},
        {"name": "rb", "allocationCount": 2},
        {"name": "rc", "allocationCount": 1},
    ]


def test_single_server_is_exactly_one_and_the_site_minimum_applies() -> None:
    hosts = ["a1", "b1", "b2"]
    rabbits = {h: "r" + h[0] for h in hosts}
    least = min_allocations({"lustre": StorageLimit(None, 4 * GIB)})
    plan = plan_servers([need("mgt", SINGLE_SERVER, 1)], hosts, rabbits, least)
    assert placed(plan) == [("mgt", 4 * GIB, [{"name": "rb", "allocationCount": 1}])]


# ---- site limits in config and at submit ----------------------------------------------------


def test_storage_limits_in_the_dws_table() -> None:
    policy = policy_from_table(
        {"storage": {"xfs": {"max-per-node": "1TiB", "min-allocation": "1GiB"}}}
    )
    assert policy.storage_limits["xfs"] == StorageLimit(2**40, GIB)
    assert policy.storage_limits.get("gfs2", NO_LIMIT) == NO_LIMIT


@pytest.mark.parametrize(
    "table, words",
    [
        ({"storage": {"xf": {}}}, "unknown key 'storage.xf' (did you mean 'storage.xfs'?)"),
        ({"storage": {"xfs": {"max-per-node": 5}}}, 'must be a size such as "1TiB"'),
        ({"storage": {"xfs": {"max-per-node": "1GiB", "min-allocation": "2GiB"}}}, "more than"),
        ({"rabbit-scheduling": "yes"}, "must be true or false"),
    ],
)
def test_bad_storage_limits_name_the_key(table: dict, words: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(words)):
        policy_from_table(table)


def test_submit_refuses_a_directive_over_the_maximum() -> None:
    policy = policy_from_table(
        {"storage": {"xfs": {"max-per-node": "100GiB"}, "lustre": {"max-per-node": "1TiB"}}}
    )
    xfs = {"dw": "#DW jobdw type=xfs capacity=200GiB name=scratch"}
    assert validate_attributes(xfs, policy, 1000, 0, NODE_REQUEST) == (
        "xfs storage of 200 GiB per node is over the site maximum of 100 GiB per node"
    )
    lustre = {"dw": "#DW jobdw type=lustre capacity=8TiB name=scratch"}
    assert "2048 GiB per node" in validate_attributes(lustre, policy, 1000, 0, NODE_REQUEST)
    wide = [dict(NODE_REQUEST[0], count=16)]
    assert validate_attributes(lustre, policy, 1000, 0, wide) is None
    # without -N the Lustre share is not known at submit: Proposal checks it
    assert validate_attributes(lustre, policy, 1000, 0, [{"type": "slot", "count": 2}]) is None


# ---- flux dws rabbit-graph ------------------------------------------------------------------


def test_rabbit_graph_command_from_saved_objects(tmp_path: Path) -> None:
    config, storages = objects()
    saved = {
        "kind": "List",
        "items": [dict(config, kind="SystemConfiguration")]
        + [dict(s, kind="Storage") for s in storages],
    }
    (tmp_path / "dws.json").write_text(json.dumps(saved))
    (tmp_path / "R.json").write_text(json.dumps(R))
    out, err = io.StringIO(), io.StringIO()
    argv = [
        "rabbit-graph",
        "-R",
        str(tmp_path / "R.json"),
        "--from-file",
        str(tmp_path / "dws.json"),
    ]
    assert main(argv, out=out, err=err) == 0
    assert json.loads(out.getvalue()) == resource_graph(R, rabbit_inventory(config, storages))
    again = io.StringIO()
    assert main(argv, out=again, err=io.StringIO()) == 0
    assert again.getvalue() == out.getvalue()


def test_rabbit_graph_command_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "R.json").write_text(json.dumps(R))
    (tmp_path / "dws.json").write_text(json.dumps({"kind": "List", "items": []}))
    err = io.StringIO()
    argv = [
        "rabbit-graph",
        "-R",
        str(tmp_path / "R.json"),
        "--from-file",
        str(tmp_path / "dws.json"),
    ]
    assert main(argv, out=io.StringIO(), err=err) == 1
    assert err.getvalue().count("\n") == 1
    assert "holds no SystemConfiguration" in err.getvalue()
    err = io.StringIO()
    argv[2] = str(tmp_path / "missing.json")
    assert main(argv, out=io.StringIO(), err=err) == 1
    assert "cannot read R" in err.getvalue()


# ---- dwssim accounts for rabbit capacity ----------------------------------------------------


def test_dwssim_fails_setup_on_a_rabbit_short_of_capacity() -> None:
    from test_dwssim import allocate, create, move, settled, wait_for

    store = Store()
    seed(store, ("node0", "node1"), rabbits={"rabbit-0": ["node0", "node1"]}, capacity=100 * GIB)
    xfs = "#DW jobdw type=xfs capacity=30GiB name=scratch"
    with DwsSim(store, time_scale=0.001, seed=7) as sim:
        for name in ("first", "second"):
            create(store, name, [xfs])
            wait_for(store, name, settled("Proposal"), "settled in Proposal")
            allocate(store, name, ("node0", "node1"))
        assert move(store, "first", "Setup")["status"]["ready"] is True
        assert sim.capacity.held() == {"rabbit-0": 60 * GIB}
        failed = move(store, "second", "Setup")["status"]
        assert failed["status"] == "Error"
        assert "rabbit-0: insufficient capacity available" in failed["message"]
        # Teardown gives the capacity back: the next job's Setup succeeds
        move(store, "first", "Teardown")
        assert sim.capacity.held() == {}
        create(store, "third", [xfs])
        wait_for(store, "third", settled("Proposal"), "settled in Proposal")
        allocate(store, "third", ("node0", "node1"))
        assert move(store, "third", "Setup")["status"]["ready"] is True


def test_rabbit_graph_command_from_the_live_api(kubeapi, tmp_path: Path) -> None:
    seed(kubeapi.store, rabbits=MAPPING, capacity=100 * GIB)
    (tmp_path / "R.json").write_text(json.dumps(R))
    out, err = io.StringIO(), io.StringIO()
    argv = ["rabbit-graph", "-R", str(tmp_path / "R.json"), "--kubeconfig", kubeapi.kubeconfig]
    assert main(argv, out=out, err=err) == 0, err.getvalue()
    config, storages = objects()
    assert json.loads(out.getvalue()) == resource_graph(R, rabbit_inventory(config, storages))


def test_resource_exclude_leaves_nodes_out_of_the_graph(tmp_path: Path) -> None:
    config, storages = objects()
    rabbits = rabbit_inventory(config, storages)
    assert excluded_hosts(R, "0-1") == {"compute-01", "compute-02"}
    assert excluded_hosts(R, "compute-[03,05]") == {"compute-03", "compute-05"}
    graph = resource_graph(R, rabbits, exclude={"compute-01", "compute-02", "compute-05"})
    names = {v["metadata"]["name"] for v in graph["scheduling"]["graph"]["nodes"]}
    assert {"compute-03", "compute-04", "compute-06", "rabbit-1"} <= names
    assert not names & {"compute-01", "compute-02", "compute-05", "rabbit-0"}
    with pytest.raises(RabbitError, match="resource.exclude"):
        excluded_hosts(R, "compute-[")
    # the command reads [resource] exclude from the instance's config (no FLUX_URI needed)
    saved = {"items": [dict(config, kind="SystemConfiguration")]}
    saved["items"] += [dict(s, kind="Storage") for s in storages]
    (tmp_path / "dws.json").write_text(json.dumps(saved))
    (tmp_path / "R.json").write_text(json.dumps(R))
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "resource.toml").write_text('[resource]\nexclude = "0-1"\n')
    argv = ["rabbit-graph", "-R", str(tmp_path / "R.json"), "--from-file"]
    argv += [str(tmp_path / "dws.json"), "--config", str(tmp_path / "conf.d")]
    out = io.StringIO()
    assert main(argv, out=out, err=io.StringIO()) == 0
    left_out = resource_graph(R, rabbits, exclude={"compute-01", "compute-02"})
    assert json.loads(out.getvalue()) == left_out
    out = io.StringIO()
    assert main([*argv, "--exclude", "compute-05"], out=out, err=io.StringIO()) == 0
    assert json.loads(out.getvalue()) == resource_graph(R, rabbits, exclude={"compute-05"})


def test_allocated_rabbits_read_fluxions_shorthand_jgf() -> None:
    """rv1_shorthand: names left out when basename + id, sizes when 1, and every vertex under
    an exclusively allocated one (resource/writers/match_writers.cpp)."""

    def vertex(kind: str, path: str, **meta: object) -> dict:
        return {"metadata": {"type": kind, "paths": {"containment": path}, **meta}}

    R_job = {
        "execution": {"nodelist": ["compute-[01-04]"], "R_lite": []},
        "scheduling": {
            "writer": "fluxion:jgf_shorthand",
            "graph": {
                "nodes": [
                    vertex("ssd", "/cluster0/rabbit-0/ssd3"),  # no name, no size: 1
                    vertex("node", "/cluster0/rabbit-0/compute-01", exclusive=True),
                    vertex("chassis", "/cluster0/rabbit-1", name="rabbit-1", exclusive=True),
                ]
            },
        },
    }
    served = {"compute-01": "rabbit-0", "compute-03": "rabbit-1", "compute-04": "rabbit-1"}
    assert allocated_rabbits(R_job, served) == {
        "rabbit-0": ["compute-01"],
        "rabbit-1": ["compute-03", "compute-04"],
    }
    from flux_dws.core.rabbits import ssd_parts

    assert ssd_parts(R_job) == {"rabbit-0": (("/cluster0/rabbit-0/ssd3", 1),)}
