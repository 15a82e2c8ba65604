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

    def status(self) -> dict[str, Any]:
        """The v1 Status object for this error."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
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
    """422 Invalid, worded like the API server's field validation."""
    joined = causes[0] if len(causes) == 1 else "[" + ", ".join(causes) + "]"
    return ApiError(422, "Invalid", f'{kind_group} "{name}" is invalid: {joined}')


def expired(requested: int, oldest: int) -> ApiError:
    return ApiError(410, "Expired", f"too old resource version: {requested} ({oldest})")


def _details(qualified: str, name: str) -> dict[str, Any]:
    plural, _, group = qualified.partition(".")
    details: dict[str, Any] = {"name": name, "kind": plural}
    if group:
        details["group"] = group
    return details
