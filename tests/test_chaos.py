# SPDX-License-Identifier: LGPL-3.0-only
"""Chaos: 200 #DW jobs, API faults and repeated SIGKILLs of the service (issue 6, part 5).

One seeded run through the whole stack (kubeapi + dwssim + fakeflux + the real service): jobs
whose stories end in success, container failures, DWS errors, timeouts and cancels are
submitted over a window while the API server answers some requests with 500/503/429, drops
some connections, adds latency, cuts watch streams (some resumed with 410 Gone) and is down
altogether for a few seconds once; the service is killed (as SIGKILL would) and restarted at
random moments, a quarter of the restarts killed again while still starting up.  Afterwards
every job must have reached the end its story dictates with nothing left behind, nothing
applied twice, our own orphan swept, and a second instance's workflows in the same
namespace untouched.

    FLUX_DWS_CHAOS_JOBS=200 FLUX_DWS_CHAOS_SEED=11 python -m pytest tests/test_chaos.py -s

``-s`` shows the figures (jobs, kills, faults injected, recovery after each restart); they are
also in the assertion message when something fails.  The default run (200 jobs, 12-16
kills, one 4 s API outage) took 32-42 s on the 2-core CI machine over ten seeds.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flux_dws.core.identity import FINALIZER, INSTANCE_LABEL
from flux_dws.core.states import State
from flux_dws.k8s.resources import workflow_body
from flux_dws.testing.fakeflux import JobInfo
from flux_dws.testing.ruleset import TEST_DRIVER
from flux_dws.testing.stack import Stack

JOBS = int(os.environ.get("FLUX_DWS_CHAOS_JOBS", "200"))
SEED = int(os.environ.get("FLUX_DWS_CHAOS_SEED", "11"))
KILLS = 12
SUBMIT_WINDOW = max(8.0, JOBS / 10)  # seconds over which jobs are submitted
KILL_GAP = 1.2  # seconds at least between two kills, so each restart gets to recover
SETTLE_TIMEOUT = 90.0  # seconds after the last submit for every job to end
OTHER = "other"  # the second instance sharing the namespace
OUTAGE = 4.0  # seconds the API server answers every request with 503, once in the run
FAULTS = {"latency": 0.003, "error_rate": 0.05, "drop_rate": 0.01, "error_codes": (500, 503, 429)}

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
GFS2 = "#DW jobdw type=gfs2 capacity=10GiB name=shared"
COPY_IN = "#DW copy_in source=/lus/in destination=$DW_JOB_scratch/in"
COPY_OUT = "#DW copy_out source=$DW_JOB_scratch/out destination=/lus/out"


def container(profile: str) -> tuple[str, ...]:
    return (GFS2, f"#DW container name=app profile={profile} DW_JOB_local_storage=shared")


@dataclass(frozen=True)
class Story:
    """A kind of job and the ending its workflow's story dictates."""

    name: str
    dw: tuple[str, ...]
    results: tuple[str, ...]  # what `flux jobs` may show (Flux fixes it when the tasks finish)
    exception: str | None = None  # type of the job's first fatal exception (None: none)
    note: str = ""  # in that exception's note
    started: bool | None = None  # whether the tasks ran (None: either, e.g. a cancel)
    runtime: float | None = 0.2
    exit_status: int = 0
    timeouts: Mapping[str, str] = field(default_factory=dict)
    cancel: bool = False  # cancelled by the user at a random moment after submit
    teardown_failed: bool = False

    @property
    def succeeds(self) -> bool:
        """Whether `flux run` exits 0: tasks exited 0 and no fatal exception up to the end."""
        return self.exception is None and self.exit_status == 0


def _fails(name: str, dw: tuple[str, ...], note: str, ran: bool, **more: Any) -> Story:
    """A job that flux-dws fails with ``note``.  After its tasks ran the result stays the
    COMPLETED they earned (Flux fixes it at finish); `flux run` fails all the same."""
    result = "COMPLETED" if ran else "FAILED"
    return Story(name, dw, (result,), "dws", note, started=ran, **more)


def _error_in(state: State) -> Story:
    directive = f"#DW {state.value} action=error message=disk_on_fire severity=Fatal"
    ran = state in (State.POSTRUN, State.DATAOUT)
    return _fails(f"error-{state.key}", (JOBDW, directive), f"{state.value} failed", ran)


def _cancelled(name: str, dw: tuple[str, ...], results: tuple[str, ...], **more: Any) -> Story:
    return Story(name, dw, results, "cancel", cancel=True, **more)


COMPLETED = ("COMPLETED",)
#: (story, weight): mostly jobs that succeed, every failure and cancel path a few times.
STORIES: tuple[tuple[Story, int], ...] = (
    (Story("storage", (JOBDW,), COMPLETED, started=True), 30),
    (Story("copies", (JOBDW, COPY_IN, COPY_OUT), COMPLETED, started=True), 12),
    (Story("container-ok", container("ok"), COMPLETED, started=True), 10),
    (Story("exit-1", (JOBDW,), ("FAILED",), started=True, exit_status=1), 5),
    (_fails("exit-nonzero", container("exit-nonzero"), "container job", True), 4),
    (_fails("crash-loop", container("crash-loop"), "after 7 attempts", True), 3),
    (_fails("hang", container("hang"), "failed to complete after", True), 3),
    (_fails("never-start", container("never-start"), "failed to start after", False), 3),
    (_fails("start-fail", container("start-fail"), "PreRun failed", False), 3),
    *((_error_in(s), 2) for s in State if s is not State.TEARDOWN),
    (
        _fails(
            "transient",
            (JOBDW, "#DW Setup action=error message=flaky severity=Major"),
            "TransientCondition for more than 1s",
            False,
            timeouts={"transient": "1s"},
        ),
        3,
    ),
    (
        _fails(
            "datain-timeout",
            (JOBDW, "#DW DataIn action=wait"),
            "DataIn failed: did not complete within 1s",
            False,
            timeouts={"datain": "1s"},
        ),
        3,
    ),
    (
        Story(
            "teardown-stuck",
            (JOBDW, "#DW Teardown action=wait"),
            COMPLETED,
            started=True,
            timeouts={"teardown": "1s"},
            teardown_failed=True,
        ),
        3,
    ),
    (_cancelled("cancel-running", (JOBDW,), ("CANCELED",), runtime=None), 8),
    (_cancelled("cancel-prerun", (JOBDW, "#DW PreRun action=wait"), ("CANCELED",)), 5),
    # cancelled while running (CANCELED) or while DataOut waits after the tasks (COMPLETED)
    (_cancelled("cancel-dataout", (JOBDW, "#DW DataOut action=wait"), ("CANCELED", *COMPLETED)), 5),
)


def pick_stories(rng: random.Random, count: int) -> list[Story]:
    """``count`` stories: each kind at least once (when count allows), the rest by weight."""
    kinds = [story for story, _ in STORIES]
    chosen = kinds[:count] + rng.choices(kinds, [w for _, w in STORIES], k=count - len(kinds))
    rng.shuffle(chosen)
    return chosen


# ----------------------------------------------------------------------------- what a job shows


def dws_exceptions(info: JobInfo) -> list[dict[str, Any]]:
    return [e["context"] for e in info.events("exception") if e["context"]["type"] == "dws"]


def story_problems(stack: Stack, story: Story, info: JobInfo, ours: set[str]) -> list[str]:
    """How the job's ending differs from its story (empty when it matches)."""
    problems: list[str] = []
    names = info.event_names()
    started = "start" in names
    raised = dws_exceptions(info)
    first = info.exception or {}
    if info.state != "INACTIVE":
        return [f"still {info.state}, holds {sorted(info.holds)}, last events {names[-6:]}"]
    if info.result not in story.results:
        problems.append(f"result {info.result}, expected {' or '.join(story.results)}")
    if (info.attach_status == 0) != story.succeeds:
        problems.append(f"flux run would exit {info.attach_status}")
    if first.get("type") != story.exception or story.note not in first.get("note", ""):
        wanted = f"a {story.exception} one saying {story.note!r}" if story.exception else "none"
        problems.append(f"exception {info.exception}, expected {wanted}")
    if story.exception != "dws" and raised:
        problems.append(f"unexpected dws exception(s) {raised}")
    if len(raised) > 1:
        problems.append(f"{len(raised)} dws exceptions, at most one allowed: {raised}")
    if len(info.events("jobspec-update")) > 1:
        problems.append(f"{len(info.events('jobspec-update'))} jobspec-update events")
    environments = len(info.events("dws-environment"))
    if (started and environments != 1) or environments > 1:
        problems.append(f"{environments} dws-environment events (started: {started})")
    if story.started is not None and started != story.started:
        problems.append(f"started {started}, expected {story.started}")
    if story.teardown_failed != bool(info.events("dws-teardown-failed")):
        problems.append(f"dws-teardown-failed events: {info.events('dws-teardown-failed')}")
    if info.holds:
        problems.append(f"holds left: {sorted(info.holds)}")
    if f"fluxjob-{stack.identity}-{info.id}" in ours:
        problems.append("its workflow is left in Kubernetes")
    return problems


# ----------------------------------------------------------------------------- the chaos run


class FaultCounter(logging.Handler):
    """Counts the faults kubeapi injects, from its own log lines ("fault: ...")."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("fault: dropping"):
            self.counts["dropped"] += 1
        elif message.startswith("fault: answering"):
            self.counts[f"HTTP {message.rsplit(' ', 1)[-1]}"] += 1
        elif message.startswith("fault: forcing 410"):
            self.counts["410 on watch"] += 1


@dataclass
class Restart:
    """One kill and restart, and how long the fresh service took to get going."""

    at: float  # seconds into the run
    tracked: int  # jobs/workflows the killed service was tracking
    down: float  # seconds without a service
    snapshot: float | None = None  # restart -> the plugin's job snapshot taken in
    listed: float | None = None  # restart -> the first list of our workflows taken in
    first_action: float | None = None  # restart -> its first action sent


@dataclass
class OtherWorkflow:
    """A second instance's workflow, and what it looked like once DWS had settled it."""

    name: str
    settled: dict[str, Any] | None = None
    last_rv: str = ""
    stable_since: float = 0.0


class Chaos:
    """Runs the timeline: submits, cancels, kills and restarts, watch cuts, other workflows."""

    def __init__(self, stack: Stack, rng: random.Random) -> None:
        assert stack.api is not None and stack.service is not None
        self.stack = stack
        self.api = stack.api
        self.rng = rng
        self.t0 = time.monotonic()
        self.jobs: list[tuple[int, Story]] = []
        self.restarts: list[Restart] = []
        self.others: list[OtherWorkflow] = []
        self.cuts = 0
        self.late_cancels = 0
        self.outage_at = 0.0  # seconds into the run when the API outage began
        self.outage_until = 0.0  # seconds into the run when the API outage ends (0: none)
        self.stories: list[Story] = []
        self.submitted: dict[int, int] = {}  # story index -> job id
        self.failures: Counter[str] = Counter()
        self.actions: Counter[str] = Counter()
        self._measuring: tuple[Restart, float] | None = None
        self.version = stack.service.kube.versions.workflow  # the Workflow version served

    def now(self) -> float:
        return time.monotonic() - self.t0

    # ---- the timeline

    def run(self, stories: list[Story]) -> None:
        rng = self.rng
        timeline: list[tuple[float, int, str, Any]] = []
        self.stories = stories
        for index, story in enumerate(stories):
            at = rng.uniform(0.0, SUBMIT_WINDOW)
            timeline.append((at, len(timeline), "submit", index))
            if story.cancel:
                timeline.append((at + rng.uniform(0.1, 4.0), len(timeline), "cancel", index))
        for at in self._kill_times():
            # a quarter of the restarts are killed again while still starting up
            again = rng.uniform(0.0, 0.15) if rng.random() < 0.25 else None
            timeline.append((at, len(timeline), "kill", (rng.uniform(0.05, 0.8), again)))
        at = 0.0
        while at < SUBMIT_WINDOW:
            at += rng.uniform(1.5, 3.5)
            timeline.append((at, len(timeline), "cut", rng.random() < 0.3))
        for i in range(3):
            timeline.append((rng.uniform(1.0, SUBMIT_WINDOW), len(timeline), "other", i))
        timeline.append((rng.uniform(1.0, SUBMIT_WINDOW), len(timeline), "orphan", None))
        timeline.append((rng.uniform(2.0, SUBMIT_WINDOW - 2.0), len(timeline), "outage", OUTAGE))
        timeline.sort()
        for at, _, kind, arg in timeline:
            self._idle_until(at)
            getattr(self, f"_{kind}")(arg)
        self._measure_to_end()

    def _kill_times(self) -> list[float]:
        span = SUBMIT_WINDOW + 4.0
        slot = span / KILLS
        assert slot > KILL_GAP, "too many kills for the window"
        return [0.8 + k * slot + self.rng.uniform(0.0, slot - KILL_GAP) for k in range(KILLS)]

    def _idle_until(self, at: float) -> None:
        while self.now() < at:
            self._tick()
            time.sleep(min(0.01, max(0.0, at - self.now())))

    def _tick(self) -> None:
        if self.outage_until and self.now() >= self.outage_until:
            self.api.faults.set(**FAULTS)
            self.outage_until = 0.0
        self._measure_recovery()
        self._settle_others()

    def _outage(self, seconds: float) -> None:
        """The API server is down: every request fails, open watch streams break."""
        self.api.faults.set(error_rate=1.0, error_codes=(503,))
        self.api.faults.cut_watches()
        self.outage_at = self.now()
        self.outage_until = self.outage_at + seconds

    def _submit(self, index: int) -> None:
        story = self.stories[index]
        jobid = self.stack.submit(
            list(story.dw),
            timeouts=dict(story.timeouts) or None,
            runtime=story.runtime,
            exit_status=story.exit_status,
        )
        self.jobs.append((jobid, story))
        self.submitted[index] = jobid

    def _cancel(self, index: int) -> None:
        """``flux cancel`` by the user (the job may be waiting for a service that is down)."""
        try:
            self.stack.cancel(self.submitted[index])
        except OSError:
            self.late_cancels += 1  # already inactive: its story allows no such ending

    def _kill(self, how: tuple[float, float | None]) -> None:
        """Kill the service, restart it ``down`` seconds later, and kill that one too after
        ``again`` seconds when given (before it has even read its job snapshot, maybe)."""
        down, again = how
        # Not during the API outage (a service cannot start without the API server): the
        # outage is for a running service to ride out.
        while self.outage_until:
            self._idle_until(self.now() + 0.05)
        stack = self.stack
        assert stack.service is not None and stack.loop is not None
        service = stack.service
        tracked = stack.loop.run_sync(lambda: len(service.jobs))
        self._measure_recovery()  # what the last restart got to before this kill
        self._measuring = None
        self.actions.update(service.metrics.actions)
        self.failures.update(service.metrics.failures)
        restart = Restart(at=self.now(), tracked=tracked, down=down)
        stack.kill_service()
        self._idle_until(self.now() + down)
        started = time.monotonic()
        stack.start_service()
        self.restarts.append(restart)
        self._measuring = (restart, started)
        if again is not None:
            self._idle_until(self.now() + again)
            self._kill((self.rng.uniform(0.05, 0.3), None))

    def _cut(self, force_410: bool) -> None:
        if force_410:
            self.api.faults.force_410_next_watch()
        self.api.faults.cut_watches()
        self.cuts += 1

    def _other(self, index: int) -> None:
        """A second instance's workflow; its job id is one of ours, so only labels tell."""
        jobid = self.jobs[-1][0] if self.jobs else 4242 + index
        self.others.append(self._create_other(jobid))

    def _create_other(self, jobid: int) -> OtherWorkflow:
        directives = [JOBDW, "#DW Proposal action=wait"] if jobid % 2 else [JOBDW]
        obj = self.api.store.create(
            "workflows", self.stack.policy.namespace, self._body(OTHER, jobid, directives)
        )
        return OtherWorkflow(obj["metadata"]["name"])

    def _orphan(self, _: None) -> None:
        """A workflow of ours whose job no longer exists, as a crash between delete and
        epilog-finish of a job purged since would leave: it must be swept."""
        self.api.store.create(
            "workflows", self.stack.policy.namespace, self._body(self.stack.identity, 77, [JOBDW])
        )

    def _body(self, identity: str, jobid: int, directives: list[str]) -> dict[str, Any]:
        return workflow_body(
            identity=identity,
            namespace=self.stack.policy.namespace,
            version=self.version,
            jobid=jobid,
            userid=self.stack.owner_uid,
            groupid=self.stack.owner_uid,
            directives=directives,
        )

    # ---- observations

    def _measure_recovery(self) -> None:
        if self._measuring is None or self.stack.loop is None:
            return
        restart, started = self._measuring
        service = self.stack.service
        synced, listed, actions = self.stack.loop.run_sync(
            lambda: (service.synced, service.listed, sum(service.metrics.actions.values()))
        )
        elapsed = time.monotonic() - started
        if synced and restart.snapshot is None:
            restart.snapshot = elapsed
        if listed and restart.listed is None:
            restart.listed = elapsed
        if actions and restart.first_action is None:
            restart.first_action = elapsed
        if None not in (restart.snapshot, restart.listed, restart.first_action):
            self._measuring = None

    def _measure_to_end(self) -> None:
        """Keep measuring the last restart (bounded) before it is killed or the run ends."""
        deadline = time.monotonic() + 2.0
        while self._measuring is not None and time.monotonic() < deadline:
            self._measure_recovery()
            time.sleep(0.01)
        self._measuring = None

    def _settle_others(self) -> None:
        """Snapshot each second-instance workflow once DWS has stopped changing it."""
        for other in self.others:
            if other.settled is not None:
                continue
            obj = self.api.store.get("workflows", self.stack.policy.namespace, other.name)
            rv = obj["metadata"]["resourceVersion"]
            if rv != other.last_rv:
                other.last_rv, other.stable_since = rv, self.now()
            elif _decided(obj) and self.now() - other.stable_since > 0.3:
                other.settled = obj

    def wait_for_jobs(self) -> dict[int, JobInfo]:
        assert self.stack.flux is not None
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while time.monotonic() < deadline:
            self._settle_others()
            infos = {j.id: j for j in self.stack.flux.jobs()}
            if all(infos[jobid].state == "INACTIVE" for jobid, _ in self.jobs):
                break
            time.sleep(0.2)
        while any(o.settled is None for o in self.others) and time.monotonic() < deadline:
            self._settle_others()
            time.sleep(0.05)
        if self.stack.service is not None:
            self.actions.update(self.stack.service.metrics.actions)
            self.failures.update(self.stack.service.metrics.failures)
        return {j.id: j for j in self.stack.flux.jobs()}


def _decided(obj: dict[str, Any]) -> bool:
    """Whether DWS (dwssim) is done with a second-instance workflow in Proposal: its NNF
    entries for Proposal completed, and ready unless the test driver holds it (``action=wait``).
    Not only "unchanged for a while": a starved simulator thread can pause longer than that
    between entering Proposal and completing it."""
    status = obj.get("status") or {}
    drivers = [e for e in status.get("drivers") or [] if e.get("watchState") == "Proposal"]
    if status.get("state") != "Proposal" or not drivers:
        return False
    tester = [e for e in drivers if e.get("driverID") == TEST_DRIVER]
    others = [e for e in drivers if e.get("driverID") != TEST_DRIVER]
    held = any(not e.get("completed") for e in tester)
    return all(e.get("completed") for e in others) and (held or status.get("ready") is True)


def figures(chaos: Chaos, faults: FaultCounter, infos: Mapping[int, JobInfo], took: float) -> str:
    by_story: Counter[str] = Counter(story.name for _, story in chaos.jobs)
    results = Counter(str(infos[jobid].result) for jobid, _ in chaos.jobs)
    lines = [
        f"chaos (seed {SEED}): {len(chaos.jobs)} jobs in {took:.1f}s; results {dict(results)}",
        f"  stories: {dict(sorted(by_story.items()))}",
        f"  kills: {len(chaos.restarts)}, watch cuts: {chaos.cuts}, API outage: {OUTAGE}s at "
        f"{chaos.outage_at:.1f}s, "
        f"cancels too late: {chaos.late_cancels}, "
        f"faults injected: {sum(faults.counts.values())} {dict(sorted(faults.counts.items()))}",
        f"  service actions: {sum(chaos.actions.values())}, failed and retried: "
        f"{dict(sorted(chaos.failures.items()))}",
    ]
    for n, r in enumerate(chaos.restarts, 1):
        snap, listed, first = (
            "-" if t is None else f"{t:.3f}s" for t in (r.snapshot, r.listed, r.first_action)
        )
        lines.append(
            f"  restart {n:2d} at {r.at:5.1f}s: {r.tracked:3d} tracked when killed, down "
            f"{r.down:.2f}s; jobs after {snap}, workflows after {listed}, first action after "
            f"{first}"
        )
    return "\n".join(lines)


def test_chaos_jobs_end_as_their_story_says_through_kills_and_faults():
    rng = random.Random(SEED)
    stories = pick_stories(rng, JOBS)
    faults = FaultCounter()
    kubeapi_log = logging.getLogger("flux-dws.testing.kubeapi")
    saved = (kubeapi_log.level, kubeapi_log.propagate)
    kubeapi_log.setLevel(logging.INFO)
    kubeapi_log.propagate = False  # counted here, not a few thousand lines in the report
    kubeapi_log.addHandler(faults)
    started = time.monotonic()
    try:
        with Stack(hosts=64, delays=0.05, time_scale=0.01, seed=SEED) as stack:
            assert stack.api is not None
            chaos = Chaos(stack, rng)
            for i in range(3):  # the second instance's workflows before the run
                chaos.others.append(chaos._create_other(9000 + i))
            stack.api.faults.set(**FAULTS)
            chaos.run(stories)
            stack.api.faults.clear()  # no more faults: what is left must still finish
            infos = chaos.wait_for_jobs()
            took = time.monotonic() - started
            # a job cancelled before it started is inactive while its Teardown and delete run
            ours = set(stack.workflows_left())
            report = figures(chaos, faults, infos, took)
            print("\n" + report)
            problems = {
                f"job {jobid} ({story.name})": found
                for jobid, story in chaos.jobs
                if (found := story_problems(stack, story, infos[jobid], ours))
            }
            listing = "\n".join(f"  {job}: {'; '.join(found)}" for job, found in problems.items())
            assert not problems, f"{len(problems)} job(s) off their story:\n{listing}\n{report}"
            assert ours == set(), f"workflows left behind: {sorted(ours)}\n{report}"
            assert len(chaos.restarts) >= 10, report
            assert sum(faults.counts.values()) > 0, report
            touched = other_instance_changes(stack, chaos.others)
            assert not touched, f"the second instance's workflows changed: {touched}\n{report}"
    finally:
        kubeapi_log.removeHandler(faults)
        kubeapi_log.setLevel(saved[0])
        kubeapi_log.propagate = saved[1]


def other_instance_changes(stack: Stack, others: list[OtherWorkflow]) -> dict[str, str]:
    """What changed in each second-instance workflow since DWS settled it."""
    assert stack.api is not None
    changes: dict[str, str] = {}
    for other in others:
        if other.settled is None:
            changes[other.name] = "never settled (kept changing)"
            continue
        items, _ = stack.api.store.list("workflows", stack.policy.namespace, None)
        now = {w["metadata"]["name"]: w for w in items}.get(other.name)
        if now is None:
            changes[other.name] = "deleted"
        elif now != other.settled:
            was, spec = other.settled, now["spec"]
            changes[other.name] = (
                f"resourceVersion {was['metadata']['resourceVersion']} -> "
                f"{now['metadata']['resourceVersion']}, desiredState {spec['desiredState']}, "
                f"finalizers {now['metadata'].get('finalizers')}"
            )
        elif now["metadata"]["labels"].get(INSTANCE_LABEL) != OTHER or FINALIZER not in (
            now["metadata"].get("finalizers") or []
        ):
            changes[other.name] = f"labels/finalizers not the other instance's: {now['metadata']}"
    return changes


# ----------------------------------------------------------------------------- reproductions
# Minimal cases of what the chaos run found, each on its own so a regression names its cause.


def test_restart_waits_for_the_workflow_list_before_deciding():
    """The job snapshot arrives before the first workflow list: until the list is in, a job
    whose workflow was created must not be taken for one whose workflow was deleted.

    Found by the chaos run: every job in flight at a restart failed with "the job's workflow
    was deleted outside flux-dws".  A slow list makes the order certain.
    """
    with Stack() as stack:
        jobid = stack.submit([JOBDW, "#DW PreRun action=wait"])
        stack.wait_workflow(jobid, State.PRERUN)
        stack.wait_event(jobid, "dws-workflow")
        stack.kill_service()
        assert stack.api is not None
        stack.api.faults.set(latency=0.5, verbs=["list"])
        stack.start_service()
        service, loop = stack.service, stack.loop
        assert service is not None and loop is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the list is in and the job decided again
            tracked = loop.run_sync(lambda: service.jobs.get(jobid))
            if tracked is not None and tracked.workflow is not None and not tracked.busy:
                break
            time.sleep(0.02)
        stack.api.faults.clear()
        assert dws_exceptions(stack.flux.info(jobid)) == []
        stack.cancel(jobid)
        info = stack.wait(jobid)
        assert info.result == "CANCELED"
        assert not info.holds and stack.workflows_left() == []
