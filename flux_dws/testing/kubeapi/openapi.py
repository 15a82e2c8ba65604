# SPDX-License-Identifier: LGPL-3.0-only
"""OpenAPI v3 (and v2, JSON) documents for the served kinds, so kubectl can validate,
`kubectl explain` and `kubectl edit` against the stand-in (pure).

The schemas are our own compact ones, not copies of the CRDs: each kind's top-level fields
with their types, the Workflow spec in full (the fields flux-dws writes), and an object that
keeps unknown fields (x-kubernetes-preserve-unknown-fields) wherever we do not model the
content.  Every PATCH operation declares the fieldValidation parameter, which is how kubectl
learns that the server validates fields itself.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .admission import REQUIRED_SPEC, STATES
from .resources import Resource, served

META = "io.k8s.apimachinery.pkg.apis.meta.v1"
OBJECT_META = f"{META}.ObjectMeta"
_OPEN = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}


def _open(description: str) -> dict:
    return {**_OPEN, "description": description}


_OBJECT_META_SCHEMA = {
    "description": "ObjectMeta is metadata that all persisted resources must have.",
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Name must be unique within a namespace."},
        "generateName": {"type": "string", "description": "A prefix for a generated name."},
        "namespace": {"type": "string", "description": "The namespace of the object."},
        "uid": {"type": "string", "description": "Unique in time and space (set by the server)."},
        "resourceVersion": {"type": "string", "description": "The object's version."},
        "generation": {"type": "integer", "format": "int64", "description": "Spec version."},
        "creationTimestamp": {"type": "string", "format": "date-time"},
        "deletionTimestamp": {"type": "string", "format": "date-time"},
        "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
        "labels": {**_STRING_MAP, "description": "Map of string keys and values."},
        "annotations": {**_STRING_MAP, "description": "Unstructured key value map."},
        "finalizers": {
            **_STRINGS,
            "description": "Must be empty before the object is deleted from the registry.",
            "x-kubernetes-list-type": "set",
        },
        "ownerReferences": {"type": "array", "items": _OPEN},
        "managedFields": {"type": "array", "items": _OPEN},
    },
}

_WORKFLOW_SPEC = {
    "description": "WorkflowSpec defines the desired state of Workflow",
    "type": "object",
    "required": list(REQUIRED_SPEC),
    "properties": {
        "desiredState": {
            "type": "string",
            "enum": list(STATES),
            "description": "Desired state for the workflow to be in.",
        },
        "dwDirectives": {**_STRINGS, "description": "The #DW strings of the job script."},
        "forceReady": {"type": "boolean", "default": False, "description": "Ready at once."},
        "hurry": {"type": "boolean", "default": False, "description": "Tear down in a hurry."},
        "groupID": {"type": "integer", "format": "int32", "description": "The job's group ID."},
        "userID": {"type": "integer", "format": "int32", "description": "The job's user ID."},
        "jobID": {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "description": "The WLM job ID of this workflow.",
        },
        "wlmID": {"type": "string", "description": "The workload manager of this workflow."},
    },
}

#: plural -> (description, top-level properties besides apiVersion/kind/metadata)
_KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "workflows": (
        "Workflow is the Schema for the workflows API",
        {"spec": _WORKFLOW_SPEC, "status": _open("WorkflowStatus: the state of the workflow")},
    ),
    "computes": (
        "Computes is the Schema for the computes API",
        {"data": {"type": "array", "items": _open("A compute node"), "description": "Nodes"}},
    ),
    "dwdirectiverules": (
        "DWDirectiveRule is the Schema for the DWDirective API",
        {"spec": {"type": "array", "items": _open("A directive rule"), "description": "Rules"}},
    ),
    "systemstatuses": (
        "SystemStatus is the Schema for the systemstatuses API",
        {"data": _open("The status of nodes and storage")},
    ),
    "nnfcontainerprofiles": (
        "NnfContainerProfile is the Schema for the nnfcontainerprofiles API",
        {"data": _open("The profile of a user container")},
    ),
    "secrets": (
        "Secret holds secret data of a certain type.",
        {
            "data": {**_STRING_MAP, "description": "Secret data, base64 encoded."},
            "stringData": {**_STRING_MAP, "description": "Write-only data, as strings."},
            "type": {"type": "string", "description": "Used to facilitate handling."},
            "immutable": {"type": "boolean", "description": "Data cannot be updated."},
        },
    ),
    "events": (
        "Event is a report of an event somewhere in the cluster.",
        {
            name: (
                {"type": "string"} if kind == "s" else {"type": "integer"} if kind == "i" else _OPEN
            )
            for name, kind in (
                ("action", "s"),
                ("count", "i"),
                ("eventTime", "s"),
                ("firstTimestamp", "s"),
                ("lastTimestamp", "s"),
                ("involvedObject", "o"),
                ("message", "s"),
                ("reason", "s"),
                ("related", "o"),
                ("reportingComponent", "s"),
                ("reportingInstance", "s"),
                ("series", "o"),
                ("source", "o"),
                ("type", "s"),
            )
        },
    ),
}


def schema_name(resource: Resource, version: str) -> str:
    """The schema's name as the API server builds it (reversed group, version, kind)."""
    if not resource.group:
        return f"io.k8s.api.core.{version}.{resource.kind}"
    return ".".join([*reversed(resource.group.split(".")), version, resource.kind])


def kind_schema(resource: Resource, version: str, ref: str) -> dict:
    gvk = [{"group": resource.group, "kind": resource.kind, "version": version}]
    if resource.schema is not None:  # served from its CRD: the CRD's structural schema
        properties = dict(resource.schema.get("properties") or {})
        properties["metadata"] = {"allOf": [{"$ref": f"{ref}{OBJECT_META}"}], "default": {}}
        return {**resource.schema, "properties": properties, "x-kubernetes-group-version-kind": gvk}
    description, extra = _KINDS.get(
        resource.plural,
        (
            f"{resource.kind} is the Schema for the {resource.plural} API",
            {"spec": _open(f"{resource.kind}Spec"), "status": _open(f"{resource.kind}Status")},
        ),
    )
    properties = {
        "apiVersion": {"type": "string", "description": "The versioned schema of this object."},
        "kind": {"type": "string", "description": "The REST resource this object represents."},
        "metadata": {"allOf": [{"$ref": f"{ref}{OBJECT_META}"}], "default": {}},
        **extra,
    }
    return {
        "description": description,
        "type": "object",
        "properties": properties,
        "x-kubernetes-group-version-kind": [
            {"group": resource.group, "kind": resource.kind, "version": version}
        ],
    }


def unknown_fields(resource: Resource, obj: dict) -> list[tuple[str, ...]]:
    """Paths of the fields in ``obj`` its schema does not declare (metadata excepted)."""
    schema = kind_schema(resource, resource.preferred_version, "")
    found: list[tuple[str, ...]] = []
    _unknown(schema, obj, (), found)
    return found


def _unknown(schema: dict, value: Any, path: tuple[str, ...], found: list) -> None:
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, dict):  # a CRD's arrays of objects
        for index, item in enumerate(value):
            _unknown(items, item, (*path, str(index)), found)
        return
    properties = schema.get("properties")
    if not isinstance(value, dict) or properties is None:
        return
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    for key in sorted(value):
        if key not in properties:
            found.append((*path, key))
        elif key != "metadata" or path:
            _unknown(properties[key], value[key], (*path, key), found)


def _query(name: str, kind: str = "string") -> dict:
    return {"name": name, "in": "query", "schema": {"type": kind}, "uniqueItems": True}


def _operations(resource: Resource, group: str, version: str, v3: bool) -> dict:
    """Paths and operations of one resource (v3 style; v2 flattens the parameter schema)."""
    gvk = {"group": group, "version": version, "kind": resource.kind}
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if resource.namespaced:
        prefix += "/namespaces/{namespace}"
    ref = (
        f"#/components/schemas/{schema_name(resource, version)}"
        if v3
        else (f"#/definitions/{schema_name(resource, version)}")
    )
    body = (
        {"content": {"application/json": {"schema": {"$ref": ref}}}}
        if v3
        else {"name": "body", "in": "body", "required": True, "schema": {"$ref": ref}}
    )
    ok = (
        {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": ref}}}}}
        if v3
        else {"200": {"description": "OK", "schema": {"$ref": ref}}}
    )

    def op(action: str, verb: str, *params: str, with_body: bool = False) -> dict:
        entry: dict[str, Any] = {
            "operationId": f"{verb}{resource.kind}",
            "parameters": [_param(p, v3) for p in params],
            "responses": ok,
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
        }
        if with_body and v3:
            entry["requestBody"] = body
        elif with_body:
            entry["parameters"].append(body)
        return entry

    write = ("dryRun", "fieldManager", "fieldValidation")
    lists = ("labelSelector", "fieldSelector", "limit", "continue", "resourceVersion", "watch")
    plural = f"{prefix}/{resource.plural}"
    return {
        plural: {
            "get": op("list", "list", *lists),
            "post": op("post", "create", *write, with_body=True),
        },
        f"{plural}/{{name}}": {
            "get": op("get", "read"),
            "put": op("put", "replace", *write, with_body=True),
            "patch": op("patch", "patch", *write, "force", with_body=True),
            "delete": op("delete", "delete", "dryRun"),
        },
    }


def _param(name: str, v3: bool) -> dict:
    kind = {"limit": "integer", "watch": "boolean", "force": "boolean"}.get(name, "string")
    if v3:
        return _query(name, kind)
    return {"name": name, "in": "query", "type": kind, "uniqueItems": True}


def group_version_doc(group: str, version: str, resources: list[Resource]) -> dict:
    """The OpenAPI 3.0 document of one group/version."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {OBJECT_META: _OBJECT_META_SCHEMA}
    for resource in resources:
        paths.update(_operations(resource, group, version, True))
        schemas[schema_name(resource, version)] = kind_schema(
            resource, version, "#/components/schemas/"
        )
    title = "Kubernetes CRD Swagger" if group else "Kubernetes"
    return {
        "openapi": "3.0.0",
        "info": {"title": title, "version": "v0.1.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def v3_index(group_versions: list[tuple[str, str]]) -> dict:
    """/openapi/v3: each group/version's document, addressed with its content hash."""
    paths = {}
    for group, version in group_versions:
        key = f"apis/{group}/{version}" if group else f"api/{version}"
        doc = group_version_doc(group, version, list(served(group, version)))
        digest = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]
        paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest.upper()}"}
    return {"paths": paths}


def v2_doc(group_versions: list[tuple[str, str]]) -> dict:
    """/openapi/v2 as JSON (Swagger 2.0): every served kind in one document."""
    paths: dict[str, Any] = {}
    definitions: dict[str, Any] = {OBJECT_META: _OBJECT_META_SCHEMA}
    for group, version in group_versions:
        for resource in served(group, version):
            paths.update(_operations(resource, group, version, False))
            definitions[schema_name(resource, version)] = kind_schema(
                resource, version, "#/definitions/"
            )
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "definitions": definitions,
    }
