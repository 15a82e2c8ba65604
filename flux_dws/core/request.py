# SPDX-License-Identifier: LGPL-3.0-only
"""A job's DWS attributes -> a validated :class:`DwRequest`.

Users submit ``flux run -S dw="#DW jobdw ..." -S dw_timeout.prerun=10m ...``, so the jobspec's
``attributes.system`` holds ``dw`` (#DW lines as one string or a list, or the name of a site
preset) and ``dw_timeout`` (state key -> duration).  Everything is checked here, before a
workflow exists, so a bad request fails the job with one line naming the attribute at fault.
A user's timeout above the site maximum is refused, never silently clamped: the user asked
for something the site does not give, and should know.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.errors import DirectiveError, RequestError
from flux_dws.base.frozen import SLOTS, FrozenMap
from flux_dws.base.fsd import format_fsd, parse_fsd
from flux_dws.core.directives import Directive, parse_directives
from flux_dws.core.jobspec import (
    check_no_ssd,
    check_per_node,
    directive_bytes_per_node,
    node_count,
    rewritten_nodes,
    without_ssd,
)
from flux_dws.core.policy import (
    AFTER_TEARDOWN,
    AFTER_UNMOUNT,
    PRESET_NAME_RE,
    RELEASE_CHOICES,
    TIMEOUT_KEYS,
    Policy,
    type_name,
)
from flux_dws.core.storage import StorageError

DW_ATTR = "dw"
TIMEOUT_ATTR = "dw_timeout"
TOLERANCE_ATTR = "dw_failure_tolerance"
RELEASE_ATTR = "dw_release"
#: Commands that create or destroy storage outliving the job (restrict-persistent).
PERSISTENT_COMMANDS = frozenset({"create_persistent", "destroy_persistent"})
#: Commands whose DirectiveBreakdown asks for rabbit storage (nnf-sos): with rabbit scheduling,
#: such a job's resources are rewritten at release, so they must be a shape the rewrite takes.
STORAGE_COMMANDS = frozenset({"jobdw", "create_persistent"})



@dataclass(frozen=True, **SLOTS)
class DwRequest:
    """A job's #DW directives and the timeouts in force for its workflow."""

    directives: tuple[Directive, ...]
    timeouts: Mapping[str, float]  # every key of TIMEOUT_KEYS: the user's value or the default
    user_timeouts: Mapping[str, float]  # only the keys the user set
    preset: str | None = None  # the site preset system.dw named, if it named one
    failure_tolerance: int = 0  # compute nodes that may fail Setup or PreRun (dw_failure_tolerance)
    release: str = AFTER_TEARDOWN  # when the nodes go back: [dws] release-nodes, or dw_release

    @property
    def releases_early(self) -> bool:
        """The nodes go back once PostRun unmounted the storage, before DataOut and Teardown."""
        return self.release == AFTER_UNMOUNT

    def __post_init__(self) -> None:
        object.__setattr__(self, "directives", tuple(self.directives))
        object.__setattr__(self, "timeouts", FrozenMap(self.timeouts))
        object.__setattr__(self, "user_timeouts", FrozenMap(self.user_timeouts))

    @property
    def lines(self) -> tuple[str, ...]:
        """The directive texts, for the Workflow's spec.dwDirectives."""
        return tuple(d.text for d in self.directives)

    @property
    def has_container(self) -> bool:
        return any(d.command == "container" for d in self.directives)

    def describe_timeouts(self) -> dict[str, str]:
        """Key -> FSD string for every timeout in force, for job events and logs."""
        return {key: format_fsd(self.timeouts[key]) for key in TIMEOUT_KEYS}

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: seconds as numbers, no limit as "inf" (JSON has no infinity)."""
        return {
            "dw": list(self.lines),
            "timeouts": {k: _json_seconds(v) for k, v in self.timeouts.items()},
            "user_timeouts": {k: _json_seconds(v) for k, v in self.user_timeouts.items()},
            "preset": self.preset,
            "failure_tolerance": self.failure_tolerance,
            "release": self.release,
        }

    @classmethod
    def from_json(cls, data: Any) -> DwRequest:
        """The inverse of :meth:`to_json`; RequestError names what a stored request lacks."""
        if not isinstance(data, Mapping):
            raise RequestError(f"stored DWS request must be an object, not {type_name(data)}")
        lines = data.get("dw")
        if not isinstance(lines, list) or not lines or not all(isinstance(s, str) for s in lines):
            raise RequestError("stored DWS request: 'dw' must be a non-empty list of strings")
        try:
            directives = parse_directives(tuple(lines))
        except DirectiveError as exc:
            raise RequestError(f"stored DWS request: dw: {exc}") from None
        timeouts = _stored_seconds(data.get("timeouts"), "timeouts")
        user = _stored_seconds(data.get("user_timeouts", {}), "user_timeouts")
        if set(timeouts) != set(TIMEOUT_KEYS):
            keys = ", ".join(TIMEOUT_KEYS)
            raise RequestError(f"stored DWS request: 'timeouts' must have exactly the keys {keys}")
        if not set(user) <= set(TIMEOUT_KEYS):
            raise RequestError("stored DWS request: 'user_timeouts' has unknown keys")
        preset = data.get("preset")
        if preset is not None and not isinstance(preset, str):
            raise RequestError("stored DWS request: 'preset' must be a string or null")
        tolerance = data.get("failure_tolerance", 0)
        if isinstance(tolerance, bool) or not isinstance(tolerance, int) or tolerance < 0:
            raise RequestError("stored DWS request: 'failure_tolerance' must be an integer >= 0")
        release = data.get("release", AFTER_TEARDOWN)
        if release not in RELEASE_CHOICES:
            raise RequestError(
                f"stored DWS request: 'release' must be one of {', '.join(RELEASE_CHOICES)}"
            )
        return cls(directives, timeouts, user, preset, tolerance, release)


def request_from_attributes(
    system: Mapping[str, Any] | None, policy: Policy, *, userid: int, owner_uid: int
) -> DwRequest | None:
    """The job's validated request, or None for a job without system.dw (not a DWS job).

    ``userid`` is the job's owner, ``owner_uid`` the Flux instance owner: with
    restrict-persistent only the latter may create or destroy persistent storage.
    """
    if system is None:
        return None
    if not isinstance(system, Mapping):
        raise RequestError(f"attributes.system must be a table, not {type_name(system)}")
    if DW_ATTR not in system:
        for attr, what in (
            (TIMEOUT_ATTR, "DWS timeouts apply"),
            (TOLERANCE_ATTR, "failure tolerance applies"),
            (RELEASE_ATTR, "early release applies"),
        ):
            if attr in system:
                raise RequestError(
                    f"system.{attr} is set but system.{DW_ATTR} is not: "
                    f"{what} only to jobs with #DW directives"
                )
        return None
    directives, preset = _directives(system[DW_ATTR], policy)
    if policy.restrict_persistent and userid != owner_uid:
        for d in directives:
            if d.command in PERSISTENT_COMMANDS:
                raise RequestError(
                    f"system.{DW_ATTR}: #DW directive {d.index} ({d.command}): only the "
                    f"instance owner (uid {owner_uid}) may manage persistent storage at this site"
                )
    user = _user_timeouts(system.get(TIMEOUT_ATTR, {}), policy)
    timeouts = {key: user.get(key, policy.timeout(key).default) for key in TIMEOUT_KEYS}
    tolerance = _tolerance(system.get(TOLERANCE_ATTR, 0), policy)
    release = _release(system.get(RELEASE_ATTR, policy.release_nodes), policy)
    return DwRequest(directives, timeouts, user, preset, tolerance, release)


def validate_attributes(
    system: Mapping[str, Any] | None,
    policy: Policy,
    userid: int,
    owner_uid: int,
    resources: Any = None,
) -> str | None:
    """The one line to refuse a job with at submit, or None to accept: what the job-ingest
    validator (flux_dws/validator.py) answers for a job's attributes.system and jobspec
    ``resources`` (None: not known, so not checked).

    Besides the request itself: with ``rabbit-scheduling``, the rewrite is the only source of
    ``ssd``, so a job without #DW that asks for ssd is refused, and a #DW job with rabbit
    storage must ask for a shape the rewrite takes (whole nodes).  A #DW job's own ssd is
    taken out, as the rewrite does, before the site's storage limits are checked.
    """
    try:
        request = request_from_attributes(system, policy, userid=userid, owner_uid=owner_uid)
        if request is None:
            if policy.rabbit_scheduling:
                check_no_ssd(resources)
            return None
        resources = without_ssd(resources)  # replaced at release; deeper, refused
        nnodes = node_count(resources)
        if (
            policy.rabbit_scheduling
            and resources is not None
            and any(d.command in STORAGE_COMMANDS for d in request.directives)
        ):
            nnodes = rewritten_nodes(resources)
        if policy.storage_limits:
            per_node = directive_bytes_per_node(request.directives, nnodes, policy.storage_limits)
            check_per_node(per_node, policy.storage_limits)
    except (RequestError, StorageError) as exc:
        return str(exc)
    return None


def _release(value: object, policy: Policy) -> str:
    """system.dw_release: a job may ask for the safe behaviour (its nodes held until Teardown
    is done) at a site that releases them early, never the other way round."""
    where = f"system.{RELEASE_ATTR}"
    if not isinstance(value, str) or value not in RELEASE_CHOICES:
        shown = value if isinstance(value, str) else type_name(value)
        raise RequestError(f"{where} must be one of {', '.join(RELEASE_CHOICES)}, not {shown!r}")
    if value == AFTER_UNMOUNT and policy.release_nodes != AFTER_UNMOUNT:
        raise RequestError(
            f"{where}={AFTER_UNMOUNT}: this site holds a job's nodes until Teardown is done "
            "([dws] release-nodes)"
        )
    return value


def _tolerance(value: object, policy: Policy) -> int:
    """system.dw_failure_tolerance: how many compute nodes may fail, up to the site maximum."""
    where = f"system.{TOLERANCE_ATTR}"
    if isinstance(value, str) and untrusted.decimal(value.strip()) is not None:
        value = untrusted.decimal(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(
            f"{where} must be a whole number, not {type_name(value)} {untrusted.echo(value)}"
        )
    if value < 0:
        raise RequestError(f"{where} must be 0 or more, not {value}")
    if value > policy.failure_tolerance_max:
        raise RequestError(
            f"{where}={value} exceeds this site's maximum of {policy.failure_tolerance_max} "
            "([dws] failure-tolerance-max)"
        )
    return value


def _directives(value: object, policy: Policy) -> tuple[tuple[Directive, ...], str | None]:
    """Parse system.dw: #DW text, a list of #DW lines, or one word naming a site preset."""
    where = f"system.{DW_ATTR}"
    preset = None
    if isinstance(value, str):
        if not value.strip():
            raise RequestError(f"{where} is empty: give #DW directives or a preset name")
        if PRESET_NAME_RE.fullmatch(value.strip()):
            preset = value.strip()
            if preset not in policy.presets:
                known = ", ".join(sorted(policy.presets)) or "(this site defines none)"
                known = untrusted.text(known, 400)  # the site's names: many may be defined
                raise RequestError(
                    f"{where}: unknown preset {untrusted.echo(preset)}; known: {known}"
                )
            source: Any = policy.presets[preset]
        else:
            source = value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise RequestError(f"{where}[{i}] must be a string, not {type_name(item)}")
        if not any(item.strip() for item in value):
            raise RequestError(f"{where} is empty: give #DW directives or a preset name")
        source = tuple(value)
    else:
        raise RequestError(
            f"{where} must be #DW directives (a string or a list of strings) or a preset name, "
            f"not {type_name(value)}"
        )
    if preset is None:
        _check_total_size(source, policy)
    try:
        directives = _parsed(source)
    except DirectiveError as exc:
        raise RequestError(f"{where}: {exc}") from None
    if not directives:
        raise RequestError(f"{where} holds no #DW directives")
    if preset is None:
        _check_each(directives, policy)
    return directives, preset


#: The most one directive may hold, in bytes (a copy_in with two PATH_MAX paths fits).
MAX_DIRECTIVE_BYTES = 16384


@functools.lru_cache(maxsize=256)
def _parsed(source: str | tuple[str, ...]) -> tuple[Directive, ...]:
    """parse_directives, remembered for the last texts seen: jobs submitted from one script
    share their directives, which are immutable (a 10,000-job restart parsed the same text
    10,000 times, a quarter of a millisecond each).  A failure is not remembered."""
    return parse_directives(source)


def _check_total_size(source: str | tuple[str, ...], policy: Policy) -> None:
    """Refuse an oversized system.dw before parsing it ([dws] max-directives-bytes)."""
    texts = (source,) if isinstance(source, str) else source
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    if size > policy.max_directives_bytes:
        raise RequestError(
            f"system.{DW_ATTR} is {size} bytes, more than this site's limit of "
            f"{policy.max_directives_bytes} ([dws] max-directives-bytes)"
        )


def _check_each(directives: tuple[Directive, ...], policy: Policy) -> None:
    """Refuse too many directives ([dws] max-directives) or one that is too long."""
    if len(directives) > policy.max_directives:
        raise RequestError(
            f"system.{DW_ATTR} holds {len(directives)} #DW directives, more than this site's "
            f"limit of {policy.max_directives} ([dws] max-directives)"
        )
    for d in directives:
        size = len(d.text.encode("utf-8", "surrogatepass"))
        if size > MAX_DIRECTIVE_BYTES:
            raise RequestError(
                f"system.{DW_ATTR}: #DW directive {d.index} ({d.command}) is {size} bytes, "
                f"more than the limit of {MAX_DIRECTIVE_BYTES} for one directive"
            )


def _user_timeouts(value: object, policy: Policy) -> dict[str, float]:
    where = f"system.{TIMEOUT_ATTR}"
    if not isinstance(value, Mapping):
        raise RequestError(
            f"{where} must be a table of state=duration (e.g. -S {TIMEOUT_ATTR}.prerun=30m), "
            f"not {type_name(value)}"
        )
    if value and not policy.user_timeouts:
        raise RequestError(f"{where}: this site does not let jobs set DWS timeouts")
    seconds: dict[str, float] = {}
    for key, raw in value.items():
        if key not in TIMEOUT_KEYS:
            raise RequestError(
                f"{where}.{untrusted.text(key, untrusted.ECHO_LIMIT)}: unknown timeout; "
                f"valid: {', '.join(TIMEOUT_KEYS)}"
            )
        try:
            limit = parse_fsd(raw)
        except ValueError as exc:
            raise RequestError(f"{where}.{key}: {exc}") from None
        if limit == 0:
            raise RequestError(f'{where}.{key}: must be greater than 0 (use "inf" for no limit)')
        maximum = policy.timeout(key).maximum
        if limit > maximum:
            shown = untrusted.text(
                raw.strip() if isinstance(raw, str) else raw, untrusted.ECHO_LIMIT
            )
            raise RequestError(
                f"{where}.{key}={shown} exceeds the site maximum of {format_fsd(maximum)}"
            )
        seconds[key] = limit
    return seconds


def _json_seconds(seconds: float) -> float | str:
    return "inf" if math.isinf(seconds) else seconds


def _stored_seconds(value: object, name: str) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise RequestError(f"stored DWS request: {name!r} must be an object")
    try:
        return {str(k): parse_fsd(v) for k, v in value.items()}
    except ValueError as exc:
        raise RequestError(f"stored DWS request: {name}: {exc}") from None
