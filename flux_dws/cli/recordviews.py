# SPDX-License-Identifier: LGPL-3.0-only
"""``flux dws status`` data movement and ``flux dws logs`` container output (pure views).

Data movement comes from the job's ``dws-datamovement`` events; container output from the
document flux-dws saved in the job's KVS directory (flux_dws.core.output), which only the job's
owner and the instance owner can read.  When nothing was saved, the ``dws-container`` event
says why (for example, the pods were already gone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.jobid import f58
from flux_dws.core.output import SavedOutput

Event = Mapping[str, Any]


@dataclass(frozen=True)
class Copy:
    """One copy directive's record, as the dws-datamovement event has it."""

    state: str
    index: int | None
    directive: str
    status: str
    message: str
    files: int | None
    bytes: int | None
    elapsed: float | None
    progress: int | None


def copies(eventlog: Sequence[Event]) -> tuple[Copy, ...]:
    """Every dws-datamovement record on the job, in the order posted."""
    found = []
    for entry in eventlog:
        if entry.get("name") != "dws-datamovement":
            continue
        c = entry.get("context")
        c = untrusted.mapping(c)
        found.append(
            Copy(
                state=_text(c.get("state")),
                index=_int(c.get("index")),
                directive=_text(c.get("directive")),
                status=_text(c.get("status")) or "?",
                message=_text(c.get("message")),
                files=_int(c.get("files")),
                bytes=_int(c.get("bytes")),
                elapsed=_number(c.get("elapsed")),
                progress=_int(c.get("progress")),
            )
        )
    return tuple(found)


def render_copies(found: Sequence[Copy]) -> list[str]:
    """The DATA MOVEMENT table of ``flux dws status`` (nothing when there were no copies)."""
    if not found:
        return []
    rows = [["DATA MOVEMENT", "STATUS", "FILES", "BYTES", "ELAPSED", "DIRECTIVE"]]
    notes = []
    for c in found:
        rows.append(
            [
                f"{c.state} #{c.index if c.index is not None else '?'}",
                c.status,
                "-" if c.files is None else str(c.files),
                "-" if c.bytes is None else _size(c.bytes),
                "-" if c.elapsed is None else f"{c.elapsed:.1f}s",
                c.directive,
            ]
        )
        if c.status != "Success" and c.message:
            first = c.message.strip().splitlines()
            notes.append(f"  {c.state} #{c.index}: {first[0] if first else ''}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    return ["", *lines, *notes]


def render_output(
    jobid: int, saved: SavedOutput | None, event: Event | None, *, prefix: str = "ƒ"
) -> list[str]:
    """``flux dws logs``: each container's name, exit code and saved log tail."""
    job = f58(jobid, prefix)
    context = (event or {}).get("context")
    context = untrusted.mapping(context)
    if saved is None or not saved.containers:
        why = (saved.note if saved is not None else "") or _text(context.get("output"))
        if not why:
            if event is None:
                return []
            why = "no container output was saved"
        return [f"{job}: {untrusted.text(why)}"]
    lines = []
    for c in saved.containers:
        s = c.status
        code = "-" if s.exit_code is None else str(s.exit_code)
        what = f"exit code {code}" if s.state == "terminated" else s.state
        extra = f" ({s.reason})" if s.reason else ""
        restarts = f", {s.restarts} restart(s)" if s.restarts else ""
        head = f"{job}: container {s.name} in pod {s.pod}: {what}{extra}{restarts}"
        lines.append(untrusted.text(head, None))
        if c.error:
            lines.append(f"  no log: {untrusted.text(c.error)}")
            continue
        if c.truncated:
            lines.append(f"  ... (only the last {saved.limit} bytes were kept)")
        lines += [f"  {untrusted.lines(line)}" for line in c.log.splitlines()]
    if saved.skipped:
        lines.append(f"{job}: {saved.skipped} more container(s) not read")
    return lines


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n}B"


def _text(value: Any) -> str:
    """A string field of a record, as one safe line ("" when not a string)."""
    return untrusted.text(value) if isinstance(value, str) else ""


def _int(value: Any) -> int | None:
    return untrusted.integer(value)


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None
