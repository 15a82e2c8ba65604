# SPDX-License-Identifier: LGPL-3.0-only
"""dwssim's writes to the Store, shared by its DWS controller and its NNF driver.

Every read asks the store for ``shared`` objects (the stored ones, not copies): nothing here
may change an object it has read.  Writes are counted by plural (``writes``), so tests and
benchmarks can see what the simulator cost the API server.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

from flux_dws.testing.dwssim import companions as cmp
from flux_dws.testing.kubeapi.errors import ApiError
from flux_dws.testing.kubeapi.podlog import logs_of

LOG = logging.getLogger("flux-dws.testing.dwssim")
MAX_CONFLICT_RETRIES = 8  # re-reads after a 409 before giving a write up


class StoreWriter:
    """Reads and idempotent writes on ``store`` (a kubeapi Store, or anything with its
    methods, their ``shared`` keyword too), counted by plural."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._writes: Counter[str] = Counter()
        self._counter_lock = threading.Lock()

    @property
    def writes(self) -> dict[str, int]:
        """Writes (create, replace, delete) made so far, by resource plural."""
        with self._counter_lock:
            return dict(self._writes)

    def _count(self, plural: str) -> None:
        with self._counter_lock:
            self._writes[plural] += 1

    def _get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._store.get(plural, namespace, name, shared=True)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    def _ensure(self, plural: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``obj`` unless it exists; give it ``obj``'s status if it has another."""
        meta = obj["metadata"]
        try:
            current = self._store.create(plural, meta["namespace"], obj, shared=True)
            self._count(plural)
        except ApiError as exc:
            if exc.code != 409:
                raise
            current = self._store.get(plural, meta["namespace"], meta["name"], shared=True)
        if "status" in obj and current.get("status") != obj["status"]:
            current = self._set_status(plural, current, obj["status"])
        return current

    def _set_status(
        self, plural: str, obj: Mapping[str, Any], status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Replace ``obj``'s status, re-reading on a conflict (bounded)."""
        meta = obj["metadata"]
        current = dict(obj)
        for _ in range(MAX_CONFLICT_RETRIES):
            new = dict(current, status=dict(status))  # the store copies what it is given
            try:
                written = self._store.replace(
                    plural, meta["namespace"], meta["name"], new, shared=True
                )
                self._count(plural)
                return written
            except ApiError as exc:
                if exc.code != 409:
                    raise
                current = self._store.get(plural, meta["namespace"], meta["name"], shared=True)
        raise ApiError(
            409, "Conflict", f"{plural} {meta['namespace']}/{meta['name']} kept changing"
        )

    def _labelled(self, wf: Mapping[str, Any], plural: str) -> list[dict[str, Any]]:
        meta = wf["metadata"]
        selector = (
            f"{cmp.WORKFLOW_NAME_LABEL}={meta['name']},"
            f"{cmp.WORKFLOW_NAMESPACE_LABEL}={meta['namespace']}"
        )
        items, _ = self._store.list(plural, None, selector, shared=True)
        return list(items)

    def _delete_labelled(
        self, wf: Mapping[str, Any], plural: str, keep: frozenset[str] | set[str] = frozenset()
    ) -> None:
        """Delete ``plural`` objects carrying the workflow's labels (in any namespace), but
        those named in ``keep``."""
        for item in self._labelled(wf, plural):
            where = item["metadata"]
            if where["name"] in keep:
                continue
            try:
                self._store.delete(plural, where["namespace"], where["name"], shared=True)
                self._count(plural)
            except ApiError as exc:
                if exc.code != 404:
                    raise
            if plural == "pods":
                logs_of(self._store).forget(where["namespace"], where["name"])


def json_copy(data: Any) -> Any:
    """A deep copy of plain JSON data (several times faster than copy.deepcopy)."""
    return json.loads(json.dumps(data))


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def who(wf: Mapping[str, Any]) -> str:
    """How a log line names a workflow: namespace/name and the WLM's job id."""
    meta = wf.get("metadata") or {}
    job = (wf.get("spec") or {}).get("jobID", "?")
    return f"{meta.get('namespace')}/{meta.get('name')} (job {job})"
