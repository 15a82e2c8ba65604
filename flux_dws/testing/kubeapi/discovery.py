# SPDX-License-Identifier: LGPL-3.0-only
"""Discovery documents (/api, /apis, group and group/version resource lists, /version), pure.

Served as plain application/json, which tells kubectl to use legacy (non-aggregated)
discovery.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Optional

from .errors import ApiError
from .resources import CORE_VERSIONS, NAMESPACED_VERBS, Resource, served
from .resources import groups as all_groups
from .subresources import HANDLERS

#: which named groups a server offers: None for every group in the resource table.
Groups = Optional[Collection[str]]


def groups(allowed: Groups = None) -> dict[str, tuple[str, ...]]:
    return {g: v for g, v in all_groups().items() if allowed is None or g in allowed}


VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-flux-dws-kubeapi",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.23.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def root_paths(allowed: Groups = None) -> dict:
    paths = ["/api", "/api/v1", "/apis", "/version"]
    for group, versions in groups(allowed).items():
        paths.append(f"/apis/{group}")
        paths.extend(f"/apis/{group}/{v}" for v in versions)
    return {"paths": paths}


def api_versions(server_address: str) -> dict:
    return {
        "kind": "APIVersions",
        "versions": list(CORE_VERSIONS),
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def api_group(group: str, allowed: Groups = None) -> dict:
    versions = groups(allowed).get(group)
    if not versions:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": listed,
        "preferredVersion": listed[0],
    }


def api_group_list(allowed: Groups = None) -> dict:
    found = []
    for group in groups(allowed):
        entry = api_group(group, allowed)
        del entry["kind"], entry["apiVersion"]
        found.append(entry)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": found}


def resource_list(group: str, version: str, allowed: Groups = None) -> dict:
    resources = served(group, version)
    if not resources or (group and allowed is not None and group not in allowed):
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": [entry for r in resources for entry in _entries(r)],
    }


def _entries(resource: Resource) -> list[dict]:
    """A resource's discovery entry, then one per subresource ("storages/status")."""
    found = [
        {
            "name": resource.plural,
            "singularName": resource.singular,
            "namespaced": resource.namespaced,
            "kind": resource.kind,
            "verbs": list(NAMESPACED_VERBS),
            **({"shortNames": list(resource.short_names)} if resource.short_names else {}),
        }
    ]
    names = [("status", ["get", "patch", "update"])] if resource.has_status else []
    names += [(sub, ["get"]) for plural, sub in sorted(HANDLERS) if plural == resource.plural]
    for sub, verbs in names:
        found.append(
            {
                "name": f"{resource.plural}/{sub}",
                "singularName": "",
                "namespaced": resource.namespaced,
                "kind": resource.kind,
                "verbs": verbs,
            }
        )
    return found
