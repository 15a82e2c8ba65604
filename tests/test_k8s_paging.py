# SPDX-License-Identifier: LGPL-3.0-only
"""The adapter lists its workflows in pages, as a real server wants at 10,000 of them.

KubeClient.list_workflows (start-up, and the watch's relist after a 410) asks for
``LIST_PAGE`` (500) workflows at a time and follows continue tokens; an expired token restarts the
list.  Everything goes over HTTP to the stand-in API server.
"""

from __future__ import annotations

import itertools
import threading

import pytest
from waiting import wait_for

from flux_dws.k8s import KubeClient, KubeError
from flux_dws.k8s.watch import WorkflowWatch

NS = "default"
DIRECTIVES = ["#DW jobdw type=xfs capacity=10GiB name=scratch"]
_touches = itertools.count()


@pytest.fixture
def kube(kubeapi):
    client = KubeClient.connect(
        namespace=NS, identity="pager", kubeconfig=kubeapi.kubeconfig, timeout=10.0
    )
    client.backoff_max = 0.2
    client._page_size = 2  # pages of two, to see several
    yield client
    client.close()


def make(kube, jobids):
    for jobid in jobids:
        kube.create_workflow(jobid=jobid, userid=1, groupid=1, directives=DIRECTIVES)
    return sorted(kube.workflow_name(j) for j in jobids)


def names(items):
    return sorted(obj["metadata"]["name"] for obj in items)


def test_list_workflows_follows_continue_tokens_page_by_page(kubeapi, kube):
    expected = make(kube, range(1, 6))
    kubeapi.reset_counts()
    items, rv = kube.list_workflows()
    assert names(items) == expected
    assert kubeapi.request_counts()[("list", "workflows")] == 3  # 2 + 2 + 1
    assert rv == kubeapi.store.resource_version


def test_every_page_shows_the_version_of_the_first(kubeapi, kube):
    expected = make(kube, range(1, 5))
    first_page = kube._list_page
    changed = threading.Event()

    def page_then_change(limit, token, where):
        found = first_page(limit, token, where)
        if not changed.is_set():  # between pages: one workflow goes, one arrives
            changed.set()
            kubeapi.store.patch("workflows", NS, expected[-1], {"metadata": {"finalizers": []}})
            kubeapi.store.delete("workflows", NS, expected[-1])
            make(kube, [99])
        return found

    kube._list_page = page_then_change
    items, rv = kube.list_workflows()
    assert names(items) == expected  # the list as it was when it started
    assert int(rv) < int(kubeapi.store.resource_version)


def touch_and_compact(kubeapi, name):
    """A change, then a compaction: the versions before it are gone from the history."""
    touched = str(next(_touches))
    kubeapi.store.patch("workflows", NS, name, {"metadata": {"annotations": {"t": touched}}})
    kubeapi.store.compact()


def test_an_expired_continue_token_restarts_the_list(kubeapi, kube):
    expected = make(kube, range(1, 6))
    first_page = kube._list_page
    calls = []

    def page_then_compact(limit, token, where):
        calls.append(token)
        found = first_page(limit, token, where)
        if len(calls) == 1:
            touch_and_compact(kubeapi, expected[0])
        return found

    kube._list_page = page_then_compact
    items, _ = kube.list_workflows()
    assert len(items) == 5
    assert calls[0] is None and calls[2] is None  # page 2 got 410: started again
    assert len(calls) == 2 + 3


def test_a_list_that_keeps_expiring_gives_up_with_the_410(kubeapi, kube):
    make(kube, range(1, 4))
    first_page = kube._list_page

    def always_compact(limit, token, where):
        found = first_page(limit, token, where)
        touch_and_compact(kubeapi, kube.workflow_name(1))
        return found

    kube._list_page = always_compact
    with pytest.raises(KubeError) as info:
        kube.list_workflows()
    assert info.value.status == 410


def test_the_watch_lists_and_relists_in_pages_and_keeps_no_managed_fields(kubeapi, kube):
    expected = make(kube, range(1, 6))
    seen: list[tuple[str, str]] = []
    kept: list[dict] = []

    def record(kind: str, obj: dict) -> None:
        seen.append((kind, obj["metadata"]["name"]))
        kept.append(obj)

    watch = WorkflowWatch(
        kube,
        record,
        backoff_max=0.2,
        backoff_base=0.02,
        watch_timeout=30,
    )
    kubeapi.reset_counts()
    watch.start()
    try:
        wait_for(lambda: len(seen) == 5, what="five ADDED from the paged start-up list")
        assert sorted(name for _, name in seen) == expected
        assert kubeapi.request_counts()[("list", "workflows")] == 3
        # the server's managedFields are not held: nothing reads them
        assert kubeapi.store.get("workflows", NS, expected[0])["metadata"]["managedFields"]
        assert not any("managedFields" in obj["metadata"] for obj in kept)
        kubeapi.faults.force_410_next_watch()
        kubeapi.faults.cut_watches()
        wait_for(
            lambda: kubeapi.request_counts()[("list", "workflows")] == 6,
            what="a paged relist after the 410",
        )
        assert sorted(name for _, name in seen) == expected  # nothing changed: no deliveries
    finally:
        watch.stop()


def test_the_watch_hands_over_each_page_as_it_comes_and_is_listed_after_the_last(kubeapi, kube):
    """The service decides on a page's workflows while the next pages are on their way: the
    first page is delivered while the second is held back by the server, and the list counts
    as complete (on_listed) only once the last page is in."""
    expected = make(kube, range(1, 6))
    seen: list[str] = []
    listed: list[int] = []
    watch = WorkflowWatch(
        kube,
        lambda kind, obj: seen.append(obj["metadata"]["name"]),
        on_listed=lambda: listed.append(len(seen)),
        backoff_max=0.2,
        backoff_base=0.02,
        watch_timeout=30,
    )
    held = kubeapi.faults.hold_pages("workflows")
    kubeapi.reset_counts()
    watch.start()
    try:
        wait_for(lambda: len(seen) == 2, what="the first page's workflows")
        wait_for(lambda: kubeapi.faults.pages_waiting("workflows") == 1, what="page 2 asked")
        assert seen == expected[:2] and listed == []  # page 2 is held: not listed yet
        held.set()
        wait_for(lambda: listed, what="the list's end")
        assert seen == expected and listed == [5]
    finally:
        held.set()
        watch.stop()
