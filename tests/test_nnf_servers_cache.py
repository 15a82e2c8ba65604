# SPDX-License-Identifier: LGPL-3.0-only
"""Setup is asked for only once nnf-sos shows it has read the Servers' spec.

nnf-sos's Setup reads the Servers from its informer cache and fails the job, Fatal, with
"Allocation request does not meet directive requirements" when the cache still holds the
Servers from before flux-dws filled it in (seen on about one nnf-sos job in twenty here).  Its
Servers controller copies the spec's labels and rabbits into ``status.allocationSets`` once
its cache has the spec: flux-dws waits (bounded) for that copy on a Servers nnf-sos manages.
"""

from __future__ import annotations

import threading
import time

from waiting import wait_for

from flux_dws.core.rabbits import NNF_SERVERS_FINALIZER, servers_awaiting_nnf
from flux_dws.testing.stack import Stack

JOBDW = "#DW jobdw type=xfs capacity=1GiB name=scratch"


def servers(spec_sets, status_sets=None, finalizers=(NNF_SERVERS_FINALIZER,)) -> dict:
    obj = {"metadata": {"finalizers": list(finalizers)}, "spec": {"allocationSets": spec_sets}}
    if status_sets is not None:
        obj["status"] = {"allocationSets": status_sets}
    return obj


SPEC = [{"label": "xfs", "storage": [{"name": "rabbit-0", "allocationCount": 1}]}]
MIRROR = [{"label": "xfs", "storage": {"rabbit-0": {"allocationSize": 0}}}]


def test_a_servers_is_awaited_until_nnf_sos_copies_its_spec_into_status():
    assert servers_awaiting_nnf(servers(SPEC))  # nnf-sos's cache has not shown the spec
    assert servers_awaiting_nnf(servers(SPEC, []))
    assert not servers_awaiting_nnf(servers(SPEC, MIRROR))
    other = [{"label": "xfs", "storage": {"rabbit-1": {"allocationSize": 0}}}]
    assert servers_awaiting_nnf(servers(SPEC, other))  # a copy of an older spec
    assert not servers_awaiting_nnf(servers(SPEC, finalizers=()))  # not nnf-sos's: no wait
    for junk in (None, "x", {"metadata": 5}, servers("x", 7), servers([5], [None])):
        servers_awaiting_nnf(junk)  # untrusted: an answer, never an exception


def test_setup_waits_for_nnf_sos_to_show_it_read_the_servers():
    with Stack(hosts=2) as stack:
        store = stack.api.store

        def as_nnf_sos(_operation: str, _old, new: dict) -> dict:
            meta = new.setdefault("metadata", {})
            if NNF_SERVERS_FINALIZER not in (meta.get("finalizers") or []):
                meta["finalizers"] = [*(meta.get("finalizers") or []), NNF_SERVERS_FINALIZER]
            return new

        store.add_admission("servers", as_nnf_sos)
        jobid = stack.submit(JOBDW, runtime=0.0)
        name = f"fluxjob-{stack.identity}-{jobid}"

        def filled() -> dict | None:
            items, _ = store.list("servers", "default")
            for obj in items:
                if obj["metadata"]["name"].startswith(name) and obj["spec"].get("allocationSets"):
                    return obj
            return None

        filled_servers = wait_for(filled, "the Servers filled in", 30)
        time.sleep(0.3)  # well inside the wait's bound (NNF_WAIT), far past a patch
        (workflow,) = [w for w in stack.workflows() if w["metadata"]["name"] == name]
        assert workflow["spec"]["desiredState"] == "Proposal"

        def mirror() -> None:  # what nnf-sos's Servers controller writes
            sets = filled_servers["spec"]["allocationSets"]
            status = [
                {
                    "label": a["label"],
                    "storage": {e["name"]: {"allocationSize": 0} for e in a["storage"]},
                }
                for a in sets
            ]
            store.patch(
                "servers",
                "default",
                filled_servers["metadata"]["name"],
                {"status": {"allocationSets": status}},
            )

        threading.Thread(target=mirror).start()
        assert stack.wait(jobid, timeout=60).result == "COMPLETED"
