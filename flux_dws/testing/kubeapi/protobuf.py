# SPDX-License-Identifier: LGPL-3.0-only
"""Kubernetes protobuf request bodies for the built-in kinds kubectl sends that way (pure).

kubectl's typed commands (`kubectl create namespace`, `kubectl create secret`) send their
object as application/vnd.kubernetes.protobuf: the "k8s\\x00" magic, a runtime.Unknown
envelope, and the object's protobuf encoding; so does controller-runtime (nnf-sos) for every
built-in kind it writes.  The server answers in JSON, which the client also accepts.  Only
the messages those clients use are described here (the workload kinds nnf-sos writes in
``protobuf_workloads``), by field number as in k8s.io/api's generated.proto; anything else is
a 415.
"""

from __future__ import annotations

import base64
from datetime import datetime, timezone
from typing import Any

from . import protobuf_workloads
from .errors import ApiError, bad_request

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

# A message: field number -> (json name, kind); kinds: "str", "int", "bool", "bytes",
# "time", a nested message (dict), "map" (string->string), "bmap" (string->base64 bytes),
# and a list [kind] for repeated fields.
_TIME = "time"
_OWNER = {
    5: ("apiVersion", "str"),
    1: ("kind", "str"),
    3: ("name", "str"),
    4: ("uid", "str"),
    6: ("controller", "bool"),
    7: ("blockOwnerDeletion", "bool"),
}
OBJECT_META = {
    1: ("name", "str"),
    2: ("generateName", "str"),
    3: ("namespace", "str"),
    5: ("uid", "str"),
    6: ("resourceVersion", "str"),
    7: ("generation", "int"),
    8: ("creationTimestamp", _TIME),
    9: ("deletionTimestamp", _TIME),
    10: ("deletionGracePeriodSeconds", "int"),
    11: ("labels", "map"),
    12: ("annotations", "map"),
    13: ("ownerReferences", [_OWNER]),
    14: ("finalizers", ["str"]),
}
_MESSAGES: dict[tuple[str, str], dict[int, tuple[str, Any]]] = {
    ("v1", "Namespace"): {
        1: ("metadata", OBJECT_META),
        2: ("spec", {1: ("finalizers", ["str"])}),
        3: ("status", {1: ("phase", "str")}),
    },
    ("v1", "Secret"): {
        1: ("metadata", OBJECT_META),
        2: ("data", "bmap"),
        3: ("type", "str"),
        4: ("stringData", "map"),
        5: ("immutable", "bool?"),
    },
    **protobuf_workloads.messages(OBJECT_META),
}


def decode(data: bytes) -> dict:
    """The object a protobuf request body carries, as JSON-ready data."""
    if not data.startswith(MAGIC):
        raise bad_request("the protobuf body lacks the k8s magic prefix")
    envelope = _fields(data[len(MAGIC) :])
    type_meta = _fields(_first(envelope, 1, b""))
    api_version = _first(type_meta, 1, b"").decode()
    kind = _first(type_meta, 2, b"").decode()
    message = _MESSAGES.get((api_version, kind))
    if kind == "DeleteOptions":  # registered in every group version
        message = protobuf_workloads.DELETE_OPTIONS
    if message is None:
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include:"
            f" application/json, application/yaml ({kind or 'this kind'} in {MEDIA_TYPE})",
        )
    obj = _message(message, _first(envelope, 2, b""))
    return {"apiVersion": api_version, "kind": kind, **obj}


def _first(fields: list[tuple[int, Any]], number: int, default: Any) -> Any:
    return next((value for n, value in fields if n == number), default)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if at >= len(data):
            raise bad_request("truncated protobuf body")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise bad_request("malformed protobuf varint")


def _fields(data: bytes) -> list[tuple[int, Any]]:
    """(field number, int or bytes) for each field, in order."""
    out: list[tuple[int, Any]] = []
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise bad_request("truncated protobuf body")
            value, at = data[at : at + length], at + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, at = data[at : at + size], at + size
        else:
            raise bad_request(f"unsupported protobuf wire type {wire}")
        out.append((number, value))
    return out


def _message(schema: dict[int, tuple[str, Any]], data: bytes) -> dict:
    obj: dict[str, Any] = {}
    for number, raw in _fields(data):
        if number not in schema:
            continue
        name, kind = schema[number]
        if isinstance(kind, list):
            if kind[0] == "int" and isinstance(raw, bytes):  # packed
                obj.setdefault(name, []).extend(_value("int", v) for v in _packed(raw))
            else:
                obj.setdefault(name, []).append(_value(kind[0], raw))
        elif kind in ("map", "bmap", "qmap"):
            entry = _fields(raw)
            key = _first(entry, 1, b"").decode()
            value = _first(entry, 2, b"")
            if kind == "qmap":
                obj.setdefault(name, {})[key] = _value("quantity", value)
            else:
                text = base64.b64encode(value).decode() if kind == "bmap" else value.decode()
                obj.setdefault(name, {})[key] = text
        elif name == "":  # an embedded Go struct: its fields are the parent's in JSON
            obj.update(_value(kind, raw))
        elif isinstance(kind, str) and kind.endswith("?"):  # a pointer: zero is a value
            obj[name] = _value(kind[:-1], raw)
        else:
            value = _value(kind, raw)
            if value not in ("", 0, False):  # proto2 writes zero values; JSON omits them
                obj[name] = value
    return obj


def _packed(raw: bytes) -> list[int]:
    values, at = [], 0
    while at < len(raw):
        value, at = _varint(raw, at)
        values.append(value)
    return values


def _value(kind: Any, raw: Any) -> Any:
    if isinstance(kind, dict):
        return _message(kind, raw)
    if kind == "str":
        return raw.decode()
    if kind == "int":
        return raw - (1 << 64) if raw >= 1 << 63 else raw
    if kind == "bool":
        return bool(raw)
    if kind == "quantity":  # resource.Quantity: {1: its string form}
        return _first(_fields(raw), 1, b"").decode()
    if kind == "intorstr":  # intstr.IntOrString: {1: type (1: string), 2: int, 3: string}
        fields = _fields(raw)
        if _first(fields, 1, 0) == 1:
            return _first(fields, 3, b"").decode()
        return _value("int", _first(fields, 2, 0))
    if kind == _TIME:
        seconds = _first(_fields(raw), 1, 0)
        return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return raw
