# SPDX-License-Identifier: LGPL-3.0-only
"""What a driver decides for one directive in one state, and how that lands in its entry.

A driver's decision is a value: ``Complete``, ``Fail`` (status, message, error for the driver
entry) or ``Wait`` (look again later, or only when something changes).  Errors are built the
way DWS's ResourceError renders them, so the messages a WLM sees are the upstream ones:
``message`` is "<Type> error: <user message>" and ``error`` is "<type> error: <detail>".
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from flux_dws.core.states import Status
from flux_dws.testing.dwssim.status import micro_time

USER, WLM, INTERNAL = "User", "WLM", "Internal"
MINOR, MAJOR, FATAL = "Minor", "Major", "Fatal"

#: severity -> driver entry status (DWS ResourceErrorSeverity.ToStatus).
SEVERITY_STATUS = {MINOR: "Running", MAJOR: Status.TRANSIENT.value, FATAL: Status.ERROR.value}


@dataclass(frozen=True)
class Complete:
    """The driver finished its work for this state; ``env`` goes into status.env."""

    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Fail:
    """The driver entry's status, user-facing message and debug error."""

    status: str
    message: str
    error: str


@dataclass(frozen=True)
class Wait:
    """Not done yet: look again after ``seconds``, or (None) only when something changes."""

    seconds: float | None = None


Outcome = Union[Complete, Fail, Wait]


@dataclass(frozen=True)
class ResourceError:
    """A DWS ResourceError: a user message, a debug message, a type and a severity."""

    user_message: str = ""
    debug: str = ""
    type: str = INTERNAL
    severity: str = MINOR

    def wrap(
        self,
        debug: str = "",
        user_message: str = "",
        kind: str | None = None,
        severity: str | None = None,
    ) -> ResourceError:
        """This error as a caller wraps it (NewResourceError(debug).WithError(self)...).

        The caller's debug text goes first; the child's user message, type and severity are
        kept, and the caller's user message only fills an empty one, as upstream.
        """
        inner = self.debug or self.user_message
        joined = ": ".join(part for part in (debug, inner) if part)
        wrapped = ResourceError(
            user_message=self.user_message or user_message,
            debug=joined,
            type=kind or self.type,
            severity=severity or self.severity,
        )
        return wrapped

    def fail(self) -> Fail:
        detail = self.debug or self.user_message
        return Fail(
            status=SEVERITY_STATUS.get(self.severity, Status.ERROR.value),
            message=f"{self.type} error: {self.user_message}",
            error=f"{self.type.lower()} error: {detail}",
        )


def fatal(user_message: str = "", debug: str = "", kind: str = INTERNAL) -> Fail:
    """The common case: a Fatal error rendered for a driver entry."""
    return ResourceError(user_message, debug, kind, FATAL).fail()


def unclassified(error: str) -> Fail:
    """nnf-sos's handleWorkflowError for a plain Go error (an API call that failed): Error,
    ``Internal error: <err>``; its controller requeues and clears the entry on its next pass."""
    return Fail(status=Status.ERROR.value, message=f"Internal error: {error}", error=error)


def is_unclassified(entry: Mapping[str, Any]) -> bool:
    """An entry ``unclassified`` wrote, which the driver retries."""
    error = entry.get("error")
    return (
        entry.get("status") == Status.ERROR.value
        and bool(error)
        and entry.get("message") == f"Internal error: {error}"
    )


def apply_outcome(
    entry: Mapping[str, Any], outcome: Outcome, now: datetime.datetime
) -> dict[str, Any]:
    """The driver entry after ``outcome`` (unchanged for Wait), as a new dict.

    Only the entry's own fields change, so a shallow copy is enough: its values are scalars.
    """
    new = dict(entry)
    if isinstance(outcome, Complete):
        new.update(
            status=Status.COMPLETED.value,
            message="",
            error="",
            completed=True,
            completeTime=micro_time(now),
        )
    elif isinstance(outcome, Fail):
        new.update(status=outcome.status, message=outcome.message, error=outcome.error)
        new["completed"] = False
    return new


def tester_outcome(args: Mapping[str, str]) -> Outcome:
    """DWS's test driver for "#DW <State> action=complete|wait|error ...".

    Upstream words: the entry's message is "Reported error: <message>" as written, its error
    the message with "_" shown as a space; severity Minor (the default), Major or Fatal.
    """
    action = args.get("action", "")
    if action == "complete":
        return Complete()
    if action != "error":
        return Wait()
    raw = args.get("message", "")
    severity = args.get("severity", "")
    canonical = {s.lower(): s for s in SEVERITY_STATUS}.get(severity.lower() or "minor")
    if canonical is None:
        problem = f"unknown severity: {severity}"
        return Fail(Status.ERROR.value, "Internal error: " + problem, problem)
    return Fail(SEVERITY_STATUS[canonical], "Reported error: " + raw, raw.replace("_", " "))
