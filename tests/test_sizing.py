# SPDX-License-Identifier: LGPL-3.0-only
"""Sizes and counts: the jobspec rewrite and the Servers plan keep to one rule, and every size,
count and name from a user or from DWS is bounded before arithmetic (issues 21, 22 and 26).

The property tests run the Hypothesis profile's examples (tests/conftest.py): 100 by default,
to keep the suite quick; ``HYPOTHESIS_PROFILE=thorough`` runs 1,000 each.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux_dws.base.sizes import MAX_BYTES, MAX_COUNT, ceil_div
from flux_dws.cli import main
from flux_dws.core.jobspec import (
    MAX_NESTING,
    RABBIT_SLOT,
    StorageLimit,
    min_allocations,
    rabbit_resources,
    release_update,
    reserved_gib,
    without_ssd,
)
from flux_dws.core.policy import Policy
from flux_dws.core.rabbits import GIB, RabbitError, rabbit_inventory, resource_graph
from flux_dws.core.storage import (
    ACROSS_SERVERS,
    NNF_LUSTRE_MIN_ALLOCATION,
    PER_COMPUTE,
    PER_SERVER,
    SINGLE_SERVER,
    STRATEGIES,
    AllocationNeed,
    ComputeLayout,
    StorageError,
    compute_layout,
    jobspec_storage,
    needs_from_breakdowns,
    plan_servers,
)
from flux_dws.testing.dwssim.companions import storage_resource, system_configuration
from flux_dws.validator import validate_attributes

PROPERTY = settings(deadline=None)
SERVERS = ("default", "srv")
NODES = [{"type": "node", "count": 2, "with": [{"type": "slot", "count": 1, "label": "task"}]}]


def need(
    label: str, strategy: str, size: int, count: int | None = None, exclusive: tuple = ()
) -> AllocationNeed:
    return AllocationNeed("bd", SERVERS, label, strategy, size, count, exclusive)


def lustre(ost: int, mdt: int = 32 * GIB, mgt: int = GIB) -> list[AllocationNeed]:
    """What nnf-sos's DirectiveBreakdown gives a Lustre jobdw with the default profile
    (internal/controller/directivebreakdown_controller.go): OSTs across the servers, an MDT
    across them with count 1, an MGT on a single server."""
    return [
        need("ost", ACROSS_SERVERS, ost),
        need("mdt", ACROSS_SERVERS, mdt, count=1),
        need("mgt", SINGLE_SERVER, mgt),
    ]


def load(plan: dict) -> dict[str, int]:
    """Bytes Servers ask of each rabbit."""
    taken: dict[str, int] = {}
    for sets in plan.values():
        for aset in sets:
            for entry in aset["storage"]:
                taken[entry["name"]] = (
                    taken.get(entry["name"], 0) + aset["allocationSize"] * entry["allocationCount"]
                )
    return taken


def ssd_per_node(resources: list[dict]) -> int:
    top = resources[0]
    return next(c["count"] for c in top["with"] if c["type"] == "ssd")


# ---- issue 21 item 6: reserve what Servers will take -----------------------------------------


def test_lustre_over_two_rabbits_reserves_the_mdt_on_the_rabbit_that_gets_it() -> None:
    """The measured case: 24 GiB of OSTs and a 32 GiB MDT, one node on each of two rabbits.
    Fluxion reserved 28 GiB on each; Servers took 12 + 32 (+ the MGT) on rabbit-1."""
    needs = lustre(24 * GIB, mgt=GIB)
    rewritten = rabbit_resources(NODES, needs, {})
    assert rewritten is not None and rewritten[0]["label"] == RABBIT_SLOT
    reserved = ssd_per_node(rewritten)
    plan = plan_servers(needs, ["n1", "n2"], {"n1": "rabbit-1", "n2": "rabbit-2"})
    taken = load(plan)
    assert taken == {"rabbit-1": (12 + 32 + 1) * GIB, "rabbit-2": 12 * GIB}
    assert reserved * GIB >= max(taken.values())  # 45 GiB a node; it was 28 (ceil(57/2))


KEYS = ("lustre-mgt", "")  # nnf-sos's MGT key, and its exclusive MDT's (no key)


@st.composite
def jobs(draw):
    """Random needs of every strategy and label, some with an exclusive colocation key, a
    site minimum, a placement of the job's nodes on rabbits of unequal share (as Fluxion might
    place them), and the keys other Servers hold on some of those rabbits."""
    size = st.one_of(st.integers(1, 4 * GIB), st.integers(1, 2**40), st.just(MAX_BYTES // 64))
    keys = st.sampled_from([(), (), ("lustre-mgt",), ("",)])
    needs = []
    for _ in range(draw(st.integers(1, 5))):
        strategy = draw(st.sampled_from(STRATEGIES))
        label = draw(st.sampled_from(["xfs", "raw", "gfs2", "ost", "mdt", "mgt", "mgtmdt"]))
        count = draw(st.none() | st.integers(1, 40)) if strategy == ACROSS_SERVERS else None
        needs.append(need(label, strategy, draw(size), count, draw(keys)))
    nnodes = draw(st.integers(1, 40))
    nrabbits = draw(st.integers(1, nnodes))
    # Every rabbit gets at least one node; the rest land anywhere (unequal shares).
    placement = list(range(nrabbits)) + [
        draw(st.integers(0, nrabbits - 1)) for _ in range(nnodes - nrabbits)
    ]
    floors = {
        fs: StorageLimit(None, draw(st.sampled_from([0, GIB, 10 * GIB])))
        for fs in ("xfs", "lustre")
    }
    held = st.frozensets(st.sampled_from(KEYS), min_size=1)
    taken = draw(st.dictionaries(st.sampled_from([f"rabbit-{r}" for r in range(nrabbits)]), held))
    return needs, placement, floors, taken


@PROPERTY
@given(jobs())
def test_no_rabbit_is_asked_for_more_than_its_nodes_reserved(job) -> None:
    """... and no rabbit gets two allocation sets with one exclusive key (counting what
    other Servers hold there), nor two allocations of one such set placed by count."""
    needs, placement, limits, taken = job
    hosts = [f"n{i}" for i in range(len(placement))]
    rabbits = {h: f"rabbit-{r}" for h, r in zip(hosts, placement)}
    try:
        gib = reserved_gib(needs, len(hosts), limits)
    except StorageError:
        return  # more than an int64 in all: refused before Fluxion sees it
    try:
        plan = plan_servers(needs, hosts, rabbits, min_allocations(limits), taken=taken)
    except StorageError as exc:  # only colocation refuses a job that could be reserved
        assert "exclusive colocation key" in str(exc) and any(n.keys for n in needs), exc
        assert "\n" not in str(exc)
        return
    held = {r: set(k) for r, k in taken.items()}
    for aset, wanted in zip(plan[SERVERS], needs):
        for entry in aset["storage"]:
            assert not held.get(entry["name"], set()) & wanted.keys, (entry, held)
            if wanted.keys and (wanted.strategy == SINGLE_SERVER or wanted.count):
                assert entry["allocationCount"] == 1
        for entry in aset["storage"]:
            held.setdefault(entry["name"], set()).update(wanted.keys)
    nodes_on = {r: placement.count(int(r.split("-")[1])) for r in set(rabbits.values())}
    for rabbit, taken in load(plan).items():
        assert taken <= nodes_on[rabbit] * gib * GIB, (rabbit, taken, nodes_on[rabbit], gib)
    # and what nnf-sos checks of each set (validateServerAllocations) holds
    for aset, wanted in zip(plan[SERVERS], needs):
        allocations = sum(e["allocationCount"] for e in aset["storage"])
        assert 1 <= aset["allocationSize"] <= MAX_BYTES
        if wanted.strategy == SINGLE_SERVER:
            assert aset["storage"] == [{"name": aset["storage"][0]["name"], "allocationCount": 1}]
        if wanted.strategy == ACROSS_SERVERS:
            assert aset["allocationSize"] * allocations >= wanted.capacity
        else:
            assert aset["allocationSize"] >= wanted.capacity


# ---- issue 22: sizes and counts bounded where they are born -----------------------------------


def test_two_directives_whose_sum_passes_int64_fail_the_job_clearly() -> None:
    """5000000TiB twice: each is an int64, their sum is not (it went into dws-proposal)."""
    huge = 5_000_000 * 2**40
    assert huge <= MAX_BYTES < 2 * huge
    needs = [need("xfs", PER_COMPUTE, huge), need("xfs", PER_COMPUTE, huge)]
    with pytest.raises(StorageError, match=r"^the job's xfs storage add up to more than"):
        jobspec_storage(needs)
    breakdowns = [
        {
            "metadata": {"name": f"bd-{i}"},
            "status": {
                "storage": {
                    "reference": {"namespace": "default", "name": f"srv-{i}"},
                    "allocationSets": [
                        {"allocationStrategy": PER_COMPUTE, "minimumCapacity": huge, "label": "xfs"}
                    ],
                }
            },
        }
        for i in range(2)
    ]
    with pytest.raises(StorageError, match="add up to more than"):  # read at Proposal
        needs_from_breakdowns(breakdowns)
    for rabbit_scheduling in (False, True):
        with pytest.raises(StorageError, match="add up to more than"):
            release_update(NODES, needs, {}, rabbit_scheduling)


@PROPERTY
@given(st.lists(st.integers(0, MAX_BYTES), min_size=1, max_size=6), st.integers(1, 2**33))
def test_whatever_the_sizes_the_release_is_int64_or_refused(sizes, nnodes) -> None:
    needs = [need("xfs" if i % 2 else "ost", STRATEGIES[i % 4], s) for i, s in enumerate(sizes)]
    resources = [{"type": "node", "count": nnodes}]
    try:
        update = release_update(resources, needs, {}, True)
    except StorageError as exc:
        assert "\n" not in str(exc)
        return
    for figures in update["attributes.system.dw_storage"].values():
        assert all(0 <= v <= MAX_BYTES for v in figures.values())
    for entry in update.get("resources", [{}])[0].get("with", []):
        assert 1 <= entry["count"] <= MAX_COUNT
    if "resources" in update:
        assert update["resources"][0]["count"] <= MAX_COUNT


def test_a_huge_breakdown_count_is_refused_and_a_large_one_is_not_looped_over() -> None:
    breakdown = {
        "metadata": {"name": "bd"},
        "status": {
            "storage": {
                "reference": {"namespace": "default", "name": "srv"},
                "allocationSets": [
                    {
                        "allocationStrategy": ACROSS_SERVERS,
                        "minimumCapacity": GIB,
                        "label": "mdt",
                        "constraints": {"count": 1_000_000_000_000},
                    }
                ],
            }
        },
    }
    with pytest.raises(StorageError, match=r"constraints.count 1000000000000 is not a count"):
        needs_from_breakdowns([breakdown])
    # The largest count admitted: placed by arithmetic over the job's 3 rabbits, at once.
    plan = plan_servers(
        [need("mdt", ACROSS_SERVERS, GIB, count=MAX_COUNT)],
        ["a", "b", "c"],
        {"a": "ra", "b": "rb", "c": "rc"},
    )
    storage = plan[SERVERS][0]["storage"]
    assert [e["allocationCount"] for e in storage] == [MAX_COUNT // 3] * 3
    assert plan[SERVERS][0]["allocationSize"] == 1


@pytest.mark.parametrize("bad", [-1, MAX_BYTES + 1, 2**100, 1.5, "1", True])
def test_a_breakdown_capacity_out_of_int64_is_refused(bad) -> None:
    breakdown = {
        "metadata": {"name": "bd"},
        "status": {
            "storage": {
                "reference": {"name": "srv"},
                "allocationSets": [
                    {"allocationStrategy": PER_COMPUTE, "minimumCapacity": bad, "label": "xfs"}
                ],
            }
        },
    }
    with pytest.raises(StorageError, match="minimumCapacity .* is not a size"):
        needs_from_breakdowns([breakdown])


def test_integer_rounding_never_asks_a_gib_too_few_nor_past_int64() -> None:
    # A float quotient made 2**62+1 bytes 2**32 GiB: one GiB too few.
    assert math.ceil((2**62 + 1) / GIB) == 2**32
    assert reserved_gib([need("xfs", PER_COMPUTE, 2**62 + 1)], 1, {}) == 2**32 + 1
    # ... which is more than Fluxion's jobspec counts take: refused, not emitted.
    with pytest.raises(StorageError, match=f"at most {MAX_COUNT}"):
        rabbit_resources(NODES, [need("xfs", PER_COMPUTE, 2**62 + 1)], {})
    # ceil(INT64_MAX / 1) as a float is 2**63, past int64.
    plan = plan_servers([need("ost", ACROSS_SERVERS, MAX_BYTES)], ["a"], {"a": "ra"})
    assert plan[SERVERS][0]["allocationSize"] == MAX_BYTES
    assert ceil_div(MAX_BYTES, 1) == MAX_BYTES and ceil_div(2**62 + 1, 2) == 2**61 + 1


def test_a_node_count_fluxion_would_refuse_is_refused() -> None:
    with pytest.raises(StorageError, match="Fluxion's jobspec counts"):
        rabbit_resources([{"type": "node", "count": 2**32}], [need("xfs", PER_COMPUTE, GIB)], {})


# ---- a user's own ssd ------------------------------------------------------------------------

USERS_SSD = [
    {
        "type": "slot",
        "count": 2,
        "label": "task",
        "with": [{"type": "node", "count": 1}, {"type": "ssd", "count": 1}],
    }
]


def test_a_users_own_ssd_is_replaced_by_the_rewrite_and_checked_against_the_limits() -> None:
    needs = [need("xfs", PER_COMPUTE, 2**40)]
    rewritten = rabbit_resources(USERS_SSD, needs, {})
    assert rewritten == [
        {
            "type": "slot",
            "count": 2,
            "label": "task",
            "with": [
                {"type": "node", "count": 1},
                {"type": "ssd", "count": 1024, "exclusive": True},
            ],
        }
    ]
    assert rabbit_resources(rewritten, needs, {}) is None  # a repeated release: no change
    limits = {"xfs": StorageLimit(512 * GIB)}
    with pytest.raises(StorageError, match="over the site maximum of 512 GiB"):
        release_update(USERS_SSD, needs, limits, True)
    # and at submit, the same check counts the user's slot of nodes
    system = {"dw": "#DW jobdw type=xfs capacity=1TiB name=scratch"}
    from flux_dws.core.policy import policy_from_table

    policy = policy_from_table({"storage": {"xfs": {"max-per-node": "512GiB"}}})
    reason = validate_attributes(system, policy, 1000, 1000, USERS_SSD)
    assert reason is not None and "over the site maximum" in reason


def test_our_own_rewrite_is_undone_to_the_users_request() -> None:
    plain = [{"type": "node", "count": 3, "with": [{"type": "slot", "count": 1, "label": "task"}]}]
    rewritten = rabbit_resources(plain, [need("xfs", PER_COMPUTE, GIB)], {})
    assert without_ssd(rewritten) == plain
    assert rabbit_resources(rewritten, [need("xfs", PER_COMPUTE, 2 * GIB)], {}) == rabbit_resources(
        plain, [need("xfs", PER_COMPUTE, 2 * GIB)], {}
    )


def test_ssd_deeper_than_the_rewrite_reaches_is_refused() -> None:
    deep = [
        {
            "type": "slot",
            "count": 1,
            "with": [{"type": "node", "count": 1, "with": [{"type": "ssd", "count": 5}]}],
        }
    ]
    with pytest.raises(StorageError, match="ask for ssd themselves"):
        rabbit_resources(deep, [need("xfs", PER_COMPUTE, GIB)], {})
    # a storage-less job's own ssd is taken out too: no rabbit storage is left reserved
    assert rabbit_resources(USERS_SSD, [], {}) == [
        {"type": "slot", "count": 2, "label": "task", "with": [{"type": "node", "count": 1}]}
    ]


def nested(levels: int, bottom: dict | None = None) -> list[dict]:
    """``node x 2`` over slots nested so that the resources are ``levels`` deep."""
    deep: dict = bottom or {"type": "core", "count": 1}
    for _ in range(levels - 2):
        deep = {"type": "slot", "count": 1, "label": "task", "with": [deep]}
    return [{"type": "node", "count": 2, "with": [deep]}]


def test_resources_nested_past_the_bound_fail_in_one_line_not_in_recursion() -> None:
    """The release copied the whole request (copy.deepcopy) and looked for ssd by recursion:
    resources nested 480 deep (960 JSON levels, which Flux and Python still read) raised
    RecursionError in the service instead of a release or a failure."""
    needs = [need("xfs", PER_COMPUTE, GIB)]
    with pytest.raises(StorageError, match=f"^the job's resources nest more than {MAX_NESTING}"):
        rabbit_resources(nested(480), needs, {})
    with pytest.raises(StorageError, match="nest more than"):
        rabbit_resources(nested(MAX_NESTING + 1), needs, {})
    deepest = nested(MAX_NESTING)
    rewritten = rabbit_resources(deepest, needs, {})
    assert rewritten is not None and rewritten[0]["with"][0]["with"] == deepest[0]["with"]
    assert without_ssd(rewritten) == deepest
    assert deepest == nested(MAX_NESTING)  # the request itself is left as it was
    # and at submit, in the validator's words
    system = {"dw": "#DW jobdw type=xfs capacity=1GiB name=scratch"}
    reason = validate_attributes(system, Policy(rabbit_scheduling=True), 1000, 1000, nested(480))
    assert reason is not None and reason.startswith("the job's resources nest more than")


@st.composite
def user_resources(draw):
    """A jobspec's resources as a user might write them (a ``node``, ``slot`` or ``chassis``
    at the top, any counts), and the same with ssd of the user's own added: beside the nodes
    (``where="top"``), or deeper than the rewrite reaches (``where="deep"``)."""
    count = st.integers(1, 2**33)
    inner = [{"type": "slot", "count": draw(count), "label": "task"}]
    kind = draw(st.sampled_from(["node", "slot", "chassis"]))
    if kind == "node":
        base = [{"type": "node", "count": draw(count), "with": inner}]
    else:
        node = {"type": "node", "count": draw(count), "with": inner}
        base = [{"type": kind, "count": draw(count), "label": "task", "with": [node]}]
    ssd = {"type": "ssd", "count": draw(st.integers(0, 2**64))}
    where = draw(st.sampled_from(["top", "deep"]))
    users = json.loads(json.dumps(base))
    if where == "top":
        users[0].setdefault("with", []).append(ssd)
    else:
        users[0]["with"][0].setdefault("with", []).append(ssd)
    return base, users, where


def effective(resources, needs):
    """What the job is scheduled with after the rewrite (its resources when it changes none)."""
    rewritten = rabbit_resources(resources, needs, {})
    return resources if rewritten is None else rewritten


@PROPERTY
@given(user_resources(), st.lists(st.integers(1, 2**42), max_size=3))
def test_the_rewrite_is_the_only_source_of_ssd(shapes, sizes) -> None:
    """A user's own ssd never changes what the job is scheduled with: beside the nodes it is
    replaced by the rewrite's (the same as for the jobspec without it), deeper it is refused."""
    base, users, where = shapes
    needs = [need("xfs", PER_COMPUTE, size) for size in sizes]
    try:
        wanted = effective(base, needs)
    except StorageError as exc:
        wanted = exc
    try:
        got = effective(users, needs)
    except StorageError as exc:
        assert "\n" not in str(exc)
        assert where == "deep" or isinstance(wanted, StorageError), exc
        return
    assert where == "top"
    assert got == wanted
    for entry in got[0].get("with", []):
        assert entry["type"] != "ssd" or 1 <= entry["count"] <= MAX_COUNT


# ---- the rabbit graph and rabbit names ------------------------------------------------------

R = {
    "version": 1,
    "execution": {
        "R_lite": [{"rank": "0-1", "children": {"core": "0"}}],
        "starttime": 0.0,
        "expiration": 0.0,
        "nodelist": ["c[1-2]"],
    },
}


def test_a_rabbit_capacity_past_int64_fails_the_graph_command(tmp_path: Path) -> None:
    config = system_configuration({"rabbit-0": ["c1", "c2"]})
    storage = storage_resource("rabbit-0", ["c1", "c2"], 2**100)
    rabbits = rabbit_inventory(config, [storage])
    with pytest.raises(RabbitError, match="Storage rabbit-0: capacity .* is not a byte count"):
        resource_graph(R, rabbits)
    saved = {
        "kind": "List",
        "items": [dict(config, kind="SystemConfiguration"), dict(storage, kind="Storage")],
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
    assert main([*argv, "-o", str(tmp_path / "out.json")], out=out, err=err) == 1
    assert "is not a byte count" in err.getvalue() and err.getvalue().count("\n") == 1
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("name", ["0", "r/0", "Rabbit-0", "-r", "r\x1b[2J", "r" * 254, "r_0"])
def test_a_rabbit_name_dws_could_not_use_is_refused_clearly(name: str) -> None:
    config = system_configuration({name: ["c1"]})
    with pytest.raises(RabbitError, match="is not a DNS-1123 name") as graph_error:
        rabbit_inventory(config, [])
    assert "\x1b" not in str(graph_error.value)
    with pytest.raises(StorageError, match="is not a DNS-1123 name.*Servers cannot name it"):
        plan_servers([need("xfs", PER_COMPUTE, GIB)], ["c1"], {"c1": name})


def test_ordinary_rabbit_names_pass() -> None:
    hosts = {"c1": "rabbit-0", "c2": "x1000c0j7b0.example", "c3": "r9"}
    plan = plan_servers([need("xfs", PER_SERVER, GIB)], list(hosts), hosts)
    assert {e["name"] for e in plan[SERVERS][0]["storage"]} == set(hosts.values())


# ---- issue 26 item 7a: a job without storage needs no rabbit ---------------------------------


def test_a_job_without_storage_needs_no_rabbit() -> None:
    assert plan_servers([], ["external-1"], {}) == {}


def test_a_storage_job_on_a_node_no_rabbit_serves_says_why() -> None:
    with pytest.raises(StorageError, match="no rabbit serves compute node c9: .*computesAccess"):
        plan_servers([need("xfs", PER_COMPUTE, GIB)], ["c9"], {})


# ---- externalComputeNodes: compute nodes no rabbit is attached to ----------------------------


def test_the_layout_reads_external_compute_nodes_and_an_attached_node_stays_attached() -> None:
    config = system_configuration({"rabbit-1": ["c1"]}, external=["x1", "c1"])
    config["spec"]["externalComputeNodes"] += [{"name": ""}, "x2", {"name": 3}]
    layout = compute_layout(config)
    assert layout == ComputeLayout({"c1": "rabbit-1"}, frozenset({"x1"}))
    assert layout.covers(["c1", "x1"]) and not layout.covers(["c1", "x2"])
    assert compute_layout(None) == ComputeLayout({}) and not compute_layout(None).covers(["c1"])


@pytest.mark.parametrize("label,strategy", [("xfs", PER_COMPUTE), ("raw", PER_SERVER)])
def test_storage_other_than_lustre_on_an_external_node_is_refused_naming_it(
    label: str, strategy: str
) -> None:
    with pytest.raises(StorageError) as refused:
        plan_servers([need(label, strategy, GIB)], ["c1", "x1"], {"c1": "r1"}, external={"x1"})
    assert str(refused.value) == (
        "compute node x1 is one of the SystemConfiguration's externalComputeNodes: no rabbit"
        f" is attached to it, so it cannot have {label} storage (only Lustre reaches it)"
    )


def test_lustre_reaches_external_nodes_and_sits_on_the_rabbits_of_the_others() -> None:
    """nnf-sos mounts Lustre on every client over the network (mapClientNetworkStorage): the
    targets go on the rabbits of the job's attached nodes, sized over those nodes alone."""
    rabbits = {"c1": "r1", "c2": "r1", "c3": "r2"}
    hosts = ["c1", "x1", "c2", "c3", "x2"]
    plan = plan_servers(lustre(30 * GIB), hosts, rabbits, external={"x1", "x2"})
    assert plan == plan_servers(lustre(30 * GIB), ["c1", "c2", "c3"], rabbits)
    ost = plan[SERVERS][0]
    assert {e["name"] for e in ost["storage"]} == {"r1", "r2"}
    assert sum(e["allocationCount"] for e in ost["storage"]) * ost["allocationSize"] >= 30 * GIB


def test_lustre_with_every_node_external_has_no_rabbit_to_sit_on() -> None:
    with pytest.raises(StorageError, match=r"^every compute node of the job \(x1 and 1 more\)"):
        plan_servers(lustre(GIB), ["x1", "x2"], {"c1": "r1"}, external={"x1", "x2"})
    assert plan_servers([], ["x1"], {}, external={"x1"}) == {}


@pytest.fixture
def no_configuration_stack():
    from flux_dws.testing.stack import Stack

    with Stack(hosts=2) as stack:
        assert stack.api is not None
        stack.api.store.delete("systemconfigurations", "default", "default")
        yield stack


def test_without_a_system_configuration_storage_less_jobs_run_and_others_fail_clearly(
    no_configuration_stack,
) -> None:
    stack = no_configuration_stack
    plain = stack.submit("#DW Setup action=complete", nnodes=2)
    assert stack.wait(plain).result == "COMPLETED"
    storage = stack.submit("#DW jobdw type=xfs capacity=1GiB name=scratch", nnodes=1)
    info = stack.wait(storage)
    assert info.result != "COMPLETED"
    assert info.exception is not None
    assert "no SystemConfiguration 'default' yet" in info.exception.get("note", "")


@PROPERTY
@given(
    st.lists(st.one_of(st.integers(0, 2**64), st.just(MAX_BYTES)), min_size=1, max_size=4),
    st.integers(1, 64),
)
def test_the_graph_is_loadable_or_refused_whatever_the_capacities(capacities, chunks) -> None:
    computes = {f"rabbit-{i}": [f"c{i}"] for i in range(len(capacities))}
    config = system_configuration(computes)
    storages = [storage_resource(r, c, cap) for (r, c), cap in zip(computes.items(), capacities)]
    R_n = {
        "version": 1,
        "execution": {
            "R_lite": [{"rank": f"0-{len(capacities) - 1}", "children": {"core": "0"}}],
            "nodelist": [f"c[0-{len(capacities) - 1}]"],
        },
    }
    try:
        graph = resource_graph(R_n, rabbit_inventory(config, storages), chunks=chunks)
    except RabbitError as exc:
        assert "\n" not in str(exc) and max(capacities) > MAX_BYTES
        return
    sizes = [v["metadata"].get("size", 1) for v in graph["scheduling"]["graph"]["nodes"]]
    assert all(0 <= s <= MAX_BYTES for s in sizes) and sum(sizes) <= MAX_BYTES


def test_two_directives_past_int64_fail_their_job_and_block_no_other() -> None:
    """issue 22 item 1, through the service: the job fails at Proposal with one line, and
    the next #DW job runs (before, the release was retried forever holding a Proposal slot)."""
    from flux_dws.testing.stack import Stack

    huge = [f"#DW jobdw type=xfs capacity=5000000TiB name=big-{n}" for n in "ab"]
    with Stack(hosts=2) as stack:
        bad = stack.wait(stack.submit(huge, nnodes=1), timeout=60)
        assert bad.result != "COMPLETED" and bad.exception is not None
        note = bad.exception.get("note", "")
        assert "xfs storage add up to more than" in note and "\n" not in note
        good = stack.submit("#DW jobdw type=xfs capacity=1GiB name=scratch", nnodes=1)
        assert stack.wait(good, timeout=60).result == "COMPLETED"


def test_a_users_own_ssd_through_the_service_is_replaced_and_held_to_the_site_limit() -> None:
    """issue 22, end to end: a #DW job's own ssd is replaced by the rewrite's (the same rule
    as for any other job) and its storage is checked against ``max-per-node`` at submit; a
    job without #DW may not ask for ssd, nor may a #DW job whose shape the rewrite cannot
    take (both passed submit before, the latter to fail only at release)."""
    from flux_dws.core.jobspec import OWN_SSD, WHOLE_NODES
    from flux_dws.testing.fakeflux import SubmitError
    from flux_dws.testing.stack import Stack

    config = {"rabbit-scheduling": True, "storage": {"xfs": {"max-per-node": "512GiB"}}}
    own = [
        {
            "type": "slot",
            "count": 2,
            "label": "task",
            "with": [{"type": "node", "count": 1}, {"type": "ssd", "count": 1}],
        }
    ]
    with Stack(hosts=2, config=config) as stack:
        jobid = stack.submit(
            "#DW jobdw type=xfs capacity=100GiB name=scratch", nnodes=2, resources=own
        )
        info = stack.wait(jobid, timeout=60)
        assert info.result == "COMPLETED", info.exception
        updates = [
            e["context"]["resources"]
            for e in info.events("jobspec-update")
            if "resources" in e["context"]
        ]
        node_and_ssd = [
            {"type": "node", "count": 1},
            {"type": "ssd", "count": 100, "exclusive": True},
        ]
        assert updates == [[{"type": "slot", "count": 2, "label": "task", "with": node_and_ssd}]]
        with pytest.raises(SubmitError) as over:
            stack.submit("#DW jobdw type=xfs capacity=1TiB name=scratch", nnodes=2, resources=own)
        assert str(over.value) == (
            "xfs storage of 1024 GiB per node is over the site maximum of 512 GiB per node"
        )
        with pytest.raises(SubmitError) as plain:
            stack.flux.submit({}, nnodes=2, resources=own)
        assert str(plain.value) == OWN_SSD
        no_node = [{"type": "slot", "count": 2, "label": "task", "with": [{"type": "core"}]}]
        with pytest.raises(SubmitError) as shape:
            stack.submit(
                "#DW jobdw type=xfs capacity=1GiB name=scratch", nnodes=2, resources=no_node
            )
        assert str(shape.value) == WHOLE_NODES
        assert [w["metadata"]["name"] for w in stack.workflows()] == []


def test_a_huge_breakdown_count_fails_its_job_clearly_and_leaves_nothing_behind() -> None:
    """issue 22 item 2, through the service: nnf-sos's breakdown asks for 10**12 servers; the
    job fails at Proposal naming the count and its workflow is torn down, while a breakdown
    asking for 1,152,921,504 OSTs (half what an int64 of bytes holds at nnf-sos's least
    allocation, 4,000,000,000 bytes, on a rabbit of int64 bytes) is planned by arithmetic and
    the job runs."""
    from flux_dws.testing.stack import Stack

    most = MAX_BYTES // NNF_LUSTRE_MIN_ALLOCATION // 2
    counts = {"huge": 1_000_000_000_000, "large": most}

    def nnf_sos_says(operation: str, old: dict | None, new: dict) -> dict:
        directive = (new.get("spec") or {}).get("directive", "")
        storage = (new.get("status") or {}).get("storage") or {}
        for word, count in counts.items():
            if f"name={word}" in directive:
                for aset in storage.get("allocationSets") or []:
                    if aset.get("label") == "ost":
                        aset.setdefault("constraints", {})["count"] = count
        return new

    planned: list[int] = []  # allocationCount of each Servers entry the service wrote

    def servers_written(operation: str, old: dict | None, new: dict) -> None:
        for aset in (new.get("spec") or {}).get("allocationSets") or []:
            planned.extend(entry.get("allocationCount", 0) for entry in aset.get("storage", []))

    with Stack(hosts=2, capacity=MAX_BYTES) as stack:
        assert stack.api is not None
        stack.api.store.add_admission("directivebreakdowns", nnf_sos_says)
        stack.api.store.add_admission("servers", servers_written)
        huge = stack.submit("#DW jobdw type=lustre capacity=1TiB name=huge", nnodes=2)
        large = stack.submit("#DW jobdw type=lustre capacity=1TiB name=large", nnodes=2)
        bad = stack.wait(huge, timeout=60)
        assert bad.result != "COMPLETED" and bad.exception is not None
        note = bad.exception.get("note", "")
        assert "constraints.count 1000000000000 is not a count" in note and "\n" not in note
        assert not bad.holds
        assert stack.left_behind(huge) == []
        good = stack.wait(large, timeout=60)
        assert good.result == "COMPLETED", good.exception
        assert most in planned  # the one rabbit of the job's 2 nodes got every OST
        assert stack.left_behind(large) == []
