# SPDX-License-Identifier: LGPL-3.0-only
"""One Kubernetes request, bounded: a timeout per attempt, jittered retries, every attempt counted.

urllib3's own retries are turned off (flux_dws.k8s.config) so that every attempt is ours to
count (``counts``), log, report to an observer (API health, metrics) and bound: a request
timeout per attempt, then jittered exponential backoff for retryable failures (connection
trouble, 429, 5xx), at most ``retries`` times.  Thread-safe.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import Counter
from typing import Any, Callable, Protocol, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException

from flux_dws.k8s.backoff import backoff_delay, retry_after
from flux_dws.k8s.errors import (
    KubeError,
    WorkflowRejected,
    describe_status,
    is_retryable_status,
    status_body_message,
    webhook_message,
)

log = logging.getLogger("flux-dws.k8s")

T = TypeVar("T")

#: Failures below HTTP: refused or reset connections, timeouts, truncated bodies.
TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)

MERGE_PATCH = "application/merge-patch+json"


class RequestObserver(Protocol):
    """Told of every request attempt (API health, metrics); called on the calling thread."""

    def attempt_started(self, verb: str, resource: str) -> Any:
        """An attempt begins; the value returned comes back to ``attempt_ended``."""

    def attempt_ended(self, token: Any, verb: str, code: int | None, attempt: int) -> None:
        """It ended with HTTP status ``code`` (None: no HTTP answer); ``attempt`` > 1 is a retry."""


class Calls:
    """Send requests with the bounds above; see the module docstring."""

    def __init__(
        self,
        *,
        timeout: float = 10.0,
        retries: int = 5,
        backoff_base: float = 0.1,
        backoff_max: float = 5.0,
    ) -> None:
        self.timeout = timeout
        self.retries = retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.counts: Counter[str] = Counter()
        self.observer: RequestObserver | None = None
        self._lock = threading.Lock()

    def timeouts(self) -> tuple[float, float]:
        """(connect, read) seconds for one attempt.  A pair, never one number: clients
        before the pydantic-generated ones take a lone timeout only as an int and silently
        ignore a float, which would leave a hanging request without any bound."""
        return (self.timeout, self.timeout)

    def snapshot(self) -> dict[str, int]:
        """``counts`` as they are now, safe to read from any thread."""
        with self._lock:
            return dict(self.counts)

    def count(self, verb: str) -> None:
        with self._lock:
            self.counts[verb] += 1

    def call(
        self,
        verb: str,
        resource: str,
        target: str,
        fn: Callable[..., T],
        *args: Any,
        retry_conflict: bool = False,
        timeout_arg: bool = True,
        retries: int | None = None,
        **kwargs: Any,
    ) -> T:
        """One request with a timeout per attempt and bounded, jittered retries.

        ``retry_conflict``: a 409 on an unconditional patch only means the server lost a race
        with another writer; sending the same patch again is correct.
        """
        if timeout_arg:
            kwargs["_request_timeout"] = self.timeouts()
        attempt = 0
        while True:
            attempt += 1
            self.count(verb)
            hint: float | None = None
            observer = self.observer
            token = observer.attempt_started(verb, resource) if observer else None
            code: int | None = None
            try:
                result = fn(*args, **kwargs)
                code = 200
                return result
            except ApiException as exc:
                code = exc.status or None
                error = self.api_error(verb, resource, target, exc)
                retryable = is_retryable_status(exc.status) or (
                    retry_conflict and exc.status == 409
                )
                if exc.status == 429 and exc.headers:
                    hint = retry_after(exc.headers.get("Retry-After"), self.backoff_max)
                cause: BaseException = exc
            except TRANSPORT_ERRORS as exc:
                error = transport_error(verb, resource, target, exc)
                retryable = True
                cause = exc
            finally:
                if observer is not None:
                    observer.attempt_ended(token, verb, code, attempt)
            if not retryable:
                raise error from cause
            if attempt > (self.retries if retries is None else retries):
                if retries != 0:  # a probe's failure is the caller's to report
                    log.warning("%s; giving up after %d attempts", error, attempt)
                raise error from cause
            delay = max(hint or 0.0, self.backoff(attempt))  # Retry-After is a minimum
            log.info("%s; retry %d of %d in %.2fs", error, attempt, self.retries, delay)
            time.sleep(delay)

    def backoff(self, attempt: int) -> float:
        return backoff_delay(attempt, base=self.backoff_base, cap=self.backoff_max)

    def api_error(self, verb: str, resource: str, target: str, exc: ApiException) -> KubeError:
        message = status_body_message(exc.body)
        if exc.status == 403 and resource == "workflow" and verb in ("create", "patch"):
            reason = webhook_message(message)
            if reason:
                return WorkflowRejected(verb, resource, target, reason)
        return KubeError(
            verb,
            resource,
            target,
            describe_status(exc.status, exc.reason, message),
            status=exc.status,
        )


def merge_patch_kwargs(patch: Callable[..., Any]) -> dict[str, str]:
    """The keyword that makes ``patch`` send a JSON merge patch, if this client has one.

    The pydantic-generated clients (37.0.2 is tested) take ``_content_type``; older ones
    (24.2.0 and 33.1.0 are tested) always send a merge patch for custom objects and refuse
    any keyword they do not list (ApiTypeError), so it is passed only where the signature
    names it.
    """
    try:
        parameters = inspect.signature(patch).parameters
    except (TypeError, ValueError):
        return {}
    return {"_content_type": MERGE_PATCH} if "_content_type" in parameters else {}


def transport_error(verb: str, resource: str, target: str, exc: BaseException) -> KubeError:
    return KubeError(verb, resource, target, f"API server unreachable: {type(exc).__name__}: {exc}")
