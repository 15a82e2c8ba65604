# SPDX-License-Identifier: LGPL-3.0-only
"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902), as pure functions on plain data."""

from __future__ import annotations

import copy
from typing import Any

from .errors import ApiError


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 merge patch: objects merge, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Any, operations: list[Any]) -> Any:
    """Apply an RFC 6902 patch; a failing operation is a 422 as from the API server."""
    doc = copy.deepcopy(target)
    for index, op in enumerate(operations):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise _unprocessable(f"operation {index} must have 'op' and 'path'")
        kind, path = op["op"], _pointer(op["path"])
        if kind == "test":
            if _get(doc, path) != op.get("value"):
                raise _unprocessable(f"testing value {op['path']} failed")
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind in ("add", "replace"):
            if kind == "replace":
                _get(doc, path)
                doc = _remove(doc, path)
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = copy.deepcopy(_get(doc, source))
            if kind == "move":
                doc = _remove(doc, source)
            doc = _add(doc, path, value)
        else:
            raise _unprocessable(f"unexpected kind: {kind}")
    return doc


def _pointer(text: str) -> list[str]:
    if text == "":
        return []
    if not text.startswith("/"):
        raise _unprocessable(f"invalid JSON pointer {text!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in text[1:].split("/")]


def _get(doc: Any, path: list[str]) -> Any:
    for step in path:
        if isinstance(doc, dict) and step in doc:
            doc = doc[step]
        elif isinstance(doc, list) and step.isdigit() and int(step) < len(doc):
            doc = doc[int(step)]
        else:
            raise _unprocessable(f"doc is missing path: /{'/'.join(path)}")
    return doc


def _add(doc: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _get(doc, path[:-1])
    last = path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise _unprocessable(f"invalid index {last} for /{'/'.join(path)}")
    else:
        raise _unprocessable(f"doc is missing path: /{'/'.join(path)}")
    return doc


def _remove(doc: Any, path: list[str]) -> Any:
    if not path:
        return None
    parent = _get(doc, path[:-1])
    last = path[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise _unprocessable(f"unable to remove nonexistent key: /{'/'.join(path)}")
    return doc


def _unprocessable(message: str) -> ApiError:
    return ApiError(
        422, "Invalid", f"the server rejected our request due to an error in our request: {message}"
    )
