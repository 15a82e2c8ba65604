# SPDX-License-Identifier: LGPL-3.0-only
"""Reads and writes of the admin commands (``flux dws rabbits``, ``flux dws persistent``).

They run with the person's own kubeconfig, not the service's, so they are kept apart from
KubeClient's methods (whose RBAC the service's manifest grants exactly).  Each call goes
through KubeClient's Calls: a timeout per attempt and bounded retries.
"""

from __future__ import annotations

from typing import Any

from flux_dws.k8s.client import KubeClient
from flux_dws.k8s.resources import PERSISTENT_STORAGES, WORKFLOWS, Kind

#: nnf-sos lets any uid's persistentdw use an instance carrying this annotation set to "true"
#: (nnf_workflow_controller_helpers.go, PersistentStorageIgnoreUIDAnnotation).
IGNORE_UID = "dataworkflowservices.github.io/ignore-uid"


def _list(kube: KubeClient, kind: Kind, namespace: str | None) -> list[dict[str, Any]]:
    return kube._items(kube._collection(kind, namespace))


def list_all_workflows(kube: KubeClient, namespace: str | None = None) -> list[dict[str, Any]]:
    """Workflows of every instance (the person's view, not one instance's)."""
    return _list(kube, WORKFLOWS, namespace)


def list_persistent(kube: KubeClient, namespace: str | None = None) -> list[dict[str, Any]]:
    """PersistentStorageInstances."""
    return _list(kube, PERSISTENT_STORAGES, namespace)


def get_persistent(kube: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    return kube._get(PERSISTENT_STORAGES, namespace, name)


def set_shared(kube: KubeClient, namespace: str, name: str, shared: bool) -> dict[str, Any]:
    """Set (``"true"``) or remove nnf-sos's ignore-uid annotation on an instance."""
    body = {"metadata": {"annotations": {IGNORE_UID: "true" if shared else None}}}
    return kube._patch(PERSISTENT_STORAGES, namespace, name, body)


__all__ = [
    "IGNORE_UID",
    "PERSISTENT_STORAGES",
    "get_persistent",
    "list_all_workflows",
    "list_persistent",
    "set_shared",
]
