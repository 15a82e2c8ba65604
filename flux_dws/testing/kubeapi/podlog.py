# SPDX-License-Identifier: LGPL-3.0-only
"""The core/v1 ``pods/log`` subresource: a container's log as text/plain.

A real API server asks the kubelet; here the log text lives beside the store, set by whoever
plays the kubelet (dwssim) with ``logs_of(store).write(...)``.  What the server honours, as the
real one does:

- ``container``: required when the pod has more than one container ("a container name must
  be specified for pod P, choose one of: [a b]"); a name the pod does not have is 400.
- a container that has not started (waiting) is 400 "container "c" in pod "p" is waiting to
  start: <reason>"; ``previous=true`` without an earlier instance is 400 too.
- ``tailLines`` (>= 0) keeps the last N lines, then ``limitBytes`` (>= 1) cuts the answer
  after that many bytes, possibly mid-line.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from .errors import ApiError

_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log/?$")


class PodLogs:
    """Log text by (namespace, pod, container, previous); thread-safe."""

    def __init__(self) -> None:
        self._logs: dict[tuple[str, str, str, bool], bytes] = {}
        self._lock = threading.Lock()

    def write(
        self, namespace: str, pod: str, container: str, text: str | bytes, *, previous: bool = False
    ) -> None:
        data = text.encode() if isinstance(text, str) else bytes(text)
        with self._lock:
            self._logs[(namespace, pod, container, previous)] = data

    def read(
        self, namespace: str, pod: str, container: str, previous: bool = False
    ) -> bytes | None:
        with self._lock:
            return self._logs.get((namespace, pod, container, previous))

    def forget(self, namespace: str, pod: str) -> None:
        with self._lock:
            for key in [k for k in self._logs if k[0] == namespace and k[1] == pod]:
                del self._logs[key]


_REGISTRY: weakref.WeakKeyDictionary[Any, PodLogs] = weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()


def logs_of(store: Any) -> PodLogs:
    """The pod logs that go with ``store`` (created on first use)."""
    with _REGISTRY_LOCK:
        if store not in _REGISTRY:
            _REGISTRY[store] = PodLogs()
        return _REGISTRY[store]


def match(path: str) -> tuple[str, str] | None:
    """(namespace, pod) when ``path`` names a pod's log subresource."""
    found = _PATH.match(path)
    return (found.group(1), found.group(2)) if found else None


def serve(store: Any, namespace: str, pod: str, query: Mapping[str, str]) -> bytes:
    """The log a GET asks for; ApiError (400, 404, 422) as the real server answers."""
    obj = store.get("pods", namespace, pod, shared=True)  # 404 pods "p" not found
    tail = _number(query, "tailLines", least=0)
    limit = _number(query, "limitBytes", least=1)
    previous = query.get("previous") in ("true", "1")
    container = query.get("container") or _only_container(obj, pod)
    status = _container_status(obj, pod, container)
    if previous:
        data = logs_of(store).read(namespace, pod, container, previous=True)
        if data is None:
            raise _bad(f'previous terminated container "{container}" in pod "{pod}" not found')
    else:
        state = status.get("state") if isinstance(status.get("state"), Mapping) else {}
        waiting = state.get("waiting")
        if isinstance(waiting, Mapping) or not state:
            reason = waiting.get("reason", "") if isinstance(waiting, Mapping) else ""
            raise _bad(
                f'container "{container}" in pod "{pod}" is waiting to start: '
                f"{reason or 'ContainerCreating'}"
            )
        data = logs_of(store).read(namespace, pod, container) or b""
    if tail is not None:  # lines end at "\n" only, as the kubelet counts them ("\r" is text)
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
            data = b"".join(line + b"\n" for line in lines[-tail:]) if tail else b""
        else:
            kept = lines[-tail:] if tail else []
            data = b"\n".join(kept)
    if limit is not None:
        data = data[:limit]
    return data


def _names(obj: Mapping[str, Any], key: str) -> list[str]:
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    items = spec.get(key) if isinstance(spec.get(key), list) else []
    return [str(c.get("name", "")) for c in items if isinstance(c, Mapping)]


def _only_container(obj: Mapping[str, Any], pod: str) -> str:
    names = _names(obj, "containers")
    if len(names) == 1:
        return names[0]
    message = (
        f"a container name must be specified for pod {pod}, choose one of: [{' '.join(names)}]"
    )
    inits = _names(obj, "initContainers")
    if inits:
        message += f" or one of the init containers: [{' '.join(inits)}]"
    raise _bad(message)


def _container_status(obj: Mapping[str, Any], pod: str, container: str) -> Mapping[str, Any]:
    if container not in _names(obj, "containers") + _names(obj, "initContainers"):
        raise _bad(f"container {container} is not valid for pod {pod}")
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    for key in ("containerStatuses", "initContainerStatuses"):
        for entry in status.get(key) or []:
            if isinstance(entry, Mapping) and entry.get("name") == container:
                return entry
    return {}


def _number(query: Mapping[str, str], key: str, least: int) -> int | None:
    text = query.get(key)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, "BadRequest", f'{key}: Invalid value: "{text}": not a number') from None
    if value < least:
        rule = "must be greater than or equal to 0" if least == 0 else "must be greater than 0"
        raise ApiError(
            422, "Invalid", f'PodLogOptions "" is invalid: {key}: Invalid value: {value}: {rule}'
        )
    return value


def _bad(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)
