# SPDX-License-Identifier: LGPL-3.0-only
"""The objects a job's records read (container pods, NnfDataMovements), kept by watches.

The records (flux_dws.k8s.recordreads) used to list a workflow's pods for each container job and
its NnfDataMovements for each copy job: at 1,000 jobs in flight, hundreds of lists.  Instead,
one watch per kind follows every such object of this instance's namespace (a ResourceWatch:
one list, then a watch), and the records read the watch's copy.

A read must be as fresh as the list it replaces.  It is asked for when a workflow's status
says the pods or copies are done, and DWS (nnf-sos) wrote those objects before that status:
so a read *at* the workflow's resourceVersion is answered from the cache only once the watch
has delivered every change up to that version (its own position: the last event, bookmark or
list).  Kubernetes resourceVersions are etcd revisions, one sequence for every kind kept in
the same etcd; a watch's bookmarks carry that sequence's current value.  The read waits for
the watch to catch up, at most ``CATCH_UP`` seconds, and otherwise is not answered (None):
the caller then lists, as before.  It is never answered while the watch has not listed yet,
is failing, or when either version is not an integer.  So the cache can make a record later
by at most CATCH_UP, never staler.  The wait holds a KubeWorker thread, as the list did,
unless the caller first waits with ``when_current`` (a callback, no thread held).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from flux_dws.base import untrusted
from flux_dws.core.copies import WORKFLOW_NAME_LABEL, WORKFLOW_NAMESPACE_LABEL
from flux_dws.core.output import CONTAINER_LABEL
from flux_dws.k8s.client import KubeClient
from flux_dws.k8s.objects import Collection
from flux_dws.k8s.resources import DATA_MOVEMENTS
from flux_dws.k8s.watch import DELETED, Lister, Opener, ResourceWatch, qualified_name

#: How long a read waits for its watch to reach the workflow's resourceVersion before the
#: caller lists instead.  A busy system's watches move on within milliseconds (every change
#: to a pod or data movement of any job moves them); a quiet one's only at the next bookmark
#: (about a minute apart in Kubernetes), and a list costs little there: so the wait is short.
CATCH_UP = 0.25


class PodWatch(ResourceWatch):
    """Every NNF user-container pod (``nnf.cray.hpe.com/container``) in our namespace."""

    kind = "pod"
    target = "container pods in namespace"

    def endpoints(self, client: KubeClient) -> tuple[Lister, Opener]:
        where = client._pods(client.namespace, CONTAINER_LABEL, "container pods")

        def full() -> tuple[list[dict], str]:
            return client._list_all(where)

        def open_(rv: str, timeout: int, read_timeout: float) -> Any:
            return client._open_watch(where, rv, timeout, read_timeout)

        return full, open_


class DataMovementWatch(ResourceWatch):
    """Every NnfDataMovement of our namespace's workflows, in all namespaces."""

    kind = "datamovement"
    target = "nnfdatamovements of namespace"
    key = staticmethod(qualified_name)  # one name may be in several rabbits' namespaces

    def endpoints(self, client: KubeClient) -> tuple[Lister, Opener]:
        selector = f"{WORKFLOW_NAMESPACE_LABEL}={client.namespace}"

        def where() -> Collection:  # in every namespace; the version is known once connected
            return client._collection(DATA_MOVEMENTS, None, selector)

        def full() -> tuple[list[dict], str]:
            return client._list_all(where())

        def open_(rv: str, timeout: int, read_timeout: float) -> Any:
            return client._open_watch(where(), rv, timeout, read_timeout)

        return full, open_


class WatchedObjects:
    """One watch's objects by workflow (the value of ``label``); read from any thread."""

    def __init__(self, watch: type[ResourceWatch], kube: KubeClient, label: str) -> None:
        self._label = label
        self._cond = threading.Condition()
        self._by_workflow: dict[str, dict[str, dict]] = {}
        self._where: dict[str, str] = {}  # object key -> its workflow
        self._position: int | None = None  # every change up to it is in _by_workflow
        self._healthy = False
        self._waiting: list[tuple[int, Callable[[], None], float]] = []  # when_current's
        self.hits = 0  # reads answered from the cache
        self.misses = 0  # reads the caller listed for instead
        self.waited = 0.0  # seconds reads (and when_current) spent waiting for the watch
        self._watch = watch(kube, self._event, on_health=self._health, on_position=self._advanced)

    def start(self) -> None:
        self._watch.start()

    def stop(self) -> None:
        self._watch.stop()

    def read(self, workflow: str, at: str, catch_up: float | None = None) -> list[dict] | None:
        """The workflow's objects as a list taken at resourceVersion ``at`` (or later) would
        show them; None when the watch cannot say so within ``catch_up`` seconds (CATCH_UP)."""
        need = untrusted.decimal(at)
        start = time.monotonic()
        deadline = start + (CATCH_UP if catch_up is None else catch_up)
        try:
            return self._read(workflow, need, deadline)
        finally:
            self.waited += time.monotonic() - start

    def when_current(self, at: str, callback: Callable[[], None]) -> None:
        """``callback()`` once a read at resourceVersion ``at`` would not wait: the watch has
        reached it, or cannot say (not listed, failing, not a number).  At once on this thread,
        or later on the watch's; the caller bounds the wait itself (CATCH_UP), then reads
        with ``catch_up=0``."""
        need = untrusted.decimal(at)
        with self._cond:
            position = self._position
            if self._healthy and need is not None and position is not None and position < need:
                self._waiting.append((need, callback, time.monotonic()))
                return
        callback()

    def _due(self, every: bool) -> list[Callable[[], None]]:
        """Take the callbacks the position answers (``every``: all of them); under the lock."""
        due, keep, now = [], [], time.monotonic()
        for need, callback, since in self._waiting:
            if every or need <= (self._position or 0):
                due.append(callback)
                self.waited += now - since
            else:
                keep.append((need, callback, since))
        self._waiting = keep
        return due

    def _read(self, workflow: str, need: int | None, deadline: float) -> list[dict] | None:
        with self._cond:
            if need is None or not self._healthy or self._position is None:
                self.misses += 1
                return None
            while self._position < need:
                left = deadline - time.monotonic()
                if left <= 0 or not self._healthy:
                    self.misses += 1
                    return None
                self._cond.wait(left)
            self.hits += 1
            objects = self._by_workflow.get(workflow, {})
            return [objects[key] for key in sorted(objects)]  # a list's order: namespace, name

    # -- the watch thread -------------------------------------------------------------------

    def _event(self, kind: str, obj: dict) -> None:
        key = qualified_name(obj)
        labels = untrusted.mapping(untrusted.mapping(obj.get("metadata")).get("labels"))
        workflow = labels.get(self._label)
        with self._cond:
            old = self._where.pop(key, None)
            if old is not None:
                objects = self._by_workflow.get(old, {})
                objects.pop(key, None)
                if not objects:
                    self._by_workflow.pop(old, None)
            if kind != DELETED and isinstance(workflow, str) and workflow:
                self._where[key] = workflow
                self._by_workflow.setdefault(workflow, {})[key] = obj

    def _advanced(self, rv: str) -> None:
        position = untrusted.decimal(rv)
        with self._cond:
            if position is not None and (self._position is None or position > self._position):
                self._position = position
                self._cond.notify_all()
            due = self._due(every=False) if self._waiting else []
        for callback in due:
            callback()

    def _health(self, connected: bool, _since: float) -> None:
        with self._cond:
            self._healthy = connected
            self._cond.notify_all()
            due = self._due(every=True) if not connected else []
        for callback in due:  # a read would not be answered: it lists
            callback()


class RecordCache:
    """The container pods and NnfDataMovements of this instance's namespace, watched."""

    def __init__(self, kube: KubeClient) -> None:
        self.pods = WatchedObjects(PodWatch, kube, CONTAINER_LABEL)
        self.movements = WatchedObjects(DataMovementWatch, kube, WORKFLOW_NAME_LABEL)
        self._nnf = bool(kube.versions.nnf)

    def start(self) -> None:
        self.pods.start()
        if self._nnf:  # else nothing to watch: the records read [] without asking
            self.movements.start()

    def stop(self) -> None:
        self.pods.stop()
        self.movements.stop()


__all__ = ["CATCH_UP", "DataMovementWatch", "PodWatch", "RecordCache", "WatchedObjects"]
