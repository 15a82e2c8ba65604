# SPDX-License-Identifier: LGPL-3.0-only
"""The service's parts keep their state on the loop: what they found on the way.

- Only the loop touches the service's state: worker threads hand their results to it
  (KubeWorker's ``deliver``), so the SystemConfiguration cache and the reaction figures are
  written on the loop, never on a worker thread.
- The passwd/group lookup (which may block on NSS, say with LDAP down) never runs on the
  loop: a decision reads only the groups already found.
- Record reads that fail are counted per job and per kind (each state's copies apart), the
  count cleared by a success and dropped with the job.
"""

from __future__ import annotations

import os
import pwd
import threading
from typing import Any

import pytest
from waiting import wait_for

from flux_dws.service.executor import ActionExecutor
from flux_dws.service.jobs import Attempts
from flux_dws.service.upkeep import Upkeep
from flux_dws.testing.stack import Stack

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
LOOP_THREAD = "flux-dws"  # the name Stack gives the service's loop thread
RETRIES = 5  # the service's client retries a failed request this often itself


class ThreadRecordingList(list):
    """A list that notes the thread of every append."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def append(self, item: Any) -> None:
        self.threads.append(threading.current_thread().name)
        super().append(item)


def test_worker_results_are_kept_on_the_loop_and_lookups_run_off_it(monkeypatch):
    lookups: list[str] = []
    real = pwd.getpwuid

    def getpwuid(uid: int) -> Any:
        lookups.append(threading.current_thread().name)
        return real(uid)

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    cache_writes: list[str] = []

    def get_rabbits(self: ActionExecutor) -> Any:
        return self.__dict__.get("_rabbits_seen")

    def set_rabbits(self: ActionExecutor, value: Any) -> None:
        cache_writes.append(threading.current_thread().name)
        self.__dict__["_rabbits_seen"] = value

    monkeypatch.setattr(
        ActionExecutor, "rabbits", property(get_rabbits, set_rabbits), raising=False
    )
    with Stack(hosts=2) as stack:
        assert stack.service is not None
        reactions = ThreadRecordingList()
        stack.service.metrics.reactions = reactions
        jobids = [stack.submit(JOBDW, userid=os.getuid()) for _ in range(4)]
        for jobid in jobids:
            info = stack.wait(jobid, timeout=60)
            assert info.result == "COMPLETED", info
        assert stack.service.executor.gids.get(os.getuid()) == real(os.getuid()).pw_gid
    assert lookups and LOOP_THREAD not in lookups
    # one lookup for the user, though both jobs asked for their workflow at once
    assert len([name for name in lookups if name.startswith("kube-worker")]) == 1
    assert len(cache_writes) >= 2  # None at start, then the map a worker read for Setup
    assert cache_writes[1:] and set(cache_writes[1:]) == {LOOP_THREAD}
    assert reactions.threads and set(reactions.threads) == {LOOP_THREAD}


def test_record_attempts_count_each_kind_apart_and_a_success_clears_them():
    attempts = Attempts(limit=3)
    assert not attempts.failed(1, "copies DataIn")
    assert not attempts.failed(1, "copies DataIn")
    attempts.succeeded(1, "copies DataIn")  # the count starts again
    assert not attempts.failed(1, "copies DataIn")
    assert not attempts.failed(1, "copies DataIn")
    assert not attempts.failed(1, "copies DataOut")  # DataOut counts apart
    assert attempts.failed(1, "copies DataIn")  # the third in a row: give up
    assert not attempts.failed(1, "copies DataIn")  # and cleared
    assert not attempts.failed(2, "copies DataIn")
    attempts.forget(1)
    assert len(attempts) == 1  # only job 2's count is left


@pytest.mark.parametrize("kind", ["copies DataIn", "output"])
def test_a_job_the_service_forgets_takes_its_record_attempts_with_it(kind):
    with Stack(hosts=1) as stack:
        assert stack.service is not None
        executor = stack.service.executor
        jobid = stack.submit(JOBDW)
        stack.loop.run_sync(executor.attempts.failed, jobid, kind)
        assert stack.loop.run_sync(len, executor.attempts) == 1
        info = stack.wait(jobid, timeout=60)
        assert info.result == "COMPLETED"

        def forgotten() -> bool:
            return jobid not in stack.service.jobs and len(executor.attempts) == 0

        wait_for(lambda: stack.loop.run_sync(forgotten), what="the job to be forgotten")


def test_the_api_probe_is_settled_on_the_loop(monkeypatch):
    """Upkeep probes an idle API server from a worker; the answer is taken on the loop."""
    writes: list[tuple[str, bool]] = []

    def get_probing(self: Upkeep) -> bool:
        return self.__dict__.get("_probing_seen", False)

    def set_probing(self: Upkeep, value: bool) -> None:
        writes.append((threading.current_thread().name, value))
        self.__dict__["_probing_seen"] = value

    monkeypatch.setattr(Upkeep, "_probing", property(get_probing, set_probing), raising=False)
    with Stack(hosts=1, config={"heartbeat": "1s"}) as stack:
        assert stack.service is not None
        wait_for(lambda: any(not v for _, v in writes[1:]), what="a probe to be answered")
    answered = [name for name, value in writes[1:] if not value]
    assert answered and set(answered) == {LOOP_THREAD}


def test_dataout_copies_get_their_own_attempts_after_datain_reads_recovered():
    """DataIn's reads of the NnfDataMovements fail four times, then work: that count is
    cleared.  DataOut's first read then fails once: it is tried again, and both copies are
    recorded from what the reads found, neither as "could not read".  (A read fails once the
    client's own retries are spent: 1 + RETRIES requests.)"""
    copy_in = "#DW copy_in source=/lus/in destination=$DW_JOB_scratch/in"
    copy_out = "#DW copy_out source=$DW_JOB_scratch/out destination=/lus/out"
    with Stack(hosts=1) as stack:
        assert stack.api is not None
        faults = stack.api.faults
        faults.set(plurals={"nnfdatamovements"}, verbs={"list"})
        faults.fail_next(4 * (1 + RETRIES))
        retries = stack.service.kube.retries
        assert retries == RETRIES
        jobid = stack.submit([JOBDW, copy_in, copy_out], runtime=3.0)

        def copied_in() -> bool:
            return bool(stack.flux.info(jobid).events("dws-datamovement"))

        wait_for(copied_in, what="the DataIn copy to be recorded", timeout=120)
        faults.fail_next(1 + RETRIES)  # the job still runs: DataOut's first read meets it
        info = stack.wait(jobid, timeout=120)
        assert info.result == "COMPLETED", info.exception
        records = [e["context"] for e in info.events("dws-datamovement")]
        assert [(r["state"], r["status"]) for r in records] == [
            ("DataIn", "Success"),
            ("DataOut", "Success"),
        ]
        assert not any("could not read" in str(r) for r in records)
        assert stack.loop.run_sync(len, stack.service.executor.attempts) == 0
