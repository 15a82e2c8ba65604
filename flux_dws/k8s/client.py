# SPDX-License-Identifier: LGPL-3.0-only
"""KubeClient: every Kubernetes request flux-dws makes, each bounded in time and retries.

Synchronous and thread-safe: the service runs these calls on a KubeWorker thread, never on its
event loop.  This module says which objects flux-dws reads and writes (their kinds are
described once, in flux_dws.k8s.resources); its base, flux_dws.k8s.objects, says how any one
request is made: through flux_dws.k8s.calls (a timeout per attempt, bounded jittered retries,
every attempt counted).  Credentials come from flux_dws.k8s.config.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import urllib3
from kubernetes import client as k8s

from flux_dws.base.jobid import f58
from flux_dws.core.identity import check_identity, instance_selector, workflow_name
from flux_dws.core.states import State
from flux_dws.k8s import listing
from flux_dws.k8s.calls import Calls, merge_patch_kwargs
from flux_dws.k8s.config import load_configuration
from flux_dws.k8s.errors import KubeError, KubeSetupError, NameTaken
from flux_dws.k8s.listing import Page
from flux_dws.k8s.objects import Collection, KubeObjects
from flux_dws.k8s.rawapi import Core, CustomObjects, RawApi
from flux_dws.k8s.resources import (
    BREAKDOWNS,
    CLIENTMOUNTS,
    COMPUTES,
    CONTAINER_PROFILES,
    DWS_GROUP,
    PERSISTENT_STORAGES,
    SERVERS,
    STORAGE_NAMESPACE,
    STORAGES,
    SYSTEM_CONFIGURATION,
    SYSTEM_CONFIGURATIONS,
    SYSTEM_STATUS,
    SYSTEM_STATUSES,
    WORKFLOWS,
    ApiVersions,
    ServedGroup,
    breakdown_refs,
    choose_versions,
    computes_patch,
    container_profile_name,
    decode_token,
    desired_state_patch,
    finalizer_removal_patch,
    is_ours,
    servers_patch,
    workflow_body,
)

log = logging.getLogger("flux-dws.k8s")

#: How often a finalizer removal re-reads and retries after a conflict (409).
CONFLICT_RETRIES = 10
#: What a list or watch of this instance's workflows names in its errors.
WATCHED = "workflows in namespace"


class KubeClient(KubeObjects):
    """The DWS and NNF requests of one Flux instance, in one namespace."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        namespace: str,
        identity: str,
        versions: ApiVersions,
        timeout: float = 10.0,
        retries: int = 5,
        backoff_base: float = 0.1,
        backoff_max: float = 5.0,
    ) -> None:
        self.namespace = namespace
        self.identity = check_identity(identity)
        self.versions = versions
        self.calls = Calls(
            timeout=timeout, retries=retries, backoff_base=backoff_base, backoff_max=backoff_max
        )
        self.host = api_client.configuration.host
        self._api = api_client
        self._raw = RawApi(api_client)  # the generated API classes cost more than the HTTP
        self._custom = CustomObjects(self._raw)
        self._core = Core(self._raw)
        self._merge_patch = merge_patch_kwargs(self._custom.patch_namespaced_custom_object)

    @classmethod
    def connect(
        cls,
        *,
        namespace: str,
        identity: str,
        kubeconfig: str | None = None,
        workflow_version: str | None = None,
        nnf_version: str | None = None,
        timeout: float = 10.0,
        retries: int = 5,
    ) -> KubeClient:
        """Connect, discover the served versions and check we may list workflows.

        Every failure is one KubeSetupError line (ValueError for an invalid identity);
        nothing here leaks a traceback.
        """
        check_identity(identity)
        api = k8s.ApiClient(load_configuration(kubeconfig))
        placeholder = ApiVersions(workflow=workflow_version or "", nnf=nnf_version)
        kube = cls(
            api,
            namespace=namespace,
            identity=identity,
            versions=placeholder,
            timeout=timeout,
            retries=retries,
        )
        try:
            kube.versions = choose_versions(
                kube.served_groups(),
                workflow_override=workflow_version,
                nnf_override=nnf_version,
            )
            kube.check_access()
        except KubeSetupError:
            kube.close()
            raise
        except KubeError as exc:
            kube.close()
            transient = exc.status is None or exc.status == 429 or exc.status >= 500
            raise KubeSetupError(
                f"Kubernetes API at {kube.host}: {exc}", transient=transient
            ) from exc
        log.info(
            "connected to %s: Workflow %s/%s, NNF %s, namespace %s, instance %s",
            kube.host,
            DWS_GROUP,
            kube.versions.workflow,
            kube.versions.nnf or "not served",
            namespace,
            identity,
        )
        return kube

    def close(self) -> None:
        self._api.close()

    def request_counts(self) -> dict[str, int]:
        """A snapshot of ``counts`` (requests sent, by verb), safe to read from any thread."""
        return self.calls.snapshot()

    # -- discovery -----------------------------------------------------------------------

    def ping(self) -> None:
        """GET /version once, no retries: is the server answering at all (API health probe)?"""

        self.calls.call(
            "get", "version", "/version", self._raw.request, "GET", "/version", retries=0
        )

    def served_groups(self) -> dict[str, ServedGroup]:
        """API group -> served versions, from the API server's discovery document."""

        doc = self.calls.call("get", "discovery", "/apis", self._raw.request, "GET", "/apis")
        groups: dict[str, ServedGroup] = {}
        for group in doc.get("groups") or []:
            versions = tuple(v.get("version", "") for v in group.get("versions") or [])
            preferred = (group.get("preferredVersion") or {}).get("version")
            groups[group.get("name", "")] = ServedGroup(versions=versions, preferred=preferred)
        return groups

    def check_access(self) -> None:
        """List one workflow: proves the version is served and we may read the namespace."""
        try:
            self.list_workflows(limit=1)
        except KubeError as exc:
            if exc.status == 404:
                raise KubeSetupError(
                    f"{DWS_GROUP}/{self.versions.workflow} workflows are not served in"
                    f" namespace {self.namespace}: check [dws] workflow-version and namespace"
                ) from exc
            raise

    # -- workflows -----------------------------------------------------------------------

    def create_workflow(
        self, *, jobid: int, userid: int, groupid: int, directives: Sequence[str]
    ) -> dict:
        """Create the job's workflow in Proposal; if it already exists and is ours, return it.

        A 403 from the DWS admission webhook raises WorkflowRejected (a user error).
        """
        body = workflow_body(
            identity=self.identity,
            namespace=self.namespace,
            version=self.versions.workflow,
            jobid=jobid,
            userid=userid,
            groupid=groupid,
            directives=directives,
        )
        name = body["metadata"]["name"]
        try:
            return self._create(WORKFLOWS, self.namespace, name, body)
        except KubeError as exc:
            if exc.status != 409:
                raise
        existing = self.get_workflow(name)
        if existing is not None and is_ours(existing, self.identity, jobid):
            log.info("workflow %s for job %s already exists; adopting it", name, f58(jobid))
            return existing
        target = f"{self.namespace}/{name}"
        if existing is not None:
            raise NameTaken("create", "workflow", target)
        raise KubeError(
            "create",
            "workflow",
            target,
            "conflicted with an object that has since disappeared",
            status=409,
        )

    def get_workflow(self, name: str) -> dict | None:
        """The workflow, or None if there is none."""
        return self._get(WORKFLOWS, self.namespace, name)

    def list_workflows(self, limit: int | None = None) -> tuple[list[dict], str]:
        """This instance's workflows (by label) and the list's resourceVersion.

        Lists in pages of ``objects.LIST_PAGE`` (a real server throttles one huge list);
        every page of one list shows the same resourceVersion.  A continue token that expired
        (410) restarts the list, a bounded number of times.  ``limit``: one page of at most
        that many, for a cheap probe.
        """
        if limit:
            items, rv, _ = self._list_page(limit, None, self._ours())
            return items, rv
        return listing.collect(self.workflow_pages())

    def workflow_pages(self) -> Iterator[Page]:
        """This instance's workflows page by page, each as it arrives (see list_workflows):
        whoever reads them may act on a page before the next is asked for."""
        return self._list_pages(self._ours())

    def _ours(self) -> Collection:
        """This instance's workflows (by label), in its namespace."""
        selector = instance_selector(self.identity)
        return self._collection(WORKFLOWS, self.namespace, selector, what=WATCHED)

    def set_desired_state(self, name: str, state: State, *, hurry: bool = False) -> dict:
        """Merge-patch spec.desiredState (with hurry, only for Teardown)."""
        return self._patch(WORKFLOWS, self.namespace, name, desired_state_patch(state, hurry))

    def annotate_workflow(self, name: str, key: str, value: str) -> dict:
        """Merge-patch one annotation of the workflow (flux-dws's own, e.g. its release mark)."""
        body = {"metadata": {"annotations": {key: value}}}
        return self._patch(WORKFLOWS, self.namespace, name, body)

    def patch_computes(self, name: str, hosts: Sequence[str]) -> dict:
        """Write the job's compute nodes into the Computes resource named like the workflow."""
        return self._patch(COMPUTES, self.namespace, name, computes_patch(hosts))

    def read_breakdowns(self, workflow: Mapping) -> list[dict]:
        """The DirectiveBreakdowns listed in ``status.directiveBreakdowns``, in that order."""
        default_ns = (workflow.get("metadata") or {}).get("namespace") or self.namespace
        breakdowns = []
        for ref in breakdown_refs(workflow):
            namespace = ref.get("namespace") or default_ns
            obj = self._get(BREAKDOWNS, namespace, ref.get("name", ""))
            if obj is None:
                raise KubeError(
                    "get",
                    "directivebreakdown",
                    f"{namespace}/{ref.get('name')}",
                    "listed by the workflow but not found",
                    status=404,
                )
            breakdowns.append(obj)
        return breakdowns

    def patch_servers(
        self,
        name: str,
        namespace: str,
        allocation_sets: list[dict],
        annotations: Mapping[str, str] | None = None,
    ) -> dict:
        """Write spec.allocationSets of a Servers resource (named by a DirectiveBreakdown),
        and ``annotations`` when given."""
        body = servers_patch(allocation_sets, annotations)
        return self._patch(SERVERS, namespace, name, body)

    def read_system_configuration(self) -> dict | None:
        """DWS's SystemConfiguration (which rabbit serves which compute node), or None."""
        return self._get(SYSTEM_CONFIGURATIONS, *SYSTEM_CONFIGURATION)

    # -- health: Storage, SystemStatus, ClientMount, Servers (flux_dws.core.health) --------------

    def list_storages(self) -> tuple[list[dict], str]:
        """Every rabbit's Storage resource (capacity, health, links to its computes), in
        pages, and the list's resourceVersion (where a StorageWatch resumes)."""
        return self._list_all(self._collection(STORAGES, STORAGE_NAMESPACE))

    def open_storage_watch(
        self, resource_version: str, timeout_seconds: int, read_timeout: float
    ) -> urllib3.HTTPResponse:
        """Start one watch on every Storage after ``resource_version``; the raw response."""
        where = self._collection(STORAGES, STORAGE_NAMESPACE)
        return self._open_watch(where, resource_version, timeout_seconds, read_timeout)

    def list_persistent(self) -> tuple[list[dict], str]:
        """Every PersistentStorageInstance in our namespace (where nnf-sos makes them for our
        workflows), in pages, and the list's resourceVersion (where a PersistentWatch resumes)."""
        return self._list_all(self._collection(PERSISTENT_STORAGES, self.namespace))

    def open_persistent_watch(
        self, resource_version: str, timeout_seconds: int, read_timeout: float
    ) -> urllib3.HTTPResponse:
        """Start one watch on our namespace's PersistentStorageInstances; the raw response."""
        where = self._collection(PERSISTENT_STORAGES, self.namespace)
        return self._open_watch(where, resource_version, timeout_seconds, read_timeout)

    def read_system_status(self) -> dict | None:
        return self._get(SYSTEM_STATUSES, *SYSTEM_STATUS)

    def write_system_status(self, patch: dict, exists: bool) -> dict:
        """Merge-patch SystemStatus default/default, or create it holding ``patch``."""
        namespace, name = SYSTEM_STATUS
        if exists:
            return self._patch(SYSTEM_STATUSES, namespace, name, patch)
        body = {
            "apiVersion": f"{DWS_GROUP}/{self.versions.workflow}",
            "kind": "SystemStatus",
            "metadata": {"name": name, "namespace": namespace},
            **patch,
        }
        return self._create(SYSTEM_STATUSES, namespace, name, body)

    def list_clientmounts(self, workflow: str, namespace: str | None = None) -> list[dict]:
        """The ClientMounts of a workflow (one per compute node, in the node's namespace)."""
        selector = (
            f"{DWS_GROUP}/workflow.name={workflow},"
            f"{DWS_GROUP}/workflow.namespace={namespace or self.namespace}"
        )
        return self._items(self._collection(CLIENTMOUNTS, None, selector, target=workflow))

    def list_servers(self) -> tuple[list[dict], str]:
        """Every Servers resource, in every namespace: the capacity each rabbit's allocations
        hold, persistent and system storage's included (flux_dws.core.rabbits), in pages, and
        the list's resourceVersion (where a ServersWatch resumes)."""
        return self._list_all(self._collection(SERVERS, None))

    def open_servers_watch(
        self, resource_version: str, timeout_seconds: int, read_timeout: float
    ) -> urllib3.HTTPResponse:
        """Start one watch on every Servers, in every namespace; the raw response."""
        where = self._collection(SERVERS, None)
        return self._open_watch(where, resource_version, timeout_seconds, read_timeout)

    def read_servers(self, namespace: str, name: str) -> dict | None:
        return self._get(SERVERS, namespace, name)

    def force_ready(self, name: str) -> dict:
        """spec.forceReady: DWS takes the current state as ready (failure tolerance)."""
        return self._patch(WORKFLOWS, self.namespace, name, {"spec": {"forceReady": True}})

    def read_container_profile(self, workflow: Mapping) -> dict | None:
        """The container profile nnf-sos pinned for this workflow, or None.

        None when the workflow has no container directive, NNF is not served, or the pinned
        copy does not exist (yet).
        """
        name = container_profile_name(workflow)
        if name is None or not self.versions.nnf:
            return None
        namespace = (workflow.get("metadata") or {}).get("namespace") or self.namespace
        return self._get(CONTAINER_PROFILES, namespace, name)

    def read_token(self, namespace: str, name: str) -> str | None:
        """The workflow token (Secret ``data.token``, decoded), or None if there is none."""

        try:
            secret = self.calls.call(
                "get",
                "secret",
                f"{namespace}/{name}",
                self._core.read_namespaced_secret,
                name,
                namespace,
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return decode_token(secret.get("data"))

    def delete_workflow(self, name: str, seen: Mapping[str, Any] | None = None) -> None:
        """Remove our finalizer, then delete the workflow.  Already gone is success.

        The finalizer patch carries the resourceVersion it was computed from; on a conflict
        the workflow is re-read and the patch recomputed, a bounded number of times.
        ``seen``: the workflow as last watched (its metadata's finalizers and
        resourceVersion are enough), to patch without reading it first; if it is stale, the
        server's 409 makes it re-read.
        """
        target = f"{self.namespace}/{name}"
        for attempt in range(CONFLICT_RETRIES):
            current = seen if attempt == 0 and seen is not None else self.get_workflow(name)
            if current is None:
                return
            patch = finalizer_removal_patch(current)
            if patch is None:
                break
            try:
                self._patch(WORKFLOWS, self.namespace, name, patch, retry_conflict=False)
                break
            except KubeError as exc:
                if exc.status == 404:
                    return
                if exc.status != 409:
                    raise
                log.info("workflow %s changed while removing our finalizer; re-reading", target)
        else:
            raise KubeError(
                "patch",
                "workflow",
                target,
                f"finalizer removal still conflicted after {CONFLICT_RETRIES} re-reads",
                status=409,
            )
        self._delete(WORKFLOWS, self.namespace, name)
        log.info("deleted workflow %s", target)

    def open_workflow_watch(
        self, resource_version: str, timeout_seconds: int, read_timeout: float
    ) -> urllib3.HTTPResponse:
        """Start one watch on our workflows after ``resource_version``; the raw response
        (flux_dws.k8s.objects: no retry, the watch loop reconnects)."""
        return self._open_watch(self._ours(), resource_version, timeout_seconds, read_timeout)

    def workflow_name(self, jobid: int) -> str:
        return workflow_name(self.identity, jobid)
