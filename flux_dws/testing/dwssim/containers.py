# SPDX-License-Identifier: LGPL-3.0-only
"""User containers: NnfContainerProfiles, their simulated behaviours, and nnf-sos's verdicts.

A profile made by the simulator carries the annotation ``BEHAVIOR_ANNOTATION`` saying what
its containers do; the timeouts, retry limit and port count come from the profile's ``data``
as nnf-sos reads them (dws-api.md section 4).  The verdict for each state is a pure function
of the profile, the time spent in the state and the job's nodes, worded as nnf-sos words it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from flux_dws.core.directives import Directive
from flux_dws.testing.dwssim.companions import api_object
from flux_dws.testing.dwssim.outcomes import (
    FATAL,
    USER,
    WLM,
    Complete,
    Fail,
    Outcome,
    ResourceError,
    Wait,
    fatal,
)

BEHAVIOR_ANNOTATION = "dwssim.flux-dws.flux-framework.org/behavior"
PROFILE_NAMESPACE = "nnf-system"
PROFILE_PLURAL = "nnfcontainerprofiles"

DEFAULT_PRERUN_TIMEOUT = 300
DEFAULT_POSTRUN_TIMEOUT = 300
DEFAULT_RETRY_LIMIT = 6


class Behavior(str, Enum):
    """What the containers of a profile do once launched."""

    OK = "ok"  # start, run, exit 0 when PostRun asks them to stop
    EXIT_NONZERO = "exit-nonzero"  # start, then exit 1 in PostRun
    CRASH_LOOP = "crash-loop"  # fail every attempt, retryLimit + 1 times
    NEVER_START = "never-start"  # stay initializing: the PreRun timeout fires
    HANG = "hang"  # start, never exit: the PostRun timeout fires
    # cannot start at all: its pods wait in ErrImagePull, and nnf-sos, which has no check of
    # its own for that, fails PreRun at the profile's timeout as for never-start
    START_FAIL = "start-fail"


#: A profile restricted to this UserID is seeded as "restricted".
RESTRICTED_USER_ID = 4242

#: The profiles ``seed`` creates in nnf-system: name -> behaviour.
PROFILES: Mapping[str, Behavior] = {
    "ok": Behavior.OK,
    "red-rock-slushy": Behavior.OK,
    "with-ports": Behavior.OK,
    "restricted": Behavior.OK,
    "exit-nonzero": Behavior.EXIT_NONZERO,
    "crash-loop": Behavior.CRASH_LOOP,
    "never-start": Behavior.NEVER_START,
    "hang": Behavior.HANG,
    "start-fail": Behavior.START_FAIL,
}
#: data overrides of the seeded profiles that are not plain examples of their behaviour.
PROFILE_DATA: Mapping[str, Mapping[str, Any]] = {
    "with-ports": {"numPorts": 2},
    "restricted": {"userID": RESTRICTED_USER_ID},
}


@dataclass(frozen=True)
class ProfileSettings:
    """What nnf-sos reads from an NnfContainerProfile, plus the simulated behaviour."""

    name: str
    behavior: Behavior = Behavior.OK
    prerun_timeout: int = DEFAULT_PRERUN_TIMEOUT  # seconds; 0 disables
    postrun_timeout: int = DEFAULT_POSTRUN_TIMEOUT  # seconds; 0: do not wait or check exit
    retry_limit: int = DEFAULT_RETRY_LIMIT
    num_ports: int = 0
    user_id: int | None = None
    group_id: int | None = None
    mpi: bool = False

    @classmethod
    def from_profile(cls, profile: Mapping[str, Any]) -> ProfileSettings:
        """Read a profile object; ValueError names a field that cannot be used."""
        meta = profile.get("metadata") or {}
        data = profile.get("data") or {}
        behavior = (meta.get("annotations") or {}).get(BEHAVIOR_ANNOTATION, Behavior.OK.value)
        try:
            parsed = Behavior(behavior)
        except ValueError:
            known = ", ".join(b.value for b in Behavior)
            raise ValueError(
                f"annotation {BEHAVIOR_ANNOTATION}={behavior!r} is not one of {known}"
            ) from None
        return cls(
            name=str(meta.get("name", "")),
            behavior=parsed,
            prerun_timeout=_count(data, "preRunTimeoutSeconds", DEFAULT_PRERUN_TIMEOUT),
            postrun_timeout=_count(data, "postRunTimeoutSeconds", DEFAULT_POSTRUN_TIMEOUT),
            retry_limit=_count(data, "retryLimit", DEFAULT_RETRY_LIMIT),
            num_ports=_count(data, "numPorts", 0),
            user_id=_optional_id(data, "userID"),
            group_id=_optional_id(data, "groupID"),
            mpi=data.get("mpiSpec") is not None,
        )


def _count(data: Mapping[str, Any], key: str, default: int) -> int:
    value = data.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"data.{key}={value!r} is not a non-negative integer")
    return value


def _optional_id(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    return None if value is None else _count(data, key, 0)


def container_profile(
    name: str,
    behavior: Behavior | str = Behavior.OK,
    *,
    namespace: str = PROFILE_NAMESPACE,
    mpi: bool | None = None,
    **data: Any,
) -> dict[str, Any]:
    """An NnfContainerProfile object whose containers behave as ``behavior``.

    ``data`` overrides the profile's data fields (preRunTimeoutSeconds, retryLimit, numPorts,
    userID, ...).  The crash-loop behaviour is an MPI profile unless ``mpi`` says otherwise,
    since that is where nnf-sos reports retries.
    """
    kind = Behavior(behavior)
    use_mpi = kind is Behavior.CRASH_LOOP if mpi is None else mpi
    container = {
        "name": f"{name}-app",
        "image": f"ghcr.io/flux-framework/dwssim-{kind.value}:latest",
        "command": ["/bin/sh", "-c", f"exec dwssim-container --behavior={kind.value}"],
    }
    body: dict[str, Any] = {
        "pinned": False,
        "retryLimit": DEFAULT_RETRY_LIMIT,
        "preRunTimeoutSeconds": DEFAULT_PRERUN_TIMEOUT,
        "postRunTimeoutSeconds": DEFAULT_POSTRUN_TIMEOUT,
        "storages": [
            {"name": "DW_JOB_local_storage", "optional": True},
            {"name": "DW_PERSISTENT_persistent_storage", "optional": True},
            {"name": "DW_GLOBAL_global_storage", "optional": True},
        ],
    }
    if use_mpi:
        launcher = dict(container, name=f"{name}-launcher", command=["mpirun", "dwssim-app"])
        worker = dict(container, name=f"{name}-worker")
        # nnf-sos's NnfMPISpec: the launcher's and the workers' pod specs, which it copies
        # into the MPIJob's replica specs
        body["mpiSpec"] = {
            "launcher": {"containers": [launcher]},
            "worker": {"containers": [worker]},
            "slotsPerWorker": 1,
        }
    else:
        body["spec"] = {"containers": [container]}
    body.update(data)
    return {
        **api_object(PROFILE_PLURAL),
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {BEHAVIOR_ANNOTATION: kind.value},
        },
        "data": body,
    }


def seeded_profiles() -> tuple[dict[str, Any], ...]:
    """The profiles of ``PROFILES``, as ``seed`` creates them."""
    return tuple(
        container_profile(name, behavior, **PROFILE_DATA.get(name, {}))
        for name, behavior in PROFILES.items()
    )


def pinned_copy(profile: Mapping[str, Any], metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The copy nnf-sos pins for one workflow: the same data, pinned, under ``metadata``."""
    pinned = copy.deepcopy(dict(profile))
    annotations = dict((profile.get("metadata") or {}).get("annotations") or {})
    pinned["metadata"] = dict(copy.deepcopy(dict(metadata)), annotations=annotations)
    pinned.setdefault("data", {})["pinned"] = True
    return pinned


# ---------------------------------------------------------------------------- verdicts


def check_access(settings: ProfileSettings, user_id: Any, group_id: Any) -> Fail | None:
    """A profile restricted to another user or group: Fatal User error in Proposal."""
    if settings.user_id is not None and settings.user_id != user_id:
        return fatal(
            f"container profile '{settings.name}' is restricted to UserID {settings.user_id}",
            kind=USER,
        )
    if settings.group_id is not None and settings.group_id != group_id:
        return fatal(
            f"container profile '{settings.name}' is restricted to GroupID {settings.group_id}",
            kind=USER,
        )
    return None


def check_storages(profile: Mapping[str, Any], directive: Directive) -> Fail | None:
    """nnf-sos's validateContainerDirective in Proposal, past what flux-dws's own grammar
    checks (each storage is a jobdw or persistentdw of the job that a container can mount):
    every storage argument is one the profile lists in ``storages``, and every storage the
    profile does not mark optional is given."""
    name = str((profile.get("metadata") or {}).get("name", ""))
    storages = [s for s in (profile.get("data") or {}).get("storages") or [] if s]
    listed = {s.get("name") for s in storages}
    given = [k for k in directive.args if k.startswith(("DW_JOB_", "DW_PERSISTENT_", "DW_GLOBAL_"))]
    for key in given:
        if key not in listed and key.startswith("DW_GLOBAL_"):
            return fatal(f"storage '{key}' is not present in the container profile", kind=USER)
        if key not in listed:
            return fatal(f"storage '{key}' not found in container profile '{name}'", kind=USER)
    for storage in storages:
        if not storage.get("optional") and storage.get("name") not in given:
            return fatal(
                f"storage '{storage.get('name')}' in container profile '{name}' is not "
                "optional: storage argument not found in the supplied arguments",
                kind=USER,
            )
    return None


def _launch_failure(cause: ResourceError) -> Fail:
    """How nnf-sos reports a failure to create the container jobs in PreRun."""
    return (
        cause.wrap("error obtaining the target NNF nodes for containers")
        .wrap(user_message="unable to create/update Container Jobs", severity=FATAL)
        .fail()
    )


def container_nodes(
    computes: Sequence[str], rabbits: Mapping[str, str] | None
) -> tuple[str, ...] | Fail:
    """The rabbits that run the containers: those serving the job's compute nodes.

    ``rabbits`` maps compute -> rabbit from the SystemConfiguration (None: there is none).
    """
    if not computes:
        return _launch_failure(
            ResourceError(
                debug="the Computes resources does not specify any compute nodes",
                type=WLM,
                severity=FATAL,
            )
        )
    if rabbits is None:
        return _launch_failure(
            ResourceError(debug="could not get system configuration", severity=FATAL)
        )
    nodes: list[str] = []
    for compute in computes:
        rabbit = rabbits.get(compute)
        if rabbit is None:
            return _launch_failure(
                ResourceError(
                    debug=f"supplied compute node '{compute}' not found in SystemConfiguration",
                    severity=FATAL,
                )
            )
        if rabbit not in nodes:
            nodes.append(rabbit)
    return tuple(nodes)


def ports_failure() -> Fail:
    """Setup: the port pool cannot give the profile its numPorts."""
    return fatal("could not request ports for container workflow: InsufficientResources")


def container_env(workflow: str, namespace: str, nodes: Sequence[str], mpi: bool) -> dict[str, str]:
    """The NNF_CONTAINER_* variables nnf-sos puts in status.env once the containers start."""
    env = {
        "NNF_CONTAINER_SUBDOMAIN": workflow,
        "NNF_CONTAINER_DOMAIN": f"{namespace}.svc.cluster.local",
    }
    if mpi:
        hosts = [f"{workflow}-launcher", *(f"{workflow}-worker-{i}" for i in range(len(nodes)))]
        # the rabbit the launcher runs on: its Job's nodeSelector, the first of the rabbits
        env["NNF_CONTAINER_LAUNCHER"] = nodes[0]
    else:
        hosts = list(nodes)
    env["NNF_CONTAINER_HOSTNAMES"] = ",".join(hosts)
    return env


def prerun_verdict(
    settings: ProfileSettings,
    elapsed: float,
    time_scale: float,
    workflow: str,
    namespace: str,
    nodes: Sequence[str],
) -> Outcome:
    """PreRun: started -> Complete; not started (initializing, or an image that cannot be
    pulled) -> Fatal at the profile's timeout, as nnf-sos words it.

    ``elapsed`` is the time since PreRun began; profile seconds count ``time_scale`` each.
    """
    if settings.behavior in (Behavior.NEVER_START, Behavior.START_FAIL):
        return _deadline(
            settings.prerun_timeout,
            elapsed,
            time_scale,
            ResourceError(
                user_message=f"user container(s) failed to start after "
                f"{settings.prerun_timeout} seconds",
                debug="MPIJob timeout set" if settings.mpi else "job(s) timeout set",
                severity=FATAL,
            ),
        )
    return Complete(env=container_env(workflow, namespace, nodes, settings.mpi))


def postrun_verdict(
    settings: ProfileSettings, elapsed: float, time_scale: float, workflow: str, namespace: str
) -> Outcome:
    """PostRun: exit 0 -> Complete; failure -> Fatal; still running -> timeout.

    postRunTimeoutSeconds 0 means nnf-sos neither waits nor checks the exit.
    """
    if settings.postrun_timeout == 0 or settings.behavior is Behavior.OK:
        return Complete()
    kind = "MPIJob" if settings.mpi else "job"
    if settings.behavior in (Behavior.HANG, Behavior.NEVER_START):
        return _deadline(
            settings.postrun_timeout,
            elapsed,
            time_scale,
            ResourceError(
                user_message=f"user container(s) failed to complete after "
                f"{settings.postrun_timeout} seconds",
                debug=f"container {kind} Failed (DeadlineExceeded): "
                "Job was active longer than specified deadline",
                severity=FATAL,
            ),
        )
    if settings.mpi:
        return ResourceError(
            user_message=f"user container(s) failed to run successfully after "
            f"{settings.retry_limit + 1} attempts",
            # mpi-operator appends the last failed launcher pod's reason and message (a
            # container that exits with an error leaves both empty) to its launcher Job's
            debug="container MPIJob Failed (BackoffLimitExceeded/): "
            "Job has reached the specified backoff limit: ",
            severity=FATAL,
        ).fail()
    return ResourceError(
        debug="container job Failed (BackoffLimitExceeded): "
        "Job has reached the specified backoff limit",
        severity=FATAL,
    ).fail()


def _deadline(seconds: int, elapsed: float, time_scale: float, late: ResourceError) -> Outcome:
    """Wait for the rest of a profile timeout (0: forever), then fail with ``late``."""
    if seconds == 0:
        return Wait()
    remaining = seconds * time_scale - elapsed
    return late.fail() if remaining <= 0 else Wait(remaining)
