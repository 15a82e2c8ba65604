# SPDX-License-Identifier: LGPL-3.0-only
"""DWS workflow states and statuses, in the order DWS allows them."""

from __future__ import annotations

from enum import Enum


class State(str, Enum):
    """A Workflow's desiredState / status.state (dws-api.md section 1)."""

    PROPOSAL = "Proposal"
    SETUP = "Setup"
    DATAIN = "DataIn"
    PRERUN = "PreRun"
    POSTRUN = "PostRun"
    DATAOUT = "DataOut"
    TEARDOWN = "Teardown"

    @property
    def key(self) -> str:
        """Lower-case name used in config keys and job attributes ("prerun")."""
        return self.value.lower()

    @property
    def index(self) -> int:
        return STATE_ORDER.index(self)

    def next(self) -> State | None:
        """The state DWS allows after this one, or None after Teardown."""
        i = self.index
        return STATE_ORDER[i + 1] if i + 1 < len(STATE_ORDER) else None

    @classmethod
    def parse(cls, value: str) -> State:
        """Accept "PreRun" or "prerun"; raise ValueError naming the value otherwise."""
        state = _BY_SPELLING.get(value) if isinstance(value, str) else None
        if state is None:
            raise ValueError(f"unknown workflow state {value!r}")
        return state


STATE_ORDER: tuple[State, ...] = tuple(State)
STATE_KEYS: tuple[str, ...] = tuple(s.key for s in STATE_ORDER)
#: Both accepted spellings of each state: every watch event parses two states, so a lookup.
_BY_SPELLING: dict[str, State] = {
    **{s.value: s for s in STATE_ORDER},
    **{s.key: s for s in STATE_ORDER},
}
#: The State a spelling names, or None: State.parse without the error, for the watch's views.
state_named = _BY_SPELLING.get


class Status(str, Enum):
    """A Workflow's status.status."""

    COMPLETED = "Completed"
    DRIVER_WAIT = "DriverWait"
    TRANSIENT = "TransientCondition"
    ERROR = "Error"


def is_legal_transition(current: State | None, desired: State) -> bool:
    """Whether DWS admission accepts moving desiredState from ``current`` to ``desired``.

    Readiness is checked separately; this is only the shape of the move: staying put,
    one step forward, or Teardown from anywhere.  Nothing but Teardown after Teardown.
    """
    if current is None:
        return desired is State.PROPOSAL
    if current is State.TEARDOWN:
        return desired is State.TEARDOWN
    return desired in (current, State.TEARDOWN, current.next())
