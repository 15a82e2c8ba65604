# SPDX-License-Identifier: LGPL-3.0-only
"""An in-memory object store with Kubernetes semantics: the state behind the stand-in API server.

One lock guards everything; every mutation takes the next integer resourceVersion and appends
one event to a bounded history, from which watches replay.  Objects are copied on the way in
and out, so callers never share mutable state with the store.  A committed object is an
immutable snapshot, encoded once at commit: every copy handed out and every watch event is
made from that one JSON text, however many readers there are.  A reader that only reads
(the simulator, the server answering a request) may ask for ``shared=True``: the stored
object itself, which it must never change, and no copy at all.  Semantics follow the API
server where tests can observe them: 404/409/410/422 Status errors, optimistic concurrency,
finalizers with deletionTimestamp, no-op updates that keep the resourceVersion,
label-filtered watches that turn an object leaving the selector into DELETED, and the garbage
collector's background propagation: an object gone for good takes with it the objects whose
ownerReferences name it and no owner still there.
"""

from __future__ import annotations

import json
import random
import string
import threading
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import errors, managed, paging
from .errors import ApiError
from .managed import Manager
from .objectrules import (
    SYSTEM_METADATA,
    OwnerGraph,
    check_name,
    check_preconditions,
    check_type,
    copy_json,
    counted_content,
    field_owners,
    key_of,
    normalize,
    now,
    parse_rv,
    resource_of,
    scope,
    without_version,
)
from .resources import Resource, by_plural
from .selectors import fields_match, matches, parse_field_selector, parse_label_selector
from .watches import Watch, _dumps, _Event, _Snapshot, _with_api_version

__all__ = ["ApiError", "Hook", "Store", "Watch"]

#: hook(operation "CREATE"|"UPDATE", old object or None, new object) -> mutated object or None.
#: ``old`` is the stored object itself: read it, never change it.  ``new`` belongs to the store
#: and may be changed in place (with plain JSON data) or replaced by the returned object.
Hook = Callable[[str, Optional[dict], dict], Optional[dict]]

DEFAULT_HISTORY = 1000


@dataclass(frozen=True)
class Write:
    """How a write arrived: over HTTP it names a field manager, the endpoint (main resource
    "" or "status") and whether it is a dry run; in-process writes (the simulator's) use the
    default, which neither records managedFields nor separates spec from status."""

    manager: Manager | None = None
    subresource: str | None = None
    dry_run: bool = False
    api_version: str = ""

    def status_mode(self, resource: Resource) -> str:
        if not resource.has_status or self.subresource is None:
            return "track"
        return "only" if self.subresource == "status" else "skip"


IN_PROCESS = Write()


class Store:
    """Thread-safe in-memory objects keyed by (plural, namespace, name).

    A new store holds the ``namespaces`` it was given (so "default" exists, at
    resourceVersion 1) and, with ``webhooks``, the DWS Workflow admission webhook.
    """

    def __init__(
        self,
        history_limit: int = DEFAULT_HISTORY,
        webhooks: bool = True,
        namespaces: tuple[str, ...] = ("default",),
    ) -> None:
        self._lock = threading.RLock()
        self._objects: dict[str, dict[tuple[str, str], _Snapshot]] = {}
        self._rv = 0
        self._history: deque[_Event] = deque()
        self._history_limit = max(0, history_limit)
        self._floor = 0  # every event with rv > floor is still in the history
        self._watchers: set[Watch] = set()
        self._hooks: dict[str, list[Hook]] = {}
        # the garbage collector's graph: every stored uid, and who owns what
        self._ownership = OwnerGraph()
        if webhooks:
            from .admission import register_workflow_webhook

            register_workflow_webhook(self)
        for namespace in namespaces:
            self.create("namespaces", None, {"metadata": {"name": namespace}})

    # ---- reads ---------------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        with self._lock:
            return str(self._rv)

    def get(self, plural: str, namespace: str | None, name: str, *, shared: bool = False) -> dict:
        """A copy of the object; with ``shared``, the stored object (read-only: see the top)."""
        resource = by_plural(plural)
        with self._lock:
            return self._existing(resource, namespace, name).out(shared)

    def list(
        self,
        plural: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        *,
        shared: bool = False,
    ) -> tuple[list[dict], str]:
        with self._lock:
            found = self._matching(plural, namespace, label_selector, field_selector)
            return [snap.out(shared) for snap in found], str(self._rv)

    def list_page(
        self,
        plural: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 0,
        token: str | None = None,
        *,
        shared: bool = False,
    ) -> tuple[list[dict], str, str | None, int | None]:
        """One page of a list: (items, resourceVersion, continue token, remainingItemCount).

        Every page of one list shows the objects as they were when its first page was taken.
        """
        snaps, rv, more, remaining = self._page(
            plural, namespace, label_selector, field_selector, limit, token
        )
        return [s.out(shared) for s in snaps], rv, more, remaining

    def list_page_text(
        self,
        plural: str,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
        limit: int,
        token: str | None,
        api_version: str,
    ) -> tuple[list[str], str, str | None, int | None]:
        """``list_page`` with each item as the JSON text it was committed as (saying
        ``api_version``), for a server that only sends it on: no object is encoded again."""
        snaps, rv, more, remaining = self._page(
            plural, namespace, label_selector, field_selector, limit, token
        )
        texts = [_with_api_version(s.text, s.obj.get("apiVersion"), api_version) for s in snaps]
        return texts, rv, more, remaining

    def _page(
        self,
        plural: str,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
        limit: int,
        token: str | None,
    ) -> tuple[list[_Snapshot], str, str | None, int | None]:
        resource = by_plural(plural)
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, resource)
        with self._lock:
            start: tuple[str, str] | None = None
            rv = self._rv
            table = self._objects.get(plural, {})
            if token:
                found = paging.decode(token)
                start = found.start
                if found.rv != paging.INCONSISTENT:
                    if found.rv < self._floor:
                        raise paging.expired(found.start)
                    rv = found.rv
                    table = paging.table_at(table, self._history, resource, rv)
            items, more, remaining = paging.select(
                table, start, namespace if resource.namespaced else None, labels, fields, limit
            )
            return items, str(rv), paging.encode(rv, more) if more else None, remaining

    # ---- writes --------------------------------------------------------------------------

    def create(
        self,
        plural: str,
        namespace: str | None,
        obj: dict,
        *,
        shared: bool = False,
        write: Write = IN_PROCESS,
    ) -> dict:
        resource = by_plural(plural)
        new = copy_json(obj)
        if not isinstance(new, dict):
            raise errors.bad_request("the request body must be a JSON object")
        check_type(resource, new)
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        namespace = scope(resource, namespace, meta)
        if meta.get("resourceVersion"):
            raise ApiError(
                500,
                "InternalError",
                "Internal error occurred: resourceVersion should not be set on objects to be"
                " created",
            )
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            meta["name"] = f"{meta['generateName']}{suffix}"
        check_name(resource, meta.get("name"))
        for field in SYSTEM_METADATA:
            meta.pop(field, None)
        if resource.namespaced:
            meta["namespace"] = namespace
        if write.status_mode(resource) == "skip":
            new.pop("status", None)  # the status subresource alone writes status
        normalize(resource, new)
        with self._lock:
            if resource.namespaced:
                self._check_namespace(namespace)
            new = self._admit(resource, "CREATE", None, new)
            key = (namespace, new["metadata"]["name"])
            if key in self._objects.get(plural, {}):
                raise errors.already_exists(resource.qualified, key[1])
            meta = new["metadata"]
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), name=key[1])
            if resource.group:  # custom resources count spec changes; these core kinds do not
                meta["generation"] = 1
            if resource.namespaced:
                meta["namespace"] = namespace
            if write.manager is not None:
                if write.manager.operation == "Update":
                    meta.pop("managedFields", None)
                    managed.record_update(
                        None, new, write.manager, write.api_version, now(), "track"
                    )
            else:
                meta.pop("managedFields", None)
            return self._commit(resource, key, "ADDED", new, None, write.dry_run).out(shared)

    def _check_namespace(self, namespace: str) -> None:
        """NamespaceLifecycle: no new objects in a missing or terminating namespace."""
        found = self._objects.get("namespaces", {}).get(("", namespace))
        if found is None:
            raise errors.not_found("namespaces", namespace)
        if found.obj["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                "Forbidden",
                f"unable to create new content in namespace {namespace} because it is being"
                " terminated",
                {"name": namespace, "kind": "namespaces"},
            )

    def replace(
        self,
        plural: str,
        namespace: str | None,
        name: str,
        obj: dict,
        *,
        shared: bool = False,
        write: Write = IN_PROCESS,
    ) -> dict:
        """PUT: 409 Conflict when obj's metadata.resourceVersion is set and stale."""
        resource = by_plural(plural)
        new = copy_json(obj)
        if not isinstance(new, dict) or not isinstance(new.get("metadata", {}), dict):
            raise errors.bad_request("the request body must be a JSON object")
        check_type(resource, new)
        with self._lock:
            old = self._existing(resource, namespace, name)
            wanted = new.get("metadata", {}).get("resourceVersion")
            if wanted and wanted != old.obj["metadata"]["resourceVersion"]:
                raise errors.conflict(resource.qualified, name)
            return self._update(resource, old, new, write).out(shared)

    def patch(
        self,
        plural: str,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        shared: bool = False,
        write: Write = IN_PROCESS,
    ) -> dict:
        """RFC 7386 merge patch (a dict) or RFC 6902 JSON patch (a list of operations).

        A metadata.resourceVersion in the result is a precondition, as in Kubernetes.
        """
        from .patches import json_patch, merge_patch

        resource = by_plural(plural)
        patch = copy_json(patch)
        with self._lock:
            old = self._existing(resource, namespace, name)
            if isinstance(patch, list):
                new = json_patch(old.obj, patch)  # works on a copy of its own
            elif isinstance(patch, dict):
                new = merge_patch(old.copy(), patch)  # never share parts of the stored object
            else:
                raise errors.bad_request("the patch must be a JSON object or a JSON patch list")
            if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
                raise errors.bad_request("the patched object must keep its metadata")
            wanted = new["metadata"].get("resourceVersion")
            if wanted and wanted != old.obj["metadata"]["resourceVersion"]:
                raise errors.conflict(resource.qualified, name)
            check_type(resource, new)
            return self._update(resource, old, new, write).out(shared)

    def apply(
        self,
        plural: str,
        namespace: str | None,
        name: str,
        config: Any,
        write: Write,
        *,
        force: bool = False,
        shared: bool = False,
    ) -> tuple[dict, bool]:
        """Server-side apply of ``config`` by ``write.manager``: (object, whether created)."""
        resource = by_plural(plural)
        if not isinstance(config, dict) or not isinstance(config.get("metadata", {}), dict):
            raise errors.bad_request("the apply configuration must be an object")
        config = copy_json(config)
        if not config.get("apiVersion") or not config.get("kind"):
            missing = "apiVersion" if not config.get("apiVersion") else "kind"
            raise errors.bad_request(f"invalid object type: {missing} must be set")
        check_type(resource, config)
        meta = config.setdefault("metadata", {})
        if meta.get("name") and meta["name"] != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL"
                f" ({name})"
            )
        meta["name"] = name
        assert write.manager is not None
        mode = write.status_mode(resource)
        with self._lock:
            key = (namespace or "" if resource.namespaced else "", name)
            old = self._objects.get(plural, {}).get(key)
            if old is None:
                if write.subresource == "status":
                    raise errors.not_found(resource.qualified, name)
                merged = managed.apply(
                    {"metadata": {}}, config, write.manager, write.api_version, now(), force=force
                )
                created = self.create(
                    plural, namespace, merged, shared=shared, write=_applying(write)
                )
                return created, True
            if meta.get("resourceVersion") and (
                meta["resourceVersion"] != old.obj["metadata"]["resourceVersion"]
            ):
                raise errors.conflict(resource.qualified, name)
            merged = managed.apply(
                old.obj, config, write.manager, write.api_version, now(), force=force, status=mode
            )
            return self._update(resource, old, merged, _applying(write)).out(shared), False

    def delete(
        self,
        plural: str,
        namespace: str | None,
        name: str,
        preconditions: dict | None = None,
        *,
        shared: bool = False,
        dry_run: bool = False,
    ) -> dict:
        """Delete now, or with finalizers set deletionTimestamp and keep the object.

        Returns the object as last stored (still present exactly when it has finalizers).
        """
        resource = by_plural(plural)
        with self._lock:
            old = self._existing(resource, namespace, name)
            old_meta = old.obj["metadata"]
            check_preconditions(resource, old.obj, preconditions or {})
            key = key_of(resource, old.obj)
            is_namespace = resource.plural == "namespaces"
            if old_meta.get("finalizers") or is_namespace:
                if old_meta.get("deletionTimestamp"):
                    return old.out(shared)
                new = old.copy()
                new["metadata"]["deletionTimestamp"] = now()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                if is_namespace:  # spec.finalizers ["kubernetes"]: the namespace controller
                    new.setdefault("status", {})["phase"] = "Terminating"
                elif resource.group:
                    new["metadata"]["generation"] = old_meta.get("generation", 0) + 1
                done = self._commit(resource, key, "MODIFIED", new, old, dry_run)
                if is_namespace and not dry_run:
                    self._finalize_namespace(name)
                    done = self._objects.get("namespaces", {}).get(key, done)
                return done.out(shared)
            return self._commit(resource, key, "DELETED", old.copy(), old, dry_run).out(shared)

    def delete_collection(
        self,
        plural: str,
        namespace: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        *,
        dry_run: bool = False,
    ) -> list[dict]:
        """DELETE on a collection (client-go's DeleteAllOf): each selected object is deleted as
        by ``delete`` (finalizers keep it, with deletionTimestamp set).  Returns them as last
        stored, in list order, as kube-apiserver's deletecollection answers."""
        with self._lock:
            found = self._matching(plural, namespace, label_selector, field_selector)
            names = [(s.obj["metadata"].get("namespace"), s.obj["metadata"]["name"]) for s in found]
            return [self.delete(plural, ns, name, dry_run=dry_run) for ns, name in names]

    def _finalize_namespace(self, namespace: str) -> None:
        """The namespace controller: delete everything in a terminating namespace, and the
        namespace itself once nothing is left (objects with finalizers hold it)."""
        ns = self._objects.get("namespaces", {}).get(("", namespace))
        if ns is None or not ns.obj["metadata"].get("deletionTimestamp"):
            return
        left = False
        for plural, table in list(self._objects.items()):
            resource = by_plural(plural)
            if not resource.namespaced:
                continue
            for key in [k for k in table if k[0] == namespace]:
                self.delete(plural, namespace, key[1])
                left = left or key in self._objects.get(plural, {})
        if not left:
            self._commit(by_plural("namespaces"), ("", namespace), "DELETED", ns.copy(), ns)

    def _namespace_emptied(self, namespace: str) -> None:
        """After a deletion in ``namespace``: a terminating namespace left empty goes too."""
        ns = self._objects.get("namespaces", {}).get(("", namespace))
        if ns is None or not ns.obj["metadata"].get("deletionTimestamp"):
            return
        for plural, table in self._objects.items():
            if by_plural(plural).namespaced and any(k[0] == namespace for k in table):
                return
        self._commit(by_plural("namespaces"), ("", namespace), "DELETED", ns.copy(), ns)

    # ---- watches -------------------------------------------------------------------------

    def watch(
        self,
        plural: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        resource_version: str | None = None,
        field_selector: str | None = None,
        bookmark_interval: float | None = None,
        *,
        shared: bool = False,
    ) -> Watch:
        """Events after ``resource_version`` (with ``shared``, of stored objects: read-only).

        None or "" starts from now; "0" first sends a synthetic ADDED for every matching object
        (as Kubernetes does); a version older than the retained history raises 410 Expired.
        """
        resource = by_plural(plural)
        with self._lock:
            start = self._rv
            replay_from: int | None = None
            if resource_version not in (None, "", "0"):
                replay_from = parse_rv(str(resource_version))
                if replay_from < self._floor:
                    raise errors.expired(replay_from, self._floor)
                start = max(start, replay_from)
            watch = Watch(
                resource,
                namespace,
                label_selector,
                field_selector,
                start,
                bookmark_interval,
                self._unregister,
                shared,
            )
            if resource_version == "0":
                for snap in self._matching(plural, namespace, label_selector, field_selector):
                    watch._push_added(snap)
            elif replay_from is not None:
                for event in self._history:
                    if event.rv > replay_from:
                        watch._offer(event, event.rv)
            self._watchers.add(watch)
            return watch

    def compact(self) -> None:
        """Forget the event history: watches from any earlier version now get 410."""
        with self._lock:
            self._history.clear()
            self._floor = self._rv

    def set_history_limit(self, limit: int) -> None:
        with self._lock:
            self._history_limit = max(0, limit)
            self._trim()

    def close_watches(self) -> None:
        """Close every open watch (their next() returns None)."""
        with self._lock:
            watchers = list(self._watchers)
        for watch in watchers:
            watch.close()

    # ---- admission and persistence -------------------------------------------------------

    def add_admission(self, plural: str, hook: Hook) -> None:
        """Run ``hook`` on each CREATE and UPDATE of ``plural``; it may mutate or raise ApiError."""
        by_plural(plural)
        with self._lock:
            self._hooks.setdefault(plural, []).append(hook)

    def dump(self) -> dict:
        """Every object and the current resourceVersion, as JSON-ready data."""
        with self._lock:
            objects = [s.copy() for table in self._objects.values() for s in table.values()]
            return {"resourceVersion": self._rv, "objects": objects}

    def load(self, state: dict) -> None:
        """Replace the contents with a dump(); the event history starts empty."""
        with self._lock:
            self._objects = {}
            self._ownership = OwnerGraph()
            for obj in state.get("objects", []):
                resource = resource_of(obj)
                text = _dumps(obj)
                snap = _Snapshot(json.loads(text), text)
                self._objects.setdefault(resource.plural, {})[key_of(resource, obj)] = snap
                self._ownership.update(resource.plural, key_of(resource, obj), None, snap.obj)
            self._rv = int(state.get("resourceVersion", 0))
            self.compact()

    # ---- internals -----------------------------------------------------------------------

    def _existing(self, resource: Resource, namespace: str | None, name: str) -> _Snapshot:
        key = (namespace or "" if resource.namespaced else "", name)
        found = self._objects.get(resource.plural, {}).get(key)
        if found is None:
            raise errors.not_found(resource.qualified, name)
        return found

    def _matching(
        self,
        plural: str,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
    ) -> list[_Snapshot]:
        """The snapshots of ``plural`` a list or watch selects, in key order (under the lock)."""
        resource = by_plural(plural)
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, resource)
        table = self._objects.get(plural, {})
        return [
            table[key]
            for key in sorted(table)
            if (namespace is None or not resource.namespaced or key[0] == namespace)
            and matches(labels, table[key].obj["metadata"].get("labels"))
            and fields_match(fields, table[key].obj)
        ]

    def _update(
        self, resource: Resource, old_snap: _Snapshot, new: dict, write: Write = IN_PROCESS
    ) -> _Snapshot:
        old = old_snap.obj
        old_meta, meta = old["metadata"], new.setdefault("metadata", {})
        for field, label in (("name", "name"), ("namespace", "namespace")):
            if meta.get(field) and meta[field] != old_meta.get(field):
                raise errors.bad_request(
                    f"the {label} of the object ({meta[field]}) does not match the {label} on"
                    f" the URL ({old_meta.get(field)})"
                )
        mode = write.status_mode(resource)
        if mode == "only":  # /status: everything but the status stays as stored
            status = new.get("status")
            sent_fields = meta.get("managedFields")
            new = old_snap.copy()
            meta = new["metadata"]
            if sent_fields is not None:
                meta["managedFields"] = sent_fields
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        elif mode == "skip":  # the main resource: status stays as stored
            if "status" in old:
                new["status"] = copy_json(old["status"])
            else:
                new.pop("status", None)
        for field in (*SYSTEM_METADATA, "name", "namespace"):
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        normalize(resource, new)
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
            if added:
                raise errors.invalid(
                    resource.kind_group,
                    old_meta["name"],
                    [
                        "metadata.finalizers: Forbidden: no new finalizers can be added if the"
                        f" object is being deleted, found new finalizers"
                        f" {errors.go_strings(sorted(added))}"
                    ],
                )
        new = self._admit(resource, "UPDATE", old, new)
        if write.manager is None:
            if "managedFields" in old_meta:
                new["metadata"]["managedFields"] = old_meta["managedFields"]
            else:
                new["metadata"].pop("managedFields", None)
        elif write.manager.operation == "Update":
            managed.record_update(old, new, write.manager, write.api_version, now(), mode)
        key = key_of(resource, old)
        if (
            old_meta.get("deletionTimestamp")
            and not new["metadata"].get("finalizers")
            and resource.plural != "namespaces"
        ):
            return self._commit(resource, key, "DELETED", new, old_snap, write.dry_run)
        if without_version(new) == without_version(old) and (
            write.manager is None or field_owners(new) == field_owners(old)
        ):
            return old_snap  # a no-op write: nothing changes, not even the resourceVersion
        if resource.group and counted_content(resource, new) != counted_content(resource, old):
            new["metadata"]["generation"] = old_meta.get("generation", 0) + 1
        return self._commit(resource, key, "MODIFIED", new, old_snap, write.dry_run)

    def _admit(self, resource: Resource, operation: str, old: dict | None, new: dict) -> dict:
        """Run the hooks on ``new`` (the store's own copy); what they return becomes ours too."""
        for hook in self._hooks.get(resource.plural, ()):
            try:
                result = hook(operation, old, new)
            except ApiError:
                raise
            except Exception as exc:  # a crashing webhook is a 500, as with a real one
                raise ApiError(
                    500, "InternalError", f"Internal error occurred: admission hook failed: {exc}"
                ) from exc
            if result is not None and result is not new:
                new = copy_json(result)
        return new

    def _commit(
        self,
        resource: Resource,
        key: tuple[str, str],
        event_type: str,
        new: dict,
        prev: _Snapshot | None,
        dry_run: bool = False,
    ) -> _Snapshot:
        """Store ``new`` (ours from now on) at the next resourceVersion; tell every watch.

        A dry run goes no further than encoding: nothing is stored or seen by any watch.
        """
        if dry_run:
            if prev is None:
                new["metadata"].pop("resourceVersion", None)
            return _Snapshot.of(new)
        rv = self._rv + 1
        new["metadata"]["resourceVersion"] = str(rv)
        snap = _Snapshot.of(new)  # a 400 for data that is not JSON, before anything changed
        self._rv = rv
        table = self._objects.setdefault(resource.plural, {})
        gone = event_type == "DELETED"
        if gone:
            table.pop(key, None)
        else:
            table[key] = snap
        old = prev.obj if prev else None
        self._ownership.update(resource.plural, key, old, None if gone else snap.obj)
        event = _Event(rv, resource.plural, event_type, snap, prev)
        self._history.append(event)
        self._trim()
        for watch in list(self._watchers):
            watch._offer(event, rv)
        if gone and resource.namespaced:
            self._namespace_emptied(key[0])
        if gone:
            self._collect_dependents(snap.obj["metadata"].get("uid", ""))
        return snap

    def _collect_dependents(self, uid: str) -> None:
        """The garbage collector (background propagation): the object ``uid`` is gone, so
        each object it owned is deleted once no owner of it is left (finalizers still hold
        it).  Kubernetes does this a moment later; here it is at once."""
        for plural, key in self._ownership.orphans(uid, self._objects):
            self.delete(plural, key[0] or None, key[1])

    def _trim(self) -> None:
        while len(self._history) > self._history_limit:
            self._floor = self._history.popleft().rv

    def _unregister(self, watch: Watch) -> None:
        with self._lock:
            self._watchers.discard(watch)


def _applying(write: Write) -> Write:
    """The Write an apply's create or update goes on as (its managedFields already set)."""
    assert write.manager is not None
    apply_manager = Manager(write.manager.name, "Apply", write.manager.subresource)
    return Write(apply_manager, write.subresource, write.dry_run, write.api_version)
