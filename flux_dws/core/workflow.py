# SPDX-License-Identifier: LGPL-3.0-only
"""A Workflow object from Kubernetes -> an immutable WorkflowView.

The lifecycle core decides from what it sees, so the raw dict is checked here, once: a field of
the wrong type is a one-line ValueError naming the field, an absent optional field takes the
value DWS means by its absence, and nothing downstream ever touches the dict.  Served versions
(v1alpha6, v1alpha7) carry the same fields for our purposes, so the version is not consulted.

The container directive's outcome is derived here too, by flux_dws.core.containeroutcome; the
driver entries and the ``DW Directive N:`` prefix are flux_dws.core.workflowstatus.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from sys import intern
from types import MappingProxyType
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.errors import DwsError
from flux_dws.base.frozen import SLOTS, Shared, share_strings
from flux_dws.core.containeroutcome import ContainerOutcome, container_outcome
from flux_dws.core.states import State, Status, state_named
from flux_dws.core.workflowstatus import DriverStatus, only_retried_errors, strip_directive

WORKFLOW_GROUP = "dataworkflowservices.github.io"
WORKFLOW_KIND = "Workflow"

_NO_NAME = "not a Workflow"
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)
#: What workflows hold alike, held once (view_workflow).
_SHARED = Shared()
_NO_ANNOTATIONS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, **SLOTS)
class WorkflowView:
    """What Kubernetes says about one workflow, checked and frozen."""

    name: str
    namespace: str
    uid: str
    resource_version: str
    jobid: str
    desired_state: State
    state: State | None
    ready: bool
    status: Status | None
    message: str
    drivers: tuple[DriverStatus, ...]
    env: Mapping[str, str] = field(hash=False)
    directives: tuple[str, ...]
    hurry: bool
    desired_state_change: float | None
    ready_change: float | None
    elapsed_time_last_state: str
    token_secret: tuple[str, str] | None
    deleting: bool
    finalizers: tuple[str, ...]
    labels: Mapping[str, str] = field(hash=False)
    container: ContainerOutcome
    requires: tuple[str, ...] = ()  # status.requires (e.g. copy-offload)
    annotations: Mapping[str, str] = field(hash=False, default_factory=dict)  # metadata

    @property
    def settled(self) -> bool:
        """The controller has caught up with desiredState; status says something about it."""
        return self.state is self.desired_state

    @property
    def complete(self) -> bool:
        return self.settled and self.ready

    @property
    def failed(self) -> bool:
        return self.settled and self.status is Status.ERROR and not self.retrying

    @property
    def transient(self) -> bool:
        return self.settled and (self.status is Status.TRANSIENT or self.retrying)

    @property
    def retrying(self) -> bool:
        """Error, but only from errors the drivers did not classify and retry themselves
        (``retried_error``): waited for like a TransientCondition, not failed at once."""
        return self.settled and only_retried_errors(self.drivers, self.state, self.status)

    @property
    def user_message(self) -> str:
        """status.message without its "DW Directive N: " prefix."""
        return strip_directive(self.message)


# --------------------------------------------------------------------------- timestamps


def parse_time(text: str | None) -> float | None:
    """Epoch seconds for an RFC 3339 time (Time or MicroTime); None for None or ""."""
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        raise DwsError(f"invalid timestamp {_show(text)}: expected an RFC 3339 string")
    return _parse_time(text)


def _parse_time(text: str) -> float:
    match = _RFC3339.match(text)
    if match is None:
        raise _bad_time(text)
    year, month, day, hour, minute, second = map(int, match.group(1, 2, 3, 4, 5, 6))
    try:  # datetime checks the date and the time of day (at C speed)
        moment = datetime.datetime(year, month, day, hour, minute, second, tzinfo=_UTC)
    except ValueError:
        raise _bad_time(text) from None
    offset = 0
    if match.group(9):
        off_h, off_m = int(match.group(10)), int(match.group(11))
        if off_h > 23 or off_m > 59:
            raise _bad_time(text)
        offset = (off_h * 3600 + off_m * 60) * (-1 if match.group(9) == "-" else 1)
    whole = (moment - _EPOCH) // _SECOND - offset
    return whole + float("0" + (match.group(7) or ".0"))


def _bad_time(text: str) -> DwsError:
    example = "2026-03-01T12:00:00.123456Z"
    return DwsError(f"invalid timestamp {_show(text)} (expected RFC 3339, e.g. {example})")


_UTC = datetime.timezone.utc
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=_UTC)
_SECOND = datetime.timedelta(seconds=1)


# --------------------------------------------------------------------------- the view


def view_workflow(obj: Mapping[str, Any]) -> WorkflowView:
    """Check and freeze one Workflow object (any served version).

    Raises ValueError (DwsError), one line naming the field, for an object that is not a
    Workflow or has a field of the wrong type.
    """
    if not isinstance(obj, Mapping):
        raise DwsError(f"{_NO_NAME}: expected a mapping, got {type(obj).__name__}")
    kind = obj.get("kind")
    if kind is not None and kind != WORKFLOW_KIND:
        raise DwsError(f"{_NO_NAME}: kind is {_show(kind)}")
    api = obj.get("apiVersion")
    if api is not None and (not isinstance(api, str) or api.split("/")[0] != WORKFLOW_GROUP):
        raise DwsError(f"{_NO_NAME}: apiVersion {_show(api)} is not in group {WORKFLOW_GROUP}")

    meta = _Fields(_NO_NAME, "", obj).mapping("metadata", required=True)
    name = meta.string("name", required=True)
    if not name:
        raise meta.error("name", "is empty")
    namespace = meta.string("namespace")
    root = _Fields(f"workflow {namespace}/{name}" if namespace else f"workflow {name}", "", obj)
    who = root.who
    meta = root.mapping("metadata")
    spec = root.mapping("spec", required=True)
    status = root.mapping("status")

    jobid = spec.get("jobID", (int, str), "an integer or a string", required=True)
    directives = spec.strings("dwDirectives")
    state = status.enum("state", State.parse)
    wf_status = status.enum("status", Status)
    message = status.string("message")
    # Most workflows' driver entries, directives and finalizers are alike: one copy of each.
    drivers = _SHARED(
        tuple(_SHARED(_driver(who, i, d)) for i, d in enumerate(status.sequence("drivers")))
    )
    annotations = _annotations(meta.raw("annotations"))
    return WorkflowView(
        name=name,
        namespace=namespace,
        uid=meta.string("uid"),
        resource_version=meta.string("resourceVersion"),
        jobid=str(jobid),
        desired_state=spec.enum("desiredState", State.parse, required=True),
        state=state,
        ready=status.boolean("ready"),
        status=wf_status,
        message=message,
        drivers=drivers,
        env=MappingProxyType(status.string_map("env")),
        directives=_SHARED(directives),
        hurry=spec.boolean("hurry"),
        desired_state_change=status.time("desiredStateChange"),
        ready_change=status.time("readyChange"),
        elapsed_time_last_state=status.string("elapsedTimeLastState"),
        token_secret=_token_secret(status),
        deleting=bool(meta.string("deletionTimestamp")),
        finalizers=_SHARED(meta.strings("finalizers")),
        labels=MappingProxyType(meta.string_map("labels")),
        container=_SHARED(
            container_outcome(
                directives, drivers, state, wf_status, message, status.raw("containers")
            )
        ),
        requires=_SHARED(status.strings("requires")),
        annotations=MappingProxyType(annotations) if annotations else _NO_ANNOTATIONS,
    )


#: What is read of a Workflow object once :func:`view_workflow` has read it (the view holds
#: the rest): who it is (core.identity.owned_jobid; the watch's bookkeeping), the release
#: mark (core.release.held_parts) and what the Proposal refers to (k8s.resources
#: breakdown_refs, container_profile_name).
_KEPT = {
    "metadata": (
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "labels",
        "annotations",
        "finalizers",
        "deletionTimestamp",
    ),
    "spec": ("jobID", "dwDirectives"),
    "status": ("directiveBreakdowns",),
}


#: Who a Workflow object is: what the watch needs of those it delivered, to tell the service
#: of one deleted while it looked away (core.identity.owned_jobid reads it then).
_IDENTITY = {
    "metadata": ("name", "namespace", "uid", "resourceVersion", "labels"),
    "spec": ("jobID",),
}


def kept_identity(obj: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`kept`, but only who the workflow is (``_IDENTITY``)."""
    return kept(obj, _IDENTITY)


def kept(obj: Mapping[str, Any], parts: Mapping[str, tuple[str, ...]] = _KEPT) -> dict[str, Any]:
    """The parts of a Workflow object still read after :func:`view_workflow` (``_KEPT``),
    sharing their values with ``obj``: what the watch and each tracked job hold instead of
    the whole object, whose status (drivers, env, ...) is several times bigger and is read
    once, into the view.  Never raises: a part that is not a mapping is kept as it is."""
    out: dict[str, Any] = {k: obj[k] for k in ("apiVersion", "kind") if k in obj}
    for part, keys in parts.items():
        value = obj.get(part)
        if isinstance(value, Mapping):
            out[part] = {k: value[k] for k in keys if k in value}
        elif value is not None:
            out[part] = value
    return out


def view_of(obj: dict[str, Any]) -> tuple[WorkflowView, dict[str, Any]]:
    """The view of a Workflow object freshly decoded, and what is kept of it (:func:`kept`),
    its strings shared first (base.frozen): one copy of each repeated text (namespace,
    labels, directives) among the workflows held.  Raises as :func:`view_workflow`."""
    raw = share_strings(kept(obj))
    return view_workflow(obj), raw


def read_from(view: WorkflowView | None, obj: Mapping[str, Any]) -> bool:
    """Whether ``view`` was read from this very version of the workflow ``obj`` (same uid
    and resourceVersion, which name one content), so reading ``obj`` again gives ``view``:
    the watch's event for a version the service adopted from a response already.  A view
    whose desiredState (or hurry) was set ahead of the watch (a patch in flight) was not."""
    if view is None:
        return False
    meta, spec = obj.get("metadata"), obj.get("spec")
    if type(meta) is not dict or type(spec) is not dict:
        return False
    version = meta.get("resourceVersion")
    return (
        type(version) is str
        and version != ""
        and version == view.resource_version
        and meta.get("uid") == view.uid
        and type(spec.get("desiredState")) is str
        and state_named(spec["desiredState"]) is view.desired_state
        and (spec.get("hurry") is True) is view.hurry
    )


def _annotations(value: Any) -> dict[str, str]:
    """metadata.annotations, string to string only: flux-dws reads its own (the release
    mark, core.release) and ignores what others put there, so nothing in them makes the
    workflow unreadable."""
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _text_or_none(value: Any) -> bool:
    return value is None or type(value) is str


def _driver(who: str, index: int, entry: Any) -> DriverStatus:
    if type(entry) is dict:  # the common case, each field of its JSON type: checked inline
        get = entry.get
        driver_id, task_id, status = get("driverID"), get("taskID"), get("status")
        message, error, watch = get("message"), get("error"), get("watchState")
        dwd_index, completed, last_hb = get("dwdIndex"), get("completed"), get("lastHB")
        watch_state = state_named(watch) if type(watch) is str else None
        if (
            type(dwd_index) is int
            and (completed is None or type(completed) is bool)
            and (last_hb is None or type(last_hb) is int)
            and (watch is None or watch == "" or watch_state is not None)
            and _text_or_none(driver_id)
            and _text_or_none(task_id)
            and _text_or_none(status)
            and _text_or_none(message)
            and _text_or_none(error)
        ):
            return DriverStatus(  # one copy of each text, as from the watch (base.frozen)
                driver_id=intern(driver_id) if driver_id else "",
                task_id=intern(task_id) if task_id else "",
                dwd_index=dwd_index,
                watch_state=watch_state,
                completed=completed is True,
                status=intern(status) if status else "",
                message=intern(message) if message else "",
                error=intern(error) if error else "",
                last_hb=last_hb or 0,
            )
    return _driver_checked(who, index, entry)


def _driver_checked(who: str, index: int, entry: Any) -> DriverStatus:
    """:func:`_driver` field by field: the one-line error for a field of the wrong type."""
    path = f"status.drivers[{index}]"
    if not isinstance(entry, Mapping):
        raise DwsError(f"{who}: {path} must be a mapping, not {type(entry).__name__}")
    d = _Fields(who, path, entry)
    return DriverStatus(
        driver_id=d.string("driverID"),
        task_id=d.string("taskID"),
        dwd_index=d.get("dwdIndex", (int,), "an integer", required=True),
        watch_state=d.enum("watchState", State.parse),
        completed=d.boolean("completed"),
        status=d.string("status"),
        message=d.string("message"),
        error=d.string("error"),
        last_hb=d.get("lastHB", (int,), "an integer", default=0),
    )


def _token_secret(status: _Fields) -> tuple[str, str] | None:
    token = status.mapping("workflowToken")
    namespace, name = token.string("secretNamespace"), token.string("secretName")
    return (namespace, name) if namespace and name else None


class _Fields:
    """Typed reads from one sub-object; every error names the workflow and the field path.

    JSON null counts as absent, as it does for Kubernetes.
    """

    def __init__(self, who: str, path: str, data: Mapping[Any, Any]) -> None:
        self.who, self.path, self.data = who, path, data

    def error(self, key: str, problem: str) -> DwsError:
        return DwsError(f"{self.who}: {self._path(key)} {problem}")

    def _path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def raw(self, key: str) -> Any:
        return self.data.get(key)

    def get(
        self, key: str, kinds: tuple[type, ...], what: str, required: bool = False, default=None
    ) -> Any:
        value = self.data.get(key)
        if value is None:
            if required:
                raise self.error(key, "is missing")
            return default
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise self.error(key, f"must be {what}, not {type(value).__name__}")
        return value

    def string(self, key: str, required: bool = False) -> str:
        return self.get(key, (str,), "a string", required=required, default="")

    def boolean(self, key: str) -> bool:
        return self.get(key, (bool,), "a boolean", default=False)

    def mapping(self, key: str, required: bool = False) -> _Fields:
        data = self.get(key, (Mapping,), "a mapping", required=required, default={})
        return _Fields(self.who, self._path(key), data)

    def sequence(self, key: str) -> Sequence[Any]:
        return self.get(key, (list, tuple), "a list", default=())

    def strings(self, key: str) -> tuple[str, ...]:
        items = self.sequence(key)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise self.error(f"{key}[{i}]", f"must be a string, not {type(item).__name__}")
        return tuple(items)

    def string_map(self, key: str) -> dict[str, str]:
        items = self.mapping(key).data
        for k, v in items.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise self.error(f"{key}[{_show(k)}]", "must map a string to a string")
        return dict(items)

    def enum(self, key: str, parse: Any, required: bool = False) -> Any:
        """An enum value; "" is absent (DWS leaves status.state empty until it has run)."""
        text = self.string(key, required=required)
        if not text:
            if required:
                raise self.error(key, "is empty")
            return None
        try:
            return parse(text)
        except ValueError:
            raise self.error(key, f"has unknown value {_show(text)}") from None

    def time(self, key: str) -> float | None:
        try:
            return parse_time(self.data.get(key))
        except ValueError as e:
            raise self.error(key, f"is an {e}") from None


def _show(value: Any) -> str:
    return untrusted.echo(value, 60)
