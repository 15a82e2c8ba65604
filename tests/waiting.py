# SPDX-License-Identifier: LGPL-3.0-only
"""Bounded waiting for tests: poll a condition, fail (never hang) if it does not come true."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest


def wait_for(condition: Callable[[], Any], what: str = "condition", timeout: float = 60.0) -> Any:
    """Poll ``condition`` until truthy and return its value; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    pytest.fail(f"timed out waiting for {what}")
