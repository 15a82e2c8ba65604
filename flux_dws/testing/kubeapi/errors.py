# SPDX-License-Identifier: LGPL-3.0-only
"""ApiError: a Kubernetes API failure, carried as the v1 Status body a real server sends."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An API request failed with ``code``/``reason``/``message``, as in a v1 Status.

    Raised by the store and by admission hooks; the HTTP server turns it into the Status
    body, so in-process callers and HTTP clients see the same failure.
    """

    def __init__(
        self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.metadata: dict[str, Any] = {}  # ListMeta of the Status (a 410's continue token)

    def status(self) -> dict[str, Any]:
        """The v1 Status object for this error."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": dict(self.metadata),
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body

    def __repr__(self) -> str:
        return f"ApiError({self.code}, {self.reason!r}, {self.message!r})"


def not_found(qualified: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{qualified} "{name}" not found', _details(qualified, name))


def already_exists(qualified: str, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{qualified} "{name}" already exists', _details(qualified, name)
    )


def conflict(qualified: str, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified;'
        " please apply your changes to the latest version and try again",
        _details(qualified, name),
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(kind_group: str, name: str, causes: list[str]) -> ApiError:
    """422 Invalid, worded like the API server's field validation.

    Each cause is "field: message" as Go's field.Error prints it; the Status carries them
    as details.causes (with the kind and name), from which kubectl prints
    'The Workflow "x" is invalid: spec.desiredState: ...'.
    """
    joined = causes[0] if len(causes) == 1 else "[" + ", ".join(causes) + "]"
    kind, _, group = kind_group.partition(".")
    details: dict[str, Any] = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    details["causes"] = [_cause(text) for text in causes]
    return ApiError(422, "Invalid", f'{kind_group} "{name}" is invalid: {joined}', details)


#: Go's field.ErrorType strings -> the StatusCause reason the server sends for each.
_CAUSE_REASONS = (
    ("Required value", "FieldValueRequired"),
    ("Unsupported value", "FieldValueNotSupported"),
    ("Duplicate value", "FieldValueDuplicate"),
    ("Forbidden", "FieldValueForbidden"),
    ("Too long", "FieldValueTooLong"),
    ("Too many", "FieldValueTooMany"),
    ("Internal error", "InternalError"),
    ("Not found", "FieldValueNotFound"),
    ("Invalid value", "FieldValueInvalid"),
)


def _cause(text: str) -> dict[str, str]:
    field, sep, message = text.partition(": ")
    if not sep:
        field, message = "", text
    reason = next((r for prefix, r in _CAUSE_REASONS if message.startswith(prefix)), "")
    if reason == "FieldValueInvalid" and " must be of type " in message:
        reason = "FieldValueTypeInvalid"
    return {"reason": reason, "message": message, "field": field}


def go_strings(values: list[str]) -> str:
    """A []string as Go's %#v prints it: []string{"a", "b"}."""
    return "[]string{" + ", ".join(go_quote(v) for v in values) + "}"


def go_quote(text: str) -> str:
    """A string as Go's %q prints it (strconv.Quote, for the characters we meet)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = escaped.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    return '"' + "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in escaped) + '"'


def expired(requested: int, oldest: int) -> ApiError:
    return ApiError(410, "Expired", f"too old resource version: {requested} ({oldest})")


def _details(qualified: str, name: str) -> dict[str, Any]:
    plural, _, group = qualified.partition(".")
    details: dict[str, Any] = {"name": name, "kind": plural}
    if group:
        details["group"] = group
    return details
