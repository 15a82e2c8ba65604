# SPDX-License-Identifier: LGPL-3.0-only
"""When acting for a job fails: the service's rules, as pure decisions.

Everything from Kubernetes is untrusted and every call bounded: a call that can never succeed
fails the job at once with the API's message; a transient failure is retried with backoff for
at most the timeout of the state the workflow is in.  A definitive failure found while acting
(DWS rejected the directives, the storage cannot be placed, a copy failed) is a ``Refusal``,
which decide() raises on the job like any other failure (flux_dws.core.lifecycle).

The service's handlers only report what happened (flux_dws.service.outcome); these functions
give the verdict, so every way a job fails goes through the core.
"""

from __future__ import annotations

from dataclasses import dataclass

from flux_dws.base.fsd import format_fsd
from flux_dws.core.jobview import JobView, Refusal
from flux_dws.core.messages import failure_note
from flux_dws.core.policy import Policy
from flux_dws.core.states import State
from flux_dws.core.workflow import WorkflowView

RETRY_MIN = 0.5  # seconds before retrying a job whose action failed; doubles up to RETRY_MAX
RETRY_MAX = 60.0


@dataclass(frozen=True)
class CallFailure:
    """A Kubernetes call of the job's chain that failed: ``what`` it was, the error's
    ``text``, and whether sending it again can never help (``permanent``)."""

    what: str
    text: str
    permanent: bool


def backoff(previous: float) -> float:
    """The next retry delay after ``previous`` (0 for the first): 0.5 s doubling to a minute."""
    return min(max(previous * 2, RETRY_MIN), RETRY_MAX)


def state_timeout(job: JobView, workflow: WorkflowView | None, policy: Policy) -> float:
    """The timeout of the state the job's workflow is in (Proposal before it exists)."""
    key = workflow.desired_state.key if workflow is not None else "proposal"
    if job.request is not None:
        return job.request.timeouts[key]
    return policy.timeout(key).default


def give_up(
    job: JobView,
    workflow: WorkflowView | None,
    failure: CallFailure,
    failing_for: float,
    policy: Policy,
) -> Refusal | None:
    """The job's failure when a call failing for ``failing_for`` seconds should fail it, else
    None (retry).  A job that already failed keeps retrying, with backoff: its workflow must
    still go."""
    if not job.active or job.exception is not None:
        return None
    if failure.permanent:
        return Refusal(f"{failure.what}: {failure.text}")
    limit = state_timeout(job, workflow, policy)
    if failing_for >= limit:
        return Refusal(f"{failure.what} kept failing for {format_fsd(limit)}: {failure.text}")
    return None


def refusal_note(job: JobView, workflow: WorkflowView | None, refusal: Refusal) -> str:
    """The exception a refusal gives the job, in the one form of flux_dws.core.messages."""
    state = refusal.state or (workflow.desired_state if workflow is not None else State.PROPOSAL)
    return failure_note(
        state.value, refusal.reason, job.jobid, directive=refusal.directive, step=refusal.step
    )


__all__ = ["RETRY_MAX", "RETRY_MIN", "CallFailure", "Refusal", "backoff", "give_up", "refusal_note"]
