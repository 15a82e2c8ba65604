# SPDX-License-Identifier: LGPL-3.0-only
"""The DWS Workflow admission webhooks (dws-api.md section 1), as pure functions plus one hook.

Order and wording follow the upstream webhooks as a real API server reports them: structural
defaults, then (on create) the mutating webhook adds driver entries and env, then schema
validation (422 Invalid), then the validating webhook (403, 'admission webhook
"vworkflow.kb.io" denied the request: <field error>').
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flux_dws.core.states import STATE_ORDER, State, Status
from flux_dws.testing import ruleset

from . import webhooks
from .errors import ApiError, invalid
from .resources import by_plural
from .webhooks import RemoteWebhook

WEBHOOK = "vworkflow.kb.io"
MUTATING = "mworkflow.kb.io"
#: Where a DWS install serves its webhooks (its kustomization's dws- prefix and namespace).
SERVICE_URL = "https://dws-webhook-service.dws-system.svc:443"
PATHS = {
    MUTATING: "/mutate-dataworkflowservices-github-io-v1alpha7-workflow",
    WEBHOOK: "/validate-dataworkflowservices-github-io-v1alpha7-workflow",
}
#: status fields Go's encoding/json leaves out when empty (omitempty), so the patch drops them
_OMITTED_EMPTY = ("state", "status", "message", "elapsedTimeLastState", "drivers", "requires")
STATES = tuple(s.value for s in STATE_ORDER)
WORKFLOW_STATUSES = tuple(s.value for s in Status)
DRIVER_STATUSES = (
    "Pending",
    "Queued",
    "Running",
    "Completed",
    "TransientCondition",
    "Error",
    "DriverWait",
)
REQUIRED_SPEC = (
    "desiredState",
    "dwDirectives",
    "forceReady",
    "groupID",
    "jobID",
    "userID",
    "wlmID",
)
#: spec field -> (the schema's type name, the Python type a JSON value of it has).
SPEC_TYPES = {
    "desiredState": ("string", str),
    "wlmID": ("string", str),
    "dwDirectives": ("array", list),
    "userID": ("integer", int),
    "groupID": ("integer", int),
    "hurry": ("boolean", bool),
    "forceReady": ("boolean", bool),
}
#: spec field -> the Go field name upstream's "field is immutable" message uses.
IMMUTABLE_SPEC = (
    ("wlmID", "WLMID"),
    ("jobID", "JobID"),
    ("userID", "UserID"),
    ("groupID", "GroupID"),
    ("dwDirectives", "DWDirectives"),
)


def register_workflow_webhook(store: Any) -> None:
    """The Python port of DWS's Workflow webhooks (the default)."""
    store.add_admission("workflows", admission_chain("workflows", _port_mutate, _port_validate))


def register_remote_webhooks(store: Any, hooks: Sequence[RemoteWebhook]) -> None:
    """Remote webhooks (kubeapi.webhooks) in place of the port, for each kind they name.

    Mutating webhooks run first, in order, then the validating ones, as kube-apiserver runs
    them; the store must have been made without the port (``Store(webhooks=False)``).
    """
    for plural in sorted(webhooks.plurals(hooks)):

        def mutate(operation: str, old: dict | None, new: dict, plural: str = plural) -> dict:
            for hook in hooks:
                if hook.mutating:
                    new = hook.admit(plural, operation, old, new)
            return new

        def validate(operation: str, old: dict | None, new: dict, plural: str = plural) -> None:
            for hook in hooks:
                if not hook.mutating:
                    hook.admit(plural, operation, old, new)

        store.add_admission(plural, admission_chain(plural, mutate, validate))


def admission_chain(
    plural: str,
    mutate: Callable[[str, dict | None, dict], dict],
    validate: Callable[[str, dict | None, dict], None],
) -> Callable[[str, dict | None, dict], dict]:
    """A store hook doing what kube-apiserver does around the webhooks of a kind.

    For workflows (whose CRD schema kubeapi does not otherwise read): the CRD's defaults,
    mutating admission, the defaults again (after a mutation, as for a CRD), then schema
    validation (422 Invalid, ratcheted on update), then validating admission.
    """
    structural = plural == "workflows"

    def hook(operation: str, old: dict | None, new: dict) -> dict:
        if structural:
            new = apply_defaults(new)
        new = mutate(operation, old, new)
        if structural:
            new = apply_defaults(new)
            causes = schema_errors(new)
            if operation == "UPDATE" and old is not None:
                causes = ratcheted(causes, old, new)
            if causes:
                resource = by_plural(plural)
                name = new.get("metadata", {}).get("name", "")
                raise invalid(resource.kind_group, name, causes)
        validate(operation, old, new)
        return new

    return hook


def _port_mutate(operation: str, old: dict | None, new: dict) -> dict:
    if operation != "CREATE":
        return new
    _decode(MUTATING, new)
    directives = _dict(new.get("spec")).get("dwDirectives")
    if isinstance(directives, list) and ruleset.crashes_parser(directives):
        raise crashed(MUTATING)
    return mutate(new)


def _port_validate(operation: str, old: dict | None, new: dict) -> None:
    _decode(WEBHOOK, new)
    if operation == "CREATE":
        denial = validate_create(new)
    else:
        try:
            denial = validate_update(old or {}, new)
        except _Crash:
            raise crashed(WEBHOOK) from None
    if denial:
        raise deny(denial)


class _Crash(Exception):
    """Where the Go webhook indexes past a slice's end: it panics, and its server hangs up."""


def crashed(webhook: str) -> ApiError:
    """What kube-apiserver answers when the webhook's server drops the connection (Fail)."""
    url = f"{SERVICE_URL}{PATHS[webhook]}?timeout={webhooks.DEFAULT_TIMEOUT}s"
    return ApiError(
        500,
        "InternalError",
        f'Internal error occurred: failed calling webhook "{webhook}": failed to call webhook:'
        f' Post "{url}": EOF',
    )


def _decode(webhook: str, obj: dict) -> None:
    """The webhook's JSON decoding into the Go type: IDs are uint32 (the schema says int32)."""
    for key, value in _dict(obj.get("spec")).items():
        if key in ("userID", "groupID") and _is(value, int) and not 0 <= value < 2**32:
            raise ApiError(
                400,
                "",
                f'admission webhook "{webhook}" denied the request: json: cannot unmarshal number'
                f" {value} into Go struct field WorkflowSpec.spec.{key} of type uint32",
            )


def deny(message: str) -> ApiError:
    return ApiError(
        403, "Forbidden", f'admission webhook "{WEBHOOK}" denied the request: {message}'
    )


def apply_defaults(obj: dict) -> dict:
    """The CRD's structural defaults: spec.forceReady and spec.hurry default to false."""
    spec = obj.get("spec")
    if isinstance(spec, dict):
        spec.setdefault("forceReady", False)
        spec.setdefault("hurry", False)
    return obj


def mutate(obj: dict) -> dict:
    """The mutating webhook: one Pending driver entry per watched state, and the env."""
    spec = _dict(obj.get("spec"))
    status = obj.setdefault("status", {})
    if not isinstance(status, dict):
        return obj
    drivers = status.setdefault("drivers", [])
    directives = spec.get("dwDirectives")
    if isinstance(directives, list) and isinstance(drivers, list):
        for index, directive in enumerate(directives):
            if not isinstance(directive, str):
                continue
            for driver_id, state in ruleset.watched_states(directive):
                if not any(_registered(d, driver_id, index, state.value) for d in drivers):
                    drivers.append(driver_entry(driver_id, index, state))
    for entry in drivers if isinstance(drivers, list) else ():
        for key in ("status", "message", "error"):
            if isinstance(entry, dict) and entry.get(key) == "":
                del entry[key]
    for key in _OMITTED_EMPTY:
        if status.get(key) in ("", []):
            del status[key]
    status.setdefault("computes", {})  # a struct, not a pointer: never left out
    status.setdefault("ready", False)
    env = status.setdefault("env", {})
    if isinstance(env, dict):
        meta = obj.get("metadata", {})
        env["DW_WORKFLOW_NAME"] = meta.get("name", "")
        env["DW_WORKFLOW_NAMESPACE"] = meta.get("namespace", "")
    return obj


def driver_entry(driver_id: str, index: int, state: State) -> dict:
    return {
        "driverID": driver_id,
        "taskID": "",
        "dwdIndex": index,
        "watchState": state.value,
        "lastHB": 0,
        "completed": False,
        "status": "Pending",
    }


def schema_errors(obj: dict) -> list[str]:
    """What the CRD's openAPIV3Schema rejects (a 422 Invalid), worded like the API server."""
    causes: list[str] = []
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = {}
    for field in REQUIRED_SPEC:
        if spec.get(field) is None:
            causes.append(f"spec.{field}: Required value")
    for field, (expected, python_type) in SPEC_TYPES.items():
        value = spec.get(field)
        if value is not None and not _is(value, python_type):
            causes.append(_type_error(f"spec.{field}", value, expected))
    job_id = spec.get("jobID")
    if job_id is not None and not (_is(job_id, int) or isinstance(job_id, str)):
        causes.append(_type_error("spec.jobID", job_id, "integer or string"))
    directives = spec.get("dwDirectives")
    if isinstance(directives, list):
        for index, item in enumerate(directives):
            if not isinstance(item, str):
                causes.append(_type_error(f"spec.dwDirectives[{index}]", item, "string"))
    causes += _enum_error("spec.desiredState", spec.get("desiredState"), STATES)
    status = _dict(obj.get("status"))
    causes += _enum_error("status.state", status.get("state"), STATES)
    causes += _enum_error("status.status", status.get("status"), WORKFLOW_STATUSES)
    drivers = status.get("drivers")
    for index, entry in enumerate(drivers if isinstance(drivers, list) else ()):
        entry = _dict(entry)
        path = f"status.drivers[{index}]"
        causes += _enum_error(f"{path}.status", entry.get("status"), DRIVER_STATUSES)
        causes += _enum_error(f"{path}.watchState", entry.get("watchState"), STATES)
    return causes


_MISSING = object()


def _at(obj: Any, path: str) -> Any:
    """The value at a field path such as ``status.drivers[0].status`` (_MISSING if none)."""
    for part in path.replace("[", ".[").split("."):
        if part.startswith("["):
            index = int(part[1:-1])
            if not isinstance(obj, list) or index >= len(obj):
                return _MISSING
            obj = obj[index]
        elif isinstance(obj, dict) and part in obj:
            obj = obj[part]
        else:
            return _MISSING
    return obj


def ratcheted(causes: list[str], old: dict, new: dict) -> list[str]:
    """CRD validation ratcheting (kube-apiserver 1.30 on, GA in 1.33): an update may keep a
    value the schema now refuses, as long as the update leaves that value unchanged; a field
    it sets or changes is checked.  A missing required field is never ratcheted here."""
    kept = []
    for cause in causes:
        path, _, detail = cause.partition(": ")
        value = _at(new, path)
        unchanged = value is not _MISSING and _at(old, path) == value
        if unchanged and not detail.startswith("Required value"):
            continue
        kept.append(cause)
    return kept


def validate_create(obj: dict) -> str | None:
    """ValidateCreate: the field error a new Workflow breaks, or None."""
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    desired = spec.get("desiredState")
    if desired != State.PROPOSAL.value:
        return _invalid("Spec.DesiredState", desired, "desired state must start in Proposal")
    if spec.get("hurry"):
        return "Spec.Hurry: Forbidden: the hurry flag may not be set on creation"
    if status.get("state"):
        return "Status.State: Forbidden: the status state may not be set on creation"
    return directive_error(spec.get("dwDirectives") or [])


def directive_error(directives: list[str]) -> str | None:
    """Why DWS's DWDirectiveRules refuse the directive list, or None (dwdparse's words)."""
    return ruleset.admission_error(directives)


def validate_update(old: dict, new: dict) -> str | None:
    """ValidateUpdate: the field error an update breaks, or None (checks in upstream order)."""
    spec, old_spec = _dict(new.get("spec")), _dict(old.get("spec"))
    status, old_status = _dict(new.get("status")), _dict(old.get("status"))
    desired = spec.get("desiredState")
    if spec.get("hurry") and desired != State.TEARDOWN.value:
        return "Spec.Hurry: Invalid value: true: the hurry flag may be set only in Teardown"
    for field, label in IMMUTABLE_SPEC:
        if spec.get(field) != old_spec.get(field) or type(spec.get(field)) is not type(
            old_spec.get(field)
        ):
            return f"Spec.{label}: Forbidden: field is immutable"
    old_state = old_status.get("state") or ""
    if old_state == "" and desired == State.PROPOSAL.value:
        return None  # the controller's initial setup of a new workflow
    drivers_error = _drivers_error(old_state, old_status.get("drivers"), status.get("drivers"))
    if drivers_error:
        return drivers_error
    if desired in (State.TEARDOWN.value, old_state):
        return None
    if _after(old_state, desired):
        return _invalid("Spec.DesiredState", desired, "DesiredState cannot progress backwards")
    if _next(old_state) != desired:
        return _invalid("Spec.DesiredState", desired, "states cannot be skipped")
    if not old_status.get("ready"):
        return _invalid("Status.State", old_state, "current desired state not yet achieved")
    return None


def _drivers_error(old_state: str, old_drivers: Any, drivers: Any) -> str | None:
    old_drivers = old_drivers if isinstance(old_drivers, list) else []
    for index, entry in enumerate(drivers if isinstance(drivers, list) else ()):
        entry = _dict(entry)
        previous = _dict(old_drivers[index]) if index < len(old_drivers) else None
        path = f"Status.Drivers[{index}]: Internal error: driver"
        if entry.get("watchState") != old_state:
            if previous is None:
                raise _Crash  # Drivers[i] of the old workflow, past its end
            # An entry equal to the old one is unchanged: no need to compare set fields.
            if previous != entry and _set_fields(previous) != _set_fields(entry):
                return f"{path} entry for non-current state cannot be changed"
            continue
        if entry.get("completed"):
            if entry.get("status") != "Completed":
                return f"{path} cannot be completed without status=Completed"
            if entry.get("error"):
                return f"{path} cannot be completed when error is present"
        elif previous is None:
            raise _Crash
        elif previous.get("completed"):
            return f"{path} cannot change from completed state"
    return None


def _next(state: str) -> str | None:
    if state == "":
        return State.PROPOSAL.value
    following = State(state).next() if state in STATES else None
    return following.value if following else None


def _after(state: str, other: str) -> bool:
    """Whether ``state`` comes after ``other`` in the DWS order ("" precedes everything)."""
    if state not in STATES or other not in STATES:
        return False
    return STATES.index(state) > STATES.index(other)


def _registered(entry: Any, driver_id: str, index: int, state: str) -> bool:
    entry = _dict(entry)
    return (entry.get("driverID"), entry.get("dwdIndex"), entry.get("watchState")) == (
        driver_id,
        index,
        state,
    )


def _set_fields(entry: dict) -> dict:
    """A driver entry as Go's typed struct sees it: absent and zero values are equal."""
    return {key: value for key, value in entry.items() if value not in (None, "", 0, False)}


def _invalid(path: str, value: Any, detail: str) -> str:
    return f"{path}: Invalid value: {_go_value(value)}: {detail}"


def _go_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return '""'
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


def _type_error(path: str, value: Any, expected: str) -> str:
    name = _json_type(value)
    return f'{path}: Invalid value: "{name}": {path} in body must be of type {expected}: "{name}"'


def _enum_error(path: str, value: Any, allowed: tuple[str, ...]) -> list[str]:
    if value is None or value in allowed or not isinstance(value, str):
        return []
    supported = ", ".join(f'"{a}"' for a in allowed)
    return [f"{path}: Unsupported value: {_go_value(value)}: supported values: {supported}"]


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _is(value: Any, python_type: type) -> bool:
    if python_type is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, python_type)


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}
