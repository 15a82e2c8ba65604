# SPDX-License-Identifier: LGPL-3.0-only
"""KubeWorker: run Kubernetes calls off the service's event loop; results come back as events.

A bounded pool of threads; ``submit`` only enqueues, so the event loop never waits on the API.
Each call's outcome is handed to ``on_done(result, error)`` through ``deliver``: the service
gives its loop's thread-safe "call soon", so results arrive on the loop as ordinary events and
no callback ever runs on a worker thread.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable, TypeVar

log = logging.getLogger("flux-dws.k8s.worker")

T = TypeVar("T")

#: How a finished call reaches the service: called with a no-argument callback.
Deliver = Callable[[Callable[[], None]], None]

_Call = Callable[[], None]


class KubeWorker:
    """A bounded pool of threads for blocking Kubernetes calls; never blocks the submitter.

    Calls run in submit order, except that ``urgent`` ones (a workflow's next state, which a
    job is waiting on) go first, and ``reserved`` threads only ever take urgent calls: a burst
    of creates and reads for new jobs can fill the other threads, yet a job that is already
    moving finds a thread free at once instead of queueing behind a slow API round trip.
    ``soon`` ones (a moving job's records, which its next state waits for but which may wait
    for a watch) run on the other threads, before the calls queued there.
    """

    def __init__(self, threads: int = 16, *, deliver: Deliver, reserved: int = 0) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        if not 0 <= reserved < threads:
            raise ValueError(
                f"reserved must be from 0 to threads - 1 ({threads - 1}), not {reserved}"
            )
        self._urgent: collections.deque[_Call] = collections.deque()
        self._soon: collections.deque[_Call] = collections.deque()
        self._normal: collections.deque[_Call] = collections.deque()
        self._normal_limit = threads - reserved  # threads that may run non-urgent calls
        self._normal_running = 0
        self._cond = threading.Condition()
        self._deliver = deliver
        self._stopped = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, name=f"kube-worker-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(
        self,
        fn: Callable[..., T],
        *args: Any,
        on_done: Callable[[T | None, BaseException | None], None],
        urgent: bool = False,
        soon: bool = False,
        **kwargs: Any,
    ) -> None:
        """Run ``fn(*args, **kwargs)`` on a worker thread, then ``on_done(result, error)``.

        Exactly one of result/error is meaningful; ``error`` is the exception ``fn`` raised.
        Raises RuntimeError after stop().
        """
        if self._stopped.is_set():
            raise RuntimeError("KubeWorker is stopped")

        def run() -> None:
            if self._stopped.is_set():
                result, error = None, RuntimeError("KubeWorker stopped before the call ran")
            else:
                try:
                    result, error = fn(*args, **kwargs), None
                except Exception as exc:
                    result, error = None, exc
            try:
                self._deliver(lambda: self._finish(on_done, result, error))
            except Exception:  # e.g. the service's loop is already closed
                log.exception("KubeWorker: could not deliver the outcome of %r", fn)

        with self._cond:
            (self._urgent if urgent else self._soon if soon else self._normal).append(run)
            self._cond.notify()

    def queued(self) -> int:
        """Calls waiting for a thread (a metric: how far the pool is behind)."""
        with self._cond:
            return len(self._urgent) + len(self._soon) + len(self._normal)

    def _next(self) -> tuple[_Call | None, bool]:
        """The next call for this thread (None: stop) and whether it is a non-urgent one."""
        with self._cond:
            while True:
                if self._urgent:
                    return self._urgent.popleft(), False
                stopped = self._stopped.is_set()  # then queued calls only end with an error
                queue = self._soon or self._normal
                if queue and (stopped or self._normal_running < self._normal_limit):
                    self._normal_running += 1
                    return queue.popleft(), True
                if stopped:
                    return None, False
                self._cond.wait()

    def _work(self) -> None:
        while True:
            run, normal = self._next()
            if run is None:
                return
            try:
                run()
            finally:
                if normal:
                    with self._cond:
                        self._normal_running -= 1
                        self._cond.notify()

    def stop(self, wait: bool = True) -> None:
        """Refuse new calls; queued ones end with an error.  By default wait for running ones."""
        with self._cond:
            self._stopped.set()
            self._cond.notify_all()
        if wait:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join()

    @staticmethod
    def _finish(
        on_done: Callable[[Any, BaseException | None], None],
        result: Any,
        error: BaseException | None,
    ) -> None:
        try:
            on_done(result, error)
        except Exception:
            log.exception("KubeWorker: on_done callback failed")
