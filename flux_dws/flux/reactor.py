# SPDX-License-Identifier: LGPL-3.0-only
"""The service's loop and transport on a real Flux handle (flux-core's Python bindings).

FluxLoop is flux_dws.base.loop.Loop driven by the Flux reactor: callbacks queued from any thread
wake the reactor through a pipe, and the loop's timer heap is served by one Flux timer watcher
re-armed for the next deadline.  FluxTransport sends doc/protocol.rst's requests with the same
handle, so every Flux call happens on the reactor's thread.  Imports of ``flux`` stay inside
functions: this module loads without flux-core.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any, Callable

from flux_dws.base.loop import Loop
from flux_dws.flux.transport import TOPIC_PREFIX, Callback, Payload, RpcError

log = logging.getLogger("flux-dws.flux.reactor")


class FluxLoop(Loop):
    """A Loop whose ``run()`` is the Flux reactor of ``handle``."""

    def __init__(self, handle: Any, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock=clock, name="flux-dws")
        from flux.constants import FLUX_POLLIN

        self.handle = handle
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._wakeup = handle.fd_watcher_create(self._rfd, self._on_wakeup, events=FLUX_POLLIN)
        self._wakeup.start()
        self._timer: Any = None

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        super().call_soon(fn, *args)
        with contextlib.suppress(BlockingIOError):  # full pipe: a wake-up is already pending
            os.write(self._wfd, b"\0")

    def _on_wakeup(self, *_: Any) -> None:
        try:
            while os.read(self._rfd, 4096):
                pass
        except BlockingIOError:
            pass
        self._pump()

    def _pump(self, *_: Any) -> None:
        delay = self.run_pending()
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.handle.timer_watcher_create(delay, self._pump)
        self._timer.start()

    def run(self) -> None:
        """Run the reactor until ``stop()``, or until it stops by itself: with no watcher
        left, or with an error (libflux stops it so when receiving from the broker fails;
        the bindings do when a callback raised, and re-raise that exception here).  An error
        end is kept in ``broken``, never raised: the caller tells a lost instance from a
        failure on a live one (:meth:`instance_answers`)."""
        self.broken: BaseException | None = None
        self.call_soon(lambda: None)  # serve anything queued before the reactor started
        try:
            rc = self.handle.reactor_run()
        except Exception as exc:
            self.broken = exc
            return
        if isinstance(rc, int) and rc < 0:
            self.broken = OSError("the reactor stopped with an error")

    def instance_answers(self, timeout: float = 10.0) -> bool:
        """Whether the broker still answers a ping: after the reactor stopped by itself, tells
        an instance that went away from a reactor that failed on a live one."""
        try:
            self.handle.rpc("broker.ping", {"seq": 0, "pad": ""}).wait_for(timeout).get()
        except (OSError, TimeoutError):
            return False
        return True

    def stop(self) -> None:
        self.call_soon(self.handle.reactor_stop)


class FluxTransport:
    """doc/protocol.rst over a Flux handle; call only on the FluxLoop's thread.

    A request the handle cannot even send (the broker is gone: EPIPE, ECONNRESET) fails
    like any other, through its callback (``defer``: the loop's call_soon, so the caller's
    own frame has returned first), never as an exception in the caller.
    """

    def __init__(self, handle: Any, defer: Callable[..., None] | None = None) -> None:
        self.handle = handle
        self._defer = defer or (lambda fn, *args: fn(*args))
        self._streams: list[dict[str, bool]] = []

    def rpc(self, method: str, payload: Payload, on_done: Callback) -> None:
        try:
            future = self.handle.rpc(TOPIC_PREFIX + method, payload)
            future.then(self._answered, on_done)
        except OSError as exc:
            self._defer(on_done, None, RpcError(exc.errno or 0, exc.strerror or str(exc)))

    @staticmethod
    def _answered(future: Any, on_done: Callback) -> None:
        try:
            response = future.get()
        except OSError as exc:
            _answer(on_done, None, _rpc_error(future, exc))
        else:
            _answer(on_done, response or {}, None)

    def stream(self, method: str, payload: Payload, on_response: Callback) -> Callable[[], None]:
        from flux.constants import FLUX_RPC_STREAMING

        state = {"open": True}
        self._streams.append(state)
        try:
            future = self.handle.rpc(TOPIC_PREFIX + method, payload, flags=FLUX_RPC_STREAMING)
            future.then(self._streamed, on_response, state)
        except OSError as exc:
            state["open"] = False
            self._defer(on_response, None, RpcError(exc.errno or 0, exc.strerror or str(exc)))

        def cancel() -> None:
            state["open"] = False

        return cancel

    @staticmethod
    def _streamed(future: Any, on_response: Callback, state: dict[str, bool]) -> None:
        try:
            response = future.get()
        except OSError as exc:
            if state["open"]:
                state["open"] = False
                _answer(on_response, None, _rpc_error(future, exc))
            return
        future.reset()
        if state["open"]:
            _answer(on_response, response or {}, None)

    def close(self) -> None:
        for state in self._streams:
            state["open"] = False


def _answer(callback: Callback, response: Payload | None, error: RpcError | None) -> None:
    """Hand a response to its callback; a callback that raises is logged, as the loop's are
    (flux_dws.base.loop), never left to the bindings, which would stop the reactor with it."""
    try:
        callback(response, error)
    except Exception:
        log.exception("a job-manager response callback failed")


def _rpc_error(future: Any, exc: OSError) -> RpcError:
    try:
        message = future.error_string() or exc.strerror or ""
    except Exception:  # the future may be gone with the handle
        message = exc.strerror or ""
    return RpcError(exc.errno or 0, message)
