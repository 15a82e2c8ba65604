# SPDX-License-Identifier: LGPL-3.0-only
"""How Flux judges a job from its eventlog: the result `flux jobs` shows, and the exit status
`flux run` / `flux job attach` return.  flux-core's rules, in one place for fakeflux, the
`flux dws` views and the tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Event = Mapping[str, Any]


def job_result(eventlog: Sequence[Event]) -> str:
    """job-list's result: success is decided at ``finish`` (exit 0 and no fatal exception yet);
    an exception raised later (in the epilog, e.g. a PostRun failure) does not change it.
    Otherwise the most severe exception (the first at that severity) names the result."""
    occurred: Mapping[str, Any] | None = None
    success = False
    for entry in eventlog:
        context = entry.get("context") or {}
        if entry.get("name") == "exception":
            if occurred is None or context.get("severity", 0) < occurred.get("severity", 0):
                occurred = context
        elif entry.get("name") == "finish":
            fatal = occurred is not None and occurred.get("severity") == 0
            success = context.get("status") == 0 and not fatal
    if success:
        return "COMPLETED"
    if occurred is not None:
        return {"cancel": "CANCELED", "timeout": "TIMEOUT"}.get(str(occurred.get("type")), "FAILED")
    return "FAILED"


def attach_status(eventlog: Sequence[Event]) -> int:
    """`flux job attach`'s exit code: the tasks' exit code (1 if they never ran), and 1 for any
    fatal exception up to ``clean``, including one raised after the tasks ended."""
    code = 1
    for entry in eventlog:
        if entry.get("name") == "finish":
            status = int((entry.get("context") or {}).get("status", 0))
            code = (status >> 8) & 0xFF if status & 0x7F == 0 else 128 + (status & 0x7F)
    fatal = any(
        e.get("name") == "exception" and (e.get("context") or {}).get("severity") == 0
        for e in eventlog
    )
    return 1 if fatal and code == 0 else code
