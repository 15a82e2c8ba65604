# SPDX-License-Identifier: LGPL-3.0-only
"""What ``flux dws status`` shows, as pure functions of what was read and the time; ``flux dws
logs`` is built from the same pieces (flux_dws.cli.logsview).

Every view is built from a job's eventlog (what flux-dws recorded on the job, doc/protocol.rst)
and, when it still exists, the job's Workflow object; nothing here reads a clock or does I/O,
so the commands and their tests see the same thing for the same inputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.errors import DwsError
from flux_dws.base.fsd import parse_fsd
from flux_dws.core.containeroutcome import ContainerState
from flux_dws.core.lifecycle import container_note
from flux_dws.core.messages import failure_note
from flux_dws.core.states import STATE_KEYS, State
from flux_dws.core.workflow import WorkflowView, view_workflow
from flux_dws.flux import results

Event = Mapping[str, Any]

#: Flux job states after each job-manager event that moves one (RFC 21).
_JOB_STATE_AFTER = {
    "submit": "NEW",
    "validate": "DEPEND",
    "depend": "PRIORITY",
    "priority": "SCHED",
    "alloc": "RUN",
    "finish": "CLEANUP",
    "clean": "INACTIVE",
}
_ACTIVE_BEFORE_CLEANUP = frozenset({"DEPEND", "PRIORITY", "SCHED", "RUN"})


# --------------------------------------------------------------------------- small helpers


def events_named(eventlog: Iterable[Event], name: str) -> list[Event]:
    return [e for e in eventlog if e.get("name") == name]


def event_context(event: Event | None) -> Mapping[str, Any]:
    ctx = (event or {}).get("context")
    return untrusted.mapping(ctx)


def last_event(eventlog: Sequence[Event], name: str) -> Event | None:
    found = events_named(eventlog, name)
    return found[-1] if found else None


def number_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _seconds(fsd: Any) -> float | None:
    try:
        return parse_fsd(fsd)
    except ValueError:
        return None


def _state(value: Any) -> State | None:
    try:
        return State.parse(value) if isinstance(value, str) else None
    except ValueError:
        return None


def fatal_exception(eventlog: Sequence[Event]) -> Mapping[str, Any] | None:
    """The context of the job's first fatal (severity 0) exception."""
    for event in events_named(eventlog, "exception"):
        if event_context(event).get("severity") == 0:
            return event_context(event)
    return None


def job_state(eventlog: Sequence[Event]) -> str:
    """The Flux job state the eventlog has reached (NEW ... INACTIVE)."""
    state = "NEW"
    for event in eventlog:
        name = event.get("name")
        if name == "exception" and event_context(event).get("severity") == 0:
            if state in _ACTIVE_BEFORE_CLEANUP:
                state = "CLEANUP"
        elif name in _JOB_STATE_AFTER:
            state = _JOB_STATE_AFTER[str(name)]
    return state


def job_result(eventlog: Sequence[Event]) -> str | None:
    """The result ``flux jobs`` shows for an inactive job; None while it is active."""
    if job_state(eventlog) != "INACTIVE":
        return None
    return results.job_result(eventlog)


def job_outcome(eventlog: Sequence[Event]) -> str | None:
    """What happened to an inactive job: Flux's result, except that a fatal exception raised
    after ``finish`` (a PostRun or DataOut failure) makes it FAILED; flux-core decides
    ``result`` at ``finish`` and cannot change it later (job-list's job_state.c)."""
    result = job_result(eventlog)
    if result == "COMPLETED" and fatal_exception(eventlog) is not None:
        return "FAILED"
    return result


def _job_end(eventlog: Sequence[Event]) -> float | None:
    """When the job stopped needing its workflow: the dws epilog's end, else ``clean``."""
    for event in reversed(eventlog):
        if event.get("name") in ("epilog-finish", "clean"):
            return number_or_none(event.get("timestamp"))
    return None


def read_workflow(obj: Mapping[str, Any] | None) -> tuple[WorkflowView | None, str]:
    """The workflow's view, or None and why it could not be read."""
    if obj is None:
        return None, ""
    try:
        return view_workflow(obj), ""
    except DwsError as exc:
        return None, f"unreadable workflow: {exc}"


# --------------------------------------------------------------------------- flux dws status


@dataclass(frozen=True)
class StateSpan:
    """One workflow state as the job lived it: from the service's ``dws-state`` events."""

    state: State
    start: float
    duration: float
    running: bool  # the state the workflow is in now (the job is still active)
    timeout: str | None  # the effective timeout as posted ("15m"), None for none
    deadline: float | None  # absolute; None for no timeout
    left: float | None  # deadline - now, for the running state only
    ready_at: float | None = None  # the workflow's readyChange, for the running state only


@dataclass(frozen=True)
class TimeoutLine:
    """One effective timeout and how much of it was used or is left."""

    key: str  # a TIMEOUT_KEY ("prerun", "transient") or "container-prerun"/"container-postrun"
    value: str  # as in effect, FSD
    progress: str  # "pending", "running", "done", "skipped", "active", "clear"
    used: float | None = None
    left: float | None = None


@dataclass(frozen=True)
class Container:
    """The job's container outcome and where it was read from."""

    state: str
    phase: str
    reason: str  # DWS's words, as DWS wrote them
    detail: str  # the driver's error, as DWS wrote it
    source: str  # "job" (the dws-container event) or "workflow" (the live object)
    #: a failure in the one form (flux_dws.core.messages), what the user reads first; ""
    #: when the containers did not fail
    note: str = ""


@dataclass(frozen=True)
class Transient:
    state: str
    since: float | None  # None once the condition cleared
    message: str
    timestamp: float | None = None


@dataclass(frozen=True)
class LiveWorkflow:
    """What the live Workflow object says right now."""

    name: str
    namespace: str
    desired_state: str
    state: str
    status: str
    ready: bool
    message: str
    deleting: bool


@dataclass(frozen=True)
class JobStatus:
    """Everything ``flux dws status`` shows for one job."""

    jobid: int
    userid: int | None
    job_state: str
    result: str | None
    workflow_name: str
    namespace: str
    current: str | None  # the last state flux-dws asked for
    timeline: tuple[StateSpan, ...]
    timeouts: tuple[TimeoutLine, ...]
    workflow: LiveWorkflow | None
    workflow_note: str  # why the live workflow is not shown, when it is not
    container: Container | None
    transient: Transient | None
    last_message: str
    exception: Mapping[str, Any] | None = field(hash=False)
    teardown_failed: str | None
    env: Mapping[str, str] = field(hash=False)
    tolerance: str | None = None  # dw_failure_tolerance asked for and what it was used for
    now: float = 0.0
    #: what happened: FAILED once a fatal exception came, even after ``finish`` (where
    #: flux-core's ``result`` still says COMPLETED); None while the job is active
    outcome: str | None = None


def timeline(eventlog: Sequence[Event], *, now: float, active: bool) -> tuple[StateSpan, ...]:
    """The states the service asked for, each with its start, duration and deadline.

    A repeated ``dws-state`` for the state already in force (a restarted service posting it
    again) keeps the first start and takes the later deadline.
    """
    entries: list[tuple[State, float, str | None, float | None]] = []
    for event in events_named(eventlog, "dws-state"):
        ctx = event_context(event)
        state, start = _state(ctx.get("state")), number_or_none(event.get("timestamp"))
        if state is None or start is None:
            continue
        timeout = ctx.get("timeout") if isinstance(ctx.get("timeout"), str) else None
        deadline = number_or_none(ctx.get("deadline"))
        if entries and entries[-1][0] is state:
            entries[-1] = (state, entries[-1][1], timeout, deadline)
        else:
            entries.append((state, start, timeout, deadline))
    end_of_job = None if active else (_job_end(eventlog) or now)
    spans = []
    for i, (state, start, timeout, deadline) in enumerate(entries):
        last = i == len(entries) - 1
        running = last and active
        if not last:
            end = entries[i + 1][1]
        else:
            end = now if active else max(end_of_job or start, start)
        spans.append(
            StateSpan(
                state=state,
                start=start,
                duration=max(0.0, end - start),
                running=running,
                timeout=timeout,
                deadline=deadline,
                left=(deadline - now) if running and deadline is not None else None,
            )
        )
    return tuple(spans)


def _with_ready(spans: tuple[StateSpan, ...], wf: WorkflowView | None) -> tuple[StateSpan, ...]:
    """Mark when the running state became ready, from the workflow's own timestamps."""
    if not spans or wf is None or not spans[-1].running:
        return spans
    last = spans[-1]
    if wf.state is last.state and wf.ready and wf.ready_change is not None:
        last = replace(last, ready_at=wf.ready_change)
    return (*spans[:-1], last)


def timeout_lines(
    eventlog: Sequence[Event], spans: Sequence[StateSpan], *, now: float, active: bool
) -> tuple[TimeoutLine, ...]:
    """The effective timeouts (``dws-workflow``, ``dws-proposal``) and what is left of each."""
    posted = event_context(last_event(eventlog, "dws-workflow")).get("timeouts")
    posted = untrusted.mapping(posted)
    by_state = {span.state: span for span in spans}
    lines = []
    for key in (*STATE_KEYS, *sorted(k for k in posted if k not in STATE_KEYS)):
        if key not in posted:
            continue
        value = str(posted[key])
        if key == "transient":
            lines.append(_transient_line(eventlog, value, spans, now=now, active=active))
            continue
        state = _state(key)
        span = by_state.get(state) if state is not None else None
        lines.append(_span_line(key, value, span, now=now, active=active))
    container = event_context(last_event(eventlog, "dws-proposal")).get("container_timeouts")
    if isinstance(container, Mapping):
        for key in sorted(container, key=lambda k: STATE_KEYS.index(k) if k in STATE_KEYS else 99):
            span = by_state.get(_state(key)) if _state(key) is not None else None
            lines.append(
                _span_line(f"container-{key}", str(container[key]), span, now=now, active=active)
            )
    return tuple(lines)


def _span_line(
    key: str, value: str, span: StateSpan | None, *, now: float, active: bool
) -> TimeoutLine:
    seconds = _seconds(value)
    if span is None:
        return TimeoutLine(key, value, "pending" if active else "skipped")
    if not span.running:
        return TimeoutLine(key, value, "done", used=span.duration)
    if span.left is not None and key in STATE_KEYS:
        left = span.left  # the service's own deadline is the one that counts
    else:
        left = None if seconds is None or math.isinf(seconds) else span.start + seconds - now
    return TimeoutLine(key, value, "running", used=span.duration, left=left)


def _transient_line(
    eventlog: Sequence[Event],
    value: str,
    spans: Sequence[StateSpan],
    *,
    now: float,
    active: bool,
) -> TimeoutLine:
    current = transient_condition(eventlog)
    seconds = _seconds(value)
    running = spans[-1] if spans and spans[-1].running else None
    if (
        active
        and current is not None
        and current.since is not None
        and running is not None
        and current.state == running.state.value
    ):
        used = now - current.since
        left = None if seconds is None or math.isinf(seconds) else current.since + seconds - now
        return TimeoutLine("transient", value, "active", used=used, left=left)
    return TimeoutLine("transient", value, "clear")


def transient_condition(eventlog: Sequence[Event]) -> Transient | None:
    event = last_event(eventlog, "dws-transient")
    if event is None:
        return None
    ctx = event_context(event)
    return Transient(
        state=str(ctx.get("state", "")),
        since=number_or_none(ctx.get("since")),
        message=str(ctx.get("message") or ""),
        timestamp=number_or_none(event.get("timestamp")),
    )


def container_outcome(
    jobid: int, eventlog: Sequence[Event], wf: WorkflowView | None
) -> Container | None:
    """The recorded outcome (``dws-container``), else what the live workflow says."""
    event = last_event(eventlog, "dws-container")
    if event is not None:
        ctx = event_context(event)
        state, phase = str(ctx.get("state", "")), str(ctx.get("phase") or "")
        reason = str(ctx.get("reason") or "")
        note = str(ctx.get("note") or "")
        if not note and _failed(state):  # recorded before the event carried its note
            started = state != ContainerState.START_FAILED.value
            note = failure_note(
                phase or (State.POSTRUN if started else State.PRERUN).value, reason, jobid
            )
        return Container(
            state=state,
            phase=phase,
            reason=reason,
            detail=str(ctx.get("detail") or ""),
            source="job",
            note=note,
        )
    if wf is not None and wf.container.state is not ContainerState.NONE:
        outcome = wf.container
        return Container(
            state=outcome.state.value,
            phase=outcome.phase.value if outcome.phase else "",
            reason=outcome.reason,
            detail=outcome.detail,
            source="workflow",
            note=container_note(jobid, wf) if outcome.state.is_failure else "",
        )
    return None


def _failed(state: str) -> bool:
    try:
        return ContainerState(state).is_failure
    except ValueError:
        return False


def last_message(eventlog: Sequence[Event], wf: WorkflowView | None) -> str:
    """The workflow's own message if it has one, else the latest one flux-dws recorded that
    no later state change has made stale (a TransientCondition, waiting for the service, a
    Teardown given up)."""
    if wf is not None and wf.user_message:
        return wf.user_message
    for event in reversed(eventlog):
        ctx = event_context(event)
        name = event.get("name")
        if name == "dws-transient":
            return str(ctx.get("message") or "") if ctx.get("since") is not None else ""
        if name in ("dws-waiting", "dws-teardown-failed"):
            return str(ctx.get("reason") or "")
        if name in ("dws-state", "dws-workflow"):
            return ""
    return ""


def build_status(
    jobid: int,
    eventlog: Sequence[Event],
    workflow: Mapping[str, Any] | None,
    now: float,
    *,
    workflow_note: str = "",
) -> JobStatus:
    """The status of one job from its eventlog and its Workflow object (None: not found or
    not looked up; ``workflow_note`` says why when it was not)."""
    state = job_state(eventlog)
    active = state != "INACTIVE"
    wf, unreadable = read_workflow(workflow)
    created = event_context(last_event(eventlog, "dws-workflow"))
    spans = _with_ready(timeline(eventlog, now=now, active=active), wf)
    submit = event_context(last_event(eventlog, "submit"))
    userid = submit.get("userid")
    env = event_context(last_event(eventlog, "dws-environment")).get("env")
    teardown = last_event(eventlog, "dws-teardown-failed")
    drained = event_context(teardown).get("drained")
    torn = str(event_context(teardown).get("reason") or "") if teardown else None
    if torn is not None and isinstance(drained, list) and drained:
        torn += f"; drained {','.join(map(str, drained))}"
    note = unreadable or workflow_note
    if wf is None and not note and created:
        note = "deleted" if not active else "not found"
    return JobStatus(
        jobid=jobid,
        userid=untrusted.integer(userid),
        job_state=state,
        result=job_result(eventlog),
        workflow_name=str(created.get("name") or (wf.name if wf else "")),
        namespace=str(created.get("namespace") or (wf.namespace if wf else "")),
        current=spans[-1].state.value if spans else None,
        timeline=spans,
        timeouts=timeout_lines(eventlog, spans, now=now, active=active),
        workflow=_live(wf),
        workflow_note=note,
        container=container_outcome(jobid, eventlog, wf),
        transient=transient_condition(eventlog),
        last_message=last_message(eventlog, wf),
        exception=fatal_exception(eventlog),
        teardown_failed=torn,
        env=dict(env) if isinstance(env, Mapping) else {},
        now=now,
        tolerance=tolerance_line(eventlog),
        outcome=job_outcome(eventlog),
    )


def tolerance_line(eventlog: Sequence[Event]) -> str | None:
    """``dw_failure_tolerance`` and the nodes it let the job go on without, or None (0)."""
    allowed = event_context(last_event(eventlog, "dws-workflow")).get("failure_tolerance")
    used = [event_context(e) for e in events_named(eventlog, "dws-tolerated")]
    if not used and not (isinstance(allowed, int) and allowed > 0):
        return None
    line = f"{allowed if isinstance(allowed, int) else '?'} node(s) allowed"
    nodes = event_context(last_event(eventlog, "dws-tolerated")).get("all")
    count = len(nodes) if isinstance(nodes, list) else 0
    line += f", {count} used"
    for ctx in used:
        names = ctx.get("nodes")
        if isinstance(names, list):
            line += f"; {ctx.get('state', '?')}: {','.join(map(str, names))}"
    return line


def _live(wf: WorkflowView | None) -> LiveWorkflow | None:
    if wf is None:
        return None
    return LiveWorkflow(
        name=wf.name,
        namespace=wf.namespace,
        desired_state=wf.desired_state.value,
        state=wf.state.value if wf.state else "",
        status=wf.status.value if wf.status else "",
        ready=wf.ready,
        message=wf.user_message,
        deleting=wf.deleting,
    )


# --------------------------------------------------------------------------- time, for people


def format_duration(seconds: float | None) -> str:
    """A short human duration ("0.35s", "4.2s", "3m12s", "2h05m", "3d04h"); "-" for None."""
    if seconds is None or math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return "inf" if seconds > 0 else "-inf"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 10:
        return f"{seconds:.2f}s" if seconds < 1 else f"{seconds:.1f}s"
    if seconds < 60:
        return f"{int(seconds)}s"
    if seconds < 3600:
        m, s = divmod(int(seconds), 60)
        return f"{m}m{s:02d}s"
    if seconds < 86400:
        h, rest = divmod(int(seconds), 3600)
        return f"{h}h{rest // 60:02d}m"
    d, rest = divmod(int(seconds), 86400)
    return f"{d}d{rest // 3600:02d}h"
