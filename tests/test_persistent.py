# SPDX-License-Identifier: LGPL-3.0-only
"""Persistent storage as a managed resource, against the stand-ins (the service, kubeapi over
HTTP, dwssim with nnf-sos's uid rule and ignore-uid annotation) on fakeflux and, where
flux-core is installed, on real Flux: create, list, a user refused on unshared storage, share,
the user's job runs, destroy refused while it runs, destroy."""

from __future__ import annotations

import argparse
import io
import json
import os
import pwd

import pytest

from flux_dws.base.errors import DwsError
from flux_dws.base.jobid import f58
from flux_dws.cli import build_parser
from flux_dws.cli import persistent as cli
from flux_dws.core.persistent import persistent_rows, use_refusal

OWNER = os.getuid()
#: another user the system knows (the workflow's groupID comes from its passwd entry)
OTHER = next(p.pw_uid for p in pwd.getpwall() if p.pw_uid not in (OWNER, 0))
NAME = "team-data"
USE = f"#DW persistentdw name={NAME}"


@pytest.fixture(scope="module")
def stack(stack_backend):
    if stack_backend not in ("fakeflux", "flux"):
        pytest.skip("fakeflux and real Flux are enough here")
    from flux_dws.testing.stack import Stack

    backend = "fake" if stack_backend == "fakeflux" else "flux"
    with Stack(identity="pstest", backend=backend) as running:
        yield running


def args(stack, *argv: str) -> argparse.Namespace:
    parsed = build_parser().parse_args(["persistent", *argv])
    if hasattr(parsed, "kubeconfig"):
        parsed.kubeconfig = stack.kubeconfig
    return parsed


def submitter(stack, userid: int = OWNER):
    def submit(directive: str, timeout: float):
        jobid = stack.submit(directive, userid=userid)
        return jobid, list(stack.wait(jobid, timeout=timeout).eventlog)

    return submit


def run(stack, *argv: str, uid: int = OWNER) -> str:
    out = io.StringIO()
    assert cli.run(args(stack, *argv), out, submit=submitter(stack), uid=uid) == 0
    return out.getvalue()


def listed(stack) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(run(stack, "list", "--json"))}


def test_create_use_and_destroy(stack):
    said = run(stack, "create", NAME, "-t", "xfs", "-c", "10GiB")
    assert said.startswith(f"created persistent storage '{NAME}' (xfs, 10GiB) with job ")
    row = listed(stack)[NAME]
    assert (row["owner"], row["type"], row["state"], row["shared"]) == (
        OWNER,
        "xfs",
        "Active",
        False,
    )
    assert row["jobs"] == []
    # the owner's job uses it; while it runs, destroy is refused naming the job
    jobid = stack.submit(USE, runtime=None)
    try:
        stack.wait_event(jobid, "start", timeout=120)
        assert listed(stack)[NAME]["jobs"] == [f58(jobid)]
        with pytest.raises(DwsError) as refused:
            run(stack, "destroy", NAME)
        assert str(refused.value) == (
            f"persistent storage '{NAME}' is in use by job {f58(jobid)}: it can be destroyed"
            " once they end"
        )
    finally:
        stack.cancel(jobid)
        stack.wait(jobid, timeout=120)
    assert listed(stack)[NAME]["jobs"] == []
    said = run(stack, "destroy", NAME)
    assert said.startswith(f"destroyed persistent storage '{NAME}' with job ")
    assert NAME not in listed(stack)


def _someone_elses(stack, name: str) -> None:
    """Persistent storage another user made, as nnf-sos leaves it after their job."""
    stack.api.store.create(
        "persistentstorageinstances",
        "default",
        {
            "apiVersion": "dataworkflowservices.github.io/v1alpha7",
            "kind": "PersistentStorageInstance",
            "metadata": {"name": name},
            "spec": {
                "name": name,
                "fsType": "lustre",
                "userID": OTHER,
                "state": "Active",
                "dwDirective": f"#DW create_persistent type=lustre name={name}",
            },
            "status": {"state": "Active"},
        },
    )


def test_unshared_storage_is_refused_until_its_owner_shares_it(stack):
    name = "their-data"
    use = f"#DW persistentdw name={name}"
    _someone_elses(stack, name)
    refused = stack.wait(stack.submit(use), timeout=120)
    assert refused.result == "FAILED"
    assert refused.exception["note"] == (
        f"Proposal failed: {use}: User ID does not match existing persistent storage; "
        f"its owner can share it: flux dws persistent share {name}"
    )
    # only the owner may share it
    with pytest.raises(DwsError, match=f"belongs to uid {OTHER}: only its owner may share it"):
        run(stack, "share", name)
    assert "usable by every user's jobs" in run(stack, "share", name, uid=OTHER)
    assert listed(stack)[name]["shared"] is True
    ran = stack.wait(stack.submit(use), timeout=120)
    assert (ran.result, ran.exception) == ("COMPLETED", None)
    # destroying it stays its owner's (nnf-sos refuses anyone else, in Teardown)
    with pytest.raises(DwsError, match=f"belongs to uid {OTHER}: only its owner may destroy it"):
        run(stack, "destroy", name)
    assert name in listed(stack)
    assert "usable by its owner only" in run(stack, "share", name, "--off", uid=OTHER)


def test_use_refusals_name_the_storage_and_the_reason():
    psi = {
        "metadata": {"name": "d", "namespace": "default"},
        "spec": {"userID": 7, "fsType": "lustre", "consumerReferences": [{"name": "wf-a-1"}]},
        "status": {"state": "Degraded"},
    }
    (row,) = persistent_rows([psi], workflows=[])
    assert row.usable and row.consumers == ("wf-a",)
    assert use_refusal(row, "d", 7) is None
    assert "belongs to uid 7 and is not shared" in use_refusal(row, "d", 8)
    assert "does not exist" in use_refusal(None, "x", 8)
    psi["status"]["state"] = "Destroying"
    (row,) = persistent_rows([psi])
    assert use_refusal(row, "d", 7) == "persistent storage 'd' is being destroyed"
    assert (
        persistent_rows([None, {"metadata": {}}, {"metadata": {"name": "z"}, "spec": 5}])[0].name
        == "z"
    )
