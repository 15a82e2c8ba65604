# SPDX-License-Identifier: LGPL-3.0-only
"""Is the Kubernetes API server answering?  Judged from every request, not only the watch.

A server that refuses connections fails requests at once; a hung one (stopped, wedged, or a
network that drops packets) just never answers.  The watch cannot tell: its read timeout is
minutes.  So every request attempt reports its start and its end here, and an attempt still
unanswered after ``overdue`` seconds (the client's per-request timeout: a slow server answers
within it, a hung one does not; the service shortens it to half of ``[dws] api-alarm`` when
that is shorter) counts as "unreachable" without waiting for the retries.  "Unreachable
since" is the server's last answer before the trouble, so an alarm raised ``api-alarm`` after
it comes at most ``api-alarm`` after the server stopped answering.

Time this process itself did not run (a host under memory pressure, a SIGSTOP, a paused VM)
is not the server's: when :meth:`judge` is called much later than every ``tick`` seconds, the
excess is left out of the age of every attempt open across it, so a service that wakes up does
not call a server that answers at once "unreachable".

Any HTTP answer, even an error status, means the server is reachable; only failures below HTTP
(refused, reset, timed out) and overdue attempts mean it is not.  Thread-safe: requests run on
worker threads and the watch thread; the service's loop reads :meth:`judge`.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Verdict:
    """What :meth:`ApiHealth.judge` concluded: reachable or not, and since when (epoch s)."""

    reachable: bool
    since: float | None  # unreachable: its last answer (or the first attempt left unanswered)
    why: str = ""


class ApiHealth:
    """Outcomes of request attempts -> reachable or not (see the module docstring)."""

    def __init__(
        self, overdue: float, clock: Callable[[], float] = time.time, tick: float | None = None
    ) -> None:
        self.overdue = overdue
        self.clock = clock
        self.tick = tick  # how often judge() is called; None: no pause is told apart
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._open: dict[int, tuple[float, str, float]] = {}  # attempt -> (start, what, paused)
        self._paused = 0.0  # seconds this process was seen not running, in all
        self._judged: float | None = None
        self._failed_since: float | None = None  # first failed attempt since the last answer
        self._why = ""
        self.last_answer: float | None = None
        self.last_start: float = 0.0

    def begin(self, what: str) -> int:
        """An attempt starts; returns its token for :meth:`end`."""
        now = self.clock()
        with self._lock:
            token = next(self._ids)
            self._open[token] = (now, what, self._paused)
            self.last_start = now
        return token

    def end(self, token: int, answered: bool, why: str = "") -> None:
        """The attempt got an HTTP answer (``answered``) or failed below HTTP (``why``)."""
        now = self.clock()
        with self._lock:
            start, what, _ = self._open.pop(token, (now, "", 0.0))
            if answered:  # any HTTP answer, even a late one: the server is there
                self.last_answer = max(now, self.last_answer or now)
                self._failed_since, self._why = None, ""
            elif self._failed_since is None:
                self._failed_since, self._why = start, why or f"{what}: no answer"

    def note(self, reachable: bool, why: str = "") -> None:
        """An outcome seen outside :meth:`begin`/:meth:`end` (the watch's own stream)."""
        self.end(self.begin("watch"), reachable, why)

    def judge(self) -> Verdict:
        """Reachable, or unreachable since its last answer before the first attempt that
        failed or is overdue (that attempt's start if it never answered, or answered since)."""
        now = self.clock()
        with self._lock:
            if self.tick is not None and self._judged is not None:
                self._paused += max(0.0, now - self._judged - 2 * self.tick)
            self._judged = now
            since, why = self._failed_since, self._why
            for start, what, paused in self._open.values():
                waited = now - start - (self._paused - paused)
                if waited >= self.overdue and (since is None or start < since):
                    since = start
                    why = f"{what}: no answer for {waited:.0f}s (server hung?)"
            if since is not None and self.last_answer is not None:
                since = min(since, self.last_answer)
        if since is None:
            return Verdict(True, None)
        return Verdict(False, since, why)

    def idle_for(self) -> float:
        """Seconds since the last attempt started: the service probes when it is too long."""
        with self._lock:
            return self.clock() - self.last_start
