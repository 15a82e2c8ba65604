# SPDX-License-Identifier: LGPL-3.0-only
"""flux_dws.k8s over real HTTP, with the real kubernetes client, against kubeapi.

Every fault the adapter claims to survive is injected here: 5xx/429 with latency, dropped
connections, conflicts, cut watch streams, 410 Gone and an unreachable server.  No test
asserts on wall time; waits are for conditions, bounded so a bug fails instead of hanging.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import socket
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from waiting import wait_for

from flux_dws.core.identity import FINALIZER, INSTANCE_LABEL, JOBID_LABEL, WLM_ID, workflow_name
from flux_dws.core.states import STATE_ORDER, State
from flux_dws.k8s import (
    ApiVersions,
    KubeClient,
    KubeError,
    KubeSetupError,
    KubeWorker,
    WorkflowRejected,
    WorkflowWatch,
    container_timeouts,
)
from flux_dws.k8s.config import _AtMostEvery
from flux_dws.k8s.resources import (
    DEFAULT_CONTAINER_TIMEOUT,
    DWS_GROUP,
    ServedGroup,
    choose_versions,
)
from flux_dws.k8s.watch import Delivered, qualified_name
from flux_dws.testing.kubeapi import ApiError, KubeApi

NS = "default"
DIRECTIVES = ["#DW jobdw type=xfs capacity=10GiB name=scratch"]
_identities = (f"t{i}" for i in itertools.count())


@pytest.fixture
def api(kubeapi):
    """conftest's KubeApi: a fresh server and store for each test."""
    return kubeapi


@pytest.fixture
def kubeconfig(kubeapi):
    return kubeapi.kubeconfig


@pytest.fixture
def kube(api, kubeconfig):
    """A client with its own instance identity, as two instances sharing a namespace have."""
    client = KubeClient.connect(
        namespace=NS, identity=next(_identities), kubeconfig=kubeconfig, timeout=10.0
    )
    client.backoff_max = 0.2  # keep retries quick; the bound is what is under test
    yield client
    client.close()


def store_workflow(api, kube, jobid):
    return api.store.get("workflows", NS, workflow_name(kube.identity, jobid))


def mark_ready(api, name, state: State):
    """Play DWS: the workflow reached ``state`` and every driver is done."""
    return api.store.patch(
        "workflows",
        NS,
        name,
        {"status": {"state": state.value, "ready": True, "status": "Completed"}},
    )


def make_computes(api, name):
    api.store.create(
        "computes",
        NS,
        {"apiVersion": "dataworkflowservices.github.io/v1alpha7", "kind": "Computes",
         "metadata": {"name": name}, "data": []},
    )  # fmt: skip


# -- connecting ------------------------------------------------------------------------


def test_connect_discovers_served_versions(kube):
    assert kube.versions == ApiVersions(workflow="v1alpha7", nnf="v1alpha10")


def test_admin_override_wins_over_discovery(api, kubeconfig):
    client = KubeClient.connect(
        namespace=NS, identity="override", kubeconfig=kubeconfig, workflow_version="v1alpha6"
    )
    try:
        assert client.versions.workflow == "v1alpha6"
        created = client.create_workflow(jobid=1, userid=1000, groupid=100, directives=DIRECTIVES)
        assert created["metadata"]["name"] == workflow_name("override", 1)
    finally:
        client.delete_workflow(workflow_name("override", 1))
        client.close()


def test_unserved_workflow_version_is_one_setup_error(kubeconfig):
    with pytest.raises(KubeSetupError) as info:
        KubeClient.connect(
            namespace=NS, identity="x", kubeconfig=kubeconfig, workflow_version="v1alpha2"
        )
    assert "v1alpha2" in str(info.value)
    assert "\n" not in str(info.value)


def test_cluster_without_dws_is_one_setup_error(tmp_path):
    with KubeApi(groups=()) as bare:
        path = bare.write_kubeconfig(str(tmp_path / "kubeconfig"))
        with pytest.raises(KubeSetupError) as info:
            KubeClient.connect(namespace=NS, identity="x", kubeconfig=path)
    assert "is DWS installed" in str(info.value)
    assert "\n" not in str(info.value)


def test_cluster_without_nnf_has_no_container_profiles(tmp_path):
    with KubeApi(groups=(DWS_GROUP,)) as api:
        path = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        client = KubeClient.connect(namespace=NS, identity="x", kubeconfig=path)
        try:
            assert client.versions == ApiVersions(workflow="v1alpha7", nnf=None)
            directives = ["#DW container name=c1 profile=p1"]
            workflow = client.create_workflow(jobid=1, userid=1, groupid=1, directives=directives)
            assert client.read_container_profile(workflow) is None
        finally:
            client.close()


def test_only_unserved_dws_versions_is_one_setup_error():
    served = {DWS_GROUP: ServedGroup(versions=("v1alpha4", "v1alpha5"))}
    with pytest.raises(KubeSetupError) as info:
        choose_versions(served)
    assert "v1alpha4" in str(info.value) and "workflow-version" in str(info.value)
    assert not info.value.transient


def test_unreachable_api_server_is_one_setup_error(api, tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = tmp_path / "kubeconfig"
    api.write_kubeconfig(str(path))
    path.write_text(path.read_text().replace(api.url, f"http://127.0.0.1:{port}"))
    with pytest.raises(KubeSetupError) as info:
        KubeClient.connect(namespace=NS, identity="x", kubeconfig=str(path), retries=1)
    assert "\n" not in str(info.value)
    assert info.value.transient  # worth retrying: the service waits, it does not exit 78


def test_missing_kubeconfig_is_one_setup_error(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(KubeSetupError) as info:
        KubeClient.connect(namespace=NS, identity="x", kubeconfig=str(missing))
    assert str(missing) in str(info.value)
    assert not info.value.transient


# -- workflow requests -----------------------------------------------------------------


def test_create_workflow_carries_ownership_and_job_ids(api, kube):
    kube.create_workflow(jobid=42, userid=1001, groupid=101, directives=DIRECTIVES)
    stored = store_workflow(api, kube, 42)
    meta, spec = stored["metadata"], stored["spec"]
    assert meta["labels"][INSTANCE_LABEL] == kube.identity
    assert meta["labels"][JOBID_LABEL] == "42"
    assert meta["finalizers"] == [FINALIZER]
    assert spec["desiredState"] == "Proposal"
    assert (spec["wlmID"], spec["jobID"], spec["userID"], spec["groupID"]) == (
        WLM_ID,
        "42",
        1001,
        101,
    )
    assert spec["dwDirectives"] == DIRECTIVES


def test_flux_sized_job_id_is_accepted(api, kube):
    jobid = 2**63 + 12345  # Flux ids are 64-bit; Kubernetes ints in int-or-string are not
    kube.create_workflow(jobid=jobid, userid=1, groupid=1, directives=DIRECTIVES)
    assert store_workflow(api, kube, jobid)["spec"]["jobID"] == str(jobid)


def test_create_is_idempotent_for_our_own_workflow(kube):
    first = kube.create_workflow(jobid=7, userid=1, groupid=1, directives=DIRECTIVES)
    again = kube.create_workflow(jobid=7, userid=1, groupid=1, directives=DIRECTIVES)
    assert again["metadata"]["uid"] == first["metadata"]["uid"]


def test_create_refuses_a_same_named_workflow_that_is_not_ours(api, kube):
    name = workflow_name(kube.identity, 8)
    api.store.create(
        "workflows",
        NS,
        {"metadata": {"name": name, "labels": {INSTANCE_LABEL: "someone-else"}},
         "spec": {"desiredState": "Proposal", "wlmID": "flux", "jobID": 8, "userID": 1,
                  "groupID": 1, "dwDirectives": DIRECTIVES}},
    )  # fmt: skip
    with pytest.raises(KubeError) as info:
        kube.create_workflow(jobid=8, userid=1, groupid=1, directives=DIRECTIVES)
    assert not isinstance(info.value, WorkflowRejected)
    assert info.value.status == 409
    assert name in str(info.value)


def test_webhook_rejection_is_a_user_error_with_the_webhook_message(api, kube):
    bad = ["#DW nosuchcommand x=y"]
    with pytest.raises(ApiError) as direct:  # what the webhook itself says about it
        api.store.create(
            "workflows",
            NS,
            {"metadata": {"name": "probe"}, "spec": {"desiredState": "Proposal", "wlmID": "flux",
             "jobID": 1, "userID": 1, "groupID": 1, "dwDirectives": bad}},
        )  # fmt: skip
    with pytest.raises(WorkflowRejected) as info:
        kube.create_workflow(jobid=9, userid=1, groupid=1, directives=bad)
    assert info.value.message in direct.value.message
    assert "admission webhook" not in info.value.message
    assert "nosuchcommand" in info.value.message


def test_illegal_state_move_is_rejected_with_the_webhook_message(api, kube):
    kube.create_workflow(jobid=10, userid=1, groupid=1, directives=DIRECTIVES)
    name = kube.workflow_name(10)
    with pytest.raises(WorkflowRejected) as info:
        kube.set_desired_state(name, State.DATAIN)  # Proposal is not ready: may not advance
    assert info.value.message
    assert store_workflow(api, kube, 10)["spec"]["desiredState"] == "Proposal"


def test_state_walk_and_hurried_teardown(api, kube):
    kube.create_workflow(jobid=11, userid=1, groupid=1, directives=DIRECTIVES)
    name = kube.workflow_name(11)
    for previous, state in zip(STATE_ORDER, STATE_ORDER[1:4]):
        mark_ready(api, name, previous)
        assert kube.set_desired_state(name, state)["spec"]["desiredState"] == state.value
    kube.set_desired_state(name, State.TEARDOWN, hurry=True)
    spec = store_workflow(api, kube, 11)["spec"]
    assert (spec["desiredState"], spec["hurry"]) == ("Teardown", True)


def test_hurry_outside_teardown_is_refused_before_any_request(kube):
    before = kube.request_counts()
    with pytest.raises(ValueError):
        kube.set_desired_state("whatever", State.PRERUN, hurry=True)
    assert kube.request_counts() == before


def test_patch_computes_replaces_the_host_list(api, kube):
    kube.create_workflow(jobid=12, userid=1, groupid=1, directives=DIRECTIVES)
    name = kube.workflow_name(12)
    make_computes(api, name)
    kube.patch_computes(name, ["node1", "node2", "node3"])
    kube.patch_computes(name, ["node4"])
    assert api.store.get("computes", NS, name)["data"] == [{"name": "node4"}]


def test_breakdowns_and_servers(api, kube):
    second = "#DW jobdw type=xfs capacity=10GiB name=scratch2"  # DWS: jobdw names are unique
    kube.create_workflow(jobid=13, userid=1, groupid=1, directives=[*DIRECTIVES, second])
    name = kube.workflow_name(13)
    refs = []
    for index in (1, 0):  # status order, not name order, is what counts
        bd_name = f"{name}-{index}"
        api.store.create(
            "directivebreakdowns",
            NS,
            {"metadata": {"name": bd_name}, "spec": {"directive": DIRECTIVES[0], "userID": 1},
             "status": {"ready": True, "storage": {"reference": {"name": bd_name,
                        "namespace": NS}}}},
        )  # fmt: skip
        api.store.create("servers", NS, {"metadata": {"name": bd_name}, "spec": {}})
        refs.append({"name": bd_name, "namespace": NS})
    api.store.patch("workflows", NS, name, {"status": {"directiveBreakdowns": refs}})
    workflow = kube.get_workflow(name)
    breakdowns = kube.read_breakdowns(workflow)
    assert [b["metadata"]["name"] for b in breakdowns] == [r["name"] for r in refs]
    sets = [{"label": "xfs", "allocationSize": 1 << 30, "storage": [{"name": "rabbit-1",
             "allocationCount": 1}]}]  # fmt: skip
    kube.patch_servers(refs[0]["name"], NS, sets)
    assert api.store.get("servers", NS, refs[0]["name"])["spec"]["allocationSets"] == sets
    api.store.delete("directivebreakdowns", NS, refs[1]["name"])
    with pytest.raises(KubeError) as info:
        kube.read_breakdowns(workflow)
    assert info.value.status == 404 and refs[1]["name"] in str(info.value)


def test_system_configuration(api, kube):
    if not _exists(api, "systemconfigurations", "default", "default"):
        assert kube.read_system_configuration() is None
        api.store.create(
            "systemconfigurations",
            "default",
            {"metadata": {"name": "default"}, "spec": {"storageNodes": [{"name": "rabbit-1"}]}},
        )
    expected = api.store.get("systemconfigurations", "default", "default")
    assert kube.read_system_configuration()["spec"] == expected["spec"]


def _exists(api, plural, namespace, name) -> bool:
    try:
        api.store.get(plural, namespace, name)
    except ApiError:
        return False
    return True


def test_pinned_container_profile_and_its_timeouts(api, kube):
    directives = [DIRECTIVES[0], "#DW container name=c1 profile=red-rock DW_JOB_xy=scratch"]
    kube.create_workflow(jobid=14, userid=1, groupid=1, directives=directives)
    name = kube.workflow_name(14)
    workflow = kube.get_workflow(name)
    assert kube.read_container_profile(workflow) is None  # not pinned yet
    api.store.create(
        "nnfcontainerprofiles",
        NS,
        {"metadata": {"name": f"{name}-1"}, "data": {"pinned": True, "preRunTimeoutSeconds": 17}},
    )
    profile = kube.read_container_profile(workflow)
    assert profile["metadata"]["name"] == f"{name}-1"
    timeouts = container_timeouts(profile)
    assert (timeouts.prerun, timeouts.postrun) == (17, DEFAULT_CONTAINER_TIMEOUT)


def test_no_container_directive_means_no_profile_request(kube):
    kube.create_workflow(jobid=15, userid=1, groupid=1, directives=DIRECTIVES)
    workflow = kube.get_workflow(kube.workflow_name(15))
    before = kube.request_counts()
    assert kube.read_container_profile(workflow) is None
    assert kube.request_counts() == before


def test_read_token(api, kube):
    token = "s3cret-token"
    api.store.create(
        "secrets",
        NS,
        {"metadata": {"name": "wf-token"}, "data": {"token": base64.b64encode(token.encode())
         .decode()}},
    )  # fmt: skip
    assert kube.read_token(NS, "wf-token") == token
    assert kube.read_token(NS, "no-such-secret") is None


def test_delete_removes_only_our_finalizer(api, kube):
    kube.create_workflow(jobid=16, userid=1, groupid=1, directives=DIRECTIVES)
    name = kube.workflow_name(16)
    kube.delete_workflow(name)
    assert not _exists(api, "workflows", NS, name)
    kube.delete_workflow(name)  # already gone: success

    kube.create_workflow(jobid=17, userid=1, groupid=1, directives=DIRECTIVES)
    name = kube.workflow_name(17)
    api.store.patch(
        "workflows", NS, name, {"metadata": {"finalizers": [FINALIZER, "other.io/keep"]}}
    )
    kube.delete_workflow(name)
    left = api.store.get("workflows", NS, name)  # the other controller still holds it
    assert left["metadata"]["finalizers"] == ["other.io/keep"]
    assert left["metadata"].get("deletionTimestamp")


# -- faults ----------------------------------------------------------------------------


def test_conflicts_are_reread_and_retried(api, kube):
    kube.create_workflow(jobid=18, userid=1, groupid=1, directives=DIRECTIVES)
    name = kube.workflow_name(18)
    api.faults.set(verbs={"patch"})
    api.faults.fail_next(2, code=409)
    before = kube.request_counts()
    kube.delete_workflow(name)
    assert not _exists(api, "workflows", NS, name)
    spent = Counter(kube.request_counts()) - Counter(before)
    assert spent["patch"] == 3 and spent["get"] == 3  # each conflict: re-read, re-patch

    kube.create_workflow(jobid=19, userid=1, groupid=1, directives=DIRECTIVES)
    name = kube.workflow_name(19)
    api.faults.fail_next(1, code=409)
    kube.set_desired_state(name, State.TEARDOWN)
    assert kube.get_workflow(name)["spec"]["desiredState"] == "Teardown"


def test_lifecycles_survive_5xx_429_drops_and_latency(api, kube):
    api.faults.set(latency=0.002, error_rate=0.1, drop_rate=0.02, retry_after=0)
    names = []
    for jobid in range(100, 108):
        kube.create_workflow(jobid=jobid, userid=1, groupid=1, directives=DIRECTIVES)
        name = kube.workflow_name(jobid)
        names.append(name)
        make_computes(api, name)
        for previous, state in zip(STATE_ORDER, STATE_ORDER[1:]):
            mark_ready(api, name, previous)
            kube.set_desired_state(name, state)
            if state is State.SETUP:
                kube.patch_computes(name, ["node1"])
        kube.delete_workflow(name)
    api.faults.clear()
    assert kube.list_workflows()[0] == []
    counts = kube.request_counts()
    minimal = len(names) * (1 + 6 + 1 + 1 + 1 + 1)  # create, states, computes, get, patch, delete
    assert sum(counts.values()) - counts.get("list", 0) > minimal  # faults were met and retried


def test_retries_are_bounded(api, kube):
    api.faults.set(error_rate=1.0, error_codes=(503,))
    kube.retries = 2
    before = kube.request_counts()
    with pytest.raises(KubeError) as info:
        kube.get_workflow("anything")
    assert info.value.status == 503
    assert (Counter(kube.request_counts()) - Counter(before))["get"] == 3


def test_a_hanging_request_times_out_and_is_retried_a_bounded_number_of_times(api, kube):
    api.faults.set(latency=1.0)  # every answer comes later than the client waits
    kube.timeout, kube.retries = 0.2, 1
    before = kube.request_counts()
    with pytest.raises(KubeError) as info:
        kube.get_workflow("anything")
    assert "Timeout" in str(info.value)
    assert (Counter(kube.request_counts()) - Counter(before))["get"] == 2


def test_client_errors_are_not_retried(kube):
    before = kube.request_counts()
    with pytest.raises(KubeError) as info:
        kube.set_desired_state("no-such-workflow", State.TEARDOWN)
    assert info.value.status == 404
    assert (Counter(kube.request_counts()) - Counter(before))["patch"] == 1


# -- the watch -------------------------------------------------------------------------


class Recorder:
    def __init__(self):
        self.events: list[tuple[str, str, str]] = []  # (kind, name, resourceVersion)
        self.health: list[bool] = []
        self.lock = threading.Lock()

    def on_event(self, kind, obj):
        meta = obj["metadata"]
        with self.lock:
            self.events.append((kind, meta["name"], meta["resourceVersion"]))

    def on_health(self, connected, since):
        assert since > 0
        with self.lock:
            self.health.append(connected)

    def seen(self, kind, name, rv=None):
        with self.lock:
            return any(
                e[0] == kind and e[1] == name and (rv is None or e[2] == rv) for e in self.events
            )

    def versions(self):
        with self.lock:
            return [e[2] for e in self.events]


@pytest.fixture
def watched(kube):
    recorder = Recorder()
    watch = WorkflowWatch(
        kube,
        recorder.on_event,
        on_health=recorder.on_health,
        backoff_max=0.2,
        backoff_base=0.02,
        watch_timeout=30,
    )
    watch.start()
    wait_for(lambda: recorder.health == [True], what="the watch to connect")
    yield watch, recorder
    watch.stop()


def test_watch_lists_existing_then_delivers_each_change_once(api, kube, kubeconfig):
    kube.create_workflow(jobid=20, userid=1, groupid=1, directives=DIRECTIVES)
    recorder = Recorder()
    watch = WorkflowWatch(kube, recorder.on_event, on_health=recorder.on_health)
    watch.start()
    try:
        name = kube.workflow_name(20)
        wait_for(lambda: recorder.seen("ADDED", name), what="ADDED from the initial list")
        written = []
        written.append(mark_ready(api, name, State.PROPOSAL)["metadata"]["resourceVersion"])
        written.append(kube.set_desired_state(name, State.SETUP)["metadata"]["resourceVersion"])
        kube.delete_workflow(name)
        wait_for(lambda: recorder.seen("DELETED", name), what="DELETED")
        versions = recorder.versions()
        assert len(versions) == len(set(versions))
        assert all(rv in versions for rv in written)
        # another instance's workflow is never delivered
        other = KubeClient.connect(namespace=NS, identity="other", kubeconfig=kubeconfig)
        other.create_workflow(jobid=20, userid=1, groupid=1, directives=DIRECTIVES)
        other.close()
        kube.create_workflow(jobid=21, userid=1, groupid=1, directives=DIRECTIVES)
        wait_for(lambda: recorder.seen("ADDED", kube.workflow_name(21)), what="ours")
        assert not any(e[1] == workflow_name("other", 20) for e in recorder.events)
    finally:
        watch.stop()


def test_watch_survives_cut_streams_without_missing_or_repeating(api, kube, watched):
    watch, recorder = watched
    kube.create_workflow(jobid=30, userid=1, groupid=1, directives=DIRECTIVES)
    name = kube.workflow_name(30)
    written = []
    for i in range(30):
        obj = api.store.patch("workflows", NS, name, {"metadata": {"annotations": {"i": str(i)}}})
        written.append(obj["metadata"]["resourceVersion"])
        if i % 5 == 4:  # cut a live stream, then keep writing while the watch reconnects
            wait_for(lambda: written[-1] in recorder.versions(), what="a live stream")
            api.faults.cut_watches(graceful=bool(i % 10 == 9))
    wait_for(lambda: written[-1] in recorder.versions(), what="the last write")
    delivered = [rv for kind, n, rv in recorder.events if n == name and kind == "MODIFIED"]
    assert delivered == written  # every write, once, in order
    assert kube.request_counts()["list"] == 1 + 1  # connect's probe + the initial list
    wait_for(lambda: kube.request_counts()["watch"] >= 1 + 6, what="a reconnect after each cut")


def test_watch_recovers_from_410_with_one_relist(api, kube, watched):
    watch, recorder = watched
    names = []
    for jobid in (40, 41, 42):
        kube.create_workflow(jobid=jobid, userid=1, groupid=1, directives=DIRECTIVES)
        names.append(kube.workflow_name(jobid))
    wait_for(lambda: all(recorder.seen("ADDED", n) for n in names), what="three ADDED")
    lists_before = kube.request_counts()["list"]

    api.faults.set(error_rate=1.0, error_codes=(503,))  # the API goes away ...
    api.faults.cut_watches()
    wait_for(lambda: recorder.health[-1] is False, what="the watch to notice the outage")
    last_seen_1 = _last_rv(recorder, names[1])
    changed = api.store.patch("workflows", NS, names[0], {"metadata": {"annotations": {"a": "b"}}})
    api.store.patch("workflows", NS, names[1], {"metadata": {"finalizers": []}})
    api.store.delete("workflows", NS, names[1])
    kube_added = api.store.create(
        "workflows",
        NS,
        {"metadata": {"name": kube.workflow_name(43), "labels": {INSTANCE_LABEL: kube.identity}},
         "spec": {"desiredState": "Proposal", "wlmID": "flux", "jobID": "43", "userID": 1,
                  "groupID": 1, "dwDirectives": DIRECTIVES}},
    )  # fmt: skip
    api.store.compact()  # ... and its history is gone: resuming now means 410
    mark = len(recorder.events)
    api.faults.clear()

    wait_for(lambda: recorder.health[-1] is True, what="the watch to reconnect")
    wait_for(lambda: recorder.seen("ADDED", kube.workflow_name(43)), what="the relist")
    after = recorder.events[mark:]
    assert sorted(after) == sorted(
        [
            ("MODIFIED", names[0], changed["metadata"]["resourceVersion"]),
            ("DELETED", names[1], last_seen_1),  # the last state the service was told of
            ("ADDED", kube.workflow_name(43), kube_added["metadata"]["resourceVersion"]),
        ]
    )
    assert kube.request_counts()["list"] == lists_before + 1  # re-listed exactly once

    # resumed watching from the list's version: a new change arrives as an event
    obj = api.store.patch("workflows", NS, names[2], {"metadata": {"annotations": {"c": "d"}}})
    wait_for(lambda: recorder.seen("MODIFIED", names[2], obj["metadata"]["resourceVersion"]))
    assert kube.request_counts()["list"] == lists_before + 1


def _last_rv(recorder, name):
    return [e[2] for e in recorder.events if e[1] == name and e[0] != "DELETED"][-1]


def test_forced_410_on_resume_relists_once(api, kube, watched):
    watch, recorder = watched
    kube.create_workflow(jobid=50, userid=1, groupid=1, directives=DIRECTIVES)
    name = kube.workflow_name(50)
    wait_for(lambda: recorder.seen("ADDED", name))
    lists_before = kube.request_counts()["list"]
    api.faults.force_410_next_watch()
    api.faults.cut_watches()
    obj = api.store.patch("workflows", NS, name, {"metadata": {"annotations": {"x": "1"}}})
    wait_for(lambda: recorder.seen("MODIFIED", name, obj["metadata"]["resourceVersion"]))
    versions = recorder.versions()
    assert len(versions) == len(set(versions))
    wait_for(lambda: kube.request_counts()["list"] == lists_before + 1, what="one relist")


# -- pure bookkeeping behind the watch ---------------------------------------------------

ops = st.lists(
    st.tuples(st.sampled_from(["put", "delete"]), st.integers(0, 3)), min_size=1, max_size=30
)


def history(operations):
    """The events a server would send for ``operations``, and the final truth."""
    truth: dict[str, dict] = {}
    events = []
    for rv, (op, n) in enumerate(operations, start=1):
        name = f"w{n}"
        meta = {"name": name, "resourceVersion": str(rv), "uid": name}
        if op == "put":
            events.append(("MODIFIED" if name in truth else "ADDED", {"metadata": meta}))
            truth[name] = {"metadata": meta}
        elif name in truth:
            del truth[name]
            events.append(("DELETED", {"metadata": meta}))
    return events, truth


@settings(max_examples=100, deadline=None)
@given(ops, st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=6))
def test_delivered_never_repeats_and_converges(operations, resumes):
    """Streams that resume from older points (replaying events) deliver each event once, in
    order; a re-list at the end then brings the view to the truth without repeating anything."""
    events, truth = history(operations)
    stream, end = [], 0
    for back, length in resumes:  # each reconnect resumes at or before where the last ended
        start = max(0, end - back)
        end = min(len(events), max(end, start + length))
        stream += events[start:end]
    delivered = Delivered()
    out = []
    for kind, obj in stream:
        out += delivered.watch_event(kind, obj)
    assert out == events[:end]
    out += delivered.relist(list(truth.values()), str(len(operations)))
    keys = [(k, o["metadata"]["name"], o["metadata"]["resourceVersion"]) for k, o in out]
    assert len(keys) == len(set(keys))
    assert delivered.objects == truth


def test_a_watch_over_every_namespace_tells_same_named_objects_apart():
    """Servers are named after workflows, in each workflow's namespace: one cluster-wide watch
    may see two of the same name, and must neither merge them nor lose one on a re-list."""

    def servers(namespace: str, rv: int) -> dict:
        meta = {"name": "fluxjob-1-0", "namespace": namespace, "resourceVersion": str(rv)}
        return {"metadata": meta}

    delivered = Delivered(qualified_name)
    assert delivered.watch_event("ADDED", servers("a", 1)) == [("ADDED", servers("a", 1))]
    assert delivered.watch_event("ADDED", servers("b", 2)) == [("ADDED", servers("b", 2))]
    assert sorted(delivered.objects) == ["a/fluxjob-1-0", "b/fluxjob-1-0"]
    assert delivered.relist([servers("b", 2)], "3") == [("DELETED", servers("a", 1))]
    assert list(delivered.objects) == ["b/fluxjob-1-0"]


def test_a_list_taken_page_by_page_tells_what_went_only_at_its_end():
    """Each page's objects are handed over as it comes; what is missing may be on a later
    page, so DELETED waits for the last.  A list started again (its continue token expired)
    counts from its fresh page: what the aborted one showed and the new one does not, went."""

    def wf(name: str, rv: int) -> dict:
        return {"metadata": {"name": name, "resourceVersion": str(rv), "uid": name}}

    delivered = Delivered()
    delivered.relist([wf("a", 1), wf("b", 2), wf("c", 3)], "3")
    assert delivered.list_page([wf("a", 1), wf("d", 4)], fresh=True) == [("ADDED", wf("d", 4))]
    assert delivered.list_page([wf("e", 5)], fresh=False) == [("ADDED", wf("e", 5))]
    # the token expired: the list starts again, where "d" has gone and "b" changed
    assert delivered.list_page([wf("a", 1), wf("b", 6)], fresh=True) == [("MODIFIED", wf("b", 6))]
    assert delivered.list_page([wf("e", 5)], fresh=False) == []
    gone = delivered.list_done("6")
    assert sorted((kind, obj["metadata"]["name"]) for kind, obj in gone) == [
        ("DELETED", "c"),
        ("DELETED", "d"),
    ]
    assert sorted(delivered.objects) == ["a", "b", "e"]


# -- the worker ------------------------------------------------------------------------


def test_worker_never_blocks_and_reports_results_as_events():
    delivered: list = []
    worker = KubeWorker(threads=2, deliver=delivered.append)
    release = threading.Event()
    outcomes: list = []

    def record(result, error):
        outcomes.append((result, error))

    try:
        for i in range(5):  # more calls than threads: submit must still return at once
            worker.submit(
                lambda i: release.wait(10) and i, i, on_done=lambda r, e: outcomes.append((r, e))
            )
        assert delivered == [] and outcomes == []
        worker.submit(_boom, on_done=record)
        release.set()
        wait_for(lambda: len(delivered) == 6, what="six results")
        for callback in delivered:  # the service runs them on its own loop
            callback()
        assert sorted(r for r, e in outcomes if e is None) == [0, 1, 2, 3, 4]
        errors = [e for r, e in outcomes if e is not None]
        assert len(errors) == 1 and isinstance(errors[0], KubeError)
    finally:
        worker.stop()
    with pytest.raises(RuntimeError):
        worker.submit(_boom, on_done=lambda r, e: None)


def _boom():
    raise KubeError("get", "workflow", "default/x", "HTTP 500")


def test_calls_queued_at_stop_end_with_an_error():
    outcomes: list = []
    release, running = threading.Event(), threading.Event()

    def first() -> bool:
        running.set()
        return release.wait(10)

    worker = KubeWorker(threads=1, deliver=run_here)
    worker.submit(first, on_done=lambda r, e: outcomes.append(("first", r, e)))
    worker.submit(lambda: "ran", on_done=lambda r, e: outcomes.append(("queued", r, e)))
    assert running.wait(10)
    worker.stop(wait=False)
    release.set()
    wait_for(lambda: len(outcomes) == 2, what="both outcomes")
    assert outcomes[0] == ("first", True, None)
    assert outcomes[1][:2] == ("queued", None) and isinstance(outcomes[1][2], RuntimeError)


def test_urgent_calls_find_a_reserved_thread_while_others_fill_the_rest():
    release = threading.Event()
    started: list[str] = []
    outcomes: list = []
    worker = KubeWorker(threads=2, reserved=1, deliver=run_here)

    def call(name: str, block: bool) -> str:
        started.append(name)
        if block:
            release.wait(10)
        return name

    try:
        for name in ("create-1", "create-2"):  # only one thread may take non-urgent calls
            worker.submit(call, name, True, on_done=lambda r, e: outcomes.append(r))
        wait_for(lambda: started == ["create-1"], what="the first create to start")
        worker.submit(call, "setup", False, on_done=lambda r, e: outcomes.append(r), urgent=True)
        wait_for(lambda: outcomes == ["setup"], what="the urgent call, past a busy pool")
        assert started == ["create-1", "setup"]  # create-2 still waits for its thread
        release.set()
        wait_for(lambda: len(outcomes) == 3, what="the creates")
        assert started == ["create-1", "setup", "create-2"]
    finally:
        release.set()
        worker.stop()


@contextlib.contextmanager
def busy_worker(threads: int, reserved: int) -> Iterator[tuple[KubeWorker, threading.Event]]:
    """A KubeWorker whose one thread for work that can wait is held by a call until the
    event is set (the test sets it; leaving sets it too, and stops the worker)."""
    release, running = threading.Event(), threading.Event()
    worker = KubeWorker(threads=threads, reserved=reserved, deliver=run_here)

    def first() -> None:
        running.set()
        release.wait(10)

    try:
        worker.submit(first, on_done=lambda r, e: None)
        assert running.wait(10)
        yield worker, release
    finally:
        release.set()
        worker.stop()


def test_urgent_calls_overtake_queued_ones():
    order: list[str] = []
    with busy_worker(threads=1, reserved=0) as (worker, release):
        for name, urgent in (("read", False), ("create", False), ("dataIn", True)):
            worker.submit(order.append, name, on_done=lambda r, e: None, urgent=urgent)
        release.set()
        wait_for(lambda: len(order) == 3, what="the queued calls")
    assert order == ["dataIn", "read", "create"]


def test_soon_calls_overtake_queued_ones_on_the_threads_for_work_that_can_wait():
    """A moving job's records (soon) go before new jobs' creates, after any next state, and
    never on a reserved thread (they may wait for a watch)."""
    order: list[str] = []
    with busy_worker(threads=2, reserved=1) as (worker, release):
        for name in ("create", "output"):
            worker.submit(order.append, name, on_done=lambda r, e: None, soon=name == "output")
        worker.submit(order.append, "dataOut", on_done=lambda r, e: None, urgent=True)
        wait_for(lambda: order == ["dataOut"], what="the urgent call, on the reserved thread")
        assert worker.queued() == 2  # the output waits for the busy thread, as the create does
        release.set()
        wait_for(lambda: len(order) == 3, what="the queued calls")
    assert order == ["dataOut", "output", "create"]


@pytest.mark.parametrize("threads, reserved", [(0, 0), (4, 4), (4, -1)])
def test_worker_sizes_are_checked(threads, reserved):
    with pytest.raises(ValueError, match="threads|reserved"):
        KubeWorker(threads=threads, reserved=reserved, deliver=run_here)


def test_token_hook_runs_at_most_once_per_interval_and_stays_installed():
    """The kubeconfig loader's hook re-installs a copy of itself each time it runs."""
    calls: list[int] = []

    class Configuration:
        refresh_api_key_hook = None

    def loader_hook(configuration) -> None:
        calls.append(len(calls))
        configuration.refresh_api_key_hook = loader_hook  # as kube_config._set_config does

    cfg = Configuration()
    cfg.refresh_api_key_hook = throttled = _AtMostEvery(60.0, loader_hook)
    for _ in range(5):  # as the client does before every request
        cfg.refresh_api_key_hook(cfg)
    assert calls == [0] and cfg.refresh_api_key_hook is throttled
    throttled.interval = 0.0
    cfg.refresh_api_key_hook(cfg)
    assert calls == [0, 1] and cfg.refresh_api_key_hook is throttled


def test_kubeconfig_token_hook_is_throttled(kube):
    hook = kube._api.configuration.refresh_api_key_hook
    assert isinstance(hook, _AtMostEvery)
    for _ in range(3):
        kube.served_groups()
    assert kube._api.configuration.refresh_api_key_hook is hook


def run_here(callback):
    """A worker's deliver for tests without a loop: the outcome on the worker's thread."""
    callback()
