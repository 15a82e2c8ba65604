# SPDX-License-Identifier: LGPL-3.0-only
"""Capacity truth on a real Flux instance scheduled by Fluxion.

The graph is made while rabbit-1 holds 40 GiB of system storage (a Servers owned by an
NnfSystemStorage), so its pool is 60 GiB where rabbit-0's is 100.  A job that fits the smaller
pool runs; one that would need rabbit-1's whole drives is never placed there (with the pool
sized from Storage ``status.capacity`` or the drives alone, Fluxion would place it and Setup
would fail with "insufficient capacity").  Then a leak on rabbit-0 is kept from Fluxion: a job
needing the leaked capacity waits, and runs once the leak is gone.  Skipped, with one line,
where flux-core or Fluxion (flux-sched) is not installed.
"""

from __future__ import annotations

import pytest

from flux_dws.core.rabbits import GIB, allocated_rabbits
from flux_dws.flux.bindings import flux_command
from flux_dws.testing.fluxsetup import fluxion_installed

if flux_command() is None:
    pytest.skip("flux-core is not installed: Fluxion capacity skipped", allow_module_level=True)
if not fluxion_installed():
    pytest.skip(
        "Fluxion (flux-sched) is not installed: rabbit capacity skipped", allow_module_level=True
    )

from waiting import wait_for  # noqa: E402

from flux_dws.testing.stack import Stack  # noqa: E402

RABBITS = {"rabbit-0": ["compute-01", "compute-02"], "rabbit-1": ["compute-03", "compute-04"]}
WAIT = 120.0


def xfs(gib: int) -> str:
    return f"#DW jobdw type=xfs capacity={gib}GiB name=scratch"


@pytest.fixture(scope="module")
def stack():
    config = {
        "heartbeat": "2s",
        "rabbit-scheduling": True,
        "health-interval": "1s",
        "capacity-drift": "1GiB",
    }
    with Stack(
        hosts=4,
        backend="flux",
        config=config,
        rabbits=RABBITS,
        capacity=100 * GIB,
        system_storage={"rabbit-1": 40 * GIB},
    ) as running:
        yield running


def _down(stack) -> str:
    """Fluxion's ssd vertices held down now, as JGF text."""
    handle = stack.flux._handle
    found = handle.rpc("sched-fluxion-resource.find", {"criteria": "status=down", "format": "jgf"})
    return str(found.get())


def test_a_rabbit_with_system_storage_gets_the_smaller_pool(stack):
    fits = stack.submit(xfs(30), nnodes=4)  # 60 GiB on each rabbit: rabbit-1's whole pool
    info = stack.wait(fits, timeout=WAIT)
    assert info.result == "COMPLETED", info.exception
    too_big = stack.submit(xfs(35), nnodes=4)  # 70 GiB on rabbit-1: more than it has
    info = stack.wait(too_big, timeout=WAIT)
    assert info.result != "COMPLETED"  # Fluxion cannot place it: refused before any Setup
    assert "Setup" not in {e["context"].get("state") for e in info.events("dws-state")}


def test_a_leak_is_kept_from_fluxion_and_no_job_fails_in_setup(stack):
    stack.sim.leak("rabbit-0", 50 * GIB)
    wait_for(lambda: "/rabbit-0/ssd" in _down(stack), "the leaked capacity down in Fluxion", WAIT)
    job = stack.submit(xfs(70), nnodes=1)  # rabbit-1's pool is 60; rabbit-0 has 50 left
    stack.wait(job, state="SCHED", timeout=WAIT)
    seen = stack.health_passes()
    wait_for(lambda: stack.health_passes() > seen + 2, "passes with the leak", WAIT)
    assert stack.flux.info(job).state == "SCHED"
    stack.sim.unleak()
    info = stack.wait(job, timeout=WAIT)
    assert info.result == "COMPLETED", info.exception
    assert set(allocated_rabbits(stack.flux.job_R(job))) == {"rabbit-0"}
    wait_for(lambda: "/rabbit-0/ssd" not in _down(stack), "its pool given back", WAIT)
