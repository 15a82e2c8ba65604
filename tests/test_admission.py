# SPDX-License-Identifier: LGPL-3.0-only
"""The Proposal window (flux_dws.core.window): a burst reaches DWS a few jobs at a time, in
order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flux_dws.core.window import ProposalWindow


def test_jobs_past_the_limit_wait_and_are_woken_in_the_order_they_asked():
    window = ProposalWindow(limit=2)
    assert window.ask(1) and window.ask(2)
    assert not window.ask(3) and not window.ask(4) and not window.ask(3)  # asks twice: once in line
    assert list(window.waiting) == [3, 4]
    assert window.leave(1) == [3]  # 1 released to the scheduler: one slot, the first in line
    assert not window.ask(4)  # 4 may not take the slot 3 was woken for
    assert window.ask(3) and window.waiting == {4: None}
    assert window.leave(2) == [4] and window.ask(4)
    assert window.holders == {3, 4}


def test_no_limit_admits_everyone():
    window = ProposalWindow(limit=0)
    assert all(window.ask(jobid) for jobid in range(100))
    assert not window.waiting


def test_workflows_found_in_proposal_hold_slots_even_past_the_limit():
    window = ProposalWindow(limit=2)
    for jobid in (1, 2, 3):  # a restart finds three workflows in Proposal
        window.entered(jobid)
    assert not window.ask(4)
    assert window.leave(1) == []  # still two holders: 4 keeps waiting
    assert window.leave(2) == [4] and window.ask(4)


def test_a_job_that_leaves_the_line_loses_its_place():
    window = ProposalWindow(limit=1)
    assert window.ask(1) and not window.ask(2) and not window.ask(3)
    assert window.leave(2) == []  # e.g. cancelled while it waited: no slot is free
    assert window.leave(1) == [3] and window.ask(3)


def test_a_woken_job_that_no_longer_needs_its_slot_passes_it_on():
    window = ProposalWindow(limit=1)
    assert window.ask(1) and not window.ask(2) and not window.ask(3)
    assert window.leave(1) == [2]
    assert window.leave(2) == [3]  # 2 was cancelled before it asked again


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(min_value=1, max_value=4),
    steps=st.lists(
        st.tuples(st.sampled_from(["ask", "leave", "entered"]), st.integers(0, 7)), max_size=60
    ),
)
def test_asking_never_exceeds_the_limit_and_never_jumps_the_line(limit, steps):
    window = ProposalWindow(limit=limit)
    for op, jobid in steps:
        before_holders, line = set(window.holders), list(window.waiting)
        if op == "ask":
            admitted = window.ask(jobid)
            if admitted and jobid not in before_holders:
                ahead = line.index(jobid) if jobid in line else len(line)
                assert ahead < limit - len(before_holders)  # nobody who asked first was passed
                assert len(window.holders) <= limit
            if not admitted:
                assert jobid in window.waiting and jobid not in window.holders
        elif op == "leave":
            woken = window.leave(jobid)
            assert jobid not in window.holders and jobid not in window.waiting
            free = limit - len(window.holders)
            assert woken == list(window.waiting)[: max(free, 0)]
        else:
            window.entered(jobid)
            assert jobid in window.holders and jobid not in window.waiting
        assert not (window.holders & set(window.waiting))
