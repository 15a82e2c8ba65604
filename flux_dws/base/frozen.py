# SPDX-License-Identifier: LGPL-3.0-only
"""FrozenMap: a read-only, hashable mapping for the fields of frozen dataclasses."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

#: ``@dataclass(**SLOTS)``: instances without a ``__dict__`` where Python has slotted
#: dataclasses (3.10 on), for the records the service holds per job (bench_reconcile).
SLOTS: dict[str, Any] = {"slots": True} if sys.version_info >= (3, 10) else {}

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V]):
    """A read-only, hashable mapping, so frozen dataclasses holding one stay hashable.

    Compares equal to any mapping with the same items (including a plain dict).
    """

    __slots__ = ("_data",)

    def __init__(self, data: Any = ()) -> None:
        self._data: dict[K, V] = dict(data)

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __contains__(self, key: object) -> bool:  # the dict's own: Mapping's goes by KeyError
        return key in self._data

    def get(self, key: Any, default: Any = None) -> Any:
        return self._data.get(key, default)

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"
