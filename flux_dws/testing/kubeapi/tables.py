"""meta.k8s.io/v1 Table responses, so `kubectl get` prints a resource's columns (pure)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from .resources import Column, Resource

_NAME_COLUMN = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace.",
    "priority": 0,
}


def wants_table(accept: str) -> bool:
    return "as=Table" in (accept or "")


def table(
    resource: Resource,
    objects: list[dict],
    resource_version: str,
    now: datetime,
    include_object: str = "Metadata",
) -> dict:
    definitions = [_NAME_COLUMN] + [
        {
            "name": c.name,
            "type": "string" if c.type == "date" else c.type,
            "format": "",
            "description": c.description,
            "priority": c.priority,
        }
        for c in resource.columns
    ]
    rows = []
    for obj in objects:
        row: dict[str, Any] = {
            "cells": [obj["metadata"]["name"]] + [_cell(c, obj, now) for c in resource.columns]
        }
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }


def _cell(column: Column, obj: dict, now: datetime) -> Any:
    value: Any = obj
    for step in column.json_path.strip(".").split("."):
        value = value.get(step) if isinstance(value, dict) else None
    if value is None:
        return None
    if column.type == "date":
        try:
            then = datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        except ValueError:
            return str(value)
        return human_duration((now - then).total_seconds())
    if column.type == "boolean":
        return bool(value)
    if column.type == "integer" and isinstance(value, int):
        return value
    return str(value)


def human_duration(seconds: float) -> str:
    """Age as kubectl prints it ("45s", "3m12s", "5h", "2d3h")."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    s = max(s, 0)
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    years, days = hours // (24 * 365), (hours // 24) % 365
    return f"{years}y{days}d" if hours < 24 * 365 * 8 and days else f"{years}y"
