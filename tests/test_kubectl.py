# SPDX-License-Identifier: LGPL-3.0-only
"""The stand-in API server driven with Debian's kubectl, as an admin would drive it.

Each test is one thing kube-apiserver does that kubectl shows: dry runs that store nothing,
OpenAPI-backed validation, explain and edit, server-side apply with its conflicts, namespace
lifecycle, paged lists, field selectors, printer columns, error wording, watches,
finalizers, optimistic concurrency and the DWS admission messages.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


def _client_minor() -> int:
    if KUBECTL is None:
        return 0
    done = subprocess.run(
        [KUBECTL, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30
    )
    try:
        return int(json.loads(done.stdout)["clientVersion"]["minor"].rstrip("+"))
    except (ValueError, KeyError, TypeError):
        return 0


#: explain and validation read OpenAPI v3 from kubectl 1.27 on (older ones want v2 protobuf)
needs_openapi_v3 = pytest.mark.skipif(
    0 < _client_minor() < 27, reason="this kubectl reads OpenAPI v2 as protobuf only"
)

G = "dataworkflowservices.github.io"
V = "v1alpha7"
NS = "default"
DIRECTIVE = "#DW jobdw type=xfs capacity=10GiB name=scratch"


def workflow_yaml(name: str, *, labels: str = "", extra_spec: str = "", state="Proposal") -> str:
    meta_labels = f"\n  labels:\n{textwrap.indent(labels, '    ')}" if labels else ""
    return (
        f"apiVersion: {G}/{V}\nkind: Workflow\nmetadata:\n  name: {name}{meta_labels}\n"
        f"spec:\n  desiredState: {state}\n  wlmID: flux\n  jobID: 7\n  userID: 1001\n"
        f"  groupID: 100\n  dwDirectives: [{json.dumps(DIRECTIVE)}]\n{extra_spec}"
    )


def workflow_obj(name: str) -> dict:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "Workflow",
        "metadata": {"name": name},
        "spec": {
            "desiredState": "Proposal",
            "wlmID": "flux",
            "jobID": 7,
            "userID": 1001,
            "groupID": 100,
            "dwDirectives": [DIRECTIVE],
        },
    }


class Kubectl:
    def __init__(self, kubeconfig: str, home: Path) -> None:
        self.env = dict(os.environ, KUBECONFIG=kubeconfig, HOME=str(home))
        self.home = home

    def result(self, *args: str, stdin: str | None = None, env: dict | None = None):
        return subprocess.run(
            [KUBECTL or "kubectl", *args],
            env={**self.env, **(env or {})},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def __call__(self, *args: str, stdin: str | None = None, env: dict | None = None) -> str:
        done = self.result(*args, stdin=stdin, env=env)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def fails(self, *args: str, stdin: str | None = None) -> str:
        done = self.result(*args, stdin=stdin)
        assert done.returncode != 0, f"kubectl {' '.join(args)} succeeded: {done.stdout}"
        return done.stderr.strip()

    def header(self, *args: str) -> list[str]:
        lines = self(*args).splitlines()
        assert lines, f"kubectl {' '.join(args)} printed nothing"
        return lines[0].split()


@contextlib.contextmanager
def watching(kubeapi, kubectl: Kubectl, *args: str) -> Iterator[Iterator[str]]:
    """Run a watching kubectl; yield its output lines (each within 60 s), once it watches."""
    process = subprocess.Popen(
        [KUBECTL or "kubectl", *args],
        env=kubectl.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def lines() -> Iterator[str]:
        assert process.stdout is not None
        while True:
            ready, _, _ = select.select([process.stdout], [], [], 60)
            assert ready, "kubectl printed nothing within 60 s"
            yield process.stdout.readline().strip()

    try:
        wait_for(lambda: kubeapi.open_watches() >= 1, what="kubectl to open its watch")
        yield lines()
    finally:
        process.kill()
        process.communicate(timeout=10)


@pytest.fixture
def kubectl(kubeapi, tmp_path) -> Kubectl:
    return Kubectl(kubeapi.kubeconfig, tmp_path)


@pytest.fixture
def store(kubeapi):
    return kubeapi.store


# -- 1. dry runs -----------------------------------------------------------------------


def test_server_dry_runs_store_nothing(kubectl, store):
    out = kubectl("create", "-f", "-", "--dry-run=server", stdin=workflow_yaml("dry"))
    assert "created (server dry run)" in out
    assert store.list("workflows")[0] == []
    store.create("workflows", NS, workflow_obj("wf"))
    before = store.get("workflows", NS, "wf")
    kubectl("label", "workflow", "wf", "a=b", "--dry-run=server")
    kubectl("annotate", "workflow", "wf", "n=1", "--dry-run=server")
    kubectl("patch", "workflow", "wf", "--type=merge", "-p", '{"spec":{"hurry":false}}',
            "--dry-run=server")  # fmt: skip
    kubectl("delete", "workflow", "wf", "--dry-run=server")
    relabelled = workflow_yaml("wf", labels="flux-dws/instance: other")
    diff = kubectl.result("diff", "-f", "-", stdin=relabelled)
    assert diff.returncode == 1 and "flux-dws/instance: other" in diff.stdout
    assert store.get("workflows", NS, "wf") == before
    assert store.resource_version == before["metadata"]["resourceVersion"]


def test_an_unsupported_dry_run_value_is_refused(kubeapi):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{kubeapi.url}/apis/{G}/{V}/namespaces/{NS}/workflows?dryRun=Some",
        data=json.dumps(workflow_obj("x")).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    body = json.load(info.value)
    assert info.value.code == 422
    assert body["message"] == (
        'CreateOptions.meta.k8s.io "" is invalid: dryRun[0]: Unsupported value: "Some":'
        ' supported values: "All"'
    )
    assert kubeapi.store.list("workflows")[0] == []


# -- 2. OpenAPI: validation, explain, edit --------------------------------------------


@needs_openapi_v3
def test_validation_is_on_by_default_and_unknown_fields_are_refused(kubectl, store):
    bogus = workflow_yaml("wf", extra_spec="  bogus: 1\n")
    message = kubectl.fails("create", "-f", "-", stdin=bogus)
    assert 'strict decoding error: unknown field "spec.bogus"' in message
    assert "openapi" not in message.lower()
    kubectl("create", "-f", "-", "--validate=false", stdin=bogus)
    assert "bogus" not in store.get("workflows", NS, "wf")["spec"]  # pruned, as a CRD does


@needs_openapi_v3
def test_explain_describes_the_served_kinds(kubectl):
    out = kubectl("explain", "workflows.spec")
    assert "KIND:       Workflow" in out and f"VERSION:    {V}" in out
    assert "desiredState\t<string> -required-" in out
    assert "dwDirectives\t<[]string> -required-" in out
    for kind in ("storages", "clientmounts", "systemstatuses", "nnfdatamovements", "secrets"):
        assert "KIND:" in kubectl("explain", kind)


@needs_openapi_v3
def test_edit_changes_the_object_through_the_editor(kubectl, store, tmp_path):
    store.create("workflows", NS, workflow_obj("wf"))
    editor = tmp_path / "editor.sh"
    editor.write_text(
        '#!/bin/sh\nsed -i \'s/^  name: wf$/  name: wf\\n  labels:\\n    edited: "yes"/\' "$1"\n'
    )
    editor.chmod(0o755)
    out = kubectl("edit", "workflow", "wf", env={"KUBE_EDITOR": str(editor)})
    assert "edited" in out
    assert store.get("workflows", NS, "wf")["metadata"]["labels"] == {"edited": "yes"}


# -- 3. server-side apply --------------------------------------------------------------


def test_server_side_apply_owns_fields_and_reports_conflicts(kubectl, store):
    out = kubectl("apply", "--server-side", "-f", "-", stdin=workflow_yaml("wf", labels="t: a"))
    assert "serverside-applied" in out
    fields = store.get("workflows", NS, "wf")["metadata"]["managedFields"]
    assert [(f["manager"], f["operation"]) for f in fields] == [("kubectl", "Apply")]
    assert fields[0]["fieldsV1"]["f:metadata"]["f:labels"] == {"f:t": {}}
    kubectl("label", "workflow", "wf", "t=b", "--overwrite")
    applied = workflow_yaml("wf", labels="t: a")
    message = kubectl.fails("apply", "--server-side", "-f", "-", stdin=applied)
    assert (
        'Apply failed with 1 conflict: conflict with "kubectl-label" using'
        f" {G}/{V}: .metadata.labels.t"
    ) in message
    assert store.get("workflows", NS, "wf")["metadata"]["labels"] == {"t": "b"}
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
            stdin=workflow_yaml("wf", labels="t: a"))  # fmt: skip
    assert store.get("workflows", NS, "wf")["metadata"]["labels"] == {"t": "a"}
    # dropping a field from the configuration removes it, as nobody else owns it now
    kubectl("apply", "--server-side", "-f", "-", stdin=workflow_yaml("wf"))
    assert "labels" not in store.get("workflows", NS, "wf")["metadata"]


def test_client_side_apply_records_its_manager(kubectl, store):
    kubectl("apply", "-f", "-", stdin=workflow_yaml("wf"))
    kubectl("apply", "-f", "-", stdin=workflow_yaml("wf", labels="x: z"))
    fields = store.get("workflows", NS, "wf")["metadata"]["managedFields"]
    managers = {(f["manager"], f["operation"]) for f in fields}
    assert ("kubectl-client-side-apply", "Update") in managers
    shown = kubectl("get", "workflow", "wf", "-o", "yaml", "--show-managed-fields")
    assert "manager: kubectl-client-side-apply" in shown


# -- 4. namespaces ---------------------------------------------------------------------


def test_namespaces_are_served_and_enforced(kubectl, store):
    message = kubectl.fails("create", "-n", "nowhere", "-f", "-", stdin=workflow_yaml("wf"))
    assert 'namespaces "nowhere" not found' in message
    assert kubectl.header("get", "namespaces") == ["NAME", "STATUS", "AGE"]
    kubectl("create", "namespace", "team")
    kubectl("create", "secret", "generic", "token", "--from-literal=a=b", "-n", "team")
    kubectl("create", "-n", "team", "-f", "-", stdin=workflow_yaml("wf"))
    assert "team   Active" in kubectl("get", "ns", "team")
    kubectl("delete", "namespace", "team")
    assert store.list("secrets", "team")[0] == [] and store.list("workflows", "team")[0] == []
    assert 'namespaces "team" not found' in kubectl.fails("get", "ns", "team")


# -- 5. paging -------------------------------------------------------------------------


def test_kubectl_pages_with_chunk_size(kubeapi, kubectl, store):
    for i in range(5):
        store.create("workflows", NS, workflow_obj(f"wf-{i}"))
    kubeapi.reset_counts()
    out = kubectl("get", "workflows", "--chunk-size=2", "-o", "name")
    assert out.split() == [f"workflow.{G}/wf-{i}" for i in range(5)]
    assert kubeapi.request_counts()[("list", "workflows")] == 3


# -- 6. field selectors ----------------------------------------------------------------


def test_field_selectors_support_only_name_and_namespace(kubectl, store):
    store.create("workflows", NS, workflow_obj("a"))
    store.create("workflows", NS, workflow_obj("b"))
    out = kubectl("get", "workflows", "--field-selector", "metadata.name=b", "-o", "name")
    assert out.split() == [f"workflow.{G}/b"]
    out = kubectl("get", "workflows", "-A", "--field-selector", "metadata.namespace!=default")
    assert (
        "No resources found"
        in kubectl.result(
            "get", "workflows", "-A", "--field-selector", "metadata.namespace!=default"
        ).stderr
        or out == ""
    )
    message = kubectl.fails("get", "workflows", "--field-selector", "spec.jobID=7")
    assert message.endswith("field label not supported: spec.jobID")


# -- 7. printer columns and short names -------------------------------------------------

AGE = [".metadata.creationTimestamp"]
HEADERS = {
    "workflows": ["NAME", "STATE", "READY", "STATUS", "JOBID", "AGE"],
    "computes": ["NAME", "AGE"],
    # served only for nnf-sos, which lists them as it finalizes a workflow: name and age
    "jobs": ["NAME", "AGE"],
    "mpijobs": ["NAME", "AGE"],
    "services": ["NAME", "AGE"],
    "directivebreakdowns": ["NAME", "READY", "ERROR", "AGE"],
    "servers": ["NAME", "READY", "ERROR", "AGE"],
    "systemconfigurations": ["NAME", "READY", "AGE"],
    "persistentstorageinstances": ["NAME", "ERROR", "AGE"],
    "dwdirectiverules": ["NAME", "AGE"],
    "storages": ["NAME", "STATE", "STATUS", "MODE", "AGE"],
    "systemstatuses": ["NAME", "AGE"],
    "clientmounts": ["NAME", "DESIREDSTATE", "READY", "ERROR", "AGE"],
    "nnfcontainerprofiles": ["NAME", "AGE"],
    "nnfdatamovements": ["NAME", "STATE", "STATUS", "ERROR", "AGE"],
    "pods": ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
    "secrets": ["NAME", "TYPE", "DATA", "AGE"],
    "events": ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
    "namespaces": ["NAME", "STATUS", "AGE"],
    # kube-apiserver prints NAME STATUS ROLES AGE VERSION; kubeapi serves Nodes only for
    # nnf-sos's storage controller, with the CRD default columns
    "nodes": ["NAME", "AGE"],
}


def test_every_kind_prints_its_columns(kubectl, store):
    from flux_dws.testing.kubeapi.resources import RESOURCES

    for resource in RESOURCES:
        if resource.plural == "workflows":
            obj = workflow_obj("one")
        elif resource.plural == "events":
            obj = {"metadata": {"name": "one"}, "involvedObject": {"kind": "Pod", "name": "p"},
                   "reason": "Started", "type": "Normal", "message": "hi", "count": 1}  # fmt: skip
        elif resource.plural == "pods":
            obj = {"metadata": {"name": "one"}, "spec": {"containers": [{"name": "c"}]},
                   "status": {"phase": "Running"}}  # fmt: skip
        else:
            obj = {"metadata": {"name": "one"}}
        if resource.plural != "namespaces":
            store.create(resource.plural, NS if resource.namespaced else None, obj)
        assert kubectl.header("get", resource.plural) == HEADERS[resource.plural], resource.plural
    assert "one    0/1     Running" in kubectl("get", "pods")
    assert kubectl.header("get", "workflows", "-o", "wide")[6:] == [
        "DESIREDSTATE", "DESIREDSTATECHANGE", "ELAPSEDTIMELASTSTATE", "UID", "GID"
    ]  # fmt: skip


def test_short_names_are_the_crds_and_the_core_kinds(kubectl, store):
    store.create("directivebreakdowns", NS, {"metadata": {"name": "d"}})
    for short in ("dbd", "psi", "wf"):
        assert f'the server doesn\'t have a resource type "{short}"' in kubectl.fails("get", short)
    assert kubectl.header("get", "ns") == ["NAME", "STATUS", "AGE"]
    kubectl("get", "po")
    kubectl("get", "ev")


def test_dates_print_as_ages(kubectl, store):
    store.create("workflows", NS, workflow_obj("wf"))
    status = {
        "state": "Proposal",
        "status": "Completed",
        "ready": True,
        "elapsedTimeLastState": "1s",
        "desiredStateChange": "2020-01-01T00:00:00Z",
    }
    store.patch("workflows", NS, "wf", {"status": status})  # fmt: skip
    row = kubectl("get", "workflows", "-o", "wide").splitlines()[1].split()
    assert row[5][-1] == "s" and row[5][:-1].isdigit()  # AGE: seconds
    assert row[7][0].isdigit() and row[7][-1] in "yd"  # DESIREDSTATECHANGE: years


# -- 8. error bodies -------------------------------------------------------------------


def test_invalid_objects_are_named_with_their_field_causes(kubectl, store):
    message = kubectl.fails("create", "-f", "-", stdin=workflow_yaml("wf", state="Bogus"))
    assert message.startswith(
        'The Workflow "wf" is invalid: spec.desiredState: Unsupported value: "Bogus":'
    )
    store.create("workflows", NS, workflow_obj("held"))
    kubectl(
        "patch", "workflow", "held", "--type=merge", "-p", '{"metadata":{"finalizers":["a/b"]}}'
    )
    kubectl("delete", "workflow", "held", "--wait=false")
    message = kubectl.fails(
        "patch", "workflow", "held", "--type=merge", "-p",
        '{"metadata":{"finalizers":["a/b","c/d"]}}',
    )  # fmt: skip
    assert message == (
        'The Workflow "held" is invalid: metadata.finalizers: Forbidden: no new finalizers can'
        ' be added if the object is being deleted, found new finalizers []string{"c/d"}'
    )


def test_admission_denials_read_as_upstream_words_them(kubectl, store):
    store.create("workflows", NS, workflow_obj("wf"))
    message = kubectl.fails(
        "patch", "workflow", "wf", "--type=merge", "-p", '{"spec":{"desiredState":"DataIn"}}'
    )
    assert message == (
        'Error from server (Forbidden): admission webhook "vworkflow.kb.io" denied the request:'
        ' Spec.DesiredState: Invalid value: "DataIn": states cannot be skipped'
    )


# -- existing behaviour: watch, finalizers, conflicts ----------------------------------


def test_get_watch_prints_changes(kubeapi, kubectl, store):
    store.create("workflows", NS, workflow_obj("wf"))
    with watching(kubeapi, kubectl, "get", "workflows", "--watch", "-o", "name") as lines:
        assert next(lines) == f"workflow.{G}/wf"
        store.create("workflows", NS, workflow_obj("later"))
        assert next(lines) == f"workflow.{G}/later"


def test_finalizers_hold_a_deleted_object(kubectl, store):
    store.create("workflows", NS, workflow_obj("wf"))
    kubectl("patch", "workflow", "wf", "--type=merge", "-p", '{"metadata":{"finalizers":["a/b"]}}')
    kubectl("delete", "workflow", "wf", "--wait=false")
    assert store.get("workflows", NS, "wf")["metadata"]["deletionTimestamp"]
    kubectl("patch", "workflow", "wf", "--type=json",
            "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')  # fmt: skip
    assert 'workflows.dataworkflowservices.github.io "wf" not found' in kubectl.fails(
        "get", "workflow", "wf"
    )


def test_a_stale_replace_is_a_conflict(kubectl, store, tmp_path):
    store.create("workflows", NS, workflow_obj("wf"))
    stale = kubectl("get", "workflow", "wf", "-o", "json")
    store.patch("workflows", NS, "wf", {"metadata": {"labels": {"moved": "on"}}})
    message = kubectl.fails("replace", "-f", "-", stdin=stale)
    assert (
        f'Operation cannot be fulfilled on workflows.{G} "wf": the object has been modified;'
        " please apply your changes to the latest version and try again"
    ) in message


# -- 10. the kinds a production service reads -------------------------------------------


@pytest.mark.parametrize("plural", ["storages", "systemstatuses", "clientmounts",
                                    "nnfdatamovements", "pods"])  # fmt: skip
def test_other_kinds_list_watch_and_validate_names(kubeapi, kubectl, store, plural):
    store.create(plural, NS, {"metadata": {"name": "first", "labels": {"k": "v"}}})
    assert kubectl("get", plural, "-l", "k=v", "-o", "name").strip().endswith("/first")
    message = kubectl.fails("create", "-f", "-", stdin=json.dumps(
        {"apiVersion": _api_version(plural), "kind": _kind(plural), "metadata": {"name": "Bad_"}}
    ))  # fmt: skip
    assert 'is invalid: metadata.name: Invalid value: "Bad_"' in message
    with watching(kubeapi, kubectl, "get", plural, "--watch-only", "-o", "name") as lines:
        kubectl("label", plural, "first", "k=w", "--overwrite")
        assert next(lines).endswith("/first")


def _resource(plural: str):
    from flux_dws.testing.kubeapi.resources import by_plural

    return by_plural(plural)


def _api_version(plural: str) -> str:
    return _resource(plural).api_version()


def _kind(plural: str) -> str:
    return _resource(plural).kind
