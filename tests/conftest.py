"""Shared fixtures: a stand-in Kubernetes API server over real HTTP, and a real client for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flux_dws.testing.kubeapi import KubeApi


@pytest.fixture
def kubeapi(tmp_path: Path) -> Iterator[KubeApi]:
    """A KubeApi on a free 127.0.0.1 port with its kubeconfig written (``kubeapi.kubeconfig``).

    Bookmarks come every 0.2 s so watch tests stay quick.
    """
    api = KubeApi(bookmark_interval=0.2).start()
    api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture
def k8s_client(kubeapi: KubeApi) -> Iterator[object]:
    """A kubernetes.client.ApiClient configured from the kubeconfig ``kubeapi`` wrote."""
    kubernetes = pytest.importorskip("kubernetes")
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(
        config_file=kubeapi.kubeconfig, client_configuration=configuration
    )
    client = kubernetes.client.ApiClient(configuration)
    try:
        yield client
    finally:
        client.close()
