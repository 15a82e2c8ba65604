# SPDX-License-Identifier: LGPL-3.0-only
"""kube-apiserver behaviour of the stand-in, through the real kubernetes client over HTTP.

Dry runs, OpenAPI documents and field validation, server-side apply and managedFields,
namespace lifecycle, paging, field selectors, Table columns, error details, query parameter
spellings and the status subresource: each as the real server has it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from flux_dws.testing.kubeapi import managed, subresources
from flux_dws.testing.kubeapi.paging import EXPIRED_MESSAGE

G = "dataworkflowservices.github.io"
V = "v1alpha7"
NS = "default"
DIRECTIVES = ["#DW jobdw type=xfs capacity=10GiB name=scratch"]
APPLY = "application/apply-patch+yaml"


def workflow(name: str, **spec) -> dict:
    body = {"desiredState": "Proposal", "wlmID": "flux", "jobID": 7, "userID": 1001,
            "groupID": 100, "dwDirectives": list(DIRECTIVES), **spec}  # fmt: skip
    return {"apiVersion": f"{G}/{V}", "kind": "Workflow", "metadata": {"name": name},
            "spec": body}  # fmt: skip


def failure(call) -> tuple[int, dict]:
    with pytest.raises(ApiException) as info:
        call()
    return info.value.status, json.loads(info.value.body)


def get_json(kubeapi, path: str) -> tuple[int, dict, dict]:
    try:
        with urllib.request.urlopen(f"{kubeapi.url}{path}", timeout=10) as answer:
            return answer.status, json.load(answer), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc), dict(exc.headers)


# -- 1. dry run ------------------------------------------------------------------------


def test_dry_run_all_stores_nothing_on_any_write(kubeapi, co):
    store = kubeapi.store
    would = co.create_namespaced_custom_object(G, V, NS, "workflows", workflow("wf"), dry_run="All")
    assert would["metadata"]["name"] == "wf" and would["status"]["drivers"]  # admitted, mutated
    assert store.list("workflows")[0] == []
    store.create("workflows", NS, workflow("wf"))
    before, version = store.get("workflows", NS, "wf"), store.resource_version
    labelled = co.patch_namespaced_custom_object(
        G, V, NS, "workflows", "wf", {"metadata": {"labels": {"a": "b"}}}, dry_run="All"
    )
    assert labelled["metadata"]["labels"] == {"a": "b"}
    replaced = dict(before, metadata={**before["metadata"], "annotations": {"n": "1"}})
    co.replace_namespaced_custom_object(G, V, NS, "workflows", "wf", replaced, dry_run="All")
    applied = {**workflow("wf"), "metadata": {"name": "wf", "labels": {"x": "y"}}}
    co.patch_namespaced_custom_object(
        G, V, NS, "workflows", "wf", applied, dry_run="All", field_manager="m",
        _content_type=APPLY,
    )  # fmt: skip
    co.delete_namespaced_custom_object(G, V, NS, "workflows", "wf", dry_run="All")
    assert store.get("workflows", NS, "wf") == before
    assert store.resource_version == version
    status, body = failure(
        lambda: co.delete_namespaced_custom_object(G, V, NS, "workflows", "wf", dry_run="Yes")
    )
    assert status == 422 and body["message"].startswith('DeleteOptions.meta.k8s.io "" is invalid')


# -- 2. OpenAPI and field validation ----------------------------------------------------


def test_openapi_v3_describes_each_group_version(kubeapi):
    status, index, _ = get_json(kubeapi, "/openapi/v3")
    assert status == 200
    assert {"api/v1", f"apis/{G}/{V}", "apis/nnf.cray.hpe.com/v1alpha10"} <= set(index["paths"])
    url = index["paths"][f"apis/{G}/{V}"]["serverRelativeURL"]
    status, doc, _ = get_json(kubeapi, url)
    schema = doc["components"]["schemas"][f"io.github.dataworkflowservices.{V}.Workflow"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": G, "kind": "Workflow",
                                                          "version": V}]  # fmt: skip
    assert schema["properties"]["spec"]["properties"]["desiredState"]["enum"][0] == "Proposal"
    patch = doc["paths"][f"/apis/{G}/{V}/namespaces/{{namespace}}/workflows/{{name}}"]["patch"]
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    status, v2, _ = get_json(kubeapi, "/openapi/v2")
    assert status == 200 and v2["swagger"] == "2.0"
    assert f"io.github.dataworkflowservices.{V}.Storage" in v2["definitions"]
    assert get_json(kubeapi, "/openapi/v3/apis/nowhere.example/v1")[0] == 404


def test_unknown_fields_are_refused_when_strict_and_pruned_otherwise(kubeapi, co):
    body = workflow("wf", bogus=1)
    status, answer = failure(
        lambda: co.create_namespaced_custom_object(
            G, V, NS, "workflows", body, field_validation="Strict"
        )
    )
    assert status == 400 and answer["message"] == (
        'Workflow in version "v1alpha7" cannot be handled as a Workflow: strict decoding error:'
        ' unknown field "spec.bogus"'
    )
    request = urllib.request.Request(
        f"{kubeapi.url}/apis/{G}/{V}/namespaces/{NS}/workflows",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 201
        assert answer.headers["Warning"] == '299 - "unknown field \\"spec.bogus\\""'
    assert "bogus" not in kubeapi.store.get("workflows", NS, "wf")["spec"]
    status, answer = failure(
        lambda: co.patch_namespaced_custom_object(
            G, V, NS, "workflows", "wf", {"spec": {"extra": 1}}, field_validation="Strict"
        )
    )
    assert status == 400 and 'unknown field "spec.extra"' in answer["message"]


# -- 3. server-side apply and managedFields ---------------------------------------------


def apply(co, body, manager="ops", **kwargs):
    name = body["metadata"]["name"]
    return co.patch_namespaced_custom_object(
        G, V, NS, "workflows", name, body, field_manager=manager, _content_type=APPLY, **kwargs
    )


def test_apply_creates_then_conflicts_with_another_manager(kubeapi, co):
    labelled = {**workflow("wf"), "metadata": {"name": "wf", "labels": {"team": "a"}}}
    apply(co, labelled)  # 201 Created (which this client's patch decodes as None)
    created = co.get_namespaced_custom_object(G, V, NS, "workflows", "wf")
    entry = created["metadata"]["managedFields"][0]
    assert (entry["manager"], entry["operation"], entry["apiVersion"]) == (
        "ops",
        "Apply",
        f"{G}/{V}",
    )
    assert entry["fieldsV1"]["f:spec"]["f:desiredState"] == {}
    relabel = {"metadata": {"labels": {"team": "b"}}}
    co.patch_namespaced_custom_object(G, V, NS, "workflows", "wf", relabel, field_manager="tool")
    status, body = failure(lambda: apply(co, labelled))
    assert status == 409 and body["reason"] == "Conflict"
    assert body["message"] == (
        f'Apply failed with 1 conflict: conflict with "tool" using {G}/{V}: .metadata.labels.team'
    )
    assert body["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": f'conflict with "tool" using {G}/{V}',
         "field": ".metadata.labels.team"}
    ]  # fmt: skip
    forced = apply(co, labelled, force=True)
    assert forced["metadata"]["labels"] == {"team": "a"}
    managers = [e["manager"] for e in forced["metadata"]["managedFields"]]
    assert managers == ["ops"]  # "tool" owned nothing else: its entry is gone
    status, body = failure(
        lambda: co.patch_namespaced_custom_object(
            G, V, NS, "workflows", "wf", labelled, _content_type=APPLY
        )
    )
    assert status == 422 and "fieldManager: Required value" in body["message"]


def test_updates_record_their_manager_and_default_to_the_user_agent(kubeapi, co):
    created = co.create_namespaced_custom_object(G, V, NS, "workflows", workflow("wf"))
    entry = created["metadata"]["managedFields"][0]
    assert entry["operation"] == "Update" and entry["manager"] == "OpenAPI-Generator"
    patched = co.patch_namespaced_custom_object(
        G, V, NS, "workflows", "wf", {"metadata": {"annotations": {"k": "v"}}}, field_manager="me"
    )
    mine = [e for e in patched["metadata"]["managedFields"] if e["manager"] == "me"][0]
    assert mine["fieldsV1"] == {"f:metadata": {"f:annotations": {".": {}, "f:k": {}}}}
    # a no-op write changes nothing, not even the resourceVersion
    again = co.patch_namespaced_custom_object(
        G, V, NS, "workflows", "wf", {"metadata": {"annotations": {"k": "v"}}}, field_manager="me"
    )
    assert again["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]
    cleared = co.patch_namespaced_custom_object(
        G, V, NS, "workflows", "wf", {"metadata": {"managedFields": [{}]}}
    )
    assert "managedFields" not in cleared["metadata"]


# -- 4. namespaces ---------------------------------------------------------------------


def test_namespaces_exist_before_their_objects_and_take_them_when_deleted(kubeapi, co, core):
    status, body = failure(
        lambda: co.create_namespaced_custom_object(G, V, "gone", "workflows", workflow("wf"))
    )
    assert status == 404 and body["message"] == 'namespaces "gone" not found'
    assert body["details"] == {"name": "gone", "kind": "namespaces"}
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team")))
    assert [n.metadata.name for n in core.list_namespace().items] == ["default", "team"]
    held = workflow("held")
    held["metadata"]["finalizers"] = ["x/y"]
    co.create_namespaced_custom_object(G, V, "team", "workflows", held)
    co.create_namespaced_custom_object(G, V, "team", "workflows", workflow("free"))
    core.delete_namespace("team")
    terminating = core.read_namespace("team")
    assert terminating.status.phase == "Terminating"
    assert [o["metadata"]["name"] for o in kubeapi.store.list("workflows", "team")[0]] == ["held"]
    status, body = failure(
        lambda: co.create_namespaced_custom_object(G, V, "team", "workflows", workflow("new"))
    )
    assert status == 403 and "because it is being terminated" in body["message"]
    co.patch_namespaced_custom_object(G, V, "team", "workflows", "held",
                                      {"metadata": {"finalizers": None}})  # fmt: skip
    assert failure(lambda: core.read_namespace("team"))[0] == 404


# -- 5. paging -------------------------------------------------------------------------


def test_pages_follow_continue_tokens_from_one_snapshot(kubeapi, co):
    for i in range(5):
        kubeapi.store.create("workflows", NS, workflow(f"wf-{i}"))
    first = co.list_namespaced_custom_object(G, V, NS, "workflows", limit=2)
    assert [o["metadata"]["name"] for o in first["items"]] == ["wf-0", "wf-1"]
    assert first["metadata"]["remainingItemCount"] == 3
    kubeapi.store.create("workflows", NS, workflow("wf-9"))  # after the snapshot
    kubeapi.store.patch("workflows", NS, "wf-3", {"metadata": {"labels": {"late": "yes"}}})
    token = first["metadata"]["continue"]
    second = co.list_namespaced_custom_object(G, V, NS, "workflows", limit=2, _continue=token)
    third = co.list_namespaced_custom_object(
        G, V, NS, "workflows", limit=2, _continue=second["metadata"]["continue"]
    )
    assert [o["metadata"]["name"] for o in second["items"] + third["items"]] == [
        "wf-2", "wf-3", "wf-4"
    ]  # fmt: skip
    assert "labels" not in second["items"][1]["metadata"]  # as it was at the first page
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert "continue" not in third["metadata"]


def test_an_expired_token_is_410_with_an_inconsistent_continuation(kubeapi, co):
    for i in range(4):
        kubeapi.store.create("workflows", NS, workflow(f"wf-{i}"))
    first = co.list_namespaced_custom_object(G, V, NS, "workflows", limit=2)
    kubeapi.store.patch("workflows", NS, "wf-0", {"metadata": {"labels": {"a": "b"}}})
    kubeapi.store.compact()
    token = first["metadata"]["continue"]
    status, body = failure(
        lambda: co.list_namespaced_custom_object(G, V, NS, "workflows", limit=2, _continue=token)
    )
    assert (status, body["reason"], body["message"]) == (410, "Expired", EXPIRED_MESSAGE)
    rest = co.list_namespaced_custom_object(
        G, V, NS, "workflows", limit=2, _continue=body["metadata"]["continue"]
    )
    assert [o["metadata"]["name"] for o in rest["items"]] == ["wf-2", "wf-3"]
    assert rest["metadata"]["resourceVersion"] == kubeapi.store.resource_version
    for bad in ("not-a-token", "eyJ2IjoidjEifQ"):
        status, body = failure(
            lambda bad=bad: co.list_namespaced_custom_object(G, V, NS, "workflows", _continue=bad)
        )
        assert status == 400 and body["message"].startswith("continue key is not valid")
    status, body = failure(
        lambda: co.list_namespaced_custom_object(
            G, V, NS, "workflows", _continue=token, resource_version="5"
        )
    )
    assert status == 400


# -- 6. field selectors ----------------------------------------------------------------


@pytest.mark.parametrize(
    "plural, selector, supported",
    [
        ("workflows", "metadata.name=a", True),
        ("workflows", "metadata.namespace=default", True),
        ("workflows", "spec.jobID=7", False),
        ("storages", "status.status=Ready", False),
        ("pods", "spec.nodeName=n1", True),
        ("pods", "spec.foo=n1", False),
        ("secrets", "type=Opaque", True),
        ("events", "involvedObject.name=x", True),
    ],
)
def test_field_labels_are_those_the_kind_supports(kubeapi, k8s_client, plural, selector, supported):
    group = "" if plural in ("pods", "secrets", "events") else G
    path = (
        f"/api/v1/namespaces/{NS}/{plural}"
        if not group
        else (f"/apis/{G}/{V}/namespaces/{NS}/{plural}")
    )
    status, body, _ = get_json(kubeapi, f"{path}?fieldSelector={selector}")
    if supported:
        assert status == 200
    else:
        label = selector.split("=")[0]
        assert (status, body["message"]) == (400, f"field label not supported: {label}")
    watch_path = f"{path}?watch=1&fieldSelector={selector}&timeoutSeconds=0"
    try:
        with urllib.request.urlopen(f"{kubeapi.url}{watch_path}", timeout=10) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    assert status == (200 if supported else 400)


# -- 7. Table columns -------------------------------------------------------------------


def table_of(kubeapi, path: str) -> dict:
    request = urllib.request.Request(
        f"{kubeapi.url}{path}",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def test_tables_carry_the_crd_columns_and_the_core_printers(kubeapi):
    store = kubeapi.store
    store.create("storages", NS, {"metadata": {"name": "r1"}, "spec": {"state": "Enabled"},
                                  "status": {"status": "Ready"}})  # fmt: skip
    found = table_of(kubeapi, f"/apis/{G}/{V}/namespaces/{NS}/storages")
    columns = [(c["name"], c["type"]) for c in found["columnDefinitions"]]
    assert columns == [("Name", "string"), ("State", "string"), ("Status", "string"),
                       ("Mode", "string"), ("Age", "date")]  # fmt: skip
    assert found["rows"][0]["cells"][:4] == ["r1", "Enabled", "Ready", None]
    store.create("servers", NS, {"metadata": {"name": "s"}})
    error = table_of(kubeapi, f"/apis/{G}/{V}/namespaces/{NS}/servers")["columnDefinitions"][2]
    assert error["description"] == (
        "Custom resource definition column (in JSONPath format): .status.error.severity"
    )
    store.create("pods", NS, {"metadata": {"name": "p"}, "spec": {"containers": [{}, {}]},
                              "status": {"phase": "Running", "containerStatuses": [
                                  {"ready": True, "restartCount": 2,
                                   "state": {"running": {}}}]}})  # fmt: skip
    pod = table_of(kubeapi, f"/api/v1/namespaces/{NS}/pods")["rows"][0]["cells"]
    assert pod[:4] == ["p", "1/2", "Running", 2]
    store.create("events", NS, {"metadata": {"name": "e"}, "type": "Warning", "reason": "Boom",
                                "involvedObject": {"kind": "Workflow", "name": "wf"},
                                "message": " bad \n"})  # fmt: skip
    event = table_of(kubeapi, f"/api/v1/namespaces/{NS}/events")
    assert [c["name"] for c in event["columnDefinitions"]][:5] == [
        "Last Seen", "Type", "Reason", "Object", "Subobject"
    ]  # fmt: skip
    assert event["rows"][0]["cells"][1:4] == ["Warning", "Boom", "workflow/wf"]


# -- 8. error details ------------------------------------------------------------------


def test_422_carries_kind_name_and_causes(co):
    status, body = failure(
        lambda: co.create_namespaced_custom_object(
            G, V, NS, "workflows", workflow("wf", desiredState="Bogus", userID="x")
        )
    )
    assert status == 422
    details = body["details"]
    assert (details["kind"], details["group"], details["name"]) == ("Workflow", G, "wf")
    causes = {c["field"]: c for c in details["causes"]}
    assert causes["spec.desiredState"]["reason"] == "FieldValueNotSupported"
    assert causes["spec.desiredState"]["message"].startswith('Unsupported value: "Bogus"')
    assert causes["spec.userID"]["reason"] == "FieldValueTypeInvalid"


# -- 9. query parameters ----------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["true", "True", "TRUE", "t", "T", "1"])
def test_every_parse_bool_spelling_of_true_watches(kubeapi, spelling):
    kubeapi.store.create("workflows", NS, workflow("wf"))
    path = f"/apis/{G}/{V}/namespaces/{NS}/workflows?watch={spelling}&timeoutSeconds=1"
    with urllib.request.urlopen(f"{kubeapi.url}{path}", timeout=10) as answer:
        first = json.loads(answer.readline())
    assert first["type"] == "ADDED" and first["object"]["metadata"]["name"] == "wf"


@pytest.mark.parametrize("spelling", ["false", "False", "FALSE", "f", "F", "0", ""])
def test_every_parse_bool_spelling_of_false_lists(kubeapi, spelling):
    status, body, _ = get_json(kubeapi, f"/apis/{G}/{V}/workflows?watch={spelling}")
    assert status == 200 and body["kind"] == "WorkflowList"


@pytest.mark.parametrize(
    "query, message",
    [
        ("watch=yes", 'strconv.ParseBool: parsing "yes": invalid syntax'),
        ("allowWatchBookmarks=on&watch=1", 'strconv.ParseBool: parsing "on": invalid syntax'),
        ("limit=ten", 'strconv.ParseInt: parsing "ten": invalid syntax'),
        ("watch=1&timeoutSeconds=1.5", 'strconv.ParseInt: parsing "1.5": invalid syntax'),
    ],
)
def test_malformed_parameters_are_400(kubeapi, query, message):
    status, body, _ = get_json(kubeapi, f"/apis/{G}/{V}/workflows?{query}")
    assert (status, body["message"]) == (400, message)


def test_an_old_client_sending_watch_true_sees_events(kubeapi, co):
    kubeapi.store.create("workflows", NS, workflow("wf"))
    events = watch.Watch().stream(
        co.list_namespaced_custom_object, G, V, NS, "workflows", timeout_seconds=1, watch=True
    )
    assert [e["object"]["metadata"]["name"] for e in events] == ["wf"]


# -- 10. status subresource and other subresources --------------------------------------


def test_the_status_subresource_keeps_spec_and_status_apart(kubeapi, co):
    kubeapi.store.create("storages", NS, {"metadata": {"name": "r"}, "spec": {"state": "Enabled"},
                                          "status": {"status": "Ready"}})  # fmt: skip
    main = co.patch_namespaced_custom_object(
        G, V, NS, "storages", "r", {"spec": {"state": "Disabled"}, "status": {"status": "Failed"}}
    )
    assert main["spec"]["state"] == "Disabled" and main["status"]["status"] == "Ready"
    assert main["metadata"]["generation"] == 2
    status = co.patch_namespaced_custom_object_status(
        G, V, NS, "storages", "r", {"spec": {"state": "Enabled"}, "status": {"status": "Failed"}}
    )
    assert status["spec"]["state"] == "Disabled" and status["status"]["status"] == "Failed"
    assert status["metadata"]["generation"] == 2  # status changes do not count
    read = co.get_namespaced_custom_object_status(G, V, NS, "storages", "r")
    assert read["status"]["status"] == "Failed"
    status, found, _ = get_json(kubeapi, f"/apis/{G}/{V}")
    names = {r["name"]: r["verbs"] for r in found["resources"]}
    assert names["storages/status"] == ["get", "patch", "update"]
    assert "workflows/status" not in names
    # Workflow declares no status subresource: /status is not there, and status is data
    kubeapi.store.create("workflows", NS, workflow("wf"))
    assert (
        failure(lambda: co.get_namespaced_custom_object_status(G, V, NS, "workflows", "wf"))[0]
        == 404
    )


def test_registered_subresources_are_routed(kubeapi, monkeypatch):
    calls = []

    def echo(store, request):
        calls.append((request.method, request.namespace, request.name, request.query))
        return subresources.Reply(200, b"hello\n", "text/plain")

    monkeypatch.setitem(subresources.HANDLERS, ("pods", "echo"), echo)
    kubeapi.store.create("pods", NS, {"metadata": {"name": "p"}})
    with urllib.request.urlopen(f"{kubeapi.url}/api/v1/namespaces/{NS}/pods/p/echo?x=1") as a:
        assert a.read() == b"hello\n"
    assert calls == [("GET", NS, "p", {"x": "1"})]
    assert get_json(kubeapi, f"/api/v1/namespaces/{NS}/pods/p/other")[0] == 404


# -- field ownership bookkeeping ---------------------------------------------------------

_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["a", "b"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["x", "y", "z"]), inner, max_size=3)
    ),
    max_leaves=8,
)
_objects = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "labels": st.dictionaries(st.sampled_from(["k", "l"]), st.sampled_from(["1", "2"])),
                "finalizers": st.lists(st.sampled_from(["f/a", "f/b"]), unique=True),
            },
        ),
    },
    optional={"spec": _values, "status": _values},
)


@settings(max_examples=300, deadline=None)
@given(_objects, _objects)
def test_changed_fields_are_what_a_full_comparison_finds(old, new):
    touched, removed = managed.changed(old, new)
    old_set, new_set = managed.field_set(old), managed.field_set(new)
    assert removed == old_set - new_set
    full = {
        p for p in new_set if p not in old_set or managed._leaf(old, p) != managed._leaf(new, p)
    }
    assert touched == full
