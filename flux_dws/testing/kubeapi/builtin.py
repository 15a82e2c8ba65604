# SPDX-License-Identifier: LGPL-3.0-only
"""The built-in (core/v1) kinds' Table columns and field selectors, as kube-apiserver has them.

Custom resources print the columns their CRD declares; built-in kinds have printers written in
code.  These follow the API server's printers for the few core kinds served here (pods,
secrets, events, namespaces): column names, priorities and how each cell is derived.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any


@dataclass(frozen=True)
class Column:
    """A Table column: an additionalPrinterColumn of a CRD, or a built-in kind's printer column.

    ``json_path`` is a dotted path from the object root (".status.state"); ``compute`` (for
    the built-in kinds, whose printers are code) derives the cell from the whole object.
    """

    name: str
    type: str  # string | boolean | integer | date
    json_path: str = ""
    description: str = ""
    priority: int = 0  # 0: always shown; 1: only with -o wide
    compute: Callable[[dict, datetime], Any] | None = None


_NONE = "<none>"


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp (seconds or microseconds), or None."""
    if not isinstance(value, str):
        return None
    for layout in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.%fZ"):
        try:
            return datetime.strptime(value, layout).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return None


def human_duration(seconds: float) -> str:
    """Age as the API server and kubectl print it ("45s", "3m12s", "5h", "2d3h")."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    s = max(s, 0)
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    years, days = hours // (24 * 365), (hours // 24) % 365
    return f"{years}y{days}d" if hours < 24 * 365 * 8 and days else f"{years}y"


def since(value: Any, now: datetime) -> str:
    """translateTimestampSince: the age of a timestamp, "<unknown>" without one."""
    then = parse_time(value)
    if then is None:
        return "<unknown>"
    return human_duration((now - then).total_seconds())


def _get(obj: Any, *path: str) -> Any:
    for step in path:
        obj = obj.get(step) if isinstance(obj, dict) else None
    return obj


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _age(obj: dict, now: datetime) -> str:
    return since(_get(obj, "metadata", "creationTimestamp"), now)


# ---- pods --------------------------------------------------------------------------------


def _pod_ready(obj: dict, now: datetime) -> str:
    total = len(_list(_get(obj, "spec", "containers")))
    ready = sum(1 for s in _list(_get(obj, "status", "containerStatuses")) if _get(s, "ready"))
    return f"{ready}/{total}"


def pod_status(obj: dict) -> str:
    """The STATUS cell: the phase, overridden by a reason, a container's state, or deletion."""
    reason = _get(obj, "status", "reason") or _get(obj, "status", "phase") or ""
    running = False
    for status in reversed(_list(_get(obj, "status", "containerStatuses"))):
        waiting = _get(status, "state", "waiting", "reason")
        terminated = _get(status, "state", "terminated")
        if waiting:
            reason = waiting
        elif isinstance(terminated, dict) and terminated.get("reason"):
            reason = terminated["reason"]
        elif isinstance(terminated, dict):
            if terminated.get("signal"):
                reason = f"Signal:{terminated['signal']}"
            else:
                reason = f"ExitCode:{terminated.get('exitCode', 0)}"
        elif _get(status, "ready") and _get(status, "state", "running") is not None:
            running = True
    if reason == "Completed" and running:
        reason = "Running"
    if _get(obj, "metadata", "deletionTimestamp"):
        reason = "Unknown" if _get(obj, "status", "reason") == "NodeLost" else "Terminating"
    return str(reason)


def _pod_restarts(obj: dict, now: datetime) -> Any:
    restarts, last = 0, None
    for status in _list(_get(obj, "status", "containerStatuses")):
        count = _get(status, "restartCount")
        restarts += count if isinstance(count, int) else 0
        finished = parse_time(_get(status, "lastState", "terminated", "finishedAt"))
        if finished is not None and (last is None or finished > last):
            last = finished
    if last is None:
        return restarts
    return f"{restarts} ({human_duration((now - last).total_seconds())} ago)"


def _pod_gates(obj: dict, now: datetime) -> str:
    gates = _list(_get(obj, "spec", "readinessGates"))
    if not gates:
        return _NONE
    conditions = {
        _get(c, "type"): _get(c, "status") for c in _list(_get(obj, "status", "conditions"))
    }
    ready = sum(1 for g in gates if conditions.get(_get(g, "conditionType")) == "True")
    return f"{ready}/{len(gates)}"


def _or_none(*path: str):
    return lambda obj, now: _get(obj, *path) or _NONE


POD_COLUMNS = (
    Column("Ready", "string", compute=_pod_ready),
    Column("Status", "string", compute=lambda obj, now: pod_status(obj)),
    Column("Restarts", "string", compute=_pod_restarts),
    Column("Age", "string", compute=_age),
    Column("IP", "string", priority=1, compute=_or_none("status", "podIP")),
    Column("Node", "string", priority=1, compute=_or_none("spec", "nodeName")),
    Column("Nominated Node", "string", priority=1, compute=_or_none("status", "nominatedNodeName")),
    Column("Readiness Gates", "string", priority=1, compute=_pod_gates),
)
POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)

# ---- secrets and namespaces --------------------------------------------------------------

SECRET_COLUMNS = (
    Column("Type", "string", compute=lambda obj, now: str(obj.get("type") or "")),
    Column(
        "Data",
        "string",
        compute=lambda obj, now: len(obj["data"]) if isinstance(obj.get("data"), dict) else 0,
    ),
    Column("Age", "string", compute=_age),
)
NAMESPACE_COLUMNS = (
    Column("Status", "string", compute=lambda obj, now: str(_get(obj, "status", "phase") or "")),
    Column("Age", "string", compute=_age),
)

# ---- events ------------------------------------------------------------------------------


def _first_seen(obj: dict, now: datetime) -> str:
    first = obj.get("firstTimestamp") or obj.get("eventTime")
    return since(first, now)


def _last_seen(obj: dict, now: datetime) -> str:
    series = obj.get("series")
    if isinstance(series, dict):
        return since(series.get("lastObservedTime"), now)
    if obj.get("lastTimestamp"):
        return since(obj["lastTimestamp"], now)
    return _first_seen(obj, now)


def _event_count(obj: dict, now: datetime) -> int:
    series = obj.get("series")
    count = series.get("count") if isinstance(series, dict) else obj.get("count")
    return count if isinstance(count, int) and count else 1


def _event_object(obj: dict, now: datetime) -> str:
    kind = str(_get(obj, "involvedObject", "kind") or "").lower()
    name = _get(obj, "involvedObject", "name")
    return f"{kind}/{name}" if name else kind


def _event_source(obj: dict, now: datetime) -> str:
    parts = [str(_get(obj, "source", "component") or obj.get("reportingComponent") or "")]
    host = _get(obj, "source", "host") or obj.get("reportingInstance")
    if host:
        parts.append(str(host))
    return ", ".join(parts)


def _text(*path: str):
    return lambda obj, now: str(_get(obj, *path) or "")


EVENT_COLUMNS = (
    Column("Last Seen", "string", compute=_last_seen),
    Column("Type", "string", compute=_text("type")),
    Column("Reason", "string", compute=_text("reason")),
    Column("Object", "string", compute=_event_object),
    Column("Subobject", "string", priority=1, compute=_text("involvedObject", "fieldPath")),
    Column("Source", "string", priority=1, compute=_event_source),
    Column("Message", "string", compute=lambda obj, now: str(obj.get("message") or "").strip()),
    Column("First Seen", "string", priority=1, compute=_first_seen),
    Column("Count", "string", priority=1, compute=_event_count),
    Column("Name", "string", priority=1, compute=_text("metadata", "name")),
)
EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)
#: field labels whose value is not found at their own path.
FIELD_PATHS = {"source": "source.component"}
