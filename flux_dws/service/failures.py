# SPDX-License-Identifier: LGPL-3.0-only
"""When a job's Kubernetes call fails: the service's rules, as decisions.

Everything from Kubernetes is untrusted and every call bounded: a call that can never succeed
fails the job at once with the API's message; a transient failure is retried with backoff for
at most the timeout of the state the workflow is in.  These functions only judge; the action
executor (flux_dws.service.executor) acts on their verdict.
"""

from __future__ import annotations

import pwd

from flux_dws.base import untrusted
from flux_dws.base.fsd import format_fsd
from flux_dws.core.policy import Policy
from flux_dws.core.storage import BreakdownPending
from flux_dws.k8s import KubeError
from flux_dws.k8s.errors import is_permanent
from flux_dws.service.jobs import Tracked

RETRY_MIN = 0.5  # seconds before retrying a job whose action failed; doubles up to RETRY_MAX
RETRY_MAX = 60.0


def backoff(previous: float) -> float:
    """The next retry delay after ``previous`` (0 for the first): 0.5 s doubling to a minute."""
    return min(max(previous * 2, RETRY_MIN), RETRY_MAX)


class FailureRules:
    """Whether a failed call should fail its job; see the module docstring."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def give_up(
        self, tracked: Tracked, what: str, exc: BaseException, failing_for: float
    ) -> str | None:
        """Why the job fails (its exception's reason) when a call failing for
        ``failing_for`` seconds should fail it, else None (retry).  A job already failed
        keeps retrying, with backoff: its workflow must still go."""
        record = tracked.record
        if record is None or record.get("exception"):
            return None  # nothing left to fail: keep retrying (with backoff)
        text = error_text(exc)
        if is_permanent(exc) and not isinstance(exc, BreakdownPending):  # DWS retries it
            return f"{what}: {text}"
        limit = self.state_timeout(tracked)
        if failing_for >= limit:
            return f"{what} kept failing for {format_fsd(limit)}: {text}"
        return None

    def state_timeout(self, tracked: Tracked) -> float:
        """The timeout of the state the job's workflow is in (Proposal before it exists)."""
        key = tracked.workflow.desired_state.key if tracked.workflow else "proposal"
        request = tracked.request[0] if tracked.request else None
        if request is not None:
            return request.timeouts[key]
        return self.policy.timeout(key).default


def primary_group(userid: int) -> int | str:
    """The primary gid of ``userid`` from the passwd database, or why it cannot be had.

    May block (NSS, LDAP): call it on a worker thread, never on the loop.
    """
    try:
        return pwd.getpwuid(userid).pw_gid
    except KeyError:
        return f"uid {userid} has no passwd entry, so its primary group is unknown"
    except (OverflowError, TypeError, ValueError) as exc:
        return f"uid {userid} is not a valid user id ({exc})"
    except OSError as exc:  # NSS trouble (e.g. an LDAP server down)
        return f"looking up uid {userid} failed: {exc}"


def error_text(exc: BaseException) -> str:
    """A failed call, in one line: Kubernetes errors say enough; others get their type."""
    shown = exc if isinstance(exc, KubeError) else f"{type(exc).__name__}: {exc}"
    return untrusted.text(shown)
