# SPDX-License-Identifier: LGPL-3.0-only
"""The words of a workflow failure as the user reads them, in one form.

Every failure flux-dws raises on a job reads ``<State> failed: [<directive>: ]<reason>[; <what
to do next>]``: the state that failed, the ``#DW`` directive it was about when DWS says which
(its ``DW Directive N:`` prefix, or the container directive), DWS's reason without its
``<Type> error:`` prefix (``status.message`` writes ``Internal error: ...``, a driver's error
``internal error: ...``; the same failure came out both ways), and a next step where the
reason (or the directive) says enough to suggest one.

Not only exception notes: a failed container's note (``dws-container``, ``flux dws status``,
``flux dws logs``), Teardown's failure, and the outcome saved for a job whose nodes went back
before its DataOut failed all take this form; DWS's own words may follow, labelled.  The
plugin's service-wait notes (jobtap/holds.c) are written in it by hand.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from flux_dws.base import untrusted
from flux_dws.base.jobid import f58

_DIRECTIVE = re.compile(r"^\s*DW Directive (\d+):\s*")
_TYPE = re.compile(r"^\s*(?:user|wlm|internal) error:\s*", re.IGNORECASE)
_NAME = re.compile(r"\bname=(\S+)")
#: How much of a directive a note quotes.
DIRECTIVE_LIMIT = 160

#: (pattern over the reason, else over the directive, next step); ``{job}`` is the job's f58
#: ID.  First match wins.
_NEXT: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), step)
    for pattern, step in (
        (r"failed to start", "check the container profile's image; flux dws logs {job}"),
        (
            r"container\(s\) failed|container (mpi)?job failed|backofflimitexceeded",
            "the containers' output: flux dws logs {job}",
        ),
        (r"insufficient capacity", "free capacity: flux dws rabbits; ask for less or retry"),
        (
            r"user id does not match existing persistent storage|is not shared with you",
            "the instance owner can share it: flux dws persistent share NAME",
        ),
        (
            r"persistent ?storage ?instance '[^']*' not found|persistent storage .* not found",
            "existing storage: flux dws persistent list",
        ),
        (r"is deleting|is being destroyed", "it is being destroyed: use other storage"),
        (r"copy_(in|out)", "check the paths; flux dws status {job}"),
        (r"^#DW container\b", "the containers' output: flux dws logs {job}"),
    )
)
DEFAULT_NEXT = "flux dws status {job}"


def dws_reason(text: str) -> str:
    """DWS's text without its ``DW Directive N:`` and ``<Type> error:`` prefixes, one line."""
    text = _DIRECTIVE.sub("", untrusted.text(text), count=1)
    return _TYPE.sub("", text, count=1).strip()


def directive_index(text: str) -> int | None:
    """N of a ``DW Directive N:`` prefix, or None."""
    match = _DIRECTIVE.match(text or "")
    return int(match.group(1)) if match else None


def next_step(reason: str, jobid: int, directive: str = "") -> str:
    """What the user can do next, from the reason's words, else the directive's."""
    for text in (reason, directive):
        for pattern, step in _NEXT:
            if pattern.search(text):
                return step.format(job=f58(jobid))
    return DEFAULT_NEXT.format(job=f58(jobid))


def failure_note(
    state: str,
    reason: str,
    jobid: int,
    *,
    directive: str = "",
    step: str | None = None,
) -> str:
    """``<State> failed: [<directive>: ]<reason>; <next step>``."""
    reason = dws_reason(reason) or "no reason given"
    directive = untrusted.text(" ".join(str(directive).split()), DIRECTIVE_LIMIT)
    where = f"{directive}: " if directive else ""
    then = next_step(reason, jobid, directive) if step is None else step
    named = _NAME.search(directive)
    then = then.replace("NAME", named.group(1)) if named else then
    return f"{state} failed: {where}{reason}" + (f"; {then}" if then else "")


def directive_of(directives: Sequence[str], index: int | None) -> str:
    """The directive at ``index`` (as written), or ""."""
    if index is None or not 0 <= index < len(directives):
        return ""
    return " ".join(str(directives[index]).split())


__all__ = [
    "DEFAULT_NEXT",
    "directive_index",
    "directive_of",
    "dws_reason",
    "failure_note",
    "next_step",
]
