# SPDX-License-Identifier: LGPL-3.0-only
"""The records' pods and NnfDataMovements come from watches, never staler than a list.

flux_dws.k8s.recordcache over real HTTP against kubeapi: a read at a workflow's
resourceVersion is answered only once the watch has delivered everything up to it (events or
bookmarks), else the caller lists; a failing watch is never trusted; data movements of one
name in two rabbits' namespaces are two objects.  And through the whole stack: container and
copy jobs leave no list of pods or data movements after the watches' first.
"""

from __future__ import annotations

import itertools

import pytest
from waiting import wait_for

from flux_dws.core.copies import WORKFLOW_NAME_LABEL, WORKFLOW_NAMESPACE_LABEL
from flux_dws.core.output import CONTAINER_LABEL, OUTPUT_KEY
from flux_dws.k8s import KubeClient, recordcache
from flux_dws.k8s.recordcache import DataMovementWatch, PodWatch, WatchedObjects
from flux_dws.k8s.recordreads import collect_output, read_data_movements
from flux_dws.testing.dwssim.companions import api_object
from flux_dws.testing.stack import Stack

NS = "default"
_identities = (f"rc{i}" for i in itertools.count())


@pytest.fixture(autouse=True)
def _patient(monkeypatch):
    """Reads wait up to 30 s for the watch to catch up, not the service's 0.25 s: a watch
    thread (or the 0.2 s bookmark a quiet watch waits for) can be later than that on a loaded
    machine, and a read that is not answered falls back to a list, which these tests count.
    A read meant not to be answered says its own catch_up, or the watch is failing (no wait)."""
    monkeypatch.setattr(recordcache, "CATCH_UP", 30.0)


@pytest.fixture
def kube(kubeapi):
    client = KubeClient.connect(
        namespace=NS, identity=next(_identities), kubeconfig=kubeapi.kubeconfig, timeout=10.0
    )
    yield client
    client.close()


def pod(name: str, workflow: str, namespace: str = NS) -> dict:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {CONTAINER_LABEL: workflow}},
        "spec": {"containers": [{"name": "app"}]},
        "status": {"containerStatuses": [{"name": "app", "state": {"terminated": {}}}]},
    }


def movement(name: str, namespace: str, workflow: str) -> dict:
    labels = {WORKFLOW_NAME_LABEL: workflow, WORKFLOW_NAMESPACE_LABEL: NS}
    meta = {"name": name, "namespace": namespace, "labels": labels}
    return {**api_object("nnfdatamovements"), "metadata": meta, "status": {"state": "Finished"}}


def namespace(kubeapi, name: str) -> None:
    kubeapi.store.create("namespaces", None, {"metadata": {"name": name}})


def lists(kubeapi, plural: str) -> int:
    return kubeapi.request_counts().get(("list", plural), 0)


def started(cache: WatchedObjects) -> WatchedObjects:
    cache.start()
    wait_for(lambda: cache.read("none", "1", catch_up=0) is not None, "the watch's list")
    cache.hits = cache.misses = 0
    return cache


@pytest.fixture
def pods(kube):
    cache = started(WatchedObjects(PodWatch, kube, CONTAINER_LABEL))
    yield cache
    cache.stop()


def test_a_read_right_after_the_write_sees_it_without_a_list(kubeapi, kube, pods):
    listed = lists(kubeapi, "pods")
    for i in range(20):  # each read races the watch's delivery of the pod just written
        kubeapi.store.create("pods", NS, pod(f"p{i}", f"wf{i}"))
        at = kubeapi.store.resource_version  # the workflow's status comes after the pod
        found = pods.read(f"wf{i}", at)
        assert [p["metadata"]["name"] for p in found or []] == [f"p{i}"]
    assert lists(kubeapi, "pods") == listed
    assert pods.hits == 20


def test_bookmarks_carry_a_quiet_watch_to_the_workflows_version(kubeapi, kube, pods):
    kubeapi.store.create("pods", NS, pod("p", "wf"))
    namespace(kubeapi, "elsewhere")
    kubeapi.store.create(
        "pods", "elsewhere", pod("q", "other", "elsewhere")
    )  # not in the watch's sight
    at = kubeapi.store.resource_version
    assert [p["metadata"]["name"] for p in pods.read("wf", at) or []] == ["p"]
    assert pods.read("other", at) == []


def test_a_watch_that_cannot_catch_up_is_not_answered(kubeapi, kube, pods):
    ahead = str(int(kubeapi.store.resource_version) + 1000)
    assert pods.read("wf", ahead, catch_up=0.05) is None
    assert pods.read("wf", "not-a-number") is None


def test_when_current_calls_back_once_the_watch_reaches_the_version_holding_no_thread(
    kubeapi, kube, pods
):
    now: list[str] = []
    pods.when_current(kubeapi.store.resource_version, lambda: now.append("now"))
    assert now == ["now"]  # the watch is there already: at once, on this thread
    ahead = str(int(kubeapi.store.resource_version) + 1)
    later: list[str] = []
    pods.when_current(ahead, lambda: later.append("later"))
    pods.when_current("not-a-number", lambda: later.append("cannot say"))
    assert later == ["cannot say"]
    kubeapi.store.create("pods", NS, pod("p", "wf"))  # the next change moves the watch on
    wait_for(lambda: later == ["cannot say", "later"], "the watch to reach the version")
    assert [p["metadata"]["name"] for p in pods.read("wf", ahead, catch_up=0) or []] == ["p"]
    far = str(int(kubeapi.store.resource_version) + 1000)
    failed: list[str] = []
    pods.when_current(far, lambda: failed.append("listed instead"))
    kubeapi.faults.set(error_rate=1.0, error_codes=(503,), verbs={"watch"}, plurals={"pods"})
    kubeapi.faults.cut_watches()
    wait_for(lambda: failed == ["listed instead"], "a failing watch to answer every waiter")


def test_a_failing_watch_falls_back_to_a_list_as_fresh(kubeapi, kube, pods):
    kubeapi.faults.set(error_rate=1.0, error_codes=(503,), verbs={"watch"}, plurals={"pods"})
    kubeapi.faults.cut_watches()
    wait_for(lambda: pods.read("wf", "1", catch_up=0) is None, "the pod watch to fail")
    kubeapi.store.create("pods", NS, pod("late", "wf"))
    listed = lists(kubeapi, "pods")
    saved = collect_output(kube, "wf", NS, 0, pods, kubeapi.store.resource_version)
    assert [c.status.pod for c in saved.containers] == ["late"]
    assert lists(kubeapi, "pods") == listed + 1


def test_one_name_in_two_rabbits_namespaces_is_two_movements(kubeapi, kube):
    cache = started(WatchedObjects(DataMovementWatch, kube, WORKFLOW_NAME_LABEL))
    try:
        for rabbit in ("rabbit-0", "rabbit-1"):
            namespace(kubeapi, rabbit)
            kubeapi.store.create("nnfdatamovements", rabbit, movement("wf-1", rabbit, "wf"))
        at = kubeapi.store.resource_version
        found = read_data_movements(kube, "wf", NS, cache, at)
        assert [m["metadata"]["namespace"] for m in found] == ["rabbit-0", "rabbit-1"]
        for rabbit in ("rabbit-0", "rabbit-1"):
            kubeapi.store.delete("nnfdatamovements", rabbit, "wf-1")
        assert read_data_movements(kube, "wf", NS, cache, kubeapi.store.resource_version) == []
        assert cache.misses == 0
    finally:
        cache.stop()


def test_container_and_copy_jobs_list_no_pods_or_movements_after_start_up():
    # This stack is quiet: the watches reach a workflow's version only at their next bookmark
    # (every second), and each read waits for it here instead of listing (_patient).
    copies = [
        "#DW jobdw type=gfs2 capacity=10GiB name=shared",
        "#DW copy_in source=/lus/in destination=$DW_JOB_shared/in",
        "#DW container name=app profile=ok DW_JOB_local_storage=shared",
        "#DW copy_out source=$DW_JOB_shared/out destination=/lus/out",
    ]
    with Stack() as stack:
        jobs = [stack.submit(copies, runtime=0.05) for _ in range(3)]
        for jobid in jobs:
            info = stack.wait(jobid)
            states = [e["context"]["state"] for e in info.events("dws-datamovement")]
            assert states == ["DataIn", "DataOut"]
            (event,) = info.events("dws-container")
            assert {c["exit_code"] for c in event["context"]["containers"]} == {0}
            assert stack.saved(jobid, OUTPUT_KEY)
        counts = stack.api.request_counts()
        records = stack.service.records
        assert (records.pods.hits, records.movements.hits) == (3, 6)
    assert counts.get(("list", "pods")) == 1  # the pod watch's first list, nothing per job
    assert counts.get(("list", "nnfdatamovements")) == 1


@pytest.mark.parametrize("ending", ["\n", ""])
def test_a_log_cut_to_its_last_lines_says_older_output_was_left_out(kubeapi, kube, ending):
    """However the log ends (a container's last line need not end in a newline), output older
    than the lines kept is said to be left out; a short log is whole."""
    from flux_dws.testing.kubeapi.podlog import logs_of

    kubeapi.store.create("pods", NS, pod("long", "wf"))
    # 600 short lines: the last 512 asked for fit well within the 4096 bytes kept
    logs_of(kubeapi.store).write(NS, "long", "app", "\n".join(f"l{i}" for i in range(600)) + ending)
    (saved,) = collect_output(kube, "wf", NS, 4096).containers
    assert saved.log.startswith("l88\n") and saved.log.endswith("l599" + ending)
    assert saved.truncated
    kubeapi.store.create("pods", NS, pod("short", "wf2"))
    logs_of(kubeapi.store).write(NS, "short", "app", "a\rprogress\nb" + ending)
    (whole,) = collect_output(kube, "wf2", NS, 4096).containers
    assert not whole.truncated and whole.log == "a\rprogress\nb" + ending
