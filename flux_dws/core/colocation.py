# SPDX-License-Identifier: LGPL-3.0-only
"""Colocation: which allocation sets may not share a rabbit, as pure functions.

A DirectiveBreakdown's allocation set may carry ``constraints.colocation: [{type: exclusive,
key: K}]`` (DWS api/v1alpha7 directivebreakdown_types.go, AllocationSetColocationConstraint:
"Locations for allocation sets with the same colocation key should be picked according to the
colocation type"; ``exclusive`` is the only type).  flux-dws reads it as: no two allocation
sets with the same exclusive key on one rabbit, whoever made them (this job's other sets,
other jobs, persistent storage).  nnf-sos puts the key ``lustre-mgt`` on every set that holds a
Lustre MGT (directivebreakdown_controller.go), because a rabbit mounts one MGT, and nnf-sos
finds a file system's MGT by its rabbit's address: two on one rabbit fail the job
("multiple MGTs found for address", nnf_storage_controller.go).

A Servers resource does not say which keys its sets had, so flux-dws writes them on the
Servers it fills (:data:`ANNOTATION`, a JSON object label -> keys) and reads them back from
every Servers it watches.  A set labelled mgt or mgtmdt holds ``lustre-mgt`` whatever its
annotation or breakdown says, so an MGT made by another WLM (or by a profile whose exclusive
MDT replaces the MGT's key) is still kept alone.  Everything read here is untrusted:
:func:`parse_colocation` says what is wrong in one line, :func:`servers_exclusive` never raises.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.untrusted import echo
from flux_dws.core.identity import GROUP

#: DWS's one colocation type (its CRD's enum).
EXCLUSIVE = "exclusive"
#: nnf-sos's key for a set that holds a Lustre MGT.
MGT_KEY = "lustre-mgt"
#: The labels of a set that holds an MGT (a combined MGT/MDT holds one too).
MGT_LABELS = frozenset({"mgt", "mgtmdt"})
#: The Servers annotation flux-dws writes: label -> the exclusive keys of that set.
ANNOTATION = f"{GROUP}/exclusive"
#: The longest key taken (as long as a Kubernetes object name); the most keys one set may have.
MAX_KEY = 253
MAX_KEYS = 16
#: An annotation longer than this is not read (a Servers of a few sets needs far less).
MAX_ANNOTATION = 16384

#: rabbit -> the exclusive keys allocations on it hold
Holds = Mapping[str, frozenset]


def parse_colocation(value: Any) -> tuple[tuple[str, ...], str | None]:
    """(the exclusive keys, sorted and distinct; why ``value`` cannot be read, or None) for a
    ``constraints.colocation`` field; the problem reads after the field's name."""
    if value is None:
        return (), None
    if not isinstance(value, (list, tuple)):
        return (), f" must be a list, not {type(value).__name__}"
    keys: set[str] = set()
    for i, entry in enumerate(value):
        if not isinstance(entry, Mapping):
            return (), f"[{i}] must be an object, not {type(entry).__name__}"
        kind, key = entry.get("type"), entry.get("key", "")  # Go reads a missing key as ""
        if kind != EXCLUSIVE:
            return (), f"[{i}].type {echo(kind)} is not a colocation type (only '{EXCLUSIVE}')"
        if not isinstance(key, str) or len(key) > MAX_KEY:
            why = f"is not a colocation key (a string of at most {MAX_KEY} characters)"
            return (), f"[{i}].key {echo(key)} {why}"
        keys.add(key)
    if len(keys) > MAX_KEYS:
        return (), f" has {len(keys)} keys, more than {MAX_KEYS}"
    return tuple(sorted(keys)), None


def held_keys(label: str, declared: Iterable[str] = ()) -> frozenset[str]:
    """The exclusive keys an allocation set labelled ``label`` holds: those declared, and
    :data:`MGT_KEY` for a set that holds an MGT."""
    keys = frozenset(declared)
    return keys | {MGT_KEY} if label in MGT_LABELS else keys


def annotation(sets: Sequence[tuple[str, Iterable[str]]]) -> str | None:
    """The :data:`ANNOTATION` value for a Servers whose sets are ``(label, keys)``; None when
    no set holds a key."""
    by_label: dict[str, set[str]] = {}
    for label, keys in sets:
        held = held_keys(label, keys)
        if held:
            by_label.setdefault(label, set()).update(held)
    if not by_label:
        return None
    return json.dumps({label: sorted(keys) for label, keys in sorted(by_label.items())})


def _declared(text: Any) -> Mapping[str, Any]:
    """The annotation's label -> keys; empty when it is absent or cannot be read."""
    if not isinstance(text, str) or len(text) > MAX_ANNOTATION:
        return {}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def servers_exclusive(servers: Any) -> dict[str, frozenset[str]]:
    """rabbit -> the exclusive keys one Servers resource's allocations hold there (by its
    :data:`ANNOTATION` and its sets' labels); entries with no allocation hold nothing."""
    obj = untrusted.mapping(servers)
    meta = untrusted.mapping(obj.get("metadata"))
    declared = _declared(untrusted.mapping(meta.get("annotations")).get(ANNOTATION))
    held: dict[str, frozenset[str]] = {}
    for aset in untrusted.sequence(untrusted.mapping(obj.get("spec")).get("allocationSets")):
        aset = untrusted.mapping(aset)
        label = aset.get("label")
        if not isinstance(label, str):
            continue
        named = [k for k in untrusted.sequence(declared.get(label)) if isinstance(k, str)]
        keys = held_keys(label, named[:MAX_KEYS])
        if not keys:
            continue
        for entry in untrusted.sequence(aset.get("storage")):
            entry = untrusted.mapping(entry)
            name, count = entry.get("name"), untrusted.count(entry.get("allocationCount"))
            if isinstance(name, str) and name and count != 0:  # absent: one
                held[name] = held.get(name, frozenset()) | keys
    return held


def merge(holds: Iterable[Holds]) -> dict[str, frozenset[str]]:
    """rabbit -> every key any of ``holds`` has there."""
    out: dict[str, frozenset[str]] = {}
    for hold in holds:
        for rabbit, keys in hold.items():
            out[rabbit] = out.get(rabbit, frozenset()) | keys
    return out


__all__ = [
    "ANNOTATION",
    "EXCLUSIVE",
    "MGT_KEY",
    "MGT_LABELS",
    "annotation",
    "held_keys",
    "merge",
    "parse_colocation",
    "servers_exclusive",
]
