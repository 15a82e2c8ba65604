# SPDX-License-Identifier: LGPL-3.0-only
"""Bounded, jittered exponential backoff: one rule for request retries and watch reconnects."""

from __future__ import annotations

import random
from typing import Callable


def backoff_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before retry number ``attempt`` (1, 2, ...).

    Doubles from ``base`` up to ``cap``, then takes a random point in the upper half of that
    window, so many clients that failed together do not retry together, and no wait is zero.
    """
    window = min(cap, base * (2 ** max(0, attempt - 1)))
    return window * (0.5 + 0.5 * rand())


def retry_after(header: str | None, cap: float) -> float | None:
    """The server's Retry-After (seconds form) bounded by ``cap``; None when absent or a date."""
    if not header:
        return None
    try:
        seconds = float(header)
    except ValueError:
        return None
    return max(0.0, min(cap, seconds))
