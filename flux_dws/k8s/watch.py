# SPDX-License-Identifier: LGPL-3.0-only
"""ResourceWatch: one long-lived watch on a kind of resource, each change delivered once.

WorkflowWatch follows this instance's workflows (the service's jobs), StorageWatch every
rabbit's Storage and ServersWatch every namespace's Servers (flux_dws.service.healthwatch).

The existing Flux integration polls every 5 s and replays everything from version 0 after a
410; this watch reacts within milliseconds of a change and, after a 410, re-lists once and
tells the service only what changed meanwhile.  It runs in its own thread:

    list -> watch(resourceVersion, bookmarks) -> ... stream ends or breaks -> watch again
                     \\-- 410 Gone --> list once, diff against what was delivered -> watch

A list is taken in pages (flux_dws.k8s.listing) and each page's objects are delivered as it
arrives; only the last page tells what disappeared, and only then is the list complete
(``on_listed``).  Reconnects back off with bounded jitter; a silent dead connection is noticed
because the client's read timeout is longer than the server's ``timeoutSeconds``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

from flux_dws.base import untrusted
from flux_dws.base.frozen import share_strings
from flux_dws.core.rabbits import servers_kept
from flux_dws.core.workflow import kept_identity
from flux_dws.k8s.backoff import backoff_delay
from flux_dws.k8s.calls import TRANSPORT_ERRORS
from flux_dws.k8s.client import KubeClient
from flux_dws.k8s.errors import KubeError, describe_status
from flux_dws.k8s.listing import Page
from flux_dws.k8s.resources import name_of, version_of

log = logging.getLogger("flux-dws.k8s.watch")

#: What the watch hands to the service: ('ADDED'|'MODIFIED'|'DELETED', workflow object).
Delivery = tuple[str, dict]

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"

#: A stream that ends cleanly this fast without a single event counts as a failure, so a
#: misbehaving server cannot make the watch spin.
MIN_HEALTHY_STREAM = 1.0


def _uid(obj: dict) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def slim(obj: dict) -> dict:
    """``obj`` without metadata.managedFields: the server's bookkeeping of who wrote which
    field, which nothing here reads and which would double what each workflow costs to hold."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def shared_identity(obj: dict) -> dict:
    """What a workflow watch keeps of a workflow (core.workflow.kept_identity), its strings
    shared: one copy of each for as long as the workflow is there."""
    return share_strings(kept_identity(obj))


def _number(rv: str) -> int | None:
    return untrusted.decimal(rv)


def qualified_name(obj: dict) -> str:
    """``namespace/name``: what tells apart objects of a watch over every namespace."""
    meta = obj.get("metadata") or {}
    name = name_of(obj)
    return f"{meta.get('namespace') or ''}/{name}" if name else ""


class Delivered:
    """What the service has been told, by object name (``key``: by namespace and name for
    a watch over every namespace); decides what to tell it next.

    Pure bookkeeping (no I/O), so that replays, reconnects and re-lists can never make the
    service see one change twice, see an older state after a newer one, or miss a deletion.
    Deduplication is by resourceVersion: an event at or below the highest version already
    handled is a replay.  (Kubernetes versions are etcd revisions, increasing integers; should
    a server use opaque ones, only exact repeats of an object's version are dropped.)
    """

    def __init__(
        self, key: Callable[[dict], str] = name_of, keep: Callable[[dict], dict] | None = None
    ) -> None:
        # what is kept of each object: enough for ``key``, its version and uid, and whoever
        # receives it again as DELETED after a re-list (``keep``; the whole object by default)
        self.objects: dict[str, dict] = {}
        self._high: int | None = None
        self._listed: set[str] = set()  # names the list being taken in has shown so far
        self._key = key
        self._keep = keep

    def watch_event(self, kind: str, obj: dict) -> list[Delivery]:
        """Deliveries for one watch event: none if it replays a version already handled."""
        rv = _number(version_of(obj))
        if rv is not None:
            if self._high is not None and rv <= self._high:
                return []
            self._high = rv
        name = self._key(obj)
        known = self.objects.get(name)
        if kind == DELETED:
            if known is None:
                return []
            del self.objects[name]
            return [(DELETED, obj)]
        if kind not in (ADDED, MODIFIED) or not name:
            return []
        return self._upsert(name, known, obj)

    def relist(self, items: list[dict], resource_version: str) -> list[Delivery]:
        """Deliveries that bring the service from what it saw to ``items``, a list taken at
        ``resource_version``: what changed, appeared or disappeared meanwhile."""
        return [*self.list_page(items, fresh=True), *self.list_done(resource_version)]

    def list_page(self, items: list[dict], *, fresh: bool) -> list[Delivery]:
        """Deliveries for one page of a list, as it arrives: what appeared or changed.
        ``fresh``: the list's first page (or that of the list started again)."""
        if fresh:
            self._listed = set()
        out: list[Delivery] = []
        for obj in items:
            name = self._key(obj)
            if name:
                self._listed.add(name)
                out.extend(self._upsert(name, self.objects.get(name), obj))
        return out

    def list_done(self, resource_version: str) -> list[Delivery]:
        """The list is complete at ``resource_version``: what it did not show has gone.

        Only now: an object missing from the pages so far may be on a later one."""
        out = [(DELETED, self.objects.pop(n)) for n in list(self.objects) if n not in self._listed]
        self._listed = set()
        self._high = _number(resource_version)
        return out

    def _upsert(self, name: str, known: dict | None, obj: dict) -> list[Delivery]:
        if known is not None and version_of(known) == version_of(obj):
            return []
        self.objects[name] = obj if self._keep is None else self._keep(obj)
        if known is None:
            return [(ADDED, obj)]
        if _uid(known) and _uid(obj) and _uid(known) != _uid(obj):
            return [(DELETED, known), (ADDED, obj)]  # deleted and re-created while we looked away
        return [(MODIFIED, obj)]


def stream_lines(resp: Any) -> Iterator[bytes]:
    """Non-empty lines of a streaming response, each as soon as its newline arrives."""
    buffer = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            if buffer.strip():
                yield buffer
            return
        if b"\n" not in chunk:
            buffer += chunk
            continue
        lines = (buffer + chunk).split(b"\n")  # one split: not one copy of the rest per line
        buffer = lines.pop()
        for line in lines:
            if line.strip():
                yield line


#: (items, resourceVersion) of a full list; the raw response of one watch request
Lister = Callable[[], "tuple[list[dict], str]"]
Opener = Callable[[str, int, float], Any]


class ResourceWatch:
    """Deliver every change to the listed objects, once, from a background thread.

    ``on_event(kind, obj)``, ``on_health(connected, since)``, ``on_listed()`` (after each
    full list's changes were delivered) and ``on_position(resource_version)`` (every change
    up to that version has been delivered: after a list, an event or a bookmark) run in the
    watch thread: they must be quick and hand the work to the service's loop.  ``since`` is
    the wall-clock time (time.time()) at which the API became reachable or unreachable.
    """

    #: in logs and the thread's name ("workflow watch"), and what errors name
    kind = "resource"
    target = "resources"
    #: what identifies one object among those delivered
    key: Callable[[dict], str] = staticmethod(name_of)
    #: what is kept of each object delivered, for re-lists (None: all of it)
    keep: Callable[[dict], dict] | None = None
    #: what is delivered of each object (and kept): the fields its receiver reads
    trim: Callable[[dict], dict] = staticmethod(lambda obj: obj)
    #: each event's object with its strings shared (base.frozen), for those held whole
    share: Callable[[dict], dict] = staticmethod(share_strings)

    def __init__(
        self,
        client: KubeClient,
        on_event: Callable[[str, dict], None],
        *,
        on_health: Callable[[bool, float], None] | None = None,
        on_listed: Callable[[], None] | None = None,
        on_position: Callable[[str], None] | None = None,
        backoff_max: float = 30.0,
        backoff_base: float = 0.5,
        watch_timeout: int = 300,
        read_margin: float = 30.0,
    ) -> None:
        self._client = client
        self._list, self._open = self.endpoints(client)
        self._on_event = on_event
        self._on_health = on_health
        self._on_listed = on_listed
        self._on_position = on_position
        self._backoff_max = backoff_max
        self._backoff_base = backoff_base
        self._watch_timeout = watch_timeout
        self._read_margin = read_margin
        self._delivered = Delivered(self.key, self.keep)
        self._rv: str | None = None
        self._connected: bool | None = None
        self._failures = 0  # consecutive failed attempts since the last connection; backoff
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._resp: Any = None
        self._thread: threading.Thread | None = None
        self._opened = False
        self.relists = 0  # full lists (the first, and after each 410 Gone)
        self.restarts = 0  # watch requests opened after the first one

    def endpoints(self, client: KubeClient) -> tuple[Lister, Opener]:
        """The full list and the watch request of this kind of resource."""
        raise NotImplementedError

    @property
    def resource_version(self) -> str | None:
        """The version the next watch resumes from (None: the next step is a list)."""
        return self._rv

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._thread = threading.Thread(target=self._run, name=f"{self.kind}-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread: wakes a backoff sleep and shuts down an open stream."""
        self._stopping.set()
        with self._lock:
            resp = self._resp
        if resp is not None:
            # Unblocks a read in progress in the watch thread.  Fails if already closed, or on
            # an urllib3 without shutdown(): then the read ends at its timeout.
            with contextlib.suppress(Exception):
                resp.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        gone = 0  # consecutive 410s with nothing in between: never re-list in a tight loop
        while not self._stopping.is_set():
            try:
                if self._rv is None:
                    self._relist()
                outcome = self._watch_once()
            except Exception as exc:
                if self._stopping.is_set():
                    return  # stop() broke the stream on purpose
                self._failures += 1
                outcome = self._failure(exc, self._failures)
                if outcome != "gone":
                    continue
            if outcome == "gone":
                gone += 1
                log.info(
                    "%s watch: resourceVersion %s expired (410); re-listing", self.kind, self._rv
                )
                self._rv = None
                if gone > 1:
                    self._sleep(self._backoff(gone - 1))
            else:
                gone = 0
                if outcome == "idle":
                    self._sleep(self._backoff(1))

    def _failure(self, exc: Exception, failures: int) -> str:
        """Log and back off after a failed list or watch; 'gone' for a 410, else 'failed'."""
        if isinstance(exc, KubeError):
            if exc.status == 410:
                return "gone"
            self._failed(str(exc), failures)
        elif isinstance(exc, TRANSPORT_ERRORS):  # broke after connecting: the API is not "down"
            self._failed(f"stream broke: {type(exc).__name__}: {exc}", failures, down=False)
        else:
            log.exception("%s watch: unexpected error; retrying", self.kind)
            self._sleep(self._backoff(failures))
        return "failed"

    def pages(self) -> Iterator[Page]:
        """The full list, page by page (here one page: the whole list at once)."""
        items, rv = self._list()
        yield Page(items, rv, fresh=True, last=True)

    def _relist(self) -> None:
        """List, delivering each page's changes as it arrives; what disappeared, and
        ``on_listed``, only once the last page is in."""
        count, changes = 0, 0
        for page in self.pages():
            if self._stopping.is_set():
                return
            self._health(True)
            items = [self.trim(share_strings(slim(obj))) for obj in page.items]
            count = len(items) if page.fresh else count + len(items)
            deliveries = self._delivered.list_page(items, fresh=page.fresh)
            if page.last:
                deliveries += self._delivered.list_done(page.resource_version)
            changes += len(deliveries)
            for kind, obj in deliveries:
                self._deliver(kind, obj)
            if not page.last:
                continue
            self.relists += 1
            log.info(
                "%s watch: listed %d at resourceVersion %s (%d changes)",
                self.kind,
                count,
                page.resource_version,
                changes,
            )
            self._advance(page.resource_version)
            if self._on_listed is not None and not self._stopping.is_set():
                self._on_listed()  # after the deliveries: everything listed has been handed over

    def _watch_once(self) -> str:
        """One watch request; 'closed' (ended normally), 'idle' (ended at once), or 'gone'."""
        timeout = int(self._watch_timeout * (1 + random.random()))
        self.restarts += 1 if self._opened else 0
        self._opened = True
        resp = self._open(self._rv or "", timeout, timeout + self._read_margin)
        self._health(True)
        started = time.monotonic()
        received = 0
        with self._lock:
            self._resp = resp
        try:
            if self._stopping.is_set():  # stop() ran before it could see this stream
                return "closed"
            for line in stream_lines(resp):
                if self._stopping.is_set():
                    return "closed"
                received += 1
                event = json.loads(line)
                kind, obj = event.get("type"), slim(event.get("object") or {})
                if kind == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        return "gone"
                    raise KubeError(
                        "watch",
                        self.target,
                        self._client.namespace,
                        describe_status(code, obj.get("reason"), str(obj.get("message") or "")),
                        status=code,
                    )
                rv = version_of(obj)
                if kind != "BOOKMARK":
                    obj = self.trim(self.share(obj))
                    for delivery in self._delivered.watch_event(kind, obj):
                        self._deliver(*delivery)
                if rv:
                    self._advance(rv)
        finally:
            with self._lock:
                self._resp = None
            resp.close()
        if not received and time.monotonic() - started < MIN_HEALTHY_STREAM:
            return "idle"
        return "closed"

    # -- helpers -------------------------------------------------------------------------

    def _advance(self, rv: str) -> None:
        self._rv = rv
        if self._on_position is not None and rv:
            try:
                self._on_position(rv)
            except Exception:
                log.exception("%s watch: on_position failed", self.kind)

    def _deliver(self, kind: str, obj: dict) -> None:
        if self._stopping.is_set():
            return
        try:
            self._on_event(kind, obj)
        except Exception:
            log.exception("%s watch: on_event failed for %s %s", self.kind, kind, name_of(obj))

    def _failed(self, what: str, failures: int, *, down: bool = True) -> None:
        delay = self._backoff(failures)
        if down:
            self._health(False)
        log.warning("%s watch: %s; reconnecting in %.1fs", self.kind, what, delay)
        self._sleep(delay)

    def _health(self, connected: bool) -> None:
        if connected:
            self._failures = 0
        if self._connected is connected:
            return
        self._connected = connected
        if self._on_health is not None and not self._stopping.is_set():
            try:
                self._on_health(connected, time.time())
            except Exception:
                log.exception("%s watch: on_health failed", self.kind)

    def _backoff(self, attempt: int) -> float:
        return backoff_delay(attempt, base=self._backoff_base, cap=self._backoff_max)

    def _sleep(self, seconds: float) -> None:
        self._stopping.wait(seconds)


class WorkflowWatch(ResourceWatch):
    """This instance's workflows (by label), in its namespace."""

    kind = "workflow"
    target = "workflows in namespace"
    keep = staticmethod(shared_identity)  # the service keeps its own (WorkflowView, kept)
    # most events are for a version the service read from a response already and are
    # dropped: it shares the strings of what it keeps (Service._on_workflow_event)
    share = staticmethod(lambda obj: obj)

    def endpoints(self, client: KubeClient) -> tuple[Lister, Opener]:
        return client.list_workflows, client.open_workflow_watch

    def pages(self) -> Iterator[Page]:
        """Page by page: the service decides for a job whose workflow is on a page already
        while the next pages are on their way (flux_dws.core.reconcile.may_decide)."""
        return self._client.workflow_pages()


class StorageWatch(ResourceWatch):
    """Every rabbit's Storage, in DWS's namespace: health follows it without polling."""

    kind = "storage"
    target = "storages"

    def endpoints(self, client: KubeClient) -> tuple[Lister, Opener]:
        return client.list_storages, client.open_storage_watch


class PersistentWatch(ResourceWatch):
    """Our namespace's PersistentStorageInstances: the jobtap plugin checks persistentdw
    against them at submit (flux_dws.service.persistentpush)."""

    kind = "persistent"
    target = "persistentstorageinstances in namespace"

    def endpoints(self, client: KubeClient) -> tuple[Lister, Opener]:
        return client.list_persistent, client.open_persistent_watch


class ServersWatch(ResourceWatch):
    """Every Servers resource, in every namespace: the capacity each rabbit's allocations
    hold, for health's capacity-drift comparison without a list per pass."""

    kind = "servers"
    target = "servers"
    key = staticmethod(qualified_name)
    trim = staticmethod(servers_kept)  # one per workflow: its status is never read

    def endpoints(self, client: KubeClient) -> tuple[Lister, Opener]:
        return client.list_servers, client.open_servers_watch
