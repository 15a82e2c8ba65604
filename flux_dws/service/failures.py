# SPDX-License-Identifier: LGPL-3.0-only
"""When a job's Kubernetes call fails, or its workflow cannot be read: the service's rules.

A mixin of the service (with flux_dws.service.actions.ActionRunner).  Everything from Kubernetes is
untrusted and every call bounded: a call that can never succeed fails the job at once with
the API's message; a transient failure is retried with backoff for at most the timeout of
the state the workflow is in; a workflow that cannot be read is never taken as gone (its job
is held until a readable version arrives).
"""

from __future__ import annotations

import logging
import pwd
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flux_dws.base.fsd import format_fsd
from flux_dws.core.states import State
from flux_dws.flux.transport import RpcError
from flux_dws.k8s import KubeError
from flux_dws.k8s.errors import is_permanent

if TYPE_CHECKING:
    from flux_dws.service.actions import Done, Tracked

log = logging.getLogger("flux-dws")

RETRY_MIN = 0.5  # seconds before retrying a job whose action failed; doubles up to RETRY_MAX
RETRY_MAX = 60.0


class FailureRules:
    """``_call_failed``, ``_patch_failed`` and ``_unreadable``; see the module docstring."""

    def _call_failed(self, tracked: Tracked, what: str, exc: BaseException, done: Done) -> None:
        """A Kubernetes call of the job's chain failed.

        A call that can never succeed (flux_dws.k8s.errors.is_permanent) fails the job at
        once with the API's message; a transient failure is retried with backoff (the chain
        reports the error) until it has lasted the current state's timeout, then fails the
        job.  A job already failed keeps retrying, with backoff: its workflow must still go.
        """
        text = _error_text(exc)
        now = self.loop.time()
        if tracked.failing_since is None:
            tracked.failing_since = now
        why = self._why_give_up(tracked, what, exc, text, now - tracked.failing_since)
        if why is None:
            done(text)
            return
        tracked.failing_since = None
        self._fail_job(tracked, why, done)

    def _patch_failed(self, tracked: Tracked, name: str, state: State, exc: BaseException) -> None:
        """A desiredState patch (sent outside the chain) failed: as _call_failed, but the
        retry is a later decision (the job's chain may be busy with something else)."""
        text = _error_text(exc)
        now = self.loop.time()
        if tracked.patch_failing_since is None:
            tracked.patch_failing_since = now
        gone = isinstance(exc, KubeError) and exc.status == 404  # the watch will say so
        since = now - tracked.patch_failing_since
        why = (
            None
            if gone
            else self._why_give_up(tracked, f"asking for {state.value}", exc, text, since)
        )
        if why is not None:
            tracked.patch_failing_since = None
            self._fail_job(tracked, why, self._retry_on_error(tracked))
            return
        delay = self._retry_later(tracked)
        log.warning(
            "job %d workflow %s: asking for %s failed: %s; retrying in %.1fs",
            tracked.jobid,
            name,
            state.value,
            text,
            delay,
        )

    def _retry_later(self, tracked: Tracked) -> float:
        """Decide for the job again after a backoff (0.5 s doubling to a minute) and return
        the delay.  For calls sent outside the job's chain (a patch, a post): the chain has
        ended by then, so their backoff is their own, reset only when one succeeds."""
        tracked.async_retry = min(max(tracked.async_retry * 2, RETRY_MIN), RETRY_MAX)
        self.loop.call_later(tracked.async_retry, self._kick, tracked.jobid)
        return tracked.async_retry

    def _why_give_up(
        self, tracked: Tracked, what: str, exc: BaseException, text: str, failing_for: float
    ) -> str | None:
        """The job's exception note when a failed call should fail the job, else None."""
        record = tracked.record
        if record is None or record.get("exception"):
            return None  # nothing left to fail: keep retrying (with backoff)
        if is_permanent(exc):
            return f"{what} failed: {text}"
        limit = self._state_timeout(tracked)
        if failing_for >= limit:
            return f"{what} kept failing for {format_fsd(limit)}: {text}"
        return None

    def _state_timeout(self, tracked: Tracked) -> float:
        """The timeout of the state the job's workflow is in (Proposal before it exists)."""
        key = tracked.workflow.desired_state.key if tracked.workflow else "proposal"
        request = tracked.request[0] if tracked.request else None
        if request is not None:
            return request.timeouts[key]
        return self.policy.timeout(key).default

    def _unreadable(self, tracked: Tracked) -> bool:
        """True (hold the job) while its workflow's latest version cannot be read.

        Such a workflow is neither gone nor understood: deciding from it could fail the job
        or leak its storage, so nothing is done until a readable version arrives.  The admin
        (log) and the job (a dws-workflow-unreadable event) are told once per problem.
        """
        if not tracked.unreadable:
            tracked.alarmed = ""
            return False
        if tracked.timer:
            tracked.timer.cancel()
            tracked.timer = None
        # A held job keeps no Proposal slot ([dws] max-proposals): the others go on.  It takes
        # one again (even past the limit) once its workflow can be read.
        self._wake(self.window.leave(tracked.jobid))
        if tracked.alarmed != tracked.unreadable:
            tracked.alarmed = tracked.unreadable
            name = _name(tracked.raw or {})
            log.error(
                "job %d workflow %s: cannot read the workflow: %s; the job stays held and the "
                "workflow is kept until a readable version arrives (fix the object, or "
                "upgrade flux-dws if DWS added a value)",
                tracked.jobid,
                name,
                tracked.unreadable,
            )
            if tracked.record is not None:
                context = {"workflow": name, "problem": tracked.unreadable}
                self.jm.post(tracked.jobid, "dws-workflow-unreadable", context, _ignore)
        return True


def primary_group(userid: int) -> int | str:
    """The primary gid of ``userid`` from the passwd database, or why it cannot be had."""
    try:
        return pwd.getpwuid(userid).pw_gid
    except KeyError:
        return f"uid {userid} has no passwd entry, so its primary group is unknown"
    except (OverflowError, TypeError, ValueError) as exc:
        return f"uid {userid} is not a valid user id ({exc})"
    except OSError as exc:  # NSS trouble (e.g. an LDAP server down)
        return f"looking up uid {userid} failed: {exc}"


def _ignore(_response: Any, _error: RpcError | None) -> None:
    """An answer nobody waits for (an alarm event: the log line already said it)."""


def _error_text(exc: BaseException) -> str:
    """A failed call, in one line: Kubernetes errors say enough; others get their type."""
    return str(exc) if isinstance(exc, KubeError) else f"{type(exc).__name__}: {exc}"


def _name(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return str(name) if name else "?"
