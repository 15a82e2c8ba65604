# SPDX-License-Identifier: LGPL-3.0-only
"""Kubernetes' Job controller and the MPI operator, for the container jobs nnf-sos makes.

nnf-sos (``nnf_workflow_controller_container_helpers.go``) runs a ``#DW container`` as one
batch Job per rabbit, ``<workflow>-<rabbit>``, or as an MPIJob named after the workflow; it
then reads only their statuses: a Job's ``status.ready`` and ``conditions`` (PreRun: started
once ready >= 1 or finished; PostRun: finished once it has a condition, failed unless it is
Complete), an MPIJob's conditions (Running or Succeeded in PreRun, Succeeded or Failed in
PostRun) and its launcher Job's nodeSelector.  It ends a container job by setting the Job's
``activeDeadlineSeconds`` (PreRun's timeout, PostRun's) and deletes them in Teardown.  These
pure functions play the two controllers as nnf-sos builds against them (Kubernetes 1.28,
mpi-operator v2beta1 of 2023-02):

- ``sync_job``: one pod at a time from the template (``<job>-<5 letters>``, the template's
  labels plus ``batch.kubernetes.io/job-name`` and ``controller-uid``, owned by the Job);
  ``active``, ``ready``, ``succeeded``, ``failed``; a failed pod is replaced after the
  controller's back-off (10 s doubling, at most 6 min, times ``time_scale``) until more than
  ``backoffLimit`` have failed: then ``Failed`` (BackoffLimitExceeded, "Job has reached the
  specified backoff limit"); past ``activeDeadlineSeconds`` its running pods are deleted and
  it is ``Failed`` (DeadlineExceeded, "Job was active longer than specified deadline"); a pod
  that succeeds makes it ``Complete``.  Ended pods are kept (restartPolicy Never); a deleted
  one stops its containers before it goes (``kubelet.on_deletion``).
- ``sync_mpijob``: the Created condition, a worker pod per replica (``<name>-worker-<i>``) and
  the launcher Job (``<name>-launcher``, labelled ``app=<name>``), Running once the launcher
  and every worker run, Succeeded or Failed as the launcher Job ends (a back-off failure
  names the last failed launcher pod's reason), and the running workers deleted then
  (cleanPodPolicy Running).  Its ConfigMap, ssh Secret and Services are not made: nothing
  here resolves or connects to them.
"""

from __future__ import annotations

import datetime
import random
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flux_dws.testing.dwssim.kubelet import KUBELET_FINALIZER, parse_rfc3339, rfc3339

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
BACKOFF = 10.0  # seconds before the first retry; doubles per failure (DefaultJobBackOff)
MAX_BACKOFF = 360.0  # MaxJobBackOff
BACKOFF_LIMIT = 6  # a Job's default spec.backoffLimit
BACKOFF_MESSAGE = "Job has reached the specified backoff limit"
DEADLINE_MESSAGE = "Job was active longer than specified deadline"

MPI_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
MPI_JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
MPI_OPERATOR_LABEL = "training.kubeflow.org/operator-name"
MPI_REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"


@dataclass
class Sync:
    """What one pass of a controller does: objects to create, pods to delete, a new status."""

    pods: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # pod names, in the object's namespace
    status: dict[str, Any] | None = None  # None: unchanged


def owned_by(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    uid = (owner.get("metadata") or {}).get("uid")
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(r.get("uid") == uid and r.get("controller") for r in refs)


def controller_ref(owner: Mapping[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": owner.get("apiVersion", ""),
        "kind": owner.get("kind", ""),
        "name": meta["name"],
        "uid": meta.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _active(pod: Mapping[str, Any]) -> bool:
    """Pending or Running, and not being deleted (a terminating pod is not counted)."""
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    return _phase(pod) in ("Pending", "Running") and not deleting


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _finished_at(pod: Mapping[str, Any]) -> datetime.datetime | None:
    ends = [
        parse_rfc3339(((s.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for s in (pod.get("status") or {}).get("containerStatuses") or []
    ]
    found = [e for e in ends if e is not None]
    return max(found) if found else None


def _condition(kind: str, stamp: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "lastProbeTime": stamp,
        "lastTransitionTime": stamp,
        **({"reason": reason} if reason else {}),
        **({"message": message} if message else {}),
    }


def job_pod(job: Mapping[str, Any]) -> dict[str, Any]:
    """A new pod of ``job``'s template, as the Job controller creates it."""
    meta = job["metadata"]
    template = job.get("spec", {}).get("template") or {}
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    uid = meta.get("uid", "")
    for key, value in ((JOB_NAME_LABEL, meta["name"]), (CONTROLLER_UID_LABEL, uid)):
        labels[key] = labels[key.split("/")[1]] = value  # and the legacy job-name, controller-uid
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-{suffix}",
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
            "ownerReferences": [controller_ref(job)],
            "finalizers": [KUBELET_FINALIZER],
        },
        "spec": dict(template.get("spec") or {}),
    }


def job_finished(job: Mapping[str, Any]) -> str | None:
    """ "Complete" or "Failed" once the Job has ended, else None."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return None


def sync_job(
    job: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    now: datetime.datetime,
    time_scale: float = 1.0,
) -> Sync:
    """One pass of the Job controller over ``job`` and the pods it owns (all of them)."""
    sync = Sync()
    meta, spec = job.get("metadata") or {}, job.get("spec") or {}
    old = dict(job.get("status") or {})
    if meta.get("deletionTimestamp") or job_finished(job):
        return sync  # an ended Job is left as it ended
    stamp = rfc3339(now)
    status = dict(old)
    status.setdefault("startTime", stamp)
    active = [p for p in pods if _active(p)]
    failed = [p for p in pods if _phase(p) == "Failed"]
    succeeded = [p for p in pods if _phase(p) == "Succeeded"]
    deadline = spec.get("activeDeadlineSeconds")
    started = parse_rfc3339(status["startTime"]) or now
    end = None
    if succeeded:
        end = _condition("Complete", stamp)
        status["completionTime"] = stamp
    elif len(failed) > spec.get("backoffLimit", BACKOFF_LIMIT):
        end = _condition("Failed", stamp, "BackoffLimitExceeded", BACKOFF_MESSAGE)
    elif isinstance(deadline, int) and now >= started + datetime.timedelta(seconds=deadline):
        end = _condition("Failed", stamp, "DeadlineExceeded", DEADLINE_MESSAGE)
    elif not active and _backoff_over(failed, now, time_scale):
        sync.pods.append(job_pod(job))
    if end is not None:  # its pods still running are deleted (they count as failed)
        status["conditions"] = [*old.get("conditions", []), end]
        sync.delete = [p["metadata"]["name"] for p in active]
        active = []
    status.update(
        active=len(active) + len(sync.pods),
        ready=sum(1 for p in active if _ready(p)),
        failed=len(failed) + len(sync.delete),
        succeeded=len(succeeded),
    )
    for key in ("active", "failed", "succeeded"):
        if not status[key]:
            status.pop(key)
    sync.status = status if status != old else None
    return sync


def _backoff_over(
    failed: Sequence[Mapping[str, Any]], now: datetime.datetime, time_scale: float
) -> bool:
    """Whether the back-off after the last failed pod is over (no failure: no back-off)."""
    if not failed:
        return True
    last = max((_finished_at(p) for p in failed if _finished_at(p)), default=None)
    if last is None:
        return True
    delay = min(BACKOFF * 2 ** (len(failed) - 1), MAX_BACKOFF) * time_scale
    return now >= last + datetime.timedelta(seconds=delay)


# ---- the MPI operator ---------------------------------------------------------------------


def _mpi_condition(kind: str, stamp: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "lastUpdateTime": stamp,
        "lastTransitionTime": stamp,
        "reason": reason,
        "message": message,
    }


def _set_condition(conditions: list[dict[str, Any]], new: dict[str, Any]) -> list[dict[str, Any]]:
    """mpi-operator's setCondition: replace the type's entry (append), and a final
    condition turns Running (and an earlier Failed) False."""
    same = next((c for c in conditions if c.get("type") == new["type"]), None)
    if same and same.get("status") == new["status"] and same.get("reason") == new["reason"]:
        return conditions
    kept = []
    for c in conditions:
        if c.get("type") == new["type"]:
            continue
        if new["type"] in ("Succeeded", "Failed") and c.get("type") in ("Running", "Failed"):
            c = dict(c, status="False")
        kept.append(c)
    return [*kept, new]


def _replica_template(mpijob: Mapping[str, Any], role: str) -> dict[str, Any]:
    specs = (mpijob.get("spec") or {}).get("mpiReplicaSpecs") or {}
    return dict((specs.get(role) or {}).get("template") or {})


def mpi_worker(mpijob: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Worker pod ``index`` of an MPIJob, as mpi-operator's newWorker makes it."""
    meta = mpijob["metadata"]
    template = _replica_template(mpijob, "Worker")
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    labels.update(_mpi_labels(meta["name"], "worker"))
    labels[MPI_REPLICA_INDEX_LABEL] = str(index)
    name = f"{meta['name']}-worker-{index}"
    spec = dict(template.get("spec") or {}, hostname=name, subdomain=f"{meta['name']}-worker")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels,
            "ownerReferences": [controller_ref(mpijob)],
            "finalizers": [KUBELET_FINALIZER],
        },
        "spec": spec,
    }


def mpi_launcher(mpijob: Mapping[str, Any]) -> dict[str, Any]:
    """The launcher Job of an MPIJob, as mpi-operator's newLauncherJob makes it."""
    meta, spec = mpijob["metadata"], mpijob.get("spec") or {}
    run = spec.get("runPolicy") or {}
    template = _replica_template(mpijob, "Launcher")
    template_meta = dict(template.get("metadata") or {})
    template_meta["labels"] = {
        **(template_meta.get("labels") or {}),
        **_mpi_labels(meta["name"], "launcher"),
    }
    job_spec: dict[str, Any] = {"template": {**template, "metadata": template_meta}}
    for key in ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        if run.get(key) is not None:
            job_spec[key] = run[key]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{meta['name']}-launcher",
            "namespace": meta["namespace"],
            "labels": {"app": meta["name"]},
            "ownerReferences": [controller_ref(mpijob)],
        },
        "spec": job_spec,
    }


def _mpi_labels(name: str, role: str) -> dict[str, str]:
    return {MPI_OPERATOR_LABEL: "mpi-operator", MPI_JOB_NAME_LABEL: name, MPI_JOB_ROLE_LABEL: role}


def sync_mpijob(
    mpijob: Mapping[str, Any],
    launcher: Mapping[str, Any] | None,
    launcher_pods: Sequence[Mapping[str, Any]],
    workers: Sequence[Mapping[str, Any]],
    now: datetime.datetime,
) -> Sync:
    """One pass of mpi-operator's syncHandler over an MPIJob, its launcher Job (None: not
    made yet) and the pods of both."""
    sync = Sync()
    meta = mpijob.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return sync
    stamp = rfc3339(now)
    shown = f"{meta.get('namespace')}/{meta.get('name')}"
    old = dict(mpijob.get("status") or {})
    status = dict(old)
    conditions = list(old.get("conditions") or [])
    if not conditions:
        created = _mpi_condition("Created", stamp, "MPIJobCreated", f"MPIJob {shown} is created.")
        conditions = [created]
    done = any(
        c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True" for c in conditions
    )
    running_workers = [w for w in workers if _active(w) and _phase(w) == "Running"]
    if done and status.get("completionTime"):
        sync.delete = [w["metadata"]["name"] for w in workers if _active(w)]
        return sync
    status.setdefault("startTime", stamp)
    ended = job_finished(launcher) if launcher is not None else None
    if ended is None:
        replicas = (
            ((mpijob.get("spec") or {}).get("mpiReplicaSpecs") or {}).get("Worker") or {}
        ).get("replicas") or 0
        have = {w["metadata"]["name"] for w in workers}
        sync.pods = [
            mpi_worker(mpijob, i)
            for i in range(int(replicas))
            if f"{meta['name']}-worker-{i}" not in have
        ]
        if launcher is None:
            sync.jobs = [mpi_launcher(mpijob)]
    launching = sum(1 for p in launcher_pods if _phase(p) == "Running")
    replica = {"Launcher": {}, "Worker": {"active": len(running_workers)}}
    if ended == "Complete":
        replica["Launcher"] = {"succeeded": 1}
        status.setdefault("completionTime", (launcher.get("status") or {}).get("completionTime"))
        message = f"MPIJob {shown} successfully completed."
        conditions = _set_condition(
            conditions, _mpi_condition("Succeeded", stamp, "MPIJobSucceeded", message)
        )
    elif ended == "Failed":
        reason, message = _launcher_failure(launcher, launcher_pods, shown)
        replica["Launcher"] = {"failed": (launcher.get("status") or {}).get("failed", 0)}
        status.setdefault("completionTime", stamp)
        conditions = _set_condition(conditions, _mpi_condition("Failed", stamp, reason, message))
    elif launcher is not None and launching >= 1 and len(running_workers) == len(workers):
        replica["Launcher"] = {"active": launching}
        message = f"MPIJob {shown} is running."
        conditions = _set_condition(
            conditions, _mpi_condition("Running", stamp, "MPIJobRunning", message)
        )
    status.update(conditions=conditions, replicaStatuses=replica)
    sync.status = status if status != old else None
    return sync


def _launcher_failure(
    launcher: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], shown: str
) -> tuple[str, str]:
    """updateMPIJobFailedStatus: the launcher Job's Failed reason and message, and after a
    back-off failure the last failed launcher pod's reason and message appended."""
    failed = next(
        (
            c
            for c in (launcher.get("status") or {}).get("conditions") or []
            if c.get("type") == "Failed"
        ),
        {},
    )
    reason = failed.get("reason") or "MPIJobFailed"
    message = failed.get("message") or f"MPIJob {shown} has failed"
    if reason == "BackoffLimitExceeded":
        dead = [p for p in pods if _phase(p) == "Failed"]
        if dead:
            last = max(dead, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp", ""))
            reason += "/" + str((last.get("status") or {}).get("reason") or "")
            message += ": " + str((last.get("status") or {}).get("message") or "")
    return reason, message
