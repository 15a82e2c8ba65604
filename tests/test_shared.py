# SPDX-License-Identifier: LGPL-3.0-only
"""One copy of what many jobs hold alike (flux_dws.base.frozen.Shared): the workflows'
driver entries, the jobs' requests, the like parts of their records (bench_reconcile's
memory per workflow)."""

from __future__ import annotations

import json
import sys

from flux_dws.base.frozen import Shared
from flux_dws.core.policy import Policy
from flux_dws.core.states import State
from flux_dws.core.workflow import view_workflow
from flux_dws.flux.jobrecords import job_view, parse_request, share_alike
from tests.test_workflow import make_workflow

RESOURCES = [{"type": "node", "count": 1, "with": [{"type": "slot", "count": 1, "label": "task"}]}]
TIMEOUTS = {"proposal": "10m", "setup": "30m"}


def record(jobid: int, hosts: list[str]) -> dict:
    """A held job's record as the plugin sends it (doc/protocol.rst), decoded afresh."""
    return json.loads(
        json.dumps(
            {
                "id": jobid,
                "userid": 1001,
                "phase": "prolog" if hosts else "depend",
                "attributes": {"dw": ["#DW jobdw type=xfs capacity=10GiB name=scratch"]},
                "hosts": hosts,
                "rabbits": {},
                "ssd": [],
                "resources": RESOURCES,
                "dws": {
                    "dws-workflow": {"name": f"fluxjob-{jobid}", "timeouts": TIMEOUTS},
                    "dws-state": {"state": "Proposal", "deadline": 1000.0 + jobid},
                    "dws-proposal": {"storage": {"per_compute": {"xfs": 1}}, "needs": [jobid]},
                },
            }
        )
    )


def test_shared_gives_the_first_equal_value_and_forgets_past_its_limit() -> None:
    shared = Shared(limit=2)
    a, b = (1, "x"), (1, "x")
    assert shared(a) is a and shared(b) is a
    shared((2,))
    shared((3,))  # past the limit: starts afresh
    assert shared(b) is b


def test_shared_json_tells_numbers_and_booleans_apart() -> None:
    shared = Shared()
    one, real, true = {"a": 1}, {"a": 1.0}, {"a": True}
    assert shared.json(one) is one and shared.json(real) is real and shared.json(true) is true
    assert shared.json({"a": 1}) is one
    assert shared.json({}) is shared.json({}) and shared.json([]) is shared.json([])


def test_records_share_their_alike_parts_and_read_the_same() -> None:
    policy = Policy()
    first, second = record(1, []), record(2, ["node1"])
    views = [
        job_view(r, parse_request(r, policy, owner_uid=0), groupid=-1) for r in (first, second)
    ]
    share_alike([first, second])
    assert first["resources"] is second["resources"]
    assert first["attributes"] is second["attributes"]
    assert first["rabbits"] is second["rabbits"] and first["ssd"] is second["ssd"]
    one, two = (r["dws"] for r in (first, second))
    assert one["dws-workflow"]["timeouts"] is two["dws-workflow"]["timeouts"]
    assert one["dws-proposal"]["storage"] is two["dws-proposal"]["storage"]
    assert first["hosts"] == [] and second["hosts"] == ["node1"]  # the rest is each job's own
    assert one["dws-proposal"]["needs"] == [1] and two["dws-proposal"]["needs"] == [2]
    assert one["dws-state"]["state"] is two["dws-state"]["state"]  # and every text, once
    assert second["hosts"][0] is sys.intern("node1") and first["phase"] is sys.intern("depend")
    again = [
        job_view(r, parse_request(r, policy, owner_uid=0), groupid=-1) for r in (first, second)
    ]
    assert again == views


def test_records_sharing_their_attributes_share_one_request() -> None:
    policy = Policy()
    first, second, third = share_alike([record(1, []), record(2, []), record(3, [])])
    third["userid"] = 1002  # another user's job: parsed for that user
    one, two, other = (parse_request(r, policy, owner_uid=0) for r in (first, second, third))
    assert one[0] is not None and one is two and other is not one and other == one
    alone = record(4, [])  # not shared: parsed on its own, alike all the same
    assert parse_request(alone, policy, owner_uid=0) == one


def test_alike_workflows_share_their_driver_entries_and_directives() -> None:
    one, two = (view_workflow(make_workflow(State.SETUP)) for _ in range(2))
    assert one == two
    assert one.drivers is two.drivers and one.directives is two.directives
    assert one.finalizers is two.finalizers and one.container is two.container
