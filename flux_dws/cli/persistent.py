# SPDX-License-Identifier: LGPL-3.0-only
"""``flux dws persistent list|create|destroy|share``: persistent storage as a managed resource.

``list`` reads DWS's PersistentStorageInstances (live, or a saved JSON as ``flux dws rabbits``
does); ``share`` sets or clears nnf-sos's ignore-uid annotation, for the Flux instance owner
only (flux-core's ``security.owner``; refused when no instance can be asked);
``create`` and ``destroy`` run the ``create_persistent`` / ``destroy_persistent`` job for the
person (a Flux job submitted through flux-core's Python API) and say how it ended.  A destroy
of storage that jobs use now is refused before any job is submitted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Callable, TextIO

from flux_dws.base.errors import DwsError
from flux_dws.base.jobid import f58
from flux_dws.base.sizes import parse_size, show_bytes
from flux_dws.cli.rabbitgraph import read_json
from flux_dws.cli.render import Column, format_table, show_json, show_line
from flux_dws.cli.sources import (
    KUBE_RETRIES,
    KUBE_TIMEOUT,
    FluxSource,
    Source,
    SourceError,
    flux_uri_problem,
    user_name,
)
from flux_dws.core.persistent import PersistentRow, destroy_refusal, persistent_rows

#: (directive) -> (jobid, the job's eventlog once inactive); replaced in tests.
Submit = Callable[[str, float], tuple[int, list[dict[str, Any]]]]

PERSISTENT_FIELDS: Mapping[str, Column] = {
    "name": Column("NAME", "the storage's name (persistentdw name=...)"),
    "owner": Column("OWNER", "the user who created it"),
    "type": Column("TYPE", "its file system type"),
    "capacity": Column("CAPACITY", "its capacity, from its Servers"),
    "rabbits": Column("RABBITS", "the rabbits it is on"),
    "state": Column("STATE", "Creating, Active, Degraded or Destroying"),
    "shared": Column("SHARED", "other users may use it (ignore-uid)"),
    "jobs": Column("USED-BY", "the jobs using it now"),
}
DEFAULT_FORMAT = (
    "{name:<16} {owner:<8.8} {type:<6} {capacity:>8} {state:<10} {shared:<6} {rabbits:<16} {jobs}"
)
TYPES = ("xfs", "gfs2", "lustre", "raw")


def add_arguments(parser: argparse.ArgumentParser, parser_class: Any) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=parser_class)
    sub.required = True
    p = sub.add_parser("list", help="persistent storage: owner, type, capacity, state, users")
    p.add_argument("-o", "--format", help="a format string of " + ", ".join(PERSISTENT_FIELDS))
    p.add_argument("-H", "--no-header", action="store_true", help="omit the header line")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--from-file", metavar="FILE", help="read saved resources instead of the API")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig for the live API")
    p = sub.add_parser(
        "share", help="let every user's persistentdw use it (the instance owner only)"
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--off", action="store_true", help="stop sharing it")
    p.add_argument("--namespace", default="default", help="its namespace (default: default)")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig for the live API")
    p = sub.add_parser("create", help="run a create_persistent job")
    p.add_argument("name", metavar="NAME")
    p.add_argument("-t", "--type", required=True, choices=TYPES, help="file system type")
    p.add_argument("-c", "--capacity", required=True, help="capacity, e.g. 1TiB")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    p = sub.add_parser("destroy", help="run a destroy_persistent job (refused while in use)")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--namespace", default="default", help="its namespace (default: default)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig for the in-use check")


def _kube(kubeconfig: str | None) -> Any:
    from flux_dws.k8s import KubeClient

    return KubeClient.connect(
        namespace="default",
        identity="persistent",
        kubeconfig=kubeconfig,
        timeout=KUBE_TIMEOUT,
        retries=KUBE_RETRIES,
    )


def live_rows(kubeconfig: str | None) -> list[PersistentRow]:
    from flux_dws.k8s import admin

    kube = _kube(kubeconfig)
    try:
        return persistent_rows(
            admin.list_persistent(kube), kube.list_servers()[0], admin.list_all_workflows(kube)
        )
    finally:
        kube.close()


def saved_rows(path: str) -> list[PersistentRow]:
    from flux_dws.cli.rabbits import split_saved

    saved = split_saved(read_json(path, "saved resources", sys.stdin))
    return persistent_rows(saved.persistent, saved.servers, saved.workflows)


def record(row: PersistentRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "owner": "-" if row.owner is None else user_name(row.owner),
        "type": row.fs_type or "-",
        "capacity": show_bytes(row.capacity) if row.capacity else "-",
        "rabbits": ",".join(row.rabbits) or "-",
        "state": row.state,
        "shared": "yes" if row.shared else "no",
        "jobs": ",".join(f58(j) for j in row.jobs) or ("-" if not row.consumers else "?"),
    }


def as_json(row: PersistentRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "namespace": row.namespace,
        "owner": row.owner,
        "type": row.fs_type,
        "capacity": row.capacity,
        "rabbits": list(row.rabbits),
        "state": row.state,
        "usable": row.usable,
        "shared": row.shared,
        "consumers": list(row.consumers),
        "jobs": [f58(j) for j in row.jobs],
    }


def _find(rows: Sequence[PersistentRow], name: str, namespace: str) -> PersistentRow | None:
    return next((r for r in rows if r.name == name and r.namespace == namespace), None)


def flux_submit(environ: Mapping[str, str]) -> Submit:
    """Submit with flux-core's Python API to the instance in FLUX_URI, and wait (bounded) for
    the job to be inactive, whatever exceptions it had (its eventlog says how it ended)."""

    def submit(directive: str, timeout: float) -> tuple[int, list[dict[str, Any]]]:
        source = FluxSource(command="flux dws persistent ...", environ=environ)
        try:
            jobid = source.submit(["true"], {"dw": directive})
            if not source.wait_inactive(jobid, timeout):
                raise DwsError(
                    f"job {f58(jobid)} ({directive}) has not ended after {timeout:g}s;"
                    f" see flux dws status {f58(jobid)}"
                )
            return jobid, source.eventlog(jobid)
        finally:
            source.close()

    return submit


def _ran(directive: str, submit: Submit, timeout: float) -> tuple[int, str | None]:
    """Run the job; (jobid, None) when it succeeded, else its failure."""
    from flux_dws.cli.views import fatal_exception
    from flux_dws.flux.results import job_result

    jobid, eventlog = submit(directive, timeout)
    for event in eventlog:  # DWS refused to tear down (a destroy_persistent it would not do)
        if event.get("name") == "dws-teardown-failed":
            return jobid, str((event.get("context") or {}).get("reason") or "Teardown failed")
    exc = fatal_exception(eventlog)
    if exc is not None:
        return jobid, str(exc.get("note") or exc.get("type") or "failed")
    result = job_result(eventlog)
    return jobid, None if result == "COMPLETED" else result


def run(
    args: argparse.Namespace,
    out: TextIO,
    environ: Mapping[str, str] | None = None,
    *,
    submit: Submit | None = None,
    uid: int | None = None,
    source_factory: Callable[[], Source] | None = None,
) -> int:
    """Run ``flux dws persistent ACTION``; ``submit`` and ``source_factory`` (who owns the
    instance, for ``share``) replace the Flux instance in FLUX_URI in tests."""
    environ = os.environ if environ is None else environ
    uid = os.getuid() if uid is None else uid
    if args.action == "list":
        rows = saved_rows(args.from_file) if args.from_file else live_rows(args.kubeconfig)
        if args.json:
            show_json([as_json(r) for r in rows], out)
            return 0
        lines = format_table(
            [record(r) for r in rows],
            args.format or DEFAULT_FORMAT,
            PERSISTENT_FIELDS,
            header=not args.no_header,
        )
        for line in lines:
            show_line(line, out)
        return 0
    if args.action == "share":
        return _share(args, out, uid, _instance_owner(environ, source_factory))
    submit = submit or flux_submit(environ)
    if args.action == "create":
        try:
            parse_size(args.capacity)
        except DwsError as exc:
            raise DwsError(f"--capacity: {exc}") from None
        directive = (
            f"#DW create_persistent type={args.type} capacity={args.capacity} name={args.name}"
        )
        jobid, failed = _ran(directive, submit, args.timeout)
        if failed:
            raise DwsError(
                f"persistent storage {args.name!r} was not created: job {f58(jobid)}: {failed}"
            )
        show_line(
            f"created persistent storage {args.name!r} ({args.type}, {args.capacity})"
            f" with job {f58(jobid)}",
            out,
        )
        return 0
    rows = live_rows(args.kubeconfig)
    row = _find(rows, args.name, args.namespace)
    if row is None:
        raise DwsError(f"no persistent storage {args.name!r} in namespace {args.namespace}")
    if row.owner != uid:  # nnf-sos refuses it in Teardown, which would drain the job's node
        raise DwsError(
            f"persistent storage {args.name!r} belongs to uid {row.owner}:"
            " only its owner may destroy it"
        )
    refusal = destroy_refusal(row, [f"job {f58(j)}" for j in row.jobs])
    if refusal:
        raise DwsError(refusal)
    jobid, failed = _ran(f"#DW destroy_persistent name={args.name}", submit, args.timeout)
    if failed:
        raise DwsError(
            f"persistent storage {args.name!r} was not destroyed: job {f58(jobid)}: {failed}"
        )
    show_line(f"destroyed persistent storage {args.name!r} with job {f58(jobid)}", out)
    return 0


def _instance_owner(environ: Mapping[str, str], source_factory: Callable[[], Source] | None) -> int:
    """The Flux instance owner's uid; DwsError (one line) when no instance can say."""
    try:
        if source_factory is None:
            problem = flux_uri_problem(environ)
            if problem:
                raise SourceError(problem)
            source: Source = FluxSource(command="flux dws persistent share", environ=environ)
        else:
            source = source_factory()
        try:
            return source.owner()
        finally:
            source.close()
    except SourceError as exc:
        raise DwsError(
            f"only the Flux instance owner may share persistent storage, and no instance"
            f" could say who that is: {exc}"
        ) from None


def _share(args: argparse.Namespace, out: TextIO, uid: int, owner: int) -> int:
    from flux_dws.k8s import admin

    if uid != owner:
        raise DwsError(
            f"only the Flux instance owner ({user_name(owner)}) may share persistent storage"
        )
    kube = _kube(args.kubeconfig)
    try:
        if admin.get_persistent(kube, args.namespace, args.name) is None:
            raise DwsError(f"no persistent storage {args.name!r} in namespace {args.namespace}")
        admin.set_shared(kube, args.namespace, args.name, not args.off)
    finally:
        kube.close()
    if args.off:
        show_line(f"persistent storage {args.name!r} is now usable by its owner only", out)
    else:
        show_line(f"persistent storage {args.name!r} is now usable by every user's jobs", out)
    return 0


__all__ = ["PERSISTENT_FIELDS", "add_arguments", "run"]
