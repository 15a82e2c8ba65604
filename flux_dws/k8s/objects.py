# SPDX-License-Identifier: LGPL-3.0-only
"""How any request for a DWS or NNF object is made: one path for get, list (page by page),
patch, create, delete and watch, whatever the Kind (flux_dws.k8s.resources).

KubeClient (flux_dws.k8s.client) says which objects flux-dws reads and writes; KubeObjects,
its base, says how: the request's path from the Kind and the served versions, what its errors
name (the Kind's noun and ``namespace/name``, or a list's namespace, ``*`` for every one), and
its bounds: each goes through flux_dws.k8s.calls (a timeout per attempt, bounded jittered
retries, every attempt counted), but a watch, whose loop owns reconnecting.  A get that finds
nothing (404) is None; a delete of what is already gone is done.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any, Callable, NamedTuple

import urllib3
from kubernetes.client.exceptions import ApiException

from flux_dws.k8s import listing
from flux_dws.k8s.calls import TRANSPORT_ERRORS, Calls, transport_error
from flux_dws.k8s.errors import KubeError
from flux_dws.k8s.listing import Page
from flux_dws.k8s.rawapi import Core, CustomObjects
from flux_dws.k8s.resources import ApiVersions, Kind, version_of

#: objects per list request (kubectl's default chunk size)
LIST_PAGE = 500


class Collection(NamedTuple):
    """What one list or watch asks for."""

    what: str  # what its errors and log lines call it
    namespace: str | None  # None: every namespace
    selector: str | None  # a label selector
    request: Callable[..., Any]  # the list request (keywords label_selector, limit, watch...)
    target: str = ""  # what its errors name it at; by default the namespace (``*``: every one)


class _OfCalls:
    """A client attribute that is its Calls' own (read and written through)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, client: Any, owner: Any = None) -> Any:
        return self if client is None else getattr(client.calls, self.name)

    def __set__(self, client: Any, value: Any) -> None:
        setattr(client.calls, self.name, value)


class KubeObjects:
    """The requests of KubeClient, for any Kind; see the module docstring."""

    # Set by KubeClient's constructor.
    calls: Calls
    versions: ApiVersions
    _custom: CustomObjects
    _core: Core
    _merge_patch: dict[str, str]  # the keyword that makes a patch a merge patch, if any

    #: objects per list request (an instance may lower it, e.g. to exercise paging)
    _page_size: int = LIST_PAGE

    # What the requests are bounded by, and who watches them: held by flux_dws.k8s.calls.
    timeout = _OfCalls("timeout")
    retries = _OfCalls("retries")
    backoff_base = _OfCalls("backoff_base")
    backoff_max = _OfCalls("backoff_max")
    counts = _OfCalls("counts")
    observer = _OfCalls("observer")

    # -- one object --------------------------------------------------------------------------

    def _get(self, kind: Kind, namespace: str, name: str) -> dict | None:
        """The object, or None if there is none."""
        try:
            return self.calls.call(
                "get",
                kind.noun,
                f"{namespace}/{name}",
                self._custom.get_namespaced_custom_object,
                *self._where(kind, namespace),
                name,
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def _patch(
        self, kind: Kind, namespace: str, name: str, body: dict, *, retry_conflict: bool = True
    ) -> dict:
        """Merge-patch the object.  ``retry_conflict``: send it again after a 409 (right for
        an unconditional patch, not for one that carries a resourceVersion)."""
        return self.calls.call(
            "patch",
            kind.noun,
            f"{namespace}/{name}",
            self._custom.patch_namespaced_custom_object,
            *self._where(kind, namespace),
            name,
            body,
            retry_conflict=retry_conflict,
            **self._merge_patch,
        )

    def _create(self, kind: Kind, namespace: str, name: str, body: dict) -> dict:
        """Create ``body``, the object ``namespace/name``."""
        return self.calls.call(
            "create",
            kind.noun,
            f"{namespace}/{name}",
            self._custom.create_namespaced_custom_object,
            *self._where(kind, namespace),
            body,
        )

    def _delete(self, kind: Kind, namespace: str, name: str) -> None:
        """Delete the object; already gone is success."""
        try:
            self.calls.call(
                "delete",
                kind.noun,
                f"{namespace}/{name}",
                self._custom.delete_namespaced_custom_object,
                *self._where(kind, namespace),
                name,
            )
        except KubeError as exc:
            if exc.status != 404:
                raise

    def _where(self, kind: Kind, namespace: str) -> tuple[str, str | None, str, str]:
        """The leading arguments of a request for one object: group, version, namespace,
        plural."""
        return kind.group, kind.version(self.versions), namespace, kind.plural

    # -- collections ---------------------------------------------------------------------------

    def _collection(
        self,
        kind: Kind,
        namespace: str | None,
        selector: str | None = None,
        *,
        what: str | None = None,
        target: str = "",
    ) -> Collection:
        """``kind`` in ``namespace`` (None: every namespace), by label ``selector``; ``what``
        names it in errors (by default the plural), at ``target`` (by default the namespace)."""
        version = kind.version(self.versions)
        if namespace is None:
            request = functools.partial(
                self._custom.list_cluster_custom_object, kind.group, version, kind.plural
            )
        else:
            request = functools.partial(
                self._custom.list_namespaced_custom_object,
                kind.group,
                version,
                namespace,
                kind.plural,
            )
        return Collection(what or kind.plural, namespace, selector, request, target)

    def _pods(self, namespace: str, selector: str, what: str, target: str = "") -> Collection:
        """core/v1 pods in ``namespace`` by label ``selector``, as ``_collection``'s."""
        request = functools.partial(self._core.list_namespaced_pod, namespace)
        return Collection(what, namespace, selector, request, target)

    def _items(self, where: Collection) -> list[dict]:
        """The whole collection in one request, without paging (for lists known to be short)."""
        return self._list_page(None, None, where)[0]

    def _list_all(self, where: Collection) -> tuple[list[dict], str]:
        """Every page of one list at once, and the list's resourceVersion."""
        return listing.collect(self._list_pages(where))

    def _list_pages(self, where: Collection) -> Iterator[Page]:
        """The pages of one list as each arrives (flux_dws.k8s.listing)."""
        return listing.pages(lambda t: self._list_page(self._page_size, t, where), where.what)

    def _list_page(
        self, limit: int | None, token: str | None, where: Collection
    ) -> tuple[list[dict], str, str | None]:
        """One page of at most ``limit`` objects (None: all) from continue ``token``: its
        objects, the list's resourceVersion and the next page's token (None: the last)."""
        extra = {"_continue": token} if token else {}
        result = self.calls.call(
            "list",
            where.what,
            where.target or where.namespace or "*",
            where.request,
            label_selector=where.selector,
            limit=limit,
            **extra,
        )
        meta = result.get("metadata") if isinstance(result, dict) else None
        token = meta.get("continue") if isinstance(meta, dict) else None
        items = result.get("items") if isinstance(result, dict) else None
        page = [i for i in items or [] if isinstance(i, dict)] if isinstance(items, list) else []
        return page, version_of(result), token or None

    def _open_watch(
        self, where: Collection, resource_version: str, timeout_seconds: int, read_timeout: float
    ) -> urllib3.HTTPResponse:
        """Start one watch on ``where`` after ``resource_version``; the raw response.

        No retry here: the watch loop owns reconnecting.  The server ends the stream after
        ``timeout_seconds``; ``read_timeout`` (longer) notices a connection that died silently.
        """
        self.calls.count("watch")
        try:
            return where.request(
                label_selector=where.selector,
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=resource_version,
                timeout_seconds=timeout_seconds,
                _preload_content=False,
                _request_timeout=(self.calls.timeout, read_timeout),
            )
        except ApiException as exc:
            raise self.calls.api_error("watch", where.what, where.namespace or "*", exc) from exc
        except TRANSPORT_ERRORS as exc:
            raise transport_error("watch", where.what, where.namespace or "*", exc) from exc
