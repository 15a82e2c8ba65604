# SPDX-License-Identifier: LGPL-3.0-only
"""The Kubernetes that runs nnf-sos's container jobs: Job controller, MPI operator, kubelet.

Beside nnf-sos (``Stack(dws="real", nnf="sos")``) nothing else runs the batch Jobs and
MPIJobs it makes for a ``#DW container`` directive.  ``Workloads`` plays, in one thread, what
a cluster runs for them: the MPI operator and the Job controller (``jobcontrollers``), the
scheduler and each rabbit's kubelet (``kubelet``), which also writes each container's log
where kubeapi serves ``pods/log``.  Like a controller it is level-triggered: every ``tick``
it lists the Jobs, MPIJobs and the pods they own and moves each one step, so a write that
loses a race (409) or an object that is gone (404) is simply looked at again next time.
A deleted pod stays while its containers stop (``kubelet.on_deletion``: a hung one for
its grace period, in real seconds), as on a real node.  Pods that belong to no Job or
MPIJob are left alone.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from flux_dws.testing.dwssim import jobcontrollers as jc
from flux_dws.testing.dwssim import kubelet
from flux_dws.testing.dwssim.computemounts import Background
from flux_dws.testing.dwssim.writer import LOG
from flux_dws.testing.kubeapi.errors import ApiError
from flux_dws.testing.kubeapi.podlog import logs_of

TICK = 0.1  # seconds between passes


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


def _owner_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") in ("Job", "MPIJob"):
            return ref.get("uid")
    return None


class Workloads(Background):
    """Runs the container Jobs and MPIJobs of a kubeapi Store; back-off seconds count
    ``time_scale`` each (deadlines are real seconds: nnf-sos sets them from the clock)."""

    name = "workloads"

    def __init__(self, store: Any, time_scale: float = 1.0, tick: float = TICK) -> None:
        super().__init__(store)
        self._scale = time_scale
        self._tick = tick
        self._logs = logs_of(store)
        self._known: set[tuple[str, str]] = set()  # pods whose logs we wrote

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            try:
                self.step(datetime.datetime.now(datetime.timezone.utc))
            except Exception:  # the next pass looks again
                LOG.exception("%s: a pass failed", self.name)

    # ---- one pass ---------------------------------------------------------------------------

    def step(self, now: datetime.datetime) -> None:
        """One pass of every controller over what the store holds now."""
        self._mpijobs(now)
        self._jobs(now)
        self._nodes(now)

    def _list(self, plural: str) -> list[dict[str, Any]]:
        items, _ = self._store.list(plural, None, shared=True)
        return list(items)

    def _owned(self) -> dict[str, list[dict[str, Any]]]:
        """Pods by the uid of the Job or MPIJob that owns them."""
        owned: dict[str, list[dict[str, Any]]] = {}
        for pod in self._list("pods"):
            uid = _owner_uid(pod)
            if uid:
                owned.setdefault(uid, []).append(pod)
        return owned

    def _mpijobs(self, now: datetime.datetime) -> None:
        owned = self._owned()
        jobs = {_key(j): j for j in self._list("jobs")}
        for mpijob in self._list("mpijobs"):
            namespace, name = _key(mpijob)
            launcher = jobs.get((namespace, f"{name}-launcher"))
            if launcher is not None and not jc.owned_by(launcher, mpijob):
                continue  # not ours to drive (mpi-operator would refuse it too)
            uid = mpijob["metadata"].get("uid", "")
            launcher_pods = owned.get(launcher["metadata"].get("uid", ""), []) if launcher else []
            sync = jc.sync_mpijob(mpijob, launcher, launcher_pods, owned.get(uid, []), now)
            self._apply("mpijobs", mpijob, sync)

    def _jobs(self, now: datetime.datetime) -> None:
        owned = self._owned()
        for job in self._list("jobs"):
            pods = owned.get(job["metadata"].get("uid", ""), [])
            self._apply("jobs", job, jc.sync_job(job, pods, now, self._scale))

    def _apply(self, plural: str, obj: Mapping[str, Any], sync: jc.Sync) -> None:
        namespace, name = _key(obj)
        try:
            for pod in sync.pods:
                self._store.create("pods", namespace, pod)
            for job in sync.jobs:
                self._store.create("jobs", namespace, job)
            for pod_name in sync.delete:
                self._delete_pod(namespace, pod_name)
            if sync.status is not None:
                self._write_status(plural, obj, sync.status)
        except ApiError as exc:
            if exc.code not in (404, 409):
                raise

    def _write_status(self, plural: str, obj: Mapping[str, Any], status: dict[str, Any]) -> None:
        """Replace ``obj``'s status with ``status`` if ``obj`` has not changed since read."""
        meta = obj["metadata"]  # its resourceVersion: 409 Conflict if it has changed
        self._store.replace(plural, meta.get("namespace"), meta["name"], dict(obj, status=status))

    def _delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod: it terminates (``kubelet.on_deletion``) before it goes."""
        try:
            self._store.delete("pods", namespace, name)
        except ApiError as exc:
            if exc.code != 404:
                raise

    def _forget(self, namespace: str, name: str) -> None:
        self._logs.forget(namespace, name)
        self._known.discard((namespace, name))

    def _nodes(self, now: datetime.datetime) -> None:
        """The scheduler and the kubelets: bind each new pod, then move it one step."""
        pods = [p for p in self._list("pods") if _owner_uid(p)]
        present = {_key(p) for p in pods}
        for gone in self._known - present:
            self._forget(*gone)
        workflows: dict[tuple[str, str], Any] = {}
        owned = self._owned()
        for pod in pods:
            namespace, name = _key(pod)
            try:
                if (pod.get("metadata") or {}).get("deletionTimestamp"):
                    self._terminate(pod, now)
                    continue
                if not (pod.get("spec") or {}).get("nodeName"):
                    node = kubelet.schedule(pod, pods)
                    if node is not None:
                        spec = {"spec": {"nodeName": node}}
                        pod = self._store.patch("pods", namespace, name, spec, shared=True)
                        pods = [pod if _key(p) == (namespace, name) else p for p in pods]
                    continue
                siblings = owned.get(_owner_uid(pod) or "", [])
                order = sorted(siblings, key=lambda p: p["metadata"].get("creationTimestamp", ""))
                attempt = 1 + [_key(p) for p in order].index((namespace, name))
                shutdown = kubelet.shutting_down(self._workflow(pod, workflows))
                status, logs = kubelet.next_status(pod, shutdown, now, attempt)
                if status is None:
                    continue
                for container, text in logs.items():
                    self._logs.write(namespace, name, container, text)
                    self._known.add((namespace, name))
                self._write_status("pods", pod, status)
            except ApiError as exc:
                if exc.code not in (404, 409):
                    raise

    def _terminate(self, pod: dict[str, Any], now: datetime.datetime) -> None:
        """A deleted pod's containers stop; then the kubelet lets the pod go."""
        status, release = kubelet.on_deletion(pod, now)
        if status is not None:
            self._write_status("pods", pod, status)
        elif release:
            meta = pod["metadata"]
            held = [f for f in meta.get("finalizers") or [] if f != kubelet.KUBELET_FINALIZER]
            patch = {"metadata": {"finalizers": held, "resourceVersion": meta["resourceVersion"]}}
            self._store.patch("pods", meta["namespace"], meta["name"], patch)

    def _workflow(
        self, pod: Mapping[str, Any], cache: dict[tuple[str, str], Any]
    ) -> Mapping[str, Any] | None:
        """The workflow whose container ``pod`` runs (its labels name it), or None."""
        labels = (pod.get("metadata") or {}).get("labels") or {}
        key = (
            labels.get(kubelet.WORKFLOW_NAMESPACE_LABEL, ""),
            labels.get(kubelet.WORKFLOW_NAME_LABEL, ""),
        )
        if key not in cache:
            try:
                cache[key] = self._store.get("workflows", key[0], key[1], shared=True)
            except ApiError:
                cache[key] = None
        return cache[key]
