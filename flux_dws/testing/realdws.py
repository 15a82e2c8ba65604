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
from typing import Any

DWS_ENV = "FLUX_DWS_REAL_DWS"
TEST_DRIVER_ENV = "FLUX_DWS_TEST_DRIVER"
DEFAULT_DWS = "/opt/dws/bin/dws-manager"
DEFAULT_TEST_DRIVER = "/opt/dws/bin/dws-test-driver"
CRDS_ENV = "FLUX_DWS_CRDS"  # colon-separated directories of CRD manifests
DEFAULT_CRDS = ("/opt/dws/config/dws/crd/bases", "/opt/dws/config/nnf-sos/crd/bases")
#: LustreFileSystem's CRD (lustre-fs-operator, which nnf-sos vendors): served where found
#: among the CRD directories, such as this default; nnf-sos looks up copy_in/copy_out's global
#: paths in those objects (nnf_workflow_controller_helpers.go, findLustreFileSystemForPath).
DEFAULT_LUSTRE_CRDS = "/opt/dws/config/lustre-fs-operator/crd/bases"
READY_TIMEOUT = 30.0  # seconds for a manager to sync its informers and start its workers
STOP_TIMEOUT = 10.0


def dws_manager() -> str:
    return os.environ.get(DWS_ENV) or DEFAULT_DWS


def test_driver() -> str:
    return os.environ.get(TEST_DRIVER_ENV) or DEFAULT_TEST_DRIVER


def crd_dirs() -> list[str]:
    """Where the built DWS and nnf-sos keep their CRD manifests (config/crd/bases), if there."""
    listed = os.environ.get(CRDS_ENV)
    paths = listed.split(":") if listed else [*DEFAULT_CRDS, DEFAULT_LUSTRE_CRDS]
    return [p for p in paths if os.path.isdir(p)]


#: The test parameters a scenario runs on: dwssim, the real DWS (both with fakeflux), and
#: the real DWS under a real Flux instance.
BACKENDS = ("sim", "real", "real-flux")


def backend_problem(param: str) -> str | None:
    """Why the stack of test parameter ``param`` (one of BACKENDS) cannot run here, or None."""
    from flux_dws.testing.fluxsetup import real_flux_problem

    which, _, flux = param.partition("-")
    return (which == "real" and real_dws_problem()) or (flux and real_flux_problem()) or None


def backend_options(param: str) -> dict[str, Any]:
    """The Stack keywords of test parameter ``param`` (one of BACKENDS)."""
    which, _, flux = param.partition("-")
    if not flux:
        return {"dws": which}
    # Under real Flux the service's heartbeat is what the jobtap plugin waits on after a kill.
    return {"dws": which, "backend": "flux", "config": {"heartbeat": "2s"}}


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


def manager_flags(kubeconfig: str) -> list[str]:
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
        flags = manager_flags(kubeconfig)
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


# ---- the real DWS admission webhooks (dws-manager --mode webhook) ----------------------------

DWS_GROUP = "dataworkflowservices.github.io"
WEBHOOK_PORT = 9443  # controller-runtime's webhook server: fixed in DWS's main, no flag
WEBHOOK_MANIFESTS_ENV = "FLUX_DWS_WEBHOOK_MANIFESTS"
DEFAULT_WEBHOOK_MANIFESTS = "/opt/dws/config/dws/webhook/manifests.yaml"
RULESETS_ENV = "FLUX_DWS_RULESETS"  # colon-separated DWDirectiveRule manifests
DEFAULT_RULESETS = (
    "/opt/dws/config/nnf-sos/dws/nnf-ruleset.yaml",
    "/opt/dws/config/dws-test-driver/dws/test-ruleset.yaml",
)


def webhook_manifests() -> str:
    return os.environ.get(WEBHOOK_MANIFESTS_ENV) or DEFAULT_WEBHOOK_MANIFESTS


def rulesets() -> list[str]:
    listed = os.environ.get(RULESETS_ENV)
    return listed.split(":") if listed else list(DEFAULT_RULESETS)


def real_webhook_problem() -> str | None:
    """Why DWS's webhooks cannot run here (one line), or None."""
    if not os.access(dws_manager(), os.X_OK):
        return f"real DWS webhook skipped: {dws_manager()} is not an executable (set {DWS_ENV})"
    for path in (webhook_manifests(), *rulesets()):
        if not os.path.isfile(path):
            return f"real DWS webhook skipped: no {path}"
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", WEBHOOK_PORT))
        except OSError as exc:
            return f"real DWS webhook skipped: port {WEBHOOK_PORT} is taken ({exc.strerror})"
    return None


def install_rulesets(store: Any, namespace: str) -> None:
    """The DWDirectiveRules of the DWS/NNF/test-driver builds, in ``namespace``, as v1alpha7.

    The webhook reads them from its POD_NAMESPACE; a manifest in an older version (the test
    driver's says v1alpha2) has the same fields and is served as the current one.
    """
    import yaml

    for path in rulesets():
        with open(path) as handle:
            for doc in yaml.safe_load_all(handle):
                if isinstance(doc, dict) and doc.get("kind") == "DWDirectiveRule":
                    meta = {"name": doc["metadata"]["name"], "namespace": namespace}
                    rule = {**doc, "apiVersion": f"{DWS_GROUP}/v1alpha7", "metadata": meta}
                    store.create("dwdirectiverules", namespace, rule)


class RealWebhook:
    """``dws-manager --mode webhook`` on 127.0.0.1:9443, with a certificate made for the run.

    trustme makes a CA and a serving certificate for 127.0.0.1; the manager reads the pair
    from ``$TMPDIR/k8s-webhook-server/serving-certs`` (a TMPDIR of this run's own).
    :meth:`webhooks` gives the manifests' webhooks with a ``url`` on that port and the CA as
    their caBundle, for kubeapi.admission.register_remote_webhooks.
    """

    def __init__(self, kubeconfig: str, logdir: str, namespace: str = "default") -> None:
        import trustme

        self.ca = trustme.CA()
        self.tmpdir = os.path.join(logdir, "dws-webhook-tmp")
        certs = os.path.join(self.tmpdir, "k8s-webhook-server", "serving-certs")
        os.makedirs(certs, exist_ok=True)
        served = self.ca.issue_cert("127.0.0.1")
        served.cert_chain_pems[0].write_to_path(os.path.join(certs, "tls.crt"))
        served.private_key_pem.write_to_path(os.path.join(certs, "tls.key"))
        flags = manager_flags(kubeconfig)
        self.manager = GoManager(
            "dws-manager webhook",
            [dws_manager(), "-mode=webhook", *flags],
            os.path.join(logdir, "dws-webhook.log"),
            {"TMPDIR": self.tmpdir, "POD_NAMESPACE": namespace},
        )
        self.namespace = namespace

    def webhooks(self) -> list[Any]:
        import yaml

        from flux_dws.testing.kubeapi import webhooks

        def url_for(client_config: dict) -> str:
            path = (client_config.get("service") or {}).get("path", "/")
            return client_config.get("url") or f"https://127.0.0.1:{WEBHOOK_PORT}{path}"

        with open(webhook_manifests()) as handle:
            docs = list(yaml.safe_load_all(handle))
        return webhooks.load(docs, url_for, self.ca.cert_pem.bytes())

    def start(self, timeout: float = READY_TIMEOUT) -> RealWebhook:
        """Start it and wait until it admits a Workflow with a directive (bounded).

        The first such review also fills the webhook's cache of DWDirectiveRules, so no later
        review waits on a list that kubeapi serves behind the store's lock.
        """
        try:
            self.manager.start()
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        from flux_dws.testing.kubeapi import ApiError

        probe = {
            "metadata": {"name": "readiness-probe", "namespace": self.namespace},
            "spec": {
                "desiredState": "Proposal",
                "dwDirectives": ["#DW jobdw type=xfs capacity=1GiB name=probe"],
                "wlmID": "probe",
                "jobID": 0,
                "userID": 0,
                "groupID": 0,
                "forceReady": False,
            },
        }
        validating = [h for h in self.webhooks() if not h.mutating]
        deadline = time.monotonic() + timeout
        failure = ""
        while time.monotonic() < deadline:
            assert self.manager.process is not None
            if self.manager.process.poll() is not None:
                raise RuntimeError(
                    f"{self.manager.name} exited with {self.manager.process.returncode}:"
                    f" {self.manager.tail()}"
                )
            try:
                for hook in validating:
                    hook.admit("workflows", "CREATE", None, probe)
                return
            except ApiError as exc:
                failure = exc.message
            time.sleep(0.1)
        raise RuntimeError(
            f"{self.manager.name} not ready after {timeout:g}s: {failure} | {self.manager.tail()}"
        )

    def stop(self) -> None:
        self.manager.stop()

    def running(self) -> bool:
        return self.manager.running()
