# SPDX-License-Identifier: LGPL-3.0-only
"""NnfDataMovement objects -> one record per copy directive (pure).

nnf-sos creates the data-movement objects of a ``copy_in`` (DataIn) or ``copy_out`` (DataOut)
directive: one in ``nnf-dm-system`` for Lustre, or one per rabbit (in the rabbit's own
namespace) for XFS and GFS2.  Each carries the workflow's labels, ``dm.cray.hpe.com/initiator``
(the directive's command) and ``nnf.cray.hpe.com/directive_index``; nnf-dm writes its status
(``state`` Starting/Running/Finished, ``status`` Success/Failed/Invalid/Cancelled, ``message``,
``startTime``/``endTime`` and the parsed ``dcp`` figures in ``commandStatus``).  They live until
Teardown, so flux-dws reads them once the state is complete or failed, before asking for the
next one, and writes what it found on the job as ``dws-datamovement`` events.

Everything read here came from Kubernetes and is untrusted: a field of the wrong type is
ignored, text is bounded, and nothing raises.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flux_dws.base import untrusted
from flux_dws.core.messages import failure_note
from flux_dws.core.states import State
from flux_dws.core.workflow import parse_time

INITIATOR_LABEL = "dm.cray.hpe.com/initiator"
DIRECTIVE_INDEX_LABEL = "nnf.cray.hpe.com/directive_index"
WORKFLOW_NAME_LABEL = "dataworkflowservices.github.io/workflow.name"
WORKFLOW_NAMESPACE_LABEL = "dataworkflowservices.github.io/workflow.namespace"

#: The copy command each data-movement state runs.
COPY_COMMANDS: Mapping[State, str] = {State.DATAIN: "copy_in", State.DATAOUT: "copy_out"}
EVENT = "dws-datamovement"

SUCCESS = "Success"
FINISHED = "Finished"
UNKNOWN = "Unknown"
#: Worst first: the status a directive gets when its objects disagree.
_STATUS_RANK = ("Failed", "Invalid", "Cancelled", UNKNOWN, SUCCESS)
MESSAGE_LIMIT = 2048  # characters of status.message kept in the event
ERROR_LIMIT = 300  # characters of the first error kept in the job's exception note
_EXIT_STATUS = re.compile(r"^\s*exit status \d+:\s*")
_BYTES = re.compile(r"\((\d+) bytes\)")
_ERROR_LINE = re.compile(r"\b(error|failed|cannot|could not|no such|denied|invalid)\b", re.I)
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class CopyRecord:
    """What became of one copy directive (all its NnfDataMovement objects together)."""

    index: int
    directive: str
    state: State  # DataIn or DataOut
    dm_state: str  # Starting | Running | Finished ("" when nothing was found)
    status: str  # Success | Failed | Invalid | Cancelled | Unknown
    message: str = ""
    progress: int | None = None  # percent, the least advanced object's
    items: int | None = None
    directories: int | None = None
    files: int | None = None
    links: int | None = None
    bytes: int | None = None
    data: str = ""  # dcp's own words, e.g. "18.626 GiB (20000000000 bytes)"
    rate: str = ""
    elapsed: float | None = None  # seconds, the slowest object's
    movements: int = 0  # NnfDataMovement objects found

    @property
    def failed(self) -> bool:
        return self.status != SUCCESS

    def to_event(self) -> dict[str, Any]:
        """The ``dws-datamovement`` context (a user reads it in the eventlog)."""
        return {
            "state": self.state.value,
            "index": self.index,
            "directive": self.directive,
            "dm_state": self.dm_state,
            "status": self.status,
            "message": self.message,
            "progress": self.progress,
            "items": self.items,
            "directories": self.directories,
            "files": self.files,
            "links": self.links,
            "bytes": self.bytes,
            "data": self.data,
            "rate": self.rate,
            "elapsed": self.elapsed,
            "movements": self.movements,
        }


def copy_directives(directives: Sequence[str], state: State) -> list[tuple[int, str]]:
    """(index, text) of the directives whose data moves in ``state`` (none outside DataIn and
    DataOut)."""
    command = COPY_COMMANDS.get(state)
    if command is None:
        return []
    return [
        (i, text)
        for i, text in enumerate(directives)
        if isinstance(text, str) and text.split()[:2] == ["#DW", command]
    ]


def pending_copies(
    directives: Sequence[str], state: State, recorded: tuple[State, int] | None
) -> tuple[int, ...]:
    """Indices of ``state``'s copy directives not yet recorded on the job.

    ``recorded`` is (state, index) of the latest ``dws-datamovement`` event: records are posted
    in directive order, DataIn before DataOut, so everything up to it is on the job already.
    """
    indices = [i for i, _ in copy_directives(directives, state)]
    if recorded is None:
        return tuple(indices)
    done_state, done_index = recorded
    if done_state.index > state.index:
        return ()
    if done_state is state:
        return tuple(i for i in indices if i > done_index)
    return tuple(indices)


def copy_records(
    state: State,
    directives: Sequence[str],
    objects: Iterable[Any],
    *,
    problem: str = "",
) -> list[CopyRecord]:
    """One record per copy directive of ``state``, from the workflow's NnfDataMovements.

    ``problem``: why the objects could not be read (every record then says so).  Objects of
    other directives, states or initiators (copy-offload requests from the job) are ignored.
    """
    command = COPY_COMMANDS.get(state)
    by_index: dict[int, list[Mapping[str, Any]]] = {}
    for obj in objects:
        if not isinstance(obj, Mapping):
            continue
        labels = untrusted.mapping(untrusted.mapping(obj.get("metadata")).get("labels"))
        if labels.get(INITIATOR_LABEL) != command:
            continue
        index = _index(labels.get(DIRECTIVE_INDEX_LABEL))
        if index is not None:
            by_index.setdefault(index, []).append(obj)
    records = []
    for index, text in copy_directives(directives, state):
        found = sorted(by_index.get(index, []), key=lambda o: untrusted.name_of(o, namespaced=True))
        records.append(_record(state, index, text, found, problem))
    return records


def _record(
    state: State, index: int, text: str, found: list[Mapping[str, Any]], problem: str
) -> CopyRecord:
    if not found:
        why = problem or "no NnfDataMovement was found for this directive"
        return CopyRecord(index, text, state, "", UNKNOWN, untrusted.field(why, MESSAGE_LIMIT))
    statuses = [untrusted.mapping(o.get("status")) for o in found]
    commands = [untrusted.mapping(s.get("commandStatus")) for s in statuses]
    states = [untrusted.field(s.get("state")) for s in statuses]
    if all(s == FINISHED for s in states):
        dm_state = FINISHED
        given = [untrusted.field(s.get("status")) or UNKNOWN for s in statuses]
        status = min(given, key=lambda s: _STATUS_RANK.index(s) if s in _STATUS_RANK else 3)
    else:
        dm_state = next((s for s in ("Running", "Starting") if s in states), states[0] or "")
        status = UNKNOWN
    failing = [s for s in statuses if untrusted.field(s.get("status")) not in ("", SUCCESS)]
    messages = [untrusted.field(s.get("message")) for s in (failing or statuses)]
    message = next((m for m in messages if m), "")
    if status == UNKNOWN and not message:
        message = f"data movement still {dm_state or 'not started'} when {state.value} ended"
    total_bytes = _sum(_bytes(untrusted.field(c.get("data"))) for c in commands)
    single = commands[0] if len(commands) == 1 else {}
    return CopyRecord(
        index=index,
        directive=text,
        state=state,
        dm_state=dm_state,
        status=status,
        message=untrusted.field(message, MESSAGE_LIMIT),
        progress=_least(untrusted.count(c.get("progress")) for c in commands),
        items=_sum(untrusted.count(c.get("items")) for c in commands),
        directories=_sum(untrusted.count(c.get("directories")) for c in commands),
        files=_sum(untrusted.count(c.get("files")) for c in commands),
        links=_sum(untrusted.count(c.get("links")) for c in commands),
        bytes=total_bytes,
        data=untrusted.field(single.get("data"), 80),
        rate=untrusted.field(single.get("rate"), 80),
        elapsed=_most(_elapsed(s, c) for s, c in zip(statuses, commands)),
        movements=len(found),
    )


def first_error(message: str) -> str:
    """The line of a data-movement message a user needs first (bounded).

    nnf-dm stores ``<exit status>: <dcp output>``; dcp names the file it could not copy on an
    ERROR line.  The first line that reads like an error wins, else the first line.
    """
    text = _EXIT_STATUS.sub("", message, count=1)
    lines = [line.strip() for line in text.replace("\r", "\n").split("\n") if line.strip()]
    if not lines:
        return untrusted.field(message.strip(), ERROR_LIMIT)
    chosen = next((line for line in lines if _ERROR_LINE.search(line)), lines[0])
    return untrusted.field(chosen, ERROR_LIMIT)


def copy_error(record: CopyRecord) -> str:
    """Why a copy failed, for the job's note: the first error its data movement reported."""
    return first_error(record.message) or f"status {record.status}"


def copy_note(record: CopyRecord, jobid: int) -> str:
    """The note for a failed copy, in the one form (flux_dws.core.messages): the state, the
    directive, the first error, what to do next (the paths: the error names the file)."""
    return failure_note(record.state.value, copy_error(record), jobid, directive=record.directive)


def summary(record: CopyRecord) -> str:
    """One line for logs and ``flux dws status``."""
    parts = [record.status]
    if record.files is not None:
        parts.append(f"{record.files} file{'s' if record.files != 1 else ''}")
    if record.bytes is not None:
        parts.append(f"{record.bytes} bytes")
    if record.elapsed is not None:
        parts.append(f"in {record.elapsed:.1f}s")
    text = ", ".join(parts)
    if record.failed and record.message:
        text = f"{text}: {first_error(record.message)}"
    return untrusted.readable(text)


# ----------------------------------------------------------------------------- helpers


def _index(value: Any) -> int | None:
    return untrusted.decimal(value, 99_999)


def _bytes(data: str) -> int | None:
    match = _BYTES.search(data)
    return untrusted.count(int(match.group(1))) if match and len(match.group(1)) < 20 else None


def _sum(values: Iterable[int | None]) -> int | None:
    """The total of the known figures; None when none is known or the total would not fit an
    int64 (jansson's integer: Flux refuses the whole event otherwise)."""
    known = [v for v in values if v is not None]
    return untrusted.count(sum(known)) if known else None


def _least(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _most(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _elapsed(status: Mapping[str, Any], command: Mapping[str, Any]) -> float | None:
    """endTime - startTime when both are readable, else commandStatus.elapsedTime."""
    try:
        start, end = parse_time(status.get("startTime")), parse_time(status.get("endTime"))
    except ValueError:
        start = end = None
    if start is not None and end is not None and end >= start:
        return round(end - start, 3)
    return go_duration(command.get("elapsedTime"))


def go_duration(value: Any) -> float | None:
    """Seconds in a Go duration string such as ``1m2.5s`` or ``294.183ms``; None otherwise."""
    if not isinstance(value, str) or not value or len(value) > 64:
        return None
    parts = _GO_DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    return round(sum(float(n) * _GO_UNITS[u] for n, u in parts), 6)
