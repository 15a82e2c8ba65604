# SPDX-License-Identifier: LGPL-3.0-only
"""User containers' pods -> what each container did, and the saved output document (pure).

nnf-sos runs a job's user containers in pods labelled ``nnf.cray.hpe.com/container=<workflow>``
(plus the workflow's labels), in the workflow's namespace, and removes them in Teardown.  Once
the containers have finished or failed, flux-dws reads each container's exit code and reason
from the pod status and the tail of its log (core/v1 ``pods/log``), and saves them in the job's
own KVS directory under ``OUTPUT_KEY`` (readable by the job's owner and the instance owner
only, through job-info).  ``flux dws logs`` prints them.

Pod objects and log bytes come from Kubernetes: untrusted.  Fields of the wrong type are
ignored, text is decoded leniently, NUL bytes are replaced (Flux's JSON refuses them) and
every part is bounded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flux_dws.base import untrusted
from flux_dws.core.policy import MAX_LOG_SIZE

#: The job's KVS key (under its job directory) that holds the saved output.
OUTPUT_KEY = "dws.output"
OUTPUT_VERSION = 1
CONTAINER_LABEL = "nnf.cray.hpe.com/container"
#: At most this many containers have their logs read (a job may have a pod per rabbit).
MAX_CONTAINERS = 64
#: The most characters readable() shows one byte of a log as (``\x1b`` for ESC).
SHOWN_PER_BYTE = 4


@dataclass(frozen=True)
class ContainerStatus:
    """One container of one pod, as the pod's status shows it."""

    pod: str
    name: str
    state: str  # terminated | running | waiting | unknown
    exit_code: int | None = None
    reason: str = ""
    restarts: int = 0


@dataclass(frozen=True)
class ContainerOutput:
    """A container's status and the tail of its log (or why there is none)."""

    status: ContainerStatus
    log: str = ""
    truncated: bool = False  # older output was dropped to keep the tail
    error: str = ""  # why no log could be read

    def to_json(self) -> dict[str, Any]:
        s = self.status
        return {
            "pod": s.pod,
            "name": s.name,
            "state": s.state,
            "exit_code": s.exit_code,
            "reason": s.reason,
            "restarts": s.restarts,
            "log": self.log,
            "truncated": self.truncated,
            "error": self.error,
        }


@dataclass(frozen=True)
class SavedOutput:
    """The document saved at ``OUTPUT_KEY``."""

    containers: tuple[ContainerOutput, ...] = ()
    note: str = ""  # e.g. the pods were already gone
    limit: int = 0  # bytes of log kept per container
    skipped: int = 0  # containers beyond MAX_CONTAINERS, not read

    @property
    def text_limit(self) -> int:
        """The bound of each string of the document once readable (saved in the KVS, and
        printed by ``flux dws logs --json``): a log of ``limit`` bytes is kept whole, other
        text is cut there too (at most RECORD_LIMIT when no log is kept)."""
        kept = min(max(self.limit, 0), MAX_LOG_SIZE)
        return max(untrusted.RECORD_LIMIT, SHOWN_PER_BYTE * kept)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": OUTPUT_VERSION,
            "note": self.note,
            "limit": self.limit,
            "skipped": self.skipped,
            "containers": [c.to_json() for c in self.containers],
        }

    def event_summary(self) -> dict[str, Any]:
        """What the ``dws-container`` event adds: each container's exit code and reason."""
        return {
            "containers": [
                {
                    "pod": c.status.pod,
                    "name": c.status.name,
                    "exit_code": c.status.exit_code,
                    "reason": c.status.reason,
                }
                for c in self.containers
            ],
            "output": self.note or f"saved in the job's KVS ({OUTPUT_KEY})",
        }


def container_selector(workflow: str) -> str:
    """The label selector of a workflow's container pods."""
    return f"{CONTAINER_LABEL}={workflow}"


def pod_containers(pod: Any) -> list[ContainerStatus]:
    """Every container (init containers first) of a pod object, in the pod's order."""
    if not isinstance(pod, Mapping):
        return []
    meta = untrusted.mapping(pod.get("metadata"))
    name = untrusted.field(meta.get("name"))
    status = untrusted.mapping(pod.get("status"))
    spec = untrusted.mapping(pod.get("spec"))
    found: list[ContainerStatus] = []
    for spec_key, status_key in (
        ("initContainers", "initContainerStatuses"),
        ("containers", "containerStatuses"),
    ):
        statuses = {
            untrusted.field(s.get("name")): s
            for s in untrusted.sequence(status.get(status_key))
            if isinstance(s, Mapping)
        }
        names = [
            untrusted.field(untrusted.mapping(c).get("name"))
            for c in untrusted.sequence(spec.get(spec_key))
        ]
        names += [n for n in statuses if n not in names]
        for container in names:
            if container:
                found.append(_container(name, container, statuses.get(container, {}), status))
    return found


def _container(
    pod: str, name: str, status: Mapping[str, Any], pod_status: Mapping[str, Any]
) -> ContainerStatus:
    """Terminated now, else terminated before (a restart), else running or waiting."""
    restarts = _int32(status.get("restartCount")) or 0
    state = untrusted.mapping(status.get("state"))
    last = untrusted.mapping(status.get("lastState"))
    terminated = state.get("terminated")
    if isinstance(terminated, Mapping):
        code = _int32(terminated.get("exitCode"))
        return ContainerStatus(pod, name, "terminated", code, _reason(terminated), restarts)
    waiting = state.get("waiting")
    ended = last.get("terminated")
    if isinstance(ended, Mapping):  # waiting to restart (CrashLoopBackOff) after an exit
        reason = _reason(ended)
        if isinstance(waiting, Mapping) and untrusted.field(waiting.get("reason")):
            reason = (
                f"{reason}, then {untrusted.field(waiting.get('reason'))}" if reason else reason
            )
        code = _int32(ended.get("exitCode"))
        return ContainerStatus(pod, name, "terminated", code, reason, restarts)
    if isinstance(waiting, Mapping):
        return ContainerStatus(pod, name, "waiting", None, _reason(waiting), restarts)
    if isinstance(state.get("running"), Mapping):
        return ContainerStatus(pod, name, "running", None, "", restarts)
    why = untrusted.field(untrusted.field(pod_status.get("reason")), 200)
    return ContainerStatus(pod, name, "unknown", None, why, restarts)


def tail_lines(limit: int) -> tuple[int, ...]:
    """How many lines to ask for, in turn: enough to fill ``limit`` bytes with short lines,
    then a tenth as many each time the answer was too large (very long lines)."""
    lines = max(limit // 8, 100)
    ladder = []
    while lines > 1:
        ladder.append(lines)
        lines //= 10
    return (*ladder, 1)


def tail(data: bytes, limit: int) -> tuple[str, bool]:
    """The last ``limit`` bytes of a log as text, starting at a line when one fits, and
    whether anything was dropped."""
    if limit <= 0:
        return "", bool(data)
    truncated = len(data) > limit
    if truncated:
        data = data[-limit:]
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:
            data = data[newline + 1 :]
    text = untrusted.field(data.decode("utf-8", errors="replace"))
    return text, truncated


def assemble(
    outputs: Iterable[ContainerOutput], *, limit: int, note: str = "", skipped: int = 0
) -> SavedOutput:
    """The saved document, containers ordered by pod then position."""
    ordered = sorted(outputs, key=lambda o: o.status.pod)
    return SavedOutput(tuple(ordered), note=note, limit=limit, skipped=skipped)


def read_saved(value: Any) -> SavedOutput | None:
    """A saved document read back (from the KVS); None when it cannot be understood."""
    if not isinstance(value, Mapping) or value.get("version") != OUTPUT_VERSION:
        return None
    outputs = []
    for entry in untrusted.sequence(value.get("containers")):
        if not isinstance(entry, Mapping):
            continue
        status = ContainerStatus(
            pod=untrusted.field(entry.get("pod")),
            name=untrusted.field(entry.get("name")),
            state=untrusted.field(entry.get("state")) or "unknown",
            exit_code=_int32(entry.get("exit_code")),
            reason=untrusted.field(entry.get("reason")),
            restarts=_int32(entry.get("restarts")) or 0,
        )
        outputs.append(
            ContainerOutput(
                status,
                log=untrusted.field(entry.get("log")),
                truncated=entry.get("truncated") is True,
                error=untrusted.field(entry.get("error")),
            )
        )
    return SavedOutput(
        tuple(outputs),
        note=untrusted.field(value.get("note")),
        limit=_int32(value.get("limit")) or 0,
        skipped=_int32(value.get("skipped")) or 0,
    )


# ----------------------------------------------------------------------------- helpers


def _int32(value: Any) -> int | None:
    return untrusted.integer(value, untrusted.INT32_MIN, untrusted.INT32_MAX)


def _reason(detail: Mapping[str, Any]) -> str:
    """A container state's reason, with its message when there is one (bounded)."""
    reason, message = untrusted.field(detail.get("reason")), untrusted.field(detail.get("message"))
    text = f"{reason}: {message}" if reason and message else reason or message
    return untrusted.field(" ".join(text.split()), 300)
