# SPDX-License-Identifier: LGPL-3.0-only
"""The dws jobtap plugin's submit-time checks: shape only, so a typo fails at submit.

The plugin cannot parse #DW directives or know the site's limits (the service does, through its
own validator); it only refuses attributes whose *type* is wrong, with one line naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

DW_KEY = "dw"
TIMEOUT_KEY = "dw_timeout"
TOLERANCE_KEY = "dw_failure_tolerance"
RELEASE_KEY = "dw_release"


def is_dw_job(system: Mapping[str, Any]) -> bool:
    """Whether the plugin holds this job: it asked for DataWarp-style storage."""
    return DW_KEY in system


def shallow_check(system: Mapping[str, Any]) -> str | None:
    """Why the plugin refuses these attributes.system, or None when their shape is fine."""
    if TIMEOUT_KEY in system and DW_KEY not in system:
        return f"attributes.system.{TIMEOUT_KEY} requires attributes.system.{DW_KEY}"
    if DW_KEY in system and not _is_directives(system[DW_KEY]):
        return f"attributes.system.{DW_KEY} must be a non-empty string or list of strings"
    if TIMEOUT_KEY in system:
        return _timeout_problem(system[TIMEOUT_KEY])
    return None


def _is_directives(value: object) -> bool:
    if isinstance(value, str):
        return bool(value)
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def _timeout_problem(table: object) -> str | None:
    if not isinstance(table, Mapping):
        return f"attributes.system.{TIMEOUT_KEY} must be a table of state = duration"
    for key, value in table.items():
        if not (isinstance(value, str) or _is_non_negative(value)):
            return (
                f"attributes.system.{TIMEOUT_KEY}.{key} must be a duration string"
                " or a non-negative number"
            )
    return None


def _is_non_negative(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )
