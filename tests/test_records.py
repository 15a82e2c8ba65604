# SPDX-License-Identifier: LGPL-3.0-only
"""Data-movement records and container output: the pure parts, the decisions, the stand-ins.

copies.py and output.py read untrusted Kubernetes objects; lifecycle.decide() must record the
copies of DataIn/DataOut and save the containers' output before anything moves past them;
kubeapi serves pods/log as the real server does (over HTTP, with the real client); fakeflux's
``save`` follows the protocol.
"""

from __future__ import annotations

import dataclasses
import errno
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flux_dws.base.jobid import f58
from flux_dws.core import actions as act
from flux_dws.core.copies import (
    DIRECTIVE_INDEX_LABEL,
    INITIATOR_LABEL,
    copy_note,
    copy_records,
    first_error,
    go_duration,
    pending_copies,
)
from flux_dws.core.jobview import JobPhase, JobView
from flux_dws.core.lifecycle import decide
from flux_dws.core.output import pod_containers, read_saved, tail, tail_lines
from flux_dws.core.states import State, Status
from flux_dws.flux.jobrecords import job_view
from tests.test_lifecycle import POLICY, job, recorded, request, wf

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
IN1 = "#DW copy_in source=/lus/a destination=$DW_JOB_scratch/a"
IN2 = "#DW copy_in source=/lus/b destination=$DW_JOB_scratch/b"
OUT = "#DW copy_out source=$DW_JOB_scratch/o destination=/lus/o"
DIRECTIVES = (JOBDW, IN1, IN2, OUT)
NOW = 1_800_000_000.0


def dm(index: int, command: str = "copy_in", **status) -> dict:
    labels = {INITIATOR_LABEL: command, DIRECTIVE_INDEX_LABEL: str(index)}
    return {
        "metadata": {"name": f"w-{index}", "namespace": "rabbit-0", "labels": labels},
        "status": status,
    }


# ----------------------------------------------------------------------------- copies.py


def test_records_aggregate_every_object_of_a_directive():
    ok = dict(
        state="Finished",
        status="Success",
        startTime="2026-01-01T00:00:00.000000Z",
        endTime="2026-01-01T00:00:04.500000Z",
        commandStatus={"files": 3, "items": 4, "progress": 100, "data": "1.000 KiB (1024 bytes)"},
    )
    bad = dict(
        state="Finished",
        status="Failed",
        message="exit status 1: walking\n"
        "[t] ERROR: Failed to open /lus/b/x.dat (errno=2 No such file or directory)",
        commandStatus={"files": 1, "elapsedTime": "1m2.5s"},
    )
    other = dm(1, "copy_out", state="Finished", status="Failed")  # another initiator
    records = copy_records(
        State.DATAIN,
        DIRECTIVES,
        [dm(1, **ok), dm(2, **ok), dm(2, **bad), other, "junk", {"metadata": 7}],
    )
    assert [(r.index, r.status) for r in records] == [(1, "Success"), (2, "Failed")]
    first, second = records
    assert (first.files, first.bytes, first.elapsed, first.movements) == (3, 1024, 4.5, 1)
    assert (second.files, second.bytes, second.elapsed, second.movements) == (4, 1024, 62.5, 2)
    note = copy_note(second, 83969966080)
    assert note.startswith(f"DataIn failed: {IN2}: ")
    error = "ERROR: Failed to open /lus/b/x.dat (errno=2 No such file or directory)"
    assert note.endswith(f"{error}; check the paths; flux dws status {f58(83969966080)}")


def test_a_directive_without_objects_is_unknown_and_says_why():
    (record, _) = copy_records(State.DATAIN, DIRECTIVES, [], problem="403 forbidden")
    assert (record.status, record.message) == ("Unknown", "403 forbidden")
    running = copy_records(State.DATAIN, DIRECTIVES, [dm(1, state="Running")])[0]
    assert running.status == "Unknown" and "still Running" in running.message


def test_pending_copies_follow_the_latest_record():
    assert pending_copies(DIRECTIVES, State.DATAIN, None) == (1, 2)
    assert pending_copies(DIRECTIVES, State.DATAIN, (State.DATAIN, 1)) == (2,)
    assert pending_copies(DIRECTIVES, State.DATAIN, (State.DATAIN, 2)) == ()
    assert pending_copies(DIRECTIVES, State.DATAOUT, (State.DATAIN, 2)) == (3,)
    assert pending_copies(DIRECTIVES, State.DATAIN, (State.DATAOUT, 3)) == ()
    assert pending_copies(DIRECTIVES, State.PRERUN, None) == ()


def test_first_error_prefers_an_error_line_and_is_bounded():
    assert first_error("exit status 2: a\nb\nc") == "a"
    assert first_error("exit status 1: walk\nERROR: no such file /x") == "ERROR: no such file /x"
    assert len(first_error("ERROR " + "x" * 5000)) == 300
    assert first_error("") == ""


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(), c, max_size=3),
        max_leaves=20,
    )
)
def test_untrusted_objects_never_raise(obj):
    copy_records(State.DATAIN, DIRECTIVES, [obj, {"metadata": {"labels": obj}, "status": obj}])
    pod_containers(obj)
    pod_containers({"status": {"containerStatuses": [obj]}, "spec": obj})
    read_saved(obj)


def test_go_durations():
    assert go_duration("294.183ms") == 0.294183
    assert go_duration("1h2m3s") == 3723.0
    assert go_duration("3 seconds") is None and go_duration(5) is None


# ----------------------------------------------------------------------------- output.py


def test_container_status_reads_exit_codes_restarts_and_waiting():
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]},
        "status": {
            "containerStatuses": [
                {"name": "a", "state": {"terminated": {"exitCode": 139, "reason": "Error"}}},
                {
                    "name": "b",
                    "restartCount": 6,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 2, "reason": "Error"}},
                },
                {
                    "name": "c",
                    "state": {"waiting": {"reason": "ErrImagePull", "message": "no\x00"}},
                },
            ]
        },
    }
    a, b, c = pod_containers(pod)
    assert (a.state, a.exit_code, a.reason) == ("terminated", 139, "Error")
    assert (b.exit_code, b.restarts, b.reason) == (2, 6, "Error, then CrashLoopBackOff")
    assert (c.state, c.exit_code) == ("waiting", None) and "\x00" not in c.reason


def test_tail_keeps_whole_lines_and_replaces_nul():
    data = b"".join(b"line %d\n" % i for i in range(1000)) + b"bad \x00 \xff end\n"
    text, truncated = tail(data, 100)
    assert truncated and text.startswith("line ") and len(text.encode()) <= 100
    assert text.endswith("bad \\x00 \ufffd end\n")  # NUL as untrusted.field writes it
    assert tail(b"short\n", 100) == ("short\n", False)
    assert tail_lines(64 * 1024) == (8192, 819, 81, 8, 1)


# ----------------------------------------------------------------------------- decisions


def copy_job(phase: JobPhase, **kw) -> JobView:
    return job(phase, request=request(*DIRECTIVES), **kw)


def copy_wf(state: State, **kw):
    return dataclasses.replace(wf(state, **kw), directives=DIRECTIVES)


def test_datain_copies_are_recorded_before_prerun_is_asked_for():
    j = copy_job(JobPhase.PROLOG, **recorded(State.DATAIN))
    actions = decide(j, copy_wf(State.DATAIN), POLICY, NOW)
    assert actions == [act.RecordCopies(State.DATAIN, (1, 2))]
    j = dataclasses.replace(j, copies_recorded=(State.DATAIN, 1))
    assert decide(j, copy_wf(State.DATAIN), POLICY, NOW) == [act.RecordCopies(State.DATAIN, (2,))]
    j = dataclasses.replace(j, copies_recorded=(State.DATAIN, 2))
    asked = [
        a
        for a in decide(j, copy_wf(State.DATAIN), POLICY, NOW)
        if isinstance(a, act.SetDesiredState)
    ]
    assert asked == [act.SetDesiredState(State.PRERUN)]


def test_failed_datain_is_recorded_first_then_torn_down():
    j = copy_job(JobPhase.PROLOG, **recorded(State.DATAIN))
    failed = copy_wf(State.DATAIN, ready=False, status=Status.ERROR, message="DW Directive 2: x")
    assert decide(j, failed, POLICY, NOW) == [act.RecordCopies(State.DATAIN, (1, 2))]
    j = dataclasses.replace(j, copies_recorded=(State.DATAIN, 2))
    actions = decide(j, failed, POLICY, NOW)
    assert act.SetDesiredState(State.TEARDOWN, hurry=True) in actions


def test_dataout_copies_are_recorded_before_teardown_and_not_while_moving():
    j = copy_job(
        JobPhase.EPILOG, started=True, copies_recorded=(State.DATAIN, 2), **recorded(State.DATAOUT)
    )
    assert decide(j, copy_wf(State.DATAOUT), POLICY, NOW) == [act.RecordCopies(State.DATAOUT, (3,))]
    moving = decide(j, copy_wf(State.DATAOUT, ready=False), POLICY, NOW)
    assert not [a for a in moving if isinstance(a, act.RecordCopies)]


def test_latest_copy_record_comes_back_from_the_job_record():
    record = {
        "id": 42,
        "phase": "prolog",
        "userid": 1001,
        "dws": {"dws-datamovement": {"state": "DataIn", "index": 2, "status": "Success"}},
    }
    view = job_view(record, (None, ""), groupid=1001)
    assert view.copies_recorded == (State.DATAIN, 2)
    record["dws"]["dws-datamovement"] = {"state": "DataIn", "index": True}
    assert job_view(record, (None, ""), groupid=1001).copies_recorded is None


# ----------------------------------------------------------------------------- kubeapi


def test_pod_log_is_served_as_the_real_server_serves_it(kubeapi, k8s_client):
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    from flux_dws.testing.kubeapi.podlog import logs_of

    store = kubeapi.store
    pod = {
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
        "status": {
            "containerStatuses": [
                {"name": "a", "state": {"terminated": {"exitCode": 0}}},
                {"name": "b", "state": {"waiting": {"reason": "ErrImagePull"}}},
            ]
        },
    }
    store.create("pods", "default", pod)
    logs_of(store).write("default", "p", "a", "one\ntwo\nthree\n")
    core = k8s.CoreV1Api(k8s_client)

    def read(**kw):
        return core.read_namespaced_pod_log("p", "default", _preload_content=False, **kw).data

    assert read(container="a") == b"one\ntwo\nthree\n"
    assert read(container="a", tail_lines=2) == b"two\nthree\n"
    assert read(container="a", tail_lines=2, limit_bytes=5) == b"two\nt"
    assert read(container="a", tail_lines=0) == b""
    logs_of(store).write("default", "p", "a", "one\rbar\ntwo")  # "\n" alone ends a line
    assert read(container="a", tail_lines=2) == b"one\rbar\ntwo"
    assert read(container="a", tail_lines=1) == b"two"
    logs_of(store).write("default", "p", "a", "one\ntwo\nthree\n")
    for kw, code, words in [
        ({}, 400, "a container name must be specified for pod p, choose one of: [a b]"),
        ({"container": "b"}, 400, 'container "b" in pod "p" is waiting to start: ErrImagePull'),
        ({"container": "zz"}, 400, "container zz is not valid for pod p"),
        ({"container": "a", "limit_bytes": 0}, 422, "must be greater than 0"),
    ]:
        with pytest.raises(ApiException) as caught:
            read(**kw)
        assert caught.value.status == code and words in json.loads(caught.value.body)["message"]
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod_log("gone", "default")
    assert caught.value.status == 404


# ----------------------------------------------------------------------------- fakeflux save


def test_fakeflux_save_follows_the_protocol():
    from flux_dws.flux.transport import RpcError
    from flux_dws.testing.fakeflux import FakeFlux
    from flux_dws.testing.fakeflux.plugin import DwsPlugin, Request

    with FakeFlux(["n0"]) as flux:
        jobid = flux.submit({"dw": JOBDW}, runtime=None)
        flux.wait(jobid, "DEPEND")
        plugin: DwsPlugin = flux._plugin
        answers = []

        def ask(payload, userid=flux.owner_uid):
            req = Request("save", userid, payload, False, answers.append, answers.append)
            flux.loop.run_sync(plugin.handle, req)
            return answers[-1]

        assert ask({"id": jobid, "key": "dws.output", "value": {"a": 1}}) == {}
        assert json.loads(flux.kvs_lookup(jobid, "dws.output")) == {"a": 1}
        bad = [
            ({"id": jobid, "key": "eventlog", "value": {}}, errno.EINVAL),
            ({"id": jobid, "key": "dws..x", "value": {}}, errno.EINVAL),
            ({"id": jobid, "key": "dws.x", "value": "text"}, errno.EPROTO),
            ({"id": 1, "key": "dws.x", "value": {}}, errno.ENOENT),
        ]
        for payload, code in bad:
            error = ask(payload)
            assert isinstance(error, RpcError) and error.errnum == code, (payload, error)
        assert ask({"id": jobid, "key": "dws.x", "value": {}}, userid=4242).errnum == errno.EPERM
        with pytest.raises(PermissionError):
            flux.kvs_lookup(jobid, "dws.output", userid=4242)
        flux.cancel(jobid)


# ----------------------------------------------------------------------------- dwssim


@pytest.mark.parametrize(
    "behavior, mpi, started, ended",
    [
        ("ok", False, "running", ("terminated", 0)),
        ("exit-nonzero", False, "running", ("terminated", 1)),
        ("crash-loop", True, "running", ("terminated", 139)),
        ("hang", False, "running", ("terminated", 137)),
        ("never-start", False, "waiting", ("waiting", None)),
        ("start-fail", False, "waiting", ("waiting", None)),
    ],
)
def test_dwssim_pods_end_as_their_behaviour_says(behavior, mpi, started, ended):
    from flux_dws.testing.dwssim.containers import Behavior, ProfileSettings
    from flux_dws.testing.dwssim.pods import ENDED, STARTED, pods

    workflow = {"metadata": {"name": "wf", "namespace": "default", "uid": "u"}}
    settings = ProfileSettings("p", Behavior(behavior), mpi=mpi, retry_limit=6)
    nodes = ("rabbit-0", "rabbit-1")
    first = pods(workflow, 1, settings, nodes, STARTED)
    assert len(first) == (3 if mpi else 2)
    assert {pod_containers(p)[0].state for p, _ in first} == {started}
    last = pods(workflow, 1, settings, nodes, ENDED)
    assert len(last) == (1 if mpi else 2)  # an MPI job's workers go with its launcher
    for pod, logs in last:
        assert pod["metadata"]["labels"]["nnf.cray.hpe.com/container"] == "wf"
        (status,) = pod_containers(pod)
        assert (status.state, status.exit_code) == ended
        assert bool(logs) == (ended[0] == "terminated")
        if behavior == "crash-loop":
            assert status.restarts == 6 and "Segmentation fault" in logs[status.name]


def test_text_from_kubernetes_is_safe_for_flux_json():
    pod = {
        "metadata": {"name": "p\ud800"},
        "spec": {"containers": [{"name": "a"}]},
        "status": {
            "containerStatuses": [
                {"name": "a", "state": {"terminated": {"exitCode": 1, "reason": "bad\x00\udfff"}}}
            ]
        },
    }
    (status,) = pod_containers(pod)
    assert "\\ud" not in json.dumps([status.pod, status.reason])
    (record, _) = copy_records(
        State.DATAIN, DIRECTIVES, [dm(1, state="Finished", status="Failed", message="x\udc80")]
    )
    assert "\\udc80" not in json.dumps(record.to_event())


def test_a_new_records_strings_are_shared_with_the_last_ones():
    from flux_dws.base.frozen import share_strings, share_strings_with

    old = share_strings(json.loads('{"attributes": {"system": {"dw": "#DW jobdw"}}, "dws": {}}'))
    new = json.loads(
        '{"attributes": {"system": {"dw": "#DW jobdw"}}, "dws": {"dws-state": {"state": "Setup"}}}'
    )
    expected = json.loads(json.dumps(new))
    assert share_strings_with(new, old) == expected
    assert new["attributes"] is old["attributes"]  # unchanged: the last record's copy
    assert new["dws"]["dws-state"]["state"] is share_strings(["Setup"])[0]  # changed: shared
    assert share_strings_with(json.loads(json.dumps(expected)), None) == expected
