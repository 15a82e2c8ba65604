# SPDX-License-Identifier: LGPL-3.0-only
"""Reads for the job's records: NnfDataMovements, container pods and their logs.

The pods and NnfDataMovements come from the watches of flux_dws.k8s.recordcache when those
have caught up with the workflow; else (not listed yet, failing, behind) they are listed.

Each call goes through KubeClient's Calls (a timeout per attempt, bounded retries).  A refusal
that retrying cannot cure (403 from RBAC, 404, 400 for a container that never started) is
turned into words for the record instead of an error, so a job is never held up by it; only
transient failures (API unreachable, 5xx after the retries) raise KubeError, and the caller
tries again later.
"""

from __future__ import annotations

from typing import Any

from flux_dws.core.copies import WORKFLOW_NAME_LABEL, WORKFLOW_NAMESPACE_LABEL
from flux_dws.core.output import (
    MAX_CONTAINERS,
    ContainerOutput,
    SavedOutput,
    assemble,
    container_selector,
    pod_containers,
    tail,
    tail_lines,
)
from flux_dws.k8s.client import KubeClient
from flux_dws.k8s.errors import KubeError
from flux_dws.k8s.recordcache import WatchedObjects
from flux_dws.k8s.resources import DATA_MOVEMENTS


def permanent(exc: KubeError) -> bool:
    """A refusal that asking again will not change."""
    return exc.status is not None and 400 <= exc.status < 500 and exc.status not in (408, 429)


def _cached(
    cache: WatchedObjects | None,
    kube: KubeClient,
    workflow: str,
    namespace: str,
    at: str,
    catch_up: float | None = None,
) -> list[dict[str, Any]] | None:
    """The watch's copy, when it is as fresh as a list at resourceVersion ``at`` would be
    (flux_dws.k8s.recordcache); None: list instead."""
    if cache is None or namespace != kube.namespace:
        return None
    return cache.read(workflow, at, catch_up)


def read_data_movements(
    kube: KubeClient,
    workflow: str,
    namespace: str,
    cache: WatchedObjects | None = None,
    at: str = "",
) -> list[dict[str, Any]]:
    """The workflow's NnfDataMovements in every namespace (Lustre ones live in nnf-dm-system,
    XFS/GFS2 ones in each rabbit's namespace), by the workflow labels nnf-sos puts on them:
    from ``cache`` when it has caught up with the workflow's resourceVersion ``at``, else
    listed.

    KubeError for any failure; [] when NNF is not served.
    """
    if not kube.versions.nnf:
        return []
    found = _cached(cache, kube, workflow, namespace, at)
    if found is not None:
        return found
    selector = f"{WORKFLOW_NAME_LABEL}={workflow},{WORKFLOW_NAMESPACE_LABEL}={namespace}"
    where = kube._collection(
        DATA_MOVEMENTS,
        None,
        selector,
        what="nnfdatamovements of workflow",
        target=f"{namespace}/{workflow}",
    )
    return kube._items(where)


def data_movements_or_why(
    kube: KubeClient,
    workflow: str,
    namespace: str,
    cache: WatchedObjects | None = None,
    at: str = "",
) -> tuple[list[dict[str, Any]], str]:
    """read_data_movements, with a refusal that asking again will not change read as no
    records and the reason (a KubeError that may pass is raised, to be retried)."""
    try:
        return read_data_movements(kube, workflow, namespace, cache, at), ""
    except KubeError as exc:
        if not permanent(exc):
            raise
        return [], f"could not read the NnfDataMovements: {exc}"


def collect_output(
    kube: KubeClient,
    workflow: str,
    namespace: str,
    limit: int,
    cache: WatchedObjects | None = None,
    at: str = "",
    catch_up: float | None = None,
) -> SavedOutput:
    """Every container of the workflow's pods, with the last ``limit`` bytes of its log; the
    pods from ``cache`` when it has caught up with the workflow's resourceVersion ``at``
    (waiting for it ``catch_up`` seconds at most, by default CATCH_UP).

    KubeError only when the pods cannot be listed for a transient reason.
    """
    try:
        pods = _cached(cache, kube, workflow, namespace, at, catch_up)
        if pods is None:
            pods = _list_pods(kube, workflow, namespace)
    except KubeError as exc:
        if not permanent(exc):
            raise
        return assemble((), limit=limit, note=f"the pods could not be listed: {exc}")
    if not pods:
        return assemble((), limit=limit, note="no container output: the pods were already gone")
    statuses = [c for pod in pods for c in pod_containers(pod)]
    read, skipped = statuses[:MAX_CONTAINERS], max(0, len(statuses) - MAX_CONTAINERS)
    outputs = []
    for status in read:
        if limit <= 0:
            outputs.append(ContainerOutput(status, error="logs are not saved ([dws] setting)"))
            continue
        try:
            data, more = _read_tail(kube, status.pod, namespace, status.name, limit)
        except KubeError as exc:
            if not permanent(exc):
                raise
            outputs.append(ContainerOutput(status, error=exc.what or str(exc)))
            continue
        text, truncated = tail(data, limit)
        outputs.append(ContainerOutput(status, log=text, truncated=truncated or more))
    return assemble(outputs, limit=limit, skipped=skipped)


def _list_pods(kube: KubeClient, workflow: str, namespace: str) -> list[dict[str, Any]]:
    selector = container_selector(workflow)
    return kube._items(
        kube._pods(namespace, selector, "pods of workflow", f"{namespace}/{workflow}")
    )


def _read_tail(
    kube: KubeClient, pod: str, namespace: str, container: str, limit: int
) -> tuple[bytes, bool]:
    """The end of a container's log, and whether older output was left out.

    The server cuts an answer after ``limitBytes`` from its start, so the tail is asked for in
    lines: ``tail_lines(limit)`` of them, fewer while the answer fills the byte bound (a line
    too long to fit; then the one line left may be cut).
    """
    bound = max(limit * 4, 4096)
    data, more = b"", False
    for lines in tail_lines(limit):
        where = f"{namespace}/{pod}/{container}"
        data = kube.calls.call(
            "get",
            "pod log",
            where,
            kube._core.read_namespaced_pod_log,
            pod,
            namespace,
            container=container,
            tail_lines=lines,
            limit_bytes=bound,
        )
        # as many lines as asked: older ones may have been left out (the last line of a log
        # need not end in a newline, and still counts)
        more = data.count(b"\n") + (not data.endswith(b"\n") and bool(data)) >= lines
        if len(data) < bound:
            return data, more
    return data, True
