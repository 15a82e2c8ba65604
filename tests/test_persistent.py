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
import re
import subprocess
import sys
import time

import pytest

from flux_dws.base.errors import DwsError
from flux_dws.base.jobid import f58, parse_jobid
from flux_dws.cli import build_parser, main
from flux_dws.cli import persistent as cli
from flux_dws.cli.sources import StackSource, user_name
from flux_dws.core.persistent import persistent_rows, pushed_snapshot, use_refusal
from flux_dws.testing.fakeflux import SubmitError
from flux_dws.testing.kubeapi.resources import by_plural

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


def instance(stack) -> dict:
    """How the command reaches the instance (who owns it, for share): on real Flux through
    FLUX_URI and flux-core's bindings, as a person's command does; on fakeflux, the stack."""
    if stack.backend == "flux":
        return {"environ": stack.flux._env()}  # noqa: SLF001 (the instance's environment)
    return {"source_factory": lambda: StackSource(stack)}


def run(stack, *argv: str, uid: int = OWNER) -> str:
    out = io.StringIO()
    parsed = args(stack, *argv)
    assert cli.run(parsed, out, submit=submitter(stack), uid=uid, **instance(stack)) == 0
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


def flux_dws(stack, *argv: str) -> subprocess.CompletedProcess[str]:
    """``flux dws ARGV`` as a person runs it in the instance: the command line's own entry
    point (``python -m flux_dws``, what ``flux dws`` runs) in a process of its own, under the
    instance's FLUX_URI, submitting with flux-core's Python API."""
    return subprocess.run(
        [sys.executable, "-m", "flux_dws", *argv],
        env=stack.flux._env(),  # noqa: SLF001 (the instance's environment)
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_commands_submit_and_wait_for_their_jobs_through_flux_core(stack):
    if stack.backend != "flux":
        pytest.skip("the command submits through flux-core's Python API on real Flux only")
    name, kube = "cli-data", ("--kubeconfig", stack.kubeconfig)

    def shown() -> dict[str, dict]:
        listed = flux_dws(stack, "persistent", "list", "--json", *kube)
        assert (listed.returncode, listed.stderr) == (0, "")
        return {r["name"]: r for r in json.loads(listed.stdout)}

    made = flux_dws(stack, "persistent", "create", name, "-t", "xfs", "-c", "1GiB")
    assert (made.returncode, made.stderr) == (0, ""), made.stderr
    said = re.fullmatch(
        rf"created persistent storage '{name}' \(xfs, 1GiB\) with job (ƒ\w+)\n", made.stdout
    )
    assert said, made.stdout
    jobid = parse_jobid(said.group(1))
    job = stack.flux.info(jobid)
    assert (job.result, job.userid) == ("COMPLETED", OWNER)
    jobspec = json.loads(stack.flux.kvs_lookup(jobid, "jobspec"))
    assert jobspec["attributes"]["system"]["dw"] == (
        f"#DW create_persistent type=xfs capacity=1GiB name={name}"
    )
    row = shown()[name]
    assert (row["owner"], row["type"], row["state"], row["jobs"]) == (OWNER, "xfs", "Active", [])
    gone = flux_dws(stack, "persistent", "destroy", name, *kube)
    assert (gone.returncode, gone.stderr) == (0, "")
    assert re.fullmatch(rf"destroyed persistent storage '{name}' with job ƒ\w+\n", gone.stdout)
    assert name not in shown()
    # DWS refuses the job's workflow: one line naming the job and DWS's reason, and a failure
    refused, reason = "refused-data", "name 'refused-data' is reserved"
    stack.reject_directives_containing(f"name={refused}", reason)
    failed = flux_dws(stack, "persistent", "create", refused, "-t", "xfs", "-c", "1GiB")
    assert (failed.returncode, failed.stdout) == (1, "")
    said = re.fullmatch(
        rf"flux-dws persistent: persistent storage '{refused}' was not created:"
        r" job (ƒ\w+): (.*)\n",
        failed.stderr,
    )
    assert said, failed.stderr
    job = stack.flux.info(parse_jobid(said.group(1)))
    assert job.result == "FAILED" and reason in said.group(2)
    assert said.group(2) == job.exception["note"]
    assert refused not in shown()
    # a job that cannot end in time (no service to run its workflow): the wait is bounded
    late = "late-data"
    stack.kill_service()
    try:
        waited = flux_dws(stack, "persistent", "create", late, "-t", "xfs", "-c", "1GiB",
                          "--timeout", "1")  # fmt: skip
    finally:
        stack.start_service()
    said = re.fullmatch(
        rf"flux-dws persistent: job (ƒ\w+) \(#DW create_persistent type=xfs capacity=1GiB"
        rf" name={late}\) has not ended after 1s; see flux dws status (ƒ\w+)\n",
        waited.stderr,
    )
    assert waited.returncode == 1 and said and said.group(1) == said.group(2), waited.stderr
    assert stack.wait(parse_jobid(said.group(1)), timeout=120).result == "COMPLETED"
    gone = flux_dws(stack, "persistent", "destroy", late, *kube)
    assert (gone.returncode, gone.stderr) == (0, "")


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
        f" (the instance owner can share it: flux dws persistent share {name})"
    )
    assert words == use_refusal(persistent_rows([stack.api.store.get(*PSI, name)])[0], name, 0)
    assert refused_at_submit(stack, use) == words
    if stack.backend == "flux":  # the user's own command says so, in one line
        said = stack.flux.command("submit", "-S", f"dw={use}", "true")
        assert said.returncode != 0 and said.stderr.strip().endswith(words)
    # only the Flux instance owner may share it, not the storage's owner
    with pytest.raises(DwsError) as refused:
        run(stack, "share", name, uid=OTHER)
    assert str(refused.value) == (
        f"only the Flux instance owner ({user_name(OWNER)}) may share persistent storage"
    )
    assert listed(stack)[name]["shared"] is False
    assert "usable by every user's jobs" in run(stack, "share", name)
    assert listed(stack)[name]["shared"] is True
    ran = stack.wait(submitted_once_accepted(stack, use), timeout=120)
    assert (ran.result, ran.exception) == ("COMPLETED", None)
    # destroying it stays its owner's (nnf-sos refuses anyone else, in Teardown)
    with pytest.raises(DwsError, match=f"belongs to uid {OTHER}: only its owner may destroy it"):
        run(stack, "destroy", name)
    assert name in listed(stack)
    with pytest.raises(DwsError, match="only the Flux instance owner"):
        run(stack, "share", name, "--off", uid=OTHER)
    assert "usable by its owner only" in run(stack, "share", name, "--off")
    assert listed(stack)[name]["shared"] is False
    until(lambda: _refused(stack, use), "the plugin to see the storage unshared")


def test_share_is_refused_in_one_line_where_no_flux_instance_can_say_who_owns_it(stack):
    name = "nobodys-data"
    _someone_elses(stack, name)
    out, err = io.StringIO(), io.StringIO()
    argv = ["persistent", "share", name, "--kubeconfig", stack.kubeconfig]
    assert main(argv, out=out, err=err, environ={}) == 1
    assert (out.getvalue(), err.getvalue()) == (
        "",
        "flux-dws persistent: only the Flux instance owner may share persistent storage, and"
        " no instance could say who that is: not running under a Flux instance (FLUX_URI is"
        " not set)\n",
    )
    assert listed(stack)[name]["shared"] is False


def _refused(stack, use: str) -> bool:
    try:
        jobid = stack.submit(use)
    except SubmitError:
        return True
    stack.wait(jobid, timeout=120)
    return False


def set_state(stack, name: str, state: str) -> None:
    """What DWS's PersistentStorageInstance controller reports (its status subresource, over
    HTTP to the API server, as the controller writes it)."""
    import kubernetes

    group, version = by_plural(PSI[0]).api_version().split("/")
    client = kubernetes.config.new_client_from_config(config_file=stack.kubeconfig)
    try:
        kubernetes.client.CustomObjectsApi(client).patch_namespaced_custom_object_status(
            group, version, PSI[1], PSI[0], name, {"status": {"state": state}}
        )
    finally:
        client.close()


def test_degraded_storage_is_listed_so_and_jobs_still_use_it(stack):
    name = "worn-data"
    use = f"#DW persistentdw name={name}"
    run(stack, "create", name, "-t", "xfs", "-c", "1GiB")
    # not usable while Creating: once the plugin refuses it, it has the state the service saw
    set_state(stack, name, "Creating")
    creating = f"persistent storage '{name}' is Creating, not usable"
    until(lambda: _refused_in(stack, use, creating), "the plugin to see the storage Creating")
    set_state(stack, name, "Degraded")
    row = listed(stack)[name]
    assert (row["state"], row["usable"]) == ("Degraded", True)
    assert f"{name} Degraded" in run(stack, "list", "-H", "-o", "{name} {state}").splitlines()
    (shown,) = [line.split() for line in run(stack, "list").splitlines() if line.startswith(name)]
    assert shown[4] == "Degraded"  # NAME OWNER TYPE CAPACITY STATE ...
    # DWS still uses Degraded persistent storage: accepted at submit, and the job runs
    ran = stack.wait(submitted_once_accepted(stack, use), timeout=120)
    assert (ran.result, ran.exception) == ("COMPLETED", None)
    assert listed(stack)[name]["state"] == "Degraded"
    set_state(stack, name, "Active")
    assert run(stack, "destroy", name).startswith("destroyed")
    assert name not in listed(stack)


def _refused_in(stack, use: str, words: str) -> bool:
    """``use`` is refused at submit in ``words`` (a job that was accepted is waited for)."""
    try:
        jobid = stack.submit(use)
    except SubmitError as exc:
        return str(exc) == words
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
