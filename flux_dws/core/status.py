# SPDX-License-Identifier: LGPL-3.0-only
"""Service health at a glance: pure summaries of job records and of the service's report.

Used by ``flux dws status`` without a job ID (the admin's view) and by the metrics (jobs past
their deadline).  Records are doc/protocol.rst's job records; nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flux_dws.base.fsd import parse_fsd


@dataclass(frozen=True)
class StateRow:
    """Jobs in one workflow state (the state flux-dws asked for), or in one phase before their
    workflow was asked for anything (``state`` then reads ``(depend)``, ``(sched)``...)."""

    state: str
    jobs: int
    oldest: int  # the job that has been in this state longest
    since: float  # when it entered it (epoch seconds)
    deadline: float | None  # its deadline in that state (None: no limit)
    overdue: int  # jobs of this row past their deadline


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _entered(record: Mapping[str, Any]) -> tuple[str, float, float | None]:
    """(row label, since, deadline) for one record."""
    dws = record.get("dws")
    posted = dws.get("dws-state") if isinstance(dws, Mapping) else None
    if isinstance(posted, Mapping) and isinstance(posted.get("state"), str):
        deadline = _number(posted.get("deadline"))
        try:
            timeout = parse_fsd(posted.get("timeout"))
        except (ValueError, TypeError):
            timeout = math.inf
        since = deadline - timeout if deadline is not None and math.isfinite(timeout) else None
        if since is None:
            since = _number(record.get("t_submit")) or 0.0
        return posted["state"], since, deadline
    return f"({record.get('phase', '?')})", _number(record.get("t_submit")) or 0.0, None


def job_summary(records: Iterable[Mapping[str, Any]], now: float) -> list[StateRow]:
    """One row per state, in the order states are first met; the oldest job of each."""
    rows: dict[str, list[Any]] = {}
    for record in records:
        if record.get("phase") == "gone":
            continue
        label, since, deadline = _entered(record)
        late = 1 if deadline is not None and now >= deadline else 0
        jobid = int(record.get("id", 0))
        row = rows.get(label)
        if row is None:
            rows[label] = [1, jobid, since, deadline, late]
            continue
        row[0] += 1
        row[4] += late
        if since < row[2]:
            row[1:4] = [jobid, since, deadline]
    return [StateRow(label, *values) for label, values in rows.items()]
