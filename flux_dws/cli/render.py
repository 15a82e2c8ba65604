# SPDX-License-Identifier: LGPL-3.0-only
"""Text for people and JSON for programs, from the views; pure, no colour, no TTY tricks.

Tables follow ``flux jobs``: a Python format string names the fields (``-o "{jobid} {state}"``),
the header is the same string filled with the column titles (keeping each field's alignment
and width), and ``--json`` prints the underlying values.

Everything ``flux dws`` prints leaves through :func:`show` (lines, each readable and at most
LINE_LIMIT long), :func:`show_line` (one such line) or :func:`show_json` (each string
readable and bounded), all through flux_dws.base.untrusted.readable (tests/test_sinks.py
holds every command to that).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any, Callable, TextIO

from flux_dws.base import untrusted
from flux_dws.base.errors import DwsError
from flux_dws.base.jobid import f58
from flux_dws.cli.inventory import ListRow
from flux_dws.cli.logsview import JobLogs
from flux_dws.cli.views import Container, JobStatus, format_duration
from flux_dws.core.messages import dws_reason

_FORMATTER = string.Formatter()
#: [[fill]align][sign][z][#][0][width][grouping][.precision][type] -> the parts a header keeps.
_SPEC = re.compile(
    r"^(?P<align>(.?[<>=^])?)[-+ ]?z?#?0?(?P<width>\d*)[,_]?(?P<precision>\.\d+)?[a-zA-Z%]?$"
)


_NUMERIC_TYPES = frozenset("bcdeEfFgGnoxX%")

LINE_LIMIT = untrusted.LINE_LIMIT

# --------------------------------------------------------------------------- the sinks


def show(text: str, file: TextIO) -> None:
    """Print what a command shows: it holds text from Kubernetes and users, so each line is
    made readable (every control character escaped: ESC ...) and cut to LINE_LIMIT; only the
    newlines between lines are kept."""
    print(
        "\n".join(untrusted.readable(line, LINE_LIMIT, lines=True) for line in text.split("\n")),
        file=file,
    )


def show_line(line: str, file: TextIO) -> None:
    """Print one line (a message, an error): its newlines are escaped too, so text from
    outside cannot start a line of its own; cut to LINE_LIMIT."""
    print(untrusted.readable(line, LINE_LIMIT), file=file)


def show_json(value: Any, file: TextIO, *, limit: int | None = LINE_LIMIT) -> None:
    """Print ``value`` as one line of JSON, each string readable and at most ``limit`` long
    (``None``: ``value``'s strings are bounded already, by :func:`to_jsonable`)."""
    print(dumps(value, limit=limit), file=file)


# --------------------------------------------------------------------------- tables


@dataclasses.dataclass(frozen=True)
class Column:
    title: str
    help: str


#: The fields ``flux dws list -o`` knows, their titles and meaning.
LIST_FIELDS: Mapping[str, Column] = {
    "jobid": Column("JOBID", "job ID (f58)"),
    "jobid_dec": Column("JOBID", "job ID (decimal)"),
    "name": Column("WORKFLOW", "workflow name"),
    "namespace": Column("NAMESPACE", "workflow namespace"),
    "user": Column("USER", "job owner's name"),
    "userid": Column("UID", "job owner's uid"),
    "state": Column("STATE", "workflow state (status.state)"),
    "desired": Column("DESIRED", "desiredState"),
    "status": Column("STATUS", "workflow status (Completed, DriverWait, ...)"),
    "ready": Column("READY", "the state is ready"),
    "age": Column("AGE", "time since the workflow was created"),
    "age_s": Column("AGE", "the same, seconds"),
    "in_state": Column("IN-STATE", "time since the state was asked for"),
    "in_state_s": Column("IN-STATE", "the same, seconds"),
    "phase": Column("PHASE", "where the dws plugin holds the job (depend ... epilog)"),
    "message": Column("MESSAGE", "the workflow's message"),
}
LIST_FORMATS: Mapping[str, str] = {
    "default": "{jobid:>12} {user:<8.8} {state:<8} {status:<18} {age:>7} {in_state:>8}",
    "long": (
        "{jobid:>12} {user:<8.8} {phase:<7} {desired:<8} {state:<8} {status:<18}"
        " {ready:<5} {age:>7} {in_state:>8} {message}"
    ),
}


def parse_format(fmt: str, known: Mapping[str, Column]) -> list[tuple[str, str | None, str, str]]:
    """Split ``fmt`` into (literal, field, spec, conversion); DwsError names a bad field."""
    try:
        parts = list(_FORMATTER.parse(fmt))
    except ValueError as exc:
        raise DwsError(f"invalid format {fmt!r}: {exc}") from None
    out = []
    for literal, name, spec, conversion in parts:
        if name is not None:
            if name not in known:
                raise DwsError(f"unknown field {name!r} in format (known: {', '.join(known)})")
            if conversion not in (None, "s", "r", "a"):
                raise DwsError(f"invalid conversion '!{conversion}' for field {name!r}")
            if "{" in (spec or ""):
                raise DwsError(f"nested fields are not supported in the spec of {name!r}")
        out.append((literal, name, spec or "", conversion or ""))
    return out


def _header_spec(spec: str) -> str:
    """What of a field's spec applies to its title: alignment and width, and truncation for
    text.  A number's title is right-aligned unless the spec aligns it, as numbers are."""
    match = _SPEC.match(spec)
    if not match:
        return ""
    numeric = spec[-1:] in _NUMERIC_TYPES
    align = match.group("align") or (">" if numeric and match.group("width") else "")
    precision = "" if numeric else match.group("precision") or ""
    return f"{align}{match.group('width')}{precision}"


def format_table(
    records: Sequence[Mapping[str, Any]],
    fmt: str,
    known: Mapping[str, Column],
    *,
    header: bool = True,
) -> list[str]:
    """Lines of a table: the header (unless ``header`` is false), then one per record."""
    parts = parse_format(fmt, known)
    lines = []
    if header:
        titles = {name: col.title for name, col in known.items()}
        lines.append(_line(parts, titles, header=True))
    lines.extend(_line(parts, record, header=False) for record in records)
    return lines


def _line(
    parts: Sequence[tuple[str, str | None, str, str]], values: Mapping[str, Any], *, header: bool
) -> str:
    out = []
    for literal, name, spec, conversion in parts:
        out.append(literal)
        if name is None:
            continue
        value = values.get(name)
        if header:
            out.append(format(str(value), _header_spec(spec)))
            continue
        if conversion:
            value = _FORMATTER.convert_field(value, conversion)
        try:
            out.append(format(value, spec))
        except (ValueError, TypeError):
            if value is None:
                out.append(format("-", _header_spec(spec)))
            else:
                raise DwsError(
                    f"invalid format spec ':{spec}' for field {name!r} (value {value!r})"
                ) from None
    return untrusted.text("".join(out).rstrip(), LINE_LIMIT)


def list_record(row: ListRow, *, prefix: str = "ƒ") -> dict[str, Any]:
    """The values ``-o`` fields take for one row (durations as text, ``*_s`` in seconds)."""
    return {
        "jobid": f58(row.jobid, prefix) if row.jobid >= 0 else "?",
        "jobid_dec": row.jobid,
        "name": row.name,
        "namespace": row.namespace,
        "user": row.user,
        "userid": row.userid,
        "state": row.state,
        "desired": row.desired,
        "status": row.status,
        "ready": "yes" if row.ready else "no",
        "age": format_duration(row.age),
        "age_s": row.age,
        "in_state": format_duration(row.in_state),
        "in_state_s": row.in_state,
        "phase": row.phase,
        "message": row.message,
    }


# --------------------------------------------------------------------------- JSON


def to_jsonable(value: Any, limit: int | None = LINE_LIMIT) -> Any:
    """Dataclasses, enums, mappings and infinities as plain JSON values (inf -> null), each
    string (keys too) readable and at most ``limit`` long (newlines kept: JSON escapes them).
    ``None``: not cut again (strings bounded already)."""
    if isinstance(value, str):
        return untrusted.readable(value, limit, lines=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_jsonable(getattr(value, f.name), limit) for f in dataclasses.fields(value)
        }
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value, limit)
    if isinstance(value, Mapping):
        return {untrusted.readable(k, limit): to_jsonable(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v, limit) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(value: Any, *, limit: int | None = LINE_LIMIT) -> str:
    """``value`` as one line of JSON (:func:`to_jsonable`: strings readable and bounded)."""
    return json.dumps(to_jsonable(value, limit), separators=(",", ":"))


# --------------------------------------------------------------------------- status and logs


def clock(timestamp: float | None, *, date: bool = False) -> str:
    """A local wall-clock time to the millisecond ("14:03:07.215", with the date if asked)."""
    if timestamp is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S.%f" if date else "%H:%M:%S.%f")
    return text[:-3]


def _pairs(pairs: Sequence[tuple[str, str]]) -> list[str]:
    width = max((len(k) for k, _ in pairs), default=0)
    return [f"{k:<{width}}  {untrusted.text(v, LINE_LIMIT)}".rstrip() for k, v in pairs]


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns sized to their widest cell."""
    rows = [[untrusted.text(c, LINE_LIMIT) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


def render_status(
    status: JobStatus, *, prefix: str = "ƒ", user_name: Callable[[int], str] = str
) -> list[str]:
    """``flux dws status``: the job, its workflow's timeline, timeouts, outcome, message."""
    job = f"{f58(status.jobid, prefix)} ({status.jobid})"
    state = status.job_state + (f" ({status.outcome or status.result})" if status.result else "")
    if status.outcome and status.outcome != status.result:
        state += f"; flux jobs shows {status.result}: the failure came after the tasks ended"
    head: list[tuple[str, str]] = [("JOB", job), ("STATE", state)]
    if status.userid is not None:
        head.append(("USER", f"{user_name(status.userid)} ({status.userid})"))
    if status.workflow_name:
        where = f"{status.namespace}/{status.workflow_name}" if status.namespace else ""
        head.append(("WORKFLOW", where or status.workflow_name))
    else:
        head.append(("WORKFLOW", "none created"))
    live = status.workflow
    if live is not None:
        bits = [f"desiredState {live.desired_state}", f"state {live.state or '-'}"]
        bits.append(f"status {live.status or '-'}")
        bits.append("ready" if live.ready else "not ready")
        if live.deleting:
            bits.append("being deleted")
        head.append(("LIVE", ", ".join(bits)))
    elif status.workflow_note:
        head.append(("LIVE", status.workflow_note))
    lines = _pairs(head)

    if status.timeline:
        rows = [["STATE", "START", "DURATION", "TIMEOUT", "DEADLINE", "LEFT"]]
        for i, span in enumerate(status.timeline):
            duration = format_duration(span.duration)
            if span.running:
                duration += " (ready)" if span.ready_at is not None else " (running)"
            rows.append(
                [
                    span.state.value,
                    clock(span.start, date=i == 0),
                    duration,
                    span.timeout or "none",
                    clock(span.deadline) if span.deadline is not None else "-",
                    _left(span.left) if span.running else "-",
                ]
            )
        lines += ["", *_columns(rows)]

    if status.timeouts:
        rows = [["TIMEOUT", "VALUE", "PROGRESS", "USED", "LEFT"]]
        for t in status.timeouts:
            rows.append([t.key, t.value, t.progress, format_duration(t.used), _left(t.left)])
        lines += ["", *_columns(rows)]

    tail: list[tuple[str, str]] = []
    c = status.container
    if c is not None:
        where = f" in {c.phase}" if c.phase else ""
        said = f": {c.reason}" if c.reason else ""
        tail.append(("CONTAINER", c.note or f"{c.state}{where}{said}"))
        if c.detail:
            tail.append(("DETAIL", container_detail(c)))
    t = status.transient
    if t is not None and t.since is not None:
        tail.append(("TRANSIENT", f"{t.state} since {clock(t.since)}: {t.message}"))
    if status.last_message:
        tail.append(("MESSAGE", status.last_message))
    if status.exception:
        exc = status.exception
        tail.append(("EXCEPTION", f"{exc.get('type', '?')}: {exc.get('note', '')}"))
    if status.tolerance is not None:
        tail.append(("TOLERANCE", status.tolerance))
    if status.teardown_failed is not None:
        tail.append(("TEARDOWN", status.teardown_failed))
    if tail:
        lines += ["", *_pairs(tail)]
    return lines


def container_detail(c: Container) -> str:
    """The driver's error after a container failure's note: DWS's words without the
    ``<Type> error:`` DWS puts first (the note says what failed; this says how)."""
    return dws_reason(c.detail) if c.note else c.detail


def _left(left: float | None) -> str:
    if left is None:
        return "-"
    if left < 0:
        return f"overdue by {format_duration(-left)}"
    return format_duration(left)


def render_logs(logs: JobLogs, *, prefix: str = "ƒ") -> list[str]:
    """``flux dws logs``: the saved container outcome, exception, conditions, driver errors."""
    job = f58(logs.jobid, prefix)
    if logs.empty:
        line = f"{job}: no container outcome or driver errors recorded"
        return [line + (f" ({logs.workflow_note})" if logs.workflow_note else "")]
    lines = []
    c = logs.container
    if c is not None:
        where = f" in {c.phase}" if c.phase else ""
        lines.append(f"{job}: container {c.note or c.state + where}")
        if c.reason and not c.note:
            lines.append(f"  reason: {c.reason}")
        if c.detail:
            lines.append(f"  detail: {container_detail(c)}")
    if logs.exception:
        exc = logs.exception
        lines.append(f"{job}: exception {exc.get('type', '?')}: {exc.get('note', '')}")
    for t in logs.transients:
        when = clock(t.timestamp)
        if t.since is None:
            lines.append(f"{job}: {when} {t.state} TransientCondition cleared")
        else:
            lines.append(f"{job}: {when} {t.state} TransientCondition: {t.message}")
    for reason in logs.waiting:
        lines.append(f"{job}: waited: {reason}")
    if logs.teardown_failed is not None:
        lines.append(f"{job}: {logs.teardown_failed}")
    for d in logs.drivers:
        lines.append(
            f"{job}: driver {d.driver or '?'} directive {d.dwd_index} {d.state} {d.status}:"
            f" {d.message}" + (f" [{d.error}]" if d.error and d.error != d.message else "")
        )
    if logs.workflow_note:
        lines.append(f"{job}: live workflow: {logs.workflow_note}")
    return [untrusted.text(line, LINE_LIMIT) for line in lines]
