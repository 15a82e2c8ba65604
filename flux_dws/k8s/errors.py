# SPDX-License-Identifier: LGPL-3.0-only
"""Kubernetes errors as one-line messages, and the pure rules that classify a failed request.

Every failure the adapter reports names the verb, the resource, the object and what happened,
so an admin reading a log at 3 a.m. knows where to look.  Whether a failure is worth retrying
is decided here, once, from the HTTP status or the transport error alone.
"""

from __future__ import annotations

import json
import re

from flux_dws.base import untrusted

#: HTTP statuses worth another attempt: throttling and server-side trouble.
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})

#: An RBAC denial ("... is forbidden: User "x" cannot patch resource ...") is an admin problem;
#: any other 403 on a workflow comes from the DWS admission webhook and is the user's.
_RBAC_DENIAL = re.compile(r"is forbidden: User \"")
_WEBHOOK_PREFIX = re.compile(r"^admission webhook \"[^\"]*\" denied the request:\s*")


def _one_line(text: object) -> str:
    return untrusted.text(str(text).strip())


class KubeError(Exception):
    """A Kubernetes request failed; ``str()`` is one line: verb, resource, name, what happened."""

    def __init__(
        self,
        verb: str,
        resource: str,
        name: str,
        what: str,
        *,
        status: int | None = None,
    ) -> None:
        self.verb = verb
        self.resource = resource
        self.name = name
        self.what = _one_line(what)
        self.status = status
        target = f"{resource} {name}".strip()
        super().__init__(f"{verb} {target}: {self.what}" if target else f"{verb}: {self.what}")


class WorkflowRejected(KubeError):
    """The DWS admission webhook refused a workflow (HTTP 403).

    ``message`` is the webhook's own reason, meant for the job's user.
    """

    def __init__(self, verb: str, resource: str, name: str, message: str) -> None:
        self.message = _one_line(message)
        super().__init__(verb, resource, name, f"rejected by DWS: {self.message}", status=403)


class NameTaken(KubeError):
    """A workflow with the job's name exists and is not this instance's: creating it again
    can never succeed (HTTP 409 on someone else's object)."""

    def __init__(self, verb: str, resource: str, name: str) -> None:
        super().__init__(
            verb,
            resource,
            name,
            "already exists and is not this instance's (ownership labels differ)",
            status=409,
        )


class KubeSetupError(KubeError):
    """The service cannot start: no API server, no credentials, or no DWS served.

    ``transient`` says whether trying again later may help (the API server is unreachable or
    overloaded), as opposed to a configuration that cannot work.
    """

    def __init__(self, what: str, *, transient: bool = False) -> None:
        super().__init__("connect", "", "", what)
        self.transient = transient


def status_body_message(body: str | None) -> str:
    """The ``message`` of a Kubernetes Status body, else the start of the body."""
    if not body:
        return ""
    try:
        parsed = json.loads(body)
    except ValueError:
        return _one_line(body[:200])
    if isinstance(parsed, dict):
        return _one_line(parsed.get("message") or "")
    return ""


def describe_status(status: int | None, reason: str | None, message: str) -> str:
    """ "HTTP 503 Service Unavailable: <server message>", one line."""
    head = f"HTTP {status}" if status else "request failed"
    if reason and reason not in message:
        head = f"{head} {reason}"
    return _one_line(f"{head}: {message}" if message else head)


def webhook_message(message: str) -> str | None:
    """The admission webhook's reason inside a 403 message, or None for an RBAC denial."""
    if _RBAC_DENIAL.search(message):
        return None
    return _WEBHOOK_PREFIX.sub("", _one_line(message))


def is_retryable_status(status: int | None) -> bool:
    """Throttling (429) and 5xx; never 4xx input problems."""
    return status in RETRYABLE_STATUSES


def is_permanent(exc: BaseException) -> bool:
    """Whether a failed call can never succeed by sending it again.

    A 4xx other than 409 (a conflict on our own object: re-read and retry) and 429
    (throttling) says the request itself is wrong; a workflow name taken by someone else
    stays taken; an exception that is not a Kubernetes or transport error comes from the
    client library refusing the call (e.g. an argument this client version does not know),
    which no retry fixes.  Transport trouble and 5xx are transient.
    """
    if isinstance(exc, NameTaken):
        return True
    if isinstance(exc, KubeError):
        status = exc.status
        if status is None or status in (409, 429) or status >= 500:
            return False
        return 400 <= status < 500
    return not isinstance(exc, (OSError, TimeoutError))
