# SPDX-License-Identifier: LGPL-3.0-only
"""The #DW directive grammar: a job's directive text -> validated ``Directive`` objects.

Why validate here when DWS validates again at admission: a directive DWS rejects comes back
as an HTTP 403 only after the job has waited for a workflow; checking at submit time tells the
user at once, naming the directive index (DWS's ``dwdIndex``) and the word that is wrong.

The rules are those of the nnf-sos DWDirectiveRule (``config/dws/nnf-ruleset.yaml``, 2026)
plus the job-wide checks nnf-sos makes in Proposal, so a job that passes here is not turned
back by DWS for its directive text (dws-api.md section 3).  Choices made where DWS is loose
or silent:

- Words.  DWS splits a directive at white space as Go's strings.Fields does (not at the
  ASCII separators \x1c-\x1f, which Python's str.split() also takes) and reads ``key=value``
  words, split at the first ``=``; there is no quoting.  A word without ``=`` or with an empty
  key, and a key given twice, are errors.  An empty value (``key=``) is accepted only where
  DWS and nnf-sos accept it: the test driver's ``message=`` and ``severity=``.
  ``Directive.text`` is "#DW" and the words joined by one space.
- Names (``name=`` of jobdw, persistentdw, create_persistent, destroy_persistent, container;
  ``profile=``): ``^[a-z][a-z0-9-]+$``, the nnf-sos pattern.  nnf-sos publishes a job's
  storage as ``DW_JOB_<name>`` with ``-`` turned into ``_``, so every accepted name yields a
  valid environment variable name (lower-case letters, digits, ``_``) and two names cannot
  collide.  Names also become parts of Kubernetes object names, hence lower case only.
- Capacity (``capacity=``): what DWS admits, a whole number with KB, MB, GB, TB, KiB, MiB,
  GiB or TiB; nnf-sos refuses zero in Proposal.  ``parse_size`` (flux_dws.base.sizes) reads the
  wider syntax (decimals, B, PB, K/M/G/T/P) for sizes that do not go into a directive.
- Test directives (``#DW <State> action=wait|complete|error [message=<word>]
  [severity=<s>]``, read by DWS's test driver): the message is one word, as DWS cannot carry
  more (the driver shows ``_`` as a space) and may be empty; the driver lower-cases the
  severity, so Minor, Major and Fatal are taken in any letter case (empty means Minor).  The
  driver ignores both unless the action is ``error``, and DWS admits them with any action.
- Data movement paths are absolute paths or ``$DW_JOB_<name>[/path]`` /
  ``$DW_PERSISTENT_<name>[/path]``, naming a jobdw (not raw) / persistentdw of the same job.
  As in nnf-sos, ``_`` in a reference stands for ``-`` (``$DW_JOB_fast_store`` names
  ``name=fast-store``, the form of its environment variable); errors show the reference as
  written.  A container's ``DW_JOB_<x>=<name>`` / ``DW_PERSISTENT_<x>=<name>`` value is the
  storage name itself: nnf-sos compares it as written.
- ``combined_mgtmdt``, ``external_mgs``, ``capacity_mdt``, ``capacity_mgt``: nnf-sos removed
  them from the directive in 2022 (they live in the NnfStorageProfile); rejected with that hint.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Optional

from flux_dws.base.errors import DirectiveError
from flux_dws.base.errors import quote as _show
from flux_dws.base.frozen import SLOTS, FrozenMap
from flux_dws.base.sizes import SIZE_EXAMPLES, parse_size, size_bytes
from flux_dws.core.states import State

__all__ = ["Directive", "parse_directives", "parse_size", "split_directives"]

PREFIX = "#DW"

STORAGE_TYPES = ("xfs", "gfs2", "lustre", "raw")
CONTAINER_STORAGE_TYPES = ("lustre", "gfs2", "raw")
REQUIRES_VALUES = ("copy-offload", "user-container-auth")
TEST_ACTIONS = ("wait", "complete", "error")  # compared as written by the test driver
TEST_SEVERITIES = ("Minor", "Major", "Fatal")  # lower-cased by the test driver; "" is Minor

#: the commands of the nnf ruleset, in the order users usually write them.
COMMANDS = (
    "jobdw",
    "persistentdw",
    "create_persistent",
    "destroy_persistent",
    "container",
    "copy_in",
    "copy_out",
)
#: DWS's test driver directives: "#DW <State> action=...".
TEST_COMMANDS = tuple(state.value for state in State)
#: commands DWS runs only as the one directive of a workflow.
SOLO_COMMANDS = ("create_persistent", "destroy_persistent")

NAME_RE = re.compile(r"[a-z][a-z0-9-]+")
NAME_HELP = "a lower-case letter, then lower-case letters, digits or '-' (2 or more in all)"
CONTAINER_KEY_RE = re.compile(r"(DW_JOB_|DW_PERSISTENT_|DW_GLOBAL_)[a-z][a-z0-9_]+")
DWS_CAPACITY_RE = re.compile(r"[0-9]+(KiB|KB|MiB|MB|GiB|GB|TiB|TB)")
#: A word of a directive: DWS splits with Go's strings.Fields (unicode.IsSpace).
_WORD_RE = re.compile("[^\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")

JOB_REF = "$DW_JOB_"
PERSISTENT_REF = "$DW_PERSISTENT_"

#: Lustre target options that nnf-sos reads from the storage profile, not the directive.
_PROFILE_KEYS = frozenset({"combined_mgtmdt", "external_mgs", "capacity_mdt", "capacity_mgt"})


#: A directive's ``key=value`` words: read-only, in the order written, hashable.
Args = FrozenMap


@dataclass(frozen=True, **SLOTS)
class Directive:
    """One #DW directive of a job, as DWS will see it."""

    index: int  # 0-based position in the job's list (DWS's dwdIndex)
    command: str  # an nnf command ("jobdw", ...) or a State value for a test directive
    args: Mapping[str, str]  # key=value words in order, read-only
    text: str  # "#DW " + the words joined by one space

    def __post_init__(self) -> None:
        if not isinstance(self.args, FrozenMap):
            pairs = self.args.items() if isinstance(self.args, Mapping) else self.args
            object.__setattr__(self, "args", FrozenMap((str(k), str(v)) for k, v in pairs))

    @property
    def name(self) -> str | None:
        return self.args.get("name")

    @property
    def is_test(self) -> bool:
        """Whether this is a DWS test-driver directive ("#DW PreRun action=wait")."""
        return self.command in TEST_COMMANDS


# ---------------------------------------------------------------------------- splitting


def words(text: str) -> list[str]:
    """The words of ``text`` as DWS reads them (split at white space, as Go's strings.Fields)."""
    return _WORD_RE.findall(text)


def split_directives(value: str | Sequence[str]) -> tuple[str, ...]:
    """The individual "#DW ..." strings in ``value``, whitespace normalised.

    ``value`` is one string or a list of strings; each may hold several directives, one a
    line or several on one line (a word "#DW" starts the next directive).  Words before the
    first "#DW" of a string are an error, as is input with no directive at all.
    """
    if isinstance(value, str):
        chunks: Sequence[object] = (value,)
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        chunks = value
    else:
        raise DirectiveError(
            f"#DW directives must be a string or a list of strings, not {type(value).__name__}"
        )
    found: list[str] = []
    for chunk in chunks:
        if not isinstance(chunk, str):
            raise DirectiveError(
                f"#DW directive {len(found)}: expected a string, not {type(chunk).__name__}"
            )
        current: list[str] | None = None
        for word in words(chunk):
            if word == PREFIX:
                if current is not None:
                    found.append(" ".join(current))
                current = [word]
            elif current is None:
                raise DirectiveError(
                    f"#DW directive {len(found)}: {_show(chunk.strip())} does not start with "
                    f"{PREFIX}{_prefix_hint(word)}"
                )
            else:
                current.append(word)
        if current is not None:
            found.append(" ".join(current))
    if not found:
        raise DirectiveError(
            "no #DW directives given (e.g. '#DW jobdw type=xfs capacity=10GiB name=scratch')"
        )
    return tuple(found)


def _prefix_hint(word: str) -> str:
    if word.upper().startswith(PREFIX) and word != PREFIX:
        return f" (write {PREFIX!r} as its own word, in upper case)"
    return ""


# ---------------------------------------------------------------------------- one directive

# A value check returns what is wrong with the value (completing "key='value' ..."), or None.
ValueCheck = Callable[[str], Optional[str]]


def _check_name(value: str) -> str | None:
    return None if NAME_RE.fullmatch(value) else f"is not a valid name: use {NAME_HELP}"


def _check_one_of(choices: Sequence[str]) -> ValueCheck:
    def check(value: str) -> str | None:
        return None if value in choices else f"is not one of {', '.join(choices)}"

    return check


def _check_capacity(value: str) -> str | None:
    try:
        size_bytes(value)
    except ValueError as exc:
        return str(exc)
    if not DWS_CAPACITY_RE.fullmatch(value):
        return (
            "is not accepted by DWS: use a whole number with KB, MB, GB, TB, KiB, MiB, GiB "
            f"or TiB ({SIZE_EXAMPLES})"
        )
    return None


def _check_requires(value: str) -> str | None:
    words = value.split(",")
    for word in words:
        if word not in REQUIRES_VALUES:
            return f"lists {word!r}: each entry must be one of {', '.join(REQUIRES_VALUES)}"
    if len(set(words)) != len(words):
        return "lists an entry twice"
    return None


def _check_severity(value: str) -> str | None:
    if value.lower() in ("", *(s.lower() for s in TEST_SEVERITIES)):
        return None
    return f"is not one of {', '.join(TEST_SEVERITIES)} (in any letter case)"


def _check_path(value: str) -> str | None:
    for ref in (JOB_REF, PERSISTENT_REF):
        if value.startswith(ref):
            written = _ref_name(value, ref)
            if not NAME_RE.fullmatch(_storage_name(written)):
                return (
                    f"refers to {ref}{written}, which is not a valid name: use {NAME_HELP} "
                    "('_' may stand for '-')"
                )
            return None
    if not value.startswith("/"):
        return f"must be an absolute path or start with {JOB_REF}<name> or {PERSISTENT_REF}<name>"
    return None


def _check_absolute(value: str) -> str | None:
    return None if value.startswith("/") else "must be an absolute path (a global Lustre path)"


def _any(value: str) -> str | None:
    return None


@dataclass(frozen=True)
class _Rule:
    """The keys one command takes: required (in the order reported) and optional.

    ``more`` gives the check for a key the two do not name (a DWS rule key that is a
    regular expression), or None when the command does not take that key.
    """

    required: Mapping[str, ValueCheck]
    optional: Mapping[str, ValueCheck]
    more: Callable[[str], ValueCheck | None] = lambda key: None

    def check_for(self, key: str) -> ValueCheck | None:
        return self.required.get(key) or self.optional.get(key) or self.more(key)

    def key_list(self) -> str:
        return ", ".join([*self.required, *self.optional])


_STORAGE = {
    "type": _check_one_of(STORAGE_TYPES),
    "capacity": _check_capacity,
    "name": _check_name,
}


def _container_check(key: str) -> ValueCheck | None:
    """Checks for a container's storage keys; their names are checked job-wide."""
    if not CONTAINER_KEY_RE.fullmatch(key):
        return None
    return _check_absolute if key.startswith("DW_GLOBAL_") else _check_name


def _test_driver_check(key: str) -> ValueCheck | None:
    """The test driver's rule keys are unanchored patterns: DWS admits any key that contains
    "action", "message" or "severity" (the driver reads only the keys so named)."""
    return _any if any(word in key for word in ("action", "message", "severity")) else None


_TEST_RULE = _Rule(
    {"action": _check_one_of(TEST_ACTIONS)},
    {"message": _any, "severity": _check_severity},
    _test_driver_check,
)
RULES: Mapping[str, _Rule] = MappingProxyType(
    {
        "jobdw": _Rule(_STORAGE, {"profile": _check_name, "requires": _check_requires}),
        "persistentdw": _Rule({"name": _check_name}, {"requires": _check_requires}),
        "create_persistent": _Rule(
            {"name": _check_name, "type": _STORAGE["type"]},
            {"capacity": _check_capacity, "profile": _check_name},
        ),
        "destroy_persistent": _Rule({"name": _check_name}, {}),
        "copy_in": _Rule(
            {"source": _check_path, "destination": _check_path}, {"profile": _check_name}
        ),
        "copy_out": _Rule(
            {"source": _check_path, "destination": _check_path}, {"profile": _check_name}
        ),
        "container": _Rule({"name": _check_name, "profile": _check_name}, {}, _container_check),
        **{command: _TEST_RULE for command in TEST_COMMANDS},
    }
)
_KEY_EXAMPLES = {
    "type": "type=xfs",
    "capacity": "capacity=10GiB",
    "name": "name=scratch",
    "source": "source=/lus/global/in",
    "destination": "destination=$DW_JOB_scratch/in",
    "profile": "profile=default",
    "action": "action=wait",
}


def _parse_one(index: int, text: str) -> Directive:
    """One "#DW ..." string (whitespace normalised) -> Directive, checked on its own."""
    words_ = words(text)
    if len(words_) < 2:
        raise DirectiveError(f"#DW directive {index}: missing command after {PREFIX}")
    command = words_[1]
    rule = RULES.get(command)
    if rule is None:
        raise DirectiveError(f"#DW directive {index}: {_unknown_command(command)}")

    def fail(problem: str) -> DirectiveError:
        return DirectiveError(f"#DW directive {index} ({command}): {problem}")

    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for word in words_[2:]:
        key, sep, value = word.partition("=")
        if not key:
            raise fail(f"word {_show(word)} has an empty key")
        if key in seen:
            raise fail(f"key {_show(key)} is given twice")
        check = rule.check_for(key)
        if not sep and (check is not None or key not in _PROFILE_KEYS):
            raise fail(f"word {_show(word)} is not key=value")
        if check is None:
            raise fail(_unknown_key(command, key, rule))
        problem = check(value)
        if problem:
            raise fail(
                f"{key}={_show(value)} {problem}"
                if value
                else f"key {_show(key)} has an empty value"
            )
        seen.add(key)
        pairs.append((key, value))
    for key in rule.required:
        if key not in seen:
            example = _KEY_EXAMPLES.get(key, f"{key}=...")
            raise fail(f"missing required key {key!r} (e.g. {example})")
    return Directive(index=index, command=command, args=Args(pairs), text=" ".join(words_))


def _unknown_command(command: str) -> str:
    known = (*COMMANDS, *TEST_COMMANDS)
    for candidate in known:
        if candidate.lower() == command.lower():
            return f"unknown command {_show(command)} (did you mean {candidate}?)"
    return (
        f"unknown command {_show(command)}: use one of {', '.join(COMMANDS)}, "
        f"or a state name ({', '.join(TEST_COMMANDS)}) for a test directive"
    )


def _unknown_key(command: str, key: str, rule: _Rule) -> str:
    if key in _PROFILE_KEYS:
        return (
            f"key {key!r} is not a #DW key: nnf-sos takes Lustre target options from the "
            "storage profile; choose a profile= that sets it"
        )
    if command == "container":
        if key.startswith(("DW_JOB_", "DW_PERSISTENT_", "DW_GLOBAL_")):
            return f"storage key {_show(key)} must match ^{CONTAINER_KEY_RE.pattern}$"
        return (
            f"unknown key {_show(key)}: container takes {rule.key_list()} and storage keys "
            "DW_JOB_<x>, DW_PERSISTENT_<x>, DW_GLOBAL_<x>"
        )
    return f"unknown key {_show(key)}: {command} takes {rule.key_list()}"


# ---------------------------------------------------------------------------- the whole job


def parse_directives(value: str | Sequence[str]) -> tuple[Directive, ...]:
    """A job's #DW directives -> Directives in order, each checked and checked together.

    Raises DirectiveError, one line naming the directive index, its command and the word at
    fault, for the first problem found.
    """
    directives = tuple(_parse_one(i, text) for i, text in enumerate(split_directives(value)))
    _check_job(directives)
    return directives


def _check_job(directives: tuple[Directive, ...]) -> None:
    """The rules that need the other directives of the job (nnf-sos checks them in Proposal)."""
    jobdw: dict[str, Directive] = {}
    persistent: set[str] = set()
    container: Directive | None = None
    for d in directives:
        if d.command == "jobdw":
            first = jobdw.setdefault(str(d.name), d)
            if first is not d:
                raise _fail(d, f"name={d.name!r} is already used by directive {first.index}")
        elif d.command == "persistentdw":
            persistent.add(str(d.name))
        elif d.command in SOLO_COMMANDS and len(directives) > 1:
            raise _fail(d, "must be the job's only #DW directive (DWS runs it alone)")
        elif d.command == "container":
            if container is not None:
                raise _fail(
                    d, f"only one container directive is allowed (directive {container.index})"
                )
            container = d
    for d in directives:
        if d.command in ("copy_in", "copy_out"):
            for key in ("source", "destination"):
                value = d.args[key]
                for ref in (JOB_REF, PERSISTENT_REF):
                    if value.startswith(ref):
                        written = _ref_name(value, ref)
                        _check_storage(
                            d, key, ref, written, _storage_name(written), jobdw, persistent
                        )
        elif d.command == "container":
            for key, value in d.args.items():
                if key.startswith(("DW_JOB_", "DW_PERSISTENT_")):
                    ref = JOB_REF if key.startswith("DW_JOB_") else PERSISTENT_REF
                    _check_storage(d, key, ref, value, value, jobdw, persistent)


def _check_storage(
    d: Directive,
    key: str,
    ref: str,
    written: str,
    name: str,
    jobdw: Mapping[str, Directive],
    persistent: set[str],
) -> None:
    """The storage that ``d``'s ``key`` names must be a jobdw / persistentdw of this job.

    ``ref`` says which (JOB_REF or PERSISTENT_REF); ``written`` is the name as the user wrote
    it, ``name`` the one looked up (a copy path's with '_' read as '-', as nnf-sos does).
    Absolute paths (global Lustre) are not checked here.
    """
    for_container = d.command == "container"
    shown = f"{key}={_show(d.args[key])}"
    # The storage is named as the user wrote it; '_' may stand for '-' only in copy paths.
    hint = "; '_' in a reference stands for '-'" if written != name else ""
    if ref == JOB_REF:
        target = jobdw.get(name)
        if target is None:
            raise _fail(d, f"{shown} names no jobdw directive of this job (name={written}){hint}")
        kind = target.args["type"]
        if for_container and kind not in CONTAINER_STORAGE_TYPES:
            raise _fail(
                d,
                f"{shown} is {kind} storage (directive {target.index}); "
                f"container storage may be {_or_list(CONTAINER_STORAGE_TYPES)}",
            )
        if not for_container and kind == "raw":
            raise _fail(
                d,
                f"{shown} is raw storage (directive {target.index}); "
                "data movement cannot use raw storage",
            )
    elif name not in persistent:
        wanted = (
            f"a persistentdw directive for {ref}{written}"
            if hint
            else f"a '#DW persistentdw name={name}' directive"
        )
        raise _fail(d, f"{shown} needs {wanted} in this job{hint}")


def _ref_name(value: str, ref: str) -> str:
    """The storage name as written in "$DW_JOB_<name>/rest" (nnf-sos reads up to the first '/')."""
    return value[len(ref) :].split("/", 1)[0]


def _storage_name(written: str) -> str:
    """The jobdw / persistentdw name a copy path's reference means: nnf-sos reads '_' as '-'."""
    return written.replace("_", "-")


def _or_list(words: Sequence[str]) -> str:
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else "".join(words)


def _fail(d: Directive, problem: str) -> DirectiveError:
    return DirectiveError(f"#DW directive {d.index} ({d.command}): {problem}")
