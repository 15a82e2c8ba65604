# SPDX-License-Identifier: LGPL-3.0-only
"""Exclusive colocation: no two allocation sets with one exclusive key on one rabbit.

nnf-sos gives every set that holds a Lustre MGT ``constraints.colocation: [{type: exclusive,
key: lustre-mgt}]``: a rabbit mounts one MGT, and nnf-sos fails a job Fatal when two share one
("multiple MGTs found for address", nnf_storage_controller.go).  The Servers plan keeps such
sets apart, across the job's own sets, other jobs and persistent storage
(flux_dws.core.colocation, flux_dws.core.storage.plan_servers, flux_dws.service.placements).
"""

from __future__ import annotations

import json

import pytest

from flux_dws.core import colocation
from flux_dws.core.identity import workflow_name
from flux_dws.core.rabbits import GIB, OWNER_KIND_LABEL, servers_kept
from flux_dws.core.storage import (
    ACROSS_SERVERS,
    PER_COMPUTE,
    SINGLE_SERVER,
    AllocationNeed,
    StorageError,
    needs_from_breakdowns,
    plan_servers,
)
from flux_dws.k8s import KubeClient
from flux_dws.k8s.watch import DELETED, MODIFIED
from flux_dws.service.placements import Placements
from flux_dws.testing.dwssim.companions import breakdown
from flux_dws.testing.stack import Stack

MGT = ("lustre-mgt",)
RABBITS = {"c1": "rabbit-0", "c2": "rabbit-1", "c3": "rabbit-0", "c4": "rabbit-1"}


def lustre(servers: str, *, exclusive: tuple[str, ...] = MGT) -> list[AllocationNeed]:
    """A Lustre jobdw as nnf-sos's default profile breaks it: OSTs, a combined MGT/MDT."""
    where = ("default", servers)
    return [
        AllocationNeed(servers, where, "ost", ACROSS_SERVERS, GIB),
        AllocationNeed(servers, where, "mgtmdt", ACROSS_SERVERS, 5 * GIB, 1, exclusive),
    ]


def mgt_of(plan: dict, servers: str) -> list[str]:
    [aset] = [a for a in plan["default", servers] if a["label"] == "mgtmdt"]
    return [e["name"] for e in aset["storage"] if e["allocationCount"]]


def servers_object(name: str, plan: dict, needs=(), **meta) -> dict:
    """A Servers as the watch shows it once flux-dws wrote ``plan`` into it."""
    note = colocation.annotation([(n.label, n.exclusive) for n in needs])
    metadata = {"name": name, "namespace": "default", **meta}
    if note:
        metadata["annotations"] = {colocation.ANNOTATION: note}
    return {"metadata": metadata, "spec": {"allocationSets": plan["default", name]}}


# ---- reading the constraint (untrusted) ------------------------------------------------------


def lustre_breakdown(name: str = "wf", sets: list | None = None) -> dict:
    workflow = {"metadata": {"name": name, "namespace": "default"}, "spec": {"userID": 1}}

    class Directive:
        index, command, text = 0, "jobdw", "#DW jobdw type=lustre capacity=1GiB name=l"
        args = {"type": "lustre", "capacity": "1GiB"}

    made = breakdown(workflow, Directive())  # dwssim's, shaped as nnf-sos's default profile
    if sets is not None:
        made["status"]["storage"]["allocationSets"] = sets
    return made


def test_the_mgt_key_of_nnf_sos_breakdown_is_read_into_the_need():
    ost, mgtmdt = needs_from_breakdowns([lustre_breakdown()])
    assert (ost.label, ost.exclusive, ost.keys) == ("ost", (), frozenset())
    assert (mgtmdt.label, mgtmdt.exclusive, mgtmdt.keys) == ("mgtmdt", MGT, {"lustre-mgt"})
    assert AllocationNeed.from_json(mgtmdt.to_json()) == mgtmdt


def test_an_exclusive_mdt_has_the_empty_key_as_nnf_sos_writes_it():
    """exclusiveMDT: ``{type: exclusive}`` with no key (Go reads it as ""), and an MGT keeps
    its key whatever the breakdown says."""
    sets = [
        {"allocationStrategy": ACROSS_SERVERS, "minimumCapacity": GIB, "label": "mdt"},
        {"allocationStrategy": ACROSS_SERVERS, "minimumCapacity": GIB, "label": "mgtmdt"},
    ]
    sets[0]["constraints"] = {"colocation": [{"type": "exclusive"}]}
    sets[1]["constraints"] = {"colocation": [{"type": "exclusive", "key": ""}] * 2}
    mdt, mgtmdt = needs_from_breakdowns([lustre_breakdown(sets=sets)])
    assert (mdt.exclusive, mdt.keys) == (("",), {""})
    assert (mgtmdt.exclusive, mgtmdt.keys) == (("",), {"", "lustre-mgt"})


@pytest.mark.parametrize(
    ("colocation", "why"),
    [
        ("lustre-mgt", "constraints.colocation must be a list, not str"),
        ({"type": "exclusive"}, "constraints.colocation must be a list, not dict"),
        ([5], "constraints.colocation[0] must be an object, not int"),
        (
            [{"type": "exclusive", "key": "a"}, {"key": "b"}],
            "constraints.colocation[1].type None is not a colocation type (only 'exclusive')",
        ),
        ([{"type": "Exclusive", "key": "k"}], "[0].type 'Exclusive' is not a colocation type"),
        ([{"type": "exclusive", "key": 7}], "[0].key 7 is not a colocation key"),
        ([{"type": "exclusive", "key": "k" * 254}], "is not a colocation key (a string of at"),
        ([{"type": "exclusive", "key": str(i)} for i in range(17)], "has 17 keys, more than 16"),
    ],
)
def test_a_bad_colocation_fails_the_job_in_one_line_naming_the_field(colocation, why):
    sets = [
        {
            "allocationStrategy": SINGLE_SERVER,
            "minimumCapacity": GIB,
            "label": "mgt",
            "constraints": {"colocation": colocation},
        }
    ]
    with pytest.raises(StorageError) as raised:
        needs_from_breakdowns([lustre_breakdown(sets=sets)])
    message = str(raised.value)
    assert message.startswith("DirectiveBreakdown 'wf-0': status.storage.allocationSets[0].")
    assert why in message and "\n" not in message and len(message) < 400


def test_servers_say_which_keys_they_hold_and_junk_holds_only_what_labels_say():
    needs = [
        *lustre("a"),
        AllocationNeed("a", ("default", "a"), "mdt", ACROSS_SERVERS, 1, 1, ("",)),
    ]
    plan = plan_servers(needs, ["c1", "c2"], RABBITS)
    obj = servers_object("a", plan, needs)
    assert json.loads(obj["metadata"]["annotations"][colocation.ANNOTATION]) == {
        "mdt": [""],
        "mgtmdt": ["lustre-mgt"],
    }
    assert colocation.servers_exclusive(obj) == {"rabbit-0": {"", "lustre-mgt"}}
    assert colocation.servers_exclusive(servers_kept(obj)) == {"rabbit-0": {"", "lustre-mgt"}}
    # another WLM's Servers (no annotation): an MGT still holds its key; nothing else does
    del obj["metadata"]["annotations"]
    assert colocation.servers_exclusive(obj) == {"rabbit-0": {"lustre-mgt"}}
    for junk in (None, 5, "x", {"spec": {"allocationSets": [7, {"label": 3}]}}):
        assert colocation.servers_exclusive(junk) == {}
    obj["metadata"]["annotations"] = {colocation.ANNOTATION: "{not json"}
    obj["spec"]["allocationSets"][1]["storage"][0]["allocationCount"] = 0  # holds nothing
    assert colocation.servers_exclusive(obj) == {}


# ---- the plan (pure) -----------------------------------------------------------------------


def test_a_second_lustre_job_on_the_same_rabbits_gets_its_mgt_on_the_other_rabbit():
    first = plan_servers(lustre("a"), ["c1", "c2"], RABBITS)
    assert mgt_of(first, "a") == ["rabbit-0"]  # the usual order: most nodes, then the name
    taken = colocation.servers_exclusive(servers_object("a", first, lustre("a")))
    second = plan_servers(lustre("b"), ["c3", "c4"], RABBITS, taken=taken)
    assert mgt_of(second, "b") == ["rabbit-1"]
    # the OSTs are not exclusive: they stay on both rabbits
    assert second["default", "b"][0] == {**first["default", "a"][0]}


def test_the_mgt_goes_to_the_free_rabbit_with_most_of_the_job_nodes():
    rabbits = {"c1": "r-a", "c2": "r-b", "c3": "r-b", "c4": "r-c", "c5": "r-c"}
    hosts = list(rabbits)
    assert mgt_of(plan_servers(lustre("a"), hosts, rabbits), "a") == ["r-b"]
    taken = {"r-b": frozenset(MGT)}
    assert mgt_of(plan_servers(lustre("a"), hosts, rabbits, taken=taken), "a") == ["r-c"]
    taken = {"r-b": frozenset(MGT), "r-c": frozenset(MGT), "r-a": frozenset({"other"})}
    assert mgt_of(plan_servers(lustre("a"), hosts, rabbits, taken=taken), "a") == ["r-a"]


def test_two_lustre_file_systems_of_one_job_keep_their_mgts_apart():
    needs = lustre("a") + lustre("b")
    plan = plan_servers(needs, ["c1", "c2"], RABBITS)
    assert (mgt_of(plan, "a"), mgt_of(plan, "b")) == (["rabbit-0"], ["rabbit-1"])
    with pytest.raises(StorageError, match="rabbit-0 holds one already"):
        plan_servers(needs, ["c1"], RABBITS)


def test_a_job_whose_every_rabbit_holds_the_key_fails_naming_the_key_and_rabbits():
    taken = {"rabbit-0": frozenset(MGT), "rabbit-1": frozenset(MGT)}
    with pytest.raises(StorageError) as raised:
        plan_servers(lustre("a"), ["c1", "c2"], RABBITS, taken=taken)
    assert str(raised.value) == (
        "the mgtmdt allocation set needs a rabbit of the job where no other allocation holds"
        " exclusive colocation key 'lustre-mgt' (a rabbit mounts one Lustre MGT), and every"
        " one of the job's rabbits has one (rabbit-[0-1] hold one already: another job's,"
        " persistent storage's or another of this job's sets)"
    )
    # a key held elsewhere, or another key, is no obstacle
    other = {"rabbit-0": frozenset({"x"}), "rabbit-9": frozenset(MGT)}
    assert mgt_of(plan_servers(lustre("a"), ["c1"], RABBITS, taken=other), "a") == ["rabbit-0"]


def test_a_counted_exclusive_set_takes_one_rabbit_per_allocation():
    mdt = [AllocationNeed("a", ("default", "a"), "mdt", ACROSS_SERVERS, 8 * GIB, 2, ("",))]
    plan = plan_servers(mdt, ["c1", "c2", "c3"], RABBITS)
    assert plan["default", "a"][0]["storage"] == [
        {"name": "rabbit-0", "allocationCount": 1},
        {"name": "rabbit-1", "allocationCount": 1},
    ]
    with pytest.raises(StorageError, match=r"needs 2 rabbits of the job .* only 1 of the job's 2"):
        plan_servers(mdt, ["c1", "c2"], RABBITS, taken={"rabbit-1": frozenset({""})})


def test_a_set_on_every_rabbit_cannot_dodge_a_key_and_says_so():
    xfs = [AllocationNeed("a", ("default", "a"), "xfs", PER_COMPUTE, GIB, None, ("k",))]
    assert plan_servers(xfs, ["c1", "c2"], RABBITS, taken={"rabbit-9": frozenset({"k"})})
    with pytest.raises(StorageError) as raised:
        plan_servers(xfs, ["c1", "c2"], RABBITS, taken={"rabbit-1": frozenset({"k"})})
    assert str(raised.value) == (
        "the xfs allocation set (AllocatePerCompute) goes on every rabbit of the job, and"
        " rabbit-1 already holds an allocation of exclusive colocation key 'k'"
    )


# ---- placements: what other Servers hold, and two jobs placed at once ------------------------


def planner(needs, hosts):
    return lambda taken: plan_servers(needs, hosts, RABBITS, taken=taken)


def test_two_jobs_planned_before_the_watch_shows_either_keep_apart():
    """Two jobs plan one after the other: the first plan's claim keeps the second off its
    rabbit, and goes once the watch shows the Servers (or they are deleted)."""
    book = Placements()
    book.listed()
    persistent = servers_object("p", plan_servers(lustre("p"), ["c9"], {"c9": "rabbit-9"}))
    persistent["metadata"]["labels"] = {OWNER_KIND_LABEL: "PersistentStorageInstance"}
    book.seen(MODIFIED, persistent)  # persistent storage's MGT, on a rabbit of no job here
    plan_a, notes_a = book.plan(lustre("a"), planner(lustre("a"), ["c1", "c2"]))
    plan_b, _ = book.plan(lustre("b"), planner(lustre("b"), ["c3", "c4"]))
    assert (mgt_of(plan_a, "a"), mgt_of(plan_b, "b")) == (["rabbit-0"], ["rabbit-1"])
    assert notes_a == {("default", "a"): {colocation.ANNOTATION: '{"mgtmdt": ["lustre-mgt"]}'}}
    book.settle(plan_a, True)
    book.settle(plan_b, True)
    with pytest.raises(StorageError, match="rabbit-0 holds one already"):  # a's claim
        book.plan(lustre("c"), planner(lustre("c"), ["c1"]))
    # a job planned again (a retry) is not kept off its own rabbit
    assert mgt_of(book.plan(lustre("a"), planner(lustre("a"), ["c1"]))[0], "a") == ["rabbit-0"]
    # the watch shows a's Servers as written: it holds the rabbit now, not the claim
    book.seen(MODIFIED, servers_object("a", plan_a, lustre("a")))
    with pytest.raises(StorageError, match="rabbit-0 holds one already"):
        book.plan(lustre("c"), planner(lustre("c"), ["c1"]))
    book.seen(DELETED, servers_object("a", plan_a, lustre("a")))
    assert mgt_of(book.plan(lustre("c"), planner(lustre("c"), ["c1"]))[0], "c") == ["rabbit-0"]
    book.seen(DELETED, servers_object("b", plan_b, lustre("b")))  # b was claimed, never seen
    assert mgt_of(book.plan(lustre("d"), planner(lustre("d"), ["c2"]))[0], "d") == ["rabbit-1"]


def test_a_claim_whose_servers_the_watch_never_saw_goes_when_its_patch_fails():
    book = Placements()
    book.listed()
    plan, _ = book.plan(lustre("a"), planner(lustre("a"), ["c1"]))
    book.settle(plan, False)  # e.g. 404: no Servers, and no watch event will ever come
    assert mgt_of(book.plan(lustre("b"), planner(lustre("b"), ["c1"]))[0], "b") == ["rabbit-0"]


def test_without_a_watch_every_servers_is_listed_when_a_job_needs_it(kubeapi):
    kube = KubeClient.connect(namespace="default", identity="colo", kubeconfig=kubeapi.kubeconfig)
    try:
        other = servers_object("other", plan_servers(lustre("other"), ["c1"], RABBITS))
        other["metadata"]["namespace"] = "elsewhere"  # another instance's namespace
        kubeapi.store.create("namespaces", None, {"metadata": {"name": "elsewhere"}})
        kubeapi.store.create("servers", "elsewhere", other)
        book = Placements()  # no watch: health is not ours
        assert book.must_list(lustre("a"))
        items, _ = kube.list_servers()  # what the handler reads on a worker first
        plan, _ = book.plan(lustre("a"), planner(lustre("a"), ["c1", "c2"]), items)
        assert mgt_of(plan, "a") == ["rabbit-1"]
        book.settle(plan, True)  # no claim is kept: the next list reads what was written
        items, _ = kube.list_servers()
        plan, _ = book.plan(lustre("b"), planner(lustre("b"), ["c1", "c2"]), items)
        assert mgt_of(plan, "b") == ["rabbit-1"]  # b's Servers were never written
        # a job with no exclusive set reads nothing
        xfs = [AllocationNeed("x", ("default", "x"), "xfs", PER_COMPUTE, GIB)]
        assert not book.must_list(xfs)
        assert book.plan(xfs, planner(xfs, ["c1"]))[1] == {}
    finally:
        kube.close()


# ---- the service, on dwssim ------------------------------------------------------------------

LUSTRE = "#DW jobdw type=lustre capacity=1GiB name=lus"


def test_concurrent_lustre_jobs_on_the_same_rabbits_get_their_mgts_on_different_rabbits():
    """Two 2-node Lustre jobs at once, each with a node on both rabbits: the second's MGT
    goes on the rabbit the first's is not on, and both complete; a third, while both hold
    theirs, fails Setup naming the key and the rabbits.  (Each breakdown carries nnf-sos's
    ``lustre-mgt`` key, companions.allocation_sets.)"""
    rabbits = {"rabbit-0": ["compute-01", "compute-03"], "rabbit-1": ["compute-02", "compute-04"]}
    rabbits["rabbit-0"].append("compute-05")
    rabbits["rabbit-1"].append("compute-06")
    with Stack(hosts=6, rabbits=rabbits) as stack:
        assert stack.api is not None
        first = stack.submit(LUSTRE, nnodes=2, runtime=None)
        second = stack.submit(LUSTRE, nnodes=2, runtime=None)
        for jobid in (first, second):
            stack.wait_event(jobid, "start", timeout=60)
        mgts = []
        for jobid in (first, second):
            name = f"{workflow_name(stack.identity, jobid)}-0"
            servers = stack.api.store.get("servers", stack.policy.namespace, name)
            assert {e["name"] for e in servers["spec"]["allocationSets"][0]["storage"]} == set(
                rabbits
            )
            mgts += mgt_of({("default", name): servers["spec"]["allocationSets"]}, name)
            assert colocation.ANNOTATION in servers["metadata"]["annotations"]
        assert sorted(mgts) == ["rabbit-0", "rabbit-1"]
        third = stack.submit(LUSTRE, nnodes=2, runtime=None)
        failed = stack.wait(third, timeout=60)
        assert failed.result != "COMPLETED" and failed.exception is not None
        note = failed.exception["note"]
        assert "exclusive colocation key 'lustre-mgt'" in note and "rabbit-[0-1]" in note
        assert "\n" not in note and stack.left_behind(third) == []
        for jobid in (first, second):
            stack.flux.finish(jobid)
        for jobid in (first, second):
            info = stack.wait(jobid, timeout=60)
            assert (info.result, info.exception) == ("COMPLETED", None)
            assert stack.left_behind(jobid) == []
