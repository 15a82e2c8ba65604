# SPDX-License-Identifier: LGPL-3.0-only
"""KubeApi: the store served over HTTP/1.1 on 127.0.0.1 for the real kubernetes client and kubectl.

This is the server's face: its lifecycle, its kubeconfig, what tests observe of it (request
counts, open watches) and the discovery documents.  Each request is served by the handler
(flux_dws.testing.kubeapi.handler); object semantics live in the store.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections import Counter
from collections.abc import Iterable

from . import discovery, openapi
from .faults import Faults
from .handler import Handler, HttpServer, Stream
from .resources import CORE_VERSIONS, groups, served
from .routes import DiscoveryPath, path_not_found
from .store import Store

log = logging.getLogger("flux-dws.testing.kubeapi")


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
        self._server: HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._counts: Counter[tuple[str, str]] = Counter()
        self._counts_lock = threading.Lock()
        self._streams: set[Stream] = set()
        self._streams_lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self.kubeconfig: str | None = None  # the last path write_kubeconfig wrote

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> KubeApi:
        if self._server is not None:
            return self
        server = HttpServer((self._host, self._port), Handler)
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
                raise path_not_found()
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

    def _open_stream(self, stream: Stream) -> None:
        with self._streams_lock:
            self._streams.add(stream)

    def _close_stream(self, stream: Stream) -> None:
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
