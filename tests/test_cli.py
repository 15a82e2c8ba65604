# SPDX-License-Identifier: LGPL-3.0-only
"""`flux dws status|list|logs|cleanup|service`: the pure views and renderers on synthetic
eventlogs, then the commands themselves through main() against a Stack (real service, kubeapi
over HTTP, dwssim, fakeflux) read through StackSource as a real instance would be."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from waiting import wait_for

from flux_dws.base.errors import DwsError
from flux_dws.base.jobid import f58, parse_jobid
from flux_dws.cli import main
from flux_dws.cli.inventory import filter_rows, list_rows
from flux_dws.cli.logsview import build_logs
from flux_dws.cli.render import (
    LIST_FIELDS,
    LIST_FORMATS,
    dumps,
    format_table,
    list_record,
    render_logs,
    render_status,
)
from flux_dws.cli.sources import StackSource
from flux_dws.cli.views import build_status, format_duration, job_result, timeline
from flux_dws.core.identity import INSTANCE_LABEL, JOBID_LABEL, ownership_labels, workflow_name
from flux_dws.core.reconcile import plan_cleanup
from flux_dws.core.states import State
from flux_dws.flux.bindings import flux_command

T0 = 1_700_000_000.0
JOBID = 123456789
TIMEOUTS = {
    "proposal": "10m",
    "setup": "30m",
    "datain": "1h",
    "prerun": "15m",
    "postrun": "15m",
    "dataout": "1h",
    "teardown": "30m",
    "transient": "30s",
}


def ev(offset: float, event: str, **context) -> dict:
    return {"timestamp": T0 + offset, "name": event, "context": context}


def state_ev(offset: float, state: str, timeout: str | None) -> dict:
    deadline = None if timeout is None else T0 + offset + {"10m": 600, "30m": 1800}[timeout]
    return ev(offset, "dws-state", state=state, timeout=timeout, deadline=deadline)


def running_job() -> list[dict]:
    """A job in Setup for 40 s, with a TransientCondition since 10 s ago (at now = T0 + 50)."""
    return [
        ev(0, "submit", userid=1001, urgency=16, flags=0, version=1),
        ev(0.1, "validate"),
        ev(0.2, "dws-workflow", name=f"fluxjob-x-{JOBID}", namespace="default", timeouts=TIMEOUTS),
        state_ev(0.5, "Proposal", "10m"),
        ev(2.0, "depend"),
        ev(2.0, "priority", priority=16),
        ev(9.0, "alloc"),
        state_ev(10.0, "Setup", "30m"),
        ev(40.0, "dws-transient", state="Setup", since=T0 + 40.0, message="rabbit is slow"),
    ]


def failed_container_job() -> list[dict]:
    return [
        ev(0, "submit", userid=1001),
        ev(0.1, "validate"),
        ev(0.2, "dws-workflow", name=f"fluxjob-x-{JOBID}", namespace="default", timeouts=TIMEOUTS),
        state_ev(1.0, "Proposal", "10m"),
        ev(
            1.5,
            "dws-proposal",
            storage={},
            needs=[],
            container_timeouts={"prerun": "5m", "postrun": "5m"},
        ),
        ev(2.0, "depend"),
        ev(2.0, "priority", priority=16),
        ev(3.0, "alloc"),
        state_ev(3.0, "Setup", "30m"),
        ev(5.0, "start"),
        ev(8.0, "finish", status=0),
        state_ev(8.0, "PostRun", "10m"),
        ev(
            9.0,
            "dws-container",
            state="failed",
            phase="PostRun",
            reason="User error: container exited 1",
            detail="pod app-0 exit code 1",
        ),
        ev(9.0, "exception", type="dws", severity=0, note="PostRun failed: container exited 1"),
        state_ev(9.5, "Teardown", "30m"),
        ev(11.0, "epilog-finish", description="dws", status=0),
        ev(11.0, "free"),
        ev(11.0, "clean"),
    ]


def workflow_obj(jobid: int = JOBID, identity: str = "x", **status) -> dict:
    return {
        "apiVersion": "dataworkflowservices.github.io/v1alpha7",
        "kind": "Workflow",
        "metadata": {
            "name": workflow_name(identity, jobid),
            "namespace": "default",
            "labels": ownership_labels(identity, jobid),
            "creationTimestamp": "2023-11-14T22:13:20Z",  # T0
        },
        "spec": {
            "desiredState": status.get("state", "Setup"),
            "jobID": str(jobid),
            "userID": 1001,
            "groupID": 1001,
            "dwDirectives": ["#DW jobdw type=xfs capacity=1GiB name=s"],
        },
        "status": {"desiredStateChange": "2023-11-14T22:13:30Z", **status},
    }


# --------------------------------------------------------------------------- views


def test_timeline_gives_each_state_its_start_duration_and_time_left():
    now = T0 + 50.0
    spans = timeline(running_job(), now=now, active=True)
    assert [s.state for s in spans] == [State.PROPOSAL, State.SETUP]
    proposal, setup = spans
    assert proposal.duration == pytest.approx(9.5) and not proposal.running
    assert proposal.left is None
    assert setup.running and setup.duration == pytest.approx(40.0)
    assert setup.left == pytest.approx(1800 - 40)


def test_timeline_merges_a_repeated_state_keeping_the_first_start_and_the_later_deadline():
    log = [state_ev(0, "Proposal", "10m"), state_ev(5, "Proposal", "30m")]
    (span,) = timeline(log, now=T0 + 6, active=True)
    assert span.start == T0 and span.deadline == T0 + 5 + 1800


def test_finished_job_status_ends_its_last_state_at_the_epilog_and_keeps_the_outcome():
    status = build_status(JOBID, failed_container_job(), None, T0 + 500)
    # Flux fixes the result at finish: the PostRun failure came after (the exception shows it)
    assert status.job_state == "INACTIVE" and status.result == "COMPLETED"
    assert status.exception and "PostRun failed" in status.exception["note"]
    assert [s.state.value for s in status.timeline] == ["Proposal", "Setup", "PostRun", "Teardown"]
    assert status.timeline[-1].duration == pytest.approx(1.5)  # epilog-finish at 11.0
    assert not any(s.running for s in status.timeline)
    assert status.container.reason == "User error: container exited 1"
    assert status.container.detail == "pod app-0 exit code 1" and status.container.source == "job"
    assert status.exception["note"] == "PostRun failed: container exited 1"
    assert status.workflow_note == "deleted"
    progress = {t.key: t.progress for t in status.timeouts}
    assert progress["prerun"] == "skipped" and progress["postrun"] == "done"
    assert progress["container-postrun"] == "done"


def test_timeouts_show_what_is_left_of_the_running_state_and_the_transient_grace():
    status = build_status(JOBID, running_job(), None, T0 + 50.0)
    lines = {t.key: t for t in status.timeouts}
    assert lines["setup"].progress == "running"
    assert lines["setup"].left == pytest.approx(1760)
    assert lines["proposal"].progress == "done" and lines["proposal"].used == pytest.approx(9.5)
    assert lines["prerun"].progress == "pending"
    assert lines["transient"].progress == "active"
    assert lines["transient"].left == pytest.approx(20.0)  # 30 s grace, seen 10 s ago
    assert status.last_message == "rabbit is slow"


def test_the_live_workflow_supplies_ready_time_message_and_driver_errors():
    obj = workflow_obj(
        state="Setup",
        status="Error",
        ready=False,
        message="DW Directive 0: User error: no space on rabbit",
        drivers=[
            {
                "driverID": "nnf",
                "dwdIndex": 0,
                "watchState": "Setup",
                "status": "Error",
                "message": "User error: no space on rabbit",
                "error": "allocation failed: ENOSPC",
            },
            {"driverID": "nnf", "dwdIndex": 0, "watchState": "Proposal", "status": "Completed"},
        ],
    )
    status = build_status(JOBID, running_job(), obj, T0 + 50)
    assert status.last_message == "User error: no space on rabbit"
    assert status.workflow.status == "Error"
    logs = build_logs(JOBID, running_job(), obj)
    (driver,) = logs.drivers
    assert driver.error == "allocation failed: ENOSPC" and driver.state == "Setup"
    assert "allocation failed: ENOSPC" in "\n".join(render_logs(logs))


def test_a_stale_message_is_not_shown_as_the_last_one():
    log = [ev(0, "dws-waiting", reason="flux-dws service is not running"), *running_job()[2:8]]
    assert build_status(JOBID, log, None, T0 + 20).last_message == ""


@pytest.mark.parametrize(
    "tail,result",
    [
        ([ev(5, "finish", status=0), ev(6, "clean")], "COMPLETED"),
        ([ev(5, "finish", status=256), ev(6, "clean")], "FAILED"),
        ([ev(4, "exception", type="cancel", severity=0, note=""), ev(6, "clean")], "CANCELED"),
        ([ev(4, "exception", type="dws", severity=1, note=""), ev(5, "finish", status=0)], None),
    ],
)
def test_job_result_follows_flux_jobs(tail, result):
    assert job_result([ev(0, "submit", userid=1), ev(1, "alloc"), *tail]) == result


def test_status_text_has_no_terminal_codes_and_shows_time_left():
    text = "\n".join(render_status(build_status(JOBID, running_job(), None, T0 + 50.0)))
    assert "\x1b" not in text
    assert f58(JOBID) in text and "(running)" in text
    assert format_duration(1760) in text  # Setup's time left
    assert "rabbit is slow" in text


def test_status_json_is_the_view():
    doc = json.loads(dumps(build_status(JOBID, failed_container_job(), None, T0 + 500)))
    assert doc["result"] == "COMPLETED" and doc["exception"]["type"] == "dws"
    assert doc["container"]["phase"] == "PostRun"
    assert [s["state"] for s in doc["timeline"]][-1] == "Teardown"


# --------------------------------------------------------------------------- list


def rows(now: float = T0 + 100):
    objs = [
        workflow_obj(1, state="Setup", status="DriverWait"),
        workflow_obj(2, state="PreRun", status="Completed", ready=True),
    ]
    objs[1]["spec"]["userID"] = 2002
    return list_rows(objs, now, phases={1: "prolog"}, user_name=lambda uid: f"u{uid}")


def test_list_rows_are_newest_first_with_age_and_time_in_state():
    first, second = rows()
    assert (first.jobid, second.jobid) == (2, 1)
    assert second.age == pytest.approx(100) and second.in_state == pytest.approx(90)
    assert second.phase == "prolog" and first.phase == "-"
    assert first.user == "u2002"


def test_list_filters_by_state_and_user():
    assert [r.jobid for r in filter_rows(rows(), states=[State.SETUP])] == [1]
    assert [r.jobid for r in filter_rows(rows(), userids=[2002])] == [2]
    assert filter_rows(rows(), states=[State.TEARDOWN]) == []


def test_default_format_header_lines_up_with_the_columns():
    lines = format_table(
        [list_record(r, prefix="f") for r in rows()], LIST_FORMATS["default"], LIST_FIELDS
    )
    header, first = lines[0], lines[1]
    assert header.split() == ["JOBID", "USER", "STATE", "STATUS", "AGE", "IN-STATE"]
    assert header.index("STATE") == first.index("PreRun")
    assert first.split()[0] == "f3"  # f58 of 2


def test_custom_format_uses_python_specs_and_shows_missing_numbers_as_a_dash():
    records = [list_record(r) for r in rows()]
    records[0]["age_s"] = None
    lines = format_table(records, "{jobid_dec:>4d}|{age_s:8.1f}|{user}", LIST_FIELDS)
    assert lines[0] == "JOBID|     AGE|USER"
    assert lines[1] == "   2|       -|u2002"
    assert lines[2] == "   1|   100.0|u1001"


@pytest.mark.parametrize(
    "fmt,word", [("{bogus}", "bogus"), ("{user:d}", "user"), ("{jobid", "invalid format")]
)
def test_a_bad_format_is_one_line_naming_the_problem(fmt, word):
    with pytest.raises(DwsError) as caught:
        format_table([list_record(r) for r in rows()], fmt, LIST_FIELDS)
    assert word in str(caught.value) and "\n" not in str(caught.value)


# --------------------------------------------------------------------------- cleanup plan


def test_plan_cleanup_sweeps_only_our_workflows_whose_job_is_not_held():
    ours_orphan = workflow_obj(10)
    ours_held = workflow_obj(11)
    other_instance = workflow_obj(12, identity="other")
    relabelled = workflow_obj(13)
    relabelled["metadata"]["labels"][INSTANCE_LABEL] = "other"
    wrong_jobid = workflow_obj(14)
    wrong_jobid["metadata"]["labels"][JOBID_LABEL] = "99"
    renamed = workflow_obj(15)
    renamed["metadata"]["name"] = "fluxjob-x-15-copy"
    unlabelled = workflow_obj(16)
    del unlabelled["metadata"]["labels"]
    workflows = [
        ours_orphan,
        ours_held,
        other_instance,
        relabelled,
        wrong_jobid,
        renamed,
        unlabelled,
        {"junk": True},
    ]
    plan = plan_cleanup(workflows, held_jobids=[11], identity="x")
    assert [(s.name, s.jobid) for s in plan] == [("fluxjob-x-10", 10)]
    assert "not held" in plan[0].reason


@given(st.lists(st.tuples(st.sampled_from(["x", "y"]), st.integers(0, 50)), max_size=20))
def test_plan_cleanup_never_names_another_instance_or_a_held_job(workflows):
    objs = [workflow_obj(jobid, identity=who) for who, jobid in workflows]
    held = {j for _, j in workflows if j % 3 == 0}
    for sweep in plan_cleanup(objs, held, "x"):
        assert sweep.jobid not in held
        assert sweep.name == workflow_name("x", sweep.jobid)
        assert ("x", sweep.jobid) in workflows


# --------------------------------------------------------------------------- small things


@given(st.integers(0, 2**64 - 1))
def test_job_ids_round_trip_through_f58(jobid):
    assert parse_jobid(f58(jobid)) == jobid
    assert parse_jobid(f58(jobid, "f")) == jobid
    assert parse_jobid(str(jobid)) == jobid
    assert parse_jobid(hex(jobid)) == jobid


@pytest.mark.parametrize("text", ["", "ƒ", "ƒ0OIl", "12x", "-5", str(2**64)])
def test_bad_job_ids_are_refused_naming_the_text(text):
    with pytest.raises(DwsError) as caught:
        parse_jobid(text)
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize(
    "seconds,text",
    [(None, "-"), (0.25, "0.25s"), (4.25, "4.2s"), (42, "42s"), (192, "3m12s"), (7500, "2h05m")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


# --------------------------------------------------------------------------- main()

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
CRASH = [
    "#DW jobdw type=gfs2 capacity=10GiB name=shared",
    "#DW container name=app profile=crash-loop DW_JOB_local_storage=shared",
]


def run(argv, source=None, environ=None):
    out, err = io.StringIO(), io.StringIO()
    factory = (lambda: source) if source is not None else None
    code = main(argv, out=out, err=err, source_factory=factory, environ=environ or {})
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def stack():
    from flux_dws.testing.stack import Stack

    with Stack(identity="clitest") as running:
        yield running


def test_status_and_logs_of_a_finished_container_failure(stack):
    jobid = stack.submit(CRASH, runtime=0.05)
    stack.wait(jobid)
    code, out, err = run(["status", f58(jobid)], StackSource(stack))
    assert (code, err) == (0, "")
    # the tasks ended well and the exception came after: flux-core's result stays COMPLETED,
    # flux dws status says what happened
    assert "INACTIVE (FAILED); flux jobs shows COMPLETED" in out
    assert "failed to run successfully after 7 attempts" in out
    assert "PostRun" in out and "Teardown" in out
    code, out, _ = run(["logs", str(jobid)], StackSource(stack))
    assert code == 0
    lead = f"container PostRun failed: {CRASH[1]}: user container(s) failed to run successfully"
    assert f"{f58(jobid)}: {lead}" in out  # the one form first, then DWS's detail
    assert "\n  detail: container MPIJob Failed (BackoffLimitExceeded/): " in out
    code, out, _ = run(["status", "--json", str(jobid)], StackSource(stack))
    doc = json.loads(out)
    assert doc["container"]["state"] == "failed" and doc["result"] == "COMPLETED"
    assert doc["outcome"] == "FAILED"
    memos = [e["context"] for e in stack.flux.info(jobid).eventlog if e["name"] == "memo"]
    assert memos[-1] == {"dws": {"result": "FAILED", "reason": doc["exception"]["note"]}}
    assert [set(m) for m in memos] == [{"rabbits"}, {"dws"}]  # the rabbits it got, at Setup


def test_status_and_list_of_a_job_waiting_in_prerun(stack):
    jobid = stack.submit([JOBDW, "#DW PreRun action=wait"], timeouts={"prerun": "10m"})
    try:
        stack.wait_workflow(jobid, State.PRERUN)
        code, out, _ = run(["status", str(jobid)], StackSource(stack))
        assert code == 0
        assert "desiredState PreRun, state PreRun, status DriverWait" in out
        prerun = [line for line in out.splitlines() if line.startswith("prerun")]
        assert "running" in prerun[0] and "9m" in prerun[0]

        code, out, _ = run(["list", "-o", "{jobid_dec} {state} {phase}"], StackSource(stack))
        assert code == 0
        assert f"{jobid} PreRun prolog" in out.splitlines()
        code, out, _ = run(["list", "--json", "-s", "setup"], StackSource(stack))
        assert [w["jobid"] for w in json.loads(out)["workflows"]] == []
        code, out, _ = run(["list", "-n", "-u", str(os.getuid() + 1)], StackSource(stack))
        assert (code, out) == (0, "")
    finally:
        stack.cancel(jobid)
        stack.wait(jobid)


def test_unknown_job_is_one_line(stack):
    code, out, err = run(["logs", "42"], StackSource(stack))
    assert code == 1 and out == ""
    assert err == f"flux-dws logs: job {f58(42)} not found\n"


def test_cleanup_sweeps_an_orphan_and_leaves_held_jobs_and_other_instances_alone():
    from flux_dws.k8s import KubeClient
    from flux_dws.testing.stack import Stack

    with Stack(identity="sweeper") as stack:
        held = stack.submit([JOBDW, "#DW PreRun action=wait"])
        stack.wait_workflow(held, State.PRERUN)
        stack.kill_service()  # otherwise the service would sweep the orphan itself
        clients = {
            who: KubeClient.connect(namespace="default", identity=who, kubeconfig=stack.kubeconfig)
            for who in ("sweeper", "neighbour")
        }
        for client in clients.values():
            client.create_workflow(jobid=7, userid=0, groupid=0, directives=[JOBDW])
        try:
            code, out, _ = run(["cleanup", "--dry-run"], StackSource(stack))
            assert code == 0
            assert out.splitlines() == [
                f"would sweep fluxjob-sweeper-7 ({f58(7)}): job {f58(7)} is not held by this "
                "instance (inactive or unknown)"
            ]
            code, out, _ = run(["cleanup", "--timeout", "20"], StackSource(stack))
            assert code == 0, out
            assert "swept fluxjob-sweeper-7" in out

            def names() -> set[str]:
                items = stack.api.store.list("workflows", "default")[0]
                return {w["metadata"]["name"] for w in items}

            # deleted: gone once DWS (dwssim) has removed its own finalizer, a moment later
            wait_for(lambda: "fluxjob-sweeper-7" not in names(), "fluxjob-sweeper-7 to go")
            assert {"fluxjob-neighbour-7", workflow_name("sweeper", held)} <= names()
            code, out, _ = run(["cleanup"], StackSource(stack))
            assert (code, out) == (0, "no orphaned workflows for instance sweeper\n")
        finally:
            for client in clients.values():
                client.close()


def test_without_a_flux_instance_each_command_says_so_in_one_line():
    for command in (["status", "1"], ["list"], ["logs", "1"], ["cleanup"]):
        code, out, err = run(command, environ={})
        assert code == 1 and out == ""
        assert err == (
            f"flux-dws {command[0]}: not running under a Flux instance (FLUX_URI is not set)\n"
        )


def test_usage_errors_are_one_line_naming_the_command_and_bare_usage_fails():
    code, out, err = run(["logs"])
    assert code == 2 and len(err.splitlines()) == 1 and "JOBID" in err
    assert err.startswith("flux-dws logs: ") and "`flux dws logs --help`" in err
    code, out, err = run(["simulate", "--jobs", "many"])
    assert code == 2 and err.startswith("flux-dws simulate: ") and len(err.splitlines()) == 1
    code, out, err = run(["frobnicate"])
    assert code == 2 and len(err.splitlines()) == 1 and "frobnicate" in err
    assert err.startswith("flux-dws: ")
    code, out, err = run([])  # like a bare `flux`: usage, and a failure
    assert code == 2 and out == "" and "simulate" in err and "cleanup" in err


def test_the_service_s_usage_errors_are_one_line_too():
    env = {k: v for k, v in os.environ.items() if k != "FLUX_URI"}
    bad = subprocess.run(
        [sys.executable, "-m", "flux_dws", "service", "--bogus"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert bad.returncode == 2
    assert bad.stderr == (
        "flux-dws service: unrecognized arguments: --bogus (see `flux dws service --help`)\n"
    )


def test_without_flux_core_the_commands_say_so_and_hint_only_when_it_helps():
    off = {"FLUX_URI": "local:///nonexistent", "FLUX_DWS_FLUX": "none"}
    code, out, err = run(["list"], environ=off)
    assert (code, out) == (1, "")
    assert err == "flux-dws list: flux-core is not installed (FLUX_DWS_FLUX=none)\n"
    from flux_dws.flux.bindings import run_under_flux_hint

    nowhere = {"PATH": "/nonexistent", "FLUX_DWS_FLUX": ""}
    # started by `flux` (FLUX_EXEC_PATH set): running it as `flux dws` again would not help
    assert run_under_flux_hint("flux dws list", {**nowhere, "FLUX_EXEC_PATH": "/x"}) == ""
    if flux_command({"PATH": "/nonexistent"}) is None:  # no flux in /opt/flux either
        assert "`flux dws list`" in run_under_flux_hint("flux dws list", nowhere)


def test_python_dash_m_runs_the_same_cli_and_service_reaches_the_daemon():
    env = {k: v for k, v in os.environ.items() if k != "FLUX_URI"}
    usage = subprocess.run(
        [sys.executable, "-m", "flux_dws"], capture_output=True, text=True, timeout=60, env=env
    )
    assert usage.returncode == 2 and "status" in usage.stderr
    service = subprocess.run(
        [sys.executable, "-m", "flux_dws", "service", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert service.returncode == 0 and "flux-dws service" in service.stdout
