# SPDX-License-Identifier: LGPL-3.0-only
"""Early release (flux_dws.core.release and its part of decide()): the pure decisions.

With ``[dws] release-nodes = "after-unmount"`` a job's nodes go back once PostRun is ready
and every ClientMount reads unmounted; its ssd parts are held down until Teardown is done;
the rest of the workflow is decided from the workflow alone (the job is inactive).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from test_lifecycle import JOBDW, NOW, job, wf

from flux_dws.base.errors import PolicyError, RequestError
from flux_dws.core import actions as act
from flux_dws.core import release as rl
from flux_dws.core.health import Failures, unmount_failures
from flux_dws.core.identity import INSTANCE_LABEL, JOBID_LABEL
from flux_dws.core.jobview import JobException, JobPhase, JobView
from flux_dws.core.lifecycle import decide
from flux_dws.core.policy import policy_from_table
from flux_dws.core.request import DwRequest, request_from_attributes
from flux_dws.core.states import State, Status

EARLY = policy_from_table({"release-nodes": "after-unmount"})
SAFE = policy_from_table({})
HOSTS = ("node1", "node2")
SSD = ("/cluster0/rabbit-0/ssd0", "/cluster0/rabbit-0/ssd1")


def early_request(policy=EARLY, **system: Any) -> DwRequest:
    got = request_from_attributes({"dw": [JOBDW], **system}, policy, userid=1001, owner_uid=1001)
    assert got is not None
    return got


def ended(**kw: Any) -> JobView:
    """A job that ran and is in its epilog, PostRun asked for."""
    base: dict[str, Any] = dict(
        request=early_request(),
        hosts=HOSTS,
        ssd=SSD,
        started=True,
        posted_state=State.POSTRUN,
        deadline=NOW + 100,
    )
    base.update(kw)
    return job(JobPhase.EPILOG, **base)


def unmounted(*stuck: str) -> Failures:
    return Failures("PostRun", stuck, {n: "unmount failed: still mounted" for n in stuck})


def marked(view, mark: rl.ReleaseMark):
    return dataclasses.replace(view, annotations={rl.RELEASE_ANNOTATION: mark.to_annotation()})


def of(actions: list[act.Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


# ---- policy and request ------------------------------------------------------------------


def test_policy_key_defaults_to_after_teardown_and_names_a_bad_value() -> None:
    assert SAFE.release_nodes == "after-teardown"
    assert EARLY.release_nodes == "after-unmount"
    with pytest.raises(PolicyError, match=r"release-nodes: invalid value 'soon'"):
        policy_from_table({"release-nodes": "soon"})
    with pytest.raises(PolicyError, match="release-nodes: must be a string"):
        policy_from_table({"release-nodes": True})


def test_job_may_ask_for_the_safe_behaviour_never_the_early_one() -> None:
    assert early_request().releases_early
    assert not early_request(dw_release="after-teardown").releases_early
    assert not early_request(SAFE).releases_early
    with pytest.raises(RequestError, match="this site holds a job's nodes until Teardown"):
        early_request(SAFE, dw_release="after-unmount")
    with pytest.raises(RequestError, match="system.dw_release must be one of"):
        early_request(dw_release=3)
    with pytest.raises(RequestError, match="system.dw_release is set but system.dw is not"):
        request_from_attributes({"dw_release": "after-teardown"}, EARLY, userid=1, owner_uid=1)


def test_the_choice_survives_the_stored_request() -> None:
    stored = DwRequest.from_json(json.loads(json.dumps(early_request().to_json())))
    assert stored.releases_early
    with pytest.raises(RequestError, match="'release' must be one of"):
        DwRequest.from_json({**early_request().to_json(), "release": "never"})


# ---- the release ------------------------------------------------------------------------


def test_postrun_ready_reads_the_clientmounts_first() -> None:
    assert of(decide(ended(), wf(State.POSTRUN), EARLY, NOW), act.ReadFailures) == [
        act.ReadFailures(State.POSTRUN)
    ]


def test_all_unmounted_releases_the_nodes_holding_the_ssd_parts_first() -> None:
    actions = decide(ended(failures=unmounted()), wf(State.POSTRUN), EARLY, NOW)
    names = [type(a).__name__ for a in actions]
    # the workflow moves on, the parts are held and the mark written before the epilog ends
    assert names.index("SetDesiredState") < names.index("FinishEpilog")
    assert names.index("HoldStorage") < names.index("FinishEpilog")
    assert names.index("MarkReleased") < names.index("FinishEpilog")
    assert names[-1] == "FinishEpilog"
    assert of(actions, act.SetDesiredState)[0].state is State.DATAOUT
    assert of(actions, rl.HoldStorage) == [rl.HoldStorage(SSD)]
    event = next(a for a in of(actions, act.PostEvent) if a.name == "dws-release")
    # in Flux before DataOut is asked: a restart must find the job released, or DataOut's
    # outcome would go unsaved (the release would be decided after DataOut was over)
    assert event.wait and actions.index(event) < names.index("SetDesiredState")
    assert event.context["nodes"] == list(HOSTS) and event.context["drained"] == []
    assert "reason" not in event.context
    mark = of(actions, rl.MarkReleased)[0].mark
    assert mark.ssd == SSD and mark.dataout == 3600 and mark.teardown == 1800
    assert not of(actions, act.DrainNodes) and not of(actions, act.RaiseException)


def test_policy_off_or_job_choosing_safe_holds_the_nodes_as_today() -> None:
    for policy, view in (
        (SAFE, ended(request=early_request(SAFE), failures=unmounted())),
        (EARLY, ended(request=early_request(dw_release="after-teardown"), failures=unmounted())),
    ):
        actions = decide(view, wf(State.POSTRUN), policy, NOW)
        assert [type(a).__name__ for a in lc_moves(actions)] == ["SetDesiredState"]
        assert of(actions, act.SetDesiredState)[0].state is State.DATAOUT


def lc_moves(actions: list[act.Action]) -> list[act.Action]:
    return [a for a in actions if not isinstance(a, act.PostEvent)]


def test_not_yet_ready_waits_and_a_job_that_never_ran_is_not_released_early() -> None:
    assert not of(decide(ended(), wf(State.POSTRUN, ready=False), EARLY, NOW), act.FinishEpilog)
    never = ended(started=False, failures=unmounted())
    assert not of(decide(never, wf(State.POSTRUN), EARLY, NOW), rl.MarkReleased)


def test_stuck_unmount_past_the_deadline_drains_that_node_alone_and_releases_the_rest() -> None:
    view = ended(deadline=NOW - 1, failures=unmounted("node2"))
    actions = decide(view, wf(State.POSTRUN, ready=False), EARLY, NOW)
    drains = of(actions, act.DrainNodes)
    assert [d.hosts for d in drains] == [("node2",)]
    assert "job ƒ" in drains[0].reason or "job f" in drains[0].reason
    assert "fluxjob-test-42" in drains[0].reason and "PostRun did not unmount" in drains[0].reason
    assert of(actions, act.SetDesiredState)[0].state is State.TEARDOWN
    assert "still mounted on node2" in of(actions, act.RaiseException)[0].note
    assert of(actions, rl.MarkReleased)[0].mark.drained == ("node2",)
    names = [type(a).__name__ for a in actions]
    assert names.index("DrainNodes") < names.index("FinishEpilog") == len(names) - 1


def test_a_restart_inside_the_release_finishes_it_without_posting_again() -> None:
    first = decide(ended(failures=unmounted()), wf(State.POSTRUN), EARLY, NOW)
    event = next(a for a in of(first, act.PostEvent) if a.name == "dws-release")
    mark = of(first, rl.MarkReleased)[0].mark
    # killed after the event and the DataOut patch: the job is still in its epilog
    again = ended(release=event.context, posted_state=State.DATAOUT)
    actions = decide(again, wf(State.DATAOUT, ready=False), EARLY, NOW)
    assert not [a for a in of(actions, act.PostEvent) if a.name == "dws-release"]
    assert [type(a).__name__ for a in lc_moves(actions)] == [
        "HoldStorage",
        "MarkReleased",
        "FinishEpilog",
    ]
    # killed after the mark was written: nothing is written twice
    done = decide(again, marked(wf(State.DATAOUT, ready=False), mark), EARLY, NOW)
    assert [type(a).__name__ for a in lc_moves(done)] == ["HoldStorage", "FinishEpilog"]
    # even when DataOut completes before the epilog could finish, the job is not held on
    late = decide(again, marked(wf(State.DATAOUT), mark), EARLY, NOW)
    assert of(late, act.FinishEpilog) and not of(late, act.RecordCopies)


# ---- after the release: the workflow alone ------------------------------------------------

GONE = JobView(42, JobPhase.GONE, userid=-1, groupid=-1)
MARK = rl.ReleaseMark(ssd=SSD, dataout=3600.0, teardown=1800.0)


def test_dataout_running_waits_for_its_deadline() -> None:
    actions = decide(GONE, marked(wf(State.DATAOUT, ready=False, since=NOW - 10), MARK), EARLY, NOW)
    assert actions == [rl.HoldStorage(SSD), act.WakeAt(NOW - 10 + 3600)]


def test_dataout_done_is_recorded_before_teardown_is_asked() -> None:
    actions = decide(GONE, marked(wf(State.DATAOUT), MARK), EARLY, NOW)[1:]
    assert [type(a).__name__ for a in actions] == ["RecordRelease", "SetDesiredState"]
    assert actions[0].state == "DataOut" and actions[0].outcome["status"] == "done"
    assert actions[1] == act.SetDesiredState(State.TEARDOWN)


def test_a_done_state_is_dated_by_dws_the_same_on_every_decision() -> None:
    """The outcome of a done state says when DWS saw it done (readyChange), not when this
    decision ran: a record saved again later (the workflow being deleted, a restart) keeps
    its time, and a job given the parts afterwards is never dated before it (seen on real
    Fluxion: the Teardown record re-saved while the workflow was deleted)."""
    for state in (State.DATAOUT, State.TEARDOWN):
        done = dataclasses.replace(marked(wf(state), MARK), ready_change=NOW - 5)
        for view, now in ((done, NOW), (dataclasses.replace(done, deleting=True), NOW + 60)):
            (record,) = of(decide(GONE, view, EARLY, now), rl.RecordRelease)
            assert record.outcome["status"] == "done" and record.outcome["at"] == NOW - 5
    unknown = marked(wf(State.TEARDOWN), MARK)  # no readyChange: the decision's own time
    (record,) = of(decide(GONE, unknown, EARLY, NOW), rl.RecordRelease)
    assert record.outcome["at"] == NOW


@pytest.mark.parametrize(
    "view, words",
    [
        (wf(State.DATAOUT, ready=False, status=Status.ERROR, message="copy failed"), "copy failed"),
        (wf(State.DATAOUT, ready=False, since=NOW - 4000), "did not complete within 1h"),
    ],
)
def test_dataout_failed_or_late_is_recorded_then_torn_down(view, words: str) -> None:
    held, record, teardown = decide(GONE, marked(view, MARK), EARLY, NOW)
    assert held == rl.HoldStorage(SSD)
    assert record.state == "DataOut" and record.outcome["status"] == "failed"
    assert words in record.outcome["message"]
    assert teardown == act.SetDesiredState(State.TEARDOWN, hurry=True)


def test_teardown_done_returns_the_parts_before_the_workflow_is_deleted() -> None:
    actions = decide(GONE, marked(wf(State.TEARDOWN), MARK), EARLY, NOW)
    assert [type(a).__name__ for a in actions] == [
        "RecordRelease",
        "ReturnStorage",
        "DeleteWorkflow",
    ]
    assert actions[1] == rl.ReturnStorage(SSD)


def test_teardown_running_keeps_the_parts_and_a_stuck_one_gives_them_back_loudly() -> None:
    running = decide(GONE, marked(wf(State.TEARDOWN, ready=False, since=NOW - 5), MARK), EARLY, NOW)
    assert not of(running, rl.ReturnStorage) and not of(running, act.DeleteWorkflow)
    assert running == [rl.HoldStorage(SSD), act.WakeAt(NOW - 5 + 1800)]
    stuck = decide(
        GONE, marked(wf(State.TEARDOWN, ready=False, since=NOW - 1801), MARK), EARLY, NOW
    )
    assert stuck[0].outcome["status"] == "failed"
    assert [type(a).__name__ for a in stuck] == ["RecordRelease", "ReturnStorage", "DeleteWorkflow"]


def test_never_returned_before_teardown_whatever_the_state() -> None:
    for state in (State.POSTRUN, State.DATAOUT):
        for ready in (True, False):
            for status in (Status.COMPLETED, Status.ERROR, Status.DRIVER_WAIT):
                view = marked(wf(state, ready=ready, status=status), MARK)
                assert not of(decide(GONE, view, EARLY, NOW), rl.ReturnStorage)


def test_a_released_workflow_is_not_swept_as_an_orphan_but_an_unmarked_one_is() -> None:
    assert decide(GONE, wf(State.DATAOUT, ready=False), EARLY, NOW) == [
        act.SetDesiredState(State.TEARDOWN, hurry=True)
    ]
    assert not of(
        decide(GONE, marked(wf(State.DATAOUT, ready=False), MARK), EARLY, NOW), act.SetDesiredState
    )


# ---- the mark and the ClientMounts, untrusted ---------------------------------------------


def test_mark_round_trips_and_a_bad_one_holds_nothing() -> None:
    assert rl.read_mark({}) is None
    text = rl.ReleaseMark(ssd=SSD, dataout=math.inf, drained=("node2",)).to_annotation()
    back = rl.read_mark({rl.RELEASE_ANNOTATION: text})
    assert back == rl.ReleaseMark(ssd=SSD, dataout=math.inf, teardown=math.inf, drained=("node2",))
    for bad in ("{", "[]", '{"timeouts": 3}', '{"timeouts": {}, "ssd": ["relative"]}', "\x00"):
        mark = rl.read_mark({rl.RELEASE_ANNOTATION: bad})
        assert mark is not None and mark.ssd == () and mark.problem.startswith("annotation ")
    # a released workflow whose mark is unreadable is still finished without its job
    broken = marked(wf(State.POSTRUN), rl.ReleaseMark())
    broken = dataclasses.replace(broken, annotations={rl.RELEASE_ANNOTATION: "{"})
    assert decide(GONE, broken, EARLY, NOW) == [act.SetDesiredState(State.TEARDOWN, hurry=True)]


def test_every_decision_before_teardown_is_over_holds_the_parts_again() -> None:
    # a restarted Fluxion (instance restart) has the parts up again: the next decision
    # marks them down before anything else
    for view in (
        wf(State.POSTRUN),
        wf(State.DATAOUT, ready=False),
        wf(State.TEARDOWN, ready=False),
    ):
        assert decide(GONE, marked(view, MARK), EARLY, NOW)[0] == rl.HoldStorage(SSD)


def clientmount(node: Any, *states: str, error: Any = None) -> dict[str, Any]:
    status: dict[str, Any] = {"mounts": [{"state": s} for s in states]}
    if error is not None:
        status["error"] = error
    return {"spec": {"node": node}, "status": status}


def test_unmount_failures_names_the_nodes_still_mounted() -> None:
    objects = [
        clientmount("node1", "unmounted"),
        clientmount("node2", "unmounted", "mounted"),
        clientmount("node3", "mounted"),  # not the job's
        clientmount(7, "mounted"),
        "junk",
        clientmount("node1", "unmounted", error={"userMessage": "umount: busy"}),
    ]
    got = unmount_failures(objects, HOSTS, "PostRun")
    assert got.state == "PostRun" and got.nodes == ("node1", "node2")
    assert "umount: busy" in got.causes["node1"]
    assert unmount_failures([clientmount("node1", "unmounted")], HOSTS, "PostRun").nodes == ()


def test_exception_aborting_before_the_release_keeps_todays_path() -> None:
    cancelled = ended(exception=JobException("cancel"), failures=unmounted())
    actions = decide(cancelled, wf(State.POSTRUN), EARLY, NOW)
    assert not of(actions, rl.MarkReleased) and not of(actions, act.FinishEpilog)


def test_cleanup_leaves_a_released_workflow_to_the_service() -> None:
    from flux_dws.core.reconcile import plan_cleanup

    def obj(name: str, jobid: int, annotations: dict[str, str]) -> dict[str, Any]:
        labels = {INSTANCE_LABEL: "test", JOBID_LABEL: str(jobid)}
        meta = {"name": name, "labels": labels, "annotations": annotations}
        return {"metadata": meta, "spec": {"jobID": str(jobid)}}

    released = obj("fluxjob-test-42", 42, {rl.RELEASE_ANNOTATION: MARK.to_annotation()})
    orphan = obj("fluxjob-test-43", 43, {})
    assert [s.jobid for s in plan_cleanup([released, orphan], [], "test")] == [43]


def test_a_released_job_whose_workflow_vanished_gives_its_parts_back() -> None:
    view = ended(release={"drained": []}, posted_state=State.DATAOUT)
    actions = decide(view, None, EARLY, NOW)
    assert of(actions, rl.ReturnStorage) == [rl.ReturnStorage(SSD)]
    assert isinstance(actions[-1], act.FinishEpilog)


def _listed(annotations: Any, *, deleting: bool = False, ours: bool = True) -> dict[str, Any]:
    from flux_dws.core.identity import FINALIZER

    meta: dict[str, Any] = {"name": "w", "annotations": annotations}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    meta["finalizers"] = [FINALIZER] if ours else []
    return {"metadata": meta}


def test_held_parts_are_every_released_workflows_paths_but_one_deleted_by_hand():
    def mark(*paths: str) -> dict[str, str]:
        return {rl.RELEASE_ANNOTATION: rl.ReleaseMark(ssd=paths).to_annotation()}

    listed = [
        _listed(mark("/c/r0/ssd1", "/c/r0/ssd0")),
        _listed(mark("/c/r1/ssd0"), deleting=True),  # ours: Teardown may still be going
        _listed(mark("/c/r2/ssd0"), deleting=True, ours=False),  # deleted by hand
        _listed({rl.RELEASE_ANNOTATION: "{junk"}),  # a mark that holds nothing
        _listed({"other": "x"}),
        _listed(["not", "a", "mapping"]),
        {"metadata": "junk"},
    ]
    assert rl.held_parts(listed) == ("/c/r0/ssd0", "/c/r0/ssd1", "/c/r1/ssd0")


def test_pool_marks_never_mark_a_held_part_up_and_give_back_what_the_rabbit_allows():
    marks = rl.PoolMarks()
    paths = ["/c/r0/ssd0", "/c/r0/ssd1", "/c/r0/ssd2"]
    assert marks.hold(["/c/r0/ssd0"]) == {"/c/r0/ssd0": False}
    assert marks.hold(["/c/r0/ssd0"]) == {}  # down already
    assert marks.rabbit("r0", paths, kept=()) == {"/c/r0/ssd1": True, "/c/r0/ssd2": True}
    assert marks.rabbit("r0", paths, kept=paths) == {"/c/r0/ssd1": False, "/c/r0/ssd2": False}
    assert marks.give_back(["/c/r0/ssd0"]) == {}  # its rabbit is down: it stays down
    assert marks.rabbit("r0", paths, kept=["/c/r0/ssd2"])["/c/r0/ssd0"] is True
