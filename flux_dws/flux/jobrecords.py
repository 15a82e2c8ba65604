# SPDX-License-Identifier: LGPL-3.0-only
"""The plugin's job records (doc/protocol.rst) -> JobView, as a pure function.

Everything flux-dws recorded on a job comes back in the record's ``dws`` table (the latest
context of each dws-* event), so a restarted service sees the same JobView as before.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.errors import RequestError
from flux_dws.base.frozen import Shared, share_strings
from flux_dws.core.containeroutcome import ContainerState
from flux_dws.core.failing import Refusal
from flux_dws.core.health import Failures
from flux_dws.core.jobview import JobException, JobPhase, JobView, ProposalInfo
from flux_dws.core.policy import Policy
from flux_dws.core.request import DwRequest, request_from_attributes
from flux_dws.core.states import State

#: Parts of a record that jobs of one shape hold alike: one copy between them
#: (share_alike).  Of the others, only empty lists and tables are shared.
_ALIKE = ("attributes", "resources")
_SHARED_LIMIT = 4096
_SHARED = Shared(_SHARED_LIMIT)
#: parse_request's answers: (id(attributes), id(policy), userid, owner_uid) ->
#: (attributes, policy, answer).
_REQUESTS: dict[tuple[int, int, int, int], tuple[Any, Policy, Any]] = {}


def share_alike(records: list[Any]) -> list[Any]:
    """``records`` (freshly decoded, not yet held) made to hold one copy of what they hold
    alike, in place: the text of each string (base.frozen.share_strings), and each part
    equal to another record's (the jobspec's resources and attributes, the tables the dws-*
    events record, timeouts and storage, and empty lists and tables); returns them.

    A part found shared is not walked again: its strings are shared already.  Held records
    are only read once shared: they are replaced, never changed in place
    (flux_dws.service.executor).  Saves about a kilobyte per held job (bench_reconcile)."""
    shared, intern = _SHARED.json, sys.intern
    for record in records:
        if type(record) is not dict:
            share_strings(record)
            continue
        for key, value in record.items():
            kind = type(value)
            if kind is str:
                record[key] = intern(value)
            elif kind is not dict and kind is not list:
                continue
            elif key == "dws" and kind is dict:
                _share_events(value)
            elif key in _ALIKE or not value:
                record[key] = shared(value, share_strings)
            else:  # hosts, rabbits and ssd paths differ from one allocated job to the next
                share_strings(value)
    return records


def _share_events(dws: dict[str, Any]) -> None:
    """share_alike for the record's ``dws`` table: each event's context."""
    shared, intern = _SHARED.json, sys.intern
    for name, context in dws.items():
        kind = type(context)
        if kind is str:
            dws[name] = intern(context)
        elif kind is list:
            share_strings(context)
        elif kind is dict:
            for key, value in context.items():
                kind = type(value)
                if kind is str:
                    context[key] = intern(value)
                elif kind is dict or (kind is list and not value):  # tables alike
                    context[key] = shared(value, share_strings)
                elif kind is list:  # needs, nodes: each job's own
                    share_strings(value)


def parse_request(
    record: Mapping[str, Any], policy: Policy, *, owner_uid: int
) -> tuple[DwRequest | None, str]:
    """The job's validated request, or None and why not (a job's attributes never change,
    so callers parse once per job).

    Jobs whose records share their attributes (share_alike) share one answer, parsed once:
    found by the attributes' identity, the cache holding them so that it cannot be reused."""
    attributes = record.get("attributes") or {}
    userid = int(record["userid"])
    key = (id(attributes), id(policy), userid, owner_uid)
    found = _REQUESTS.get(key)
    if found is not None and found[0] is attributes and found[1] is policy:
        return found[2]
    try:
        request = request_from_attributes(attributes, policy, userid=userid, owner_uid=owner_uid)
    except RequestError as exc:
        parsed: tuple[DwRequest | None, str] = (None, str(exc))
    else:
        parsed = (request, "" if request else "the job has no system.dw attribute")
    if len(_REQUESTS) >= _SHARED_LIMIT:
        _REQUESTS.clear()
    _REQUESTS[key] = (attributes, policy, parsed)
    return parsed


def job_view(
    record: Mapping[str, Any],
    parsed: tuple[DwRequest | None, str],
    *,
    groupid: int,
    proposal: ProposalInfo | None = None,
    failures: Failures | None = None,
    refusal: Refusal | None = None,
) -> JobView:
    """Build the lifecycle core's view of one job from its record and parsed request."""
    userid = int(record["userid"])
    request, request_error = parsed
    dws = record.get("dws") or {}
    state_event = dws.get("dws-state") or {}
    posted_state = _state(state_event.get("state"))
    return JobView(
        jobid=int(record["id"]),
        phase=JobPhase(record["phase"]),
        userid=userid,
        groupid=groupid,
        request=request,
        request_error=request_error,
        hosts=tuple(record.get("hosts") or ()),
        rabbits=_rabbits(record.get("rabbits")),
        resources=record.get("resources"),
        constraints=untrusted.mapping(record.get("attributes")).get("constraints"),
        started=bool(record.get("started")),
        exception=_exception(record.get("exception")),
        workflow_created="dws-workflow" in dws,
        proposal_recorded="dws-proposal" in dws,
        posted_state=posted_state,
        deadline=_number(state_event.get("deadline")) if posted_state else None,
        teardown_reason=_reason(state_event) if posted_state is State.TEARDOWN else "",
        transient=_transient(dws.get("dws-transient")),
        container_recorded=_container(dws.get("dws-container")),
        teardown_failed="dws-teardown-failed" in dws,
        tolerated=_nodes((dws.get("dws-tolerated") or {}).get("all")),
        copies_recorded=_copies(dws.get("dws-datamovement")),
        release=_mapping(dws.get("dws-release")),
        ssd=_paths(record.get("ssd")),
        proposal=proposal,
        failures=failures,
        refusal=refusal,
    )


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _paths(value: Any) -> tuple[str, ...]:
    """The job's ssd vertex paths (the plugin reads them from R's JGF); untrusted."""
    if not isinstance(value, list):
        return ()
    return tuple(sorted({v for v in value if isinstance(v, str) and v.startswith("/")}))


def _nodes(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(sorted({v for v in value if isinstance(v, str)}))


def _state(value: Any) -> State | None:
    try:
        return State.parse(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _reason(event: Mapping[str, Any]) -> str:
    return untrusted.field(event.get("reason"))


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _exception(value: Any) -> JobException | None:
    if not isinstance(value, Mapping):
        return None
    return JobException(
        type=str(value.get("type", "")),
        severity=int(value.get("severity", 0)),
        note=str(value.get("note", "")),
    )


def _transient(value: Any) -> tuple[State, float] | None:
    if not isinstance(value, Mapping):
        return None
    state, since = _state(value.get("state")), _number(value.get("since"))
    return (state, since) if state is not None and since is not None else None


def _copies(value: Any) -> tuple[State, int] | None:
    """(state, directive index) of the latest dws-datamovement event."""
    if not isinstance(value, Mapping):
        return None
    state, index = _state(value.get("state")), value.get("index")
    if state is None or not isinstance(index, int) or isinstance(index, bool):
        return None
    return state, index


def _container(value: Any) -> ContainerState | None:
    if not isinstance(value, Mapping):
        return None
    try:
        return ContainerState(value.get("state"))
    except ValueError:
        return None


def _rabbits(value: Any) -> tuple[tuple[str, str], ...]:
    """(host, rabbit) pairs from the record's rabbit -> [hosts] map; () when it has none."""
    if not isinstance(value, Mapping):
        return ()
    pairs = []
    for rabbit, hosts in sorted(value.items()):
        if isinstance(rabbit, str) and isinstance(hosts, list):
            pairs.extend((h, rabbit) for h in hosts if isinstance(h, str))
    return tuple(pairs)
