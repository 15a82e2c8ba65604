# SPDX-License-Identifier: LGPL-3.0-only
"""``flux dws status JOBID`` for a job whose nodes went back early (core.release).

Such a job is inactive before its DataOut and Teardown end; the service saves how each ended
in the job's KVS (``dws.release.dataout``, ``dws.release.teardown``), which only the job's
owner and the instance owner may read.  Pure: the command reads, this shapes and renders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flux_dws.base import untrusted
from flux_dws.cli.views import Event, events_named
from flux_dws.core.release import RELEASE_KEY

#: The saved outcomes, by state, in the order they happen.
KEYS = (("DataOut", f"{RELEASE_KEY}.dataout"), ("Teardown", f"{RELEASE_KEY}.teardown"))
#: How much of a saved note is shown (a directive, a copy's first error and a next step).
REASON_LIMIT = 1024


def release_event(eventlog: Sequence[Event]) -> Mapping[str, Any] | None:
    """The context of the job's ``dws-release`` event, None when its nodes were not released
    early."""
    found = events_named(eventlog, "dws-release")
    context = found[-1].get("context") if found else None
    return context if isinstance(context, Mapping) else ({} if found else None)


def release_view(
    event: Mapping[str, Any], saved: Mapping[str, Any], problems: Mapping[str, str]
) -> dict[str, Any]:
    """What the user is shown: the release, then each state's saved outcome (or why none)."""
    drained = [n for n in event.get("drained") or () if isinstance(n, str)]
    states: dict[str, Any] = {}
    for state, _ in KEYS:
        value = saved.get(state)
        if isinstance(value, Mapping):
            states[state] = {
                "status": untrusted.field(value.get("status")) or "?",
                "message": untrusted.text(value.get("message") or "", REASON_LIMIT),
                "reason": untrusted.text(value.get("reason") or "", REASON_LIMIT),
                "copies": [
                    {
                        "index": c.get("index"),
                        "status": untrusted.field(c.get("status")),
                        "message": untrusted.text(c.get("message") or "", 300),
                    }
                    for c in value.get("copies") or ()
                    if isinstance(c, Mapping)
                ],
            }
        else:
            states[state] = {"status": problems.get(state) or "not over yet"}
    return {"drained": drained, "reason": untrusted.text(event.get("reason") or "", 300), **states}


def release_failure(view: Mapping[str, Any] | None) -> str | None:
    """Why a job released early failed after all (its DataOut failed: the saved ``reason``,
    else the state's message), or None.  Flux's ``result`` stays COMPLETED: the job was
    inactive by then, and Flux sets no memo on an inactive job."""
    dataout = (view or {}).get("DataOut") or {}
    if dataout.get("status") != "failed":
        return None
    return dataout.get("reason") or dataout.get("message") or "DataOut failed"


def render_release(view: Mapping[str, Any]) -> list[str]:
    drained = view.get("drained") or []
    line = "RELEASED   the job's nodes went back after PostRun unmounted its storage"
    lines = ["", line + (f"; drained {','.join(drained)}" if drained else "")]
    for state, _ in KEYS:
        outcome = view.get(state) or {}
        said = outcome.get("reason") or outcome.get("message")
        if outcome.get("status") == "failed" and said:  # "<State> failed: ...", one form
            text = f"{state.upper():<10} {said}"
        else:
            text = f"{state.upper():<10} {outcome.get('status', '?')}"
            text += f": {said}" if said else ""
        lines.append(text)
        for copy in outcome.get("copies") or ():
            words = f"  copy_out #{copy.get('index')}: {copy.get('status')}"
            lines.append(words + (f": {copy['message']}" if copy.get("message") else ""))
    return lines
