# SPDX-License-Identifier: LGPL-3.0-only
"""nnf-sos, the real NNF driver, on mock hardware against kubeapi serving its own CRDs.

Where nnf-sos's manager is built (``$FLUX_DWS_NNF_SOS``, default /opt/dws/bin/nnf-sos-manager)
and the CRD manifests of DWS and nnf-sos are found (flux_dws.testing.realdws.crd_dirs), its
node controller runs for one rabbit with nnf-ec's ``-mock``: it must come up on kubeapi and
report the rabbit's NnfNode with its mock drives.  Otherwise these tests skip with one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from flux_dws.testing.nnfsos import nnf_node_controller, nnf_sos
from flux_dws.testing.realdws import crd_dirs

NNF = "nnf.cray.hpe.com"
RABBIT = "rabbit-0"


@pytest.fixture(scope="module")
def nnf_api(tmp_path_factory):
    if not os.access(nnf_sos(), os.X_OK):
        pytest.skip(f"nnf-sos skipped: {nnf_sos()} is not an executable (set FLUX_DWS_NNF_SOS)")
    dirs = crd_dirs()
    if len(dirs) < 2:
        pytest.skip("nnf-sos skipped: CRD manifests of DWS and nnf-sos not found (FLUX_DWS_CRDS)")
    tmp = tmp_path_factory.mktemp("nnf")
    kubeconfig = str(tmp / "kubeconfig")
    argv = [sys.executable, "-m", "flux_dws.testing.kubeapi", "--kubeconfig", kubeconfig]
    argv += ["--namespace", RABBIT, "--namespace", "nnf-system"]
    for path in dirs:
        argv += ["--crd", path]
    api = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    node = None
    try:
        assert api.stdout is not None
        assert all(api.stdout.readline() for _ in range(2)), f"kubeapi exited: {api.wait()}"
        node = nnf_node_controller(kubeconfig, RABBIT, str(tmp)).start()
        node.wait_ready(60)
        configuration = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        with client.ApiClient(configuration) as k8s:
            yield k8s, node
    finally:
        if node is not None:
            node.stop()
        api.terminate()
        api.wait(10)


def test_the_mock_node_controller_reports_its_rabbit_ready(nnf_api):
    k8s, node = nnf_api
    co = client.CustomObjectsApi(k8s)
    deadline = time.monotonic() + 60
    status: dict = {}
    while time.monotonic() < deadline:
        try:
            obj = co.get_namespaced_custom_object(NNF, "v1alpha11", RABBIT, "nnfnodes", "nnf-nlc")
            status = obj.get("status") or {}
        except ApiException as exc:
            assert exc.status == 404, exc
        if status.get("status") == "Ready" and status.get("drives"):
            break
        time.sleep(0.2)
    assert status.get("status") == "Ready", node.tail()
    assert all(d["model"].startswith("MOCK-") for d in status["drives"])
    assert status["capacity"] > 0
    assert node.running()
