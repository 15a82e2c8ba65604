# SPDX-License-Identifier: LGPL-3.0-only
"""`flux dws status` without a job ID: the service's state at a glance.

Built from the dws plugin's ``list`` answer alone (doc/protocol.rst): its job records, and
what it knows of the service, which sends a report with every heartbeat.  So it works when
the service is down (it says so) and never needs Kubernetes.  Everything in the answer is
checked here: a field of the wrong type is shown as unknown, never a traceback.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from flux_dws.base import untrusted
from flux_dws.cli.views import format_duration
from flux_dws.core.health import hostlist
from flux_dws.core.states import State
from flux_dws.core.status import StateRow, job_summary

ERRORS_SHOWN = 5


@dataclass(frozen=True)
class ServiceStatus:
    """What the admin sees; ``--json`` prints it as it is."""

    service: str  # "active", "not running"
    pid: int | None = None
    host: str = ""
    up_since: float | None = None
    heard_ago: float | None = None  # seconds since its last heartbeat reached the plugin
    standbys: int = 0
    ready: bool = False
    api_reachable: bool | None = None  # None: unknown (no service report)
    api_down_since: float | None = None
    states: list[StateRow] = field(default_factory=list)
    errors: list[tuple[float, str]] = field(default_factory=list)
    drained: dict[str, str] = field(default_factory=dict)  # host -> reason, as Flux has it
    rabbits_down: dict[str, str] = field(default_factory=dict)  # rabbit -> why
    drift: dict[str, dict[str, int]] = field(default_factory=dict)  # rabbit -> bytes


def _names(value: Any) -> dict[str, str]:
    """A name -> text mapping from the report, each cut to one safe line."""
    return {
        untrusted.text(k, 64): untrusted.text(v, 200)
        for k, v in untrusted.mapping(value).items()
        if isinstance(k, str) and isinstance(v, str)
    }


def _drift(value: Any) -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {}
    for rabbit, entry in untrusted.mapping(value).items():
        entry = untrusted.mapping(entry)
        numbers = {k: untrusted.integer(entry.get(k), 0) for k in ("total", "expected", "free")}
        if isinstance(rabbit, str) and all(v is not None for v in numbers.values()):
            found[untrusted.text(rabbit, 64)] = numbers  # type: ignore[assignment]
    return found


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def build_service_status(answer: Mapping[str, Any], now: float) -> ServiceStatus:
    """The plugin's ``list`` answer -> ServiceStatus (pure)."""
    records = [r for r in answer.get("jobs") or [] if isinstance(r, Mapping)]
    states = sorted(job_summary(records, now), key=_order)
    service = answer.get("service")
    active = service.get("active") if isinstance(service, Mapping) else None
    standbys = service.get("standbys") if isinstance(service, Mapping) else 0
    standbys = untrusted.count(standbys) or 0
    if not isinstance(active, Mapping):
        return ServiceStatus("not running", standbys=standbys, states=states)
    report = active.get("report") if isinstance(active.get("report"), Mapping) else {}
    api = report.get("api") if isinstance(report.get("api"), Mapping) else {}
    errors = []
    for entry in report.get("errors") or []:
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], str):
            errors.append((_num(entry[0]) or 0.0, untrusted.text(entry[1].strip(), 300)))
    pid = active.get("pid")
    reachable = api.get("reachable")
    return ServiceStatus(
        service="active",
        pid=untrusted.integer(pid),
        host=untrusted.text(active.get("host") or "", 64),
        up_since=_num(report.get("started")) or _num(active.get("since")),
        heard_ago=_num(active.get("heard")),
        standbys=standbys,
        ready=report.get("ready") is True,
        api_reachable=reachable if isinstance(reachable, bool) else None,
        api_down_since=_num(api.get("since")),
        states=states,
        errors=errors[-ERRORS_SHOWN:],
        drained=_names(untrusted.mapping(report.get("rabbits")).get("drained")),
        rabbits_down=_names(untrusted.mapping(report.get("rabbits")).get("down")),
        drift=_drift(untrusted.mapping(report.get("rabbits")).get("drift")),
    )


def _order(row: StateRow) -> tuple[int, str]:
    """Lifecycle order; the phases without a workflow state first."""
    try:
        return (list(State).index(State.parse(row.state)) + 1, row.state)
    except ValueError:
        return (0, row.state)


def _clock(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(when))


def render_service_status(view: ServiceStatus, now: float, name: Callable[[int], str]) -> list[str]:
    """The text form; ``name`` renders a job ID (f58 or decimal, as the terminal wants)."""
    if view.service != "active":
        lines = ["service:  NOT RUNNING: no flux-dws service is connected; #DW jobs wait"]
    else:
        who = f"pid {view.pid}" + (f" on {view.host}" if view.host else "")
        since = f", up since {_clock(view.up_since)}" if view.up_since else ""
        lines = [f"service:  active, {who}{since}"]
        if view.heard_ago is not None:
            lines[0] += f"; last heartbeat {format_duration(view.heard_ago)} ago"
        if not view.ready:
            lines.append("          starting: not yet through its first reconcile")
    if view.standbys:
        lines.append(f"          {view.standbys} standby service(s) waiting")
    if view.api_reachable is True:
        lines.append("API:      reachable")
    elif view.api_reachable is False:
        since = view.api_down_since
        ago = f" since {_clock(since)} ({format_duration(now - since)})" if since else ""
        lines.append(f"API:      UNREACHABLE{ago}")
    else:
        lines.append("API:      unknown (no report from a service)")
    if not view.states:
        lines.append("jobs:     none held")
    else:
        lines.append("jobs:     STATE        JOBS  OLDEST          IN STATE  DEADLINE")
        for row in view.states:
            if row.deadline is None:
                deadline = "none"
            elif row.deadline <= now:
                deadline = f"PASSED {format_duration(now - row.deadline)} ago"
            else:
                deadline = f"in {format_duration(row.deadline - now)}"
            if row.overdue:
                deadline += f" ({row.overdue} past deadline)"
            lines.append(
                f"          {row.state:<12} {row.jobs:>4}  {name(row.oldest):<15} "
                f"{format_duration(now - row.since):>8}  {deadline}"
            )
    lines += _render_rabbits(view)
    if view.errors:
        lines.append("last errors:")
        lines += [f"  {_clock(when)}  {text}" for when, text in view.errors]
    return lines


def _render_rabbits(view: ServiceStatus) -> list[str]:
    """Down rabbits, capacity drift and drained nodes (grouped by reason, as a hostlist)."""
    lines = []
    for rabbit, why in sorted(view.rabbits_down.items()):
        lines.append(f"rabbit:   {rabbit} DOWN ({why}): no new job gets its storage")
    gib = 2**30
    for rabbit, d in sorted(view.drift.items()):
        missing = (d["expected"] - d["free"]) / gib
        lines.append(
            f"rabbit:   {rabbit} CAPACITY DRIFT: {missing:.1f} GiB less free than its Servers "
            f"explain (free {d['free'] / gib:.1f} GiB); kept from new jobs"
        )
    by_reason: dict[str, list[str]] = {}
    for host, reason in view.drained.items():
        by_reason.setdefault(reason, []).append(host)
    if by_reason:
        lines.append("drained:  NODES            REASON")
        for reason, hosts in sorted(by_reason.items()):
            lines.append(f"          {hostlist(hosts):<16} {reason or '(no reason)'}")
    return lines


def service_status_json(view: ServiceStatus) -> dict[str, Any]:
    return asdict(view)
