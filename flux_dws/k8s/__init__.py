# SPDX-License-Identifier: LGPL-3.0-only
"""The only code that talks to Kubernetes.

- KubeClient: DWS/NNF requests, each with a timeout and bounded, jittered, counted retries.
- WorkflowWatch: one long-lived watch on this instance's workflows (resourceVersion resume,
  bookmarks, one re-list after 410 Gone), delivering each change once.
- KubeWorker: runs KubeClient calls off the service's event loop.
"""

from __future__ import annotations

from flux_dws.k8s.client import KubeClient
from flux_dws.k8s.errors import KubeError, KubeSetupError, WorkflowRejected
from flux_dws.k8s.resources import ApiVersions, ContainerTimeouts, container_timeouts
from flux_dws.k8s.watch import WorkflowWatch
from flux_dws.k8s.worker import KubeWorker

__all__ = [
    "ApiVersions",
    "ContainerTimeouts",
    "KubeClient",
    "KubeError",
    "KubeSetupError",
    "KubeWorker",
    "WorkflowRejected",
    "WorkflowWatch",
    "container_timeouts",
]
