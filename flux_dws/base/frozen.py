# SPDX-License-Identifier: LGPL-3.0-only
"""Compact shapes for what the service holds per job: FrozenMap (a read-only, hashable
mapping for the fields of frozen dataclasses), SLOTS, share_strings, and Shared (one copy
of values many jobs hold alike)."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any, Callable, TypeVar

#: ``@dataclass(**SLOTS)``: instances without a ``__dict__`` where Python has slotted
#: dataclasses (3.10 on), for the records the service holds per job (bench_reconcile).
SLOTS: dict[str, Any] = {"slots": True} if sys.version_info >= (3, 10) else {}


def share_strings(value: Any) -> Any:
    """``value`` (freshly decoded JSON, not yet shared) with every string in it, keys aside,
    replaced in place by the one interned copy of its text; returns it.

    Job records and workflows repeat most of their strings (phases, states, namespaces,
    directives, timeouts, driver names): one copy of each instead of one per object saves
    about a kilobyte per job for some microseconds (bench_reconcile).  Keys need nothing:
    the JSON decoder already shares those."""
    stack = [value]
    intern = sys.intern
    while stack:
        node = stack.pop()
        if type(node) is dict:
            for key, item in node.items():
                kind = type(item)
                if kind is str:
                    node[key] = intern(item)
                elif kind is dict or kind is list:
                    stack.append(item)
        elif type(node) is list:
            for index, item in enumerate(node):
                kind = type(item)
                if kind is str:
                    node[index] = intern(item)
                elif kind is dict or kind is list:
                    stack.append(item)
    return value


def share_strings_with(value: dict[str, Any], old: Any, depth: int = 2) -> dict[str, Any]:
    """:func:`share_strings` for a new version of ``old`` (a dict decoded afresh, whose
    strings were shared already): each of ``value``'s items equal to ``old``'s (compared at C
    speed) is replaced by ``old``'s, whose strings are shared, and only the items that changed
    are walked, down ``depth`` levels of dicts.  A job's record comes again whole on each
    change, mostly as it was (its jobspec's attributes never change), and walking all of it
    in Python each time cost more of the service's loop than deciding on it."""
    if type(old) is not dict:
        return share_strings(value)
    for key, item in value.items():
        before = old.get(key)
        if before is item:
            continue
        kind = type(item)
        if kind is str:
            value[key] = sys.intern(item)
        elif kind is not dict and kind is not list:
            continue
        elif type(before) is kind and before == item:
            value[key] = before
        elif kind is dict and depth > 1:
            share_strings_with(item, before, depth - 1)
        else:
            share_strings(item)
    return value


T = TypeVar("T")


class Shared:
    """One copy of each value many jobs hold alike, instead of one per job (bench_reconcile:
    the workflows' driver entries and directives, the like parts of the jobs' records).

    ``shared(value)``: an equal value seen before, or ``value`` itself, kept for the next
    caller.  For immutable values (frozen dataclasses, tuples of them); equality is the
    type's, so ``1`` and ``1.0`` are one value: keep such values apart in what the type
    compares.  :meth:`json`: the same for decoded JSON (dicts and lists, which are only
    read once shared: nothing may change one in place), by their text, which tells ``1``,
    ``1.0`` and ``True`` apart.  At most ``limit`` values are kept: past that, the next one
    starts afresh, so values no job holds any more are not kept for long.
    """

    __slots__ = ("_values", "_limit")

    def __init__(self, limit: int = 4096) -> None:
        self._values: dict[Any, Any] = {}
        self._limit = limit

    def __call__(self, value: T) -> T:
        values = self._values
        found = values.get(value)
        if found is not None:
            return found
        if len(values) >= self._limit:
            values.clear()
        values[value] = value
        return value

    def json(self, value: T, first: Callable[[T], Any] | None = None) -> T:
        """``value`` (a dict or list from JSON), or an equal one given here before;
        ``first(value)`` is called when there is none, before ``value`` is kept."""
        if not value:  # one empty dict and one empty list for all
            kind = type(value)
            empty = _EMPTY_DICT if kind is dict else _EMPTY_LIST if kind is list else value
            return empty  # type: ignore[return-value]
        # Found by the hash of its text, not the text (which would double what a value no
        # one else holds costs), and checked by equality: texts that differ yet collide
        # and compare equal would be 1 against 1.0 or True, and 2**-64 unlikely.
        key = (type(value), hash(repr(value)))
        values = self._values
        found = values.get(key)
        if found is not None:
            return found if found == value else value
        if first is not None:
            first(value)
        if len(values) >= self._limit:
            values.clear()
        values[key] = value
        return value


_EMPTY_DICT: dict[Any, Any] = {}
_EMPTY_LIST: list[Any] = []


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
