# SPDX-License-Identifier: LGPL-3.0-only
"""Fluxion 0.54's queue policy and jobs that wait while nodes are down (real Flux only).

Under ``fcfs`` (Fluxion's default) a pending job that asks for more nodes than are up at
that moment is denied ``unsatisfiable`` (``dfu_traverser_t::request_feasible`` in
flux-sched's resource/traversers/dfu.cpp counts only up nodes when checking
satisfiability).  Every node is down while an instance restarts, so every job pending at
a restart is denied, #DW or not, whatever the R.  ``conservative`` never takes that path
(the admin guide, "Fluxion's queue policy").  The ``fcfs`` case is kept so that a Fluxion
that no longer does this fails here, and the guide's note can go.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.realflux

DENIED = 'alloc denied due to type="unsatisfiable"'


@pytest.fixture
def fluxion():
    from conftest import _fluxion_missing

    missing = _fluxion_missing()
    if missing:
        pytest.skip(missing)


@pytest.mark.parametrize("policy", [None, "conservative"])
def test_a_job_pending_at_an_instance_restart_runs_under_conservative_only(fluxion, policy):
    """Plain rv1 R (no JGF) and a job without #DW: nothing of flux-dws is involved."""
    from flux_dws.testing.fluxsetup import plain_R
    from flux_dws.testing.realflux import RealFlux

    hosts = ["compute-01", "compute-02"]
    flux = RealFlux(
        hosts, {"instance": "qpolicy"}, R=plain_R(hosts), persist=True, queue_policy=policy
    )
    try:
        flux.start()
        holder = flux.submit({}, nnodes=2, runtime=None)
        flux.wait(holder, "RUN", timeout=60)
        pending = flux.submit({}, nnodes=2)
        flux.wait(pending, "SCHED", timeout=60)
        flux.restart()  # the shutdown cancels the holder; the pending job stays queued
        info = flux.wait(pending, timeout=60)
    finally:
        flux.stop()
    assert any(e["name"] == "flux-restart" for e in info.eventlog)
    if policy is None:  # fcfs: denied before the restarted brokers are up
        assert info.result == "FAILED"
        assert info.exception["type"] == "alloc" and info.exception["note"] == DENIED
    else:
        assert info.result == "COMPLETED" and info.exception is None
