# SPDX-License-Identifier: LGPL-3.0-only
"""Label and field selectors, parsed and matched as the API server does (pure functions)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .builtin import FIELD_PATHS
from .errors import bad_request

if TYPE_CHECKING:
    from .resources import Resource

_SET_RE = re.compile(r"^([^\s=!<>(),]+)\s+(in|notin)\s*\(([^()]*)\)$")
_CMP_RE = re.compile(r"^([^\s=!<>(),]+)\s*(==|=|!=|>|<)\s*([^\s=!<>(),]*)$")
_EXISTS_RE = re.compile(r"^(!?)\s*([^\s=!<>(),]+)$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # in | notin | exists | !exists | > | <  ("=" and "!=" become in/notin)
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if not present or not _is_int(value) or not _is_int(self.values[0]):
            return False
        lhs, rhs = int(str(value)), int(self.values[0])
        return lhs > rhs if self.op == ">" else lhs < rhs


Selector = tuple[Requirement, ...]


def parse_label_selector(text: str | None) -> Selector:
    """Parse "a=b,c!=d,e in (x,y),!f"; raise a 400 ApiError naming the bad requirement."""
    if not text or not text.strip():
        return ()
    return tuple(_parse_requirement(part.strip()) for part in _split_top_level(text))


def matches(selector: Selector, labels: dict[str, str] | None) -> bool:
    labels = labels or {}
    return all(requirement.matches(labels) for requirement in selector)


def parse_field_selector(
    text: str | None, resource: Resource | None = None
) -> tuple[tuple[str, bool, str], ...]:
    """Parse "metadata.name=x,metadata.namespace!=y" into (path, equal, value) triples.

    With ``resource``, only the field labels it supports are accepted (metadata.name, and
    metadata.namespace where namespaced, for custom resources), as the server converts them.
    """
    if not text or not text.strip():
        return ()
    result = []
    for part in text.split(","):
        found = _CMP_RE.match(part.strip())
        if not found or found.group(2) in (">", "<"):
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part.strip()}'")
        label = found.group(1)
        if resource is not None and not _supported(resource, label):
            raise bad_request(f"field label not supported: {label}")
        if resource is not None and not resource.group:
            label = FIELD_PATHS.get(label, label)
        result.append((label, found.group(2) != "!=", found.group(3)))
    return tuple(result)


def _supported(resource: Resource, label: str) -> bool:
    if label == "metadata.name" or label in resource.field_labels:
        return True
    return label == "metadata.namespace" and (resource.namespaced or not resource.group)


def fields_match(selector: tuple[tuple[str, bool, str], ...], obj: dict[str, Any]) -> bool:
    for path, equal, value in selector:
        found: Any = obj
        for step in path.split("."):
            found = found.get(step) if isinstance(found, dict) else None
        if isinstance(found, bool):
            found = "true" if found else "false"
        if (str(found) if found is not None else "") == value:
            if not equal:
                return False
        elif equal:
            return False
    return True


def _parse_requirement(part: str) -> Requirement:
    found = _SET_RE.match(part)
    if found:
        values = tuple(v.strip() for v in found.group(3).split(",") if v.strip())
        if not values:
            raise bad_request(f"unable to parse requirement: found '{part}', expected: values")
        return Requirement(found.group(1), found.group(2), values)
    found = _CMP_RE.match(part)
    if found:
        key, op, value = found.groups()
        if op in (">", "<"):
            if not _is_int(value):
                raise bad_request(
                    f"unable to parse requirement: for 'gt', 'lt' operators, the value must be"
                    f" an integer: '{part}'"
                )
            return Requirement(key, op, (value,))
        return Requirement(key, "notin" if op == "!=" else "in", (value,))
    found = _EXISTS_RE.match(part)
    if found:
        return Requirement(found.group(2), "!exists" if found.group(1) else "exists")
    raise bad_request(f"unable to parse requirement: found '{part}'")


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    if depth != 0 or any(not p.strip() for p in parts):
        raise bad_request(f"unable to parse requirement: found '{text}'")
    return parts


def _is_int(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"-?\d+", value) is not None
