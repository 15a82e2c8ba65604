# SPDX-License-Identifier: LGPL-3.0-only
"""What an action's handler says, and what it asks the executor to do on its way there.

A handler (flux_dws.service.actions, .recording, .release) is a short generator of its
inputs, the service's parts and the action with the decision's inputs (``Seen``).  It
yields *steps*, which the executor (flux_dws.service.executor) carries out and answers:

- ``Call``: a blocking Kubernetes call, run on a worker thread; its result is sent back into
  the handler, its exception thrown in (a handler catches only what it has words for);
- ``Rpc``: a request to the job-manager, answered on the loop; an error Flux calls "already
  done" (``SETTLED_ERRNOS``) counts as success, any other is thrown in as an RpcError;
- ``Wait``: anything else that answers through a callback (a lookup shared by several jobs,
  a watch catching up, Fluxion's node marks).

It returns one *outcome*: ``Done`` (go on with the chain), ``Learned`` (facts for the loop to
write, then go on, or decide again), ``Retry`` (try the chain again later, with backoff) or
``Refused`` (a definitive failure; decide() turns it into the job's exception).  An exception
that escapes a handler is turned into an outcome in one place (``outcome_of``), so no handler
fails a job, writes a job's facts or keeps a retry clock: the loop (flux_dws.service.service)
writes every fact and the core (flux_dws.core.failing, flux_dws.core.lifecycle) gives every
verdict.  kopf's ``Outcome`` and controller-runtime's ``Result``/``TerminalError`` are the
same idea.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from flux_dws.base import untrusted
from flux_dws.core.failing import CallFailure, Refusal
from flux_dws.core.health import Failures
from flux_dws.core.jobview import ProposalInfo
from flux_dws.core.storage import BreakdownPending
from flux_dws.k8s import KubeError
from flux_dws.k8s.errors import is_permanent

# ----------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class Call:
    """Run ``fn(*args, **kwargs)`` on a worker thread (``what`` names it in errors).

    ``lane``: "urgent" for a moving job's next state, "soon" for what the next state waits
    for, "normal" for the rest (flux_dws.k8s.worker).  ``detached``: go on at once; when the
    call ends, the executor reports ``detached(result, error)`` to the loop as the job's
    outcome (a desiredState patch: DWS often shows the new state before its answer)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    what: str = ""
    lane: str = "normal"
    detached: Callable[[Any, BaseException | None], Outcome] | None = None


def call(
    fn: Callable[..., Any],
    *args: Any,
    what: str,
    lane: str = "normal",
    detached: Callable[[Any, BaseException | None], Outcome] | None = None,
    **kw: Any,
) -> Call:
    """A ``Call`` step, written as the call it makes: the one way handlers make one."""
    return Call(fn, args, kw, what, lane, detached)


@dataclass(frozen=True)
class Rpc:
    """Send a job-manager request: ``start(on_done)`` with ``on_done(response, error)``.

    ``detached``: go on at once, without the answer; when it comes, the executor reports
    ``detached(None)`` (taken) or ``detached(error_text)`` to the loop as the job's outcome,
    unless that is None."""

    start: Callable[[Callable[[Any, Any], None]], None]
    what: str
    detached: Callable[[str | None], Outcome | None] | None = None


@dataclass(frozen=True)
class Wait:
    """``start(answer)``: something on the loop that calls ``answer(value)`` once."""

    start: Callable[[Callable[[Any], None]], None]


Step = Union[Call, Rpc, Wait]

# ----------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class Adopted:
    """A workflow object a response returned: newer than the view, the loop takes it."""

    obj: Any
    created: bool = False


@dataclass(frozen=True)
class Posted:
    """An event sent to the job: the cached record shows it until Flux's own record does."""

    name: str
    context: Mapping[str, Any]


@dataclass(frozen=True)
class Unposted:
    """A post Flux refused: undo ``Posted`` (unless a newer one replaced it)."""

    name: str
    context: Mapping[str, Any]


@dataclass(frozen=True)
class Delivered:
    """Flux took a post: the record it sends from now on shows the event."""

    name: str
    context: Mapping[str, Any]


@dataclass(frozen=True)
class Asking:
    """A desiredState patch is on its way: until its answer the view says it was asked
    (``asked``; None for a workflow that could not be read) instead of ``before``."""

    asked: Any
    before: Any


@dataclass(frozen=True)
class AskAnswered:
    """The answer to ``asking``: the workflow patched (``obj``), or None when it failed (the
    view goes back to what it was, unless a newer one came meanwhile)."""

    asking: Asking
    obj: Any = None


@dataclass(frozen=True)
class RecordChanged:
    """What a job-manager request changed on the job (phase, started, exception)."""

    changes: Mapping[str, Any]


@dataclass(frozen=True)
class ProposalRead:
    proposal: ProposalInfo


@dataclass(frozen=True)
class FailuresRead:
    failures: Failures


@dataclass(frozen=True)
class WorkflowDeleted:
    """The delete of this workflow (uid) was accepted; its DELETED event may lag."""

    uid: str


Fact = Union[
    Adopted,
    Posted,
    Unposted,
    Delivered,
    Asking,
    AskAnswered,
    RecordChanged,
    ProposalRead,
    FailuresRead,
    WorkflowDeleted,
]

# ----------------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class Done:
    """The action took effect: go on with the chain."""


DONE = Done()


@dataclass(frozen=True)
class Learned:
    """Facts for the loop to write; then go on with the chain, or (``again``) decide anew
    from them, dropping the rest of the chain."""

    facts: tuple[Fact, ...] = ()
    again: bool = False


@dataclass(frozen=True)
class Retry:
    """Not done now: try the job's chain again later, with backoff.  ``failure``: a
    Kubernetes call failed, which the core judges (flux_dws.core.failing.give_up) and may
    turn into the job's failure; ``facts`` are written first (e.g. an undone post)."""

    why: str
    failure: CallFailure | None = None
    facts: tuple[Fact, ...] = ()


@dataclass(frozen=True)
class Refused:
    """A definitive failure found while acting: the job fails with it (decide() raises it).
    ``facts`` are written first (e.g. the copy records that show the failure)."""

    refusal: Refusal
    facts: tuple[Fact, ...] = ()


Outcome = Union[Done, Learned, Retry, Refused]
Handler = Callable[..., Union[Outcome, Generator[Step, Any, Outcome]]]


def error_text(exc: BaseException) -> str:
    """A failed call, in one line: Kubernetes errors say enough; others get their type."""
    shown = exc if isinstance(exc, KubeError) else f"{type(exc).__name__}: {exc}"
    return untrusted.text(shown)


def outcome_of(exc: BaseException, what: str) -> Outcome:
    """An exception no handler caught, as an outcome: every call failure is a Retry that
    the core judges by its permanence (a DirectiveBreakdown DWS is still working on is not
    permanent), a job-manager error a plain Retry."""
    from flux_dws.flux.transport import RpcError  # the flux layer: only its error type

    text = error_text(exc)
    if isinstance(exc, RpcError):
        return Retry(f"{what}: {exc}" if what else str(exc))
    permanent = is_permanent(exc) and not isinstance(exc, BreakdownPending)
    return Retry(text, CallFailure(what or "a call", text, permanent))


__all__ = [
    "DONE",
    "Adopted",
    "AskAnswered",
    "Asking",
    "Call",
    "Delivered",
    "Done",
    "Fact",
    "FailuresRead",
    "Learned",
    "Outcome",
    "Posted",
    "ProposalRead",
    "RecordChanged",
    "Refused",
    "Retry",
    "Rpc",
    "Step",
    "Unposted",
    "Wait",
    "WorkflowDeleted",
    "call",
    "error_text",
    "outcome_of",
]
