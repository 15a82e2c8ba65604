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


# --------------------------------------------------------------------------- scenario stacks
# The scenario suite runs against every job-manager we have: fakeflux always, and a real Flux
# instance with the dws jobtap plugin wherever flux-core is installed.


def _real_flux_missing() -> str | None:
    from flux_dws.testing.realflux import flux_command

    if flux_command() is None:
        return "flux-core is not installed (no flux on PATH or /opt/flux/bin): real Flux skipped"
    return None


def _fluxion_missing() -> str | None:
    from flux_dws.testing.realflux import fluxion_installed

    return _real_flux_missing() or (
        None if fluxion_installed() else "Fluxion (flux-sched) is not installed: skipped"
    )


#: The Fluxion backend's rabbits: two, each serving two of the stack's four compute nodes.
FLUXION_RABBITS = {
    "rabbit-0": ["compute-01", "compute-02"],
    "rabbit-1": ["compute-03", "compute-04"],
}


@pytest.fixture(scope="module", params=["fakeflux", "fakeflux-process", "flux", "fluxion"])
def stack_backend(request):
    """fakeflux with the service in this process; fakeflux with the service in a process of
    its own (over a Unix socket, as under Flux); a real Flux instance where flux-core is; and
    one whose R holds rabbits, scheduled by Fluxion with ``rabbit-scheduling``, where Fluxion
    is installed too."""
    missing = {"flux": _real_flux_missing, "fluxion": _fluxion_missing}.get(request.param)
    if missing and missing():
        pytest.skip(missing())
    return request.param


@pytest.fixture(scope="module")
def _real_stack(stack_backend):
    """One real Flux instance per module (starting one costs seconds)."""
    if stack_backend not in ("flux", "fluxion"):
        yield None
        return
    from flux_dws.testing.stack import Stack

    if stack_backend == "fluxion":
        config = {"heartbeat": "2s", "rabbit-scheduling": True}
        with Stack(hosts=4, backend="flux", config=config, rabbits=FLUXION_RABBITS) as running:
            yield running
        return
    with Stack(hosts=4, backend="flux", config={"heartbeat": "2s"}) as running:
        yield running


@pytest.fixture
def stack(stack_backend, _real_stack):
    """A running flux-dws world: kubeapi + dwssim + a job-manager + the service."""
    if _real_stack is not None:
        yield _real_stack
        if not _real_stack.service_running():  # a test that killed it failed before restarting
            _real_stack.start_service()
        return
    from flux_dws.testing.stack import Stack

    with Stack(service_process=stack_backend == "fakeflux-process") as running:
        yield running
