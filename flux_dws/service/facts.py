# SPDX-License-Identifier: LGPL-3.0-only
"""What an action reported, written into the job's entry: the one place a job's facts change
besides the loop's own observations (flux_dws.service.service calls ``learn``, on the loop).

Each fact (flux_dws.service.outcome) has one writer in ``_LEARN``; every one marks the job to
be decided again.
"""

from __future__ import annotations

from typing import Any

from flux_dws.base import untrusted
from flux_dws.core.workflow import view_of
from flux_dws.service.jobs import Tracked
from flux_dws.service.outcome import (
    Adopted,
    AskAnswered,
    Asking,
    Delivered,
    Fact,
    FailuresRead,
    Posted,
    ProposalRead,
    RecordChanged,
    Unposted,
    WorkflowDeleted,
)


def learn(tracked: Tracked, facts: tuple[Fact, ...]) -> None:
    """Write ``facts`` into ``tracked``; the job is decided again after."""
    for fact in facts:
        _LEARN[type(fact)](tracked, fact)
        tracked.dirty = True


def _adopted(tracked: Tracked, fact: Adopted) -> None:
    """Take a returned workflow as the latest view, so the next decision need not wait.

    Only a newer version of the workflow the service knows, or the one it just created: a
    response that arrives after the watch reported the workflow deleted must not bring it
    back."""
    obj, known = fact.obj, tracked.workflow
    if not isinstance(obj, dict) or (known is None and not fact.created):
        return
    meta = untrusted.mapping(obj.get("metadata"))
    if known is not None and (
        known.uid != (meta.get("uid") or "")
        or version_number(meta.get("resourceVersion")) <= version_number(known.resource_version)
    ):
        return  # another workflow, or not newer than what we know
    try:
        tracked.workflow, tracked.raw = view_of(obj)
    except ValueError:
        return


def _posted(tracked: Tracked, fact: Posted) -> None:
    """The record takes the event now; Flux's own record follows on the job stream."""
    if tracked.record is None:
        return
    dws = tracked.record.get("dws") or {}
    tracked.posting[fact.name] = (fact.context, dws.get(fact.name))
    tracked.record = {**tracked.record, "dws": {**dws, fact.name: fact.context}}


def _unposted(tracked: Tracked, fact: Unposted) -> None:
    posting = tracked.posting.get(fact.name)
    if posting is None or posting[0] is not fact.context:
        return  # a newer post replaced it
    del tracked.posting[fact.name]
    dws = dict((tracked.record or {}).get("dws") or {})
    if tracked.record is not None and dws.get(fact.name) is fact.context:
        before = posting[1]
        if before is None:
            dws.pop(fact.name)
        else:
            dws[fact.name] = before
        tracked.record = {**tracked.record, "dws": dws}


def _delivered(tracked: Tracked, fact: Delivered) -> None:
    posting = tracked.posting.get(fact.name)
    if posting is not None and posting[0] is fact.context:
        del tracked.posting[fact.name]
    if not tracked.busy:
        tracked.retry = 0.0  # what failed before went through


def _asking(tracked: Tracked, fact: Asking) -> None:
    """Until the patch's answer, the view says the state was asked (not settled)."""
    tracked.asking = fact
    if fact.asked is not None:
        tracked.workflow = fact.asked


def _ask_answered(tracked: Tracked, fact: AskAnswered) -> None:
    asking = fact.asking
    if tracked.asking is asking:
        tracked.asking = None
    if fact.obj is not None:
        _adopted(tracked, Adopted(fact.obj))
        if not tracked.busy:
            tracked.retry, tracked.failing_since = 0.0, None  # it went through
    elif asking.asked is not None and tracked.workflow is asking.asked:  # nothing newer came
        tracked.workflow = asking.before


def _record_changed(tracked: Tracked, fact: RecordChanged) -> None:
    """What a request just did, applied to the cached record ahead of the plugin's update.

    Until it comes the next decision sees the effect (an out-of-date record arriving later
    only costs a repeated, harmless request).  A "gone" job is forgotten once its workflow is
    gone too; the first fatal exception is the one kept."""
    record, changes = tracked.record, fact.changes
    if record is None:
        return
    if changes.get("phase") == "gone":
        tracked.record = None
    elif "exception" in changes and record.get("exception"):
        return
    else:
        tracked.record = {**record, **changes}


def _proposal_read(tracked: Tracked, fact: ProposalRead) -> None:
    tracked.proposal = fact.proposal


def _failures_read(tracked: Tracked, fact: FailuresRead) -> None:
    tracked.failures = fact.failures


def _workflow_deleted(tracked: Tracked, fact: WorkflowDeleted) -> None:
    tracked.deleted = fact.uid


_LEARN: dict[type, Any] = {
    Adopted: _adopted,
    Posted: _posted,
    Unposted: _unposted,
    Delivered: _delivered,
    Asking: _asking,
    AskAnswered: _ask_answered,
    RecordChanged: _record_changed,
    ProposalRead: _proposal_read,
    FailuresRead: _failures_read,
    WorkflowDeleted: _workflow_deleted,
}


def version_number(version: Any) -> int:
    """A resourceVersion (parsed or raw) as a number, to order versions (0 if it has none)."""
    try:
        return int(version or 0)
    except (TypeError, ValueError):
        return 0
