# SPDX-License-Identifier: LGPL-3.0-only
"""Each action handler, run by the real executor against the embedded API server alone.

No service, no DWS simulator and no Flux: a handler is a function of the service's parts and
its action, so it is tested by running it and reading both its outcome and what it did to the
objects in Kubernetes.  The job-manager is a recorder that answers every request (or refuses
the ones a test names); Kubernetes is real HTTP to flux_dws/testing/kubeapi.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from flux_dws.base.loop import Loop
from flux_dws.core import actions as act
from flux_dws.core.jobview import JobPhase, JobView, ProposalInfo
from flux_dws.core.policy import Policy
from flux_dws.core.release import ReleaseMark
from flux_dws.core.states import State
from flux_dws.core.storage import ComputeLayout
from flux_dws.core.workflow import view_of
from flux_dws.flux.transport import RpcError
from flux_dws.k8s import KubeClient
from flux_dws.k8s.worker import KubeWorker
from flux_dws.service import dispatch
from flux_dws.service.executor import ActionExecutor
from flux_dws.service.jobs import Metrics, Seen
from flux_dws.service.outcome import (
    Adopted,
    AskAnswered,
    Asking,
    Delivered,
    Done,
    Learned,
    Outcome,
    Posted,
    ProposalRead,
    RecordChanged,
    Refused,
    Retry,
    Unposted,
    WorkflowDeleted,
)
from flux_dws.testing.dwssim.seed import seed

JOBID = 1234
XFS = "#DW jobdw type=xfs capacity=10GiB name=scratch"


class RecordingJobManager:
    """Answers every job-manager request on the loop, refusing the methods in ``refuse``."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.sent: list[tuple[str, tuple[Any, ...]]] = []
        self.refuse: dict[str, RpcError] = {}

    def _answer(self, method: str, args: tuple[Any, ...], on_done: Any) -> None:
        self.sent.append((method, args))
        error = self.refuse.get(method)
        self.loop.call_soon(on_done, None if error else {}, error)

    def __getattr__(self, method: str) -> Any:
        def request(*args: Any, **kwargs: Any) -> None:
            *args_, on_done = args
            self._answer(method, tuple(args_), on_done)

        return request


class Harness:
    """The real executor, its worker pool and a loop on a thread of their own."""

    def __init__(self, kube: KubeClient) -> None:
        self.loop = Loop(name="handlers").start_thread()
        self.worker = KubeWorker(2, deliver=self.loop.call_soon)
        self.jm = RecordingJobManager(self.loop)
        self.kube = kube
        self.reported: list[tuple[int, Outcome]] = []
        self.x = ActionExecutor(
            policy=Policy(),
            loop=self.loop,
            worker=self.worker,
            kube=kube,
            jm=self.jm,  # type: ignore[arg-type]
            metrics=Metrics(),
            report=lambda jobid, outcome: self.reported.append((jobid, outcome)),
        )

    def run(self, action: Any, seen: Seen, timeout: float = 30.0) -> Outcome:
        """Run ``action``'s handler on the loop; its outcome."""
        done = threading.Event()
        box: list[Outcome] = []

        def settle(outcome: Outcome) -> None:
            box.append(outcome)
            done.set()

        handler = dispatch.handler_for(action)
        self.loop.call_soon(self.x.run, handler, action, seen, settle)
        assert done.wait(timeout), f"{type(action).__name__} did not settle in {timeout}s"
        self.loop.run_sync(lambda: None)  # detached answers queued behind it are in
        assert len(box) == 1, box
        return box[0]

    def report(self, timeout: float = 30.0) -> Outcome:
        """The one outcome a detached call reported (waiting for it)."""
        deadline = time.monotonic() + timeout
        while not self.reported and time.monotonic() < deadline:
            time.sleep(0.01)
        ((jobid, outcome),) = self.reported
        assert jobid == JOBID
        self.reported.clear()
        return outcome

    def stop(self) -> None:
        self.worker.stop()
        self.loop.stop()
        self.loop.join(10)


@pytest.fixture
def kube(kubeapi) -> Iterator[KubeClient]:
    client = KubeClient.connect(namespace="default", identity="hx", kubeconfig=kubeapi.kubeconfig)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def h(kube) -> Iterator[Harness]:
    harness = Harness(kube)
    try:
        yield harness
    finally:
        harness.stop()


def job(phase: JobPhase = JobPhase.DEPEND, **kw: Any) -> JobView:
    return JobView(JOBID, phase, userid=os.getuid(), groupid=os.getgid(), **kw)


def seen_of(obj: dict | None, view: JobView | None = None, **kw: Any) -> Seen:
    wf, raw = view_of(obj) if obj is not None else (None, None)
    return Seen(view or job(), wf, raw, 0.0, **kw)


def create(h: Harness, *directives: str) -> dict:
    action = act.CreateWorkflow(directives or (XFS,), os.getuid(), os.getgid())
    outcome = h.run(action, seen_of(None))
    assert isinstance(outcome, Learned), outcome
    (adopted,) = outcome.facts
    assert isinstance(adopted, Adopted) and adopted.created
    return adopted.obj


# ---- workflow actions ------------------------------------------------------------------------


def test_create_workflow_creates_it_in_proposal_and_again_keeps_the_one_there(h, kube):
    obj = create(h)
    stored = kube.get_workflow(kube.workflow_name(JOBID))
    assert stored is not None and stored["metadata"]["uid"] == obj["metadata"]["uid"]
    assert stored["spec"]["desiredState"] == "Proposal"
    assert stored["spec"]["dwDirectives"] == [XFS]
    again = create(h)  # idempotent: an existing one of ours is kept
    assert again["metadata"]["uid"] == obj["metadata"]["uid"]


def test_create_workflow_refuses_what_dws_rejects_in_dwss_words(h, kube):
    action = act.CreateWorkflow(("#DW jobdw type=xfs name=scratch",), os.getuid(), os.getgid())
    outcome = h.run(action, seen_of(None))
    assert isinstance(outcome, Refused), outcome
    assert outcome.refusal.reason.startswith("DWS rejected the job's directives: ")
    assert kube.get_workflow(kube.workflow_name(JOBID)) is None


def test_create_workflow_with_an_unknown_group_looks_it_up_then_decides_again(h):
    action = act.CreateWorkflow((XFS,), os.getuid(), -1)
    outcome = h.run(action, seen_of(None))
    assert outcome == Learned(again=True)
    assert h.x.gids[os.getuid()] == os.getgid()


def test_set_desired_state_goes_on_at_once_and_the_answer_is_adopted(h, kube):
    obj = create(h)
    outcome = h.run(act.SetDesiredState(State.TEARDOWN, hurry=True), seen_of(obj))
    assert isinstance(outcome, Learned), outcome
    (asking,) = outcome.facts
    assert isinstance(asking, Asking) and asking.before is not None
    assert (asking.asked.desired_state, asking.asked.hurry) == (State.TEARDOWN, True)
    answer = h.report()
    assert isinstance(answer, Learned) and len(answer.facts) == 1
    (answered,) = answer.facts
    assert isinstance(answered, AskAnswered) and answered.asking is asking
    assert answered.obj["spec"]["desiredState"] == "Teardown"
    assert kube.get_workflow(obj["metadata"]["name"])["spec"]["desiredState"] == "Teardown"


def test_set_desired_state_on_a_workflow_gone_retries_without_failing_the_job(h, kube):
    obj = create(h)
    kube.delete_workflow(obj["metadata"]["name"])
    outcome = h.run(act.SetDesiredState(State.TEARDOWN), seen_of(obj))
    (asking,) = outcome.facts
    answer = h.report()
    assert isinstance(answer, Retry) and answer.failure is None, answer
    assert answer.why.startswith("asking for Teardown: ")
    assert answer.facts == (AskAnswered(asking),)  # the view goes back


def test_a_patch_the_server_refuses_is_judged_by_the_core(h, kubeapi):
    obj = create(h)
    kubeapi.faults.fail_next(1, code=403)
    h.run(act.SetDesiredState(State.TEARDOWN), seen_of(obj))
    answer = h.report()
    assert isinstance(answer, Retry) and answer.failure is not None, answer
    assert answer.failure.permanent and answer.failure.what == "asking for Teardown"


def test_setup_with_no_system_configuration_is_refused_as_unplaceable(h, kube):
    obj = create(h)
    need = _need()
    view = job(JobPhase.PROLOG, hosts=("c1",), proposal=ProposalInfo(needs=(need,)))
    outcome = h.run(act.SetDesiredState(State.SETUP, assign=("c1",)), seen_of(obj, view))
    assert isinstance(outcome, Refused), outcome
    assert outcome.refusal.state is State.SETUP
    assert "no SystemConfiguration 'default' yet" in outcome.refusal.reason
    assert kube.get_workflow(obj["metadata"]["name"])["spec"]["desiredState"] == "Proposal"


def _need():
    from flux_dws.core.storage import PER_COMPUTE, AllocationNeed

    return AllocationNeed("xfs", ("default", "s"), "xfs", PER_COMPUTE, 1 << 30)


def test_delete_workflow_removes_our_finalizer_and_the_workflow(h, kube):
    obj = create(h)
    name = obj["metadata"]["name"]
    outcome = h.run(act.DeleteWorkflow(), seen_of(obj))
    assert outcome == Learned((WorkflowDeleted(obj["metadata"]["uid"]),))
    assert kube.get_workflow(name) is None
    # deleted already (its DELETED event may lag): nothing is sent again
    assert h.run(act.DeleteWorkflow(), seen_of(obj, deleted=obj["metadata"]["uid"])) == Done()


def test_read_proposal_of_a_workflow_with_no_breakdowns_reads_no_needs(h):
    obj = create(h)
    outcome = h.run(act.ReadProposal(), seen_of(obj))
    assert outcome == Learned((ProposalRead(ProposalInfo(needs=(), container_timeouts={})),))


def test_mark_released_annotates_the_workflow(h, kube):
    obj = create(h)
    mark = ReleaseMark(ssd=("/cluster0/rabbit-0/ssd0",), dataout=60.0, teardown=60.0)
    outcome = h.run(act.MarkReleased(mark), seen_of(obj, job(JobPhase.EPILOG)))
    assert isinstance(outcome, Learned) and isinstance(outcome.facts[0], Adopted)
    annotations = kube.get_workflow(obj["metadata"]["name"])["metadata"]["annotations"]
    assert any(value == mark.to_annotation() for value in annotations.values())


def test_a_call_the_server_refuses_for_good_is_a_permanent_failure_for_the_core(h, kubeapi):
    obj = create(h)
    mark = ReleaseMark(dataout=60.0, teardown=60.0)
    seen = seen_of(obj, job(JobPhase.EPILOG))
    kubeapi.faults.fail_next(1, code=403)
    outcome = h.run(act.MarkReleased(mark), seen)
    assert isinstance(outcome, Retry) and outcome.failure is not None, outcome
    assert outcome.failure.permanent and outcome.failure.what == "marking the workflow released"
    # a server that keeps answering 503 past the client's own retries: transient for the core
    kubeapi.faults.fail_next(6, code=503)
    outcome = h.run(act.MarkReleased(mark), seen)
    assert isinstance(outcome, Retry) and outcome.failure is not None, outcome
    assert not outcome.failure.permanent
    assert "503" in outcome.failure.text


# ---- job-manager actions -------------------------------------------------------------------


def test_release_dependency_sends_the_update_and_moves_the_record_to_sched(h):
    update = {"attributes.system.dw": "x"}
    outcome = h.run(act.ReleaseDependency(update), seen_of(None))
    assert outcome == Learned((RecordChanged({"phase": "sched"}),))
    assert h.jm.sent == [("release", (JOBID, update))]


def test_an_error_flux_calls_already_done_counts_as_done(h):
    h.jm.refuse["epilog_finish"] = RpcError(errno.ENOENT, "no such job")
    outcome = h.run(act.FinishEpilog(), seen_of(None, job(JobPhase.EPILOG)))
    assert outcome == Learned((RecordChanged({"phase": "gone"}),))
    h.jm.refuse["epilog_finish"] = RpcError(errno.EPERM, "not yours")
    outcome = h.run(act.FinishEpilog(), seen_of(None, job(JobPhase.EPILOG)))
    assert isinstance(outcome, Retry) and outcome.failure is None
    assert outcome.why.startswith("epilog-finish: not yours")


def test_finish_prolog_refuses_a_copy_offload_job_whose_token_is_missing(h):
    action = act.FinishProlog(
        True, {"A": "1"}, token_secret=("default", "nope"), token_required=True
    )
    outcome = h.run(action, seen_of(None, job(JobPhase.PROLOG)))
    assert isinstance(outcome, Refused) and outcome.refusal.state is State.PRERUN
    assert "workflow token Secret default/nope is missing" in outcome.refusal.reason
    assert h.jm.sent == []  # the job never starts without it
    outcome = h.run(act.FinishProlog(True, {"A": "1"}), seen_of(None, job(JobPhase.PROLOG)))
    assert outcome == Learned((RecordChanged({"phase": "run", "started": True}),))
    assert h.jm.sent == [("prolog_finish", (JOBID, True, {"A": "1"}))]


def test_a_post_goes_on_at_once_and_a_refused_one_is_reported_undone(h):
    context = {"state": "Setup"}
    outcome = h.run(act.PostEvent("dws-state", context), seen_of(None))
    assert isinstance(outcome, Learned) and outcome.facts == (Posted("dws-state", context),)
    assert h.reported == [(JOBID, Learned((Delivered("dws-state", context),)))]
    h.reported.clear()
    h.jm.refuse["post"] = RpcError(errno.EPROTO, "bad event")
    outcome = h.run(act.PostEvent("dws-state", context), seen_of(None))
    assert isinstance(outcome, Learned)  # the chain went on
    ((jobid, later),) = h.reported
    assert jobid == JOBID and isinstance(later, Retry)
    assert later.facts == (Unposted("dws-state", context),)
    # a post the chain waits for fails the chain instead
    outcome = h.run(act.PostEvent("dws-release", context, wait=True), seen_of(None))
    assert isinstance(outcome, Retry) and outcome.why.startswith("post: bad event")


def test_raise_exception_records_the_first_fatal_exception_only_for_severity_0(h):
    outcome = h.run(act.RaiseException("boom"), seen_of(None))
    assert outcome == Learned(
        (RecordChanged({"exception": {"type": "dws", "severity": 0, "note": "boom"}}),)
    )
    assert h.run(act.RaiseException("minor", severity=1), seen_of(None)) == Done()


def test_the_nodes_layout_is_read_once_and_kept(h, kubeapi):
    seed(kubeapi.store, ["c1", "c2"], {"rabbit-0": ["c1", "c2"]})
    assert h.x.rabbits is None
    obj = create(h)
    view = job(JobPhase.PROLOG, hosts=("c1", "c2"))
    before = kubeapi.request_counts().get(("get", "systemconfigurations"), 0)
    outcome = h.run(act.ReadFailures(State.SETUP), seen_of(obj, view))
    assert isinstance(outcome, Learned)
    assert h.x.rabbits == ComputeLayout({"c1": "rabbit-0", "c2": "rabbit-0"})
    h.run(act.ReadFailures(State.SETUP), seen_of(obj, view))
    after = kubeapi.request_counts().get(("get", "systemconfigurations"), 0)
    assert after - before == 1
