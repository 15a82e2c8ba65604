# SPDX-License-Identifier: LGPL-3.0-only
"""Ownership, what may be decided while the list pages, and start-up order: the pure parts of
reconciliation."""

from __future__ import annotations

import copy

import pytest

from flux_dws.core.identity import INSTANCE_LABEL, JOBID_LABEL, owned_jobid, workflow_name
from flux_dws.core.reconcile import may_decide, plan_cleanup, startup_order, waits_for_list


def workflow(identity: str = "east", jobid: int = 42) -> dict:
    return {
        "metadata": {
            "name": workflow_name(identity, jobid),
            "labels": {INSTANCE_LABEL: identity, JOBID_LABEL: str(jobid)},
        },
        "spec": {"jobID": str(jobid)},
    }


def test_our_workflow_is_recognised_with_int_or_string_job_id():
    assert owned_jobid(workflow(), "east") == 42
    numeric = workflow()
    numeric["spec"]["jobID"] = 42
    assert owned_jobid(numeric, "east") == 42


@pytest.mark.parametrize(
    "mutate",
    [
        lambda w: w["metadata"]["labels"].update({INSTANCE_LABEL: "west"}),
        lambda w: w["metadata"]["labels"].pop(INSTANCE_LABEL),
        lambda w: w["metadata"]["labels"].update({JOBID_LABEL: "43"}),
        lambda w: w["metadata"]["labels"].update({JOBID_LABEL: "x42"}),
        lambda w: w["spec"].update({"jobID": "43"}),
        lambda w: w["spec"].update({"jobID": True}),
        lambda w: w["metadata"].update({"name": "fluxjob-east-42-copy"}),
        lambda w: w.pop("spec"),
        lambda w: w["metadata"].pop("labels"),
    ],
)
def test_anything_that_disagrees_is_not_ours(mutate):
    obj = copy.deepcopy(workflow())
    mutate(obj)
    assert owned_jobid(obj, "east") is None
    assert plan_cleanup([obj], held_jobids=[], identity="east") == []


def test_another_instance_with_a_look_alike_name_is_never_swept():
    theirs = workflow(identity="east-2", jobid=42)
    theirs["metadata"]["name"] = workflow_name("east", 42)
    assert plan_cleanup([theirs, workflow()], held_jobids=[], identity="east")[0].jobid == 42
    assert len(plan_cleanup([theirs], held_jobids=[], identity="east")) == 0


def test_startup_takes_in_flight_jobs_first_then_new_ones_in_submit_order():
    jobs = [(5, False, 50.0), (1, True, 90.0), (3, False, 10.0), (2, True, 20.0)]
    assert startup_order(jobs) == [2, 1, 3, 5]


@pytest.mark.parametrize("listed", [False, True])
@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("seen", [False, True])
def test_nothing_is_decided_before_the_job_snapshot(listed, held, seen):
    assert not may_decide(synced=False, listed=listed, held=held, seen=seen)


def test_while_the_list_pages_only_a_held_job_with_its_workflow_seen_is_decided():
    """A held job whose workflow is not seen yet may have it on a later page (deciding now
    would create a second); a workflow without a held job is swept only on the whole list."""
    assert may_decide(synced=True, listed=False, held=True, seen=True)
    assert not may_decide(synced=True, listed=False, held=True, seen=False)
    assert not may_decide(synced=True, listed=False, held=False, seen=True)
    assert not may_decide(synced=True, listed=False, held=False, seen=False)
    assert not waits_for_list(held=True, seen=True)
    assert waits_for_list(held=True, seen=False)
    assert waits_for_list(held=False, seen=True)


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("seen", [False, True])
def test_on_the_whole_list_every_job_is_decided(held, seen):
    assert may_decide(synced=True, listed=True, held=held, seen=seen)
