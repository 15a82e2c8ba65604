# SPDX-License-Identifier: LGPL-3.0-only
"""What ``flux dws logs`` shows, as pure functions of what was read: what went wrong for a job,
as recorded on it (its container outcome, fatal exception, transient conditions, waits, a
failed Teardown) and as its live workflow's driver entries say.  Built from the same pieces as
``flux dws status`` (flux_dws.cli.views); the containers' saved output is
flux_dws.cli.recordviews.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flux_dws.cli.views import (
    Container,
    Event,
    Transient,
    container_outcome,
    event_context,
    events_named,
    fatal_exception,
    last_event,
    number_or_none,
    read_workflow,
)
from flux_dws.core.workflow import WorkflowView


@dataclass(frozen=True)
class DriverError:
    """A driver entry of the live workflow that reports trouble."""

    dwd_index: int
    state: str
    driver: str
    status: str
    message: str
    error: str


@dataclass(frozen=True)
class JobLogs:
    """What went wrong for a job, as recorded: the container outcome and driver errors."""

    jobid: int
    container: Container | None
    exception: Mapping[str, Any] | None = field(hash=False)
    transients: tuple[Transient, ...] = ()
    waiting: tuple[str, ...] = ()
    teardown_failed: str | None = None
    drivers: tuple[DriverError, ...] = ()
    workflow_note: str = ""

    @property
    def empty(self) -> bool:
        return not (
            self.container
            or self.exception
            or self.transients
            or self.waiting
            or self.teardown_failed
            or self.drivers
        )


def build_logs(
    jobid: int,
    eventlog: Sequence[Event],
    workflow: Mapping[str, Any] | None,
    *,
    workflow_note: str = "",
) -> JobLogs:
    wf, unreadable = read_workflow(workflow)
    transients = tuple(
        Transient(
            state=str(event_context(e).get("state", "")),
            since=number_or_none(event_context(e).get("since")),
            message=str(event_context(e).get("message") or ""),
            timestamp=number_or_none(e.get("timestamp")),
        )
        for e in events_named(eventlog, "dws-transient")
    )
    teardown = last_event(eventlog, "dws-teardown-failed")
    return JobLogs(
        jobid=jobid,
        container=container_outcome(jobid, eventlog, wf),
        exception=fatal_exception(eventlog),
        transients=transients,
        waiting=tuple(
            str(event_context(e).get("reason") or "") for e in events_named(eventlog, "dws-waiting")
        ),
        teardown_failed=str(event_context(teardown).get("reason") or "") if teardown else None,
        drivers=driver_errors(wf),
        workflow_note=unreadable or workflow_note,
    )


def driver_errors(wf: WorkflowView | None) -> tuple[DriverError, ...]:
    """Driver entries with an error or a non-running status other than Completed."""
    if wf is None:
        return ()
    return tuple(
        DriverError(
            dwd_index=d.dwd_index,
            state=d.watch_state.value if d.watch_state else "",
            driver=d.driver_id,
            status=d.status,
            message=d.message,
            error=d.error,
        )
        for d in wf.drivers
        if d.error or d.status in ("Error", "TransientCondition")
    )
