# SPDX-License-Identifier: LGPL-3.0-only
"""Reconcile N in-flight #DW jobs at start-up: a fresh service after a crash (issue 6, Performance).

    python bench/bench_reconcile.py [-n 10000] [--prolog 0.1] [--cancel 100]
    python bench/bench_reconcile.py -n 1000 -n 10000     # one run per size

Set-up: N jobs held where a crash would find them, their workflows created by a first
service: most wait in DEPEND (``#DW Proposal action=wait``: Proposal never ready), a share in
the prolog (``#DW PreRun action=wait``: allocated, Setup and DataIn done, PreRun never
ready).  That service is killed (as SIGKILL would); while none runs, users cancel
``--cancel`` of the jobs, so the next one has real work to do.  Then a fresh service starts
and this prints, never asserts:

- time to connect (discovery + access check), to the job snapshot from the plugin, to the
  first list of workflows, and to the first action (a request to Flux or Kubernetes);
- time until reconciled: snapshot and list in, every job the plugin holds tracked with its
  workflow, and no job with an action chain in flight (every job decided and idle);
- memory per workflow: RSS growth of this process over that restart (the service; fakeflux
  was already here), and, from a second restart under tracemalloc, the Python memory the
  service holds once reconciled (fakeflux's broker side, the jobtap plugin's stand-in, left
  out).

kubeapi + dwssim run in a process of their own (Stack(api_process=True)), as a real API
server would; the service and fakeflux share this one.  Its target: full reconciliation of
10,000 workflows in under 10 s on this machine.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import threading
import time
import tracemalloc
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flux_dws.testing.fakeflux.remote import rss_mib  # noqa: E402
from flux_dws.testing.stack import Stack  # noqa: E402

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
IN_DEPEND = (JOBDW, "#DW Proposal action=wait")
IN_PROLOG = (JOBDW, "#DW PreRun action=wait")
QUICK = 0.002  # seconds between the stopwatch's readings
FULL = 0.1  # seconds between censuses: each walks every tracked job on the service's loop


@dataclass(frozen=True)
class Census:
    """The service's state at one instant, taken on its loop."""

    synced: bool
    listed: bool
    actions: int
    tracked: int  # jobs the plugin holds that the service tracks with their workflow
    busy: int  # jobs with an action chain in flight

    @property
    def idle(self) -> bool:
        return self.synced and self.listed and self.busy == 0


def census(service: Any) -> Census:
    """Run on the service's loop (walks every tracked job: keep it infrequent)."""
    jobs = service.jobs.values()
    return Census(
        synced=service.synced,
        listed=service.listed,
        actions=sum(service.metrics.actions.values()),
        tracked=sum(1 for t in jobs if t.record is not None and t.workflow is not None),
        busy=sum(1 for t in jobs if t.busy),
    )


class Stopwatch:
    """Times the service's first steps from a thread of its own, without the loop's help.

    Reads plain attributes, so a loop busy with a 10,000-record snapshot cannot delay the
    readings.
    """

    def __init__(self, service: Any, start: float) -> None:
        self.service, self.start = service, start
        self.times: dict[str, float] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stopwatch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        service = self.service
        while not self._done.is_set() and len(self.times) < 3:
            now = time.monotonic() - self.start
            try:
                actions = sum(list(service.metrics.actions.values()))
            except RuntimeError:  # the loop added a key while we read
                actions = 0
            seen = {
                "job snapshot": service.synced,
                "workflow list": service.listed,
                "first action": actions > 0,
            }
            for name, happened in seen.items():
                if happened and name not in self.times:
                    self.times[name] = now
            time.sleep(QUICK)

    def stop(self) -> dict[str, float]:
        self._done.set()
        self._thread.join()
        return self.times


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.5) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not reached within {timeout:.0f}s")
        time.sleep(interval)
    return time.monotonic() - start


def set_up(stack: Stack, jobs: int, prolog: int, timeout: float) -> list[int]:
    """Submit the jobs and let the first service bring each to its waiting point."""
    assert stack.flux is not None
    ids = [
        stack.submit(list(IN_PROLOG if i < prolog else IN_DEPEND), runtime=None)
        for i in range(jobs)
    ]

    def settled() -> bool:
        service, loop = stack.service, stack.loop
        assert service is not None and loop is not None

        def count() -> int:
            waiting = 0
            for t in service.jobs.values():
                state = ((t.record or {}).get("dws") or {}).get("dws-state") or {}
                wanted = "PreRun" if t.record and t.record["phase"] == "prolog" else "Proposal"
                seen = t.workflow.state.value if t.workflow and t.workflow.state else None
                if state.get("state") == wanted and seen == wanted and not t.busy:
                    waiting += 1  # asked for, recorded, and DWS is in it
            return waiting

        done = loop.run_sync(count, timeout=120)
        print(f"  set-up: {done}/{jobs} jobs waiting", end="\r", flush=True)
        return done == jobs

    wait_until(settled, timeout, "set-up", interval=1.0)
    print()
    return ids


def restart_and_measure(stack: Stack, expected: int, timeout: float) -> dict[str, Any]:
    """Start a fresh service and time its way to reconciliation."""
    gc.collect()
    before = rss_mib()
    start = time.monotonic()
    service = stack.start_service()
    loop = stack.loop
    assert service is not None and loop is not None
    connected = time.monotonic() - start
    stopwatch = Stopwatch(service, start)
    try:
        while True:
            time.sleep(FULL)
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"not reconciled within {timeout:.0f}s")
            state = loop.run_sync(census, service, timeout=120)
            if state.idle and state.tracked >= expected:
                reconciled = time.monotonic() - start
                break
    finally:
        times = stopwatch.stop()
    requests = service.kube.request_counts()
    return {
        **times,
        "requests": requests,
        "connect": connected,
        "reconciled": reconciled,
        "rss": rss_mib() - before,
        "tracked": state.tracked,
    }


#: fakeflux's broker side: the jobtap plugin's copy of the records it sent, the job
#: manager's jobs.  Not the service's memory (the real plugin is C, in the broker): left out.
BROKER = ("/fakeflux/plugin.py", "/fakeflux/manager.py", "/fakeflux/jobs.py")


def service_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes traced, but those with a ``BROKER`` frame in their traceback.

    Reads the snapshot's raw traces: identical tracebacks share one tuple there, so each is
    looked at once (tracemalloc's own Filter looks at every frame of every block, which
    takes many minutes for 10,000 workflows)."""
    broker: dict[int, bool] = {}
    total = 0
    for trace in snapshot.traces._traces:  # (domain, size, frames, ...)
        size, frames = trace[1], trace[2]
        hit = broker.get(id(frames))
        if hit is None:
            hit = broker[id(frames)] = any(f[0].endswith(BROKER) for f in frames)
        if not hit:
            total += size
    return total


def traced_restart(stack: Stack, expected: int, timeout: float) -> float:
    """Kill and restart under tracemalloc: bytes the new service holds once reconciled
    (what fakeflux's broker side allocated meanwhile left out, ``BROKER``)."""
    stack.kill_service()
    gc.collect()
    tracemalloc.start(32)  # deep enough to see whether a broker frame made each block
    try:
        service = stack.start_service()
        loop = stack.loop
        assert service is not None and loop is not None

        def reconciled() -> bool:
            state = loop.run_sync(census, service, timeout=120)
            return state.idle and state.tracked >= expected

        wait_until(reconciled, timeout, "traced reconciliation", interval=0.5)
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return service_bytes(snapshot)


def measure(
    jobs: int = 10000,
    prolog_share: float = 0.1,
    cancels: int = 100,
    timeout: float = 1800.0,
    hosts: int = 0,
) -> dict:
    """Set up, kill, restart; the figures as data (bench/run collects them into one table).

    ``hosts``: compute nodes of the system (16 to a rabbit); at least one per prolog job."""
    prolog = int(jobs * prolog_share)
    cancels = min(cancels, jobs)
    started = time.monotonic()
    # Every workflow in flight at once, the jobs in DEPEND ones included: no Proposal window.
    config = {"max-proposals": 0}
    nodes = max(prolog, hosts, 1)
    with Stack(config, hosts=nodes, time_scale=0.001, api_process=True) as stack:
        assert stack.flux is not None
        ids = set_up(stack, jobs, prolog, timeout)
        setup = time.monotonic() - started
        stack.kill_service()
        step = max(1, jobs // max(cancels, 1))
        for jobid in ids[::step][:cancels]:
            stack.cancel(jobid)  # while no service runs: the restart must tear these down
        times = restart_and_measure(stack, jobs - cancels, timeout)
        traced = traced_restart(stack, jobs - cancels, timeout)
    tracked = times.get("tracked", 0) or 1
    return {
        "jobs": jobs,
        "prolog": prolog,
        "cancels": cancels,
        "setup_s": setup,
        "times": {k: times.get(k) for k in ("connect", "job snapshot", "workflow list")},
        "first_action_s": times.get("first action"),
        "reconciled_s": times.get("reconciled"),
        "kib_per_workflow": traced / 1024 / tracked,
        "traced_mib": traced / 2**20,
        "rss_kib_per_workflow": times.get("rss", 0.0) * 1024 / tracked,
        "requests": dict(sorted(times["requests"].items())),
    }


def run(jobs: int, prolog_share: float, cancels: int, timeout: float) -> None:
    print(f"{jobs} jobs: {jobs - int(jobs * prolog_share)} held in DEPEND, the rest in the prolog")
    f = measure(jobs, prolog_share, cancels, timeout)
    print(
        f"  set-up (submit, first service creates and advances every workflow): {f['setup_s']:.1f}s"
    )
    print(f"  restart with {jobs} workflows in flight, {f['cancels']} jobs cancelled while down:")
    shown = {**f["times"], "first action": f["first_action_s"], "reconciled": f["reconciled_s"]}
    for name, value in shown.items():
        print(f"    {name:14s} {f'{value:.3f}s' if value is not None else 'never'}")
    print(
        f"  memory per workflow: {f['kib_per_workflow']:.1f} KiB of Python objects held once "
        f"reconciled ({f['traced_mib']:.1f} MiB, tracemalloc, 2nd restart); RSS grew "
        f"{f['rss_kib_per_workflow']:.1f} KiB per workflow "
        f"(an underestimate: the new service reuses memory the killed one freed)"
    )
    print(f"  Kubernetes requests until reconciled, by verb: {f['requests']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "-n", "--jobs", type=int, action="append", help="jobs in flight (repeatable; 10000)"
    )
    parser.add_argument("--prolog", type=float, default=0.1, help="share held in the prolog")
    parser.add_argument("--cancel", type=int, default=100, help="jobs cancelled while down")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per phase")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    for jobs in args.jobs or [10000]:
        run(jobs, args.prolog, args.cancel, args.timeout)


if __name__ == "__main__":
    main()
