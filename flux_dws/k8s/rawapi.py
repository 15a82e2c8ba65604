# SPDX-License-Identifier: LGPL-3.0-only
"""JSON requests over the official client's connection pool and credentials, nothing more.

The generated layer of the ``kubernetes`` client (its pydantic call validation, parameter
marshalling, ``sanitize_for_serialization`` of every body and response deserialisation) cost
about 0.7 ms of CPU per request, more than the HTTP exchange itself (bench/bench_service.py,
profiled with py-spy).  flux-dws only sends JSON to a handful of paths, so it keeps what the
client is for -- kubeconfig and in-cluster credentials, token refresh, TLS, proxies and the
urllib3 pool that reuses connections -- and builds those few requests itself.  Failures look
exactly as the generated client's do (``ApiException`` for an HTTP error, urllib3 errors for
transport trouble), so flux_dws.k8s.calls bounds and counts them the same way.

``CustomObjects`` has the generated ``CustomObjectsApi``'s method names and arguments for the
calls flux-dws makes, so it replaces it one for one.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from kubernetes.client.exceptions import ApiException

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"

#: keyword -> query parameter, as the API server spells them
_QUERY = {
    "label_selector": "labelSelector",
    "limit": "limit",
    "_continue": "continue",
    "watch": "watch",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "resource_version": "resourceVersion",
    "timeout_seconds": "timeoutSeconds",
    "container": "container",
    "tail_lines": "tailLines",
    "limit_bytes": "limitBytes",
}


def _segment(value: Any) -> str:
    """One path segment; names come from untrusted objects, so nothing in one is a path."""
    return quote(str(value), safe="")


def _query(params: dict[str, Any]) -> str:
    pairs = []
    for key, value in params.items():
        if value is None or value is False or value == "":
            continue
        pairs.append((_QUERY[key], "true" if value is True else str(value)))
    return f"?{urlencode(pairs)}" if pairs else ""


def _timeout(value: Any) -> urllib3.Timeout | None:
    if value is None:
        return None
    if isinstance(value, tuple):
        return urllib3.Timeout(connect=value[0], read=value[1])
    return urllib3.Timeout(total=value)


class RawApi:
    """Send one request; the parsed JSON answer (or, unpreloaded, the urllib3 response)."""

    def __init__(self, api_client: Any) -> None:
        self._client = api_client
        self._cfg = api_client.configuration
        self._pool = api_client.rest_client.pool_manager
        self._host = self._cfg.host.rstrip("/")
        # Without a proxy every request goes to the one API server: its connection pool is
        # asked for straight away, not through the PoolManager's per-request URL parsing,
        # pool lookup and redirect handling (about a tenth of a request's CPU); a proxy's
        # manager is kept whole.
        self._direct = type(self._pool) is urllib3.PoolManager
        self._url = urllib3.util.parse_url(self._host)
        self._prefix = self._url.path or ""
        self._host_pool: Any = None

    def _connection_pool(self) -> Any:
        pool = self._host_pool
        if pool is None or pool.pool is None:  # none yet, or closed (the manager's clear())
            url = self._url
            pool = self._pool.connection_from_host(url.host, port=url.port, scheme=url.scheme)
            self._host_pool = pool
        return pool

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": JSON, **self._client.default_headers}
        if content_type:
            headers["Content-Type"] = content_type
        # The loaders' token hook runs in here (flux_dws.k8s.config throttles it).
        for setting in self._cfg.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        return headers

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = JSON,
        _request_timeout: Any = None,
        _preload_content: bool = True,
        raw: bool = False,
        **params: Any,
    ) -> Any:
        """``method path?params`` with ``body`` as JSON; ApiException for any non-2xx answer.

        The answer parsed as JSON, its bytes with ``raw``, or the open urllib3 response
        without ``_preload_content`` (a watch: the caller reads and closes it).
        """
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers(content_type if data is not None else None)
        target = path + _query(params)
        sent = {
            "body": data,
            "headers": headers,
            "timeout": _timeout(_request_timeout),
            "preload_content": _preload_content,
            "retries": False,  # flux_dws.k8s.calls retries, counting every attempt
        }
        if self._direct:
            pool = self._connection_pool()
            response = pool.urlopen(
                method, self._prefix + target, redirect=False, assert_same_host=False, **sent
            )
        else:
            response = self._pool.request(method, self._host + target, **sent)
        if not 200 <= response.status < 300:
            if not _preload_content:
                response.read()
                response.release_conn()
            error = ApiException(status=response.status, reason=response.reason)
            error.body = response.data.decode("utf-8", "replace") if response.data else ""
            error.headers = response.headers
            raise error
        if not _preload_content:
            return response
        if raw:
            return bytes(response.data)
        return json.loads(response.data) if response.data else {}


class CustomObjects:
    """The generated ``CustomObjectsApi`` calls flux-dws makes, over :class:`RawApi`."""

    def __init__(self, raw: RawApi) -> None:
        self.raw = raw

    @staticmethod
    def _path(group: str, version: str, namespace: str | None, plural: str, *rest: str) -> str:
        where = f"/namespaces/{_segment(namespace)}" if namespace is not None else ""
        tail = "".join(f"/{_segment(p)}" for p in rest)
        return f"/apis/{_segment(group)}/{_segment(version)}{where}/{_segment(plural)}{tail}"

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, **kw: Any
    ) -> Any:
        return self.raw.request("GET", self._path(group, version, namespace, plural, name), **kw)

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, **kw: Any
    ) -> Any:
        return self.raw.request("GET", self._path(group, version, namespace, plural), **kw)

    def list_cluster_custom_object(self, group: str, version: str, plural: str, **kw: Any) -> Any:
        return self.raw.request("GET", self._path(group, version, None, plural), **kw)

    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: Any, **kw: Any
    ) -> Any:
        path = self._path(group, version, namespace, plural)
        return self.raw.request("POST", path, body=body, **kw)

    def patch_namespaced_custom_object(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        body: Any,
        _content_type: str = MERGE_PATCH,
        **kw: Any,
    ) -> Any:
        path = self._path(group, version, namespace, plural, name)
        return self.raw.request("PATCH", path, body=body, content_type=_content_type, **kw)

    def delete_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, **kw: Any
    ) -> Any:
        path = self._path(group, version, namespace, plural, name)
        return self.raw.request("DELETE", path, **kw)


class Core:
    """The core/v1 reads flux-dws makes: a Secret, pods by label, a container's log."""

    def __init__(self, raw: RawApi) -> None:
        self.raw = raw

    def read_namespaced_secret(self, name: str, namespace: str, **kw: Any) -> Any:
        path = f"/api/v1/namespaces/{_segment(namespace)}/secrets/{_segment(name)}"
        return self.raw.request("GET", path, **kw)

    def list_namespaced_pod(self, namespace: str, **kw: Any) -> Any:
        return self.raw.request("GET", f"/api/v1/namespaces/{_segment(namespace)}/pods", **kw)

    def read_namespaced_pod_log(self, name: str, namespace: str, **kw: Any) -> bytes:
        path = f"/api/v1/namespaces/{_segment(namespace)}/pods/{_segment(name)}/log"
        return self.raw.request("GET", path, raw=True, **kw)
