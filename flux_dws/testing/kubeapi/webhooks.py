# SPDX-License-Identifier: LGPL-3.0-only
"""Remote admission webhooks, called as kube-apiserver calls them (tests only).

A ``MutatingWebhookConfiguration`` or ``ValidatingWebhookConfiguration`` manifest gives the
webhooks; :func:`load` reads them, with each ``clientConfig`` rewritten to a ``url`` (a
service has no meaning here).  :class:`RemoteWebhook` sends an AdmissionReview v1 over
HTTPS, verifying the server's certificate against the ``caBundle`` (the system's roots when
there is none), bound by ``timeoutSeconds`` (10 s by default).  As kube-apiserver:

- a call that fails (no connection, a bad certificate, a timeout, an answer that is not an
  AdmissionReview for this request) is, with ``failurePolicy: Fail``, a 500 whose message
  starts ``failed calling webhook "<name>":``; with ``Ignore`` the webhook is passed over;
- a denial is the answer's status code (at least 400; 403 from controller-runtime) and
  ``admission webhook "<name>" denied the request: <message>``;
- a mutating webhook's base64 JSONPatch is applied to the object (patches.json_patch).

Rules match on API group, resource and operation ("*" matches any); every version of a kind
is the same here, so the request is sent in the first version the rule lists (as
``matchPolicy: Equivalent`` converts to it).  namespaceSelector and objectSelector are not
read: every object of a matching kind is sent.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ApiError
from .patches import json_patch
from .resources import by_plural

DEFAULT_TIMEOUT = 10  # seconds: admissionregistration/v1's default timeoutSeconds
KINDS = {"MutatingWebhookConfiguration": True, "ValidatingWebhookConfiguration": False}


@dataclass(frozen=True)
class Rule:
    groups: tuple[str, ...]
    versions: tuple[str, ...]
    resources: tuple[str, ...]
    operations: tuple[str, ...]

    def matches(self, group: str, plural: str, operation: str) -> bool:
        return all(
            "*" in allowed or value in allowed
            for allowed, value in (
                (self.groups, group),
                (self.resources, plural),
                (self.operations, operation),
            )
        )


@dataclass(frozen=True)
class RemoteWebhook:
    """One webhook of a configuration: where it is, what it matches, how it may fail."""

    name: str
    mutating: bool
    url: str
    ca_bundle: bytes | None  # PEM; None: the system's trust roots
    rules: tuple[Rule, ...]
    failure_policy: str = "Fail"
    timeout: int = DEFAULT_TIMEOUT

    def rule_for(self, plural: str, operation: str) -> Rule | None:
        group = by_plural(plural).group
        return next((r for r in self.rules if r.matches(group, plural, operation)), None)

    def admit(self, plural: str, operation: str, old: dict | None, new: dict) -> dict:
        """``new`` as this webhook leaves it; ApiError when it denies or fails closed."""
        rule = self.rule_for(plural, operation)
        if rule is None:
            return new
        uid = str(uuid.uuid4())
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": _request(uid, rule, plural, operation, old, new),
        }
        try:
            response = _verified(uid, self._post(review))
        except _CallFailed as failure:
            if self.failure_policy == "Ignore":
                return new
            raise ApiError(
                500,
                "InternalError",
                f'Internal error occurred: failed calling webhook "{self.name}": {failure}',
            ) from None
        if not response.get("allowed"):
            raise _denial(self.name, response.get("status"))
        patch = response.get("patch")
        if not self.mutating or not patch:
            return new
        try:
            operations = json.loads(base64.b64decode(patch))
        except (ValueError, TypeError) as exc:
            raise ApiError(500, "InternalError", f"Internal error occurred: {exc}") from None
        patched = json_patch(new, operations)
        for field in ("apiVersion", "kind"):  # the request carried them; the store keeps its own
            if field in new:
                patched[field] = new[field]
            else:
                patched.pop(field, None)
        return patched

    def _post(self, review: dict) -> dict:
        parts = urllib.parse.urlsplit(self.url)
        target = f"{self.url}?timeout={self.timeout}s"
        deadline = time.monotonic() + self.timeout
        context = ssl.create_default_context(
            cadata=self.ca_bundle.decode() if self.ca_bundle else None
        )
        connection = http.client.HTTPSConnection(
            parts.hostname or "", parts.port or 443, timeout=self.timeout, context=context
        )
        body = json.dumps(review).encode()
        try:
            connection.request(
                "POST",
                f"{parts.path or '/'}?timeout={self.timeout}s",
                body,
                {"Content-Type": "application/json", "Accept": "application/json"},
            )
            if connection.sock is not None:
                connection.sock.settimeout(max(0.001, deadline - time.monotonic()))
            answer = connection.getresponse()
            data = answer.read()
        except (socket.timeout, TimeoutError):
            raise _CallFailed(
                f'failed to call webhook: Post "{target}": context deadline exceeded'
            ) from None
        except ssl.SSLCertVerificationError as exc:
            raise _CallFailed(
                f'failed to call webhook: Post "{target}": tls: failed to verify certificate:'
                f" x509: {exc.verify_message}"
            ) from None
        except OSError as exc:
            reason = _dial_error(parts, exc)
            raise _CallFailed(f'failed to call webhook: Post "{target}": {reason}') from None
        finally:
            connection.close()
        if answer.status != 200:
            raise _CallFailed(
                f"failed to call webhook: the server responded with the status code"
                f" {answer.status} but did not return more information"
            )
        try:
            decoded = json.loads(data)
        except ValueError as exc:
            raise _CallFailed(f"received invalid webhook response: {exc}") from None
        return decoded if isinstance(decoded, dict) else {}


class _CallFailed(Exception):
    """The webhook could not be called or gave no usable answer (the failure policy's case)."""


def load(docs: Iterable[Any], url_for: Callable[[dict], str], ca_bundle: bytes | None):
    """The webhooks of every webhook configuration in ``docs``, mutating ones first.

    ``url_for`` gives each webhook's ``url`` from its ``clientConfig`` (e.g. a service's path
    on a local server); ``ca_bundle`` (PEM) replaces any the manifest has.
    """
    found: list[RemoteWebhook] = []
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") not in KINDS:
            continue
        for hook in doc.get("webhooks") or []:
            if "v1" not in (hook.get("admissionReviewVersions") or ["v1"]):
                raise ValueError(f"webhook {hook.get('name')} does not speak AdmissionReview v1")
            if hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
                raise ValueError(f"webhook {hook.get('name')} has side effects")
            url = url_for(hook.get("clientConfig") or {})
            problem = _url_problem(url)
            if problem:
                raise ValueError(f"webhook {hook.get('name')}: {problem}")
            found.append(
                RemoteWebhook(
                    name=hook["name"],
                    mutating=KINDS[doc["kind"]],
                    url=url,
                    ca_bundle=ca_bundle,
                    rules=tuple(
                        Rule(
                            tuple(r.get("apiGroups") or ()),
                            tuple(r.get("apiVersions") or ()),
                            tuple(r.get("resources") or ()),
                            tuple(r.get("operations") or ()),
                        )
                        for r in hook.get("rules") or []
                    ),
                    failure_policy=hook.get("failurePolicy") or "Fail",
                    timeout=int(hook.get("timeoutSeconds") or DEFAULT_TIMEOUT),
                )
            )
    return sorted(found, key=lambda h: not h.mutating)  # stable: manifest order within each


def _url_problem(url: str) -> str | None:
    """What admissionregistration/v1 refuses in a webhook's ``url``, or None."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https":
        return f"url: Invalid value: \"{url}\": 'https' is the only allowed URL scheme"
    if not parts.hostname:
        return f'url: Invalid value: "{url}": host must be specified'
    if parts.username is not None or parts.password is not None:
        return f'url: Invalid value: "{url}": user information is not permitted in the URL'
    if parts.fragment or "#" in url:
        return f'url: Invalid value: "{url}": fragments are not permitted in the URL'
    if parts.query or "?" in url:
        return f'url: Invalid value: "{url}": query parameters are not permitted in the URL'
    return None


def plurals(hooks: Iterable[RemoteWebhook]) -> set[str]:
    """The served kinds the webhooks' rules name."""
    return {p for h in hooks for r in h.rules for p in r.resources if p != "*"}


def _request(
    uid: str, rule: Rule, plural: str, operation: str, old: dict | None, new: dict
) -> dict:
    resource = by_plural(plural)
    version = next((v for v in rule.versions if v in resource.versions), resource.versions[0])
    api_version = f"{resource.group}/{version}" if resource.group else version
    meta = new.get("metadata") or {}
    kind = {"group": resource.group, "version": version, "kind": resource.kind}
    gvr = {"group": resource.group, "version": version, "resource": plural}
    request: dict[str, Any] = {
        "uid": uid,
        "kind": kind,
        "resource": gvr,
        "requestKind": kind,
        "requestResource": gvr,
        "name": meta.get("name", ""),
        "operation": operation,
        "userInfo": {"username": "kubeapi", "groups": ["system:masters"]},
        "object": {**new, "apiVersion": api_version, "kind": resource.kind},
        "oldObject": None
        if old is None
        else {**old, "apiVersion": api_version, "kind": resource.kind},
        "dryRun": False,
        "options": {
            "apiVersion": "meta.k8s.io/v1",
            "kind": "CreateOptions" if operation == "CREATE" else "UpdateOptions",
        },
    }
    if resource.namespaced:
        request["namespace"] = meta.get("namespace", "")
    return request


def _verified(uid: str, review: dict) -> dict:
    """The review's response, checked as kube-apiserver's VerifyAdmissionResponse checks it."""
    if review.get("apiVersion") != "admission.k8s.io/v1" or review.get("kind") != (
        "AdmissionReview"
    ):
        raise _CallFailed(
            "received invalid webhook response: expected webhook response of"
            f" admission.k8s.io/v1, Kind=AdmissionReview, got"
            f" {review.get('apiVersion')}, Kind={review.get('kind')}"
        )
    response = review.get("response")
    if not isinstance(response, dict):
        raise _CallFailed("received invalid webhook response: webhook response was absent")
    if response.get("uid") != uid:
        raise _CallFailed(
            f"received invalid webhook response: expected response.uid={uid!r},"
            f" got {response.get('uid')!r}"
        )
    if response.get("patch") and response.get("patchType") != "JSONPatch":
        raise _CallFailed(
            f"received invalid webhook response: webhook returned invalid patchType:"
            f" {response.get('patchType')!r}"
        )
    return response


def _denial(name: str, status: Any) -> ApiError:
    """webhookerrors.ToStatusErr: the answer's code (400 at least), its message prefixed."""
    status = status if isinstance(status, dict) else {}
    code = status.get("code") if isinstance(status.get("code"), int) else 0
    denied = f'admission webhook "{name}" denied the request'
    if status.get("message"):
        message = f"{denied}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied}: {status['reason']}"
    else:
        message = f"{denied} without explanation"
    return ApiError(max(code, 400), str(status.get("reason") or ""), message, status.get("details"))


def _dial_error(parts: urllib.parse.SplitResult, exc: OSError) -> str:
    """Go's net/http words for what went wrong (a server that hangs up mid-answer: EOF)."""
    if isinstance(exc, ConnectionResetError):  # http.client.RemoteDisconnected is one
        return "EOF"
    if isinstance(exc, ConnectionRefusedError):
        return f"dial tcp {parts.netloc}: connect: connection refused"
    if isinstance(exc, ssl.SSLError):
        return f"remote error: tls: {exc.reason or exc}"
    return f"dial tcp {parts.netloc}: {exc.strerror or exc}"
