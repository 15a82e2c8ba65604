# SPDX-License-Identifier: LGPL-3.0-only
"""Persistent storage as ``flux dws persistent`` shows it: pure functions of DWS's objects.

A PersistentStorageInstance (DWS api types) names the storage, its owner (``spec.userID``),
its file system type, its state (Creating, Active, Degraded, Destroying) and the workflows
using it now (``spec.consumerReferences``, one per persistentdw directive, named
``<workflow>-<index>``).  Its Servers resource (``status.servers``) says where its capacity is.
nnf-sos lets only the owner's persistentdw use it unless the annotation ``ignore-uid`` is
"true" (nnf_workflow_controller_helpers.go), and refuses to destroy it while it has consumers.
Everything is untrusted: a malformed field reads as absent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flux_dws.base import untrusted
from flux_dws.core.identity import JOBID_LABEL
from flux_dws.core.rabbits import servers_held

IGNORE_UID = "dataworkflowservices.github.io/ignore-uid"
#: States in which a persistentdw may use the storage (DWS's IsUsable).
USABLE = ("Active", "Degraded")
_INDEXED = re.compile(r"^(.*)-\d+$")


@dataclass(frozen=True)
class PersistentRow:
    """One persistent storage instance."""

    name: str
    namespace: str
    owner: int | None
    fs_type: str
    state: str
    capacity: int  # bytes, from its Servers
    rabbits: tuple[str, ...]
    shared: bool
    consumers: tuple[str, ...]  # workflow names
    jobs: tuple[int, ...]  # the Flux jobs of those workflows, where known

    @property
    def usable(self) -> bool:
        return self.state in USABLE


def is_shared(psi: Mapping[str, Any]) -> bool:
    meta = untrusted.mapping(untrusted.mapping(psi).get("metadata"))
    value = untrusted.mapping(meta.get("annotations")).get(IGNORE_UID)
    return isinstance(value, str) and value.lower() == "true"


def _jobids(workflows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    found = {}
    for wf in workflows:
        meta = untrusted.mapping(untrusted.mapping(wf).get("metadata"))
        label = untrusted.mapping(meta.get("labels")).get(JOBID_LABEL)
        jobid = untrusted.decimal(label)
        if jobid is not None:
            key = (untrusted.name_of(wf), str(meta.get("namespace") or ""))
            found[key] = jobid
    return found


def persistent_rows(
    instances: Iterable[Mapping[str, Any]],
    servers: Iterable[Mapping[str, Any]] = (),
    workflows: Iterable[Mapping[str, Any]] = (),
) -> list[PersistentRow]:
    """Every instance, by name, with its capacity, rabbits and the jobs using it."""
    by_servers = {
        (untrusted.name_of(s), str(untrusted.mapping(s.get("metadata")).get("namespace") or "")): s
        for s in servers
        if isinstance(s, Mapping)
    }
    jobs_of = _jobids(workflows)
    rows = []
    for psi in instances:
        psi = untrusted.mapping(psi)
        meta = untrusted.mapping(psi.get("metadata"))
        spec = untrusted.mapping(psi.get("spec"))
        status = untrusted.mapping(psi.get("status"))
        name = untrusted.name_of(psi)
        if name == untrusted.UNKNOWN:
            continue
        namespace = untrusted.field(meta.get("namespace") or "", 63)
        ref = untrusted.mapping(status.get("servers"))
        key = (str(ref.get("name") or name), str(ref.get("namespace") or namespace))
        placed = servers_held(by_servers.get(key) or {})
        consumers = []
        for entry in untrusted.sequence(spec.get("consumerReferences")):
            ref_name = untrusted.mapping(entry).get("name")
            if isinstance(ref_name, str) and ref_name:
                match = _INDEXED.match(ref_name)
                consumers.append(untrusted.field(match.group(1) if match else ref_name, 253))
        consumers = sorted(set(consumers))
        jobs = tuple(
            sorted({jobs_of[(c, namespace)] for c in consumers if (c, namespace) in jobs_of})
        )
        state = status.get("state") or spec.get("state") or "Unknown"
        if meta.get("deletionTimestamp"):
            state = "Destroying"  # nnf-sos refuses it from then on, whatever its state says
        rows.append(
            PersistentRow(
                name=name,
                namespace=namespace,
                owner=untrusted.count(spec.get("userID")),
                fs_type=untrusted.field(spec.get("fsType") or "", 16)
                if isinstance(spec.get("fsType"), str)
                else "",
                state=untrusted.field(state, 32) if isinstance(state, str) else "Unknown",
                capacity=sum(placed.values()),
                rabbits=tuple(sorted(placed)),
                shared=is_shared(psi),
                consumers=tuple(consumers),
                jobs=jobs,
            )
        )
    return sorted(rows, key=lambda r: (r.namespace, r.name))


def use_refusal(row: PersistentRow | None, name: str, userid: int) -> str | None:
    """Why user ``userid``'s persistentdw may not use ``name`` (nnf-sos's rule), or None."""
    if row is None:
        return f"persistent storage {name!r} does not exist (flux dws persistent list)"
    if row.state == "Destroying":
        return f"persistent storage {name!r} is being destroyed"
    if not row.usable:
        return f"persistent storage {name!r} is {row.state}, not usable"
    if row.owner != userid and not row.shared:
        return (
            f"persistent storage {name!r} belongs to uid {row.owner} and is not shared"
            f" (the instance owner can share it: flux dws persistent share {name})"
        )
    return None


#: Where the plugin writes the job's storage name into the pushed ``unknown`` words.
NAME_MARK = "@NAME@"
#: The most storage the service pushes to the jobtap plugin (the plugin refuses more).
PUSHED_MAX = 4096
_PUSHABLE = re.compile(r"^[A-Za-z0-9._-]{1,63}$")


def pushed_snapshot(rows: Iterable[PersistentRow]) -> dict[str, Any]:
    """The ``persistent`` request: the storage the plugin checks persistentdw against at submit.

    The words are use_refusal's, so submit and Proposal say the same: ``refusal`` is what the
    owner gets (None: may use it), ``others`` what any other uid gets, ``unknown`` what a
    name not listed gets (NAME_MARK marks the name).  Names the plugin cannot hold are left
    out (their jobs are checked at Proposal); beyond PUSHED_MAX rows, the rest too.
    """
    storage = []
    for row in rows:
        if len(storage) >= PUSHED_MAX or not _PUSHABLE.match(row.name):
            continue
        stranger = -1 if row.owner != -1 else -2  # a uid that is not the owner's
        storage.append(
            {
                "name": row.name,
                "owner": row.owner,
                "refusal": use_refusal(row, row.name, row.owner if row.owner is not None else -1),
                "others": use_refusal(row, row.name, stranger),
            }
        )
    return {"storage": storage, "unknown": use_refusal(None, NAME_MARK, -1)}


def persistent_names(directive: str) -> str | None:
    """The storage a ``#DW persistentdw name=X`` directive names (the last name=), or None.

    As the jobtap plugin reads it at submit (jobtap/persistent.c): the same words, split."""
    words = str(directive).split()
    if words[:2] != ["#DW", "persistentdw"]:
        return None
    names = [w[5:] for w in words[2:] if w.startswith("name=") and len(w) > 5]
    return names[-1] if names else None


def directives_refusal(
    directives: Sequence[str], rows: Mapping[str, PersistentRow], userid: int
) -> tuple[str, str] | None:
    """The first persistentdw of ``directives`` that user ``userid`` may not use, and why."""
    for directive in directives:
        name = persistent_names(directive)
        if name is not None:
            why = use_refusal(rows.get(name), name, userid)
            if why is not None:
                return directive, why
    return None


def destroy_refusal(row: PersistentRow, jobs_text: Sequence[str]) -> str | None:
    """Why ``row`` cannot be destroyed now, or None."""
    if row.consumers:
        using = ", ".join(jobs_text) if jobs_text else ", ".join(row.consumers)
        return (
            f"persistent storage {row.name!r} is in use by {using}: it can be destroyed once"
            " they end"
        )
    return None


__all__ = [
    "IGNORE_UID",
    "NAME_MARK",
    "PUSHED_MAX",
    "PersistentRow",
    "destroy_refusal",
    "directives_refusal",
    "persistent_names",
    "is_shared",
    "persistent_rows",
    "pushed_snapshot",
    "use_refusal",
]
