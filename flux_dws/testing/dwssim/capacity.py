# SPDX-License-Identifier: LGPL-3.0-only
"""Rabbit capacity, as nnf-sos accounts it: what each workflow's Servers took from each rabbit.

A rabbit asked for more than its Storage resource says it has fails Setup the way nnf-sos does
(a Fatal WLM error, "<rabbit>: insufficient capacity available"), so a scheduler that ignores
capacity is caught by the tests.  Allocations are held from Setup until Teardown (or until the
workflow is deleted).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any


def requested(servers: Mapping[str, Any]) -> dict[str, int]:
    """Rabbit -> bytes a Servers resource asks for (allocationSize x allocationCount)."""
    wanted: dict[str, int] = {}
    for aset in (servers.get("spec") or {}).get("allocationSets") or []:
        size = aset.get("allocationSize") or 0
        for entry in aset.get("storage") or []:
            count = entry.get("allocationCount") or 1
            wanted[entry["name"]] = wanted.get(entry["name"], 0) + int(size) * int(count)
    return wanted


class CapacityLedger:
    """Bytes held on each rabbit, per (workflow uid, directive index)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], dict[str, int]] = {}
        self._lock = threading.Lock()

    def used(self, rabbit: str, besides: tuple[str, int] | None = None) -> int:
        return sum(h.get(rabbit, 0) for key, h in self._held.items() if key != besides)

    def take(
        self, key: tuple[str, int], wanted: Mapping[str, int], capacity: Mapping[str, int | None]
    ) -> str | None:
        """Hold ``wanted`` for ``key``; the first rabbit short of capacity, or None.

        A rabbit whose capacity is unknown (no Storage resource) is not limited.  Taking the
        same key again replaces what it held (Setup is level-triggered).
        """
        with self._lock:
            for rabbit in sorted(wanted):
                limit = capacity.get(rabbit)
                if limit is not None and self.used(rabbit, key) + wanted[rabbit] > limit:
                    return rabbit
            self._held[key] = dict(wanted)
            return None

    def release(self, uid: str) -> None:
        with self._lock:
            for key in [k for k in self._held if k[0] == uid]:
                del self._held[key]

    def held(self) -> dict[str, int]:
        """Rabbit -> bytes held now, for tests and `flux dws simulate`."""
        with self._lock:
            total: dict[str, int] = {}
            for held in self._held.values():
                for rabbit, size in held.items():
                    total[rabbit] = total.get(rabbit, 0) + size
            return total
