# SPDX-License-Identifier: LGPL-3.0-only
"""Python's cyclic garbage collector around the service's start-up reconcile.

A (re)started service builds its whole state at once: every held job's record and every
workflow's view, tens of tracked objects per job, and nearly all of them live on.  CPython
runs a full collection each time its long-lived objects have grown by a quarter, so building
that state traverses the whole heap about five times over, each time stopping every thread
(the list's pages, the loop's decisions): with 10,000 workflows in flight, 3 to 4 s of an 8
to 11 s start-up, single pauses of up to 1.7 s (bench/bench_reconcile.py, timed with
``gc.callbacks``).

So the automatic collector waits from the service's start until its first reconcile (at
most ``PAUSE_LIMIT``, and never past ``stop()``).  Then what start-up built, the reconciled
state, is frozen (``gc.freeze()``): no later collection traverses it again, while reference
counting still frees each of its objects as usual once its job is gone.  Start-up leaves no
garbage in cycles to speak of (a collection there found none among 600,000 objects, and
took 0.3 s), so none is looked for; whatever there is stays until ``stop()`` lets the freeze
go.  The collector is the process's: pauses and freezes of services sharing one process
(tests, a standby beside the active one) nest, and a collector someone else disabled is
left so.  None of this changes what the service does, only when Python looks for cycles.
"""

from __future__ import annotations

import gc
import threading

from flux_dws.base.loop import Loop, Timer

#: The longest the automatic collector waits for the first reconcile (seconds): a standby,
#: or a service that cannot reach the API, collects as usual after it.
PAUSE_LIMIT = 60.0

_lock = threading.Lock()
_pausing = 0  # services whose start-up keeps the automatic collector waiting
_disabled = False  # we disabled it (it was enabled at the first pause)
_freezing = 0  # services whose reconciled state is frozen


class StartupCollector:
    """One service's part: ``pause()`` at start, ``settle()`` once reconciled, ``stop()``."""

    def __init__(self, loop: Loop, limit: float = PAUSE_LIMIT) -> None:
        self.loop = loop
        self.limit = limit
        self._paused = False
        self._froze = False
        self._timer: Timer | None = None

    def pause(self) -> None:
        """Keep the automatic collector waiting until ``settle()``, at most ``limit``."""
        global _pausing, _disabled
        if self._paused:
            return
        self._paused = True
        with _lock:
            if _pausing == 0 and gc.isenabled():
                gc.disable()
                _disabled = True
            _pausing += 1
        self._timer = self.loop.call_later(self.limit, self._resume)

    def settle(self) -> None:
        """The first reconcile is done: freeze what start-up built and let the collector run
        again."""
        global _freezing
        if not self._paused:
            return
        gc.freeze()
        with _lock:
            _freezing += 1
        self._froze = True
        self._resume()

    def stop(self) -> None:
        """Let the collector run again, and the freeze go, if this service held either."""
        global _freezing
        self._resume()
        if self._froze:
            self._froze = False
            with _lock:
                _freezing -= 1
                if _freezing == 0:
                    gc.unfreeze()

    def _resume(self) -> None:
        global _pausing, _disabled
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._paused:
            return
        self._paused = False
        with _lock:
            _pausing -= 1
            if _pausing == 0 and _disabled:
                _disabled = False
                gc.enable()
