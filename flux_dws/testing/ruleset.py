# SPDX-License-Identifier: LGPL-3.0-only
"""The DWDirectiveRules a DWS + NNF system registers (dws-api.md section 3), as data.

Shared by kubeapi's admission webhook (which driver entries a new Workflow gets, and which
directive lists DWS refuses at create) and by dwssim (which driver acts in which state).
Only the simulator and the stand-in API server use it: flux-dws itself validates directives
in flux_dws.core.directives, which adds the job-wide rules nnf-sos applies in Proposal.

:func:`admission_error` reads a directive list the way DWS's utils/dwdparse does: each word
after the command is ``key=value`` (split at the first ``=``; a word without one has no
value), keys are matched against each rule key *pattern* in order (the test driver's are
unanchored), string values against the rule's pattern, list values word by word.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from flux_dws.core.directives import words
from flux_dws.core.states import State

NNF_DRIVER = "nnf"
TEST_DRIVER = "tester"  # the test ruleset's driverLabel, the driver's DRIVERID

S = State


@dataclass(frozen=True)
class RuleDef:
    """One ruleDefs entry: a key pattern and what its value must be."""

    key: str
    type: str = "string"  # "string" or "list-of-string" (the kinds these rulesets use)
    pattern: str = ""
    patterns: tuple[str, ...] = ()
    required: bool = False
    value_required: bool = True
    unique_within: str = ""


@dataclass(frozen=True)
class Rule:
    """One DWDirectiveRule spec entry: a command, its driver, its watch states, its keys."""

    command: str
    driver: str
    watch_states: tuple[State, ...]
    defs: tuple[RuleDef, ...]


_NAME = "^[a-z][a-z0-9-]+$"
_TYPE = RuleDef("^type$", pattern="^(raw|xfs|gfs2|lustre)$", required=True)
_CAPACITY = r"^\d+(KiB|KB|MiB|MB|GiB|GB|TiB|TB)$"
_PROFILE = RuleDef("^profile$", pattern=_NAME)
_REQUIRES = RuleDef(
    "^requires$", type="list-of-string", patterns=("^copy-offload$", "^user-container-auth$")
)
_PATHS = (RuleDef("^source$", required=True), RuleDef("^destination$", required=True), _PROFILE)
_ALL = (S.PROPOSAL, S.SETUP, S.PRERUN, S.POSTRUN, S.TEARDOWN)

#: nnf-sos config/dws/nnf-ruleset.yaml
NNF_RULES = (
    Rule(
        "jobdw",
        NNF_DRIVER,
        _ALL,
        (
            _TYPE,
            RuleDef("^capacity$", pattern=_CAPACITY, required=True),
            RuleDef("^name$", pattern=_NAME, required=True, unique_within="jobdw_name"),
            _PROFILE,
            _REQUIRES,
        ),
    ),
    Rule(
        "create_persistent",
        NNF_DRIVER,
        (S.PROPOSAL, S.SETUP, S.TEARDOWN),
        (
            _TYPE,
            RuleDef("^capacity$", pattern=_CAPACITY),
            RuleDef("^name$", pattern=_NAME, required=True, unique_within="create_persistent_name"),
            _PROFILE,
        ),
    ),
    Rule(
        "destroy_persistent",
        NNF_DRIVER,
        (S.PROPOSAL, S.TEARDOWN),
        (RuleDef("^name$", pattern=_NAME, required=True, unique_within="destroy_persistent_name"),),
    ),
    Rule(
        "persistentdw",
        NNF_DRIVER,
        _ALL,
        (RuleDef("^name$", pattern=_NAME, required=True), _REQUIRES),
    ),
    Rule("copy_in", NNF_DRIVER, (S.PROPOSAL, S.DATAIN, S.TEARDOWN), _PATHS),
    Rule("copy_out", NNF_DRIVER, (S.PROPOSAL, S.DATAOUT, S.TEARDOWN), _PATHS),
    Rule(
        "container",
        NNF_DRIVER,
        _ALL,
        (
            RuleDef("^name$", pattern=_NAME, required=True),
            RuleDef("^profile$", pattern=_NAME, required=True),
            RuleDef("^(DW_JOB_|DW_PERSISTENT_|DW_GLOBAL_)[a-z][a-z0-9_]+$"),
        ),
    ),
)
#: dws-test-driver config/dws/test-ruleset.yaml: one command per state, unanchored keys.
TEST_RULES = tuple(
    Rule(
        state.value,
        TEST_DRIVER,
        (state,),
        (RuleDef("action", required=True), RuleDef("message"), RuleDef("severity")),
    )
    for state in State
)
RULES = NNF_RULES + TEST_RULES

#: command -> states whose driver entries the mutating webhook adds for that directive.
WATCH_STATES: dict[str, tuple[State, ...]] = {r.command: r.watch_states for r in NNF_RULES}

#: commands for which nnf-sos creates a DirectiveBreakdown in Proposal.
BREAKDOWN_COMMANDS = frozenset({"jobdw", "persistentdw", "create_persistent"})

_NO_VALUE = object()  # a word without '=' (DWS's emptyValue marker)


def command_of(directive: str) -> str:
    """The command word of a "#DW <command> ..." line ("" if there is none)."""
    found = words(directive)
    return found[1] if len(found) > 1 and found[0] == "#DW" else ""


def watched_states(directive: str) -> tuple[tuple[str, State], ...]:
    """(driverID, state) pairs for one directive, or () when no rule matches it."""
    command = command_of(directive)
    return tuple(
        (r.driver, state) for r in RULES if r.command == command for state in r.watch_states
    )


def admission_error(directives: Sequence[str]) -> str | None:
    """What DWS's webhook says of the first directive its rules refuse, or None.

    The messages are dwdparse's.  Unique values are tracked across the whole list, as DWS
    does (e.g. two jobdw directives may not share a name).
    """
    unique: set[str] = set()
    for directive in directives:
        found = words(directive)
        if not found or found[0] != "#DW":
            return f"missing '#DW' prefix in directive '{directive}'"
        if len(found) < 2:  # dwdparse indexes past the end here; the webhook fails
            return f"invalid directive '{directive}'"
        args: dict[str, object] = {"command": found[1]}
        for word in found[2:]:
            key, sep, value = word.partition("=")
            if key in args:
                return f"repeated argument '{key}' in directive '{directive}'"
            args[key] = value if sep else _NO_VALUE
        matched = [r for r in RULES if r.command == found[1]]
        for rule in matched:
            problem = _rule_error(rule, args, unique)
            if problem:
                return problem
        if not matched:
            return f"invalid directive '{directive}'"
    return None


def crashes_parser(directives: Sequence[str]) -> bool:
    """Whether dwdparse panics on the list: a bare "#DW" reached before any refused directive.

    Its BuildArgsMap reads the command word past the end of the words; the webhook's server
    then drops the connection (kubeapi.admission.crashed says what the API server answers).
    """
    for index, directive in enumerate(directives):
        if words(directive) == ["#DW"]:
            return admission_error(directives[:index]) is None
    return False


def _rule_error(rule: Rule, args: dict[str, object], unique: set[str]) -> str | None:
    """dwdparse.ValidateArgs for one rule: why ``args`` break it, or None."""
    used: set[RuleDef] = set()
    for key, value in args.items():
        if key == "command":
            continue
        found = next((d for d in rule.defs if re.search(d.key, key, re.ASCII)), None)
        if found is None:
            return f"unsupported argument '{key}'"
        if value is _NO_VALUE:
            if found.value_required:
                return f"argument '{key}' requires value"
            value = ""
        text = str(value)
        if found.type == "string":
            if found.pattern and not re.search(found.pattern, text, re.ASCII):
                return f"argument '{key}' invalid string '{text}'"
        elif found.type == "list-of-string":
            items = text.split(",")
            for item in items:
                if found.patterns and not any(re.search(p, item, re.ASCII) for p in found.patterns):
                    return f"argument '{key}' invalid string '{item}' in list '{text}'"
            if len(set(items)) != len(items):
                return f"argument '{key}' word repeated in list '{text}'"
        else:
            return f"unsupported rule type '{found.type}'"
        if found.unique_within:
            slot = f"{found.unique_within}/{text}"
            if slot in unique:
                return f"value '{text}' must be unique within '{found.unique_within}'"
            unique.add(slot)
        used.add(found)
    for d in rule.defs:
        if d.required and d not in used:
            return f"missing required argument '{d.key}'"
    return None
