# SPDX-License-Identifier: LGPL-3.0-only
"""flux_dws.testing.kubeapi over real HTTP with the real kubernetes client (and kubectl).

The stand-in API server is only worth something if it behaves like Kubernetes where flux-dws
can observe it, so every test here goes through the real client: discovery, CRUD, selectors,
optimistic concurrency, finalizers, watches (resourceVersion, bookmarks, 410), the DWS
admission rules with their upstream messages, and each kind of injected fault.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import urllib3
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from waiting import wait_for

from flux_dws.core.identity import FINALIZER
from flux_dws.testing import ruleset
from flux_dws.testing.kubeapi import ApiError, Faults, KubeApi, Store
from flux_dws.testing.kubeapi.patches import merge_patch
from flux_dws.testing.kubeapi.resources import RESOURCES
from flux_dws.testing.kubeapi.selectors import parse_label_selector

G = "dataworkflowservices.github.io"
V = "v1alpha7"
NS = "default"
DIRECTIVES = ["#DW jobdw type=xfs capacity=10GiB name=scratch"]
WEBHOOK_DENIED = 'admission webhook "vworkflow.kb.io" denied the request: '


def workflow(name: str, directives=None, **spec) -> dict:
    body = {
        "desiredState": "Proposal",
        "wlmID": "flux",
        "jobID": 7,
        "userID": 1001,
        "groupID": 100,
        "dwDirectives": list(DIRECTIVES if directives is None else directives),
    }
    body.update(spec)
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "Workflow",
        "metadata": {"name": name},
        "spec": {k: v for k, v in body.items() if v is not None},
    }


def computes(name: str, labels=None, finalizers=None) -> dict:
    meta: dict = {"name": name}
    if labels is not None:
        meta["labels"] = labels
    if finalizers is not None:
        meta["finalizers"] = finalizers
    return {"apiVersion": f"{G}/{V}", "kind": "Computes", "metadata": meta, "data": []}


def failure(call) -> tuple[int, dict, ApiException]:
    """Run ``call``, which must fail with an ApiException; its status, Status body, exception."""
    with pytest.raises(ApiException) as info:
        call()
    return info.value.status, json.loads(info.value.body), info.value


def rv(obj: dict) -> int:
    return int(obj["metadata"]["resourceVersion"])


# -- discovery -------------------------------------------------------------------------


def test_discovery_lists_every_resource_of_the_table(k8s_client):
    groups = {g.name: g for g in client.ApisApi(k8s_client).get_api_versions().groups}
    dws = groups[G]
    assert dws.preferred_version.version == "v1alpha7"
    assert [v.version for v in dws.versions] == ["v1alpha7", "v1alpha6"]
    assert client.CoreApi(k8s_client).get_api_versions().versions == ["v1"]
    assert client.VersionApi(k8s_client).get_code().major == "1"
    custom = client.CustomObjectsApi(k8s_client)
    lists = {("", "v1"): client.CoreV1Api(k8s_client).get_api_resources().resources}
    for resource in RESOURCES:
        for version in resource.versions:
            key = (resource.group, version)
            if key not in lists:
                lists[key] = custom.get_api_resources(resource.group, version).resources
            entry = next(r for r in lists[key] if r.name == resource.plural)
            assert (entry.kind, entry.namespaced) == (resource.kind, resource.namespaced)
            assert {"get", "list", "watch", "create", "patch", "update", "delete"} <= set(
                entry.verbs
            )


def test_unknown_paths_are_404_status(co):
    status, body, _ = failure(lambda: co.get_api_resources(G, "v1alpha2"))
    assert (status, body["kind"], body["reason"]) == (404, "Status", "NotFound")
    status, _, _ = failure(lambda: co.list_namespaced_custom_object(G, V, NS, "nosuchthings"))
    assert status == 404


def test_a_server_without_the_dws_group(tmp_path):
    with KubeApi(groups=()) as api:
        api.write_kubeconfig(str(tmp_path / "kc"))
        configuration = client.Configuration()
        config.load_kube_config(config_file=api.kubeconfig, client_configuration=configuration)
        with client.ApiClient(configuration) as api_client:
            names = [g.name for g in client.ApisApi(api_client).get_api_versions().groups]
            assert G not in names
            custom = client.CustomObjectsApi(api_client)
            assert (
                failure(lambda: custom.list_namespaced_custom_object(G, V, NS, "workflows"))[0]
                == 404
            )
            assert client.CoreV1Api(api_client).list_namespace().items


# -- CRUD ------------------------------------------------------------------------------


def test_create_get_under_both_versions_and_system_metadata(co):
    created = co.create_namespaced_custom_object(G, V, NS, "computes", computes("c1"))
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1 and meta["namespace"] == NS
    old = co.get_namespaced_custom_object(G, "v1alpha6", NS, "computes", "c1")
    assert old["apiVersion"] == f"{G}/v1alpha6"
    assert old["metadata"]["uid"] == meta["uid"]
    status, body, _ = failure(
        lambda: co.create_namespaced_custom_object(G, V, NS, "computes", computes("c1"))
    )
    assert (status, body["reason"]) == (409, "AlreadyExists")
    assert body["message"] == f'computes.{G} "c1" already exists'


def test_generation_follows_content_and_noop_patches_keep_the_version(co):
    created = co.create_namespaced_custom_object(G, V, NS, "computes", computes("c1"))
    labelled = co.patch_namespaced_custom_object(
        G, V, NS, "computes", "c1", {"metadata": {"labels": {"a": "b"}}}
    )
    assert rv(labelled) > rv(created) and labelled["metadata"]["generation"] == 1
    changed = co.patch_namespaced_custom_object(
        G, V, NS, "computes", "c1", {"data": [{"name": "n1"}]}
    )
    assert changed["metadata"]["generation"] == 2 and changed["data"] == [{"name": "n1"}]
    same = co.patch_namespaced_custom_object(G, V, NS, "computes", "c1", {"data": [{"name": "n1"}]})
    assert rv(same) == rv(changed)


def test_delete_without_finalizers_answers_success_then_404(co):
    co.create_namespaced_custom_object(G, V, NS, "computes", computes("gone"))
    answer = co.delete_namespaced_custom_object(G, V, NS, "computes", "gone")
    assert (answer["kind"], answer["status"]) == ("Status", "Success")
    assert answer["details"]["name"] == "gone"
    status, body, _ = failure(lambda: co.get_namespaced_custom_object(G, V, NS, "computes", "gone"))
    assert (status, body["reason"], body["message"]) == (
        404,
        "NotFound",
        f'computes.{G} "gone" not found',
    )


def test_invalid_names_and_bodies_are_rejected(co):
    status, body, _ = failure(
        lambda: co.create_namespaced_custom_object(G, V, NS, "computes", computes("Bad_Name"))
    )
    assert (status, body["reason"]) == (422, "Invalid")
    assert 'metadata.name: Invalid value: "Bad_Name"' in body["message"]
    wrong_kind = {**computes("c2"), "kind": "Servers"}
    status, _, _ = failure(
        lambda: co.create_namespaced_custom_object(G, V, NS, "computes", wrong_kind)
    )
    assert status == 400


def test_secrets_string_data_and_strategic_merge_patch(core):
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name="tok"), string_data={"token": "abc"})
    created = core.create_namespaced_secret(NS, secret)
    assert created.data == {"token": "YWJj"} and created.type == "Opaque"
    patched = core.patch_namespaced_secret("tok", NS, {"metadata": {"labels": {"x": "y"}}})
    assert patched.metadata.labels == {"x": "y"} and patched.data == {"token": "YWJj"}
    assert [s.metadata.name for s in core.list_namespaced_secret(NS).items] == ["tok"]


def test_patching_string_data_is_a_change_like_any_other():
    store = Store()
    created = store.create("secrets", NS, {"metadata": {"name": "s"}, "data": {"a": "YQ=="}})
    stream = store.watch("secrets", NS, resource_version=created["metadata"]["resourceVersion"])
    patched = store.patch("secrets", NS, "s", {"stringData": {"b": "b"}})
    assert patched["data"] == {"a": "YQ==", "b": "Yg=="} and rv(patched) > rv(created)
    kind, seen = stream.next(1)
    assert (kind, seen["data"]) == ("MODIFIED", patched["data"])


def test_custom_resources_refuse_strategic_merge_but_take_json_patch(co):
    co.create_namespaced_custom_object(G, V, NS, "computes", computes("c1"))
    status, body, _ = failure(
        lambda: co.patch_namespaced_custom_object(
            G,
            V,
            NS,
            "computes",
            "c1",
            {"data": []},
            _content_type="application/strategic-merge-patch+json",
        )
    )
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")
    ops = [{"op": "add", "path": "/data/-", "value": {"name": "n9"}}]
    patched = co.patch_namespaced_custom_object(
        G, V, NS, "computes", "c1", ops, _content_type="application/json-patch+json"
    )
    assert patched["data"] == [{"name": "n9"}]


def test_http_keep_alive_reuses_one_connection(k8s_client, co, kubeapi):
    for i in range(5):
        co.create_namespaced_custom_object(G, V, NS, "computes", computes(f"k{i}"))
        co.get_namespaced_custom_object(G, V, NS, "computes", f"k{i}")
    pool = k8s_client.rest_client.pool_manager.connection_from_url(kubeapi.url)
    assert pool.num_connections == 1


# -- label selectors, merge patch, conflicts ----------------------------------------------


@pytest.mark.parametrize(
    "selector, expected",
    [
        ("tier=gold", {"a", "b"}),
        ("tier==gold", {"a", "b"}),
        ("tier!=gold", {"c", "d"}),
        ("tier in (gold,silver)", {"a", "b", "c"}),
        ("tier notin (gold)", {"c", "d"}),
        ("zone", {"a", "c"}),
        ("!zone", {"b", "d"}),
        ("tier=gold,zone", {"a"}),
        ("tier in (gold, silver),!zone,rank>1", {"b"}),
        ("", {"a", "b", "c", "d"}),
    ],
)
def test_label_selectors(co, selector, expected):
    labels = {
        "a": {"tier": "gold", "zone": "z1", "rank": "1"},
        "b": {"tier": "gold", "rank": "2"},
        "c": {"tier": "silver", "zone": "z2"},
        "d": {},
    }
    for name, found in labels.items():
        co.create_namespaced_custom_object(
            G, V, NS, "servers", computes(name, found) | {"kind": "Servers"}
        )
    listed = co.list_namespaced_custom_object(G, V, NS, "servers", label_selector=selector)
    assert {item["metadata"]["name"] for item in listed["items"]} == expected
    everywhere = co.list_cluster_custom_object(G, V, "servers", label_selector=selector)
    assert {item["metadata"]["name"] for item in everywhere["items"]} == expected


def test_a_malformed_label_selector_is_a_400(co):
    status, body, _ = failure(
        lambda: co.list_namespaced_custom_object(G, V, NS, "servers", label_selector="a in (b")
    )
    assert (status, body["reason"]) == (400, "BadRequest")


def test_merge_patch_null_removes_and_resource_version_is_a_precondition(co):
    created = co.create_namespaced_custom_object(
        G, V, NS, "computes", computes("c1", {"a": "1", "b": "2"})
    )
    patched = co.patch_namespaced_custom_object(
        G, V, NS, "computes", "c1", {"metadata": {"labels": {"a": None}}}
    )
    assert patched["metadata"]["labels"] == {"b": "2"}
    stale = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "data": []}
    status, body, _ = failure(
        lambda: co.patch_namespaced_custom_object(G, V, NS, "computes", "c1", stale)
    )
    assert (status, body["reason"]) == (409, "Conflict")


def test_replace_with_a_stale_resource_version_is_a_409(co):
    original = co.create_namespaced_custom_object(G, V, NS, "computes", computes("c1"))
    co.patch_namespaced_custom_object(G, V, NS, "computes", "c1", {"data": [{"name": "x"}]})
    status, body, _ = failure(
        lambda: co.replace_namespaced_custom_object(G, V, NS, "computes", "c1", original)
    )
    assert (status, body["reason"]) == (409, "Conflict")
    assert body["message"] == (
        f'Operation cannot be fulfilled on computes.{G} "c1": the object has been modified;'
        " please apply your changes to the latest version and try again"
    )
    current = co.get_namespaced_custom_object(G, V, NS, "computes", "c1")
    current["data"] = [{"name": "y"}]
    replaced = co.replace_namespaced_custom_object(G, V, NS, "computes", "c1", current)
    assert replaced["data"] == [{"name": "y"}] and rv(replaced) > rv(current)


def test_concurrent_read_modify_write_loses_no_update():
    store = Store()
    store.create("computes", NS, computes("counter"))

    def bump(times: int) -> None:
        for _ in range(times):
            while True:
                obj = store.get("computes", NS, "counter")
                obj["data"] = obj["data"] + [{"name": "x"}]
                try:
                    store.replace("computes", NS, "counter", obj)
                    break
                except ApiError as exc:
                    assert exc.code == 409

    threads = [threading.Thread(target=bump, args=(25,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(store.get("computes", NS, "counter")["data"]) == 100


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=3),
        lambda inner: st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=8,
    ),
    st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=3), max_size=3),
)
def test_merge_patch_laws(patch, target):
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once  # idempotent
    if isinstance(patch, dict):
        for key, value in patch.items():
            if value is None:
                assert key not in once
            elif not isinstance(value, dict):
                assert once[key] == value
    else:
        assert once == patch


# -- finalizers ------------------------------------------------------------------------


def test_finalizers_keep_a_deleted_object_until_they_are_gone(co):
    co.create_namespaced_custom_object(G, V, NS, "computes", computes("f1", finalizers=[FINALIZER]))
    kept = co.delete_namespaced_custom_object(G, V, NS, "computes", "f1")
    assert kept["kind"] == "Computes" and kept["metadata"]["deletionTimestamp"]
    again = co.delete_namespaced_custom_object(G, V, NS, "computes", "f1")
    assert again["metadata"]["resourceVersion"] == kept["metadata"]["resourceVersion"]
    listed = co.list_namespaced_custom_object(G, V, NS, "computes")["items"]
    assert [o["metadata"]["name"] for o in listed] == ["f1"]
    status, body, _ = failure(
        lambda: co.patch_namespaced_custom_object(
            G, V, NS, "computes", "f1", {"metadata": {"finalizers": [FINALIZER, "other/x"]}}
        )
    )
    assert status == 422 and "no new finalizers can be added" in body["message"]
    co.patch_namespaced_custom_object(
        G, V, NS, "computes", "f1", {"metadata": {"finalizers": None}}
    )
    assert failure(lambda: co.get_namespaced_custom_object(G, V, NS, "computes", "f1"))[0] == 404


def test_an_owner_gone_for_good_takes_the_objects_it_alone_owns(co):
    """The garbage collector's background propagation, as after DWS's Workflow goes: its
    Computes (ownerReference, controller) go too; an object with an owner left stays; an
    owner held by a finalizer keeps them; a dependent with a finalizer is only marked."""

    def owned(name: str, owners: list, finalizers=None) -> dict:
        obj = computes(name, finalizers=finalizers)
        obj["metadata"]["ownerReferences"] = [
            {
                "apiVersion": f"{G}/{V}",
                "kind": "Workflow",
                "name": o["metadata"]["name"],
                "uid": o["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
            for o in owners
        ]
        return co.create_namespaced_custom_object(G, V, NS, "computes", obj)

    wf = co.create_namespaced_custom_object(G, V, NS, "workflows", workflow("gc-1"))
    other = co.create_namespaced_custom_object(G, V, NS, "workflows", workflow("gc-2"))
    held = co.create_namespaced_custom_object(
        G,
        V,
        NS,
        "workflows",
        workflow("gc-3") | {"metadata": {"name": "gc-3", "finalizers": [FINALIZER]}},
    )
    owned("alone", [wf])
    owned("shared", [wf, other])
    owned("finalized", [wf], finalizers=[FINALIZER])
    owned("of-held", [held])
    owned("unrelated", [])
    co.delete_namespaced_custom_object(G, V, NS, "workflows", "gc-1")
    co.delete_namespaced_custom_object(G, V, NS, "workflows", "gc-3")

    def left() -> dict:
        items = co.list_namespaced_custom_object(G, V, NS, "computes")["items"]
        return {o["metadata"]["name"]: bool(o["metadata"].get("deletionTimestamp")) for o in items}

    assert left() == {"finalized": True, "of-held": False, "shared": False, "unrelated": False}
    co.delete_namespaced_custom_object(G, V, NS, "workflows", "gc-2")
    co.patch_namespaced_custom_object(
        G, V, NS, "workflows", "gc-3", {"metadata": {"finalizers": None}}
    )
    assert left() == {"finalized": True, "unrelated": False}


def test_delete_preconditions(co):
    created = co.create_namespaced_custom_object(G, V, NS, "computes", computes("p1"))
    status, body, _ = failure(
        lambda: co.delete_namespaced_custom_object(
            G, V, NS, "computes", "p1", body={"preconditions": {"uid": "not-the-uid"}}
        )
    )
    assert (status, body["reason"]) == (409, "Conflict")
    co.delete_namespaced_custom_object(
        G, V, NS, "computes", "p1", body={"preconditions": {"uid": created["metadata"]["uid"]}}
    )


def test_delete_collection_selects_by_label_and_field_and_keeps_finalized_objects(co):
    """DWS's finalizer removes a workflow's Computes with DeleteAllOf: DELETE on the collection."""
    for name, labels, finalizers in (
        ("c1", {"owner": "wf1"}, None),
        ("c2", {"owner": "wf1"}, [FINALIZER]),
        ("c3", {"owner": "wf2"}, None),
        ("c4", {"owner": "wf1"}, None),
    ):
        co.create_namespaced_custom_object(G, V, NS, "computes", computes(name, labels, finalizers))
    done = co.delete_collection_namespaced_custom_object(
        G, V, NS, "computes", label_selector="owner=wf1", field_selector="metadata.name!=c4"
    )
    assert done["kind"] == "ComputesList"
    assert [o["metadata"]["name"] for o in done["items"]] == ["c1", "c2"]
    left = co.list_namespaced_custom_object(G, V, NS, "computes")["items"]
    assert [o["metadata"]["name"] for o in left] == ["c2", "c3", "c4"]
    assert left[0]["metadata"]["deletionTimestamp"]
    co.delete_collection_namespaced_custom_object(G, V, NS, "computes", dry_run="All")
    assert len(co.list_namespaced_custom_object(G, V, NS, "computes")["items"]) == 3
    co.delete_collection_namespaced_custom_object(G, V, NS, "computes")
    left = co.list_namespaced_custom_object(G, V, NS, "computes")["items"]
    assert [o["metadata"]["name"] for o in left] == ["c2"]
    status, body, _ = failure(
        lambda: co.delete_collection_namespaced_custom_object(
            G, V, NS, "computes", label_selector="owner in (wf1"
        )
    )
    assert status == 400


# -- watches ---------------------------------------------------------------------------


def watch_events(co, count: int, **kwargs) -> list[dict]:
    """The first ``count`` events of a watch of computes in NS (bounded by timeout_seconds)."""
    stream = watch.Watch()
    events = []
    kwargs.setdefault("timeout_seconds", 3)
    for event in stream.stream(co.list_namespaced_custom_object, G, V, NS, "computes", **kwargs):
        events.append(event)
        if len(events) == count:
            stream.stop()
    return events


def test_watch_from_a_resource_version_sees_exactly_the_later_events_in_order(co):
    first = co.create_namespaced_custom_object(G, V, NS, "computes", computes("a"))
    co.create_namespaced_custom_object(G, V, NS, "computes", computes("b"))
    co.patch_namespaced_custom_object(G, V, NS, "computes", "a", {"data": [{"name": "n"}]})
    co.delete_namespaced_custom_object(G, V, NS, "computes", "b")
    events = watch_events(co, 3, resource_version=first["metadata"]["resourceVersion"])
    seen = [(e["type"], e["raw_object"]["metadata"]["name"]) for e in events]
    assert seen == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    versions = [rv(e["raw_object"]) for e in events]
    assert versions == sorted(versions) and versions[0] > rv(first)


def test_watch_without_a_version_starts_with_the_current_objects(co):
    for name in ("x", "y"):
        co.create_namespaced_custom_object(G, V, NS, "computes", computes(name))
    events = watch_events(co, 2)
    assert [(e["type"], e["raw_object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "x"),
        ("ADDED", "y"),
    ]


def test_a_labelled_watch_sees_objects_enter_and_leave_its_selector(co):
    start = co.create_namespaced_custom_object(G, V, NS, "computes", computes("s", {"k": "no"}))
    co.patch_namespaced_custom_object(
        G, V, NS, "computes", "s", {"metadata": {"labels": {"k": "yes"}}}
    )
    co.patch_namespaced_custom_object(G, V, NS, "computes", "s", {"data": [{"name": "n"}]})
    co.patch_namespaced_custom_object(
        G, V, NS, "computes", "s", {"metadata": {"labels": {"k": "no"}}}
    )
    events = watch_events(
        co, 3, resource_version=start["metadata"]["resourceVersion"], label_selector="k=yes"
    )
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]


def test_finalizer_deletion_is_watched_as_modified_then_deleted(co):
    start = co.create_namespaced_custom_object(
        G, V, NS, "computes", computes("f", finalizers=["x/y"])
    )
    co.delete_namespaced_custom_object(G, V, NS, "computes", "f")
    co.patch_namespaced_custom_object(G, V, NS, "computes", "f", {"metadata": {"finalizers": []}})
    events = watch_events(co, 2, resource_version=start["metadata"]["resourceVersion"])
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    assert events[0]["raw_object"]["metadata"]["deletionTimestamp"]


def test_bookmarks_carry_the_current_resource_version(co, kubeapi):
    last = co.create_namespaced_custom_object(G, V, NS, "computes", computes("b"))
    kubeapi.store.create("secrets", NS, {"metadata": {"name": "elsewhere"}})  # other resource
    stream = watch.Watch()
    for event in stream.stream(
        co.list_namespaced_custom_object,
        G,
        V,
        NS,
        "computes",
        resource_version=last["metadata"]["resourceVersion"],
        allow_watch_bookmarks=True,
        timeout_seconds=3,
    ):
        assert event["type"] == "BOOKMARK"
        bookmark = event["raw_object"]
        stream.stop()
    assert bookmark["kind"] == "Computes"
    assert bookmark["metadata"] == {"resourceVersion": kubeapi.store.resource_version}


def test_a_compacted_version_is_410_gone(co, kubeapi):
    old = co.create_namespaced_custom_object(G, V, NS, "computes", computes("a"))
    co.patch_namespaced_custom_object(G, V, NS, "computes", "a", {"data": [{"name": "n"}]})
    kubeapi.store.compact()
    with pytest.raises(ApiException) as info:
        watch_events(co, 1, resource_version=old["metadata"]["resourceVersion"])
    assert info.value.status == 410
    now = kubeapi.store.resource_version
    assert info.value.reason == (
        f"Expired: too old resource version: {old['metadata']['resourceVersion']} ({now})"
    )
    newer = co.patch_namespaced_custom_object(G, V, NS, "computes", "a", {"data": []})
    events = watch_events(co, 1, resource_version=now)
    assert rv(events[0]["raw_object"]) == rv(newer)


def test_the_history_window_bounds_replay():
    store = Store(history_limit=3)
    first = store.create("computes", NS, computes("a"))
    for i in range(4):
        store.patch("computes", NS, "a", {"data": [{"name": str(i)}]})
    with pytest.raises(ApiError) as info:  # the first patch fell out of the window
        store.watch("computes", NS, resource_version=first["metadata"]["resourceVersion"])
    assert (info.value.code, info.value.reason) == (410, "Expired")
    replay = store.watch("computes", NS, resource_version=str(rv(first) + 1))
    assert [replay.next(0)[1]["data"][0]["name"] for _ in range(3)] == ["1", "2", "3"]
    assert replay.next(0) is None


# -- the in-process store API (used by dwssim) -------------------------------------------


def test_store_copies_on_the_way_in_and_out():
    store = Store()
    body = computes("c", {"a": "b"})
    created = store.create("computes", NS, body)
    body["metadata"]["labels"]["a"] = "changed"
    created["metadata"]["labels"]["a"] = "changed"
    store.get("computes", NS, "c")["metadata"]["labels"]["a"] = "changed"
    assert store.get("computes", NS, "c")["metadata"]["labels"] == {"a": "b"}


def test_store_watch_zero_replays_current_objects_and_times_out_empty():
    store = Store()
    store.create("computes", NS, computes("c"))
    stream = store.watch("computes", NS, resource_version="0")
    assert stream.next(0)[0] == "ADDED"
    assert stream.next(0.01) is None
    store.patch("computes", NS, "c", {"data": [{"name": "n"}]})
    assert stream.next(1)[0] == "MODIFIED"
    stream.close()
    assert stream.closed and stream.next(1) is None


def test_store_admission_hooks_can_mutate_and_deny():
    store = Store()

    def hook(operation, old, new):
        if new["metadata"].get("labels", {}).get("deny"):
            raise ApiError(403, "Forbidden", "denied by test")
        new["metadata"].setdefault("annotations", {})["seen"] = operation
        return new

    store.add_admission("computes", hook)
    assert store.create("computes", NS, computes("c"))["metadata"]["annotations"] == {
        "seen": "CREATE"
    }
    updated = store.patch("computes", NS, "c", {"data": [{"name": "n"}]})
    assert updated["metadata"]["annotations"] == {"seen": "UPDATE"}
    with pytest.raises(ApiError) as info:
        store.patch("computes", NS, "c", {"metadata": {"labels": {"deny": "1"}}})
    assert info.value.status()["message"] == "denied by test"


def test_store_state_survives_dump_and_load():
    store = Store()
    store.create("computes", NS, computes("c", {"a": "b"}))
    copy = Store(namespaces=())
    copy.load(json.loads(json.dumps(store.dump())))
    assert copy.get("computes", NS, "c") == store.get("computes", NS, "c")
    assert copy.resource_version == store.resource_version


def test_shared_reads_are_the_stored_object_and_copies_are_private():
    store = Store()
    created = store.create("computes", NS, computes("c", {"a": "b"}), shared=True)
    assert store.get("computes", NS, "c", shared=True) is created
    assert store.list("computes", NS, shared=True)[0] == [created]
    mine = store.get("computes", NS, "c")
    assert mine == created and mine is not created
    mine["metadata"]["labels"]["a"] = "changed"
    assert store.get("computes", NS, "c", shared=True)["metadata"]["labels"] == {"a": "b"}
    patched = store.patch("computes", NS, "c", {"data": [{"name": "n"}]}, shared=True)
    assert patched is store.get("computes", NS, "c", shared=True) and patched is not created
    assert created["data"] == []  # an earlier version stays as it was committed


def test_a_shared_watch_sees_what_a_private_one_sees():
    store = Store()
    start = store.resource_version
    private = store.watch("computes", NS, resource_version=start)
    shared = store.watch("computes", NS, resource_version=start, shared=True)
    store.create("computes", NS, computes("c"))
    store.patch("computes", NS, "c", {"data": [{"name": "n"}]})
    store.delete("computes", NS, "c")
    for kind in ("ADDED", "MODIFIED", "DELETED"):
        mine, theirs = private.next(0), shared.next(0)
        assert mine[0] == theirs[0] == kind
        assert mine[1] == theirs[1]
        assert theirs[1] is not mine[1]
    assert shared.next(0) is None and private.next(0) is None


def test_readers_over_http_never_change_the_stored_objects(co, kubeapi):
    """The server answers from the stored objects themselves: it must only ever encode them."""
    store = kubeapi.store
    created = co.create_namespaced_custom_object(G, V, NS, "computes", computes("c", {"a": "b"}))
    co.get_namespaced_custom_object(G, "v1alpha6", NS, "computes", "c")
    co.list_namespaced_custom_object(G, "v1alpha6", NS, "computes")
    patch = {"data": [{"name": "n"}]}
    co.patch_namespaced_custom_object(G, "v1alpha6", NS, "computes", "c", patch)
    events = watch_events(
        co, 1, resource_version=created["metadata"]["resourceVersion"], label_selector="a=b"
    )
    assert [(e["type"], e["raw_object"]["apiVersion"]) for e in events] == [
        ("MODIFIED", f"{G}/{V}")
    ]
    co.create_namespaced_custom_object(G, V, NS, "computes", computes("f", finalizers=["x/y"]))
    co.delete_namespaced_custom_object(G, "v1alpha6", NS, "computes", "f")
    for plural in ("computes", "namespaces"):
        assert store.list(plural, shared=True)[0] == store.list(plural)[0]
    assert store.get("computes", NS, "c", shared=True)["apiVersion"] == f"{G}/{V}"


def test_a_watch_under_another_version_says_that_version(co):
    start = co.create_namespaced_custom_object(G, V, NS, "computes", computes("o", {"k": "v"}))
    co.patch_namespaced_custom_object(G, V, NS, "computes", "o", {"data": [{"name": "n"}]})
    co.patch_namespaced_custom_object(G, V, NS, "computes", "o", {"metadata": {"labels": None}})
    stream = watch.Watch()
    events = []
    for event in stream.stream(
        co.list_namespaced_custom_object,
        G,
        "v1alpha6",
        NS,
        "computes",
        resource_version=start["metadata"]["resourceVersion"],
        label_selector="k=v",
        allow_watch_bookmarks=True,
        timeout_seconds=3,
    ):
        events.append(event)
        if event["type"] == "BOOKMARK":
            stream.stop()
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED", "BOOKMARK"]
    assert {e["raw_object"]["apiVersion"] for e in events} == {f"{G}/v1alpha6"}
    assert events[0]["raw_object"]["data"] == [{"name": "n"}]


# -- admission (dws-api.md section 1) --------------------------------------------------


def test_the_mutating_webhook_adds_driver_entries_and_env(co):
    directives = [
        "#DW jobdw type=xfs capacity=10GiB name=scratch",
        "#DW copy_out source=$DW_JOB_scratch/out destination=/home/out",
        "#DW PreRun action=wait",
    ]
    created = co.create_namespaced_custom_object(G, V, NS, "workflows", workflow("m", directives))
    drivers = created["status"]["drivers"]
    expected = [
        (driver, index, state.value)
        for index, directive in enumerate(directives)
        for driver, state in ruleset.watched_states(directive)
    ]
    assert [(d["driverID"], d["dwdIndex"], d["watchState"]) for d in drivers] == expected
    assert {(d["status"], d["completed"]) for d in drivers} == {("Pending", False)}
    assert created["status"]["env"] == {"DW_WORKFLOW_NAME": "m", "DW_WORKFLOW_NAMESPACE": NS}
    assert created["status"].get("state", "") == "" and created["status"]["ready"] is False


@pytest.mark.parametrize(
    "spec, code, message",
    [
        (
            {"desiredState": "Setup"},
            403,
            WEBHOOK_DENIED
            + 'Spec.DesiredState: Invalid value: "Setup": desired state must start in Proposal',
        ),
        (
            {"hurry": True},
            403,
            WEBHOOK_DENIED + "Spec.Hurry: Forbidden: the hurry flag may not be set on creation",
        ),
        (
            {"dwDirectives": ["#DW jobdw type=xfs capacity=1GiB name=ab", "#DW bogus x=1"]},
            403,
            WEBHOOK_DENIED + "invalid directive '#DW bogus x=1'",
        ),
        (
            {"dwDirectives": ["jobdw type=xfs"]},
            403,
            WEBHOOK_DENIED + "missing '#DW' prefix in directive 'jobdw type=xfs'",
        ),
        (
            {"wlmID": None},
            422,
            f'Workflow.{G} "w" is invalid: spec.wlmID: Required value',
        ),
        (
            {"desiredState": None, "jobID": None},
            422,
            f'Workflow.{G} "w" is invalid: [spec.desiredState: Required value,'
            " spec.jobID: Required value]",
        ),
        (
            {"desiredState": "Bogus"},
            422,
            f'Workflow.{G} "w" is invalid: spec.desiredState: Unsupported value: "Bogus":'
            ' supported values: "Proposal", "Setup", "DataIn", "PreRun", "PostRun", "DataOut",'
            ' "Teardown"',
        ),
        (
            {"userID": "root"},
            422,
            f'Workflow.{G} "w" is invalid: spec.userID: Invalid value: "string": spec.userID in'
            ' body must be of type integer: "string"',
        ),
    ],
)
def test_create_rejections(co, spec, code, message):
    status, body, _ = failure(
        lambda: co.create_namespaced_custom_object(G, V, NS, "workflows", workflow("w", **spec))
    )
    assert (status, body["code"], body["message"]) == (code, code, message)
    assert body["reason"] == ("Forbidden" if code == 403 else "Invalid")


def test_status_state_may_not_be_set_on_create(co):
    body = workflow("w")
    body["status"] = {"state": "Proposal"}
    status, answer, _ = failure(
        lambda: co.create_namespaced_custom_object(G, V, NS, "workflows", body)
    )
    assert (status, answer["message"]) == (
        403,
        WEBHOOK_DENIED + "Status.State: Forbidden: the status state may not be set on creation",
    )


def at_state(kubeapi, name: str, state: str, ready: bool, status: str = "Completed") -> None:
    """Play the DWS controller: desiredState and status.state at ``state``."""
    store = kubeapi.store
    if store.get("workflows", NS, name).get("status", {}).get("state") is None:
        store.patch("workflows", NS, name, {"status": {"state": "Proposal", "ready": True}})
    order = ["Proposal", "Setup", "DataIn", "PreRun", "PostRun", "DataOut", "Teardown"]
    current = store.get("workflows", NS, name)["spec"]["desiredState"]
    for step in order[order.index(current) + 1 : order.index(state) + 1]:
        store.patch("workflows", NS, name, {"status": {"ready": True}})
        store.patch("workflows", NS, name, {"spec": {"desiredState": step}})
        store.patch("workflows", NS, name, {"status": {"state": step}})
    store.patch("workflows", NS, name, {"status": {"ready": ready, "status": status}})


# Each refused update runs in tests/test_realdws_webhook.py, on this port and on DWS's own webhook.


@pytest.mark.parametrize(
    "state, ready, status, desired",
    [
        ("Proposal", False, "Error", "Teardown"),  # Teardown from anywhere, even in Error
        ("PreRun", False, "TransientCondition", "Teardown"),
        ("Setup", False, "DriverWait", "Setup"),  # staying put
        ("Setup", True, "Completed", "DataIn"),  # one step once ready
        ("Teardown", False, "DriverWait", "Teardown"),
    ],
)
def test_allowed_moves(co, kubeapi, state, ready, status, desired):
    co.create_namespaced_custom_object(G, V, NS, "workflows", workflow("ok"))
    at_state(kubeapi, "ok", state, ready, status)
    spec = {"desiredState": desired, "hurry": desired == "Teardown"}
    moved = co.patch_namespaced_custom_object(G, V, NS, "workflows", "ok", {"spec": spec})
    assert moved["spec"]["desiredState"] == desired


def test_controller_status_updates_pass_and_driver_rules_hold(co, kubeapi):
    created = co.create_namespaced_custom_object(G, V, NS, "workflows", workflow("d"))
    at_state(kubeapi, "d", "Proposal", False, "DriverWait")
    drivers = created["status"]["drivers"]
    done = [dict(drivers[0], completed=True, status="Completed")] + drivers[1:]
    updated = co.patch_namespaced_custom_object(
        G, V, NS, "workflows", "d", {"status": {"drivers": done, "ready": True}}
    )
    assert updated["status"]["drivers"][0]["completed"] is True
    other = done[:1] + [dict(done[1], status="Running")] + done[2:]
    status, body, _ = failure(
        lambda: co.patch_namespaced_custom_object(
            G, V, NS, "workflows", "d", {"status": {"drivers": other}}
        )
    )
    assert (status, body["message"]) == (
        403,
        WEBHOOK_DENIED
        + "Status.Drivers[1]: Internal error: driver entry for non-current state cannot be changed",
    )
    undone = [dict(done[0], completed=False, status="Running")] + done[1:]
    status, body, _ = failure(
        lambda: co.patch_namespaced_custom_object(
            G, V, NS, "workflows", "d", {"status": {"drivers": undone}}
        )
    )
    assert body["message"] == (
        WEBHOOK_DENIED
        + "Status.Drivers[0]: Internal error: driver cannot change from completed state"
    )


# -- Table output ------------------------------------------------------------------------


def test_table_responses_carry_the_workflow_print_columns(kubeapi, co):
    co.create_namespaced_custom_object(G, V, NS, "workflows", workflow("t"))
    request = urllib.request.Request(
        f"{kubeapi.url}/apis/{G}/{V}/workflows",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        table = json.load(answer)
    assert table["kind"] == "Table"
    columns = [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0]
    assert columns == ["Name", "STATE", "READY", "STATUS", "JOBID", "AGE"]
    (row,) = table["rows"]
    assert row["cells"][:5] == ["t", None, False, None, "7"]
    assert row["object"]["metadata"]["namespace"] == NS
    request.full_url += "?watch=true&timeoutSeconds=5"  # kubectl get -w: each event a Table
    with urllib.request.urlopen(request, timeout=30) as answer:
        event = json.loads(answer.readline())
    assert (event["type"], event["object"]["kind"]) == ("ADDED", "Table")
    assert event["object"]["rows"][0]["cells"][0] == "t"


# -- faults ----------------------------------------------------------------------------


@pytest.fixture
def bare_client(kubeapi):
    """A client whose urllib3 does not retry, so every fault reaches the caller."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeapi.kubeconfig, client_configuration=configuration)
    configuration.retries = False
    with client.ApiClient(configuration) as api_client:
        yield client.CustomObjectsApi(api_client)


def test_injected_429_carries_retry_after(kubeapi, bare_client):
    kubeapi.faults.set(error_rate=1.0, error_codes=(429,), retry_after=3)
    status, body, exc = failure(
        lambda: bare_client.list_namespaced_custom_object(G, V, NS, "computes")
    )
    assert (status, body["reason"], exc.headers["Retry-After"]) == (429, "TooManyRequests", "3")
    kubeapi.faults.clear()
    assert bare_client.list_namespaced_custom_object(G, V, NS, "computes")["items"] == []


@pytest.mark.parametrize("code, reason", [(500, "InternalError"), (503, "ServiceUnavailable")])
def test_fail_next_answers_exactly_that_many_requests(kubeapi, co, code, reason):
    kubeapi.faults.fail_next(2, code=code)
    for _ in range(2):
        status, body, _ = failure(lambda: co.list_namespaced_custom_object(G, V, NS, "computes"))
        assert (status, body["reason"]) == (code, reason)
    assert co.list_namespaced_custom_object(G, V, NS, "computes")["items"] == []


def test_faults_can_target_verbs_and_resources(kubeapi, co):
    kubeapi.faults.set(error_rate=1.0, error_codes=(503,), verbs={"create"}, plurals={"servers"})
    co.create_namespaced_custom_object(G, V, NS, "computes", computes("fine"))
    assert (
        failure(
            lambda: co.create_namespaced_custom_object(
                G, V, NS, "servers", computes("s") | {"kind": "Servers"}
            )
        )[0]
        == 503
    )
    assert co.list_namespaced_custom_object(G, V, NS, "servers")["items"] == []


def test_error_rate_is_a_seeded_share():
    def outcomes(seed: int) -> list:
        faults = Faults(seed)
        faults.set(error_rate=0.5, drop_rate=0.1, error_codes=(500, 503, 429))
        return [faults.decide("workflows", "get") for _ in range(200)]

    first = outcomes(7)
    assert first == outcomes(7)  # reproducible
    assert first != outcomes(8)
    errors = [d.error for d in first if d.error]
    assert 60 < len(errors) < 140 and set(errors) == {500, 503, 429}
    assert any(d.drop for d in first) and not any(d.drop and d.error for d in first)


def test_latency_is_added_before_the_answer(kubeapi, bare_client):
    kubeapi.faults.set(latency=1.0)
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        bare_client.list_namespaced_custom_object(G, V, NS, "computes", _request_timeout=(2, 0.1))
    kubeapi.faults.clear()
    assert bare_client.list_namespaced_custom_object(G, V, NS, "computes", _request_timeout=5)


def test_dropped_connections(kubeapi, co, bare_client):
    kubeapi.faults.drop_next(1)
    with pytest.raises(urllib3.exceptions.ProtocolError):
        bare_client.create_namespaced_custom_object(G, V, NS, "computes", computes("lost"))
    assert kubeapi.request_counts()[("create", "computes")] == 1
    assert failure(lambda: co.get_namespaced_custom_object(G, V, NS, "computes", "lost"))[0] == 404
    kubeapi.reset_counts()
    kubeapi.faults.drop_next(1)  # the default client retries an idempotent GET by itself
    assert co.list_namespaced_custom_object(G, V, NS, "computes")["items"] == []
    assert kubeapi.request_counts() == {("list", "computes"): 2}


def stream_in_thread(co, **kwargs):
    """Consume a computes watch in a thread; returns (events, outcome) filled as it runs."""
    events: list = []
    outcome: dict = {}

    def run() -> None:
        try:
            for event in watch.Watch().stream(
                co.list_namespaced_custom_object, G, V, NS, "computes", **kwargs
            ):
                events.append(event["type"])
            outcome["ended"] = True
        except Exception as exc:  # what the client saw
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, events, outcome


@pytest.mark.parametrize("graceful", [False, True])
def test_cut_watches_ends_every_open_stream(kubeapi, co, graceful):
    thread, events, outcome = stream_in_thread(co, timeout_seconds=10)
    wait_for(lambda: kubeapi.open_watches() == 1, "the watch to open")
    co.create_namespaced_custom_object(G, V, NS, "computes", computes("seen"))
    wait_for(lambda: events, "the first event")
    kubeapi.faults.cut_watches(graceful=graceful)
    thread.join(30)
    assert not thread.is_alive() and events == ["ADDED"]
    if graceful:
        assert outcome == {"ended": True}
    else:
        assert isinstance(outcome.get("error"), urllib3.exceptions.ProtocolError)


def test_forced_410_hits_only_the_next_watch_with_a_version(kubeapi, co):
    last = co.create_namespaced_custom_object(G, V, NS, "computes", computes("a"))
    version = last["metadata"]["resourceVersion"]
    kubeapi.faults.force_410_next_watch()
    with pytest.raises(ApiException) as info:
        watch_events(co, 1, resource_version=version)
    assert info.value.status == 410
    co.patch_namespaced_custom_object(G, V, NS, "computes", "a", {"data": [{"name": "n"}]})
    assert [e["type"] for e in watch_events(co, 1, resource_version=version)] == ["MODIFIED"]


def test_request_counts_by_verb_and_resource(kubeapi, co):
    kubeapi.reset_counts()
    co.create_namespaced_custom_object(G, V, NS, "computes", computes("c"))
    co.get_namespaced_custom_object(G, V, NS, "computes", "c")
    co.get_namespaced_custom_object(G, V, NS, "computes", "c")
    co.list_cluster_custom_object(G, V, "workflows")
    assert kubeapi.request_counts() == {
        ("create", "computes"): 1,
        ("get", "computes"): 2,
        ("list", "workflows"): 1,
    }


# -- kubectl and the command line ------------------------------------------------------


def test_kubectl_get_patch_delete(kubeapi, tmp_path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    kubeapi.store.create("workflows", NS, workflow("wf-k"))
    env = dict(os.environ, KUBECONFIG=kubeapi.kubeconfig, HOME=str(tmp_path))

    def run(*args: str) -> str:
        done = subprocess.run(
            [kubectl, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    header = run("get", "workflows", "-A").splitlines()[0].split()
    assert header == ["NAMESPACE", "NAME", "STATE", "READY", "STATUS", "JOBID", "AGE"]
    assert "name: wf-k" in run("get", "workflow", "wf-k", "-o", "yaml")
    run("patch", "workflow", "wf-k", "--type=merge", "-p", '{"metadata":{"labels":{"k":"v"}}}')
    assert kubeapi.store.get("workflows", NS, "wf-k")["metadata"]["labels"] == {"k": "v"}
    run("delete", "workflow", "wf-k")
    assert kubeapi.store.list("workflows")[0] == []


def test_the_command_line_serves_and_keeps_state(tmp_path):
    state = tmp_path / "state.json"

    def serve() -> tuple[subprocess.Popen, str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "flux_dws.testing.kubeapi", "--state", str(state),
             "--kubeconfig", str(tmp_path / "kc")],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
        url = process.stdout.readline().strip()
        assert process.stdout.readline().strip() == str(tmp_path / "kc")
        return process, url

    def stop(process: subprocess.Popen) -> None:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0

    process, url = serve()
    try:
        request = urllib.request.Request(
            f"{url}/apis/{G}/{V}/namespaces/{NS}/computes",
            data=json.dumps(computes("kept")).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 201
    finally:
        stop(process)
    process, url = serve()
    try:
        with urllib.request.urlopen(f"{url}/apis/{G}/{V}/computes", timeout=30) as answer:
            assert [o["metadata"]["name"] for o in json.load(answer)["items"]] == ["kept"]
    finally:
        stop(process)


def test_label_selector_parse_names_the_bad_requirement():
    with pytest.raises(ApiError) as info:
        parse_label_selector("a=b,,c")
    assert info.value.code == 400 and "a=b,,c" in info.value.message


def test_container_job_kinds_nnf_sos_lists_as_it_finalizes_a_workflow(k8s_client, co):
    """nnf-sos's deleteContainers lists a workflow's batch Jobs and MPIJobs (kubeflow.org) by
    label on every workflow's deletion: without them served, no workflow is ever finalized."""
    selector = "dataworkflowservices.github.io/workflow.name=wf"
    batch = client.BatchV1Api(k8s_client)
    assert batch.list_namespaced_job("default", label_selector=selector).items == []
    job = {
        "metadata": {"name": "c", "labels": {"dataworkflowservices.github.io/workflow.name": "wf"}}
    }
    batch.create_namespaced_job("default", job)
    assert [j.metadata.name for j in batch.list_namespaced_job("default").items] == ["c"]
    batch.delete_collection_namespaced_job("default", label_selector=selector)
    assert batch.list_namespaced_job("default").items == []
    mpi = co.list_namespaced_custom_object(
        "kubeflow.org", "v2beta1", "default", "mpijobs", label_selector=selector
    )
    assert (mpi["kind"], mpi["items"]) == ("MPIJobList", [])


def test_an_update_may_keep_an_invalid_value_it_does_not_change(kubeapi, co):
    """CRD validation ratcheting (kube-apiserver 1.30 on): a workflow whose status already holds
    a value the schema refuses (written before the schema tightened, or by hand) can still be
    patched elsewhere; a write that sets or changes the value is refused.  Without it, every
    later patch of such a workflow failed 422 and its job could never be torn down."""
    co.create_namespaced_custom_object(G, V, NS, "workflows", workflow("w"))
    store = kubeapi.store
    hooks = store._hooks["workflows"]
    with store._lock:  # as by hand: no admission, no schema
        saved, hooks[:] = list(hooks), []
        try:
            store.patch("workflows", NS, "w", {"status": {"status": "", "state": "Proposal"}})
        finally:
            hooks[:] = saved
    patched = co.patch_namespaced_custom_object(
        G, V, NS, "workflows", "w", {"metadata": {"labels": {"ok": "yes"}}}
    )
    assert patched["metadata"]["labels"] == {"ok": "yes"} and patched["status"]["status"] == ""
    status, body, _ = failure(
        lambda: co.patch_namespaced_custom_object(
            G, V, NS, "workflows", "w", {"status": {"status": "Bogus"}}
        )
    )
    assert (status, body["reason"]) == (422, "Invalid")
    assert 'status.status: Unsupported value: "Bogus"' in body["message"]
