# SPDX-License-Identifier: LGPL-3.0-only
"""The site's ``[dws]`` table from Flux's TOML config -> an immutable :class:`Policy`.

Everything a site decides (namespace, timeouts, presets, restrictions) is read and checked
here, once, so the rest of flux-dws works with values that are already valid.  A bad table
is an admin error: :class:`PolicyError` names the full key (``[dws] timeouts.prerun.max:
invalid duration '5x'``) so it can be fixed at 3 a.m. without reading code.

State timeouts bound how long a workflow may take to become ready in each state.  Defaults
(default / site maximum), chosen so ordinary storage and data movement fit comfortably while a
wedged workflow is still noticed within the hour:

    proposal 10m / 1h    setup 30m / 4h     datain 1h / 24h    prerun 15m / 2h
    postrun 15m / 2h     dataout 1h / 24h   teardown 30m / 4h
    transient 30s / 10m  (how long TransientCondition is tolerated; the DWS errors
                          guide recommends thirty seconds before tearing down)
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from flux_dws.base.errors import DirectiveError, PolicyError
from flux_dws.base.frozen import FrozenMap
from flux_dws.base.fsd import format_fsd, parse_fsd
from flux_dws.base.untrusted import ECHO_LIMIT, echo, readable
from flux_dws.core.directives import parse_directives, parse_size
from flux_dws.core.identity import check_identity
from flux_dws.core.jobspec import FS_TYPES, StorageLimit
from flux_dws.core.states import STATE_KEYS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10 only
    import tomli as tomllib

TABLE = "dws"
#: ``[dws] release-nodes``: a job's compute nodes go back to the scheduler once Teardown is
#: done (the safe default), or as soon as PostRun has unmounted its storage from them.
AFTER_TEARDOWN = "after-teardown"
AFTER_UNMOUNT = "after-unmount"
RELEASE_CHOICES: tuple[str, ...] = (AFTER_TEARDOWN, AFTER_UNMOUNT)
TIMEOUT_KEYS: tuple[str, ...] = STATE_KEYS + ("transient",)


@dataclass(frozen=True)
class TimeoutBound:
    """A timeout's site default and the most a job may ask for, in seconds (may be inf)."""

    default: float
    maximum: float


def _bound(default: str, maximum: str) -> TimeoutBound:
    return TimeoutBound(parse_fsd(default), parse_fsd(maximum))


DEFAULT_TIMEOUTS: Mapping[str, TimeoutBound] = FrozenMap(
    {
        "proposal": _bound("10m", "1h"),
        "setup": _bound("30m", "4h"),
        "datain": _bound("1h", "24h"),
        "prerun": _bound("15m", "2h"),
        "postrun": _bound("15m", "2h"),
        "dataout": _bound("1h", "24h"),
        "teardown": _bound("30m", "4h"),
        "transient": _bound("30s", "10m"),
    }
)
assert tuple(DEFAULT_TIMEOUTS) == TIMEOUT_KEYS

#: A preset name is one word that cannot be mistaken for a #DW line in system.dw.
PRESET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAMESPACE_HELP = "a Kubernetes namespace: 1-63 lower-case letters, digits or '-'"
_API_VERSION_RE = re.compile(r"^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$")
_API_VERSION_HELP = "a Kubernetes API version such as v1alpha7"


@dataclass(frozen=True)
class Policy:
    """What the site allows and defaults to; immutable and hashable."""

    namespace: str = "default"
    kubeconfig: str | None = None
    instance: str | None = None
    presets: Mapping[str, tuple[str, ...]] = field(default_factory=FrozenMap)
    restrict_persistent: bool = True
    user_timeouts: bool = True
    timeouts: Mapping[str, TimeoutBound] = field(default_factory=lambda: DEFAULT_TIMEOUTS)
    workflow_version: str | None = None
    nnf_version: str | None = None
    api_alarm: float = 120.0
    service_wait: float = math.inf
    heartbeat: float = 10.0  # the service's heartbeat; the plugin counts 3 missed as "gone"
    max_proposals: int = 16  # workflows in Proposal at once (0: no limit); see admission.py
    api_threads: int = 4  # threads for Kubernetes calls (see service.KubeWorker sizing)
    # rabbit and node health (flux_dws.core.health, doc/guide/admin.rst):
    # drain nodes whose rabbit or rabbit link is down: off, as Fluxion rejects any queued job
    # larger than the nodes left up (the down rabbit's pool is marked down instead)
    drain_compute_nodes: bool = False
    # mark those nodes with Fluxion's badrabbit property instead, and keep #DW jobs off them
    # (flux-coral2's soft drain; flux_dws.core.softdrain)
    soft_drain: bool = False
    drain_on_teardown_failure: bool = True  # drain a job's nodes when its Teardown fails
    health_interval: float = 30.0  # how often Storage, drains and SystemStatus are compared
    capacity_drift: int = 64 * 2**30  # bytes a rabbit may miss before its pool is held down
    failure_tolerance_max: int = 0  # the most dw_failure_tolerance a job may ask for
    metrics_address: tuple[str, int] | None = None  # Prometheus endpoint (host, port); None: off
    max_directives: int = 100  # #DW directives one job may give
    max_directives_bytes: int = 65536  # their total size in bytes (UTF-8)
    rabbit_scheduling: bool = False  # Fluxion's graph holds rabbits: rewrite #DW jobspecs
    storage_limits: Mapping[str, StorageLimit] = field(default_factory=FrozenMap)
    container_log_size: int = 64 * 1024  # bytes of each user container's log kept (0: none)
    release_nodes: str = AFTER_TEARDOWN  # when a job's nodes go back (doc: "Early release")

    def __post_init__(self) -> None:
        # Freeze what callers pass as plain dicts; fill timeouts not given from the defaults.
        unknown = sorted(set(self.timeouts) - set(TIMEOUT_KEYS))
        if unknown:
            raise PolicyError(f"unknown timeout key(s) {', '.join(map(repr, unknown))}")
        timeouts = {key: self.timeouts.get(key, DEFAULT_TIMEOUTS[key]) for key in TIMEOUT_KEYS}
        presets = {name: tuple(lines) for name, lines in self.presets.items()}
        object.__setattr__(self, "timeouts", FrozenMap(timeouts))
        object.__setattr__(self, "presets", FrozenMap(presets))
        object.__setattr__(self, "storage_limits", FrozenMap(dict(self.storage_limits)))

    def timeout(self, key: str) -> TimeoutBound:
        """The bound for one of TIMEOUT_KEYS; KeyError naming the key otherwise."""
        try:
            return self.timeouts[key]
        except KeyError:
            raise KeyError(
                f"unknown timeout key {key!r}; known: {', '.join(TIMEOUT_KEYS)}"
            ) from None


# ---- reading the [dws] table ---------------------------------------------------------------


def _fail(key: str, problem: str) -> PolicyError:
    """The one-line error for ``key`` (a table's own keys, e.g. preset names, may hold
    anything: shown readable and bounded)."""
    return PolicyError(readable(f"[{TABLE}] {readable(key, ECHO_LIMIT)}: {problem}", 1024))


def type_name(value: object) -> str:
    """The TOML word for a value's type, for messages an admin reads."""
    names = {bool: "boolean", int: "integer", float: "float", str: "string"}
    if isinstance(value, Mapping):
        return "table"
    if isinstance(value, (list, tuple)):
        return "array"
    return names.get(type(value), type(value).__name__)


def _check_keys(table: Mapping[Any, Any], known: tuple[str, ...], prefix: str = "") -> None:
    for key in table:
        if key not in known:
            hint = difflib.get_close_matches(str(key), known, n=1)
            advice = f"did you mean '{prefix}{hint[0]}'?" if hint else f"known: {', '.join(known)}"
            shown = readable(f"{prefix}{key}", ECHO_LIMIT)
            raise PolicyError(readable(f"[{TABLE}] unknown key '{shown}' ({advice})", 1024))


def _table(value: object, key: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise _fail(key, f"must be a table, not {type_name(value)}")
    return value


def _string(value: object, key: str, pattern: re.Pattern[str] | None = None, rule: str = "") -> str:
    if not isinstance(value, str):
        raise _fail(key, f"must be a string, not {type_name(value)}")
    if not value:
        raise _fail(key, "must not be empty")
    if pattern is not None and not pattern.fullmatch(value):
        raise _fail(key, f"invalid value {echo(value)}: must be {rule}")
    return value


def _choice(value: object, key: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise _fail(key, f"must be a string, not {type_name(value)}")
    if value not in choices:
        raise _fail(key, f"invalid value {value!r}: must be one of {', '.join(choices)}")
    return value


def _boolean(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(key, f"must be true or false, not {type_name(value)} {echo(value)}")
    return value


def _duration(value: object, key: str) -> float:
    """A positive FSD; 0 is refused because a zero timeout would fail every job at once."""
    try:
        seconds = parse_fsd(value)
    except ValueError as exc:
        raise _fail(key, str(exc)) from None
    if seconds == 0:
        raise _fail(key, 'must be greater than 0 (use "inf" for no limit)')
    return seconds


def _interval(value: object, key: str) -> float:
    """A positive, finite FSD: something that must happen every so often."""
    seconds = _duration(value, key)
    if math.isinf(seconds):
        raise _fail(key, "must be a finite duration")
    return seconds


#: The least and the most each whole-number key takes.  The most is far past any real site
#: (a thread or a directive per 1000 of a big system's nodes) and keeps a typo such as
#: ``api-threads = 400000`` from building that many threads or admitting that much input.
COUNT_BOUNDS: Mapping[str, tuple[int, int]] = FrozenMap(
    {
        "max-proposals": (0, 10_000),
        "api-threads": (2, 64),
        "failure-tolerance-max": (0, 100_000),
        "max-directives": (1, 10_000),
        "max-directives-bytes": (64, 1024 * 1024),
    }
)


def _count(value: object, key: str, zero: str = "") -> int:
    """A whole number in the range :data:`COUNT_BOUNDS` gives ``key``; ``zero`` says what 0
    means where it is allowed."""
    least, most = COUNT_BOUNDS[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(key, f"must be an integer, not {type_name(value)} {echo(value)}")
    if not least <= value <= most:
        shown = f"{least}{zero if least == 0 else ''}"
        raise _fail(key, f"must be from {shown} to {most}, not {echo(value)}")
    return value


_PORT = re.compile(r"[0-9]{1,5}", re.ASCII)  # not "²" or "５": str.isdigit takes those


def _address(value: object, key: str) -> tuple[str, int]:
    """``PORT`` (on the loopback address), ``HOST:PORT``, or ``[v6addr]:PORT`` for IPv6.

    An unbracketed IPv6 address (``::1``) is refused rather than read as host ``:`` port 1."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = _string(value, key)
    form = "must be PORT, HOST:PORT or [IPV6]:PORT (port 0-65535)"
    if _PORT.fullmatch(text):
        host, port = "127.0.0.1", text
    elif text.startswith("["):
        inside, sep, port = text[1:].partition("]:")
        try:
            host = str(ipaddress.IPv6Address(inside)) if sep else ""
        except ValueError:
            host = ""
        if not host:
            raise _fail(key, f"invalid address {echo(text)}: {form}")
    else:
        host, sep, port = text.partition(":")
        if ":" in port:
            raise _fail(
                key, f"invalid address {echo(text)}: an IPv6 address goes in brackets, {form}"
            )
        if not sep or not host or any(c.isspace() or not c.isprintable() for c in host):
            raise _fail(key, f"invalid address {echo(text)}: {form}")
    if not _PORT.fullmatch(port) or int(port) > 65535:
        raise _fail(key, f"invalid address {echo(text)}: {form}")
    return host, int(port)


#: The most of one container's log a site may keep: the job's KVS is not a log store.
MAX_LOG_SIZE = 16 * 1024 * 1024


def _size(value: object, key: str) -> int:
    """A size in bytes, written as #DW capacities are ("1TiB", "500GB")."""
    if not isinstance(value, str):
        raise _fail(key, f'must be a size such as "1TiB", not {type_name(value)} {echo(value)}')
    try:
        return parse_size(value)
    except DirectiveError as exc:
        raise _fail(key, str(exc)) from None


def _size_or_zero(value: object, key: str) -> int:
    """A size string, or "0" / 0 for none (alarm on any shortfall)."""
    if value in (0, "0", "0B"):
        return 0
    return _size(value, key)


def _log_size(value: object, key: str) -> int:
    """Bytes, as a size string ("64KiB") or an integer; 0 keeps exit codes but no log."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _fail(key, f"must be a size or an integer, not {type_name(value)} {echo(value)}")
    if isinstance(value, str):
        size = 0 if value.strip() in ("0", "0B") else _size(value, key)
    elif value < 0:
        raise _fail(key, f"must be 0 (no logs) or more, not {echo(value)}")
    else:
        size = value
    if size > MAX_LOG_SIZE:
        raise _fail(key, f"must be at most 16MiB, not {echo(size)} bytes")
    return size


def _instance(value: object, key: str) -> str:
    text = _string(value, key)
    try:
        return check_identity(text)
    except ValueError as exc:
        raise _fail(key, str(exc)) from None


def _presets(value: object, key: str) -> dict[str, tuple[str, ...]]:
    """Preset name -> its directive texts, each preset parsed now so a bad one fails at load."""
    presets: dict[str, tuple[str, ...]] = {}
    for name, lines in _table(value, key).items():
        where = f"{key}.{name}"
        if not isinstance(name, str) or not PRESET_NAME_RE.fullmatch(name):
            raise _fail(where, "a preset name must be one word of letters, digits, '_', '.' or '-'")
        texts = (lines,) if isinstance(lines, str) else lines
        if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
            raise _fail(where, f"must be a string or an array of strings, not {type_name(lines)}")
        if not any(t.strip() for t in texts):
            raise _fail(where, "must hold at least one #DW directive")
        try:
            directives = parse_directives(lines if isinstance(lines, str) else tuple(lines))
        except DirectiveError as exc:
            raise _fail(where, str(exc)) from None
        presets[name] = tuple(d.text for d in directives)
    return presets


def _timeouts(value: object, key: str) -> dict[str, TimeoutBound]:
    """Per-state bounds.  A lone ``default`` raises the built-in maximum to meet it and a lone
    ``max`` lowers the built-in default to meet it: only two explicit values can conflict."""
    table = _table(value, key)
    _check_keys(table, TIMEOUT_KEYS, f"{key}.")
    bounds: dict[str, TimeoutBound] = {}
    for name in TIMEOUT_KEYS:
        if name not in table:
            continue
        where = f"{key}.{name}"
        sub = _table(table[name], where)
        _check_keys(sub, ("default", "max"), f"{where}.")
        default = _duration(sub["default"], f"{where}.default") if "default" in sub else None
        maximum = _duration(sub["max"], f"{where}.max") if "max" in sub else None
        if default is not None and maximum is not None and default > maximum:
            raise _fail(where, f"default {format_fsd(default)} exceeds max {format_fsd(maximum)}")
        builtin = DEFAULT_TIMEOUTS[name]
        if default is None:
            default = builtin.default if maximum is None else min(builtin.default, maximum)
        if maximum is None:
            maximum = max(builtin.maximum, default)
        bounds[name] = TimeoutBound(default, maximum)
    return bounds


def _storage_limits(value: object, key: str) -> dict[str, StorageLimit]:
    """Per file-system type: ``max-per-node`` and ``min-allocation`` sizes."""
    table = _table(value, key)
    _check_keys(table, FS_TYPES, f"{key}.")
    limits: dict[str, StorageLimit] = {}
    for fs in FS_TYPES:
        if fs not in table:
            continue
        where = f"{key}.{fs}"
        sub = _table(table[fs], where)
        _check_keys(sub, ("max-per-node", "min-allocation"), f"{where}.")
        most = (
            _size(sub["max-per-node"], f"{where}.max-per-node") if "max-per-node" in sub else None
        )
        least = (
            _size(sub["min-allocation"], f"{where}.min-allocation")
            if "min-allocation" in sub
            else 0
        )
        if most is not None and least > most:
            raise _fail(where, "min-allocation is more than max-per-node")
        limits[fs] = StorageLimit(most, least)
    return limits


#: config key -> (Policy field, reader(value, key)).  The one list of what [dws] may hold.
_READERS: Mapping[str, tuple[str, Callable[[Any, str], Any]]] = {
    "namespace": ("namespace", partial(_string, pattern=_NAMESPACE_RE, rule=_NAMESPACE_HELP)),
    "kubeconfig": ("kubeconfig", _string),
    "instance": ("instance", _instance),
    "presets": ("presets", _presets),
    "restrict-persistent": ("restrict_persistent", _boolean),
    "user-timeouts": ("user_timeouts", _boolean),
    "timeouts": ("timeouts", _timeouts),
    "workflow-version": (
        "workflow_version",
        partial(_string, pattern=_API_VERSION_RE, rule=_API_VERSION_HELP),
    ),
    "nnf-version": (
        "nnf_version",
        partial(_string, pattern=_API_VERSION_RE, rule=_API_VERSION_HELP),
    ),
    "api-alarm": ("api_alarm", _duration),
    "service-wait": ("service_wait", _duration),
    "heartbeat": ("heartbeat", _interval),
    "max-proposals": ("max_proposals", partial(_count, zero=" (no limit)")),
    "api-threads": ("api_threads", _count),
    "drain-compute-nodes": ("drain_compute_nodes", _boolean),
    "soft-drain": ("soft_drain", _boolean),
    "drain-on-teardown-failure": ("drain_on_teardown_failure", _boolean),
    "health-interval": ("health_interval", _interval),
    "capacity-drift": ("capacity_drift", _size_or_zero),
    "failure-tolerance-max": ("failure_tolerance_max", _count),
    "metrics-address": ("metrics_address", _address),
    "max-directives": ("max_directives", _count),
    "max-directives-bytes": ("max_directives_bytes", _count),
    "rabbit-scheduling": ("rabbit_scheduling", _boolean),
    "storage": ("storage_limits", _storage_limits),
    "container-log-size": ("container_log_size", _log_size),
    "release-nodes": ("release_nodes", partial(_choice, choices=RELEASE_CHOICES)),
}
CONFIG_KEYS: tuple[str, ...] = tuple(_READERS)
assert set(COUNT_BOUNDS) <= set(CONFIG_KEYS)


def policy_from_table(table: Mapping[str, Any] | None) -> Policy:
    """The Policy for a ``[dws]`` table given as a dict; None or {} gives the defaults."""
    if table is None:
        return Policy()
    if not isinstance(table, Mapping):
        raise PolicyError(f"[{TABLE}] must be a table, not {type_name(table)}")
    _check_keys(table, CONFIG_KEYS)
    values = {}
    for key, (name, read) in _READERS.items():
        if key in table:
            values[name] = read(table[key], key)
    return Policy(**values)


def load_policy(path: str) -> Policy:
    """The Policy from a config file, or from a directory read as Flux reads its config dir
    (:func:`load_config`)."""
    return policy_from_table(load_config(path).get(TABLE))


def load_config(path: str) -> dict[str, Any]:
    """The whole instance config from a file or a directory, as flux-core reads it.

    Like flux-core: a directory means its ``*.toml`` glob (sorted, no hidden files), merged
    table by table (a later file's value wins); a single file may be TOML or, by extension, JSON.
    """
    try:
        if os.path.isdir(path):
            config: dict[str, Any] = {}
            names = sorted(n for n in os.listdir(path) if n.endswith(".toml") and n[0] != ".")
            for name in names:
                _merge(config, _read_file(os.path.join(path, name)))
        else:
            config = _read_file(path)
    except OSError as exc:
        raise PolicyError(f"cannot read config {path}: {exc.strerror or exc}") from None
    return config


def _read_file(path: str) -> dict[str, Any]:
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        if path.endswith(".json"):
            parsed = json.loads(data)
            if not isinstance(parsed, dict):
                raise ValueError("top level is not an object")
            return parsed
        return tomllib.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{path}: {exc}") from None


def _merge(into: dict[str, Any], update: Mapping[str, Any]) -> None:
    """Recursive table merge, as jansson's json_object_update_recursive (flux-core)."""
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, Mapping):
            into[key] = {}
            _merge(into[key], value)
        else:
            into[key] = value
