# SPDX-License-Identifier: LGPL-3.0-only
"""One HTTP request to kubeapi: routing and the HTTP details, for the server (KubeApi,
flux_dws.testing.kubeapi.server) that owns the listening socket, the counts and the streams.

Object semantics live in the store.  Watches stream newline-delimited JSON events with chunked
transfer encoding; a too-old resourceVersion is a 200 answer carrying one ERROR event with a
410 Status, as a real API server sends it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from . import errors, openapi, params, podlog, protobuf, subresources
from .errors import ApiError
from .managed import Manager
from .routes import (
    DiscoveryPath,
    ResourcePath,
    injected_error,
    parse_path,
    path_not_found,
    verb_of,
)
from .store import Watch, Write
from .tables import table, wants_table

log = logging.getLogger("flux-dws.testing.kubeapi")

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
IDLE_PROBE = 1.0  # seconds between checks that a quiet watch's client is still there


class Stream:
    """An open HTTP watch stream, so faults can cut it."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.cut: str | None = None  # None | "graceful" | "abrupt"


class HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    api: Any  # the KubeApi serving (flux_dws.testing.kubeapi.server)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "flux-dws-kubeapi"
    server: HttpServer

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
                raise path_not_found()
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
        stream = Stream(watch)
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


def _object_body(body: Any) -> dict:
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a JSON object")
    return body
