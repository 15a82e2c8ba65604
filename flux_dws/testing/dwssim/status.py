# SPDX-License-Identifier: LGPL-3.0-only
"""The DWS workflow controller's own status rules, as pure functions on Workflow dicts.

These are the parts of a Workflow's status that DWS computes and no driver writes
(dws-api.md section 1): what a desiredState change resets, how driver entries roll up into
``status``/``message``/``ready``, and what ``forceReady`` does.  Each function takes a
Workflow and returns a changed copy, so the controller can compare before writing.  The copy
is new only where it changes (the top level, status, and spec for a state entry) and shares
the rest with its input, which is never changed: copying whole workflows was the simulator's
largest cost.
"""

from __future__ import annotations

import contextlib
import datetime
import re
from collections.abc import Mapping
from typing import Any

from flux_dws.core.states import Status

FORCED_READY_MESSAGE = "Forced Ready"

#: driver entry status -> rank; the highest rank decides status.status and status.message.
_PRIORITY = {
    Status.COMPLETED.value: 1,
    Status.DRIVER_WAIT.value: 2,
    "Pending": 2,
    "Queued": 2,
    "Running": 2,
    Status.TRANSIENT.value: 3,
    Status.ERROR.value: 4,
}
#: statuses a workflow takes over from its top driver entry; the rest read as DriverWait.
_PASSED_UP = (Status.COMPLETED.value, Status.TRANSIENT.value, Status.ERROR.value)

_MICRO_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_MICRO_RE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})\.([0-9]{6})Z\Z"
)

Workflow = dict[str, Any]


def micro_time(now: datetime.datetime) -> str:
    """A Kubernetes MicroTime ("2026-03-01T12:00:00.123456Z") for an aware datetime."""
    return now.astimezone(datetime.timezone.utc).strftime(_MICRO_FORMAT)


def parse_micro_time(text: object) -> datetime.datetime | None:
    """The datetime in a MicroTime or RFC 3339 Time string; None when there is none."""
    if not isinstance(text, str) or not text:
        return None
    exact = _MICRO_RE.match(text)  # what micro_time writes: no strptime (slow) needed
    if exact:
        with contextlib.suppress(ValueError):  # out-of-range fields: strptime decides
            fields = [int(part) for part in exact.groups()]
            return datetime.datetime(*fields, tzinfo=datetime.timezone.utc)
    for fmt in (_MICRO_FORMAT, "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.datetime.strptime(text, fmt).replace(tzinfo=datetime.timezone.utc)
        except ValueError:
            continue
    return None


def go_duration(seconds: float) -> str:
    """``seconds`` as Go prints a time.Duration rounded to the microsecond ("294.183ms").

    DWS writes elapsedTimeLastState this way, so a WLM that parses it must see this form.
    """
    ns = round(seconds * 1_000_000) * 1000
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return sign + _fraction(ns, 1000) + "µs"
    if ns < 1_000_000_000:
        return sign + _fraction(ns, 1_000_000) + "ms"
    hours, rest = divmod(ns, 3600 * 1_000_000_000)
    minutes, rest = divmod(rest, 60 * 1_000_000_000)
    text = f"{hours}h" if hours else ""
    if hours or minutes:
        text += f"{minutes}m"
    return sign + text + _fraction(rest, 1_000_000_000) + "s"


def _fraction(value: int, unit: int) -> str:
    whole, part = divmod(value, unit)
    digits = str(part).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


def enter_state(workflow: Mapping[str, Any], now: datetime.datetime) -> Workflow:
    """What DWS does when spec.desiredState differs from status.state."""
    wf, status = _with_own_status(workflow)
    wf["spec"] = dict(wf["spec"])
    status.update(
        state=wf["spec"]["desiredState"],
        ready=False,
        status=Status.DRIVER_WAIT.value,
        desiredStateChange=micro_time(now),
    )
    status.pop("message", None)  # DWS's field is omitempty: an empty message is absent
    wf["spec"]["forceReady"] = False
    return wf


def force_ready(workflow: Mapping[str, Any], now: datetime.datetime) -> Workflow:
    """spec.forceReady: the current state is ready whatever its drivers say."""
    wf, status = _with_own_status(workflow)
    status.update(ready=True, status=Status.COMPLETED.value, message=FORCED_READY_MESSAGE)
    _stamp_ready(status, now)
    return wf


def roll_up(workflow: Mapping[str, Any], now: datetime.datetime) -> Workflow:
    """Fold the driver entries of the current state into status, message and ready.

    As DWS's Workflow controller does it: a state that is ready stays ready (DWS stops looking
    once it is); one without driver entries is ready at once.  DWS sorts the entries by
    priority (its sort of a few entries keeps their order) and walks them, clearing ready at
    each incomplete one, until the first of a lower priority than the top (that one is still
    looked at for ready).  The *last* top entry with a message gives status.message as
    "DW Directive <index>: <message>", and the top status (DriverWait for the middle rank).
    """
    wf, status = _with_own_status(workflow)
    if status.get("ready") or not status.get("state"):
        return wf
    entries = [d for d in status.get("drivers") or [] if d.get("watchState") == status["state"]]
    ready, result, message = True, Status.COMPLETED.value, ""
    ranked = sorted(entries, key=_priority, reverse=True)  # stable, as DWS's is for few
    top = _priority(ranked[0]) if ranked else 0
    for entry in ranked:
        if not entry.get("completed"):
            ready = False
        if _priority(entry) < top:
            break
        if entry.get("message"):
            message = f"DW Directive {entry.get('dwdIndex', 0)}: {entry['message']}"
        lead_status = str(entry.get("status") or "")
        result = lead_status if lead_status in _PASSED_UP else Status.DRIVER_WAIT.value
    status.update(ready=ready, status=result, message=message)
    if not message:
        del status["message"]  # omitempty, as DWS writes it
    if ready:
        _stamp_ready(status, now)
    return wf


def _with_own_status(workflow: Mapping[str, Any]) -> tuple[Workflow, dict[str, Any]]:
    """A shallow copy of ``workflow`` whose status (a new dict, "{}" when there was none) is
    its own: these rules set only status's own fields."""
    wf = dict(workflow)
    status = dict(wf.setdefault("status", {}))
    wf["status"] = status
    return wf, status


def _priority(entry: Mapping[str, Any]) -> int:
    return _PRIORITY.get(str(entry.get("status") or ""), 2)


def _stamp_ready(status: dict[str, Any], now: datetime.datetime) -> None:
    status["readyChange"] = micro_time(now)
    since = parse_micro_time(status.get("desiredStateChange"))
    elapsed = (now - since).total_seconds() if since else 0.0
    status["elapsedTimeLastState"] = go_duration(max(elapsed, 0.0))
