# SPDX-License-Identifier: LGPL-3.0-only
"""What a request to kubeapi names: its path as a resource or a discovery document, its
Kubernetes verb, and the Status an injected fault answers with.  Pure; the handler
(flux_dws.testing.kubeapi.handler) serves what these name.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import params, subresources
from .errors import ApiError
from .resources import Resource, lookup


@dataclass(frozen=True)
class ResourcePath:
    resource: Resource
    version: str
    namespace: str | None
    name: str | None
    subresource: str | None = None  # "status", or one registered in subresources


@dataclass(frozen=True)
class DiscoveryPath:
    doc: str  # root | version | api | apis | group | resources | openapi/v2 | openapi/v3
    group: str = ""
    version: str = ""


def parse_path(path: str) -> ResourcePath | DiscoveryPath:
    """Map a URL path onto a discovery document or a resource (404 ApiError otherwise)."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return DiscoveryPath("root")
    if parts == ["version"]:
        return DiscoveryPath("version")
    if parts[:2] in (["openapi", "v2"], ["openapi", "v3"]):
        return _openapi_path(parts)
    if parts[0] == "api" and len(parts) == 1:
        return DiscoveryPath("api")
    if parts[0] == "apis" and len(parts) <= 2:
        return DiscoveryPath("apis") if len(parts) == 1 else DiscoveryPath("group", parts[1])
    if parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise path_not_found()
    if not rest:
        return DiscoveryPath("resources", group, version)
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    if len(rest) > 3:
        raise path_not_found()
    resource = lookup(group, version, rest[0])
    name = rest[1] if len(rest) >= 2 else None
    subresource = rest[2] if len(rest) == 3 else None
    if subresource is not None and not (
        (subresource == "status" and resource.has_status)
        or (resource.plural, subresource) in subresources.HANDLERS
    ):
        raise path_not_found()
    if (namespace is not None and not resource.namespaced) or (
        resource.namespaced and name is not None and namespace is None
    ):
        raise path_not_found()
    return ResourcePath(resource, version, namespace, name, subresource)


def _openapi_path(parts: list[str]) -> DiscoveryPath:
    if parts == ["openapi", "v2"]:
        return DiscoveryPath("openapi/v2")
    if len(parts) == 2:
        return DiscoveryPath("openapi/v3")
    rest = parts[2:]
    if rest[0] == "api" and len(rest) == 2:
        group, version = "", rest[1]
    elif rest[0] == "apis" and len(rest) == 3:
        group, version = rest[1], rest[2]
    else:
        raise path_not_found()
    return DiscoveryPath("openapi/v3", group, version)


def verb_of(method: str, target: ResourcePath, query: dict[str, str]) -> str:
    """The Kubernetes verb of a request (as used in counts and faults)."""
    item = target.name is not None
    verbs = {
        ("GET", True): "get",
        ("GET", False): "watch" if params.boolean(query, "watch") else "list",
        ("POST", False): "create",
        ("PUT", True): "update",
        ("PATCH", True): "patch",
        ("DELETE", True): "delete",
        ("DELETE", False): "deletecollection",
    }
    try:
        return verbs[(method, item)]
    except KeyError:
        raise ApiError(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ) from None


def injected_error(code: int, retry_after: int, plural: str) -> ApiError:
    """The Status a real API server would send with ``code`` (for injected faults)."""
    if code == 409:
        return ApiError(
            409,
            "Conflict",
            f"Operation cannot be fulfilled on {plural}: the object has been modified; please"
            " apply your changes to the latest version and try again",
        )
    if code == 504:
        return ApiError(
            504, "Timeout", "Timeout: request did not complete within the allotted time"
        )
    if code == 429:
        return ApiError(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
            {"retryAfterSeconds": retry_after},
        )
    if code == 503:
        return ApiError(
            503, "ServiceUnavailable", "the server is currently unable to handle the request"
        )
    return ApiError(code, "InternalError", "Internal error occurred: injected fault")


def path_not_found() -> ApiError:
    """The 404 for a path that names nothing served."""
    return ApiError(404, "NotFound", "the server could not find the requested resource")
