# SPDX-License-Identifier: LGPL-3.0-only
"""Persistent storage as a managed resource, against the stand-ins (the service, kubeapi over
HTTP, dwssim with nnf-sos's uid rule and ignore-uid annotation) on fakeflux and, where
flux-core is installed, on real Flux: create, list, a user refused on unshared storage, share,
the user's job runs, destroy refused while it runs, destroy."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import pwd
import time

import pytest

from flux_dws.base.errors import DwsError
from flux_dws.base.jobid import f58
from flux_dws.cli import build_parser
from flux_dws.cli import persistent as cli
from flux_dws.core.persistent import persistent_rows, pushed_snapshot, use_refusal
from flux_dws.testing.fakeflux import SubmitError

OWNER = os.getuid()
#: another user the system knows (the workflow's groupID comes from its passwd entry)
OTHER = next(p.pw_uid for p in pwd.getpwall() if p.pw_uid not in (OWNER, 0))
NAME = "team-data"
USE = f"#DW persistentdw name={NAME}"
PSI = ("persistentstorageinstances", "default")


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


def known(stack) -> int | None:
    """How many persistent storage instances the plugin checks submits against (None: none)."""
    return stack.flux.dws_list()["service"].get("persistent")


def until(ready, what: str, timeout: float = 60.0):
    """``ready()``'s first true value (polled), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def refused_at_submit(stack, use: str) -> str:
    with pytest.raises(SubmitError) as refused:
        stack.submit(use)
    return str(refused.value)


def submitted_once_accepted(stack, use: str) -> int:
    """Submit ``use`` as soon as the plugin's snapshot no longer refuses it."""

    def accepted() -> int | None:
        try:
            return stack.submit(use)
        except SubmitError:
            return None

    return until(accepted, f"{use!r} to be accepted at submit")


def test_unshared_storage_is_refused_at_submit_until_its_owner_shares_it(stack):
    name = "their-data"
    use = f"#DW persistentdw name={name}"
    _someone_elses(stack, name)
    until(lambda: known(stack) == len(listed(stack)), "the plugin to know the storage")
    words = (
        f"persistent storage '{name}' belongs to uid {OTHER} and is not shared"
        f" (its owner can run: flux dws persistent share {name})"
    )
    assert words == use_refusal(persistent_rows([stack.api.store.get(*PSI, name)])[0], name, 0)
    assert refused_at_submit(stack, use) == words
    if stack.backend == "flux":  # the user's own command says so, in one line
        said = stack.flux.command("submit", "-S", f"dw={use}", "true")
        assert said.returncode != 0 and said.stderr.strip().endswith(words)
    # only the owner may share it
    with pytest.raises(DwsError, match=f"belongs to uid {OTHER}: only its owner may share it"):
        run(stack, "share", name)
    assert "usable by every user's jobs" in run(stack, "share", name, uid=OTHER)
    assert listed(stack)[name]["shared"] is True
    ran = stack.wait(submitted_once_accepted(stack, use), timeout=120)
    assert (ran.result, ran.exception) == ("COMPLETED", None)
    # destroying it stays its owner's (nnf-sos refuses anyone else, in Teardown)
    with pytest.raises(DwsError, match=f"belongs to uid {OTHER}: only its owner may destroy it"):
        run(stack, "destroy", name)
    assert name in listed(stack)
    assert "usable by its owner only" in run(stack, "share", name, "--off", uid=OTHER)
    until(lambda: _refused(stack, use), "the plugin to see the storage unshared")


def _refused(stack, use: str) -> bool:
    try:
        jobid = stack.submit(use)
    except SubmitError:
        return True
    stack.wait(jobid, timeout=120)
    return False


def test_unknown_storage_is_refused_at_submit(stack):
    until(lambda: known(stack) is not None, "the plugin to have the service's snapshot")
    assert refused_at_submit(stack, "#DW persistentdw name=nowhere") == (
        "persistent storage 'nowhere' does not exist (flux dws persistent list)"
    )
    # a batch script's #DW lines in one string are read too
    assert "'nowhere' does not exist" in refused_at_submit(
        stack, "#DW jobdw type=xfs capacity=1GiB name=scratch\n#DW persistentdw name=nowhere"
    )


def test_without_the_service_the_job_fails_at_proposal_in_the_same_words(stack):
    use = "#DW persistentdw name=nowhere"
    stack.kill_service()
    try:
        until(lambda: known(stack) is None, "the plugin to forget the snapshot", timeout=120)
        jobid = stack.submit(use)  # nothing to check against: accepted
    finally:
        stack.start_service()
    failed = stack.wait(jobid, timeout=120)
    assert failed.result == "FAILED"
    assert failed.exception["note"] == (
        f"Proposal failed: {use}: persistent storage 'nowhere' does not exist"
        " (flux dws persistent list)"
    )
    until(lambda: known(stack) is not None, "the service to tell the plugin again")


def test_the_pushed_snapshot_carries_the_words_and_is_bounded():
    rows = persistent_rows(
        [
            {"metadata": {"name": "mine"}, "spec": {"userID": 7}, "status": {"state": "Active"}},
            {"metadata": {"name": "gone", "deletionTimestamp": "t"}, "spec": {"userID": 7}},
            {"metadata": {"name": "bad name!"}, "spec": {"userID": 7}},
        ]
    )
    row = {r.name: r for r in rows}
    pushed = pushed_snapshot(rows)
    by_name = {e["name"]: e for e in pushed["storage"]}
    assert set(by_name) == {"mine", "gone"}  # a name the plugin cannot hold is left out
    assert by_name["mine"]["refusal"] is None
    assert by_name["mine"]["others"] == use_refusal(row["mine"], "mine", 8)
    assert by_name["gone"]["refusal"] == "persistent storage 'gone' is being destroyed"
    assert (
        pushed["unknown"] == "persistent storage '@NAME@' does not exist (flux dws persistent list)"
    )
    many = [dataclasses.replace(rows[1], name=f"s{i}") for i in range(5000)]
    assert len(pushed_snapshot(many)["storage"]) == 4096


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
