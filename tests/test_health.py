# SPDX-License-Identifier: LGPL-3.0-only
"""flux_dws.core.health (pure decisions) and fakeflux's drain model (flux-core's semantics)."""

from __future__ import annotations

import errno

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flux_dws.core import health
from flux_dws.core.health import Failures, RabbitHealth, plan_drains, rabbit_health
from flux_dws.flux.resource import NodeStatus, parse_resource_status
from flux_dws.testing.dwssim.companions import storage_resource
from flux_dws.testing.dwssim.faults import clientmount, storage_status_update
from flux_dws.testing.fakeflux.nodes import DrainError, DrainSet

SERVED = {"c1": "r0", "c2": "r0", "c3": "r1", "c4": "r1"}
HOSTS = ("c1", "c2", "c3", "c4")
RANKS = dict(enumerate(HOSTS))  # rank -> host: one rank per host


def by_rank(drained: dict) -> dict:
    """host -> reason as rank -> reason (one rank per host)."""
    return {HOSTS.index(h): r for h, r in drained.items()}


def by_host(drained) -> dict:
    return {HOSTS[r]: why for r, why in dict(drained).items()}


def plan(seen, drained: dict, hosts=RANKS, **kw):
    return plan_drains(seen, SERVED, hosts, by_rank(drained), **kw)


def storage(rabbit: str, status: str = "Ready", **kw) -> dict:
    obj = storage_resource(rabbit, [h for h, r in SERVED.items() if r == rabbit])
    obj["status"] = storage_status_update(obj, status, **kw)
    return obj


def rabbits(*objs: dict) -> list[RabbitHealth]:
    return [r for r in map(rabbit_health, objs) if r]


# ---- Storage -> RabbitHealth -----------------------------------------------------------------


def test_storage_is_read_with_links_and_state():
    r = rabbit_health(storage("r0", "Degraded", links={"c2": "Offline"}))
    assert (r.name, r.status, r.enabled) == ("r0", "Degraded", True)
    assert r.links == {"c1": "Ready", "c2": "Offline"}
    assert r.down is None
    assert r.link_down("c1") is None
    assert r.link_down("c2") == "rabbit r0 link to c2 is Offline"


@pytest.mark.parametrize(
    "obj",
    [None, 5, "x", {}, {"metadata": {"name": ""}}, {"metadata": {"name": "a\0b"}}, {"metadata": 3}],
)
def test_nameless_or_malformed_storage_is_ignored(obj):
    assert rabbit_health(obj) is None


def test_garbage_status_reads_as_unknown_and_disabled_spec_counts():
    obj = {"metadata": {"name": "r9"}, "spec": {"state": "Disabled"}, "status": {"status": 7}}
    r = rabbit_health(obj)
    assert r.status == "Unknown" and not r.enabled
    assert r.down == "Disabled by an admin (spec.state)"


@given(
    st.recursive(
        st.none() | st.integers() | st.text(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)
    )
)
def test_any_json_never_raises(obj):
    rabbit_health({"metadata": {"name": "r"}, "spec": obj, "status": obj})
    rabbit_health(obj)


# ---- drains --------------------------------------------------------------------------------


def test_offline_rabbit_drains_exactly_its_nodes():
    p = plan(rabbits(storage("r0", "Offline"), storage("r1")), {})
    assert by_host(p.drain) == {
        "c1": "dws: rabbit r0 is Offline",
        "c2": "dws: rabbit r0 is Offline",
    }
    assert p.undrain == ()
    assert dict(p.down_rabbits) == {"r0": "Offline"}


def test_admin_drain_is_never_touched_and_own_drains_are_undone():
    drained = {"c1": "memory errors", "c2": "dws: rabbit r0 is Offline", "c3": "dws: job 7: x"}
    down = plan(rabbits(storage("r0", "Offline"), storage("r1")), drained)
    assert down.empty  # c1 is the admin's, c2 already ours with this reason
    up = plan(rabbits(storage("r0"), storage("r1")), drained)
    assert up.undrain == (1,)  # c2; not c1 (admin), not c3 (a job's failed node)
    assert dict(up.drain) == {}


def test_ranks_that_share_a_hostname_keep_their_own_drains():
    """Two ranks on host c1: an admin drained rank 0, flux-dws rank 1 for its rabbit.  Once
    the rabbit is back only rank 1 is undrained (by rank), never the admin's rank 0."""
    shared = {0: "c1", 1: "c1", 2: "c3"}
    drained = {0: "memory errors", 1: "dws: rabbit r0 is Offline"}
    up = plan_drains(rabbits(storage("r0"), storage("r1")), SERVED, shared, drained)
    assert up.undrain == (1,) and dict(up.drain) == {}
    down = plan_drains(rabbits(storage("r0", "Offline")), SERVED, shared, {0: "admin"})
    assert dict(down.drain) == {1: "dws: rabbit r0 is Offline"}  # rank 0 is the admin's
    # and fakeflux, as flux-core, undrains by rank: the admin's drain of rank 0 stays
    d = DrainSet(("c1", "c1", "c3"), clock=lambda: 1.0)
    d.drain("0", "memory errors")
    d.drain("1", "dws: rabbit r0 is Offline")
    d.undrain("1", mode="update")
    assert {r: x.reason for r, x in d.info.items()} == {0: "memory errors"}
    d.drain("c1", "both", mode="update")  # a hostname: every rank of that host
    assert set(d.info) == {0, 1}
    status = d.status()
    assert status.hosts == ("c1", "c3") and status.drained_hosts() == {"c1": "memory errors"}


def test_changed_reason_is_rewritten_only_on_our_drains():
    drained = {"c1": "dws: rabbit r0 is Offline", "c2": "admin"}
    p = plan(rabbits(storage("r0", "Failed")), drained)
    assert by_host(p.drain) == {"c1": "dws: rabbit r0 is Failed"}


def test_drain_nodes_off_undoes_every_rabbit_drain():
    drained = {"c1": "dws: rabbit r0 is Offline", "c2": "admin"}
    p = plan(rabbits(storage("r0", "Offline")), drained, drain_nodes=False)
    assert p.drain == {} and p.undrain == (0,)
    assert dict(p.down_rabbits) == {"r0": "Offline"}  # still marked down in Fluxion


def test_plan_is_stable_once_applied():
    """Level-triggered: applying a plan and planning again gives nothing to do (no flapping)."""
    seen = rabbits(storage("r0", "Degraded", links={"c2": "Offline"}), storage("r1", "Fenced"))
    drained = by_rank({"c4": "admin"})
    p = plan_drains(seen, SERVED, RANKS, drained)
    after = {**drained, **p.drain}
    for rank in p.undrain:
        after.pop(rank)
    assert plan_drains(seen, SERVED, RANKS, after).empty
    assert set(by_host(p.drain)) == {"c2", "c3"}


def test_hosts_outside_flux_are_never_drained():
    p = plan_drains(rabbits(storage("r0", "Offline")), SERVED, {0: "c1"}, {})
    assert dict(p.drain) == {0: "dws: rabbit r0 is Offline"}


def test_a_storage_nnf_has_not_reported_keeps_its_pool_down_but_drains_nothing():
    """A fresh system: DWS creates each Storage with no status; nnf-sos fills it later."""
    bare = storage_resource("r0", ["c1", "c2"])
    del bare["status"]
    starting = storage("r1", "Starting", links={"c3": "Unknown", "c4": "Unknown"})
    p = plan(rabbits(bare, starting), {})
    assert p.drain == {}
    assert set(p.down_rabbits) == {"r0", "r1"}  # no new job gets their storage yet
    unknown = storage("r0", "Unknown")
    assert plan(rabbits(unknown), {}).drain == {}
    # an earlier rabbit drain of ours is undone while NNF has not told
    ours = {"c1": health.rabbit_reason("rabbit r0 is Offline")}
    assert plan(rabbits(bare), ours).undrain == (0,)


def test_fenced_and_degraded_follow_dws():
    # nnf-sos marks a STONITH'd rabbit Degraded + rebootRequired: down until rebooted
    fenced = storage("r0", "Degraded")
    fenced["status"]["rebootRequired"] = True
    fenced["status"]["message"] = "Storage node requires reboot to recover from STONITH event"
    (r,) = rabbits(fenced)
    assert r.down and "reboot required" in r.down and "STONITH" in r.down
    plain = storage("r1", "Degraded")
    p = plan(rabbits(fenced, plain), {})
    assert set(by_host(p.drain)) == {"c1", "c2"} and set(p.down_rabbits) == {"r0"}
    # a Fenced rabbit is down; a Fenced compute link drains that node alone
    p = plan(rabbits(storage("r0", "Fenced")), {})
    assert set(by_host(p.drain)) == {"c1", "c2"}
    link = storage("r1", "Ready", links={"c4": "Fenced"})
    assert by_host(plan(rabbits(link), {}).drain) == {"c4": "dws: rabbit r1 link to c4 is Fenced"}


def test_nnf_rabbit_reasons_are_in_our_drain_reasons():
    disabled = storage("r0", "Ready")
    disabled["spec"]["state"] = "Disabled"
    disabled["metadata"]["annotations"] = {"disable_reason": "replacing drive 3"}
    drained = storage("r1", "Drained")
    drained["metadata"]["annotations"] = {"drain_reason": "firmware\nupdate"}
    shown = by_host(plan(rabbits(disabled, drained), {}).drain)
    assert shown["c1"] == "dws: rabbit r0 is Disabled by an admin (spec.state): replacing drive 3"
    assert shown["c3"].startswith("dws: rabbit r1 is Drained: firmware")
    assert "\n" not in shown["c3"]


# ---- SystemStatus --------------------------------------------------------------------------


def test_system_status_follows_nnf_rule():
    """nnf-sos skips the unmount of a Disabled compute (nnf_access_controller.go
    checkOfflineOrFencedCompute): only an offline broker or our own drain for a failed
    unmount or a fence may make a node Disabled."""
    drained = {
        "c1": "bad DIMM",  # an admin's
        "c2": health.job_reason(1, "unmount failed (workflow w Teardown failed)"),
        "c3": health.rabbit_reason("rabbit r0 is Offline"),
        "c4": health.job_reason(2, "fenced during the job (workflow w: ...)"),
        "c5": health.job_reason(3, "Setup failed on this node: x"),
        "c6": "dws: jobby: unmount failed",  # not ours in form: not a job drain
    }
    hosts = (*HOSTS, "c5", "c6", "c7")
    wanted = health.node_states(hosts, drained, offline={"c7"})
    assert {h for h, s in wanted.items() if s == "Disabled"} == {"c2", "c4", "c7"}


def test_teardown_failures_are_the_nodes_still_mounted():
    def cm(node, state, error=None):
        status = {"mounts": [{"state": state}]}
        if error:
            status["error"] = {"userMessage": error}
        return {"spec": {"node": node}, "status": status}

    mounts = [cm("c1", "unmounted"), cm("c2", "mounted"), cm("c3", "unmounted", "busy"), 5]
    mounts.append(cm("elsewhere", "mounted"))
    found = health.unmount_failures(mounts, ("c1", "c2", "c3", "c4"), "Teardown")
    assert found.state == "Teardown" and found.nodes == ("c2", "c3")
    assert found.causes["c3"] == "unmount failed: busy"


def test_fenced_nodes_come_from_nnf_sos_message():
    text = "Workflow failed: compute nodes [c1 c3 other] were fenced during the job"
    assert health.fenced_nodes(text, ("c1", "c2", "c3")) == ("c1", "c3")
    assert health.fenced_nodes("compute nodes c1 were fenced", ("c1",)) == ()
    assert health.fenced_nodes(None, ("c1",)) == ()


def test_system_status_patch_is_minimal():
    wanted = health.node_states(
        HOSTS, drained={"c2": health.job_reason(1, "unmount failed")}, offline={"c3"}
    )
    assert wanted == {"c1": "Enabled", "c2": "Disabled", "c3": "Disabled", "c4": "Enabled"}
    current = {"data": {"nodes": {"c1": "Enabled", "c2": "Enabled", "other": "Disabled"}}}
    patch = health.system_status_patch(current, wanted)
    assert patch == {"data": {"nodes": {"c2": "Disabled", "c3": "Disabled", "c4": "Enabled"}}}
    done = {"data": {"nodes": {**current["data"]["nodes"], **patch["data"]["nodes"]}}}
    assert health.system_status_patch(done, wanted) is None
    assert health.system_status_patch(None, {"c1": "Enabled"}) == {
        "data": {"nodes": {"c1": "Enabled"}}
    }
    assert health.system_status_patch({"data": "junk"}, {}) is None


# ---- failure tolerance ---------------------------------------------------------------------


def test_tolerance_counts_nodes_and_never_tolerates_lustre():
    f = Failures("PreRun", ("c2",), {"c2": "mount failed"})
    assert health.tolerate(f, 1, HOSTS) is None
    assert "more than dw_failure_tolerance=0: c2" in health.tolerate(f, 0, HOSTS)
    lustre = Failures("Setup", ("c2",), lustre=True)
    assert "Lustre" in health.tolerate(lustre, 4, HOSTS)
    assert "every node" in health.tolerate(Failures("PreRun", ("c1",)), 1, ("c1",))


def test_mount_failures_from_clientmounts():
    wf = {"metadata": {"name": "w", "namespace": "default", "uid": "u"}}
    mounts = [clientmount(wf, 0, h, "/mnt", h == "c3") for h in HOSTS]
    mounts.append({"spec": {"node": "elsewhere"}, "status": {}})  # not the job's: ignored
    mounts.append("junk")
    f = health.mount_failures(mounts, HOSTS)
    assert f.nodes == ("c3",)
    assert "could not mount file system on c3" in f.causes["c3"]


def test_setup_failures_name_the_rabbits_nodes_and_lustre():
    servers = {
        "spec": {"allocationSets": [{"label": "ost", "storage": [{"name": "r0"}, {"name": "r1"}]}]},
        "status": {
            "allocationSets": [{"label": "ost", "storage": {"r1": {"allocationSize": 1}}}],
            "error": "could not create storage on rabbit(s) r0",
        },
    }
    f = health.setup_failures([servers, None], SERVED, HOSTS)
    assert f.nodes == ("c1", "c2") and f.lustre
    assert "r0" in f.causes["c1"]


# ---- flux-core's resource.status and drain semantics -----------------------------------------


def test_resource_status_maps_ranks_to_hosts():
    response = {
        "R": {"execution": {"R_lite": [{"rank": "0-3"}], "nodelist": ["c[1-4]"]}},
        "drain": {"1,3": {"timestamp": 1.0, "reason": "dws: rabbit r0 is Offline"}},
        "offline": "2",
    }
    status = parse_resource_status(response, lambda lists: ["c1", "c2", "c3", "c4"])
    assert dict(status.drained) == {1: "dws: rabbit r0 is Offline", 3: "dws: rabbit r0 is Offline"}
    assert status.drained_hosts() == {
        "c2": "dws: rabbit r0 is Offline",
        "c4": "dws: rabbit r0 is Offline",
    }
    assert status.offline == {2} and status.offline_hosts() == {"c3"}
    for bad in ("3-1", "0-²", "0-99999999999"):  # ValueError (HostlistError), caught by status()
        with pytest.raises(ValueError):
            parse_resource_status({**response, "offline": bad}, lambda lists: list(HOSTS))


def test_resource_status_with_ranks_sharing_a_hostname():
    response = {
        "R": {"execution": {"R_lite": [{"rank": "0-2"}], "nodelist": ["c1,c1,c3"]}},
        "drain": {"0": {"reason": "admin"}, "1": {"reason": "dws: rabbit r0 is Offline"}},
    }
    status = parse_resource_status(response, lambda lists: ["c1", "c1", "c3"])
    assert status == NodeStatus({0: "c1", 1: "c1", 2: "c3"}, {0: "admin", 1: status.drained[1]})
    assert status.hosts_of([1]) == ["c1"] and status.hosts == ("c1", "c3")


def test_drainset_follows_flux_core():
    d = DrainSet(HOSTS, clock=lambda: 5.0)
    d.drain("c1", "admin")
    with pytest.raises(DrainError) as caught:
        d.drain("c1,c2", "again")
    assert caught.value.errno == errno.EEXIST
    d.drain("c1,c2", "update", mode="update")
    assert d.info[0].reason == "admin" and d.info[1].reason == "update"
    d.drain("0", "forced", mode="overwrite")  # an idset of ranks, as flux-core takes too
    assert d.info[0].reason == "forced"
    with pytest.raises(DrainError) as caught:
        d.undrain("c3")
    assert caught.value.errno == errno.EINVAL
    d.undrain("c1,c3", mode="update")
    assert set(d.info) == {1}
    for bad in ("nosuch", "7", "0-²"):
        with pytest.raises(DrainError):
            d.drain(bad, "x")


def test_ssd_parts_come_from_the_rabbit_graph():
    from flux_dws.core.rabbits import ssd_parts

    def vertex(kind: str, path: str) -> dict:
        return {"metadata": {"type": kind, "paths": {"containment": path}, "size": 10}}

    R = {
        "scheduling": {
            "graph": {
                "nodes": [
                    vertex("cluster", "/cluster0"),
                    vertex("chassis", "/cluster0/rabbit-0"),
                    vertex("ssd", "/cluster0/rabbit-0/ssd1"),
                    vertex("ssd", "/cluster0/rabbit-0/ssd0"),
                    vertex("ssd", "/cluster0/rabbit-1/ssd2"),
                    vertex("node", "/cluster0/rabbit-0/c1"),
                    "junk",
                ]
            }
        }
    }
    assert ssd_parts(R) == {
        "rabbit-0": (("/cluster0/rabbit-0/ssd0", 10), ("/cluster0/rabbit-0/ssd1", 10)),
        "rabbit-1": (("/cluster0/rabbit-1/ssd2", 10),),
    }
    assert ssd_parts(None) == {} and ssd_parts({"scheduling": 5}) == {}


def test_parts_to_hold_cover_the_missing_bytes_from_the_end():
    from flux_dws.core.rabbits import GIB, parts_to_hold

    parts = [(f"/c/r/ssd{i}", 10) for i in range(4)]
    assert parts_to_hold(parts, 0) == ()
    assert parts_to_hold(parts, 1) == ("/c/r/ssd3",)
    assert parts_to_hold(parts, 10 * GIB) == ("/c/r/ssd3",)
    assert parts_to_hold(parts, 10 * GIB + 1) == ("/c/r/ssd2", "/c/r/ssd3")
    assert len(parts_to_hold(parts, 1000 * GIB)) == 4


@pytest.mark.realflux
def test_on_real_flux_ranks_sharing_a_hostname_keep_their_own_drains():
    """flux-core itself: ranks 0 and 1 both on host c1; the admin drained rank 0, flux-dws
    rank 1 for rabbit r0.  r0 is back: the plan's undrain (an idset) frees rank 1 only."""
    from flux_dws.testing.fluxsetup import plain_R
    from flux_dws.testing.realflux import RealFlux

    hosts = ["c1", "c1", "c3"]
    flux = RealFlux(hosts, {"instance": "shared"}, R=plain_R(hosts)).start()
    try:
        flux.drain("0", "memory errors")
        flux.drain("1", "dws: rabbit r0 is Offline", "update")

        def status() -> NodeStatus:
            from flux.hostlist import Hostlist

            response = flux._handle.rpc("resource.status", {}, nodeid=0).get()
            return parse_resource_status(response, lambda lists: list(Hostlist(",".join(lists))))

        before = status()
        assert dict(before.ranks) == {0: "c1", 1: "c1", 2: "c3"}
        p = plan_drains(rabbits(storage("r0"), storage("r1")), SERVED, before.ranks, before.drained)
        assert p.undrain == (1,)
        flux.undrain("1", "update")
        assert dict(status().drained) == {0: "memory errors"}
    finally:
        flux.stop()


# ---- a Storage event that changes only what health does not read ----------------------------


@pytest.mark.parametrize(
    "change", ["free", "link", "status", "message", "disabled", "annotation", "name"]
)
def test_storage_read_again_only_when_what_health_reads_changed(change: str) -> None:
    import copy

    from flux_dws.service.healthwatch import reads_same

    before = storage("r0")
    after = copy.deepcopy(before)
    if change == "free":
        after["status"]["capacity"] -= 10**9
        after["status"]["devices"][0]["capacity"] -= 10**9
    elif change == "link":
        after["status"] = storage_status_update(before, "Ready", links={"c1": "Offline"})
    elif change == "status":
        after["status"] = storage_status_update(before, "Degraded")
    elif change == "message":
        after["status"]["message"] = "fenced"
    elif change == "disabled":
        after["spec"]["state"] = "Disabled"
    elif change == "annotation":
        after["metadata"]["annotations"] = {"drain_reason": "maintenance"}
    else:
        after["metadata"]["name"] = "r1"
    same = reads_same(before, after)
    assert same == (change == "free")
    assert same <= (rabbit_health(before) == rabbit_health(after))
