# SPDX-License-Identifier: LGPL-3.0-only
"""dwssim: a DWS + NNF controller simulator for flux-dws tests, benchmarks and demos.

It watches Workflows in the in-process store of ``flux_dws.testing.kubeapi`` and advances
them as DWS, nnf-sos and DWS's test driver do (dws-api.md sections 1-5): state entry and
roll-up, Computes and DirectiveBreakdowns, Servers status, the job's environment, the
copy-offload token, forceReady, and user containers whose behaviour comes from their
NnfContainerProfile, with nnf-sos's own error messages.  Beside nnf-sos itself
(``Stack(nnf="sos")``) only its node-side players run: ``computemounts.ComputeMounts``
(clientmountd), ``datamovement.DataMover`` (nnf-dm) and ``workloads.Workloads`` (the Job
controller, MPI operator and kubelets that run nnf-sos's container jobs).

    store = Store()
    seed(store, computes=["node0", "node1"])
    with DwsSim(store, delays=0.0, time_scale=0.01):
        ...  # create workflows, patch desiredState, read status
"""

from __future__ import annotations

from flux_dws.testing.dwssim.containers import (
    BEHAVIOR_ANNOTATION,
    PROFILE_NAMESPACE,
    PROFILES,
    RESTRICTED_USER_ID,
    Behavior,
    ProfileSettings,
    container_profile,
)
from flux_dws.testing.dwssim.controller import (
    FINALIZER,
    REALISTIC_DELAYS,
    DwsSim,
    resolve_delays,
)
from flux_dws.testing.dwssim.seed import compute_names, seed
from flux_dws.testing.dwssim.status import go_duration

__all__ = [
    "compute_names",
    "BEHAVIOR_ANNOTATION",
    "FINALIZER",
    "PROFILES",
    "PROFILE_NAMESPACE",
    "REALISTIC_DELAYS",
    "RESTRICTED_USER_ID",
    "Behavior",
    "DwsSim",
    "ProfileSettings",
    "container_profile",
    "go_duration",
    "resolve_delays",
    "seed",
]
