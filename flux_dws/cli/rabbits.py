# SPDX-License-Identifier: LGPL-3.0-only
"""``flux dws rabbits``: each rabbit's nodes, health and capacity, like ``flux resource list``.

Reads DWS's objects from the live Kubernetes API or from a JSON file an admin saved
(``kubectl get systemconfigurations,storages,servers,workflows -A -o json``), as
``flux dws rabbit-graph`` does, and shows them through flux_dws.core.rabbitview.  ``-j JOBID``
narrows to the rabbits a job's workflow got (its Servers), ``-n HOST`` to the rabbit serving
a node.  DRIFT is the service's capacity-drift alarm, against ``[dws] capacity-drift`` of the
instance's config (``--config``, as rabbit-graph reads it) or ``--capacity-drift``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from flux_dws.base import untrusted
from flux_dws.base.errors import DwsError
from flux_dws.base.hostlist import encode_hostlist
from flux_dws.base.jobid import f58, parse_jobid
from flux_dws.base.sizes import show_bytes
from flux_dws.cli.rabbitgraph import instance_config, read_json
from flux_dws.cli.render import Column, format_table, show_json, show_line
from flux_dws.core.identity import JOBID_LABEL
from flux_dws.core.policy import policy_from_table
from flux_dws.core.rabbitview import (
    RabbitRow,
    job_allocation,
    rabbit_rows,
    serving,
    with_drains,
)
from flux_dws.core.storage import compute_layout

#: The fields ``flux dws rabbits -o`` knows.
RABBIT_FIELDS: Mapping[str, Column] = {
    "name": Column("NAME", "the rabbit (its Storage resource's name)"),
    "nodes": Column("NODES", "the compute nodes it serves, as a hostlist"),
    "nnodes": Column("NNODES", "how many compute nodes it serves"),
    "state": Column("STATE", "Storage spec.state: Enabled or Disabled"),
    "status": Column("STATUS", "Storage status.status: Ready, Offline, Degraded, ..."),
    "usable": Column("USABLE", "new jobs may get its storage (Enabled and Ready)"),
    "total": Column("TOTAL", "capacity of its devices"),
    "allocated": Column("ALLOCATED", "held by Flux jobs' workflows"),
    "persistent": Column("PERSISTENT", "held by persistent and system storage"),
    "free": Column("FREE", "still free"),
    "reasons": Column("REASONS", "why it is disabled or drained, and DWS's message"),
    "drained": Column("DRAINED", "its nodes Flux has drained, as a hostlist (- for none)"),
    "drift": Column(
        "DRIFT", "how much less free than its Servers explain, past [dws] capacity-drift"
    ),
    "allocation": Column("JOB-ALLOC", "with -j: what the job holds on it"),
}
RABBIT_FORMATS: Mapping[str, str] = {
    "default": (
        "{name:<12} {state:<8} {status:<10} {total:>8} {allocated:>9} {persistent:>10}"
        " {free:>8} {drift:>8} {nodes}"
    ),
    "long": (
        "{name:<12} {state:<8} {status:<10} {total:>8} {allocated:>9} {persistent:>10}"
        " {free:>8} {drift:>8} {nodes:<20} {drained:<16} {reasons}"
    ),
    "job": "{name:<12} {status:<10} {allocation:>9} {free:>8} {nodes}",
    "down": "{name:<12} {state:<8} {status:<10} {nodes:<20} {drained:<16} {reasons}",
}
#: Kinds read from a saved file, by kubectl's kind name.
KINDS = ("SystemConfiguration", "Storage", "Servers", "Workflow", "PersistentStorageInstance")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-j", "--jobid", metavar="JOBID", help="only the rabbits this job got")
    parser.add_argument(
        "-n", "--node", metavar="HOST", help="only the rabbit that serves this compute node"
    )
    parser.add_argument(
        "-s", "--states", metavar="LIST", help="only rabbits whose status is one of these"
    )
    fields = ", ".join(RABBIT_FIELDS)
    parser.add_argument(
        "-o",
        "--format",
        help=f"{'/'.join(RABBIT_FORMATS)} or a format string like '{{name}} {{free}}'"
        f" (fields: {fields})",
    )
    parser.add_argument("-H", "--no-header", action="store_true", help="omit the header line")
    parser.add_argument("--json", action="store_true", help="print JSON (sizes in bytes)")
    parser.add_argument(
        "--from-file",
        metavar="FILE",
        help="read saved resources (kubectl get systemconfigurations,storages,servers,"
        "workflows -A -o json) instead of the live API",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig for the live API")
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="the instance's config file or directory, for [dws] capacity-drift "
        "(default: /etc/flux/system/conf.d when it exists)",
    )
    parser.add_argument(
        "--capacity-drift",
        metavar="SIZE",
        help="alarm a rabbit missing more than this (default: the config's, else 64GiB)",
    )


def drift_threshold(args: argparse.Namespace) -> int:
    """``--capacity-drift``, else ``[dws] capacity-drift`` of the instance's config, else the
    default; read by the service's own rules (flux_dws.core.policy)."""
    if args.capacity_drift is not None:
        table: Any = {"capacity-drift": args.capacity_drift}
        where = "--capacity-drift"
    else:
        where, config = instance_config(args.config)
        dws = untrusted.mapping(config.get("dws"))
        table = {"capacity-drift": dws["capacity-drift"]} if "capacity-drift" in dws else {}
    try:
        return policy_from_table(table).capacity_drift
    except DwsError as exc:
        raise DwsError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class Objects:
    """What the command reads, by kind."""

    config: Mapping[str, Any] | None
    storages: Sequence[Mapping[str, Any]]
    servers: Sequence[Mapping[str, Any]]
    workflows: Sequence[Mapping[str, Any]]
    persistent: Sequence[Mapping[str, Any]] = ()


def split_saved(saved: Any) -> Objects:
    """A saved kubectl List (or JSON array) split by kind; DwsError when it holds none."""
    items = saved.get("items") if isinstance(saved, Mapping) else saved
    if not isinstance(items, list):
        raise DwsError("the saved file is neither a kubectl List nor a JSON array")
    by_kind: dict[str, list[Mapping[str, Any]]] = {kind: [] for kind in KINDS}
    for item in items:
        if isinstance(item, Mapping) and item.get("kind") in by_kind:
            by_kind[item["kind"]].append(item)
    configs = by_kind["SystemConfiguration"]
    named = [c for c in configs if (c.get("metadata") or {}).get("name") == "default"]
    if not configs and not by_kind["Storage"]:
        raise DwsError("the saved file holds no SystemConfiguration and no Storage")
    return Objects(
        (named or configs or [None])[0],
        by_kind["Storage"],
        by_kind["Servers"],
        by_kind["Workflow"],
        by_kind["PersistentStorageInstance"],
    )


def live_objects(kubeconfig: str | None, *, workflows: bool) -> Objects:
    """The same objects from the Kubernetes API (every namespace's Servers and Workflows)."""
    from flux_dws.cli.sources import KUBE_RETRIES, KUBE_TIMEOUT
    from flux_dws.k8s import KubeClient, admin

    kube = KubeClient.connect(
        namespace="default",
        identity="rabbits",
        kubeconfig=kubeconfig,
        timeout=KUBE_TIMEOUT,
        retries=KUBE_RETRIES,
    )
    try:
        return Objects(
            kube.read_system_configuration(),
            kube.list_storages()[0],
            kube.list_servers()[0],
            admin.list_all_workflows(kube) if workflows else [],
        )
    finally:
        kube.close()


def job_workflows(workflows: Sequence[Mapping[str, Any]], jobid: int) -> list[str]:
    """Names of the workflows labelled with this job ID (any instance's)."""
    found = []
    for wf in workflows:
        meta = wf.get("metadata") if isinstance(wf, Mapping) else None
        labels = meta.get("labels") if isinstance(meta, Mapping) else None
        if isinstance(labels, Mapping) and labels.get(JOBID_LABEL) == str(jobid):
            name = meta.get("name")
            if isinstance(name, str):
                found.append(name)
    return sorted(found)


def select(
    objects: Objects,
    *,
    jobid: int | None = None,
    node: str | None = None,
    drift_threshold: int | None = None,
) -> tuple[list[RabbitRow], dict[str, int]]:
    """The rows to show and, with ``jobid``, rabbit -> the job's bytes on it."""
    extra = {} if drift_threshold is None else {"drift_threshold": drift_threshold}
    rows = rabbit_rows(objects.config, objects.storages, objects.servers, **extra)
    allocation: dict[str, int] = {}
    if jobid is not None:
        names = job_workflows(objects.workflows, jobid)
        if not names:
            raise DwsError(f"job {f58(jobid)} has no workflow (not a #DW job, or it is gone)")
        for name in names:
            for rabbit, size in job_allocation(objects.servers, name).items():
                allocation[rabbit] = allocation.get(rabbit, 0) + size
        rows = [row for row in rows if row.name in allocation]
    if node is not None:
        row = serving(rows, node)
        if row is None:
            external = node in compute_layout(objects.config).external
            why = (
                ": it is one of the SystemConfiguration's externalComputeNodes" if external else ""
            )
            raise DwsError(f"no rabbit serves {node}{why}")
        rows = [row]
    return rows, allocation


def record(row: RabbitRow, allocation: Mapping[str, int]) -> dict[str, Any]:
    """A row's fields for the table (sizes for people)."""
    return {
        "name": row.name,
        "nodes": row.hostlist,
        "nnodes": len(row.nodes),
        "state": row.state,
        "status": row.status,
        "usable": "yes" if row.usable else "no",
        "total": show_bytes(row.total),
        "allocated": show_bytes(row.allocated),
        "persistent": show_bytes(row.persistent),
        "free": show_bytes(row.free),
        "reasons": "; ".join(row.reasons),
        "drift": show_bytes(row.drift.missing) if row.drift else "-",
        "drained": encode_hostlist(sorted(row.drained)) if row.drained else "-",
        "allocation": show_bytes(allocation.get(row.name, 0)),
    }


def as_json(row: RabbitRow, allocation: Mapping[str, int] | None) -> dict[str, Any]:
    """A row for programs: sizes in bytes."""
    out: dict[str, Any] = {
        "name": row.name,
        "nodes": row.hostlist,
        "state": row.state,
        "status": row.status,
        "usable": row.usable,
        "capacity": {
            "total": row.total,
            "allocated": row.allocated,
            "persistent": row.persistent,
            "free": row.free,
        },
        "reasons": list(row.reasons),
        # the alarm, as the service raises it: {total, expected, free} bytes, or null
        "drift": {**row.drift.to_json(), "missing": row.drift.missing} if row.drift else None,
        # host -> Flux's drain reason, or null where Flux was not read (a saved file)
        "drained": None if row.drained is None else dict(row.drained),
    }
    if allocation is not None:
        out["allocation"] = allocation.get(row.name, 0)
    return out


def run(args: argparse.Namespace, out: TextIO, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    jobid = parse_jobid(args.jobid) if args.jobid else None
    if args.from_file:
        objects = split_saved(read_json(args.from_file, "saved resources", sys.stdin))
    else:
        objects = live_objects(args.kubeconfig, workflows=jobid is not None)
    rows, allocation = select(
        objects, jobid=jobid, node=args.node, drift_threshold=drift_threshold(args)
    )
    if not args.from_file and environ.get("FLUX_URI"):  # the live system: Flux's drains too
        from flux_dws.cli.sources import SourceError, flux_drains

        try:
            rows = with_drains(rows, flux_drains(environ))
        except SourceError as exc:  # the rest still shows; DRAINED says -
            show_line(f"flux dws rabbits: cannot read Flux's drains: {exc}", sys.stderr)
    if args.states:
        wanted = {s.strip().lower() for s in args.states.split(",") if s.strip()}
        rows = [r for r in rows if r.status.lower() in wanted or r.state.lower() in wanted]
    if args.json:
        show_json([as_json(r, allocation if jobid is not None else None) for r in rows], out)
        return 0
    default = "job" if jobid is not None else "default"
    fmt = RABBIT_FORMATS.get(args.format or default, args.format or "")
    lines = format_table(
        [record(r, allocation) for r in rows], fmt, RABBIT_FIELDS, header=not args.no_header
    )
    for line in lines:
        show_line(line, out)
    return 0


__all__ = ["RABBIT_FIELDS", "RABBIT_FORMATS", "add_arguments", "run", "select", "split_saved"]
