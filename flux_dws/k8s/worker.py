"""KubeWorker: run Kubernetes calls off the service's event loop; results come back as events.

A bounded pool of threads; ``submit`` only enqueues, so the event loop never waits on the API.
Each call's outcome is handed to ``on_done(result, error)`` through ``deliver``, which the
service sets to its loop's thread-safe "call soon" so results arrive as ordinary events.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from typing import Any, Callable, TypeVar

log = logging.getLogger("flux_dws.k8s.worker")

T = TypeVar("T")

#: How a finished call reaches the service: called with a no-argument callback.
Deliver = Callable[[Callable[[], None]], None]


def _call_now(callback: Callable[[], None]) -> None:
    callback()


class KubeWorker:
    """A bounded pool of threads for blocking Kubernetes calls; never blocks the submitter.

    Calls run in submit order, except that ``urgent`` ones (a workflow's next state, which a
    job is waiting on) overtake the queue: a burst of creates and reads for new jobs must not
    hold back jobs that are already moving.
    """

    def __init__(self, threads: int = 16, *, deliver: Deliver | None = None) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        self._queue: queue.PriorityQueue[tuple[int, int, Callable[[], None] | None]] = (
            queue.PriorityQueue()
        )
        self._seq = itertools.count()
        self._deliver: Deliver = deliver or _call_now
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

        self._queue.put((0 if urgent else 1, next(self._seq), run))

    def _work(self) -> None:
        while True:
            _, _, run = self._queue.get()
            if run is None:
                return
            run()

    def stop(self, wait: bool = True) -> None:
        """Refuse new calls; queued ones end with an error.  By default wait for running ones."""
        self._stopped.set()
        for _ in self._threads:
            self._queue.put((2, next(self._seq), None))
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
