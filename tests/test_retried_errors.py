# SPDX-License-Identifier: LGPL-3.0-only
"""A driver error that the driver retries is waited for, not failed at once.

nnf-sos turns an error it did not classify (a failed API call: a conflict, an "already exists"
from its stale cache, an admission webhook's refusal) into a driver entry in Error with
``Internal error: <err>``, and its controller retries and clears the entry on its next pass.
DWS rolls it up as Error all the same.  Under nnf-sos 1 container job in about 30 failed
Proposal this way under load ("nnfcontainerprofiles ... already exists").  dwssim plays it:
an API error in its NNF driver is such an entry, retried a second later.  Here an admission
hook (as a site's policy webhook would) refuses the pinned copy of a container profile.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from flux_dws.core.states import State
from flux_dws.testing.dwssim.containers import PROFILE_NAMESPACE, container_profile
from flux_dws.testing.kubeapi import ApiError
from flux_dws.testing.stack import Stack

GFS2 = "#DW jobdw type=gfs2 capacity=10GiB name=shared"
DENIED = 'admission webhook "policy.example.org" denied the request: copies are paused'


class RefusePinnedCopies:
    """Refuses the pinned copies of one profile, ``times`` times (None: always)."""

    def __init__(self, profile: str, times: int | None) -> None:
        self.marker, self.left = f"'{profile}-app'", times
        self.lock = threading.Lock()

    def __call__(self, operation: str, old: dict | None, new: dict) -> None:
        data = new.get("data") or {}
        if operation != "CREATE" or not data.get("pinned") or self.marker not in repr(data):
            return
        with self.lock:
            if self.left == 0:
                return
            if self.left is not None:
                self.left -= 1
        raise ApiError(403, "Forbidden", DENIED)


@pytest.fixture(scope="module")
def stack():
    with Stack() as running:
        for name, refusals in (("paused", 1), ("refused", None)):
            profile = container_profile(name, "ok")
            running.api.store.create("nnfcontainerprofiles", PROFILE_NAMESPACE, profile)
            running.api.store.add_admission(
                "nnfcontainerprofiles", RefusePinnedCopies(name, refusals)
            )
        yield running


def submit(stack, profile: str, **options: Any):
    directives = [GFS2, f"#DW container name=app profile={profile} DW_JOB_local_storage=shared"]
    return stack.wait(stack.submit(directives, runtime=0.05, **options), timeout=60)


def transient_events(info) -> list[dict[str, Any]]:
    return [e["context"] for e in info.events("dws-transient")]


def test_an_error_the_driver_clears_leaves_the_job_running(stack):
    info = submit(stack, "paused")
    assert info.result == "COMPLETED", info.exception
    seen = transient_events(info)
    assert seen[0]["state"] == State.PROPOSAL.value and DENIED in seen[0]["message"], seen
    assert seen[-1]["since"] is None  # cleared
    assert not stack.left_behind(info.id)


def test_an_error_the_driver_never_clears_fails_after_the_transient_grace(stack):
    info = submit(stack, "refused", timeouts={"transient": "1s"})
    assert info.result == "FAILED" and "start" not in [e["name"] for e in info.eventlog]
    note = (info.exception or {}).get("note", "")
    assert note.startswith("Proposal failed: in Error, retried by its driver, for more than 1s: ")
    assert DENIED in note, note
    assert not stack.left_behind(info.id)
