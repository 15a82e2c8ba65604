# SPDX-License-Identifier: LGPL-3.0-only
"""kubeapi serving kinds from DWS's and nnf-sos's own CRD manifests (read where they are built).

``python -m flux_dws.testing.kubeapi --crd DIR`` serves every CRD in DIR as kube-apiserver
would: its served versions (preferred first), scope, status subresource and structural schema,
which prunes what it does not declare.  The manifests are found through
flux_dws.testing.realdws.crd_dirs (``$FLUX_DWS_CRDS``); without them these tests skip.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from flux_dws.testing.kubeapi.crds import load, resource_from_crd, version_priority
from flux_dws.testing.realdws import crd_dirs

NNF = "nnf.cray.hpe.com"


@pytest.fixture(scope="module")
def crds():
    dirs = crd_dirs()
    if len(dirs) < 2:
        pytest.skip("CRD manifests of DWS and nnf-sos not found: skipped (set FLUX_DWS_CRDS)")
    return dirs


@pytest.fixture(scope="module")
def served(crds, tmp_path_factory):
    """A kubeapi process serving every CRD, and a kubernetes ApiClient for it."""
    kubeconfig = str(tmp_path_factory.mktemp("crds") / "kubeconfig")
    argv = [sys.executable, "-m", "flux_dws.testing.kubeapi", "--kubeconfig", kubeconfig]
    for path in crds:
        argv += ["--crd", path]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(2)]
        assert all(lines), f"kubeapi exited with {process.wait()}"
        configuration = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        with client.ApiClient(configuration) as api:
            yield api
    finally:
        process.terminate()
        process.wait(10)


def test_version_priority_orders_as_kubernetes():
    names = ["v1alpha9", "v1", "v1beta1", "v1alpha10", "v2", "foo"]
    assert sorted(names, key=version_priority, reverse=True) == [
        "v2",
        "v1",
        "v1beta1",
        "v1alpha10",
        "v1alpha9",
        "foo",
    ]


def crds_manifest() -> dict:
    """A small CRD, as controller-gen writes one."""
    return {
        "kind": "CustomResourceDefinition",
        "spec": {
            "group": "example.org",
            "names": {"kind": "Thing", "plural": "things"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True}],
        },
    }


def test_every_crd_gives_a_resource_with_its_versions_scope_and_status(crds):
    found = {r.plural: r for r in load(crds)}
    access = found["nnfaccesses"]
    assert (access.group, access.kind, access.namespaced) == (NNF, "NnfAccess", True)
    assert access.versions == ("v1alpha11", "v1alpha10")  # v1alpha9 is not served
    assert access.has_status and access.schema["type"] == "object"
    assert found["workflows"].versions == ("v1alpha7", "v1alpha6")
    assert not found["workflows"].has_status  # DWS's Workflow has no status subresource
    cluster = dict(crds_manifest(), spec={**crds_manifest()["spec"], "scope": "Cluster"})
    assert not resource_from_crd(cluster).namespaced
    with pytest.raises(ValueError, match="group"):
        resource_from_crd({"kind": "CustomResourceDefinition", "spec": {}})


def test_an_nnf_kind_is_served_under_each_version_with_pruning_and_status(served):
    co = client.CustomObjectsApi(served)
    resources = client.ApisApi(served).get_api_versions()
    nnf = [g for g in resources.groups if g.name == NNF][0]
    assert nnf.preferred_version.version == "v1alpha11"
    body = {
        "apiVersion": f"{NNF}/v1alpha11",
        "kind": "NnfNode",
        "metadata": {"name": "nnf-nlc", "namespace": "default"},
        "spec": {"name": "rabbit-0", "state": "Enable", "notInSchema": 1},
    }
    made = co.create_namespaced_custom_object(NNF, "v1alpha11", "default", "nnfnodes", body)
    assert "notInSchema" not in made["spec"]  # pruned, as a structural schema does
    assert made["spec"]["name"] == "rabbit-0"
    # the status subresource: status goes through /status only
    co.patch_namespaced_custom_object_status(
        NNF, "v1alpha11", "default", "nnfnodes", "nnf-nlc", {"status": {"status": "Ready"}}
    )
    old = co.get_namespaced_custom_object(NNF, "v1alpha10", "default", "nnfnodes", "nnf-nlc")
    assert old["apiVersion"] == f"{NNF}/v1alpha10" and old["status"]["status"] == "Ready"
    with pytest.raises(ApiException) as info:
        co.get_namespaced_custom_object(NNF, "v1alpha9", "default", "nnfnodes", "nnf-nlc")
    assert info.value.status == 404


def defaulting_manifest() -> dict:
    """A CRD whose schema has defaults at each depth, as kubebuilder's +default writes them."""
    item = {"type": "object", "properties": {"size": {"type": "integer", "default": 1}}}
    spec = {
        "type": "object",
        "properties": {
            "mode": {"type": "string", "default": "Live"},
            "state": {"type": "string", "default": "Enabled"},
            "options": {
                "type": "object",
                "properties": {"level": {"type": "string", "default": "info"}},
            },
            "parts": {"type": "array", "items": item},
            "byName": {"type": "object", "additionalProperties": item},
        },
    }
    schema = {"type": "object", "properties": {"spec": spec, "status": {"type": "object"}}}
    version = {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
    manifest = crds_manifest()
    return {**manifest, "spec": {**manifest["spec"], "versions": [version]}}


def test_a_crd_kinds_schema_defaults_are_filled_on_every_write_while_it_is_served():
    """kube-apiserver fills a CRD schema's defaults on create and update (nnf-sos's Storage
    controller acts only on a Storage whose spec.mode, defaulted to Live, says so)."""
    from flux_dws.testing.kubeapi import ApiError, Store
    from flux_dws.testing.kubeapi.resources import by_plural, serving

    thing = {
        "apiVersion": "example.org/v1",
        "kind": "Thing",
        "metadata": {"name": "a", "namespace": "default"},
        "spec": {"state": "Disabled", "parts": [{}, {"size": 4}], "byName": {"x": {}}},
    }
    with serving([resource_from_crd(defaulting_manifest())]):
        store = Store()
        made = store.create("things", "default", thing)
        spec = made["spec"]
        assert (spec["mode"], spec["state"]) == ("Live", "Disabled")  # given values are kept
        assert [p["size"] for p in spec["parts"]] == [1, 4]
        assert spec["byName"] == {"x": {"size": 1}}
        assert "options" not in spec  # a default never makes a parent object
        patched = store.patch("things", "default", "a", {"spec": {"mode": None, "options": {}}})
        assert patched["spec"]["mode"] == "Live"  # removed: defaulted again on the write
        assert patched["spec"]["options"] == {"level": "info"}
        assert "mode" not in made["metadata"]
    with pytest.raises(ApiError):  # served only inside serving()
        by_plural("things")
