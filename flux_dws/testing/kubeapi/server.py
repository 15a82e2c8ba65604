# SPDX-License-Identifier: LGPL-3.0-only
"""KubeApi: the store served over HTTP/1.1 on 127.0.0.1 for the real kubernetes client and kubectl.

Routing and the HTTP details live here; object semantics live in the store.  Watches stream
newline-delimited JSON events with chunked transfer encoding; a too-old resourceVersion is a
200 answer carrying one ERROR event with a 410 Status, as a real API server sends it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from . import discovery, errors, openapi, params, podlog, protobuf, subresources
from .errors import ApiError
from .faults import Faults
from .managed import Manager
from .resources import CORE_VERSIONS, Resource, groups, lookup, served
from .store import Store, Watch, Write
from .tables import table, wants_table

log = logging.getLogger("flux-dws.testing.kubeapi")

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
IDLE_PROBE = 1.0  # seconds between checks that a quiet watch's client is still there


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
        raise _not_found()
    if not rest:
        return DiscoveryPath("resources", group, version)
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    if len(rest) > 3:
        raise _not_found()
    resource = lookup(group, version, rest[0])
    name = rest[1] if len(rest) >= 2 else None
    subresource = rest[2] if len(rest) == 3 else None
    if subresource is not None and not (
        (subresource == "status" and resource.has_status)
        or (resource.plural, subresource) in subresources.HANDLERS
    ):
        raise _not_found()
    if (namespace is not None and not resource.namespaced) or (
        resource.namespaced and name is not None and namespace is None
    ):
        raise _not_found()
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
        raise _not_found()
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


class _Stream:
    """An open HTTP watch stream, so faults can cut it."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.cut: str | None = None  # None | "graceful" | "abrupt"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: KubeApi


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "flux-dws-kubeapi"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Answers are written in pieces (headers, body, watch events): without NODELAY, Nagle
        # and delayed ACKs add ~40 ms to each.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.api._connections.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.api._connections.discard(self.connection)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        if log.isEnabledFor(logging.DEBUG):  # called for every request: format only if shown
            log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._handle("PUT")

    def do_PATCH(self) -> None:  # noqa: N802
        self._handle("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle("DELETE")

    # ---- dispatch ------------------------------------------------------------------------

    def _handle(self, method: str) -> None:
        api = self.server.api
        url = urlsplit(self.path)
        raw_query = parse_qs(url.query, keep_blank_values=True)
        query = {k: v[-1] for k, v in raw_query.items()}
        self._dry_run_values = raw_query.get("dryRun", [])
        self._query = query
        self._warnings: list[str] = []
        try:
            body = self._read_body()
            pod_log = podlog.match(url.path) if method == "GET" else None
            if pod_log is not None:  # the one subresource served (text/plain)
                api._count("get", "pods/log")
                self._send_text(200, podlog.serve(api.store, *pod_log, query))
                return
            target = parse_path(url.path)
            if isinstance(target, ResourcePath) and not api.serves(target.resource.group):
                raise _not_found()
            if isinstance(target, DiscoveryPath):
                if method != "GET":
                    raise ApiError(405, "MethodNotAllowed", "discovery documents are read-only")
                self._send_json(200, api.discovery(target))
                return
            if target.subresource not in (None, "status"):
                self._serve_subresource(method, target, query, body)
                return
            verb = verb_of(method, target, query)
            api._count(verb, target.resource.plural)
            decision = api.faults.decide(target.resource.plural, verb)
            if decision.latency:
                time.sleep(decision.latency)
            if decision.drop:
                log.info("fault: dropping %s %s", method, url.path)
                self._abort()
                return
            if decision.error is not None:
                log.info("fault: answering %s %s with %d", method, url.path, decision.error)
                retry = api.faults.settings.retry_after
                headers = {"Retry-After": str(retry)} if decision.error == 429 else {}
                self._send_error(
                    injected_error(decision.error, retry, target.resource.plural), headers
                )
                return
            if verb == "list" and query.get("continue"):
                api.faults.wait_for_page(target.resource.plural)  # a held page (faults)
            self._serve(verb, target, query, body)
        except ApiError as exc:
            self._send_error(exc)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # never let a bug kill the connection silently
            log.exception("kubeapi: %s %s failed", method, self.path)
            self._send_error(ApiError(500, "InternalError", f"Internal error occurred: {exc}"))

    def _serve(self, verb: str, target: ResourcePath, query: dict[str, str], body: Any) -> None:
        """Answer from the stored objects themselves (shared=True): they are only encoded."""
        store = self.server.api.store
        plural, namespace, name = target.resource.plural, target.namespace, target.name
        if verb == "watch":
            self._serve_watch(target, query)
            return
        if verb == "list":
            self._serve_list(target, query)
            return
        if verb == "get":
            obj = self._versioned(target, store.get(plural, namespace, name or "", shared=True))
            if wants_table(self.headers.get("Accept", "")):
                rv = obj["metadata"]["resourceVersion"]
                self._send_json(200, self._table(target, [obj], rv, query))
            else:
                self._send_json(200, obj)
            return
        if verb == "delete":
            self._serve_delete(target, body)
            return
        if verb == "deletecollection":
            self._serve_delete_collection(target, query, body)
            return
        options = {"create": "CreateOptions", "update": "UpdateOptions", "patch": "PatchOptions"}
        write = self._write(target, query, options[verb])
        params.check_field_validation(query)
        if verb == "create":
            if target.subresource is not None:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
            obj = _object_body(body)
            self._check_fields(target, query, obj)
            created = store.create(plural, namespace, obj, shared=True, write=write)
            self._send_json(201, self._versioned(target, created))
        elif verb == "update":
            obj = _object_body(body)
            self._check_fields(target, query, obj)
            replaced = store.replace(plural, namespace, name or "", obj, shared=True, write=write)
            self._send_json(200, self._versioned(target, replaced))
        elif self._content_type() == APPLY_PATCH:
            force = params.boolean(query, "force")
            if not query.get("fieldManager"):
                raise errors.invalid(
                    "PatchOptions.meta.k8s.io",
                    "",
                    ["fieldManager: Required value: is required for apply patch"],
                )
            applied = _object_body(body)
            self._check_fields(target, query, applied)
            write = Write(
                Manager(write.manager.name if write.manager else "", "Apply", write.subresource),
                write.subresource,
                write.dry_run,
                write.api_version,
            )
            obj, created = store.apply(
                plural, namespace, name or "", applied, write, force=force, shared=True
            )
            self._send_json(201 if created else 200, self._versioned(target, obj))
        else:
            if "force" in query:
                raise errors.invalid(
                    "PatchOptions.meta.k8s.io",
                    "",
                    ["force: Forbidden: may not be specified for non-apply patch"],
                )
            patch = self._patch_body(target, body)
            if isinstance(patch, dict):  # a merge patch mirrors the object: same field checks
                self._check_fields(target, query, patch)
            patched = store.patch(plural, namespace, name or "", patch, shared=True, write=write)
            self._send_json(200, self._versioned(target, patched))

    def _write(self, target: ResourcePath, query: dict[str, str], options: str) -> Write:
        """How this request writes: its field manager, endpoint and dry run."""
        dry_run = params.dry_run(self._dry_run_values, options)
        manager = params.field_manager(query, self.headers.get("User-Agent"))
        subresource = target.subresource or ""
        return Write(
            Manager(manager, "Update", subresource if subresource == "status" else ""),
            subresource,
            dry_run,
            target.resource.api_version(target.version),
        )

    def _check_fields(self, target: ResourcePath, query: dict[str, str], obj: dict) -> None:
        """Fields the schema does not declare: a 400 with fieldValidation=Strict, else
        dropped (pruned, as for a structural CRD schema) with a warning under Warn."""
        unknown = openapi.unknown_fields(target.resource, obj)
        if not unknown:
            return
        validation = params.check_field_validation(query)
        names = [".".join(path) for path in unknown]
        if validation == "Strict":
            resource = target.resource
            detail = ", ".join(f'unknown field "{name}"' for name in names)
            raise errors.bad_request(
                f'{resource.kind} in version "{target.version}" cannot be handled as a'
                f" {resource.kind}: strict decoding error: {detail}"
            )
        for path in unknown:
            parent = obj
            for step in path[:-1]:
                parent = parent[int(step)] if isinstance(parent, list) else parent[step]
            del parent[path[-1]]
        if validation == "Warn":
            self._warnings.extend(f'unknown field "{name}"' for name in names)

    def _serve_list(self, target: ResourcePath, query: dict[str, str]) -> None:
        store = self.server.api.store
        limit = params.integer(query, "limit") or 0
        token = query.get("continue") or None
        if token and query.get("resourceVersion"):
            raise errors.bad_request(
                "specifying resource version is not allowed when using continue"
            )
        where = (target.resource.plural, target.namespace)
        selectors = (query.get("labelSelector"), query.get("fieldSelector"))
        if wants_table(self.headers.get("Accept", "")):
            items, rv, more, _ = store.list_page(
                *where, *selectors, max(limit, 0), token, shared=True
            )
            items = [self._versioned(target, obj) for obj in items]
            self._send_json(200, self._table(target, items, rv, query, more))
            return
        api_version = target.resource.api_version(target.version)
        # each item as the text it was stored as: a page of 500 is not encoded again
        texts, rv, more, remaining = store.list_page_text(
            *where, *selectors, max(limit, 0), token, api_version
        )
        meta: dict[str, Any] = {"resourceVersion": rv}
        if more:
            meta["continue"] = more
            if remaining is not None:
                meta["remainingItemCount"] = remaining
        kind = f"{target.resource.kind}List"
        head = json.dumps({"kind": kind, "apiVersion": api_version, "metadata": meta})
        body = f'{head[:-1]}, "items": [{", ".join(texts)}]}}'
        self._send_data(200, body.encode())

    def _serve_delete(self, target: ResourcePath, body: Any) -> None:
        if target.subresource is not None:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
        store = self.server.api.store
        query = self._query
        params.integer(query, "gracePeriodSeconds")  # malformed: 400, as decoding would fail
        params.boolean(query, "orphanDependents")
        options = body if isinstance(body, dict) else {}
        sent = options.get("dryRun")
        dry_run = params.dry_run(
            self._dry_run_values or (sent if isinstance(sent, list) else []), "DeleteOptions"
        )
        gone = store.delete(
            target.resource.plural,
            target.namespace,
            target.name or "",
            options.get("preconditions"),
            shared=True,
            dry_run=dry_run,
        )
        meta = gone["metadata"]
        if meta.get("finalizers") or meta.get("deletionTimestamp"):
            self._send_json(200, self._versioned(target, gone))
        else:
            details = {"name": meta["name"], "kind": target.resource.plural, "uid": meta.get("uid")}
            if target.resource.group:
                details["group"] = target.resource.group
            status = {"kind": "Status", "apiVersion": "v1", "metadata": {}}
            self._send_json(200, {**status, "status": "Success", "details": details})

    def _serve_delete_collection(
        self, target: ResourcePath, query: dict[str, str], body: Any
    ) -> None:
        """DELETE on a collection: the selected objects go (or get deletionTimestamp) and the
        answer is their List, as kube-apiserver's deletecollection sends it."""
        if target.subresource is not None:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
        params.integer(query, "gracePeriodSeconds")
        options = body if isinstance(body, dict) else {}
        sent = options.get("dryRun")
        dry_run = params.dry_run(
            self._dry_run_values or (sent if isinstance(sent, list) else []), "DeleteOptions"
        )
        gone = self.server.api.store.delete_collection(
            target.resource.plural,
            target.namespace,
            query.get("labelSelector"),
            query.get("fieldSelector"),
            dry_run=dry_run,
        )
        items = [self._versioned(target, obj) for obj in gone]
        self._send_json(
            200,
            {
                "kind": f"{target.resource.kind}List",
                "apiVersion": target.resource.api_version(target.version),
                "metadata": {"resourceVersion": self.server.api.store.resource_version},
                "items": items,
            },
        )

    def _serve_subresource(
        self, method: str, target: ResourcePath, query: dict[str, str], body: Any
    ) -> None:
        handler = subresources.HANDLERS[(target.resource.plural, target.subresource or "")]
        request = subresources.Request(
            method, target.namespace, target.name or "", query, body, dict(self.headers.items())
        )
        reply = handler(self.server.api.store, request)
        self.send_response(reply.code)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)

    def _serve_watch(self, target: ResourcePath, query: dict[str, str]) -> None:
        api = self.server.api
        rv = query.get("resourceVersion") or ""
        bookmarks = params.boolean(query, "allowWatchBookmarks")
        as_table = wants_table(self.headers.get("Accept", ""))  # kubectl get -w
        seconds = params.integer(query, "timeoutSeconds")
        timeout = api.default_watch_timeout if seconds is None else float(max(seconds, 0))
        failure: ApiError | None = None
        watch: Watch | None = None
        if rv not in ("", "0") and api.faults.take_forced_410():
            log.info("fault: forcing 410 for watch of %s from %s", target.resource.plural, rv)
            failure = errors.expired(
                int(rv) if rv.isdigit() else 0, int(api.store.resource_version)
            )
        else:
            try:
                watch = api.store.watch(
                    target.resource.plural,
                    target.namespace,
                    query.get("labelSelector"),
                    rv or "0",  # unset means "start with the current state", as in Kubernetes
                    query.get("fieldSelector"),
                    api.bookmark_interval if bookmarks else None,
                )
            except ApiError as exc:
                if exc.code != 410:
                    raise
                failure = exc
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if watch is None:
            assert failure is not None
            self._write_event("ERROR", failure.status())
            self._write_chunk(b"")
            return
        stream = _Stream(watch)
        api._open_stream(stream)
        api_version = target.resource.api_version(target.version)
        try:
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                event = watch.next_text(min(remaining, IDLE_PROBE), api_version)
                if event is None:
                    if stream.cut == "abrupt":
                        self._abort()
                        return
                    if watch.closed or self._client_gone():
                        break
                    continue
                kind, text = event
                if as_table and kind != "BOOKMARK":
                    obj = json.loads(text)
                    rv = obj["metadata"]["resourceVersion"]
                    self._write_event(kind, self._table(target, [obj], rv, query))
                else:
                    # The object's text as the store encoded it once for every watch: the
                    # same bytes json.dumps({"type": kind, "object": obj}) would give.
                    self._write_chunk(
                        b'{"type": "%s", "object": %s}\n' % (kind.encode(), text.encode())
                    )
            self._write_chunk(b"")
        except OSError:
            self.close_connection = True
        except Exception:  # headers are out: a Status cannot follow, so end the stream
            log.exception("kubeapi: watch of %s failed", target.resource.plural)
            self._abort()
        finally:
            watch.close()
            api._close_stream(stream)

    # ---- helpers -------------------------------------------------------------------------

    def _versioned(self, target: ResourcePath, obj: dict) -> dict:
        """``obj`` (a stored object: never changed) as the requested version shows it."""
        return {**obj, "apiVersion": target.resource.api_version(target.version)}

    def _table(
        self,
        target: ResourcePath,
        items: list[dict],
        rv: str,
        query: dict,
        continue_token: str | None = None,
    ) -> dict:
        now = datetime.now(timezone.utc)
        include = query.get("includeObject", "Metadata")
        return table(target.resource, items, rv, now, include, continue_token)

    def _content_type(self) -> str:
        return (self.headers.get("Content-Type") or "").split(";")[0].strip()

    def _patch_body(self, target: ResourcePath, body: Any) -> Any:
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if content_type == JSON_PATCH:
            if not isinstance(body, list):
                raise errors.bad_request("a JSON patch must be a list of operations")
            return body
        if content_type == MERGE_PATCH or (
            content_type == STRATEGIC_PATCH and not target.resource.group
        ):
            return _object_body(body)
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include:"
            f" {JSON_PATCH}, {MERGE_PATCH}"
            + (f", {STRATEGIC_PATCH}" if not target.resource.group else ""),
        )

    def _read_body(self) -> Any:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = self._read_chunked()
        else:
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length) if length else b""
        if not data.strip():
            return None
        if self._content_type() == protobuf.MEDIA_TYPE:
            return protobuf.decode(data)
        if self._content_type() == APPLY_PATCH:
            try:
                return yaml.safe_load(data)
            except yaml.YAMLError as exc:
                raise errors.bad_request(f"error decoding YAML: {exc}") from None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise errors.bad_request(
                f"couldn't get version/kind; json parse error: {exc}"
            ) from None

    def _read_chunked(self) -> bytes:
        data = b""
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline().strip():
                    pass
                return data
            data += self.rfile.read(size)
            self.rfile.readline()

    def _send_json(self, code: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send_data(code, json.dumps(obj).encode(), headers)

    def _send_data(self, code: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        """``data``, JSON already encoded."""
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        for warning in getattr(self, "_warnings", ()):
            self.send_header("Warning", f"299 - {errors.go_quote(warning)}")
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, exc: ApiError, headers: dict[str, str] | None = None) -> None:
        log.debug("kubeapi: %s %s -> %d %s", self.command, self.path, exc.code, exc.message)
        try:
            self._send_json(exc.code, exc.status(), headers)
        except OSError:
            self.close_connection = True

    def _write_event(self, kind: str, obj: dict) -> None:
        self._write_chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _client_gone(self) -> bool:
        """Whether the client closed an idle watch connection (so its thread can end)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _abort(self) -> None:
        """Close the connection without (the rest of) an answer."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class KubeApi:
    """The HTTP server around a Store.  ``start()`` serves from a background thread."""

    def __init__(
        self,
        store: Store | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        bookmark_interval: float = 1.0,
        default_watch_timeout: float = 1800.0,
        seed: int = 0,
        groups: Iterable[str] | None = None,
    ) -> None:
        """``groups``: the named API groups to serve (None: all; the core group always)."""
        self.store = store if store is not None else Store()
        self.faults = Faults(seed)
        self.faults.on_cut(self._cut_streams)
        self.bookmark_interval = bookmark_interval
        self.groups = frozenset(groups) if groups is not None else None
        self.default_watch_timeout = default_watch_timeout
        self._host = host
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._counts: Counter[tuple[str, str]] = Counter()
        self._counts_lock = threading.Lock()
        self._streams: set[_Stream] = set()
        self._streams_lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self.kubeconfig: str | None = None  # the last path write_kubeconfig wrote

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> KubeApi:
        if self._server is not None:
            return self
        server = _Server((self._host, self._port), _Handler)
        server.api = self
        self._server = server
        self._port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.02},  # stop() waits up to this long
            name=f"kubeapi-{self._port}",
            daemon=True,
        )
        self._thread.start()
        log.info("kubeapi: serving on %s", self.url)
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self.faults.release_pages()
        server.shutdown()
        self._cut_streams(graceful=False)
        for connection in list(self._connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        log.info("kubeapi: stopped %s", self.url)

    def __enter__(self) -> KubeApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}"

    def write_kubeconfig(self, path: str, namespace: str = "default") -> str:
        """A kubeconfig for kubectl and the kubernetes client (insecure http, dummy token)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kubeapi", "cluster": {"server": self.url}}],
            "users": [{"name": "kubeapi", "user": {"token": "kubeapi-dummy-token"}}],
            "contexts": [
                {
                    "name": "kubeapi",
                    "context": {"cluster": "kubeapi", "user": "kubeapi", "namespace": namespace},
                }
            ],
            "current-context": "kubeapi",
            "preferences": {},
        }
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        # only its owner may read it, as a real kubeconfig (it holds the credentials)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT: set it
        with os.fdopen(fd, "w") as handle:
            json.dump(config, handle, indent=2)  # JSON is YAML: both clients read it
        self.kubeconfig = path
        return path

    # ---- observation ---------------------------------------------------------------------

    def request_counts(self) -> dict[tuple[str, str], int]:
        """Requests received so far by (verb, plural), faulted ones included."""
        with self._counts_lock:
            return dict(self._counts)

    def reset_counts(self) -> None:
        with self._counts_lock:
            self._counts.clear()

    def open_watches(self) -> int:
        """Watch streams being served now (a cut stream no longer counts)."""
        with self._streams_lock:
            return len(self._streams)

    # ---- internals -----------------------------------------------------------------------

    def serves(self, group: str) -> bool:
        return not group or self.groups is None or group in self.groups

    def discovery(self, target: DiscoveryPath) -> dict:
        if target.doc == "root":
            return discovery.root_paths(self.groups)
        if target.doc == "version":
            return dict(discovery.VERSION_INFO)
        if target.doc == "api":
            return discovery.api_versions(f"{self._host}:{self._port}")
        if target.doc == "apis":
            return discovery.api_group_list(self.groups)
        if target.doc == "group":
            return discovery.api_group(target.group, self.groups)
        if target.doc == "openapi/v2":
            return openapi.v2_doc(self._group_versions())
        if target.doc == "openapi/v3":
            if not target.version:
                return openapi.v3_index(self._group_versions())
            if (target.group, target.version) not in self._group_versions():
                raise _not_found()
            resources = list(served(target.group, target.version))
            return openapi.group_version_doc(target.group, target.version, resources)
        return discovery.resource_list(target.group, target.version, self.groups)

    def _group_versions(self) -> list[tuple[str, str]]:
        found = [("", v) for v in CORE_VERSIONS]
        for group, versions in groups().items():
            if self.serves(group):
                found.extend((group, v) for v in versions)
        return found

    def _count(self, verb: str, plural: str) -> None:
        with self._counts_lock:
            self._counts[(verb, plural)] += 1

    def _open_stream(self, stream: _Stream) -> None:
        with self._streams_lock:
            self._streams.add(stream)

    def _close_stream(self, stream: _Stream) -> None:
        with self._streams_lock:
            self._streams.discard(stream)

    def _cut_streams(self, graceful: bool) -> None:
        """End every open watch stream; they stop counting as open at once."""
        with self._streams_lock:
            streams, self._streams = self._streams, set()
        how = "graceful" if graceful else "abrupt"
        log.info("fault: cutting %d watch stream(s) (%s)", len(streams), how)
        for stream in streams:
            stream.cut = how
            stream.watch.close()


def _object_body(body: Any) -> dict:
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a JSON object")
    return body


def _not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")
