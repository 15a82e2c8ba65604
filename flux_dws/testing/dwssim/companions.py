# SPDX-License-Identifier: LGPL-3.0-only
"""The objects DWS and nnf-sos create beside a Workflow, built as plain dicts.

Computes (Proposal, DWS), DirectiveBreakdowns and their Servers (Proposal, nnf-sos), the
Servers status (Setup), the environment of the job's storage (PreRun) and the copy-offload
token Secret: shapes and names as in dws-api.md section 2.  Every child carries the
workflow's labels and an ownerReference, as upstream, and is named ``<workflow>-<index>``
when it belongs to one directive.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from flux_dws.core.directives import Directive, parse_size
from flux_dws.core.storage import ACROSS_SERVERS, PER_COMPUTE
from flux_dws.testing.dwssim.status import micro_time
from flux_dws.testing.kubeapi.resources import by_plural

WORKFLOW_NAME_LABEL = "dataworkflowservices.github.io/workflow.name"
WORKFLOW_NAMESPACE_LABEL = "dataworkflowservices.github.io/workflow.namespace"
OWNER_LABELS = ("kind", "name", "namespace", "uid")
RABBIT_CONSTRAINT = "dataworkflowservices.github.io/storage=Rabbit"
COPY_OFFLOAD = "copy-offload"
MOUNT_PREFIX = "/mnt/nnf"
SYSTEM_CONFIGURATION = ("default", "default")  # (namespace, name) nnf-sos reads

#: The Lustre metadata target nnf-sos sizes from its storage profile, not the directive.
MGTMDT_CAPACITY = 32 * 1024**3
#: create_persistent may leave capacity out (lustre); the breakdown then asks this much.
DEFAULT_CAPACITY = 1024**3
#: nnf-sos's default profile (config/examples): OSTs with ``scale: 5`` and
#: ``colocateComputes: true``; the MGT/MDT with ``count: 1``.
OST_SCALE = 5


def api_object(plural: str) -> dict[str, str]:
    """apiVersion and kind of a served resource, from the stand-in API server's table."""
    resource = by_plural(plural)
    return {"apiVersion": resource.api_version(), "kind": resource.kind}


def indexed_name(workflow: Mapping[str, Any], index: int) -> str:
    return f"{workflow['metadata']['name']}-{index}"


def token_secret_name(workflow: Mapping[str, Any]) -> str:
    return f"{workflow['metadata']['name']}-token"


def child_metadata(workflow: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Metadata of an object owned by ``workflow``: same namespace, labels, ownerReference."""
    meta = workflow["metadata"]
    labels = {
        WORKFLOW_NAME_LABEL: meta["name"],
        WORKFLOW_NAMESPACE_LABEL: meta["namespace"],
        "dataworkflowservices.github.io/owner.kind": "Workflow",
        "dataworkflowservices.github.io/owner.name": meta["name"],
        "dataworkflowservices.github.io/owner.namespace": meta["namespace"],
        "dataworkflowservices.github.io/owner.uid": meta.get("uid", ""),
    }
    owner = {
        "apiVersion": workflow.get("apiVersion") or api_object("workflows")["apiVersion"],
        "kind": "Workflow",
        "name": meta["name"],
        "uid": meta.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {
        "name": name,
        "namespace": meta["namespace"],
        "labels": labels,
        "ownerReferences": [owner],
    }


def reference(kind: str, name: str, namespace: str) -> dict[str, str]:
    """An ObjectReference as DWS writes them."""
    return {"kind": kind, "name": name, "namespace": namespace}


def computes(workflow: Mapping[str, Any]) -> dict[str, Any]:
    """The Computes DWS creates in Proposal: same name as the workflow, no nodes yet."""
    name = workflow["metadata"]["name"]
    return {**api_object("computes"), "metadata": child_metadata(workflow, name), "data": []}


def allocation_sets(fs_type: str, capacity: int) -> list[dict[str, Any]]:
    """What one storage directive needs, per nnf-sos: per compute, or Lustre targets."""
    labels = {"labels": [RABBIT_CONSTRAINT]}
    if fs_type == "lustre":
        return [
            {
                "allocationStrategy": ACROSS_SERVERS,
                "minimumCapacity": capacity,
                "label": "ost",
                "constraints": dict(labels, scale=OST_SCALE),
            },
            {  # nnf-sos's default profile (combinedMgtMdt): across the servers, count 1
                "allocationStrategy": ACROSS_SERVERS,
                "minimumCapacity": MGTMDT_CAPACITY,
                "label": "mgtmdt",
                "constraints": dict(
                    labels, count=1, colocation=[{"type": "exclusive", "key": "lustre-mgt"}]
                ),
            },
        ]
    return [
        {
            "allocationStrategy": PER_COMPUTE,
            "minimumCapacity": capacity,
            "label": fs_type,
            "constraints": dict(labels),
        }
    ]


def compute_locations(
    fs_type: str, sets: Sequence[Mapping[str, Any]], servers_ref: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The compute location constraints nnf-sos gives a breakdown, one per allocation set
    (directivebreakdown_controller.go): Lustre over the network (the OSTs, whose profile
    colocates computes, near them at best), gfs2 both ways, xfs and raw attached."""
    mandatory = {"network": "mandatory", "physical": "mandatory"}
    out = []
    for i, aset in enumerate(sets):
        if fs_type == "lustre":
            access = {"network": "mandatory"}
            if aset["label"] == "ost":
                access["physical"] = "bestEffort"
        elif fs_type == "gfs2":
            access = mandatory
        else:
            access = {"physical": "mandatory"}
        ref = {**servers_ref, "fieldPath": f"servers.spec.allocationSets[{i}]"}
        out.append(
            {
                "access": [{"type": t, "priority": p} for t, p in access.items()],
                "reference": ref,
            }
        )
    return out


def requires_of(directive: Directive) -> list[str]:
    """The ``requires=`` list of a storage directive ("copy-offload,...")."""
    value = directive.args.get("requires", "")
    return [word for word in value.split(",") if word]


def breakdown(workflow: Mapping[str, Any], directive: Directive) -> dict[str, Any]:
    """The DirectiveBreakdown nnf-sos creates for a jobdw, persistentdw or create_persistent.

    A persistentdw uses storage that already exists, so its breakdown asks for none.
    Raises DirectiveError for a capacity that is not a size.
    """
    meta = workflow["metadata"]
    name = indexed_name(workflow, directive.index)
    status: dict[str, Any] = {"ready": True, "requires": requires_of(directive)}
    if directive.command in ("jobdw", "create_persistent"):
        fs_type = directive.args.get("type", "xfs")
        text = directive.args.get("capacity")
        capacity = parse_size(text) if text else DEFAULT_CAPACITY
        servers_ref = reference("Servers", name, meta["namespace"])
        sets = allocation_sets(fs_type, capacity)
        status["storage"] = {
            "lifetime": "job" if directive.command == "jobdw" else "persistent",
            "reference": servers_ref,
            "allocationSets": sets,
        }
        status["compute"] = {
            "constraints": {"location": compute_locations(fs_type, sets, servers_ref)}
        }
    return {
        **api_object("directivebreakdowns"),
        "metadata": child_metadata(workflow, name),
        "spec": {"directive": directive.text, "userID": workflow["spec"].get("userID")},
        "status": status,
    }


def servers(workflow: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The Servers a breakdown references; the WLM fills spec.allocationSets before Setup."""
    return {
        **api_object("servers"),
        "metadata": child_metadata(workflow, indexed_name(workflow, index)),
        "spec": {},
    }


def servers_problem(
    servers_obj: Mapping[str, Any], breakdown_obj: Mapping[str, Any] | None
) -> str | None:
    """Why the WLM's Servers allocation cannot be used in Setup, or None when it can."""
    meta = servers_obj.get("metadata") or {}
    shown = f"{meta.get('namespace')}/{meta.get('name')}"
    sets = (servers_obj.get("spec") or {}).get("allocationSets") or []
    if not sets:
        return f"Servers resource {shown} has no allocation sets"
    have = {}
    for aset in sets:
        storage = aset.get("storage") or []
        if not storage or not all(s.get("name") for s in storage):
            return f"Servers resource {shown} allocation set '{aset.get('label')}' names no rabbit"
        have[aset.get("label")] = aset
    wanted = ((breakdown_obj or {}).get("status") or {}).get("storage") or {}
    for need in wanted.get("allocationSets") or []:
        if need.get("label") not in have:
            return f"Servers resource {shown} has no allocation set for label '{need['label']}'"
    return None


def servers_status(servers_obj: Mapping[str, Any], now: datetime.datetime) -> dict[str, Any]:
    """Servers status once NNF has allocated what the WLM asked for."""
    sets = []
    for aset in (servers_obj.get("spec") or {}).get("allocationSets") or []:
        size = aset.get("allocationSize", 0)
        storage = {s["name"]: {"allocationSize": size} for s in aset.get("storage") or []}
        sets.append({"label": aset.get("label"), "allocationSize": size, "storage": storage})
    return {"ready": True, "lastUpdate": micro_time(now), "allocationSets": sets}


def env_name(prefix: str, name: str) -> str:
    """DW_JOB_<name> / DW_PERSISTENT_<name>: nnf-sos turns '-' into '_'."""
    return prefix + name.replace("-", "_")


def mount_path(workflow: Mapping[str, Any], index: int) -> str:
    return f"{MOUNT_PREFIX}/{workflow['metadata'].get('uid', '')}-{index}"


def storage_env(
    workflow: Mapping[str, Any], directive: Directive, all_directives: Sequence[Directive]
) -> dict[str, str]:
    """PreRun environment for one jobdw or persistentdw directive, as nnf-sos's
    addComputesEnv (nnf_workflow_controller.go) writes it: DW_JOB_<name>, DW_JOB_<TYPE> for
    the first jobdw of each type, and DW_JOBS listing ``name:path`` of every jobdw,
    comma-separated in directive order; DW_PERSISTENT_<name> and DW_PERSISTENTS alike.
    """
    if directive.command == "jobdw":
        jobs = [d for d in all_directives if d.command == "jobdw"]
        kind = directive.args.get("type", "")
        first = next(d for d in jobs if d.args.get("type", "") == kind)
        return {
            env_name("DW_JOB_", directive.args["name"]): mount_path(workflow, directive.index),
            "DW_JOB_" + kind.upper(): mount_path(workflow, first.index),
            "DW_JOBS": ",".join(f"{d.args['name']}:{mount_path(workflow, d.index)}" for d in jobs),
        }
    if directive.command == "persistentdw":
        uses = [d for d in all_directives if d.command == "persistentdw"]
        name = env_name("DW_PERSISTENT_", directive.args["name"])
        listed = ",".join(f"{d.args['name']}:{mount_path(workflow, d.index)}" for d in uses)
        return {name: mount_path(workflow, directive.index), "DW_PERSISTENTS": listed}
    return {}


def token_secret(workflow: Mapping[str, Any], token: str) -> dict[str, Any]:
    """The Secret holding the workflow token a copy-offload client presents."""
    encoded = base64.b64encode(token.encode()).decode()
    return {
        **api_object("secrets"),
        "metadata": child_metadata(workflow, token_secret_name(workflow)),
        "type": "Opaque",
        "data": {"token": encoded},
    }


def system_configuration(
    rabbits: Mapping[str, Sequence[str]], external: Sequence[str] = ()
) -> dict[str, Any]:
    """The SystemConfiguration DWS reads: which compute nodes each rabbit serves, and the
    ``external`` compute nodes no rabbit serves (``spec.externalComputeNodes``)."""
    namespace, name = SYSTEM_CONFIGURATION
    nodes = [
        {
            "name": rabbit,
            "type": "Rabbit",
            "computesAccess": [{"name": c, "index": i} for i, c in enumerate(computes_)],
        }
        for rabbit, computes_ in rabbits.items()
    ]
    return {
        **api_object("systemconfigurations"),
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "storageNodes": nodes,
            **({"externalComputeNodes": [{"name": c} for c in external]} if external else {}),
        },
    }


#: DWS keeps the Storage resources (one per rabbit) here.
STORAGE_NAMESPACE = "default"
#: A rabbit's usable capacity when the seed names none: 32 TiB, the order of a real rabbit.
RABBIT_CAPACITY = 32 * 2**40


#: Drives a simulated rabbit lists in Storage ``status.devices`` (a real one has 16).
DRIVES = 4


def devices(capacity: int, drives: int = DRIVES) -> list[dict[str, Any]]:
    """Storage ``status.devices``: ``drives`` Ready NVMe drives adding up to ``capacity``."""
    base, extra = divmod(int(capacity), drives)
    return [
        {
            "slot": str(i),
            "model": "dwssim NVMe",
            "status": "Ready",
            "capacity": base + (extra if i == 0 else 0),
            "wearLevel": 0,
        }
        for i in range(drives)
    ]


def storage_resource(
    rabbit: str, computes_: Sequence[str], capacity: int = RABBIT_CAPACITY
) -> dict[str, Any]:
    """The Storage resource DWS keeps for a rabbit (dws-api.md section 7): Enabled and Ready,
    its capacity in bytes, and a Ready link to each compute node it serves."""
    return {
        **api_object("storages"),
        "metadata": {
            "name": rabbit,
            "namespace": STORAGE_NAMESPACE,
            "labels": {"dataworkflowservices.github.io/storage": "Rabbit"},
        },
        "spec": {"state": "Enabled", "mode": "Live"},
        "status": {
            "type": "NVMe",
            "status": "Ready",
            "rebootRequired": False,
            "message": "",
            "capacity": int(capacity),
            "access": {
                "protocol": "PCIe",
                "servers": [{"name": rabbit, "status": "Ready"}],
                "computes": [{"name": c, "status": "Ready"} for c in computes_],
            },
            "devices": devices(capacity),
        },
    }


def group_computes(
    computes_: Sequence[str], per_rabbit: int = 16, prefix: str = "rabbit-"
) -> dict[str, list[str]]:
    """Computes in order, ``per_rabbit`` to a rabbit named ``<prefix><n>``."""
    if per_rabbit < 1:
        raise ValueError(f"per_rabbit must be at least 1, not {per_rabbit}")
    groups: dict[str, list[str]] = {}
    for i, compute in enumerate(computes_):
        groups.setdefault(f"{prefix}{i // per_rabbit}", []).append(compute)
    return groups
