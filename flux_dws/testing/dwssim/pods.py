# SPDX-License-Identifier: LGPL-3.0-only
"""The pods of a job's user containers, and what each one prints, for every behaviour.

nnf-sos runs a container directive as one batch Job per rabbit (a pod named after the workflow
and the rabbit) or as an MPIJob (a launcher pod and a worker pod per rabbit); every pod carries
the workflow's labels and ``nnf.cray.hpe.com/container=<workflow>`` (dws-api.md 4).  This
module builds those pods as plain dicts for each stage (``started`` in PreRun, ``ended`` once
PostRun has a verdict) with the container status and the log each behaviour gives:

- ok: runs, prints its progress, exits 0 (Completed);
- exit-nonzero: runs, prints an error naming the file it missed, exits 1 (Error);
- crash-loop: the launcher segfaults on every attempt (exit 139, restarts = retryLimit);
  an MPI job's workers are removed when its launcher is done (cleanPodPolicy Running);
- hang: runs until PostRun's deadline kills it (exit 137, pod DeadlineExceeded);
- never-start: stays ContainerCreating (no log); start-fail: ErrImagePull (no log).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flux_dws.testing.dwssim.companions import api_object, child_metadata
from flux_dws.testing.dwssim.containers import Behavior, ProfileSettings

CONTAINER_LABEL = "nnf.cray.hpe.com/container"
DIRECTIVE_INDEX_LABEL = "nnf.cray.hpe.com/directive_index"
STARTED, ENDED = "started", "ended"
#: Lines an ok container prints: enough that a 64 KiB tail keeps only the end.
OK_LINES = 4000


def pods(
    workflow: Mapping[str, Any],
    index: int,
    settings: ProfileSettings,
    nodes: Sequence[str],
    stage: str,
) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """(pod, {container: log}) for every pod of the container directive at ``stage``."""
    name = workflow["metadata"]["name"]
    if settings.mpi:
        roles = [("mpi-launcher", f"{name}-launcher", None)]
        if stage == STARTED:  # the workers are removed once the launcher is done
            roles += [("mpi-worker", f"{name}-worker-{i}", node) for i, node in enumerate(nodes)]
    else:
        roles = [("app", f"{name}-{node}", node) for node in nodes]
    built = []
    for role, pod_name, node in roles:
        container = role
        meta = child_metadata(workflow, pod_name)
        meta["labels"].update({CONTAINER_LABEL: name, DIRECTIVE_INDEX_LABEL: str(index)})
        status, log = container_state(settings, role, stage)
        phase = _phase(status)
        pod = {
            **api_object("pods"),
            "metadata": meta,
            "spec": {
                "containers": [{"name": container, "image": _image(settings)}],
                "restartPolicy": "OnFailure" if settings.mpi else "Never",
                **({"nodeName": node} if node else {}),
            },
            "status": {
                "phase": phase,
                **(
                    {"reason": "DeadlineExceeded"}
                    if stage == ENDED and settings.behavior is Behavior.HANG
                    else {}
                ),
                "containerStatuses": [{"name": container, **status}],
            },
        }
        built.append((pod, {container: log} if log is not None else {}))
    return built


def _image(settings: ProfileSettings) -> str:
    return f"ghcr.io/flux-framework/dwssim-{settings.behavior.value}:latest"


def _phase(status: Mapping[str, Any]) -> str:
    state = status.get("state") or {}
    if "terminated" in state:
        return "Succeeded" if state["terminated"].get("exitCode") == 0 else "Failed"
    return "Running" if "running" in state else "Pending"


def container_state(
    settings: ProfileSettings, role: str, stage: str
) -> tuple[dict[str, Any], str | None]:
    """The container's status entry and its log (None: it never started, so none); ``role``
    names the container in its log.  The kubelet beside nnf-sos (dwssim.kubelet) uses it too."""
    kind = settings.behavior
    if kind is Behavior.NEVER_START:
        return {"state": {"waiting": {"reason": "ContainerCreating"}}, "restartCount": 0}, None
    if kind is Behavior.START_FAIL:
        waiting = {
            "reason": "ErrImagePull",
            "message": f'failed to pull image "{_image(settings)}"',
        }
        return {"state": {"waiting": waiting}, "restartCount": 0}, None
    head = [f"{role}: starting"]
    if stage == STARTED:
        return {"state": {"running": {}}, "restartCount": 0}, "\n".join(head) + "\n"
    if kind is Behavior.OK:
        lines = head + [f"step {i} of {OK_LINES}: checksum ok" for i in range(1, OK_LINES + 1)]
        lines.append("done: exiting 0")
        return _ended(0, "Completed", 0), "\n".join(lines) + "\n"
    if kind is Behavior.EXIT_NONZERO:
        lines = head + [f"step {i}: ok" for i in range(1, 21)]
        lines.append(
            "ERROR: cannot open input /mnt/nnf/data/missing.dat: No such file or directory"
        )
        lines.append("exiting with status 1")
        return _ended(1, "Error", 0), "\n".join(lines) + "\n"
    if kind is Behavior.CRASH_LOOP:
        attempts = settings.retry_limit + 1
        lines = head + [
            f"attempt {attempts}: rank 0: loading model",
            "rank 0: Segmentation fault (core dumped)",
            "mpirun: rank 0 exited on signal 11 (Segmentation fault)",
        ]
        return _ended(139, "Error", settings.retry_limit), "\n".join(lines) + "\n"
    lines = head + [f"still working: step {i}" for i in range(1, 51)]  # hang, killed
    return _ended(137, "Error", 0), "\n".join(lines) + "\n"


def _ended(code: int, reason: str, restarts: int) -> dict[str, Any]:
    terminated = {"exitCode": code, "reason": reason}
    return {"state": {"terminated": terminated}, "restartCount": restarts, "ready": False}
