# SPDX-License-Identifier: LGPL-3.0-only
"""A client's connection to fakeflux's job-manager: the in-process :class:`Transport`.

Messages cross as JSON text, as they would over a Flux handle, so neither side can share or
mutate the other's objects.  Requests run on the job-manager's loop; every response runs on
the client's loop, and none runs once the client cancelled that stream or closed.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
from typing import Any, Callable

from flux_dws.base.loop import Loop
from flux_dws.base.untrusted import jansson_problem
from flux_dws.flux.transport import Callback, Payload, RpcError
from flux_dws.testing.fakeflux.plugin import DwsPlugin, Request

log = logging.getLogger("flux-dws.testing.fakeflux.connection")


def log_refused(method: str, problem: str) -> None:
    """What the broker log would say about a request jansson could not parse."""
    log.warning("job-manager.dws.%s: payload refused by jansson: %s", method, problem)


class _Channel:
    """Where one request's responses go."""

    def __init__(self, conn: Connection, callback: Callback, streaming: bool) -> None:
        self.conn, self.callback, self.streaming = conn, callback, streaming
        self.done = False  # the job-manager sent the last response (job-manager thread)
        self.cancelled = threading.Event()  # the client hung up on this stream

    def respond(self, payload: dict[str, Any]) -> None:
        self._deliver(json.dumps(payload), None)
        self.done = not self.streaming

    def fail(self, err: RpcError) -> None:
        self._deliver(None, err)
        self.done = True

    def _deliver(self, text: str | None, err: RpcError | None) -> None:
        if not self.done:
            self.conn.client_loop.call_soon(self._invoke, text, err)

    def _invoke(self, text: str | None, err: RpcError | None) -> None:
        if self.conn.closed.is_set() or self.cancelled.is_set():
            return
        self.callback(None if text is None else json.loads(text), err)


class Connection:
    """What ``FakeFlux.connect`` returns: one client, identified by its userid."""

    def __init__(self, loop: Loop, plugin: DwsPlugin, client_loop: Loop, userid: int) -> None:
        self._loop, self._plugin = loop, plugin
        self.client_loop = client_loop
        self.userid = userid
        self.closed = threading.Event()

    def rpc(self, method: str, payload: Payload, on_done: Callback) -> None:
        self._send(method, payload, _Channel(self, on_done, streaming=False))

    def stream(self, method: str, payload: Payload, on_response: Callback) -> Callable[[], None]:
        channel = _Channel(self, on_response, streaming=True)
        self._send(method, payload, channel)

        def cancel() -> None:
            channel.cancelled.set()
            self._loop.call_soon(self._plugin.disconnect, self, channel)

        return cancel

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self._loop.call_soon(self._plugin.disconnect, self, None)

    def _send(self, method: str, payload: Payload, channel: _Channel) -> None:
        text = json.dumps(payload)  # a payload that is not JSON is the caller's bug: raise here
        if self.closed.is_set():
            err = RpcError(errno.ENOTCONN, "connection to the job-manager is closed")
            self.client_loop.call_soon(channel.callback, None, err)
            return
        if self.userid != self._plugin.jm.owner_uid:  # the role first: a guest's payload is
            err = self._plugin.refused(method)  # never parsed, as in the C plugin
            self.client_loop.call_soon(channel.callback, None, err)
            return
        problem = jansson_problem(payload)
        if problem is not None:  # the job-manager's json_loads refuses it: so does fakeflux
            log_refused(method, problem)
            err = RpcError(errno.EPROTO, "request payload must be a JSON object")
            self.client_loop.call_soon(channel.callback, None, err)
            return
        request = Request(
            method=method,
            userid=self.userid,
            payload=json.loads(text),
            streaming=channel.streaming,
            respond=channel.respond,
            fail=channel.fail,
            client=self,
            channel=channel,
        )
        self._loop.call_soon(self._dispatch, request, channel)

    def _dispatch(self, request: Request, channel: _Channel) -> None:
        if self.closed.is_set() or channel.cancelled.is_set():
            return  # the client went away before the job-manager read the request
        if not isinstance(request.payload, dict):
            request.fail(RpcError(errno.EPROTO, "request payload must be a JSON object"))
            return
        self._plugin.handle(request)
