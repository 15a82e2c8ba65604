# SPDX-License-Identifier: LGPL-3.0-only
"""Fault injection for the stand-in API server: latency, error answers, dropped connections,
cut watch streams, forced 410s and list pages held back.  Adjustable at run time, thread-safe,
and seeded so that a test sending the same requests sees the same faults.

Faults apply to resource requests only (never to discovery or /version), so a client can
always start up and then meet the faults where its retry logic lives.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable

ERROR_CODES = (500, 503, 429)
#: The longest a held page waits (seconds): a test that forgets to let it go ends anyway.
HOLD_LIMIT = 60.0


@dataclass(frozen=True)
class FaultSettings:
    latency: float = 0.0  # seconds added to every affected request
    error_rate: float = 0.0  # share of affected requests answered with one of error_codes
    error_codes: tuple[int, ...] = ERROR_CODES
    retry_after: int = 1  # Retry-After seconds sent with 429
    drop_rate: float = 0.0  # share of affected requests whose connection is closed unanswered
    plurals: frozenset[str] | None = None  # only these resources (None: every resource)
    verbs: frozenset[str] | None = None  # only these verbs (get, list, watch, create, ...)


@dataclass(frozen=True)
class Decision:
    """What to do to one request."""

    latency: float = 0.0
    drop: bool = False
    error: int | None = None


@dataclass
class _Pending:
    """Deterministic one-shot faults, consumed in order by matching requests."""

    errors: list[int] = field(default_factory=list)
    drops: int = 0
    force_410: int = 0


class Faults:
    def __init__(self, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self._seed = seed
        self._random = random.Random(seed)
        self._settings = FaultSettings()
        self._pending = _Pending()
        self._cut_listeners: list[Callable[[bool], None]] = []
        self._held_pages: dict[str, threading.Event] = {}
        self._waiting_pages: dict[str, int] = {}  # requests held now, by plural

    @property
    def settings(self) -> FaultSettings:
        with self._lock:
            return self._settings

    def set(self, **changes: Any) -> FaultSettings:
        """Change some settings (names of FaultSettings); returns the new settings."""
        for key in ("plurals", "verbs"):
            if changes.get(key) is not None:
                changes[key] = frozenset(changes[key])
        if "error_codes" in changes:
            changes["error_codes"] = tuple(changes["error_codes"])
        with self._lock:
            self._settings = replace(self._settings, **changes)
            return self._settings

    def clear(self) -> None:
        """No faults at all, and the random sequence restarts from the seed."""
        with self._lock:
            self._settings = FaultSettings()
            self._pending = _Pending()
            self._random = random.Random(self._seed)
        self.release_pages()

    def fail_next(self, count: int = 1, code: int = 503) -> None:
        """The next ``count`` affected requests get ``code`` (deterministic, for tests)."""
        with self._lock:
            self._pending.errors.extend([code] * count)

    def drop_next(self, count: int = 1) -> None:
        """The next ``count`` affected requests have their connection closed unanswered."""
        with self._lock:
            self._pending.drops += count

    def force_410_next_watch(self, count: int = 1) -> None:
        """The next ``count`` watch requests carrying a resourceVersion get 410 Expired."""
        with self._lock:
            self._pending.force_410 += count

    def take_forced_410(self) -> bool:
        with self._lock:
            if self._pending.force_410 <= 0:
                return False
            self._pending.force_410 -= 1
            return True

    def hold_pages(self, plural: str) -> threading.Event:
        """Hold back every page but the first of each list of ``plural``: a list request that
        carries a continue token waits, unanswered, until the returned event is set (or
        ``release_pages()``, ``clear()``, the server stopping, or ``HOLD_LIMIT``).  For a
        test to see what a client does while its list is still paging."""
        with self._lock:
            gate = self._held_pages.get(plural)
            if gate is None or gate.is_set():
                gate = self._held_pages[plural] = threading.Event()
            return gate

    def release_pages(self) -> None:
        """Let every held page go."""
        with self._lock:
            gates, self._held_pages = list(self._held_pages.values()), {}
        for gate in gates:
            gate.set()

    def pages_waiting(self, plural: str) -> int:
        """How many list requests for ``plural`` are held now."""
        with self._lock:
            return self._waiting_pages.get(plural, 0)

    def wait_for_page(self, plural: str) -> None:
        """Called by the server before it answers a continued list of ``plural``."""
        with self._lock:
            gate = self._held_pages.get(plural)
            if gate is None or gate.is_set():
                return
            self._waiting_pages[plural] = self._waiting_pages.get(plural, 0) + 1
        try:
            gate.wait(HOLD_LIMIT)
        finally:
            with self._lock:
                self._waiting_pages[plural] -= 1

    def cut_watches(self, graceful: bool = False) -> None:
        """End every open watch stream now: abruptly (connection reset) or gracefully."""
        with self._lock:
            listeners = list(self._cut_listeners)
        for listener in listeners:
            listener(graceful)

    def on_cut(self, listener: Callable[[bool], None]) -> None:
        with self._lock:
            self._cut_listeners.append(listener)

    def decide(self, plural: str, verb: str) -> Decision:
        """The faults for one resource request (consumes one-shot faults and randomness)."""
        with self._lock:
            s = self._settings
            affected = (s.plurals is None or plural in s.plurals) and (
                s.verbs is None or verb in s.verbs
            )
            if not affected:
                return Decision()
            if self._pending.drops > 0:
                self._pending.drops -= 1
                return Decision(s.latency, drop=True)
            if self._pending.errors:
                return Decision(s.latency, error=self._pending.errors.pop(0))
            if s.drop_rate and self._random.random() < s.drop_rate:
                return Decision(s.latency, drop=True)
            if s.error_rate and s.error_codes and self._random.random() < s.error_rate:
                return Decision(s.latency, error=self._random.choice(s.error_codes))
            return Decision(s.latency)
