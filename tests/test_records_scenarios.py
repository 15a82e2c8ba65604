# SPDX-License-Identifier: LGPL-3.0-only
"""Scenarios: what became of a job's data and containers, as its user reads it.

Run against every job-manager the ``stack`` fixture offers (fakeflux, fakeflux with the service
in its own process, and real Flux with the jobtap plugin where flux-core is installed): copy
results on the job (``dws-datamovement``, ``flux dws status``), a failed copy naming its file
in the job's exception, container exit codes and log tails saved in the job's KVS directory
(``flux dws logs``), readable by the job's owner and nobody else, saved once across a restart.
"""

from __future__ import annotations

import io
import json
import os
import time

import pytest

from flux_dws.base.jobid import f58
from flux_dws.cli import main as cli_main
from flux_dws.cli.sources import StackSource
from flux_dws.core.identity import workflow_name
from flux_dws.core.output import OUTPUT_KEY
from flux_dws.core.states import State
from flux_dws.testing.stack import Stack

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
GFS2 = "#DW jobdw type=gfs2 capacity=10GiB name=shared"


def container(profile: str) -> list[str]:
    return [GFS2, f"#DW container name=app profile={profile} DW_JOB_local_storage=shared"]


def cli(stack, *args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    source = StackSource(stack)
    code = cli_main(list(args), out=out, err=err, source_factory=lambda: source, environ={})
    assert code == 0, err.getvalue()
    return out.getvalue()


def saved(stack, jobid: int, **kw) -> dict:
    return json.loads(stack.saved(jobid, OUTPUT_KEY, **kw))


def test_failed_copy_in_names_the_file_in_the_exception(stack):
    missing = "#DW copy_in source=/lus/missing/input.dat destination=$DW_JOB_scratch/in"
    jobid = stack.submit([JOBDW, missing], runtime=0.05)
    info = stack.wait(jobid)
    assert info.result == "FAILED"
    note = info.exception["note"]
    assert note.startswith("DataIn failed: #DW copy_in source=/lus/missing/input.dat")
    assert "Failed to open /lus/missing/input.dat" in note
    (record,) = [e["context"] for e in info.events("dws-datamovement")]
    assert (record["state"], record["index"], record["status"]) == ("DataIn", 1, "Failed")
    assert "No such file or directory" in record["message"]
    assert "PreRun" not in [e["context"]["state"] for e in info.events("dws-state")]


def test_successful_copies_show_files_and_bytes_in_status(stack):
    copy_in = "#DW copy_in source=/lus/in destination=$DW_JOB_scratch/in"
    copy_out = "#DW copy_out source=$DW_JOB_scratch/out destination=/lus/out"
    jobid = stack.submit([JOBDW, copy_in, copy_out], runtime=0.05)
    info = stack.wait(jobid)
    assert info.result == "COMPLETED", info.exception
    records = [e["context"] for e in info.events("dws-datamovement")]
    assert [(r["state"], r["index"], r["status"]) for r in records] == [
        ("DataIn", 1, "Success"),
        ("DataOut", 2, "Success"),
    ]
    out = records[1]
    assert out["files"] > 0 and out["bytes"] > 0 and out["elapsed"] > 0
    text = cli(stack, "status", str(jobid))
    row = [line for line in text.splitlines() if line.startswith("DataOut #2")]
    assert row and "Success" in row[0] and f" {out['files']} " in row[0], text
    assert copy_out in row[0]
    parsed = json.loads(cli(stack, "status", "--json", str(jobid)))
    assert parsed["copies"][1]["bytes"] == out["bytes"]


def test_crashing_container_shows_its_last_lines_and_exit_code(stack):
    jobid = stack.submit(container("exit-nonzero"), runtime=0.05)
    info = stack.wait(jobid)
    assert (info.exception or {}).get("type") == "dws"
    (event,) = info.events("dws-container")
    codes = {c["exit_code"] for c in event["context"]["containers"]}
    assert codes == {1}
    assert event["context"]["output"].startswith("saved")
    text = cli(stack, "logs", str(jobid))
    assert "exit code 1 (Error)" in text
    lines = text.splitlines()
    error = [i for i, line in enumerate(lines) if "cannot open input" in line]
    assert error and lines[error[0] + 1].strip() == "exiting with status 1", text


def test_long_log_keeps_only_its_tail(stack):
    jobid = stack.submit(container("ok"), runtime=0.05)
    info = stack.wait(jobid)
    assert info.result == "COMPLETED"
    doc = saved(stack, jobid)
    (entry,) = doc["containers"]
    assert entry["exit_code"] == 0 and entry["truncated"] is True
    assert len(entry["log"].encode()) <= 64 * 1024
    assert entry["log"].endswith("done: exiting 0\n")
    assert not entry["log"].startswith("app: starting")  # the head was dropped


def test_only_the_jobs_owner_reads_its_saved_output(stack):
    jobid = stack.submit(container("crash-loop"), runtime=0.05)
    stack.wait(jobid)
    mine = saved(stack, jobid, userid=os.getuid())
    launcher = [c for c in mine["containers"] if c["pod"].endswith("-launcher")]
    assert launcher and launcher[0]["exit_code"] == 139
    assert "Segmentation fault" in launcher[0]["log"]
    with pytest.raises(PermissionError):
        stack.saved(jobid, OUTPUT_KEY, userid=os.getuid() + 4242)


def _restart_stack(stack_backend: str) -> Stack:
    """A stack whose PostRun drivers take a while, so the service can be stopped meanwhile."""
    return Stack(
        hosts=4,
        backend="flux" if stack_backend == "flux" else "fake",
        service_process=stack_backend == "fakeflux-process",
        delays={"PostRun": 1.5},
    )


def _wait_error(st: Stack, jobid: int, timeout: float = 30.0) -> None:
    """Until the job's workflow reports its containers' failure (status Error)."""
    name = workflow_name(st.identity, jobid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = st.api.store.get("workflows", st.policy.namespace, name).get("status") or {}
        if status.get("status") == "Error":
            return
        time.sleep(0.05)
    raise AssertionError(f"workflow {name} never reported Error")


def _pods(st: Stack, jobid: int) -> list[dict]:
    selector = f"nnf.cray.hpe.com/container={workflow_name(st.identity, jobid)}"
    return st.api.store.list("pods", None, selector)[0]


def test_restart_between_containers_end_and_teardown_saves_output_once(stack_backend):
    with _restart_stack(stack_backend) as st:
        jobid = st.submit(container("exit-nonzero"), runtime=0.05)
        st.wait_workflow(jobid, State.POSTRUN)
        st.kill_service()
        _wait_error(st, jobid)  # the containers ended while no service ran
        assert _pods(st, jobid)
        st.start_service()
        info = st.wait(jobid)
        assert len(info.events("dws-container")) == 1
        doc = saved(st, jobid)
        assert [c["exit_code"] for c in doc["containers"]] == [1]
        assert "exiting with status 1" in doc["containers"][0]["log"]
        assert _pods(st, jobid) == []  # Teardown removed them, after the save


def test_pods_already_gone_is_said_not_failed(stack_backend):
    with _restart_stack(stack_backend) as st:
        jobid = st.submit(container("exit-nonzero"), runtime=0.05)
        st.wait_workflow(jobid, State.POSTRUN)
        st.kill_service()
        _wait_error(st, jobid)
        for pod in _pods(st, jobid):
            st.api.store.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
        st.start_service()
        info = st.wait(jobid)
        assert info.state == "INACTIVE" and not info.holds
        (event,) = info.events("dws-container")
        assert "already gone" in event["context"]["output"]
        with pytest.raises(FileNotFoundError):
            st.saved(jobid, OUTPUT_KEY)
        text = cli(st, "logs", f58(jobid))
        assert "the pods were already gone" in text
