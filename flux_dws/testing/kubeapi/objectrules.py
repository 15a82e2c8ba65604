# SPDX-License-Identifier: LGPL-3.0-only
"""What the API server checks and fills in on an object before the store keeps it: its name
(an RFC 1123 subdomain), kind and apiVersion, namespace scope, delete preconditions, the
server-side defaults of the kinds served, the metadata only the server writes, what counts
as a change of generation, and the ownership graph the garbage collector follows.  Pure
helpers of flux_dws.testing.kubeapi.store, which holds the lock around them.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import Any

from . import errors
from .crds import apply_defaults
from .errors import ApiError
from .resources import Resource
from .watches import _dumps

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_HELP = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or"
    " '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used"
    " for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
# metadata the server owns: kept from the stored object on every update.
SYSTEM_METADATA = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
)


def copy_json(obj: Any) -> Any:
    return json.loads(_dumps(obj))


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def key_of(resource: Resource, obj: dict) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("namespace", "") if resource.namespaced else "", meta["name"])


def resource_of(obj: dict) -> Resource:
    from .resources import RESOURCES

    group = obj.get("apiVersion", "").rpartition("/")[0]
    for resource in RESOURCES:
        if resource.kind == obj.get("kind") and resource.group == group:
            return resource
    raise errors.bad_request(f"no resource serves kind {obj.get('kind')!r}")


def scope(resource: Resource, namespace: str | None, meta: dict) -> str:
    if not resource.namespaced:
        meta.pop("namespace", None)
        return ""
    body_ns = meta.get("namespace")
    if namespace and body_ns and body_ns != namespace:
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    found = namespace or body_ns
    if not found:
        raise errors.bad_request("an empty namespace may not be set during creation")
    return found


def check_name(resource: Resource, name: Any) -> None:
    if not name:
        raise errors.invalid(
            resource.kind_group,
            "",
            ["metadata.name: Required value: name or generateName is required"],
        )
    if not isinstance(name, str) or len(name) > 253 or not _NAME_RE.match(name):
        raise errors.invalid(
            resource.kind_group,
            str(name),
            [f'metadata.name: Invalid value: "{name}": {_NAME_HELP}'],
        )


def check_type(resource: Resource, obj: dict) -> None:
    kind = obj.get("kind")
    if kind and kind != resource.kind:
        raise errors.bad_request(
            f"the kind in the data ({kind}) does not match the expected kind ({resource.kind})"
        )
    api_version = obj.get("apiVersion")
    served = tuple(resource.api_version(v) for v in resource.versions)
    if api_version and api_version not in served:
        raise errors.bad_request(
            f"the API version in the data ({api_version}) does not match the expected API"
            f" version ({resource.api_version()})"
        )
    obj["apiVersion"] = resource.api_version()
    obj["kind"] = resource.kind


def owner_uids(obj: dict) -> set[str]:
    refs = obj["metadata"].get("ownerReferences") or []
    return {r["uid"] for r in refs if isinstance(r, dict) and isinstance(r.get("uid"), str)}


def check_preconditions(resource: Resource, obj: dict, preconditions: dict) -> None:
    meta = obj["metadata"]
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        wanted = preconditions.get(field)
        if wanted and wanted != meta.get(field):
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource.qualified} "{meta["name"]}":'
                f" Precondition failed: {label} in precondition: {wanted}, {label} in object"
                f" meta: {meta.get(field)}",
            )


def normalize(resource: Resource, obj: dict) -> None:
    """Server-side defaults of the built-in kinds we serve; ObjectMeta's empty collections
    are dropped, as its Go struct (omitempty) never stores them."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        for field in ("labels", "annotations", "finalizers", "ownerReferences"):
            if field in meta and not meta[field] and meta[field] is not None:
                del meta[field]
    if resource.plural == "secrets":
        string_data = obj.pop("stringData", None) or {}
        data = obj.setdefault("data", {}) if string_data or "data" in obj else None
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        if not obj.get("type"):
            obj["type"] = "Opaque"
    elif resource.plural == "namespaces":
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj.setdefault("status", {"phase": "Active"})
    if resource.schema is not None:  # a kind served from its CRD: the schema's defaults
        apply_defaults(resource.schema, obj)


def parse_rv(text: str) -> int:
    if not text.isdigit():
        raise errors.bad_request(f'invalid resource version "{text}"')
    return int(text)


def without_version(obj: dict) -> dict:
    meta = {
        k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "managedFields")
    }
    return {**obj, "metadata": meta}


def field_owners(obj: dict) -> list:
    """managedFields without their times: who owns what."""
    found = obj["metadata"].get("managedFields") or []
    return [{k: v for k, v in e.items() if k != "time"} for e in found if isinstance(e, dict)]


def counted_content(resource: Resource, obj: dict) -> dict:
    """What generation counts: all but metadata (and status, for a kind with a subresource)."""
    skip = ("metadata", "apiVersion", "kind", "status") if resource.has_status else _UNCOUNTED
    return {k: v for k, v in obj.items() if k not in skip}


_UNCOUNTED = ("metadata", "apiVersion", "kind")


class OwnerGraph:
    """The garbage collector's graph: every stored uid, and owner uid -> the (plural, key) of
    each object whose ownerReferences name it (kept by the store on every commit)."""

    def __init__(self) -> None:
        self.uids: set[str] = set()
        self.dependents: dict[str, set[tuple[str, tuple[str, str]]]] = {}

    def update(self, plural: str, key: tuple[str, str], old: dict | None, new: dict | None) -> None:
        """Keep the graph as ``old`` (None: created) becomes ``new`` (None: gone for good)."""
        if old is not None:
            self.uids.discard(old["metadata"].get("uid", ""))
            for owner in owner_uids(old):
                self.dependents.get(owner, set()).discard((plural, key))
        if new is not None:
            self.uids.add(new["metadata"].get("uid", ""))
            for owner in owner_uids(new):
                self.dependents.setdefault(owner, set()).add((plural, key))

    def orphans(
        self, uid: str, objects: Mapping[str, Mapping[tuple[str, str], Any]]
    ) -> Iterator[tuple[str, tuple[str, str]]]:
        """The objects ``uid`` owned (forgotten as its dependents) that have no owner left
        and are not being deleted yet, in key order; each is judged as it is reached, so a
        deletion made meanwhile (``objects`` is the store's own) counts."""
        for plural, key in sorted(self.dependents.pop(uid, ())):
            found = objects.get(plural, {}).get(key)
            if found is None or found.obj["metadata"].get("deletionTimestamp"):
                continue
            if any(owner in self.uids for owner in owner_uids(found.obj)):
                continue
            yield plural, key
