# SPDX-License-Identifier: LGPL-3.0-only
"""Reads and writes of the admin commands (``flux dws rabbits``, ``flux dws persistent``).

They run with the person's own kubeconfig, not the service's, so they are kept apart from
KubeClient's methods (whose RBAC the service's manifest grants exactly).  Each call goes
through KubeClient's Calls: a timeout per attempt and bounded retries.
"""

from __future__ import annotations

from typing import Any

from flux_dws.base import untrusted
from flux_dws.k8s.client import KubeClient
from flux_dws.k8s.resources import DWS_GROUP, PERSISTENT_STORAGES, WORKFLOWS

#: nnf-sos lets any uid's persistentdw use an instance carrying this annotation set to "true"
#: (nnf_workflow_controller_helpers.go, PersistentStorageIgnoreUIDAnnotation).
IGNORE_UID = "dataworkflowservices.github.io/ignore-uid"


def _list(kube: KubeClient, plural: str, namespace: str | None) -> list[dict[str, Any]]:
    if namespace is None:
        call: Any = kube._custom.list_cluster_custom_object
        args: tuple[Any, ...] = (DWS_GROUP, kube.versions.workflow, plural)
    else:
        call = kube._custom.list_namespaced_custom_object
        args = (DWS_GROUP, kube.versions.workflow, namespace, plural)
    found = kube.calls.call("list", plural, namespace or "*", call, *args)
    items = found.get("items") if isinstance(found, dict) else None
    return [i for i in untrusted.sequence(items) if isinstance(i, dict)]


def list_all_workflows(kube: KubeClient, namespace: str | None = None) -> list[dict[str, Any]]:
    """Workflows of every instance (the person's view, not one instance's)."""
    return _list(kube, WORKFLOWS, namespace)


def list_persistent(kube: KubeClient, namespace: str | None = None) -> list[dict[str, Any]]:
    """PersistentStorageInstances."""
    return _list(kube, PERSISTENT_STORAGES, namespace)


def get_persistent(kube: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    return kube._get(
        PERSISTENT_STORAGES,
        f"{namespace}/{name}",
        DWS_GROUP,
        kube.versions.workflow,
        namespace,
        PERSISTENT_STORAGES,
        name,
    )


def set_shared(kube: KubeClient, namespace: str, name: str, shared: bool) -> dict[str, Any]:
    """Set (``"true"``) or remove nnf-sos's ignore-uid annotation on an instance."""
    body = {"metadata": {"annotations": {IGNORE_UID: "true" if shared else None}}}
    return kube._patch(PERSISTENT_STORAGES, namespace, name, PERSISTENT_STORAGES, body)


__all__ = [
    "IGNORE_UID",
    "PERSISTENT_STORAGES",
    "get_persistent",
    "list_all_workflows",
    "list_persistent",
    "set_shared",
]
