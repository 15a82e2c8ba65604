#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-3.0-only
"""Soak: many #DW jobs on real Flux under CPU load; how many job shells got stuck.

    python bench/soak_shell.py [--jobs 300] [--per-instance 5] [--hosts 4] [--in-flight 1]
                               [--load N] [--stuck-after 30] [--reload-kvs] [--diag DIR]

Prints figures; never passes or fails on time.  It starts one real Flux instance after
another (flux_dws.testing.Stack with backend="flux": the dws jobtap and dws-env shell plugins
built from this checkout, the real service, kubeapi and dwssim), each for ``--per-instance``
of the ``--jobs`` #DW jobs (an xfs jobdw, tasks that end at once), at most ``--in-flight`` at
a time, while ``--load`` processes (default: one per core) keep every core busy.  Jobs take
every node of the instance, then one fewer each, in turn.

Why so many instance starts, each quiet: the stall it measures comes from a broker other than
rank 0 whose KVS misses a commit made while it sets the primary namespace up, on its first
request for it (often the first job shell on that node, right as the job-manager commits the
batch holding prolog-finish), and that stays behind only until the next commit.  A busy
instance heals it in milliseconds; a quiet one with a fresh broker is where shells waited for
ever, as in the test suite.  ``--in-flight 16 --per-instance 1000`` measures a busy instance;
``--reload-kvs`` reloads the KVS module of every broker but rank 0 before each job (as a
restart of those nodes' brokers would), so that every job, not only an instance's first, can
meet a freshly set-up KVS.

A job whose shell is running (its eventlog has ``start``) but whose exec eventlog has no
``shell.init`` after ``--stuck-after`` seconds counts as stuck: its flux-shell processes are
shown with ``gdb -batch -p PID -ex 'thread apply all bt'`` (where gdb is installed), ``ss
-xp``, and what their broker serves them (the job eventlog and ``flux kvs version`` there and
on rank 0), into ``--diag``, and the job is cancelled so the run goes on.  A job still active
``--job-timeout`` seconds after its submit is counted and cancelled the same way.

At the end it prints how many shells got stuck, how many dws-env shells read their start
from rank 0 or gave up (from every broker's log), each stage's p50 / p99 / max (from the
job's and the exec eventlog's timestamps), and what was left behind: workflows in
Kubernetes, flux-shell processes, active jobs.  Everything it starts (instances, service,
load) is ended on exit, Ctrl-C and SIGTERM included.  Skipped, with one line, where flux-core
is absent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flux_dws.testing.realflux import real_flux_problem  # noqa: E402
from flux_dws.testing.stack import Stack  # noqa: E402

JOBDW = "#DW jobdw type=xfs capacity=1GiB name=scratch"
POLL = 0.5  # seconds between looks at the jobs in flight

#: Stages, each from one event to the next: (label, (log, event), (log, event)).
STAGES = (
    ("submit -> depend (Proposal)", ("job", "submit"), ("job", "depend")),
    ("depend -> alloc", ("job", "depend"), ("job", "alloc")),
    ("alloc -> prolog-finish (PreRun)", ("job", "alloc"), ("job", "prolog-finish")),
    ("prolog-finish -> start", ("job", "prolog-finish"), ("job", "start")),
    ("start -> shell.init (dws-env)", ("job", "start"), ("exec", "shell.init")),
    ("shell.init -> finish", ("exec", "shell.init"), ("job", "finish")),
    ("finish -> clean (Teardown)", ("job", "finish"), ("job", "clean")),
    ("submit -> clean", ("job", "submit"), ("job", "clean")),
)


@dataclass
class Job:
    id: int
    nnodes: int
    submitted: float  # monotonic
    instance: int
    started_at: float | None = None  # monotonic, when "start" was first seen
    times: dict[tuple[str, str], float] = field(default_factory=dict)
    stuck: bool = False
    timed_out: bool = False
    result: str = ""


class Load:
    """``count`` busy processes, one per core by default: the CPU load the stalls were seen
    under.  Each is its own session, and all are killed on exit."""

    def __init__(self, count: int) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        for _ in range(count):
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", "while True: pass"],
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs.clear()


def first_times(entries: list[dict[str, Any]]) -> dict[str, float]:
    times: dict[str, float] = {}
    for entry in entries:
        times.setdefault(entry["name"], float(entry["timestamp"]))
    return times


def exec_eventlog(stack: Stack, jobid: int) -> list[dict[str, Any]]:
    """The job's exec eventlog (its guest namespace while it runs); [] before it exists."""
    done = stack.flux.command("job", "eventlog", "-f", "json", "-p", "exec", str(jobid), timeout=30)
    if done.returncode != 0:
        return []
    entries = []
    for line in done.stdout.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            entries.append(json.loads(line))
    return entries


def shell_pids(jobid: int) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"flux-shell") and argv[1:2] == [str(jobid).encode()]:
            pids.append(int(proc.name))
    return pids


def instance_shell_pids(uri: str) -> list[int]:
    """flux-shell processes connected to the instance at ``uri`` (local://DIR/local-0): its
    shells, whichever broker of it they use, and no other instance's."""
    rundir = uri.rsplit("/", 1)[0].encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if not (proc / "cmdline").read_bytes().split(b"\0")[0].endswith(b"flux-shell"):
                continue
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(b"FLUX_URI=" + rundir + b"/") for v in environ):
            pids.append(int(proc.name))
    return pids


def broker_view(stack: Stack, job: Job, pid: int) -> str:
    """What the broker a shell is connected to serves it: the job eventlog and the KVS
    root version there, and its job-info and kvs-watch counts, beside rank 0's version.  A
    rank whose KVS lags rank 0 shows a stale eventlog to every reader on it."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return ""
    uri = next((v[9:].decode() for v in environ if v.startswith(b"FLUX_URI=")), "")
    if not uri:
        return ""
    parts = []
    for label, argv, where in (
        ("job eventlog seen from the shell's broker", ("job", "eventlog", str(job.id)), uri),
        ("KVS root version, the shell's broker", ("kvs", "version"), uri),
        ("KVS root version, rank 0", ("kvs", "version"), stack.flux.uri),
        ("job-info stats, the shell's broker", ("module", "stats", "job-info"), uri),
        ("kvs-watch stats, the shell's broker", ("module", "stats", "kvs-watch"), uri),
    ):
        env = dict(os.environ, FLUX_URI=where)
        try:
            done = subprocess.run(
                [stack.flux.flux, *argv], capture_output=True, text=True, env=env, timeout=30
            )
            text = done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            text = "(no answer in 30 s)\n"
        parts.append(f"=== {label} ({where})\n{text}")
    return "".join(parts)


def diagnose(stack: Stack, job: Job, diag: Path) -> str:
    """Where the job's shells wait: gdb backtraces, their sockets, the job's eventlogs.
    Written to DIAG/<jobid>.txt; returns the innermost non-libc frames of each shell."""
    parts = [f"job {job.id} ({job.nnodes} nodes), instance {job.instance}\n"]
    summary = []
    for pid in shell_pids(job.id):
        parts.append(f"\n=== flux-shell pid {pid}\n")
        with contextlib.suppress(OSError):
            parts.append(f"wchan: {Path(f'/proc/{pid}/wchan').read_text()}\n")
        if shutil.which("gdb"):
            bt = subprocess.run(
                ["gdb", "-batch", "-p", str(pid), "-ex", "thread apply all bt"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            ).stdout
            parts.append(bt)
            frames = [
                line.split(" in ", 1)[1].split(" (")[0]
                for line in bt.splitlines()
                if line.startswith("#") and " in " in line
            ]
            summary.append(" < ".join(frames[:8]))
        ss = subprocess.run(["ss", "-xp"], capture_output=True, text=True, check=False).stdout
        parts.append("".join(line + "\n" for line in ss.splitlines() if f"pid={pid}," in line))
        parts.append(broker_view(stack, job, pid))
    for what in ("eventlog", "exec"):
        argv = (
            ("job", "eventlog", str(job.id))
            if what == "eventlog"
            else ("job", "eventlog", "-p", "exec", str(job.id))
        )
        done = stack.flux.command(*argv, timeout=30)
        parts.append(f"\n=== {what} eventlog\n{done.stdout}{done.stderr}")
    done = stack.flux.command("dmesg", timeout=30)
    parts.append(f"\n=== dmesg (tail)\n{done.stdout[-6000:]}")
    diag.mkdir(parents=True, exist_ok=True)
    (diag / f"{job.id}.txt").write_text("".join(parts))
    return "; ".join(summary) or "(no flux-shell process)"


def run_instance(
    args: argparse.Namespace, index: int, count: int, jobs: list[Job], notes: list[str]
) -> dict[str, Any]:
    """One instance's share of the jobs; what it left behind and what dws-env logged."""
    left: dict[str, Any] = {}
    with Stack(hosts=args.hosts, backend="flux", config={"heartbeat": "2s"}) as stack:
        uri = stack.flux.uri
        try:
            run_jobs(stack, args, index, count, jobs, notes)
        except KeyboardInterrupt:  # end the jobs while the service runs: a quick shutdown
            with contextlib.suppress(Exception):
                stack.flux.end_active_jobs(timeout=30)
            raise
        logged = stack.flux.command("exec", "-r", "all", "flux", "dmesg", timeout=60).stdout
        left["workflows"] = stack.workflows_left(timeout=60)
        left["active jobs"] = stack.flux.end_active_jobs()
    left["flux-shell processes"] = instance_shell_pids(uri)  # after the instance stopped
    lines = [line for line in logged.splitlines() if "dws-env" in line]
    left["logged"] = {
        "read from rank 0": sum("read the job eventlog from rank 0" in line for line in lines),
        "gave up": sum("gave up after" in line for line in lines),
    }
    return left


def run_jobs(
    stack: Stack,
    args: argparse.Namespace,
    index: int,
    count: int,
    jobs: list[Job],
    notes: list[str],
) -> None:
    """Submit ``count`` jobs, at most ``--in-flight`` at a time, and follow them to their end."""
    active: list[Job] = []
    submitted = 0
    while submitted < count or active:
        while submitted < count and len(active) < args.in_flight:
            if args.reload_kvs and args.hosts > 1 and not active:
                fresh_kvs(stack, args.hosts)
            nnodes = max(1, args.hosts - submitted % args.hosts)
            job = Job(stack.submit(JOBDW, nnodes=nnodes), nnodes, time.monotonic(), index)
            submitted += 1
            active.append(job)
            jobs.append(job)
        time.sleep(POLL)
        for job in list(active):
            if watch_job(stack, job, args, notes):
                active.remove(job)
        progress(args, jobs)


def fresh_kvs(stack: Stack, hosts: int) -> None:
    """Reload the KVS module of every broker but rank 0, as a restart of those nodes' brokers
    would: each sets the primary namespace up again on its next request, which the next
    job's shells often are."""
    ranks = f"1-{hosts - 1}" if hosts > 2 else "1"
    done = stack.flux.command("exec", "-r", ranks, "flux", "module", "reload", "kvs", timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"flux module reload kvs on ranks {ranks}: {done.stderr.strip()}")


def progress(args: argparse.Namespace, jobs: list[Job]) -> None:
    """A line every 50 jobs ended."""
    ended = sum(1 for j in jobs if j.result)
    if ended // 50 > progress.said:  # type: ignore[attr-defined]
        progress.said = ended // 50  # type: ignore[attr-defined]
        stuck = sum(1 for j in jobs if j.stuck)
        print(f"  {ended}/{args.jobs} jobs ended, {stuck} stuck", flush=True)


progress.said = 0  # type: ignore[attr-defined]


def watch_job(stack: Stack, job: Job, args: argparse.Namespace, notes: list[str]) -> bool:
    """Look at one job in flight; True once it is over (ended, or given up on)."""
    now = time.monotonic()
    events = first_times(stack.flux.eventlog(job.id))
    if "start" in events and job.started_at is None:
        job.started_at = now
    if "clean" in events:
        job.times.update({("job", k): v for k, v in events.items()})
        job.times.update(
            {("exec", k): v for k, v in first_times(exec_eventlog(stack, job.id)).items()}
        )
        info = stack.flux.info(job.id)
        job.result = info.result or "?"
        return True
    late = job.started_at is not None and now - job.started_at > args.stuck_after
    if late and not job.stuck and "shell.init" not in first_times(exec_eventlog(stack, job.id)):
        job.stuck = True
        where = diagnose(stack, job, args.diag)
        after = f"{args.stuck_after:g} s after start"
        notes.append(f"job {job.id}: shell without shell.init {after}: {where}")
        print(f"  STUCK job {job.id}: {where}", flush=True)
        with contextlib.suppress(OSError):
            stack.cancel(job.id)
    if now - job.submitted > args.job_timeout and not job.timed_out:
        job.timed_out = True
        where = diagnose(stack, job, args.diag)
        names = ", ".join(list(events)[-4:])
        notes.append(
            f"job {job.id}: active {args.job_timeout:g} s after submit (last: {names}): {where}"
        )
        with contextlib.suppress(OSError):
            stack.cancel(job.id)
    return False


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def report(
    args: argparse.Namespace,
    jobs: list[Job],
    left: list[dict[str, Any]],
    notes: list[str],
    elapsed: float,
) -> None:
    stuck = [j for j in jobs if j.stuck]
    timed_out = [j for j in jobs if j.timed_out and not j.stuck]
    results: dict[str, int] = {}
    for job in jobs:
        results[job.result or "not ended"] = results.get(job.result or "not ended", 0) + 1
    print()
    print(
        f"soak: {len(jobs)} #DW jobs in {len(left)} instance(s) of {args.hosts} nodes, "
        f"{args.in_flight} in flight, {args.load} busy processes on {os.cpu_count()} cores, "
        f"{elapsed:.0f} s"
    )
    print(f"  stuck shells (start, no shell.init after {args.stuck_after:g} s): {len(stuck)}")
    print(f"  other jobs active {args.job_timeout:g} s after submit: {len(timed_out)}")
    print(f"  results: {', '.join(f'{k} {v}' for k, v in sorted(results.items()))}")
    print(f"  {'stage':34} {'n':>5} {'p50 s':>8} {'p99 s':>8} {'max s':>8}")
    for label, start, end in STAGES:
        spans = [j.times[end] - j.times[start] for j in jobs if start in j.times and end in j.times]
        if spans:
            print(
                f"  {label:34} {len(spans):>5} {statistics.median(spans):>8.3f} "
                f"{percentile(spans, 0.99):>8.3f} {max(spans):>8.3f}"
            )
    logged = {k: sum(w["logged"][k] for w in left) for k in ("read from rank 0", "gave up")}
    print(
        f"  dws-env shells that read their start from rank 0: {logged['read from rank 0']};"
        f" that gave up: {logged['gave up']}"
    )
    behind = {k: [x for w in left for x in w[k]] for k in ("workflows", "active jobs")}
    behind["flux-shell processes"] = [x for w in left for x in w["flux-shell processes"]]
    print(
        f"  left behind by {len(left)} instance(s): "
        + "; ".join(f"{k}: {len(v)}{' ' + str(v[:5]) if v else ''}" for k, v in behind.items())
    )
    for note in notes:
        print(f"  {note}")
    if notes:
        print(f"  diagnostics: {args.diag}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300, help="#DW jobs in all (default 300)")
    parser.add_argument(
        "--per-instance", type=int, default=5, help="jobs in each instance (default 5)"
    )
    parser.add_argument("--hosts", type=int, default=4, help="nodes of each instance")
    parser.add_argument("--in-flight", type=int, default=1, help="jobs active at a time")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy processes")
    parser.add_argument("--stuck-after", type=float, default=30.0, help="seconds after start")
    parser.add_argument("--job-timeout", type=float, default=600.0, help="seconds after submit")
    parser.add_argument("--diag", type=Path, default=None, help="where diagnostics go")
    parser.add_argument(
        "--reload-kvs",
        action="store_true",
        help="before each job (with nothing in flight), reload the KVS of every broker but"
        " rank 0, as a restart of those nodes' brokers would",
    )
    args = parser.parse_args()
    problem = real_flux_problem()
    if problem:
        print(f"soak_shell: skipped: {problem}")
        return 0
    if args.diag is None:
        args.diag = Path(tempfile.mkdtemp(prefix="soak-shell-"))

    jobs: list[Job] = []
    left: list[dict[str, Any]] = []
    notes: list[str] = []
    started = time.monotonic()
    load = Load(args.load)

    def interrupt(signum: int, frame: Any) -> None:
        """Ctrl-C or SIGTERM: the load stops at once; a second signal does not cut the
        clean-up short (the instance's own watch ends it if this process dies)."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("interrupted: stopping everything this soak started", flush=True)
        load.stop()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)  # even if this process was started ignoring it
    try:
        index = 0
        while len(jobs) < args.jobs:
            share = min(args.per_instance, args.jobs - len(jobs))
            left.append(run_instance(args, index, share, jobs, notes))
            index += 1
    except KeyboardInterrupt:
        pass
    finally:
        load.stop()
    report(args, jobs, left, notes, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
