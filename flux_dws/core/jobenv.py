# SPDX-License-Identifier: LGPL-3.0-only
"""The environment a workflow gives its job, checked before the job starts: pure functions.

DWS hands the job ``status.env`` once PreRun is ready, and nnf-sos a workflow token for
copy-offload (dws-api.md 4).  Both are untrusted: a name that is not a POSIX environment
name, or a value with a NUL, would make the job shell fail at start with nothing to say why,
so the job is failed here instead, with the variable named.  The token is read only from the
Secret DWS names for the workflow, in the workflow's own namespace: a status pointing
elsewhere must not make flux-dws hand another object's data to the job.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from flux_dws.base.untrusted import echo

#: A portable environment variable name (POSIX: letters, digits, '_', not led by a digit).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Where a copy-offload job finds its token.
TOKEN_VARIABLE = "DW_WORKFLOW_TOKEN"
#: status.requires words for which nnf-sos issues a workflow token.
TOKEN_REQUIREMENTS = frozenset({"copy-offload", "container-auth", "user-container-auth"})
_REQUIRES = re.compile(r"(?:^|\s)requires=(\S*)")


def env_problem(env: Mapping[str, str]) -> str | None:
    """Why ``env`` cannot be given to the job (naming the variable), or None."""
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            return (
                f"variable name {echo(name)} is not a valid environment name "
                "(letters, digits and '_', not starting with a digit)"
            )
        if not isinstance(value, str):
            return f"variable {name} has a value that is not a string"
        if "\x00" in value:
            return f"variable {name} has a NUL character in its value"
    return None


def token_required(requires: Sequence[str], directives: Sequence[str]) -> bool:
    """Whether the job needs a workflow token: DWS says so (status.requires) or a directive
    asks for copy-offload (``requires=copy-offload``)."""
    if any(word in TOKEN_REQUIREMENTS for word in requires):
        return True
    for line in directives:
        for match in _REQUIRES.finditer(line):
            if any(word in TOKEN_REQUIREMENTS for word in match.group(1).split(",")):
                return True
    return False


def token_secret_for(workflow: str, namespace: str) -> tuple[str, str]:
    """(namespace, name) of the Secret nnf-sos makes for a workflow's token: named after
    the workflow with ``-token``, in the workflow's namespace."""
    return (namespace, f"{workflow}-token")


def token_problem(
    named: tuple[str, str] | None, workflow: str, namespace: str, required: bool
) -> str | None:
    """Why the workflow's token cannot be used (None: read ``token_secret_for``, or there is
    none and none is needed).  ``named`` is status.workflowToken as (namespace, name)."""
    expected = token_secret_for(workflow, namespace)
    if named is None:
        return (
            "copy-offload: DWS named no workflow token (status.workflowToken)" if required else None
        )
    if named != expected:
        return (
            f"status.workflowToken names Secret {echo('/'.join(named))}, not "
            f"{expected[0]}/{expected[1]} (the workflow's own namespace and the name DWS "
            "gives it): the token is not used"
        )
    return None


def token_value_problem(token: str | None, secret: tuple[str, str]) -> str | None:
    """Why a copy-offload job cannot start with the token read from ``secret``, or None."""
    where = f"{secret[0]}/{secret[1]}"
    if not token:
        return f"copy-offload: the workflow token Secret {where} is missing or has no data.token"
    if "\x00" in token:
        return f"copy-offload: the workflow token in Secret {where} holds a NUL character"
    return None


__all__ = [
    "ENV_NAME",
    "TOKEN_VARIABLE",
    "env_problem",
    "token_problem",
    "token_required",
    "token_secret_for",
    "token_value_problem",
]
