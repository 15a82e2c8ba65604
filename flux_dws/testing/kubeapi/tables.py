# SPDX-License-Identifier: LGPL-3.0-only
"""meta.k8s.io/v1 Table responses, so `kubectl get` prints a resource's columns (pure).

Custom resources get the CRD convertor's columns: Name, then each additionalPrinterColumn
with its declared type (a "date" cell is rendered as an age, as the server does); built-in
kinds get their printers' columns, whose cells are computed from the whole object.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from .builtin import human_duration, parse_time
from .resources import Column, Resource

__all__ = ["human_duration", "table", "wants_table"]

NAME_DESCRIPTION = (
    "Name must be unique within a namespace. Is required when creating resources, although"
    " some resources may allow a client to request the generation of an appropriate name"
    " automatically. Name is primarily intended for creation idempotence and configuration"
    " definition. Cannot be updated. More info:"
    " https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)
_NAME_COLUMN = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": NAME_DESCRIPTION,
    "priority": 0,
}


def wants_table(accept: str) -> bool:
    return "as=Table" in (accept or "")


def definitions(resource: Resource) -> list[dict]:
    found = [_NAME_COLUMN] if resource.name_column else []
    for c in resource.columns:
        description = c.description
        if not description and c.compute is None:
            description = f"Custom resource definition column (in JSONPath format): {c.json_path}"
        found.append(
            {
                "name": c.name,
                "type": c.type,
                "format": "",
                "description": description,
                "priority": c.priority,
            }
        )
    return found


def table(
    resource: Resource,
    objects: list[dict],
    resource_version: str,
    now: datetime,
    include_object: str = "Metadata",
    continue_token: str | None = None,
) -> dict:
    rows = []
    for obj in objects:
        cells = [obj["metadata"]["name"]] if resource.name_column else []
        cells += [_cell(c, obj, now) for c in resource.columns]
        row: dict[str, Any] = {"cells": cells}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    meta: dict[str, Any] = {"resourceVersion": resource_version}
    if continue_token:
        meta["continue"] = continue_token
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": definitions(resource),
        "rows": rows,
    }


def _cell(column: Column, obj: dict, now: datetime) -> Any:
    if column.compute is not None:
        return column.compute(obj, now)
    value: Any = obj
    for step in column.json_path.strip(".").split("."):
        value = value.get(step) if isinstance(value, dict) else None
    if value is None:
        return None
    if column.type == "date":
        then = parse_time(value)
        return str(value) if then is None else human_duration((now - then).total_seconds())
    if column.type == "boolean":
        return value if isinstance(value, bool) else None
    if column.type == "integer":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)
