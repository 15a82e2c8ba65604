# SPDX-License-Identifier: LGPL-3.0-only
"""Field management: metadata.managedFields and server-side apply, as pure functions.

A field set is a set of paths (tuples of steps); FieldsV1 is its nested JSON form
({"f:spec": {"f:desiredState": {}}}, with "." marking a node owned in itself).  Objects are
treated as the API server treats a custom resource: objects are structs whose members are
tracked one by one, lists are atomic (owned whole), except metadata.finalizers, a set whose
items are owned one by one ("v:" steps).  metadata.labels and .annotations are maps: the map
itself and each key.

An Update (create, PUT, patch) gives its manager every field it changed and takes them from
the others; an Apply owns exactly the fields of its configuration, conflicts with another
manager that owns a field it would change, and removes the fields it stops applying that
nobody else owns.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ApiError

Path = tuple[str, ...]
FieldSet = frozenset[Path]

#: metadata the field manager never tracks (the API server strips the same).
_UNTRACKED_META = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
    }
)
_MAPS = (("metadata", "labels"), ("metadata", "annotations"))
_ABSENT = object()  # a field not present
_SETS = (("metadata", "finalizers"),)


@dataclass(frozen=True)
class Manager:
    """Who is writing: the fieldManager and the operation ("Update" or "Apply")."""

    name: str
    operation: str = "Update"
    subresource: str = ""


def field_set(obj: Any, status: str = "track") -> FieldSet:
    """The fields ``obj`` sets. ``status``: "track", "skip" (main resource of a kind with a
    status subresource) or "only" (its /status subresource)."""
    found: set[Path] = set()
    if not isinstance(obj, dict):
        return frozenset()
    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        if (status == "skip" and key == "status") or (status == "only" and key != "status"):
            continue
        if key == "metadata" and isinstance(value, dict):
            for meta_key, meta_value in value.items():
                if meta_key not in _UNTRACKED_META:
                    _walk(("metadata", meta_key), meta_value, found)
        else:
            _walk((key,), value, found)
    return frozenset(found)


def _walk(path: Path, value: Any, found: set[Path]) -> None:
    if path in _SETS and isinstance(value, list):
        found.add(path)
        found.update(path + (f"v:{json.dumps(item)}",) for item in value)
        return
    if isinstance(value, dict) and value:
        if path in _MAPS:
            found.add(path)
        for key, item in value.items():
            _walk(path + (str(key),), item, found)
        return
    found.add(path)


def value_at(obj: Any, path: Path) -> tuple[bool, Any]:
    """(present, value) of ``path`` in ``obj``."""
    for step in path:
        if step.startswith("v:") and isinstance(obj, list):
            item = json.loads(step[2:])
            return (item in obj, item)
        if not isinstance(obj, dict) or step not in obj:
            return False, None
        obj = obj[step]
    return True, obj


def changed(old: Any, new: Any, status: str = "track") -> tuple[FieldSet, FieldSet]:
    """(set or changed, removed) between two objects, walking only what differs."""
    touched: set[Path] = set()
    removed: set[Path] = set()
    old = old if isinstance(old, dict) else {}
    for key in set(old) | set(new):
        if key in ("apiVersion", "kind"):
            continue
        if (status == "skip" and key == "status") or (status == "only" and key != "status"):
            continue
        was, now = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if key == "metadata" and isinstance(was, dict) and isinstance(now, dict):
            for meta_key in set(was) | set(now):
                if meta_key not in _UNTRACKED_META:
                    _diff(
                        ("metadata", meta_key),
                        was.get(meta_key, _ABSENT),
                        now.get(meta_key, _ABSENT),
                        touched,
                        removed,
                    )
        elif key != "metadata":
            _diff((key,), was, now, touched, removed)
    return frozenset(touched), frozenset(removed)


def _diff(path: Path, was: Any, now: Any, touched: set[Path], removed: set[Path]) -> None:
    if was is now or (type(was) is type(now) and was == now):
        return
    if now is _ABSENT:
        _walk(path, was, removed)
        return
    if was is _ABSENT:
        _walk(path, now, touched)
        return
    if isinstance(was, dict) and isinstance(now, dict) and was and now:
        for key in set(was) | set(now):
            _diff(
                path + (str(key),), was.get(key, _ABSENT), now.get(key, _ABSENT), touched, removed
            )
        return
    old_set: set[Path] = set()
    new_set: set[Path] = set()
    _walk(path, was, old_set)
    _walk(path, now, new_set)
    removed.update(old_set - new_set)
    touched.update(
        p
        for p in new_set
        if p not in old_set or _leaf(was, p[len(path) :], path) != _leaf(now, p[len(path) :], path)
    )


def _leaf(obj: Any, path: Path, prefix: Path = ()) -> Any:
    """The value at ``path`` as ownership compares it (map and set nodes compare by item)."""
    present, value = value_at(obj, path)
    full = prefix + path
    if isinstance(value, dict) and value and full in _MAPS:
        return None  # a map node: its keys are compared one by one
    if isinstance(value, list) and full in _SETS:
        return None
    return value if present else _ABSENT


# ---- managedFields entries ---------------------------------------------------------------


def to_fields_v1(paths: Iterable[Path]) -> dict:
    root: dict = {}
    paths = set(paths)
    for path in paths:
        node = root
        for step in path:
            node = node.setdefault(_encode(step), {})
    for path in paths:
        node = root
        for step in path:
            node = node[_encode(step)]
        if node:
            node["."] = {}
    return root


def from_fields_v1(tree: Any, prefix: Path = ()) -> FieldSet:
    found: set[Path] = set()
    if not isinstance(tree, dict):
        return frozenset()
    for key, sub in tree.items():
        if key == ".":
            found.add(prefix)
            continue
        step = key[2:] if key.startswith("f:") else key
        path = prefix + (step,)
        if isinstance(sub, dict) and sub:
            found |= from_fields_v1(sub, path)
        else:
            found.add(path)
    return frozenset(found)


def _encode(step: str) -> str:
    return step if step.startswith(("v:", "k:", "i:")) else f"f:{step}"


@dataclass
class Entry:
    manager: str
    operation: str
    api_version: str
    time: str
    fields: FieldSet
    subresource: str = ""

    @classmethod
    def parse(cls, raw: Any) -> Entry | None:
        if not isinstance(raw, dict) or not isinstance(raw.get("manager", ""), str):
            return None
        return cls(
            raw.get("manager", ""),
            str(raw.get("operation", "Update")),
            str(raw.get("apiVersion", "")),
            str(raw.get("time", "")),
            from_fields_v1(raw.get("fieldsV1")),
            str(raw.get("subresource", "")),
        )

    def key(self) -> tuple[str, str, str, str]:
        version = self.api_version if self.operation == "Update" else ""
        return (self.manager, self.operation, version, self.subresource)

    def out(self) -> dict:
        entry = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(self.fields),
        }
        if self.subresource:
            entry["subresource"] = self.subresource
        return entry


def entries(meta: dict) -> list[Entry]:
    raw = meta.get("managedFields")
    parsed = [Entry.parse(item) for item in raw] if isinstance(raw, list) else []
    return [entry for entry in parsed if entry is not None]


def base_entries(old_meta: dict, new_meta: dict) -> list[Entry] | None:
    """The entries an update starts from: the stored ones, unless the request changed them
    (a list of one empty entry clears them all: None)."""
    sent = new_meta.get("managedFields")
    if sent is None or sent == [] or sent == old_meta.get("managedFields"):
        return entries(old_meta)
    if sent == [{}]:
        return None
    return entries(new_meta)


def record_update(
    old: dict | None,
    new: dict,
    manager: Manager,
    api_version: str,
    now: str,
    status: str = "track",
) -> None:
    """Set new's managedFields after an Update by ``manager`` (old None: a create)."""
    meta = new["metadata"]
    base = [] if old is None else base_entries(old["metadata"], meta)
    if base is None:
        meta.pop("managedFields", None)
        return
    touched, removed = changed(old or {}, new, status)
    kept: list[Entry] = []
    mine = Entry(manager.name, "Update", api_version, now, frozenset(), manager.subresource)
    for entry in base:
        if entry.key() == mine.key():
            mine.fields = entry.fields
            continue
        entry.fields = entry.fields - touched - removed
        if entry.fields:
            kept.append(entry)
    mine.fields = (mine.fields | touched) - removed
    if mine.fields:
        kept.append(mine)
    _store(meta, kept)


def _store(meta: dict, kept: list[Entry]) -> None:
    if kept:
        meta["managedFields"] = [entry.out() for entry in kept]
    else:
        meta.pop("managedFields", None)


# ---- server-side apply -------------------------------------------------------------------


def apply(
    live: dict,
    config: dict,
    manager: Manager,
    api_version: str,
    now: str,
    *,
    force: bool,
    status: str = "track",
) -> dict:
    """The object after ``manager`` applies ``config`` to ``live`` (a new dict), with its
    managedFields; raises a 409 Conflict naming every field another manager owns and that
    the configuration would change (unless ``force``, which takes them over)."""
    # An Apply owns a map's or a set's items, not the map itself (an Update that adds the
    # map owns it too, as the server's diff counts it).
    applied = field_set(config, status) - frozenset(_MAPS) - frozenset(_SETS)
    base = entries(live["metadata"])
    me = (manager.name, "Apply", "", manager.subresource)
    previous = next((e.fields for e in base if e.key() == me), frozenset())
    conflicts: list[tuple[Entry, Path]] = []
    for entry in base:
        if entry.key() == me:
            continue
        for path in sorted(entry.fields & applied):
            if _leaf(live, path) != _leaf(config, path):
                conflicts.append((entry, path))
    if conflicts and not force:
        raise conflict_error(conflicts)
    merged = _merge(_plain(live), config)
    others = frozenset().union(*(e.fields for e in base if e.key() != me))
    for path in sorted(previous - applied - others, key=len, reverse=True):
        _remove(merged, path)
    kept: list[Entry] = []
    taken = frozenset(path for _, path in conflicts)
    for entry in base:
        if entry.key() == me:
            continue
        entry.fields = entry.fields - taken
        if entry.fields:
            kept.append(entry)
    kept.append(Entry(manager.name, "Apply", api_version, now, applied, manager.subresource))
    merged["metadata"]["managedFields"] = [entry.out() for entry in kept]
    return merged


def conflict_error(conflicts: list[tuple[Entry, Path]]) -> ApiError:
    """409 as the API server words an apply conflict (and its FieldManagerConflict causes)."""
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f"conflict with {_who(entry)}",
            "field": path_text(path),
        }
        for entry, path in conflicts
    ]
    if len(conflicts) == 1:
        entry, path = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {_who(entry)}: {path_text(path)}"
    else:
        lines: list[str] = []
        by_manager: dict[str, list[Path]] = {}
        for entry, path in conflicts:
            by_manager.setdefault(_who(entry), []).append(path)
        for who in sorted(by_manager):
            lines.append(f"conflicts with {who}")
            lines.extend(f"- {path_text(path)}" for path in by_manager[who])
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return ApiError(409, "Conflict", message, {"causes": causes})


def _who(entry: Entry) -> str:
    name = json.dumps(entry.manager)
    return f"{name} using {entry.api_version}" if entry.operation == "Update" else name


def path_text(path: Path) -> str:
    """A field path as the API server prints it: .spec.desiredState, [="value"] for set items."""
    out = []
    for step in path:
        out.append(f"[={step[2:]}]" if step.startswith("v:") else f".{step}")
    return "".join(out)


def _plain(obj: dict) -> dict:
    return json.loads(json.dumps(obj))


def _merge(live: Any, config: Any) -> Any:
    if isinstance(live, dict) and isinstance(config, dict):
        out = dict(live)
        for key, value in config.items():
            out[key] = _merge(live.get(key), value)
        return out
    return json.loads(json.dumps(config))


def _remove(obj: Any, path: Path) -> None:
    *parents, last = path
    for step in parents:
        obj = obj.get(step) if isinstance(obj, dict) else None
    if last.startswith("v:") and isinstance(obj, list):
        item = json.loads(last[2:])
        while item in obj:
            obj.remove(item)
    elif isinstance(obj, dict):
        obj.pop(last, None)
