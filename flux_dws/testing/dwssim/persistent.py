# SPDX-License-Identifier: LGPL-3.0-only
"""Persistent storage as nnf-sos keeps it: PersistentStorageInstances (DWS api types).

``create_persistent`` makes an instance at Setup (owned by the creating user, Active) and a
Servers resource the instance owns, so its capacity outlives the job; ``persistentdw`` is
checked in Proposal (nnf_workflow_controller_helpers.go, validatePersistentInstanceDirective:
found, not deleting, same uid unless the instance carries the ignore-uid annotation), adds
the workflow as a consumer at Setup and removes it at Teardown; ``destroy_persistent`` at
Teardown refuses another uid and an instance with consumers, then deletes it.  The words are
nnf-sos's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flux_dws.testing.dwssim.companions import api_object
from flux_dws.testing.dwssim.outcomes import FATAL, USER, ResourceError

PLURAL = "persistentstorageinstances"
IGNORE_UID = "dataworkflowservices.github.io/ignore-uid"
OWNER_KIND = "dataworkflowservices.github.io/owner.kind"
OWNER_NAME = "dataworkflowservices.github.io/owner.name"
OWNER_NAMESPACE = "dataworkflowservices.github.io/owner.namespace"
USABLE = ("Active", "Degraded")


def _user_error(user_message: str, debug: str = "") -> Any:
    return ResourceError(user_message=user_message, debug=debug, type=USER, severity=FATAL).fail()


def shared(psi: Mapping[str, Any]) -> bool:
    notes = (psi.get("metadata") or {}).get("annotations") or {}
    return str(notes.get(IGNORE_UID, "")).lower() == "true"


def use_problem(psi: Mapping[str, Any] | None, name: str, userid: Any) -> Any:
    """Why a persistentdw may not use ``psi`` (a Fail), or None."""
    if psi is None:
        return _user_error(f"PersistentStorageInstance '{name}' not found")
    if (psi.get("metadata") or {}).get("deletionTimestamp") or (
        (psi.get("spec") or {}).get("state") == "Destroying"
    ):
        return _user_error(f"Persistent storage instance '{name}' is deleting")
    owner = (psi.get("spec") or {}).get("userID")
    if not shared(psi) and owner != userid:
        return _user_error(
            "User ID does not match existing persistent storage",
            f"existing persistent storage user ID {owner} does not match user ID {userid}",
        )
    return None


def instance(wf: Mapping[str, Any], name: str, fs_type: str, directive: str) -> dict[str, Any]:
    """The PersistentStorageInstance a create_persistent directive makes."""
    meta = wf["metadata"]
    return {
        **api_object(PLURAL),
        "metadata": {"name": name, "namespace": meta["namespace"]},
        "spec": {
            "name": name,
            "fsType": fs_type,
            "dwDirective": directive,
            "userID": (wf.get("spec") or {}).get("userID"),
            "state": "Active",
            "consumerReferences": [],
        },
        "status": {
            "state": "Active",
            "servers": {"kind": "Servers", "name": name, "namespace": meta["namespace"]},
        },
    }


def owned_servers(servers: Mapping[str, Any], psi: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the creating workflow's Servers that the instance owns (outlives the job)."""
    meta = psi["metadata"]
    labels = {
        OWNER_KIND: "PersistentStorageInstance",
        OWNER_NAME: meta["name"],
        OWNER_NAMESPACE: meta["namespace"],
    }
    return {
        **api_object("servers"),
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": labels},
        "spec": dict(servers.get("spec") or {}),
        "status": dict(servers.get("status") or {}),
    }


def consumer(wf: Mapping[str, Any], index: int) -> dict[str, str]:
    meta = wf["metadata"]
    return {"kind": "Workflow", "name": f"{meta['name']}-{index}", "namespace": meta["namespace"]}


def with_consumer(psi: Mapping[str, Any], ref: Mapping[str, str], add: bool) -> dict[str, Any]:
    """``psi`` with ``ref`` added to (or removed from) spec.consumerReferences."""
    spec = dict(psi.get("spec") or {})
    refs = [r for r in spec.get("consumerReferences") or [] if r != ref]
    spec["consumerReferences"] = refs + ([dict(ref)] if add else [])
    return dict(psi, spec=spec)


def destroy_problem(psi: Mapping[str, Any], userid: Any) -> Any:
    """Why a destroy_persistent may not destroy ``psi`` (a Fail), or None."""
    spec = psi.get("spec") or {}
    if spec.get("userID") != userid:
        return _user_error(
            "user ID does not match existing persistent storage",
            f"Existing persistent storage user ID {spec.get('userID')} does not match user ID"
            f" {userid}",
        )
    consumers = spec.get("consumerReferences") or []
    if consumers:
        return _user_error(
            "persistent storage cannot be deleted while in use",
            f"persistent storage cannot be deleted with {len(consumers)} consumers",
        )
    return None


__all__ = [
    "IGNORE_UID",
    "PLURAL",
    "consumer",
    "destroy_problem",
    "instance",
    "owned_servers",
    "shared",
    "use_problem",
    "with_consumer",
]
