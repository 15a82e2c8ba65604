# SPDX-License-Identifier: LGPL-3.0-only
"""Query parameters as kube-apiserver decodes them (pure).

Booleans take every spelling Go's strconv.ParseBool accepts ("1", "t", "T", "TRUE", "true",
"True" and their false twins); integers are strconv.ParseInt's.  Anything else is a 400
worded as the server words the decoding error.
"""

from __future__ import annotations

from .errors import ApiError, bad_request, invalid

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def boolean(query: dict[str, str], name: str, default: bool = False) -> bool:
    text = query.get(name)
    if text is None or text == "":
        return default
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise bad_request(f'strconv.ParseBool: parsing "{text}": invalid syntax')


def integer(query: dict[str, str], name: str) -> int | None:
    text = query.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text, 10)
    except ValueError:
        raise bad_request(f'strconv.ParseInt: parsing "{text}": invalid syntax') from None


def dry_run(values: list[str], options_kind: str) -> bool:
    """The dryRun parameter: absent, or "All" (the only supported value): 422 otherwise."""
    causes = [
        f'dryRun[{index}]: Unsupported value: "{value}": supported values: "All"'
        for index, value in enumerate(values)
        if value != "All"
    ]
    if causes:
        raise invalid(f"{options_kind}.meta.k8s.io", "", causes)
    return bool(values)


def field_manager(query: dict[str, str], user_agent: str | None) -> str:
    """fieldManager, or the default the server derives: the User-Agent up to its first '/'."""
    manager = query.get("fieldManager")
    if manager:
        if len(manager) > 128:
            raise invalid(
                "PatchOptions.meta.k8s.io",
                "",
                [
                    f'fieldManager: Too long: may not be longer than 128 (got "{manager}",'
                    f" length {len(manager)})"
                ],
            )
        return manager
    agent = (user_agent or "").split("/")[0]
    return agent[:128] or "unknown"


def check_field_validation(query: dict[str, str]) -> str:
    value = query.get("fieldValidation") or "Warn"
    if value not in ("Ignore", "Warn", "Strict"):
        raise bad_request(
            f"fieldValidation parameter unsupported: {value}: supported values are Ignore,"
            " Warn, Strict"
        )
    return value


__all__ = ["ApiError", "boolean", "check_field_validation", "dry_run", "field_manager", "integer"]
