# SPDX-License-Identifier: LGPL-3.0-only
"""A small event loop: callbacks from any thread, timers at absolute times.

The service runs every decision on one thread.  Kubernetes calls finish on worker threads and
the watch runs on its own thread; they hand their results to the loop with ``call_soon``, which
is safe from any thread.  Under a real Flux instance the Flux reactor plays this part (see
flux_dws.flux.reactor); this one serves fakeflux, the tests and the simulation mode.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from typing import Any, Callable

log = logging.getLogger("flux-dws.base.loop")


class Timer:
    """A scheduled callback; ``cancel()`` is safe to call more than once."""

    __slots__ = ("when", "fn", "args", "cancelled")

    def __init__(self, when: float, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.when, self.fn, self.args, self.cancelled = when, fn, args, False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    """Run callbacks one at a time on the thread that calls ``run()``.

    Times are wall-clock seconds since the epoch (``time.time``), because job deadlines are
    absolute times recorded on the job and must mean the same after a restart.
    """

    def __init__(self, clock: Callable[[], float] = time.time, name: str = "loop") -> None:
        self.clock = clock
        self.name = name
        self._ready: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._timers: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def time(self) -> float:
        return self.clock()

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop's thread; callable from any thread."""
        self._ready.put((fn, args))

    def call_at(self, when: float, fn: Callable[..., Any], *args: Any) -> Timer:
        """Run ``fn(*args)`` at ``when``; callable from any thread."""
        timer = Timer(when, fn, args)
        self.call_soon(self._add_timer, timer)
        return timer

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer:
        return self.call_at(self.time() + delay, fn, *args)

    def _add_timer(self, timer: Timer) -> None:
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))

    def run(self) -> None:
        """Run until ``stop()``; an exception in a callback is logged, not fatal."""
        self._stopping.clear()
        while not self._stopping.is_set():
            timeout = self._run_due_timers()
            try:
                fn, args = self._ready.get(timeout=timeout)
            except queue.Empty:
                continue
            self._invoke(fn, args)

    def run_pending(self) -> float:
        """Run every queued callback and due timer now; return seconds until the next timer.

        For loops driven by another reactor (Flux's): it calls this when woken.
        """
        while True:
            try:
                fn, args = self._ready.get_nowait()
            except queue.Empty:
                break
            self._invoke(fn, args)
        return self._run_due_timers()

    def _run_due_timers(self) -> float:
        """Fire due timers; return how long to wait for the next one (bounded)."""
        while self._timers:
            when, _, timer = self._timers[0]
            if timer.cancelled:
                heapq.heappop(self._timers)
                continue
            delay = when - self.time()
            if delay > 0:
                return min(delay, 1.0)
            heapq.heappop(self._timers)
            self._invoke(timer.fn, timer.args)
        return 1.0

    def _invoke(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("%s: callback %s failed", self.name, getattr(fn, "__qualname__", fn))

    def stop(self) -> None:
        """Stop ``run()`` (from any thread) after the callback in progress."""
        self._stopping.set()
        self.call_soon(lambda: None)

    def start_thread(self) -> Loop:
        """Run the loop on a daemon thread of its own."""
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def run_sync(self, fn: Callable[..., Any], *args: Any, timeout: float = 10.0) -> Any:
        """Run ``fn`` on the loop's thread and wait for its result (tests and tools only)."""
        done = threading.Event()
        box: dict[str, Any] = {}

        def call() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # handed back to the caller
                box["error"] = exc
            done.set()

        self.call_soon(call)
        if not done.wait(timeout):
            raise TimeoutError(f"{self.name}: no answer within {timeout}s")
        if "error" in box:
            raise box["error"]
        return box.get("value")
