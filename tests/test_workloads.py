# SPDX-License-Identifier: LGPL-3.0-only
"""The Kubernetes that runs nnf-sos's container jobs in the test bed (no binaries needed).

flux_dws.testing.dwssim.workloads plays the Job controller, the MPI operator, the scheduler
and the rabbits' kubelets (jobcontrollers, kubelet); kubeapi serves the Service nnf-sos makes
and decodes the protobuf bodies controller-runtime sends for built-in kinds.  The same runs
with nnf-sos itself in tests/test_nnf_sos_containers.py.
"""

from __future__ import annotations

import datetime

import pytest
from waiting import wait_for

from flux_dws.testing.dwssim import jobcontrollers as jc
from flux_dws.testing.dwssim import kubelet
from flux_dws.testing.dwssim.containers import Behavior, container_profile
from flux_dws.testing.dwssim.workloads import Workloads
from flux_dws.testing.kubeapi import ApiError, Store, protobuf
from flux_dws.testing.kubeapi.podlog import logs_of

T0 = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
WORKFLOW_LABELS = {
    kubelet.WORKFLOW_NAME_LABEL: "wf",
    kubelet.WORKFLOW_NAMESPACE_LABEL: "default",
    "nnf.cray.hpe.com/container": "wf",
}


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def job(name="wf-rabbit-0", backoff=6, deadline=None, image="dwssim-ok", status=None) -> dict:
    """A container Job as nnf-sos's createNonMPIJob makes it (stored: uid, apiVersion)."""
    spec = {
        "backoffLimit": backoff,
        "template": {
            "metadata": {"labels": dict(WORKFLOW_LABELS)},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {kubelet.HOSTNAME_KEY: "rabbit-0"},
                "initContainers": [{"name": "user-init-passwd", "image": "x"}],
                "containers": [{"name": "app", "image": f"ghcr.io/flux-framework/{image}:1"}],
            },
        },
    }
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": spec,
        "status": status or {},
    }


def ended(pod: dict, phase: str, seconds: float) -> dict:
    finished = {
        "exitCode": 0 if phase == "Succeeded" else 1,
        "finishedAt": kubelet.rfc3339(at(seconds)),
    }
    return {
        **pod,
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": "app", "state": {"terminated": finished}}],
        },
    }


def with_status(obj: dict, sync: jc.Sync) -> dict:
    return {**obj, "status": sync.status if sync.status is not None else obj.get("status", {})}


# ---- the Job controller ----------------------------------------------------------------------


def test_a_job_runs_one_pod_of_its_template_and_counts_it_ready():
    first = jc.sync_job(job(), [], at(0))
    [pod] = first.pods
    labels = pod["metadata"]["labels"]
    assert labels[jc.JOB_NAME_LABEL] == labels["job-name"] == "wf-rabbit-0"
    assert labels["nnf.cray.hpe.com/container"] == "wf"  # the service's pod watch finds it
    assert pod["metadata"]["name"].startswith("wf-rabbit-0-")
    [owner] = pod["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Job", "uid-wf-rabbit-0", True)
    assert first.status == {"startTime": kubelet.rfc3339(at(0)), "active": 1, "ready": 0}
    running = {
        **pod,
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    again = jc.sync_job(with_status(job(), first), [running], at(1))
    assert again.pods == [] and again.status["ready"] == 1  # nnf-sos's PreRun: started
    done = jc.sync_job(with_status(job(), again), [ended(pod, "Succeeded", 2)], at(2))
    assert [c["type"] for c in done.status["conditions"]] == ["Complete"]
    assert done.status["succeeded"] == 1 and "active" not in done.status


def test_a_failing_pod_is_retried_after_the_back_off_until_the_backoff_limit():
    """BackoffLimitExceeded once more than backoffLimit pods failed, as Kubernetes 1.28 words it
    (nnf-sos: 'container job Failed (BackoffLimitExceeded): Job has reached ...')."""
    [pod] = jc.sync_job(job(backoff=1), [], at(0)).pods
    failed = [ended(pod, "Failed", 10)]
    assert jc.sync_job(job(backoff=1), failed, at(15)).pods == []  # backing off: 10 s
    [retry] = jc.sync_job(job(backoff=1), failed, at(20)).pods
    scaled = jc.sync_job(job(backoff=1), failed, at(10.1), time_scale=0.01)
    assert len(scaled.pods) == 1  # the back-off counts time_scale seconds
    both = [*failed, ended(retry, "Failed", 21)]
    last = jc.sync_job(job(backoff=1), both, at(60))
    assert last.pods == []
    [condition] = last.status["conditions"]
    assert (condition["type"], condition["reason"], condition["message"]) == (
        "Failed",
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    )
    assert last.status["failed"] == 2
    assert jc.sync_job(job(backoff=0), failed, at(60)).status["conditions"][0]["type"] == "Failed"


def test_a_job_past_its_deadline_fails_and_its_running_pod_is_deleted():
    """nnf-sos ends a container job by setting activeDeadlineSeconds (PreRun's and PostRun's
    timeouts); the Job controller deletes its pods: their logs are gone with them."""
    status = {"startTime": kubelet.rfc3339(at(0)), "active": 1, "ready": 1}
    [pod] = jc.sync_job(job(), [], at(0)).pods
    running = {**pod, "status": {"phase": "Running"}}
    assert jc.sync_job(job(deadline=30, status=status), [running], at(29)).delete == []
    late = jc.sync_job(job(deadline=30, status=status), [running], at(30))
    assert late.delete == [pod["metadata"]["name"]]
    [condition] = late.status["conditions"]
    assert (condition["reason"], condition["message"]) == (
        "DeadlineExceeded",
        "Job was active longer than specified deadline",
    )


# ---- the kubelet -----------------------------------------------------------------------------


SH = ["/bin/sh", "-c"]


@pytest.mark.parametrize(
    "container, kind, code",
    [
        ({"image": "ghcr.io/flux-framework/dwssim-exit-nonzero:latest"}, Behavior.EXIT_NONZERO, 1),
        ({"image": "ghcr.io/flux-framework/dwssim-crash-loop:latest"}, Behavior.CRASH_LOOP, 139),
        ({"image": "ghcr.io/flux-framework/dwssim-ok:latest"}, Behavior.OK, 0),
        # nnf-sos's config/examples: example-success, example-fail, example-forever
        ({"image": "alpine", "command": [*SH, "sleep 10 && exit 0"]}, Behavior.OK, 0),
        ({"image": "alpine", "command": [*SH, "sleep 10 && exit 3"]}, Behavior.EXIT_NONZERO, 3),
        ({"image": "alpine", "command": [*SH, "while true; do date; done"]}, Behavior.HANG, 137),
    ],
)
def test_what_a_container_does_comes_from_its_image_or_command(container, kind, code):
    assert kubelet.behavior_of(container) == (kind, code)


def pod_of(image: str, **labels: str) -> dict:
    [pod] = jc.sync_job(job(image=image), [], at(0)).pods
    pod["metadata"]["labels"].update(labels)
    return {**pod, "spec": {**pod["spec"], "nodeName": "rabbit-0"}}


def steps(pod: dict, shutdown_at: int, count: int = 4) -> list[str | None]:
    """The pod's phase after each kubelet step; nnf-sos asks it to stop from step shutdown_at."""
    phases = []
    for i in range(count):
        status, _ = kubelet.next_status(pod, i >= shutdown_at, at(i))
        if status is not None:
            pod = {**pod, "status": status}
        phases.append(pod.get("status", {}).get("phase"))
    return phases


@pytest.mark.parametrize(
    "image, phases",
    [
        ("dwssim-ok", ["Pending", "Running", "Running", "Succeeded"]),
        ("dwssim-exit-nonzero", ["Pending", "Running", "Running", "Failed"]),
        ("dwssim-hang", ["Pending", "Running", "Running", "Running"]),
        ("dwssim-never-start", ["Pending"] * 4),
        ("dwssim-start-fail", ["Pending"] * 4),
    ],
)
def test_a_container_runs_until_nnf_sos_asks_it_to_stop(image, phases):
    assert steps(pod_of(image), shutdown_at=3) == phases


def test_an_mpi_worker_runs_sshd_until_the_operator_removes_it():
    worker = pod_of("dwssim-exit-nonzero", **{kubelet.MPI_JOB_ROLE_LABEL: "worker"})
    assert steps(worker, shutdown_at=0)[-1] == "Running"


def test_the_kubelet_reports_exit_code_and_log_as_the_service_reads_them():
    from flux_dws.core.output import pod_containers

    pod = pod_of("dwssim-exit-nonzero")
    pending, _ = kubelet.next_status(pod, False, at(0))
    waiting = pod_containers({**pod, "status": pending})
    assert [(c.name, c.state, c.reason) for c in waiting] == [
        ("user-init-passwd", "waiting", "PodInitializing"),
        ("app", "waiting", "ContainerCreating"),
    ]
    running, logs = kubelet.next_status({**pod, "status": pending}, False, at(1))
    assert logs == {"user-init-passwd": "", "app": "app: starting\n"}
    final, logs = kubelet.next_status({**pod, "status": running}, True, at(2))
    states = pod_containers({**pod, "status": final})
    assert [(c.name, c.state, c.exit_code) for c in states] == [
        ("user-init-passwd", "terminated", 0),
        ("app", "terminated", 1),
    ]
    assert "exiting with status 1" in logs["app"]
    never, _ = kubelet.next_status(pod_of("dwssim-start-fail"), False, at(0))
    assert never["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"


def test_a_deleted_pod_stops_its_containers_a_hung_one_after_the_grace_period():
    """SIGTERM: a container that exits on it ends with 143 at once; a hung one is killed (137)
    once the pod's grace period (30 s unless it says) is over; a pod not running goes."""
    deleted = {"deletionTimestamp": kubelet.rfc3339(at(0))}
    for image, code, wait in (("dwssim-ok", 143, 0), ("dwssim-hang", 137, 30)):
        pod = pod_of(image)
        pod["metadata"].update(deleted)
        for i in range(2):
            status, _ = kubelet.next_status(pod, False, at(i))
            pod = {**pod, "status": status}
        assert pod["status"]["phase"] == "Running"
        if wait:
            assert kubelet.on_deletion(pod, at(wait - 1)) == (None, False)  # still stopping
        final, release = kubelet.on_deletion(pod, at(wait))
        assert final["phase"] == "Failed" and not release
        (app,) = final["containerStatuses"]
        assert app["state"]["terminated"]["exitCode"] == code
        assert kubelet.on_deletion({**pod, "status": final}, at(wait)) == (None, True)
    assert kubelet.on_deletion(pod_of("dwssim-never-start"), at(0)) == (None, True)


def test_shutdown_is_the_workflow_reaching_postrun():
    assert not kubelet.shutting_down({"spec": {"desiredState": "PreRun"}})
    assert kubelet.shutting_down({"spec": {"desiredState": "PostRun"}})
    assert kubelet.shutting_down({"spec": {"desiredState": "Teardown"}})
    assert kubelet.shutting_down(None)  # gone


def test_the_scheduler_binds_each_worker_to_a_rabbit_of_its_own():
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": kubelet.HOSTNAME_KEY,
                                "operator": "In",
                                "values": ["rabbit-0", "rabbit-1"],
                            }
                        ]
                    }
                ]
            }
        }
    }
    labels = {kubelet.MPI_JOB_NAME_LABEL: "wf", kubelet.MPI_JOB_ROLE_LABEL: "worker"}
    worker = {"metadata": {"labels": labels}, "spec": {"affinity": affinity}}
    assert kubelet.schedule(worker, []) == "rabbit-0"
    held = {"metadata": {"labels": labels}, "spec": {"nodeName": "rabbit-0"}}
    assert kubelet.schedule(worker, [held]) == "rabbit-1"
    assert kubelet.schedule(worker, [held, {**held, "spec": {"nodeName": "rabbit-1"}}]) is None
    launcher = {"spec": {"nodeSelector": {kubelet.HOSTNAME_KEY: "rabbit-1"}}}
    assert kubelet.schedule(launcher, [held]) == "rabbit-1"


# ---- the MPI operator ------------------------------------------------------------------------


def mpijob(workers: int = 2) -> dict:
    """An MPIJob as nnf-sos's createMPIJob makes it (from a dwssim crash-loop profile)."""
    profile = container_profile("loop", "crash-loop")["data"]["mpiSpec"]
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": "wf", "namespace": "default", "uid": "uid-wf"},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 6},
            "mpiReplicaSpecs": {
                "Launcher": {
                    "template": {
                        "metadata": {"labels": dict(WORKFLOW_LABELS)},
                        "spec": {
                            **profile["launcher"],
                            "nodeSelector": {kubelet.HOSTNAME_KEY: "rabbit-0"},
                        },
                    }
                },
                "Worker": {
                    "replicas": workers,
                    "template": {
                        "metadata": {"labels": dict(WORKFLOW_LABELS)},
                        "spec": profile["worker"],
                    },
                },
            },
        },
    }


def test_an_mpijob_gets_its_workers_and_launcher_job_and_runs_once_they_run():
    first = jc.sync_mpijob(mpijob(), None, [], [], at(0))
    assert [c["type"] for c in first.status["conditions"]] == ["Created"]
    assert [p["metadata"]["name"] for p in first.pods] == ["wf-worker-0", "wf-worker-1"]
    assert first.pods[1]["metadata"]["labels"][jc.MPI_REPLICA_INDEX_LABEL] == "1"
    [launcher] = first.jobs
    # nnf-sos finds the launcher Job by this label and its owner, to read its rabbit
    assert launcher["metadata"]["labels"] == {"app": "wf"}
    assert launcher["metadata"]["ownerReferences"][0]["uid"] == "uid-wf"
    assert launcher["spec"]["backoffLimit"] == 6
    template = launcher["spec"]["template"]
    assert template["metadata"]["labels"][jc.MPI_JOB_ROLE_LABEL] == "launcher"
    assert template["metadata"]["labels"]["nnf.cray.hpe.com/container"] == "wf"
    stored = {**launcher, "metadata": {**launcher["metadata"], "uid": "uid-l"}}
    workers = [{**p, "status": {"phase": "Running"}} for p in first.pods]
    running = jc.sync_mpijob(
        with_status(mpijob(), first), stored, [{"status": {"phase": "Running"}}], workers, at(1)
    )
    assert [c["type"] for c in running.status["conditions"]] == ["Created", "Running"]
    assert running.status["conditions"][1]["message"] == "MPIJob default/wf is running."


def test_an_mpijob_fails_as_its_launcher_job_does_and_its_workers_go():
    failed = {
        "conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit"}
        ],
        "failed": 7,
    }  # fmt: skip
    launcher = {**jc.mpi_launcher(mpijob()), "status": failed}
    dead = [{"metadata": {"creationTimestamp": "t"}, "status": {"phase": "Failed"}}]
    workers = [{**jc.mpi_worker(mpijob(), i), "status": {"phase": "Running"}} for i in range(2)]
    created = jc.sync_mpijob(mpijob(), None, [], [], at(0)).status
    sync = jc.sync_mpijob({**mpijob(), "status": created}, launcher, dead, workers, at(5))
    condition = sync.status["conditions"][-1]
    # updateMPIJobFailedStatus appends the last failed pod's (empty) reason and message:
    # nnf-sos then says "container MPIJob Failed (BackoffLimitExceeded/): Job has ... limit: "
    assert (condition["type"], condition["reason"], condition["message"]) == (
        "Failed",
        "BackoffLimitExceeded/",
        "Job has reached the specified backoff limit: ",
    )
    cleanup = jc.sync_mpijob({**mpijob(), "status": sync.status}, launcher, dead, workers, at(6))
    assert sorted(cleanup.delete) == ["wf-worker-0", "wf-worker-1"]  # cleanPodPolicy Running


# ---- all of them against a store -------------------------------------------------------------


def test_workloads_run_a_job_to_the_end_with_its_logs_and_gc_takes_the_pods():
    store = Store(webhooks=False)
    made = store.create("jobs", "default", job(backoff=0))

    def workflow_state(state: str) -> None:
        spec = {"desiredState": state}
        try:
            store.patch("workflows", "default", "wf", {"spec": spec})
        except ApiError:
            store.create("workflows", "default", {"metadata": {"name": "wf"}, "spec": spec})

    workflow_state("PreRun")
    runner = Workloads(store, time_scale=0.0)
    for i in range(4):  # Job: a pod; scheduler: bound; kubelet: Pending, Running; Job: ready
        runner.step(at(i))
    [pod] = store.list("pods", "default")[0]
    assert pod["status"]["phase"] == "Running"
    assert store.get("jobs", "default", "wf-rabbit-0")["status"]["ready"] == 1
    workflow_state("PostRun")
    runner.step(at(4))
    runner.step(at(5))
    [pod] = store.list("pods", "default")[0]
    assert pod["status"]["phase"] == "Succeeded"
    assert (
        store.get("jobs", "default", "wf-rabbit-0")["status"]["conditions"][0]["type"] == "Complete"
    )
    log = logs_of(store).read("default", pod["metadata"]["name"], "app")
    assert log.endswith(b"done: exiting 0\n")
    store.delete("jobs", "default", made["metadata"]["name"])  # nnf-sos's Teardown
    [pod] = store.list("pods", "default")[0]  # the garbage collector deleted it: Terminating
    assert pod["metadata"]["deletionTimestamp"]
    runner.step(at(6))  # the kubelet has nothing to stop: the pod goes
    assert store.list("pods", "default")[0] == []
    runner.step(at(7))
    assert logs_of(store).read("default", pod["metadata"]["name"], "app") is None


def test_workloads_run_in_a_thread_and_stop():
    store = Store()
    runner = Workloads(store, tick=0.01).start()
    try:
        store.create("jobs", "default", job())
        wait_for(lambda: store.list("pods", "default")[0], "a pod", 10)
    finally:
        runner.stop()


# ---- what kubeapi serves for them ------------------------------------------------------------


def varint(value: int) -> bytes:
    out = b""
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def field(number: int, value: int | str | bytes) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    data = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(data)) + data


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = field(1, api_version) + field(2, kind)
    return protobuf.MAGIC + field(1, type_meta) + field(2, raw)


def test_a_job_nnf_sos_sends_as_protobuf_is_decoded_with_its_pod_template():
    """controller-runtime sends built-in kinds as protobuf; a retryLimit of 0 is a backoffLimit
    of 0 (a pointer in Go), not an absent one."""
    env = field(1, "NNF_NODE_NAME") + field(3, field(1, field(1, "v1") + field(2, "spec.nodeName")))
    container = b"".join(
        [
            field(1, "app"),
            field(2, "alpine:latest"),
            field(3, "/bin/sh"),
            field(3, "-c"),
            field(7, env),
            field(9, field(1, "passwd") + field(3, "/etc/passwd") + field(4, "passwd")),
            field(15, field(4, 1001) + field(5, 1) + field(7, 0)),
        ]
    )
    volume = field(1, "host") + field(2, field(1, field(1, "/mnt/nnf/x") + field(2, "Directory")))
    secret = field(1, "tls") + field(2, field(6, field(1, "nnf-dm-usercontainer-server-tls")))
    labels = field(11, field(1, "nnf.cray.hpe.com/container") + field(2, "wf"))
    spec = b"".join(
        [
            field(1, volume),
            field(1, secret),
            field(2, container),
            field(3, "Never"),
            field(7, field(1, kubelet.HOSTNAME_KEY) + field(2, "rabbit-0")),
            field(14, field(5, 100)),
            field(16, "rabbit-0"),
            field(17, "wf"),
            field(22, field(1, "cray.nnf.node") + field(2, "Equal") + field(3, "true")),
        ]
    )
    job_spec = field(7, 0) + field(6, field(1, labels) + field(2, spec)) + field(3, 42)
    raw = field(1, field(1, "wf-rabbit-0") + field(3, "default")) + field(2, job_spec)
    decoded = protobuf.decode(envelope("batch/v1", "Job", raw))
    assert decoded["apiVersion"] == "batch/v1" and decoded["metadata"]["name"] == "wf-rabbit-0"
    spec = decoded["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (0, 42)
    pod = spec["template"]["spec"]
    assert spec["template"]["metadata"]["labels"] == {"nnf.cray.hpe.com/container": "wf"}
    assert pod["volumes"] == [
        {"name": "host", "hostPath": {"path": "/mnt/nnf/x", "type": "Directory"}},
        {"name": "tls", "secret": {"secretName": "nnf-dm-usercontainer-server-tls"}},
    ]
    [app] = pod["containers"]
    assert app["command"] == ["/bin/sh", "-c"]
    node = {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}
    assert app["env"] == [{"name": "NNF_NODE_NAME", "valueFrom": node}]
    assert app["volumeMounts"] == [
        {"name": "passwd", "mountPath": "/etc/passwd", "subPath": "passwd"}
    ]
    assert app["securityContext"] == {
        "runAsUser": 1001,
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
    }
    assert pod["securityContext"] == {"fsGroup": 100}
    assert (pod["hostname"], pod["subdomain"], pod["restartPolicy"]) == ("rabbit-0", "wf", "Never")
    assert pod["tolerations"] == [{"key": "cray.nnf.node", "operator": "Equal", "value": "true"}]
    assert pod["nodeSelector"] == {kubelet.HOSTNAME_KEY: "rabbit-0"}


def test_delete_options_and_a_headless_service_as_protobuf():
    options = protobuf.decode(envelope("batch/v1", "DeleteOptions", field(4, "Background")))
    assert options["propagationPolicy"] == "Background"
    selector = field(2, field(1, "nnf.cray.hpe.com/container") + field(2, "wf"))
    raw = field(1, field(1, "wf")) + field(2, selector + field(3, "None"))
    service = protobuf.decode(envelope("v1", "Service", raw))
    assert service["spec"] == {
        "selector": {"nnf.cray.hpe.com/container": "wf"},
        "clusterIP": "None",
    }


def test_the_headless_service_nnf_sos_makes_goes_with_its_workflow(k8s_client, kubeapi):
    """nnf-sos's createContainerService: a headless Service named after the workflow, owned by
    it, selecting the container pods; the garbage collector takes it with the workflow."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_client)
    body = {"wlmID": "x", "jobID": 1, "userID": 1, "groupID": 1, "dwDirectives": [],
            "desiredState": "Proposal"}  # fmt: skip
    wf = kubeapi.store.create("workflows", "default", {"metadata": {"name": "wf"}, "spec": body})
    owner = {"apiVersion": wf["apiVersion"], "kind": "Workflow", "name": "wf",
             "uid": wf["metadata"]["uid"], "controller": True}  # fmt: skip
    service = {
        "metadata": {"name": "wf", "ownerReferences": [owner]},
        "spec": {"clusterIP": "None", "selector": {"nnf.cray.hpe.com/container": "wf"}},
    }
    core.create_namespaced_service("default", service)
    got = core.read_namespaced_service("wf", "default")
    assert (got.spec.cluster_ip, got.spec.selector) == (
        "None",
        {"nnf.cray.hpe.com/container": "wf"},
    )
    kubeapi.store.delete("workflows", "default", "wf")
    assert core.list_namespaced_service("default").items == []
