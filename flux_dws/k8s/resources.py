# SPDX-License-Identifier: LGPL-3.0-only
"""The DWS and NNF resources flux-dws touches, and the bodies it sends: pure functions.

Kept apart from the HTTP code so what we write to Kubernetes can be read (and reviewed against
dws-api.md) in one place.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flux_dws.base import untrusted
from flux_dws.core.identity import FINALIZER, WLM_ID, owned_jobid, ownership_labels, workflow_name
from flux_dws.core.states import State
from flux_dws.core.storage import StorageError
from flux_dws.k8s.errors import KubeSetupError

DWS_GROUP = "dataworkflowservices.github.io"
NNF_GROUP = "nnf.cray.hpe.com"

#: Workflow versions a WLM may use, best first (dws-api.md section 1).
WORKFLOW_VERSIONS: tuple[str, ...] = ("v1alpha7", "v1alpha6")

#: DWS keeps one Storage resource per rabbit here.
STORAGE_NAMESPACE = "default"

#: DWS keeps the one SystemConfiguration here.
SYSTEM_CONFIGURATION = ("default", "default")
SYSTEM_STATUS = ("default", "default")

#: nnf-sos defaults when a profile leaves a timeout out (dws-api.md section 4).
DEFAULT_CONTAINER_TIMEOUT = 300

UINT32_MAX = 2**32 - 1


@dataclass(frozen=True)
class ApiVersions:
    """The served versions flux-dws speaks: Workflow (and friends), and NNF (None: no NNF)."""

    workflow: str
    nnf: str | None


@dataclass(frozen=True)
class ServedGroup:
    """One API group as discovery reports it."""

    versions: tuple[str, ...]
    preferred: str | None = None


@dataclass(frozen=True)
class Kind:
    """One kind of DWS or NNF object, described once: where its requests go (its API group
    and plural, at the version served for its group) and the noun a request for one object
    names it by in errors, logs and counts (flux_dws.k8s.objects makes the requests)."""

    plural: str
    noun: str
    group: str = DWS_GROUP

    def version(self, versions: ApiVersions) -> str | None:
        """The version its requests use: NNF's for NNF kinds, else the Workflow's."""
        return versions.nnf if self.group == NNF_GROUP else versions.workflow


#: Every kind flux-dws reads or writes.  Each is namespaced; a list or watch may span every
#: namespace (flux_dws.k8s.client says which).
WORKFLOWS = Kind("workflows", "workflow")
COMPUTES = Kind("computes", "computes")
SERVERS = Kind("servers", "servers")
BREAKDOWNS = Kind("directivebreakdowns", "directivebreakdown")
SYSTEM_CONFIGURATIONS = Kind("systemconfigurations", "systemconfiguration")
SYSTEM_STATUSES = Kind("systemstatuses", "systemstatus")
STORAGES = Kind("storages", "storages")
PERSISTENT_STORAGES = Kind("persistentstorageinstances", "persistentstorageinstances")
CLIENTMOUNTS = Kind("clientmounts", "clientmounts")
CONTAINER_PROFILES = Kind("nnfcontainerprofiles", "nnfcontainerprofile", NNF_GROUP)
DATA_MOVEMENTS = Kind("nnfdatamovements", "nnfdatamovements", NNF_GROUP)


def choose_versions(
    served: Mapping[str, ServedGroup],
    *,
    workflow_override: str | None = None,
    nnf_override: str | None = None,
) -> ApiVersions:
    """Pick the versions to use; an admin's override wins over discovery.

    Raises KubeSetupError, one line, when no DWS Workflow version is served.
    """
    nnf_group = served.get(NNF_GROUP)
    nnf = nnf_override or (
        (nnf_group.preferred or (nnf_group.versions[0] if nnf_group.versions else None))
        if nnf_group
        else None
    )
    if workflow_override:
        return ApiVersions(workflow=workflow_override, nnf=nnf)
    dws = served.get(DWS_GROUP)
    if dws is None:
        raise KubeSetupError(
            f"the API server does not serve {DWS_GROUP}: is DWS installed on this cluster?"
        )
    for version in WORKFLOW_VERSIONS:
        if version in dws.versions:
            return ApiVersions(workflow=version, nnf=nnf)
    raise KubeSetupError(
        f"{DWS_GROUP} serves {', '.join(dws.versions) or 'no version'}, none of"
        f" {', '.join(WORKFLOW_VERSIONS)}: upgrade DWS or set [dws] workflow-version"
    )


def check_uint32(what: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= UINT32_MAX:
        raise ValueError(f"{what} must be an integer from 0 to {UINT32_MAX}, not {value!r}")
    return value


def workflow_body(
    *,
    identity: str,
    namespace: str,
    version: str,
    jobid: int,
    userid: int,
    groupid: int,
    directives: Sequence[str],
) -> dict[str, Any]:
    """A new Workflow for ``jobid``, owned by this instance, in Proposal.

    ``jobID`` is sent as a decimal string: Flux job ids exceed the int32 that Kubernetes'
    int-or-string holds.  userID and groupID come from the job, never from user input.
    """
    if isinstance(jobid, bool) or not isinstance(jobid, int) or jobid < 0:
        raise ValueError(f"jobid must be a non-negative integer, not {jobid!r}")
    check_uint32("userid", userid)
    check_uint32("groupid", groupid)
    return {
        "apiVersion": f"{DWS_GROUP}/{version}",
        "kind": "Workflow",
        "metadata": {
            "name": workflow_name(identity, jobid),
            "namespace": namespace,
            "labels": ownership_labels(identity, jobid),
            "finalizers": [FINALIZER],
        },
        "spec": {
            "desiredState": State.PROPOSAL.value,
            "wlmID": WLM_ID,
            "jobID": str(jobid),
            "userID": userid,
            "groupID": groupid,
            "dwDirectives": list(directives),
            "forceReady": False,
        },
    }


def is_ours(obj: Mapping[str, Any], identity: str, jobid: int) -> bool:
    """Whether ``obj`` is the workflow this instance created for ``jobid``."""
    return owned_jobid(obj, identity) == jobid


def desired_state_patch(state: State, hurry: bool = False) -> dict[str, Any]:
    """Merge patch moving a workflow to ``state``; ``hurry`` is only legal with Teardown."""
    if hurry and state is not State.TEARDOWN:
        raise ValueError(f"hurry is only allowed with Teardown, not {state.value}")
    spec: dict[str, Any] = {"desiredState": state.value}
    if hurry:
        spec["hurry"] = True
    return {"spec": spec}


def computes_patch(hosts: Sequence[str]) -> dict[str, Any]:
    """Merge patch listing the job's compute nodes (replaces the whole list)."""
    return {"data": [{"name": host} for host in hosts]}


def servers_patch(
    allocation_sets: Sequence[Mapping[str, Any]], annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Merge patch telling NNF which rabbits serve each allocation set, with ``annotations``
    (the exclusive keys of its sets, flux_dws.core.colocation) when given."""
    patch: dict[str, Any] = {"spec": {"allocationSets": [dict(s) for s in allocation_sets]}}
    if annotations:
        patch["metadata"] = {"annotations": dict(annotations)}
    return patch


def finalizer_removal_patch(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """Merge patch dropping our finalizer, guarded by resourceVersion; None if it is not there.

    The resourceVersion makes the API server refuse (409) a patch computed from a stale read,
    so a finalizer another controller added meanwhile is never lost.
    """
    meta = obj.get("metadata")
    finalizers = meta.get("finalizers") if isinstance(meta, Mapping) else None
    if not isinstance(finalizers, list) or FINALIZER not in finalizers:
        return None
    return {
        "metadata": {
            "finalizers": [f for f in finalizers if f != FINALIZER],
            "resourceVersion": meta.get("resourceVersion"),
        }
    }


def breakdown_refs(workflow: Mapping[str, Any]) -> list[Mapping[str, str]]:
    """``status.directiveBreakdowns`` checked: StorageError names an entry that is not an
    object reference with a string name (and, if any, namespace)."""
    status = workflow.get("status")
    refs = (status.get("directiveBreakdowns") if isinstance(status, Mapping) else None) or []
    if not isinstance(refs, (list, tuple)):
        raise StorageError("workflow status.directiveBreakdowns must be a list")
    for i, ref in enumerate(refs):
        ok = isinstance(ref, Mapping) and isinstance(ref.get("name"), str) and ref.get("name")
        if not ok or not isinstance(ref.get("namespace") or "", str):
            raise StorageError(
                f"workflow status.directiveBreakdowns[{i}] must be a reference with a name"
            )
    return list(refs)


def container_profile_name(workflow: Mapping[str, Any]) -> str | None:
    """The pinned profile nnf-sos makes in Proposal: ``<workflow>-<index of the container>``."""
    meta, spec = workflow.get("metadata"), workflow.get("spec")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    directives = spec.get("dwDirectives") if isinstance(spec, Mapping) else None
    if not isinstance(name, str) or not isinstance(directives, list):
        return None
    for index, line in enumerate(directives):
        if str(line).split()[:2] == ["#DW", "container"]:
            return f"{name}-{index}"
    return None


@dataclass(frozen=True)
class ContainerTimeouts:
    """Seconds nnf-sos waits for containers to start (PreRun) and to exit (PostRun); 0 = off."""

    prerun: int
    postrun: int


def container_timeouts(profile: Mapping[str, Any]) -> ContainerTimeouts:
    """The timeouts of a container profile, with nnf-sos's defaults for missing ones."""
    data = profile.get("data")
    data = untrusted.mapping(data)

    def seconds(key: str) -> int:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return DEFAULT_CONTAINER_TIMEOUT
        return value

    return ContainerTimeouts(
        prerun=seconds("preRunTimeoutSeconds"), postrun=seconds("postRunTimeoutSeconds")
    )


def decode_token(data: Mapping[str, str] | None) -> str | None:
    """A Secret's ``data.token``, base64-decoded; None if absent or not valid base64 text
    (a non-ASCII character in it included: b64decode raises a plain ValueError for that)."""
    encoded = data.get("token") if isinstance(data, Mapping) else None
    if not encoded or not isinstance(encoded, str):
        return None
    try:
        return base64.b64decode(encoded, validate=True).decode("utf-8")
    except ValueError:  # binascii.Error, UnicodeDecodeError and non-ASCII input alike
        return None


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def version_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
