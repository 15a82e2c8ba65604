# SPDX-License-Identifier: LGPL-3.0-only
"""Shared fixtures: a stand-in Kubernetes API server over real HTTP, and a real client for it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from flux_dws.testing import reaper
from flux_dws.testing.kubeapi import KubeApi

# --------------------------------------------------------------------------- hypothesis
# Properties that set no max_examples of their own run the profile's number: the default
# profile (Hypothesis's 100) keeps the suite quick; HYPOTHESIS_PROFILE=thorough runs 1,000 each
# (tests/test_site_properties.py says how).  No profile has a deadline: Hypothesis's 200 ms
# per example is an assertion on wall time, and fails a correct property on a loaded machine.
settings.register_profile("quick", deadline=None)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))

# --------------------------------------------------------------------------- processes
# Every process this run starts carries its token (flux_dws.testing.reaper): after each module
# none may be left, and whatever is left when the run ends (a failed fixture, Ctrl-C) is ended.


def pytest_configure(config: pytest.Config) -> None:
    config._flux_dws_run = reaper.mark(os.environ)  # type: ignore[attr-defined]
    config.addinivalue_line("markers", "realflux: needs flux-core and its bindings in this Python")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = reaper.reap(session.config._flux_dws_run)  # type: ignore[attr-defined]
    if left:
        listing = "; ".join(str(p) for p in left[:5])
        print(f"\nflux-dws tests: ended {len(left)} process(es) left behind: {listing}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="module", autouse=True)
def _no_process_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails the module's last test if any process it started is still running after it."""
    yield
    left = reaper.reap(request.config._flux_dws_run)
    if left:
        listing = "; ".join(str(p) for p in left[:5])
        pytest.fail(f"{len(left)} process(es) left behind (now ended): {listing}")


def pytest_report_header(config: pytest.Config) -> list[str]:
    """One line each: whether the real-Flux and the real-DWS parts run, and if not, why."""
    from flux_dws.testing.realdws import dws_manager, real_dws_problem, test_driver

    dws = real_dws_problem() or f"real DWS: {dws_manager()} with {test_driver()}"
    missing = _real_flux_missing()
    if missing:
        return [f"{missing} (its tests are deselected)", dws]
    from flux_dws.flux.bindings import flux_command

    return [f"real Flux: {flux_command()}", dws]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without a usable flux-core, deselect every real-Flux test: the header says why, once."""
    if not _real_flux_missing():
        return
    real = [item for item in items if _needs_real_flux(item)]
    if real:
        dropped = {id(item) for item in real}
        items[:] = [item for item in items if id(item) not in dropped]
        config.hook.pytest_deselected(items=real)


def _needs_real_flux(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    backend = callspec.params.get("stack_backend") if callspec is not None else None
    return backend in ("flux", "realdws-flux") or item.get_closest_marker("realflux") is not None


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


@pytest.fixture
def co(k8s_client):
    """The kubernetes client's CustomObjectsApi on ``k8s_client``."""
    from kubernetes import client

    return client.CustomObjectsApi(k8s_client)


@pytest.fixture
def core(k8s_client):
    """The kubernetes client's CoreV1Api on ``k8s_client``."""
    from kubernetes import client

    return client.CoreV1Api(k8s_client)


# --------------------------------------------------------------------------- scenario stacks
# The scenario suite runs against every job-manager we have: fakeflux always, and a real Flux
# instance with the dws jobtap plugin wherever flux-core is installed.


def _real_flux_missing() -> str | None:
    from flux_dws.testing.fluxsetup import real_flux_problem

    problem = real_flux_problem()
    return f"real Flux skipped: {problem}" if problem else None


def _fluxion_missing() -> str | None:
    from flux_dws.testing.fluxsetup import fluxion_installed

    return _real_flux_missing() or (
        None if fluxion_installed() else "Fluxion (flux-sched) is not installed: skipped"
    )


#: The Fluxion backend's rabbits: two, each serving two of the stack's four compute nodes.
FLUXION_RABBITS = {
    "rabbit-0": ["compute-01", "compute-02"],
    "rabbit-1": ["compute-03", "compute-04"],
}


#: The job-managers every scenario module's ``stack`` runs on.
STACK_BACKENDS = ("fakeflux", "fakeflux-process", "flux", "fluxion")
#: The real DWS (flux_dws.testing.realdws), with fakeflux and under real Flux, by the name of
#: its realdws.BACKENDS parameter: a module that sets ``ON_REAL_DWS = True`` runs on them too.
REAL_DWS_BACKENDS = {"realdws": "real", "realdws-flux": "real-flux"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``stack_backend``'s parameters: STACK_BACKENDS, and REAL_DWS_BACKENDS where asked."""
    if "stack_backend" not in metafunc.fixturenames:
        return
    backends = list(STACK_BACKENDS)
    if getattr(metafunc.module, "ON_REAL_DWS", False):
        backends += list(REAL_DWS_BACKENDS)
    metafunc.parametrize("stack_backend", backends, indirect=True, scope="module")


@pytest.fixture(scope="module")
def stack_backend(request):
    """fakeflux with the service in this process; fakeflux with the service in a process of
    its own (over a Unix socket, as under Flux); a real Flux instance where flux-core is; and
    one whose R holds rabbits, scheduled by Fluxion with ``rabbit-scheduling``, where Fluxion
    is installed too; in an ON_REAL_DWS module, the real DWS manager and test driver (with
    dwssim as the NNF driver) with fakeflux and with real Flux, where they are built."""
    if request.param in REAL_DWS_BACKENDS:
        from flux_dws.testing.realdws import backend_problem

        problem = backend_problem(REAL_DWS_BACKENDS[request.param])
    else:
        missing = {"flux": _real_flux_missing, "fluxion": _fluxion_missing}.get(request.param)
        problem = missing() if missing else None
    if problem:
        pytest.skip(problem)
    return request.param


@pytest.fixture(scope="module")
def _real_stack(stack_backend):
    """One real Flux instance (or real DWS) per module: starting one costs seconds."""
    from flux_dws.testing.stack import Stack

    if stack_backend in REAL_DWS_BACKENDS:
        from flux_dws.testing.realdws import backend_options

        with Stack(hosts=4, **backend_options(REAL_DWS_BACKENDS[stack_backend])) as running:
            yield running
        return
    if stack_backend not in ("flux", "fluxion"):
        yield None
        return

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
        if _real_stack.backend == "flux":  # a failed test's job must not fail the next ones
            _real_stack.flux.end_active_jobs()
        return
    from flux_dws.testing.stack import Stack

    with Stack(service_process=stack_backend == "fakeflux-process") as running:
        yield running
