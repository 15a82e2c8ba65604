# SPDX-License-Identifier: LGPL-3.0-only
"""nnf-sos, the real NNF driver, in mock mode beside the real DWS (flux_dws.testing.realdws).

nnf-sos is built by hand from its public repository (never by this project):
``FLUX_DWS_NNF_SOS`` names its manager (default /opt/dws/bin/nnf-sos-manager), and its
profiles come from its config/examples (``FLUX_DWS_NNF_EXAMPLES``).  It runs as its kind
deployment does: one storage controller and one node controller per rabbit, on mock
hardware.  :func:`nnf_sos_problem` says in one line why it cannot run here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from flux_dws.testing.realdws import (
    CRDS_ENV,
    DEFAULT_LUSTRE_CRDS,
    GoManager,
    crd_dirs,
    manager_flags,
    real_dws_problem,
)

NNF_SOS_ENV = "FLUX_DWS_NNF_SOS"
DEFAULT_NNF_SOS = "/opt/dws/bin/nnf-sos-manager"
LUSTRE_CRD = "lus.cray.hpe.com_lustrefilesystems.yaml"


def nnf_sos() -> str:
    return os.environ.get(NNF_SOS_ENV) or DEFAULT_NNF_SOS


NNF_SYSTEM = "nnf-system"  # where nnf-sos runs and keeps its profiles and port manager
NNF_EXAMPLES_ENV = "FLUX_DWS_NNF_EXAMPLES"  # nnf-sos's config/examples (its profiles)
DEFAULT_NNF_EXAMPLES = "/opt/dws/config/nnf-sos/examples"
NNF_DRIVER_ID = "nnf"  # nnf-sos's DWS_DRIVER_ID (config/default/manager_ev_patch.yaml)


def nnf_examples() -> str:
    return os.environ.get(NNF_EXAMPLES_ENV) or DEFAULT_NNF_EXAMPLES


def nnf_sos_problem() -> str | None:
    """Why nnf-sos cannot run beside the real DWS here (one line), or None."""
    if real_dws_problem():
        return real_dws_problem()
    if not os.access(nnf_sos(), os.X_OK):
        return f"nnf-sos skipped: {nnf_sos()} is not an executable (set {NNF_SOS_ENV})"
    if len(crd_dirs()) < 2:
        return f"nnf-sos skipped: CRD manifests of DWS and nnf-sos not found (set {CRDS_ENV})"
    if not os.path.isdir(nnf_examples()):
        return f"nnf-sos skipped: no {nnf_examples()} (set {NNF_EXAMPLES_ENV})"
    return None


def _nnf_env(logdir: str) -> dict[str, str]:
    """What nnf-sos's kind deployment gives both its managers (config/kind, config/manager),
    with every path it writes under ``logdir``: ENVIRONMENT=kind makes its block devices
    mock ones and its file systems directories (pkg/filesystem/kind.go), mounted by symlink.
    """
    mnt = os.path.join(logdir, "nnf-mnt")
    return {
        "ENVIRONMENT": "kind",
        "ENABLE_WEBHOOKS": "false",
        "DWS_DRIVER_ID": NNF_DRIVER_ID,
        "NNF_POD_NAMESPACE": NNF_SYSTEM,
        "NNF_STORAGE_PROFILE_NAMESPACE": NNF_SYSTEM,
        "NNF_CONTAINER_PROFILE_NAMESPACE": NNF_SYSTEM,
        "NNF_DM_PROFILE_NAMESPACE": NNF_SYSTEM,
        "NNF_PORT_MANAGER_NAME": "nnf-port-manager",
        "NNF_PORT_MANAGER_NAMESPACE": NNF_SYSTEM,
        "MOCK_FILE_SYSTEM_PATH": os.path.join(mnt, "filesystems"),
        "SERVER_MOUNT_PREFIX": os.path.join(mnt, "server"),
        "COMPUTE_MOUNT_PREFIX": os.path.join(mnt, "compute"),
        "NNF_TEMP_MOUNT_PATH": os.path.join(mnt, "temp"),
    }


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
    flags = [f for f in manager_flags(kubeconfig) if not f.startswith("-zap")]
    workdir = os.path.join(logdir, f"nnf-{rabbit}")  # nnf-ec keeps its mock database here
    os.makedirs(workdir, exist_ok=True)
    return GoManager(
        f"nnf-sos node {rabbit}",
        [nnf_sos(), "-controller=node", "-mock", *flags],
        os.path.join(logdir, f"nnf-sos-{rabbit}.log"),
        {
            **_nnf_env(logdir),
            "PATH": f"{stub}:{os.environ.get('PATH', '')}",
            "NNF_NODE_NAME": rabbit,
            "NNF_POD_NAME": f"nnf-node-manager-{rabbit}",
            "RABBIT_NODE": "0",  # nnf-ec's endpoint of the rabbit itself (config/manager)
        },
        cwd=workdir,
    )


def nnf_storage_controller(kubeconfig: str, logdir: str) -> GoManager:
    """nnf-sos's storage controller (its Deployment): DirectiveBreakdowns, Servers, NnfStorage,
    NnfAccess, persistent storage, and its driver entries of every Workflow."""
    flags = [f for f in manager_flags(kubeconfig) if not f.startswith("-zap")]
    return GoManager(
        "nnf-sos storage",
        [nnf_sos(), "-controller=storage", *flags],
        os.path.join(logdir, "nnf-sos-storage.log"),
        {**_nnf_env(logdir), "NNF_POD_NAME": "nnf-controller-manager"},
        cwd=logdir,
    )


def install_nnf_profiles(store: Any) -> None:
    """nnf-sos's example profiles (config/examples) in nnf-system, and the "default" storage
    and data movement profiles a deployment makes from their templates (data.default)."""
    import yaml

    examples = nnf_examples()
    for name in sorted(os.listdir(examples)):
        if not name.startswith("nnf_") or not name.endswith(".yaml"):
            continue
        with open(os.path.join(examples, name)) as handle:
            docs = [d for d in yaml.safe_load_all(handle) if isinstance(d, dict)]
        for doc in docs:
            plural = doc["kind"].lower() + ("s" if not doc["kind"].endswith("s") else "")
            meta = {"name": doc["metadata"]["name"], "namespace": NNF_SYSTEM}
            store.create(plural, NNF_SYSTEM, {**doc, "metadata": meta})
            if meta["name"] == "template":
                data = {**doc["data"], "default": True}
                default = {**doc, "metadata": {**meta, "name": "default"}, "data": data}
                store.create(plural, NNF_SYSTEM, default)


def nnf_node_pod(rabbit: str) -> dict[str, Any]:
    """The Pod nnf-sos's node manager runs in, as the kubelet reports it: its block storage
    controller reads the manager container's start time (NNF_POD_NAME, NNF_POD_NAMESPACE)
    to tell a rebooted rabbit's stale devices (isNodeBlockStorageCurrent)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    running = {
        "name": "manager",
        "ready": True,
        "restartCount": 0,
        "image": "nnf-sos",
        "imageID": "",
        "state": {"running": {"startedAt": started}},
    }
    return {
        "metadata": {"name": f"nnf-node-manager-{rabbit}", "namespace": NNF_SYSTEM},
        "spec": {"nodeName": rabbit, "containers": [{"name": "manager", "image": "nnf-sos"}]},
        "status": {"phase": "Running", "startTime": started, "containerStatuses": [running]},
    }


class NnfSos:
    """nnf-sos in mock mode: its storage controller and one node controller per rabbit."""

    def __init__(self, kubeconfig: str, logdir: str, rabbits: Sequence[str]) -> None:
        self.storage = nnf_storage_controller(kubeconfig, logdir)
        self.nodes = [nnf_node_controller(kubeconfig, r, logdir) for r in rabbits]

    @property
    def managers(self) -> list[GoManager]:
        return [self.storage, *self.nodes]

    def start(self) -> NnfSos:
        try:
            for manager in self.managers:
                manager.start()
            for manager in self.managers:
                manager.wait_ready(60)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for manager in reversed(self.managers):
            manager.stop()

    def running(self) -> bool:
        return all(m.running() for m in self.managers)


def lustre_problem() -> str | None:
    """Why nnf-sos's data movement cannot run here (one line), or None: it needs nnf-sos and
    LustreFileSystem's CRD (lustre-fs-operator's config/crd/bases, vendored by nnf-sos)."""
    if nnf_sos_problem():
        return nnf_sos_problem()
    if not any(os.path.isfile(os.path.join(d, LUSTRE_CRD)) for d in crd_dirs()):
        where = f"{DEFAULT_LUSTRE_CRDS} (or {CRDS_ENV})"
        return f"nnf-sos data movement skipped: no {LUSTRE_CRD} in {where}"
    return None


def data_movement_manager() -> dict[str, Any]:
    """What nnf-dm's deployment makes and nnf-sos reads before it starts a copy (its
    NnfDataMovementManager, nnf-dm-system/nnf-dm-manager-controller-manager)."""
    return {
        "apiVersion": "nnf.cray.hpe.com/v1alpha11",
        "kind": "NnfDataMovementManager",
        "metadata": {"name": "nnf-dm-manager-controller-manager", "namespace": "nnf-dm-system"},
        "spec": {
            "selector": {},
            "template": {"spec": {"containers": []}},
            "hostPath": "/mnt/nnf",
            "mountPath": "/mnt/nnf",
        },
    }


def prepare_deployment(store: Any, rabbits: Sequence[str]) -> None:
    """What nnf-sos's deployment has before it starts: each rabbit's Kubernetes Node, Ready,
    and its manager pod; nnf-sos's profiles; each rabbit's LNet address (testing.nnfmock)."""
    from flux_dws.testing.nnfmock import own_nids

    for rabbit in rabbits:
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
        node = {"metadata": {"name": rabbit}, "status": {"conditions": [ready]}}
        store.create("nodes", None, node)
        store.create("pods", NNF_SYSTEM, nnf_node_pod(rabbit))
    install_nnf_profiles(store)
    own_nids(store, list(rabbits))


def wait_for_storage(
    store: Any, rabbits: Sequence[str], running: Callable[[], bool], timeout: float = 60.0
) -> None:
    """Until every rabbit's Storage is Ready: DWS makes it, nnf-sos reports its status.
    RuntimeError after ``timeout`` seconds, or as soon as nnf-sos is not ``running``."""
    deadline = time.monotonic() + timeout
    while True:
        storages, _ = store.list("storages", "default")
        up = {s["metadata"]["name"] for s in storages if _ready(s)}
        if up >= set(rabbits):
            return
        if time.monotonic() > deadline or not running():
            raise RuntimeError(f"nnf-sos reported no Ready Storage for {list(rabbits)}")
        time.sleep(0.1)


def _ready(storage: dict[str, Any]) -> bool:
    return (storage.get("status") or {}).get("status") == "Ready"
