# SPDX-License-Identifier: LGPL-3.0-only
"""Kinds served from CustomResourceDefinition manifests, as kube-apiserver serves a CRD.

A CRD gives everything the resource table holds: group, kind, plural, short names, scope,
the served versions (the preferred one first, by Kubernetes' version priority), the storage
version's status subresource, its printer columns and its structural schema (which prunes
unknown fields).  The manifests are read where a system's build keeps them (e.g. a DWS or
nnf-sos checkout's config/crd/bases): none is copied into flux-dws.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterable
from typing import Any

import yaml

from .builtin import Column
from .resources import Resource

#: libyaml's loader where PyYAML has it: the manifests are megabytes (35 s in pure Python)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")
_LEVEL = {"alpha": 0, "beta": 1, None: 2}


def version_priority(version: str) -> tuple:
    """Sort key, highest first as kube-apiserver orders versions: GA, beta, alpha, others."""
    found = _VERSION.match(version)
    if not found:
        return (-1, 0, 0, version)
    major, level, minor = found.groups()
    return (_LEVEL[level], int(major), int(minor or 0), "")


def resource_from_crd(crd: dict) -> Resource:
    """The resource one CRD manifest defines; ValueError naming what is wrong or missing."""
    if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
        raise ValueError("not a CustomResourceDefinition")
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    served = [v for v in spec.get("versions") or [] if v.get("served")]
    storage = [v for v in served if v.get("storage")]
    if not (spec.get("group") and names.get("plural") and names.get("kind") and storage):
        raise ValueError("CRD without group, names.plural, names.kind or a served storage version")
    versions = sorted(served, key=lambda v: version_priority(v["name"]), reverse=True)
    preferred, stored = versions[0], storage[0]
    columns = tuple(
        Column(
            c["name"],
            c.get("type", "string"),
            c["jsonPath"],
            c.get("description", ""),
            int(c.get("priority", 0)),
        )
        for c in preferred.get("additionalPrinterColumns") or []
    ) or (Column("Age", "date", ".metadata.creationTimestamp", "", 0),)
    schema = (stored.get("schema") or {}).get("openAPIV3Schema")
    return Resource(
        names["plural"],
        names["kind"],
        spec["group"],
        tuple(v["name"] for v in versions),
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        short_names=tuple(names.get("shortNames") or ()),
        columns=columns,
        subresources=tuple(sorted(stored.get("subresources") or {})),
        schema=schema if isinstance(schema, dict) else None,
    )


def apply_defaults(schema: dict, value: Any) -> None:
    """Fill ``value`` in place with its structural schema's ``default``s, as kube-apiserver
    defaults a custom resource on every write: a property it leaves out gets its default,
    in objects that are there (a default never makes a parent), in array items and in
    ``additionalProperties`` maps, depth first.  ``metadata`` is never defaulted."""
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for item in value:
                apply_defaults(items, item)
        return
    if not isinstance(value, dict):
        return
    properties = schema.get("properties")
    if isinstance(properties, dict):
        for key, sub in properties.items():
            if not isinstance(sub, dict) or key == "metadata":
                continue
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                apply_defaults(sub, value[key])
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key in value:
            if not isinstance(properties, dict) or key not in properties:
                apply_defaults(extra, value[key])


def load(paths: Iterable[str]) -> list[Resource]:
    """The resources of every CRD in ``paths`` (YAML files, or directories of them)."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(
                os.path.join(path, n) for n in os.listdir(path) if n.endswith((".yaml", ".yml"))
            )
        else:
            files.append(path)
    found: list[Resource] = []
    for name in files:
        with open(name) as handle:
            for doc in yaml.load_all(handle, Loader=_LOADER):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    try:
                        found.append(resource_from_crd(doc))
                    except ValueError as exc:
                        raise ValueError(f"{name}: {exc}") from None
    return found
