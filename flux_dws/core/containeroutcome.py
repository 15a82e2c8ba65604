# SPDX-License-Identifier: LGPL-3.0-only
"""Where a job's user containers are: the container directive's outcome, from a workflow's parts.

DWS has no container status field today (dws-api.md 4): whether the user's containers started,
exited or failed is read from the container directive's driver entries, or from a future
``status.containers`` field when it appears and can be understood.  Pure; the view of a
workflow (flux_dws.core.workflow) holds the outcome as ``WorkflowView.container``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.frozen import SLOTS
from flux_dws.core.states import State, Status
from flux_dws.core.workflowstatus import (
    DRIVER_ERROR,
    DriverStatus,
    only_retried_errors,
    prefixed_directive,
    retried_error,
    strip_directive,
)

# DWS renders an error with no user text as "<Type> error: " (nnf-sos pod failures do this).
_EMPTY_USER_TEXT = re.compile(r"^(User|WLM|Internal) error:\s*$", re.IGNORECASE)
_TIMEOUT = re.compile(r"failed to (start|complete) after \d+ seconds")


class ContainerState(str, Enum):
    """Where the job's user containers are, as far as DWS has told us."""

    NONE = "none"
    PENDING = "pending"
    STARTED = "started"
    EXITED = "exited"
    START_FAILED = "start-failed"
    FAILED = "failed"
    TIMED_OUT = "timed-out"

    @property
    def is_failure(self) -> bool:
        return self in (
            ContainerState.START_FAILED,
            ContainerState.FAILED,
            ContainerState.TIMED_OUT,
        )


@dataclass(frozen=True, **SLOTS)
class ContainerOutcome:
    """The container directive's result; ``reason`` is what the user is told."""

    state: ContainerState
    phase: State | None = None
    reason: str = ""
    detail: str = ""
    dwd_index: int | None = None


def container_outcome(
    directives: Sequence[str],
    drivers: Sequence[DriverStatus],
    state: State | None = None,
    status: Status | None = None,
    message: str = "",
    containers: Any = None,
) -> ContainerOutcome:
    """The container directive's outcome from a workflow's parts (pure; dws-api.md 4, 5).

    ``containers`` is the raw ``status.containers`` (a future field): used when it can be
    understood, ignored otherwise.  Without it the container directive's driver entries decide:
    an Error in PreRun or PostRun is a failure (a timeout when the message says so), a completed
    PostRun entry means the containers exited cleanly, a completed PreRun entry that they started.
    """
    index = _container_index(directives)
    if index is None:
        return ContainerOutcome(ContainerState.NONE)
    future = _from_containers_field(containers, index, state)
    if future is not None:
        return future
    mine = [d for d in drivers if d.dwd_index == index and not retried_error(d)]
    retrying = only_retried_errors(drivers, state, status)
    named = prefixed_directive(message) == index and status is Status.ERROR and not retrying
    rolled_up = message if named else ""
    for phase in (State.PRERUN, State.POSTRUN):
        for entry in mine:
            if entry.watch_state is phase and entry.status == DRIVER_ERROR:
                from_status = rolled_up if state is phase else ""
                return _failure(index, phase, entry.message, from_status, entry.error)
    if rolled_up and state in (State.PRERUN, State.POSTRUN):
        # No driver entry says so, but the roll-up names the container directive.
        return _failure(index, state, "", rolled_up, "")
    if any(d.watch_state is State.POSTRUN and d.completed for d in mine):
        return ContainerOutcome(ContainerState.EXITED, dwd_index=index)
    if any(d.watch_state is State.PRERUN and d.completed for d in mine):
        return ContainerOutcome(ContainerState.STARTED, dwd_index=index)
    return ContainerOutcome(ContainerState.PENDING, dwd_index=index)


def _container_index(directives: Sequence[str]) -> int | None:
    """Index of the (at most one) "#DW container ..." directive."""
    for i, directive in enumerate(directives):
        if directive.split()[:2] == ["#DW", "container"]:
            return i
    return None


def _user_text(message: str) -> str:
    text = strip_directive(message)
    return "" if _EMPTY_USER_TEXT.match(text) else text


def _failure(
    index: int, phase: State, message: str, rolled_up: str, error: str
) -> ContainerOutcome:
    """A failure in ``phase``; the reason is the first non-empty of the three texts."""
    reason = _user_text(message) or _user_text(rolled_up) or error.strip()
    timed_out = any(_TIMEOUT.search(text) for text in (message, rolled_up, error))
    if timed_out:
        kind = ContainerState.TIMED_OUT
    else:
        kind = ContainerState.START_FAILED if phase is State.PRERUN else ContainerState.FAILED
    return ContainerOutcome(kind, phase, reason, error, index)


def _vocabulary() -> dict[str, ContainerState]:
    """Words a future status.containers field might use, normalised to [a-z0-9]."""
    groups = {
        ContainerState.PENDING: "pending waiting creating containercreating initializing "
        "starting queued notstarted scheduled",
        ContainerState.STARTED: "started running ready active",
        ContainerState.EXITED: "exited succeeded success successful completed complete done "
        "finished",
        ContainerState.START_FAILED: "startfailed failedtostart starterror errimagepull "
        "imagepullbackoff createcontainererror",
        ContainerState.FAILED: "failed failure error errored crashed crashloopbackoff oomkilled",
        ContainerState.TIMED_OUT: "timedout timeout deadlineexceeded",
    }
    return {word: state for state, words in groups.items() for word in words.split()}


_WORDS = _vocabulary()
_STATE_KEYS = ("state", "phase", "status")
_RANK = (ContainerState.PENDING, ContainerState.STARTED, ContainerState.EXITED)


def _from_containers_field(
    containers: Any, index: int, state: State | None
) -> ContainerOutcome | None:
    """An outcome from ``status.containers`` (a dict, a list, or a dict of entries), or None
    when nothing in it can be understood.  Never raises: the field's shape is not known yet.

    Several containers: any failure wins, then the least advanced of the rest.
    """
    if isinstance(containers, Mapping):
        if any(key in containers for key in (*_STATE_KEYS, "exitCode")):
            entries: list[Any] = [containers]
        else:
            entries = list(containers.values())
    elif isinstance(containers, (list, tuple)):
        entries = list(containers)
    else:
        return None
    outcomes = [o for o in (_entry_outcome(e, index, state) for e in entries) if o is not None]
    for outcome in outcomes:
        if outcome.state.is_failure:
            return outcome
    for rank in _RANK:
        if any(o.state is rank for o in outcomes):
            return ContainerOutcome(rank, dwd_index=index)
    return None


def _entry_outcome(entry: Any, index: int, state: State | None) -> ContainerOutcome | None:
    if not isinstance(entry, Mapping):
        return None
    kind, phase = None, None
    message, detail = _text(entry, "message") or _text(entry, "reason"), _text(entry, "error")
    detail = detail or _text(entry, "detail")
    for key in _STATE_KEYS:
        value = entry.get(key)
        if isinstance(value, Mapping):  # Kubernetes ContainerState style: {"terminated": {...}}
            found, message, detail = _pod_style(value, message, detail)
        elif isinstance(value, str):
            named = _state_named(value)
            if named is not None:  # a workflow state: the phase, not the containers' state
                phase = phase or named
                continue
            found = _word(value)
        else:
            continue
        kind = kind or found
    if kind is None:
        kind = _exit_code_state(entry.get("exitCode"))
    if kind is None or kind is ContainerState.NONE:
        return None
    if not kind.is_failure:
        return ContainerOutcome(kind, dwd_index=index)
    phase = _failure_phase(kind, phase, state, message + " " + detail)
    if kind is ContainerState.FAILED and phase is State.PRERUN:
        kind = ContainerState.START_FAILED
    reason = _user_text(message) or detail
    return ContainerOutcome(kind, phase, reason, detail, index)


def _pod_style(
    value: Mapping[Any, Any], message: str, detail: str
) -> tuple[ContainerState | None, str, str]:
    for word, inner in value.items():
        inner = untrusted.mapping(inner)
        message = message or _text(inner, "message") or _text(inner, "reason")
        if word == "running":
            return ContainerState.STARTED, message, detail
        if word == "waiting":
            waiting = _word(_text(inner, "reason"))
            kind = waiting if waiting is not None and waiting.is_failure else ContainerState.PENDING
            return kind, message, detail
        if word == "terminated":
            return _exit_code_state(inner.get("exitCode")), message, detail
    return None, message, detail


def _exit_code_state(code: Any) -> ContainerState | None:
    if untrusted.integer(code) is not None:
        return ContainerState.EXITED if code == 0 else ContainerState.FAILED
    return None


def _failure_phase(
    kind: ContainerState, phase: State | None, state: State | None, text: str
) -> State:
    """PreRun or PostRun: the entry's own word, else its message, else the workflow's state."""
    if phase in (State.PRERUN, State.POSTRUN):
        return phase
    if kind is ContainerState.START_FAILED or "failed to start after" in text:
        return State.PRERUN
    return state if state in (State.PRERUN, State.POSTRUN) else State.POSTRUN


def _state_named(word: str) -> State | None:
    try:
        return State.parse(word)
    except ValueError:
        return None


def _word(word: str) -> ContainerState | None:
    return _WORDS.get(re.sub(r"[^a-z0-9]", "", word.lower()))


def _text(entry: Mapping[Any, Any], key: str) -> str:
    return untrusted.field(entry.get(key)).strip()
