# SPDX-License-Identifier: LGPL-3.0-only
"""The rabbits' side of user containers beside nnf-sos: the scheduler and the kubelet.

nnf-sos runs a ``#DW container`` directive as a batch Job per rabbit or as an MPIJob, and
their controllers (``dwssim.jobcontrollers``) make the pods.  On a real system the scheduler
binds each pod to its rabbit and that rabbit's kubelet runs it; neither runs here, so these
pure functions play them, one step per call:

- ``schedule``: the node a pod asks for: its ``nodeSelector`` hostname (a container Job's pod,
  an MPI launcher), else the first of its required node affinity's hostnames that no pod of
  the same MPI job and role holds (the workers' anti-affinity);
- ``next_status``: Pending (the image being pulled), then Running and Ready with every init
  container Completed, then terminated with the container's exit code;
- ``on_deletion``: a deleted pod's containers stop (SIGTERM; a hung one is killed after the
  pod's grace period, 30 s by default) before the pod goes.

What a container does comes from its image, as on a real node: dwssim's images
(``ghcr.io/flux-framework/dwssim-<behaviour>:...``, made by ``containers.container_profile``)
behave as their ``Behavior`` says; any other image runs its command, read for a last
``exit N`` (nnf-sos's example profiles: ``sleep 10 && exit 1``) or a ``while true`` loop
(which hangs).  A container runs until the job's compute side is done: once the workflow's
desiredState is PostRun or later, nnf-sos asks the containers to shut down
(sendContainerShutdown), and then ``ok`` exits 0, ``exit-nonzero`` 1 and ``crash-loop``
segfaults (139); a retry that starts after that fails at once.  ``hang`` never exits (the
Job's deadline ends it), an MPI worker runs sshd until the MPI operator removes it,
``never-start`` stays ContainerCreating and ``start-fail`` ErrImagePull.  The logs are those
of dwssim's own container pods (``pods.container_state``).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping
from typing import Any

from flux_dws.core.states import State
from flux_dws.testing.dwssim.containers import Behavior, ProfileSettings
from flux_dws.testing.dwssim.pods import ENDED, STARTED, container_state

HOSTNAME_KEY = "kubernetes.io/hostname"
MPI_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
MPI_JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
WORKFLOW_NAME_LABEL = "dataworkflowservices.github.io/workflow.name"
WORKFLOW_NAMESPACE_LABEL = "dataworkflowservices.github.io/workflow.namespace"
#: Held by every pod the stand-in runs: a deleted pod stays (Terminating, as the API server
#: keeps it until its kubelet has stopped its containers) until ``on_deletion`` lets it go.
KUBELET_FINALIZER = "dwssim.flux-dws.flux-framework.org/kubelet"
#: a pod's spec.terminationGracePeriodSeconds when it sets none
GRACE_PERIOD = 30
#: desiredStates from which nnf-sos has asked a workflow's containers to shut down
SHUTDOWN_STATES = frozenset(s.value for s in State if s.index >= State.POSTRUN.index)

_DWSSIM_IMAGE = re.compile(r"/dwssim-([a-z-]+)(?::[^/]*)?$")
_EXIT = re.compile(r"\bexit\s+(\d+)\W*$")


def rfc3339(now: datetime.datetime) -> str:
    """A Kubernetes Time (seconds, UTC), as pod and Job statuses carry them."""
    return now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: object) -> datetime.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return parsed.replace(tzinfo=datetime.timezone.utc)


def behavior_of(container: Mapping[str, Any]) -> tuple[Behavior, int]:
    """What a container of this spec does, and the exit code it ends with (when it ends)."""
    found = _DWSSIM_IMAGE.search(str(container.get("image") or ""))
    if found:
        try:
            kind = Behavior(found.group(1))
        except ValueError:
            kind = Behavior.OK
        return kind, {Behavior.OK: 0, Behavior.CRASH_LOOP: 139, Behavior.HANG: 137}.get(kind, 1)
    script = " ".join(str(word) for word in [*(container.get("command") or [])])
    script += " " + " ".join(str(word) for word in container.get("args") or [])
    if "while true" in script:
        return Behavior.HANG, 137
    code = _EXIT.search(script.strip())
    if code and int(code.group(1)) != 0:
        return Behavior.EXIT_NONZERO, int(code.group(1))
    return Behavior.OK, 0


def schedule(pod: Mapping[str, Any], others: Iterable[Mapping[str, Any]]) -> str | None:
    """The node the scheduler binds ``pod`` to (None: none it may use, it stays Pending)."""
    spec = pod.get("spec") or {}
    wanted = (spec.get("nodeSelector") or {}).get(HOSTNAME_KEY)
    if wanted:
        return str(wanted)
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    hosts = [
        value
        for term in terms
        for expression in term.get("matchExpressions") or []
        if expression.get("key") == HOSTNAME_KEY and expression.get("operator") == "In"
        for value in expression.get("values") or []
    ]
    labels = (pod.get("metadata") or {}).get("labels") or {}
    group = (labels.get(MPI_JOB_NAME_LABEL), labels.get(MPI_JOB_ROLE_LABEL))
    taken = {
        (o.get("spec") or {}).get("nodeName")
        for o in others
        if ((o.get("metadata") or {}).get("labels") or {}).get(MPI_JOB_NAME_LABEL) == group[0]
        and ((o.get("metadata") or {}).get("labels") or {}).get(MPI_JOB_ROLE_LABEL) == group[1]
        and group[0]
    }
    free = [h for h in hosts if h not in taken]
    return free[0] if free else None


def shutting_down(workflow: Mapping[str, Any] | None) -> bool:
    """Whether nnf-sos has asked the workflow's containers to stop (or the workflow is gone)."""
    if workflow is None or (workflow.get("metadata") or {}).get("deletionTimestamp"):
        return True
    return (workflow.get("spec") or {}).get("desiredState") in SHUTDOWN_STATES


def _is_worker(pod: Mapping[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(MPI_JOB_ROLE_LABEL) == "worker"


def next_status(
    pod: Mapping[str, Any], shutdown: bool, now: datetime.datetime, attempt: int = 1
) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The kubelet's next status of a bound pod and the logs it writes ({container: text}),
    or (None, {}) when nothing changes.  ``attempt`` is the pod's place among its Job's pods
    (a crash-loop's log counts it)."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
        return None, {}
    stamp = rfc3339(now)
    containers = spec.get("containers") or []
    kinds = {c.get("name", ""): behavior_of(c) for c in containers}
    phase = status.get("phase")
    if phase is None:
        return _pending(pod, kinds, stamp), {}
    if phase == "Pending":
        if any(k in (Behavior.NEVER_START, Behavior.START_FAIL) for k, _ in kinds.values()):
            return None, {}
        return _running(pod, kinds, stamp, attempt)
    if phase != "Running" or not shutdown or _is_worker(pod):
        return None, {}
    return _ended(pod, kinds, stamp, attempt)


def on_deletion(
    pod: Mapping[str, Any], now: datetime.datetime
) -> tuple[dict[str, Any] | None, bool]:
    """The kubelet's step for a deleted (Terminating) pod: its final status, if it changes,
    and whether the pod may go.  Its containers get SIGTERM: a hung one ignores it and is
    killed (137) once the grace period (real seconds) is over; the others exit at once
    (143).  A pod that runs nothing goes at once."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return None, True
    spec = pod.get("spec") or {}
    grace = spec.get("terminationGracePeriodSeconds")
    grace = GRACE_PERIOD if not isinstance(grace, int) else grace
    deleted = parse_rfc3339((pod.get("metadata") or {}).get("deletionTimestamp")) or now
    kinds = {c.get("name", ""): behavior_of(c)[0] for c in spec.get("containers") or []}
    hung = any(k is Behavior.HANG for k in kinds.values())
    if hung and now < deleted + datetime.timedelta(seconds=grace):
        return None, False
    stamp = rfc3339(now)
    statuses = []
    for entry in status.get("containerStatuses") or []:
        code = 137 if kinds.get(entry.get("name")) is Behavior.HANG else 143
        started = ((entry.get("state") or {}).get("running") or {}).get("startedAt", stamp)
        terminated = {"exitCode": code, "reason": "Error", "startedAt": started}
        terminated["finishedAt"] = stamp
        statuses.append(dict(entry, ready=False, started=False, state={"terminated": terminated}))
    final = dict(status, phase="Failed", containerStatuses=statuses)
    final["conditions"] = _conditions(stamp, False, "PodFailed")
    return final, False


def _settings(kind: Behavior, attempt: int) -> ProfileSettings:
    return ProfileSettings(name="", behavior=kind, retry_limit=max(attempt - 1, 0))


def _conditions(stamp: str, ready: bool, reason: str = "") -> list[dict[str, Any]]:
    flag = "True" if ready else "False"
    extra = {"reason": reason} if reason else {}
    return [
        {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
        {"type": "Ready", "status": flag, "lastTransitionTime": stamp, **extra},
        {"type": "ContainersReady", "status": flag, "lastTransitionTime": stamp, **extra},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
    ]


def _init_statuses(pod: Mapping[str, Any], stamp: str, done: bool) -> list[dict[str, Any]]:
    statuses = []
    for init in (pod.get("spec") or {}).get("initContainers") or []:
        state: dict[str, Any] = (
            {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": stamp}}
            if done
            else {"waiting": {"reason": "PodInitializing"}}
        )
        statuses.append(
            {
                "name": init.get("name", ""),
                "image": init.get("image", ""),
                "ready": done,
                "restartCount": 0,
                "state": state,
            }
        )
    return statuses


def _pending(pod: Mapping[str, Any], kinds: Mapping[str, Any], stamp: str) -> dict[str, Any]:
    waiting = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        kind = kinds[c.get("name", "")][0]
        state, _ = container_state(_settings(kind, 1), c.get("name", ""), STARTED)
        if "waiting" not in state["state"]:
            state = {"state": {"waiting": {"reason": "ContainerCreating"}}}
        waiting.append(
            {
                "name": c.get("name", ""),
                "image": c.get("image", ""),
                "ready": False,
                "restartCount": 0,
                **state,
            }
        )
    return {
        "phase": "Pending",
        "hostIP": "10.0.0.1",
        "startTime": stamp,
        "qosClass": "BestEffort",
        "conditions": _conditions(stamp, False, "ContainersNotReady"),
        "initContainerStatuses": _init_statuses(pod, stamp, False),
        "containerStatuses": waiting,
    }


def _running(
    pod: Mapping[str, Any], kinds: Mapping[str, Any], stamp: str, attempt: int
) -> tuple[dict[str, Any], dict[str, str]]:
    status = dict(pod.get("status") or {})
    statuses, logs = [], {}
    for init in (pod.get("spec") or {}).get("initContainers") or []:
        logs[init.get("name", "")] = ""
    for c in (pod.get("spec") or {}).get("containers") or []:
        name = c.get("name", "")
        _, log = container_state(_settings(kinds[name][0], attempt), name, STARTED)
        logs[name] = log or ""
        statuses.append(
            {
                "name": name,
                "image": c.get("image", ""),
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": stamp}},
            }
        )
    status.update(
        phase="Running",
        podIP="10.1.0.1",
        conditions=_conditions(stamp, True),
        initContainerStatuses=_init_statuses(pod, stamp, True),
        containerStatuses=statuses,
    )
    return status, logs


def _ended(
    pod: Mapping[str, Any], kinds: Mapping[str, Any], stamp: str, attempt: int
) -> tuple[dict[str, Any] | None, dict[str, str]]:
    status = dict(pod.get("status") or {})
    statuses, logs, codes = [], {}, []
    running = {s.get("name"): s for s in status.get("containerStatuses") or []}
    for c in (pod.get("spec") or {}).get("containers") or []:
        name = c.get("name", "")
        kind, code = kinds[name]
        if kind is Behavior.HANG:
            return None, {}  # it runs on until something kills it
        state, log = container_state(_settings(kind, attempt), name, ENDED)
        terminated = dict(state["state"]["terminated"], exitCode=code)
        started = ((running.get(name) or {}).get("state") or {}).get("running") or {}
        terminated.update(startedAt=started.get("startedAt", stamp), finishedAt=stamp)
        codes.append(code)
        logs[name] = log or ""
        statuses.append(
            {
                "name": name,
                "image": c.get("image", ""),
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
        )
    ok = all(code == 0 for code in codes)
    status.update(
        phase="Succeeded" if ok else "Failed",
        conditions=_conditions(stamp, False, "PodCompleted" if ok else "PodFailed"),
        containerStatuses=statuses,
    )
    return status, logs
