# SPDX-License-Identifier: LGPL-3.0-only
"""copy_in / copy_out: the NnfDataMovement objects nnf-sos creates and nnf-dm finishes.

Shapes as upstream (nnf-sos ``startDataInOutState``, nnf-dm's controller): for XFS and GFS2
storage one object per rabbit, in the rabbit's namespace, named ``<workflow>-<index>-0``; for
anything else one in ``nnf-dm-system`` named ``<workflow>-<index>``.  Each carries the
workflow's labels, the initiator (the directive's command), the directive index and the teardown
state.  The simulator finishes them at once: a copy whose source or destination names a path
with a ``missing`` component fails as ``dcp`` does when the file is not there (the message
names it); any other succeeds with dcp's statistics.  The workflow then gets nnf-sos's verdict.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from flux_dws.core.directives import Directive
from flux_dws.testing.dwssim.companions import api_object, child_metadata, indexed_name
from flux_dws.testing.dwssim.computemounts import Player
from flux_dws.testing.dwssim.outcomes import Complete, Outcome, ResourceError
from flux_dws.testing.dwssim.status import micro_time

PLURAL = "nnfdatamovements"
DM_NAMESPACE = "nnf-dm-system"
INITIATOR_LABEL = "dm.cray.hpe.com/initiator"
DIRECTIVE_INDEX_LABEL = "nnf.cray.hpe.com/directive_index"
TEARDOWN_STATE_LABEL = "nnf.cray.hpe.com/teardown_state"
JOB_ID_LABEL = "nnf.cray.hpe.com/job_id"
MISSING = "missing"  # a path component that makes a simulated copy fail
PER_RABBIT_TYPES = ("xfs", "gfs2")


def storage_type(directive: Directive, directives: Sequence[Directive]) -> str:
    """The file system type of the jobdw the copy's ``$DW_JOB_<name>`` path names."""
    for key in ("destination", "source"):
        path = directive.args.get(key, "")
        if path.startswith("$DW_JOB_"):
            name = path[len("$DW_JOB_") :].split("/")[0]
            for other in directives:
                if other.command == "jobdw" and other.args.get("name") == name:
                    return other.args.get("type", "")
    return "lustre"


def data_movements(
    workflow: Mapping[str, Any],
    directive: Directive,
    directives: Sequence[Directive],
    rabbits: Sequence[str],
    state: str,
    now: datetime.datetime,
) -> list[dict[str, Any]]:
    """The finished NnfDataMovement objects of one copy directive."""
    per_rabbit = storage_type(directive, directives) in PER_RABBIT_TYPES and rabbits
    places = [(r, f"{indexed_name(workflow, directive.index)}-0") for r in rabbits]
    if not per_rabbit:
        places = [(DM_NAMESPACE, indexed_name(workflow, directive.index))]
    objects = []
    for namespace, name in places:
        meta = child_metadata(workflow, name)
        meta["namespace"] = namespace
        meta.pop("ownerReferences", None)  # a cluster-wide child: owner labels only
        meta["labels"].update(
            {
                INITIATOR_LABEL: directive.command,
                DIRECTIVE_INDEX_LABEL: str(directive.index),
                TEARDOWN_STATE_LABEL: state,
                JOB_ID_LABEL: str((workflow.get("spec") or {}).get("jobID", "")),
            }
        )
        objects.append(
            {
                **api_object(PLURAL),
                "metadata": meta,
                "spec": {
                    "source": {"path": directive.args.get("source", "")},
                    "destination": {"path": directive.args.get("destination", "")},
                    "userId": (workflow.get("spec") or {}).get("userID", 0),
                    "groupId": (workflow.get("spec") or {}).get("groupID", 0),
                },
                "status": _status(directive, f"{namespace}/{name}", now),
            }
        )
    return objects


def _status(directive: Directive, key: str, now: datetime.datetime) -> dict[str, Any]:
    source, destination = directive.args.get("source", ""), directive.args.get("destination", "")
    return finished_status(source, destination, f"{directive.text} {key}", now)


def finished_status(
    source: str, destination: str, key: str, now: datetime.datetime
) -> dict[str, Any]:
    """nnf-dm's final status of a copy: Success with dcp's figures, or Failed naming the file
    (a path with a ``missing`` component); ``key`` seeds the figures."""
    seed = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    seconds = 1.0 + (seed % 900) / 100
    start = now - datetime.timedelta(seconds=seconds)
    missing = next((p for p in (source, destination) if MISSING in p.split("/")), None)
    base = {
        "state": "Finished",
        "startTime": micro_time(start),
        "endTime": micro_time(now),
        "restarts": 0,
    }
    if missing is not None:
        output = (
            f"[{start:%Y-%m-%dT%H:%M:%S}] Walking {source}\n"
            f"[{start:%Y-%m-%dT%H:%M:%S}] ERROR: Failed to open {missing} "
            "(errno=2 No such file or directory)\n"
            f"[{now:%Y-%m-%dT%H:%M:%S}] ERROR: Failed to copy 1 items"
        )
        return {
            **base,
            "status": "Failed",
            "message": f"exit status 1: {output}",
            "commandStatus": {
                "command": _command(source, destination),
                "elapsedTime": f"{seconds:.3f}s",
            },
        }
    files = 1 + seed % 40
    size = (1 + seed % 5000) * 1024 * 1024
    return {
        **base,
        "status": "Success",
        "commandStatus": {
            "command": _command(source, destination),
            "elapsedTime": f"{seconds:.3f}s",
            "progress": 100,
            "seconds": f"{seconds:.3f}",
            "items": files + 1,
            "directories": 1,
            "files": files,
            "links": 0,
            "data": f"{size / 2**20:.3f} MiB ({size} bytes)",
            "rate": f"{size / 2**20 / seconds:.3f} MiB/s ({size} bytes in {seconds:.3f} seconds)",
        },
    }


def _command(source: str, destination: str) -> str:
    return f"mpirun --hostfile /tmp/hostfile dcp --progress 1 {source} {destination}"


def verdict(objects: Sequence[Mapping[str, Any]], state: str) -> Outcome:
    """nnf-sos's finish of DataIn/DataOut: every object Success, or Fatal with its message."""
    for obj in objects:
        status = obj.get("status") or {}
        if status.get("status") != "Success":
            return ResourceError(
                user_message=f"data movement operation failed during '{state}', message: "
                f"{status.get('message', '')}",
                severity="Fatal",
            ).fail()
    return Complete()


def next_step(obj: dict[str, Any], now: datetime.datetime) -> dict[str, Any] | None:
    """An NnfDataMovement nnf-sos made, as nnf-dm leaves it: Finished, Success or Failed by
    its spec's paths (pure; None when it is finished, cancelled or going)."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    if meta.get("deletionTimestamp") or (obj.get("status") or {}).get("state") == "Finished":
        return None
    source = (spec.get("source") or {}).get("path", "")
    destination = (spec.get("destination") or {}).get("path", "")
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    return {**obj, "status": finished_status(source, destination, key, now)}


class DataMover(Player):
    """Plays nnf-dm (its data movement controllers on the rabbits) beside nnf-sos: finishes
    each NnfDataMovement at once (no data is moved)."""

    plural = PLURAL
    name = "nnf-dm"

    def _handle(self, obj: dict[str, Any]) -> None:
        new = next_step(obj, datetime.datetime.now(datetime.timezone.utc))
        if new is not None:
            self._write(obj, new)
