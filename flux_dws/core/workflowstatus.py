# SPDX-License-Identifier: LGPL-3.0-only
"""What a Workflow's view and its container outcome both read of its status: the driver entries
(``DriverStatus``, and the errors a driver retries itself) and the ``DW Directive N:`` prefix
DWS puts on ``status.message``.  Pure; the entries are checked by flux_dws.core.workflow.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from flux_dws.base.frozen import SLOTS
from flux_dws.core.states import State, Status

# DWS numbers directives from 0; a longer index is not one (int() of 5000 digits raises).
_DIRECTIVE_PREFIX = re.compile(r"^\s*DW Directive ([0-9]{1,6}):\s*", re.ASCII)
#: A driver entry's status when its driver failed.
DRIVER_ERROR = "Error"


@dataclass(frozen=True, **SLOTS)
class DriverStatus:
    """One ``status.drivers[]`` entry."""

    driver_id: str
    task_id: str
    dwd_index: int
    watch_state: State | None
    completed: bool
    status: str
    message: str
    error: str
    last_hb: int


def retried_error(entry: DriverStatus) -> bool:
    """An Error entry for an error its driver did not classify, which it retries.

    nnf-sos turns a plain Go error (an API conflict, an "already exists" from its stale cache)
    into ``message: "Internal error: <err>"``, ``error: "<err>"`` (handleWorkflowError), and its
    controller requeues with backoff and clears the entry on its next pass.  A classified
    error (DWS's ResourceError, whose severity means what it says) has ``error`` in the form
    ``"<type> error: <detail>"`` in lower case, so its message never reads so.
    """
    return (
        entry.status == DRIVER_ERROR
        and bool(entry.error)
        and entry.message == f"Internal error: {entry.error}"
    )


def only_retried_errors(
    drivers: Sequence[DriverStatus], state: State | None, status: Status | None
) -> bool:
    """The workflow is in Error in ``state`` only through ``retried_error`` entries.

    Also when no entry of the state is in Error any more: the driver's retry has reset its
    entry and DWS has not rolled the status up again yet.  A workflow with no entries for
    the state at all says nothing either way, and fails as before."""
    if status is not Status.ERROR:
        return False
    mine = [d for d in drivers if d.watch_state is state]
    return bool(mine) and all(retried_error(d) for d in mine if d.status == DRIVER_ERROR)


def prefixed_directive(message: str) -> int | None:
    """N of the ``DW Directive N:`` prefix of a message, or None."""
    match = _DIRECTIVE_PREFIX.match(message)
    return int(match.group(1)) if match else None


def strip_directive(message: str) -> str:
    """The message without its ``DW Directive N:`` prefix."""
    return _DIRECTIVE_PREFIX.sub("", message, count=1).strip()
