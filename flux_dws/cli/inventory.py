# SPDX-License-Identifier: LGPL-3.0-only
"""This instance's workflows as ``flux dws list`` shows them, and the orphan sweep's plan.

Pure functions of the listed Workflow objects (and the jobs the dws plugin holds); the caller
lists them with KubeClient.list_workflows, which already selects this instance's label, and the
sweep plan checks that label again, with the job ID and the name, before naming anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Callable

from flux_dws.base import untrusted
from flux_dws.base.errors import DwsError
from flux_dws.cli.views import read_workflow
from flux_dws.core.states import State
from flux_dws.core.workflow import parse_time

# --------------------------------------------------------------------------- flux dws list


@dataclass(frozen=True)
class ListRow:
    """One workflow in ``flux dws list``; the fields ``-o`` may name."""

    jobid: int
    name: str
    namespace: str
    userid: int | None
    user: str
    state: str
    desired: str
    status: str
    ready: bool
    age: float | None
    in_state: float | None
    phase: str
    message: str


def list_rows(
    workflows: Iterable[Mapping[str, Any]],
    now: float,
    *,
    phases: Mapping[int, str] | None = None,
    user_name: Callable[[int], str] = str,
) -> list[ListRow]:
    """One row per workflow, newest job first; ``phases``: jobid -> where the plugin holds it.

    A workflow that cannot be read still gets a row (state "?", the problem as its message):
    a list that hides what it cannot parse hides exactly what an admin needs to see.
    """
    rows = []
    for obj in workflows:
        wf, problem = read_workflow(obj)
        meta = untrusted.mapping(obj.get("metadata"))
        uid = untrusted.mapping(obj.get("spec")).get("userID")
        userid = untrusted.integer(uid)
        jobid = _jobid(obj)
        created = _created(meta)
        since = wf.desired_state_change if wf is not None else None
        rows.append(
            ListRow(
                jobid=-1 if jobid is None else jobid,
                name=str(meta.get("name", "")),
                namespace=str(meta.get("namespace", "")),
                userid=userid,
                user="-" if userid is None else user_name(userid),
                state=(wf.state or wf.desired_state).value if wf else "?",
                desired=wf.desired_state.value if wf else "?",
                status=(wf.status.value if wf.status else "-") if wf else "?",
                ready=bool(wf and wf.ready),
                age=None if created is None else max(0.0, now - created),
                in_state=None if since is None else max(0.0, now - since),
                phase=(phases or {}).get(jobid, "-") if jobid is not None else "-",
                message=wf.user_message if wf else problem,
            )
        )
    rows.sort(key=lambda r: r.jobid, reverse=True)
    return rows


def _created(meta: Mapping[str, Any]) -> float | None:
    try:
        return parse_time(meta.get("creationTimestamp"))
    except DwsError:
        return None


def filter_rows(
    rows: Iterable[ListRow],
    *,
    states: Iterable[State] | None = None,
    userids: Iterable[int] | None = None,
) -> list[ListRow]:
    """Rows whose state is one of ``states`` and whose owner is one of ``userids`` (None: any)."""
    wanted_states = None if states is None else {s.value for s in states}
    wanted_users = None if userids is None else set(userids)
    return [
        r
        for r in rows
        if (wanted_states is None or r.state in wanted_states)
        and (wanted_users is None or r.userid in wanted_users)
    ]


# --------------------------------------------------------------------------- flux dws cleanup


def _jobid(obj: Mapping[str, Any]) -> int | None:
    """spec.jobID as a number (DWS stores it as int-or-string)."""
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    value = spec.get("jobID") if isinstance(spec, Mapping) else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return untrusted.decimal(value)
