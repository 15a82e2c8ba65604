# SPDX-License-Identifier: LGPL-3.0-only
"""Python's collector waits for the service's first reconcile, then the reconciled state is
frozen (flux_dws.service.collector): start-up's full collections of a heap growing by
10,000 workflows cost seconds.  The collector is the process's, so every test here leaves it
as it found it."""

from __future__ import annotations

import gc

import pytest
from waiting import wait_for

from flux_dws.base.loop import Loop
from flux_dws.core.states import State
from flux_dws.k8s import KubeClient
from flux_dws.service.collector import StartupCollector
from flux_dws.testing.stack import Stack

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"


@pytest.fixture(autouse=True)
def _collector_as_found():
    if not gc.isenabled() or gc.get_freeze_count():
        pytest.skip("another service of this process holds the collector")
    yield
    gc.unfreeze()
    gc.enable()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_start_up_pauses_the_collector_and_freezes_what_it_built():
    collector = StartupCollector(Loop())
    collector.pause()
    assert not gc.isenabled()
    built = [{"job": n} for n in range(1000)]  # what start-up keeps
    collector.settle()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(built)  # never traversed again
    collector.stop()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_pause_ends_at_its_limit_without_a_reconcile():
    clock = Clock()
    loop = Loop(clock=clock)
    collector = StartupCollector(loop, limit=60.0)
    collector.pause()
    clock.now += 59.0
    loop.run_pending()
    assert not gc.isenabled()
    clock.now += 1.0
    loop.run_pending()
    assert gc.isenabled()
    collector.settle()  # too late: nothing is frozen
    assert gc.get_freeze_count() == 0
    collector.stop()


def test_services_sharing_a_process_nest_and_a_disabled_collector_stays_so():
    first, second = StartupCollector(Loop()), StartupCollector(Loop())
    first.pause()
    second.pause()
    first.settle()
    assert not gc.isenabled()  # the second is still starting
    second.stop()
    assert gc.isenabled() and gc.get_freeze_count() > 0  # the first's freeze holds
    first.stop()
    assert gc.get_freeze_count() == 0
    gc.disable()  # someone else's choice
    third = StartupCollector(Loop())
    third.pause()
    third.stop()
    assert not gc.isenabled()


def test_a_service_pauses_the_collector_until_it_has_reconciled(monkeypatch):
    monkeypatch.setattr(KubeClient, "_page_size", 1)
    with Stack(hosts=2) as stack:
        for _ in range(2):
            stack.wait_workflow(stack.submit([JOBDW, "#DW Proposal action=wait"]), State.PROPOSAL)
        stack.kill_service()
        assert gc.isenabled() and gc.get_freeze_count() == 0
        held = stack.api.faults.hold_pages("workflows")
        service = stack.start_service()
        try:
            wait_for(lambda: stack.api.faults.pages_waiting("workflows"), what="a held page")
            assert not gc.isenabled() and service.reconciled_at is None
        finally:
            held.set()
        wait_for(lambda: gc.isenabled(), what="the collector back after the reconcile")
        assert service.reconciled_at is not None and gc.get_freeze_count() > 0
        stack.kill_service()
        assert gc.isenabled() and gc.get_freeze_count() == 0
