# SPDX-License-Identifier: LGPL-3.0-only
"""The real DWS in the loop: HPE's DWS manager and DWS's test driver, run against kubeapi.

They are Go programs built by hand from their public repositories (never by this project):
``FLUX_DWS_REAL_DWS`` names the DWS manager (default /opt/dws/bin/dws-manager) and
``FLUX_DWS_TEST_DRIVER`` the test driver (default /opt/dws/bin/dws-test-driver), as flux-core
is found for the real-Flux tests.  :func:`real_dws_problem` says in one line why they cannot
run here, so tests skip with that line.  With them, DWS's own Workflow controller does the
roll-up (dwssim's stands aside) and the test driver acts on ``#DW <State> action=...``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

DWS_ENV = "FLUX_DWS_REAL_DWS"
TEST_DRIVER_ENV = "FLUX_DWS_TEST_DRIVER"
DEFAULT_DWS = "/opt/dws/bin/dws-manager"
DEFAULT_TEST_DRIVER = "/opt/dws/bin/dws-test-driver"
NNF_SOS_ENV = "FLUX_DWS_NNF_SOS"
DEFAULT_NNF_SOS = "/opt/dws/bin/nnf-sos-manager"
CRDS_ENV = "FLUX_DWS_CRDS"  # colon-separated directories of CRD manifests
DEFAULT_CRDS = ("/opt/dws/config/dws/crd/bases", "/opt/dws/config/nnf-sos/crd/bases")
READY_TIMEOUT = 30.0  # seconds for a manager to sync its informers and start its workers
STOP_TIMEOUT = 10.0


def dws_manager() -> str:
    return os.environ.get(DWS_ENV) or DEFAULT_DWS


def test_driver() -> str:
    return os.environ.get(TEST_DRIVER_ENV) or DEFAULT_TEST_DRIVER


def nnf_sos() -> str:
    return os.environ.get(NNF_SOS_ENV) or DEFAULT_NNF_SOS


def nnf_node_controller(kubeconfig: str, rabbit: str, logdir: str) -> GoManager:
    """nnf-sos's node controller for ``rabbit`` on mock hardware (nnf-ec's -mock).

    Even in mock mode it runs ``zpool import -a`` at start and exits if that fails, so where
    ZFS is not installed a ``zpool`` that does nothing is put first on its PATH.
    """
    stub = os.path.join(logdir, "nnf-stub-bin")
    os.makedirs(stub, exist_ok=True)
    zpool = os.path.join(stub, "zpool")
    with open(zpool, "w") as handle:
        handle.write("#!/bin/sh\n# nnf-sos on mock hardware imports no pool\nexit 0\n")
    os.chmod(zpool, 0o755)
    flags = [f for f in _base_flags(kubeconfig) if not f.startswith("-zap")]
    return GoManager(
        f"nnf-sos node {rabbit}",
        [nnf_sos(), "-controller=node", "-mock", *flags],
        os.path.join(logdir, f"nnf-sos-{rabbit}.log"),
        {
            "PATH": f"{stub}:{os.environ.get('PATH', '')}",
            "NNF_NODE_NAME": rabbit,
            "NNF_POD_NAMESPACE": "nnf-system",
            "ENABLE_WEBHOOKS": "false",
        },
        cwd=logdir,  # nnf-ec keeps its mock database in the working directory
    )


def crd_dirs() -> list[str]:
    """Where the built DWS and nnf-sos keep their CRD manifests (config/crd/bases), if there."""
    listed = os.environ.get(CRDS_ENV)
    paths = listed.split(":") if listed else list(DEFAULT_CRDS)
    return [p for p in paths if os.path.isdir(p)]


def real_dws_problem() -> str | None:
    """Why the real DWS cannot run here (one line), or None."""
    for env, path in ((DWS_ENV, dws_manager()), (TEST_DRIVER_ENV, test_driver())):
        if not os.access(path, os.X_OK):
            return f"real DWS skipped: {path} is not an executable (set {env})"
    return None


@dataclass
class GoManager:
    """One controller-runtime manager as a child process, logging to ``log``."""

    name: str
    argv: Sequence[str]
    log: str
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> GoManager:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                list(self.argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Until every controller says "Starting workers" (its caches synced)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}: {self.tail()}"
                )
            with open(self.log, "rb") as handle:
                text = handle.read().decode(errors="replace")
            if "Starting workers" in text:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout:g}s: {self.tail()}")

    def tail(self, lines: int = 5) -> str:
        with open(self.log, "rb") as handle:
            text = handle.read().decode(errors="replace")
        return " | ".join(text.strip().splitlines()[-lines:])

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT)


def _base_flags(kubeconfig: str) -> list[str]:
    # Their defaults listen on every interface: loopback ports picked by the kernel instead.
    return [
        f"-kubeconfig={kubeconfig}",
        "-metrics-bind-address=127.0.0.1:0",
        "-health-probe-bind-address=127.0.0.1:0",
        "-leader-elect=false",
        "-zap-devel=false",
        "-zap-log-level=info",
    ]


class RealDws:
    """The DWS manager (controller mode) and the test driver, against ``kubeconfig``."""

    def __init__(self, kubeconfig: str, logdir: str) -> None:
        flags = _base_flags(kubeconfig)
        self.controller = GoManager(
            "dws-manager",
            [dws_manager(), "-mode=controller", *flags],
            os.path.join(logdir, "dws-manager.log"),
            {"POD_NAMESPACE": "default"},
        )
        self.driver = GoManager(
            "dws-test-driver", [test_driver(), *flags], os.path.join(logdir, "dws-test-driver.log")
        )

    def start(self) -> RealDws:
        try:
            for manager in (self.controller, self.driver):
                manager.start()
            for manager in (self.controller, self.driver):
                manager.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for manager in (self.driver, self.controller):
            manager.stop()

    def running(self) -> bool:
        return self.controller.running() and self.driver.running()
