# SPDX-License-Identifier: LGPL-3.0-only
"""The I/O shell of ``flux dws status|list|logs|cleanup|service``: read, build a view, print.

Each command takes its parsed arguments, a Source, an output stream and the time, so tests
run them against a Stack exactly as users run them against a Flux instance.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import Any, Callable, TextIO

from flux_dws.base.errors import DwsError
from flux_dws.base.jobid import f58, f58_prefix, parse_jobid
from flux_dws.cli.inventory import filter_rows, list_rows
from flux_dws.cli.logsview import build_logs
from flux_dws.cli.recordviews import copies, render_copies, render_output
from flux_dws.cli.released import (
    KEYS,
    release_event,
    release_failure,
    release_view,
    render_release,
)
from flux_dws.cli.render import (
    LIST_FIELDS,
    LIST_FORMATS,
    format_table,
    list_record,
    render_logs,
    render_status,
    show,
    show_json,
    show_line,
    to_jsonable,
)
from flux_dws.cli.servicestatus import (
    build_service_status,
    render_service_status,
    service_status_json,
)
from flux_dws.cli.sources import Source, SourceError, user_id, user_name
from flux_dws.cli.views import build_status, events_named, job_state
from flux_dws.core.output import OUTPUT_KEY, read_saved
from flux_dws.core.reconcile import Sweep, plan_cleanup
from flux_dws.core.states import State
from flux_dws.core.workflow import view_workflow
from flux_dws.k8s import KubeError
from flux_dws.service import daemon

log = logging.getLogger("flux-dws.cli")


#: How often ``cleanup`` re-reads a workflow while waiting for its Teardown.
CLEANUP_POLL = 0.5


def _live_workflow(
    source: Source, eventlog: Sequence[dict[str, Any]]
) -> tuple[dict[str, Any] | None, str]:
    """The job's workflow object if the job is still active, else None and why not.

    An inactive job's workflow was deleted before the job was let go, and a user may have no
    Kubernetes credentials at all; then the eventlog alone tells the story.
    """
    created = events_named(eventlog, "dws-workflow")
    if not created:
        return None, ""
    if job_state(eventlog) == "INACTIVE" and release_event(eventlog) is None:
        return None, ""
    context = created[-1].get("context") or {}
    name, namespace = context.get("name"), context.get("namespace")
    try:
        kube = source.kube()
        if namespace and namespace != kube.namespace:
            return None, f"in namespace {namespace}, not the configured {kube.namespace}"
        obj = kube.get_workflow(str(name))
    except KubeError as exc:
        return None, f"not read: {exc}"
    return obj, "" if obj is not None else "not found in Kubernetes"


def status(args: argparse.Namespace, source: Source, out: TextIO, now: float) -> int:
    if args.jobid is None:  # no job: the service's state at a glance (cli.servicestatus)
        view = build_service_status(source.plugin_list(), now)
        if args.json:
            show_json(service_status_json(view), out)
        else:
            prefix = f58_prefix(out)
            lines = render_service_status(view, now, lambda jobid: f58(jobid, prefix))
            show("\n".join(lines), out)
        return 0
    jobid = parse_jobid(args.jobid)
    eventlog = source.eventlog(jobid)
    workflow, note = _live_workflow(source, eventlog)
    view = build_status(jobid, eventlog, workflow, now, workflow_note=note)
    moved = copies(eventlog)
    released = _released(source, jobid, eventlog)
    if view.outcome == "COMPLETED" and release_failure(released):  # DataOut, after the release
        view = dataclasses.replace(view, outcome="FAILED")
    if args.json:
        show_json({**to_jsonable(view), "copies": moved, "release": released}, out)
    else:
        lines = render_status(view, prefix=f58_prefix(out), user_name=user_name)
        extra = render_release(released) if released is not None else []
        show("\n".join(lines + render_copies(moved) + extra), out)
    return 0


def _released(source: Source, jobid: int, eventlog: Sequence[Any]) -> dict[str, Any] | None:
    """How an early-released job's DataOut and Teardown ended (saved in its KVS), or None."""
    event = release_event(eventlog)
    if event is None:
        return None
    saved: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for state, key in KEYS:
        try:
            saved[state] = source.saved(jobid, key)
        except SourceError as exc:
            problems[state] = f"not read: {exc}"
    return release_view(event, saved, problems)


def logs(args: argparse.Namespace, source: Source, out: TextIO, now: float) -> int:
    jobid = parse_jobid(args.jobid)
    eventlog = source.eventlog(jobid)
    workflow, note = _live_workflow(source, eventlog)
    view = build_logs(jobid, eventlog, workflow, workflow_note=note)
    saved = read_saved(source.saved(jobid, OUTPUT_KEY))
    containers = events_named(eventlog, "dws-container")
    event = containers[-1] if containers else None
    if args.json:  # the saved logs whole (as bounded when saved), the rest to LINE_LIMIT
        output = to_jsonable(saved.to_json(), saved.text_limit) if saved is not None else None
        show_json({**to_jsonable(view), "output": output}, out, limit=None)
    else:
        prefix = f58_prefix(out)
        lines = render_logs(view, prefix=prefix) + render_output(jobid, saved, event, prefix=prefix)
        show("\n".join(lines), out)
    return 0


def parse_states(text: str | None) -> list[State] | None:
    """ "setup,PreRun" -> states; None for no filter; DwsError names an unknown word."""
    if not text:
        return None
    states = []
    for word in text.split(","):
        word = word.strip()
        match = [s for s in State if word.lower() in (s.key, s.value.lower())]
        if not match:
            known = ", ".join(s.value for s in State)
            raise DwsError(f"unknown state {word!r} in --state (known: {known})")
        states.append(match[0])
    return states


def list_(args: argparse.Namespace, source: Source, out: TextIO, now: float) -> int:
    fmt = LIST_FORMATS.get(args.format or "default", args.format)
    states = parse_states(args.state)
    if args.all:
        userids = None
    elif args.user:
        userids = None if args.user == "all" else [user_id(args.user)]
    else:
        userids = [os.getuid()]
    workflows, _ = source.kube().list_workflows()
    try:
        phases = {int(r["id"]): str(r.get("phase", "-")) for r in source.held_jobs()}
    except (SourceError, KeyError, TypeError, ValueError) as exc:
        log.debug("job phases not shown: %s", exc)
        phases = {}
    rows = filter_rows(
        list_rows(workflows, now, phases=phases, user_name=user_name),
        states=states,
        userids=userids,
    )
    if args.json:
        show_json({"workflows": [to_jsonable(r) for r in rows]}, out)
        return 0
    prefix = f58_prefix(out)
    records = [list_record(r, prefix=prefix) for r in rows]
    for line in format_table(records, fmt, LIST_FIELDS, header=not args.no_header):
        show_line(line, out)
    return 0


def cleanup(args: argparse.Namespace, source: Source, out: TextIO, now: float) -> int:
    """The orphan sweep: Teardown, then delete, each workflow of ours whose job is not held.

    Workflows are listed before held jobs: a workflow is only ever created for a job the
    plugin already holds, so a job seen held later cannot be one missed in between.
    """
    kube = source.kube()
    workflows, _ = kube.list_workflows()
    held = {int(r["id"]) for r in source.held_jobs() if r.get("phase") != "gone"}
    plan = plan_cleanup(workflows, held, source.identity)
    prefix = f58_prefix(out)
    if not plan:
        show_line(f"no orphaned workflows for instance {source.identity}", out)
        return 0
    if args.dry_run:
        for sweep in plan:
            show_line(f"would sweep {sweep.name} ({f58(sweep.jobid, prefix)}): {sweep.reason}", out)
        return 0
    return _sweep(plan, kube, out, prefix, timeout=args.timeout, force=args.force)


def _sweep(
    plan: Sequence[Sweep],
    kube: Any,
    out: TextIO,
    prefix: str,
    *,
    timeout: float,
    force: bool,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    pending: dict[str, Sweep] = {}
    failed = 0
    for sweep in plan:
        try:
            kube.set_desired_state(sweep.name, State.TEARDOWN, hurry=True)
            pending[sweep.name] = sweep
            log.info(
                "job %s: workflow %s: Teardown requested (orphan)", f58(sweep.jobid), sweep.name
            )
        except KubeError as exc:
            if exc.status == 404:
                show_line(f"{sweep.name}: already gone", out)
                continue
            failed += 1
            show_line(f"{sweep.name}: Teardown not requested: {exc}", out)
    deadline = clock() + timeout
    while pending:
        for name, sweep in list(pending.items()):
            outcome = _teardown_outcome(kube, name)
            if outcome is None and clock() < deadline:
                continue
            if outcome is None and not force:
                failed += 1
                show_line(
                    f"{name} ({f58(sweep.jobid, prefix)}): Teardown not done after"
                    f" {timeout:g}s; left in place (run again, or use --force to delete it)",
                    out,
                )
                del pending[name]
                continue
            try:
                kube.delete_workflow(name)
            except KubeError as exc:
                failed += 1
                show_line(f"{name}: not deleted: {exc}", out)
            else:
                done = outcome or f"Teardown not done after {timeout:g}s, deleted anyway"
                show_line(f"swept {name} ({f58(sweep.jobid, prefix)}): {done}", out)
            del pending[name]
        if pending:
            sleep(CLEANUP_POLL)
    return 1 if failed else 0


def _teardown_outcome(kube: Any, name: str) -> str | None:
    """How Teardown ended ("Teardown complete", "Teardown failed: ..."), None while running."""
    obj = kube.get_workflow(name)
    if obj is None:
        return "already gone"
    try:
        wf = view_workflow(obj)
    except DwsError as exc:
        return f"unreadable ({exc}), deleted"
    if wf.desired_state is not State.TEARDOWN:
        return None
    if wf.complete:
        return "Teardown complete, deleted"
    if wf.failed:
        return f"Teardown failed ({wf.user_message}), deleted"
    return None


def service(args: argparse.Namespace) -> int:
    rest = list(args.rest)
    return int(daemon.main(rest[1:] if rest[:1] == ["--"] else rest) or 0)
