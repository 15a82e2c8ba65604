# SPDX-License-Identifier: LGPL-3.0-only
"""``flux dws simulate``: a mix of #DW jobs through the real service, watched live.

The embedded Kubernetes API server and DWS simulator play the cluster, with per-state delays
of the order of a small real system (REALISTIC_DELAYS, divided by ``--speed``).  The job-manager
is fakeflux, or a real Flux test instance where flux-core is installed and this runs under
Flux; the backend is a small object, so either can be swapped without touching the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, TextIO

from flux_dws.base.errors import DwsError
from flux_dws.base.fsd import parse_fsd
from flux_dws.base.jobid import f58_prefix
from flux_dws.cli.progress import Progress
from flux_dws.cli.simplan import (
    DEFAULT_MIX,
    KINDS,
    Ending,
    PlannedJob,
    judge,
    parse_mix,
    plan_jobs,
    render_summary,
    stage,
    summarize,
)
from flux_dws.cli.views import format_duration
from flux_dws.service.daemon import ReadableFormatter

#: How often the live view is redrawn, and job states are polled, per second.
REFRESH_HZ = 5.0
#: Container profile seconds (5m PreRun/PostRun timeouts) count this much at speed 1.
TIME_SCALE = 0.02
#: Seconds allowed for workflows to disappear after the last job ended.
DRAIN_TIMEOUT = 10.0
#: Compute nodes of the simulated instance.
HOSTS = 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", "-n", type=int, default=40, help="number of jobs (default 40)")
    parser.add_argument(
        "--mix",
        default=DEFAULT_MIX,
        help=f"job kinds and weights (default {DEFAULT_MIX}); kinds: {', '.join(KINDS)}",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="how much faster than a small real system the cluster acts (default 1)",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="save a timeline of the jobs' states (any format matplotlib writes: .png, .svg, .pdf)",
    )
    parser.add_argument(
        "--timeout",
        type=_duration,
        default=600.0,
        metavar="DURATION",
        help="cancel the jobs not ended after DURATION (e.g. 90s, 10m; default 10m)",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "fake", "flux"),
        default="auto",
        help="job-manager: fakeflux, or a real Flux test instance (auto: flux under Flux)",
    )
    parser.add_argument("--log", metavar="FILE", help="write the service's log to FILE")
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="the summary as JSON: on stdout, or written to FILE (the usual output stays)",
    )


# --------------------------------------------------------------------------- backends


class StackBackend:
    """A flux_dws.testing.stack.Stack: kubeapi + dwssim + job-manager + the real service."""

    def __init__(self, *, speed: float, seed: int, real_flux: bool = False) -> None:
        from flux_dws.testing.dwssim import REALISTIC_DELAYS
        from flux_dws.testing.stack import Stack

        delays = {state: seconds / speed for state, seconds in REALISTIC_DELAYS.items()}
        extra = {"backend": "flux"} if real_flux else {}
        self.name = "a real Flux test instance" if real_flux else "fakeflux"
        self.stack = Stack(
            hosts=HOSTS,
            delays=delays,
            time_scale=TIME_SCALE / speed,
            identity="simulate",
            seed=seed,
            **extra,
        )

    def start(self) -> None:
        self.stack.start()

    def stop(self) -> None:
        self.stack.stop()

    def submit(self, job: PlannedJob) -> int:
        return self.stack.submit(list(job.directives), runtime=job.runtime)

    def eventlog(self, jobid: int) -> list[dict[str, Any]]:
        return list(self.stack.flux.info(jobid).eventlog)

    def cancel(self, jobid: int) -> None:
        with contextlib.suppress(OSError):  # it ended meanwhile
            self.stack.cancel(jobid)

    def request_counts(self) -> dict[str, int] | None:
        service = self.stack.service
        return None if service is None else service.kube.request_counts()

    def workflows_left(self) -> int:
        return len(self.stack.workflows())


def choose_backend(choice: str, environ: Mapping[str, str]) -> bool:
    """Whether to use real Flux: asked for, or auto under a Flux instance with flux-core."""
    if choice == "fake":
        return False
    try:
        from flux_dws.flux.bindings import flux_command
    except ImportError:
        if choice == "flux":
            raise DwsError("--backend flux: this install has no real-Flux test backend") from None
        return False

    found = flux_command() is not None
    if choice == "flux" and not found:
        raise DwsError("--backend flux: flux-core is not installed (no `flux` command)")
    return found and (choice == "flux" or bool(environ.get("FLUX_URI")))


# --------------------------------------------------------------------------- outputs


def check_output_path(option: str, path: str) -> None:
    """DwsError (one line) unless ``path`` can be written as a file: a misspelt directory is
    caught before a run of minutes, not after it."""
    if not path or "\0" in path:
        raise DwsError(f"{option}: {path!r} is not a usable file name")
    if os.path.isdir(path):
        raise DwsError(f"{option} {path}: is a directory, not a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(parent):
        raise DwsError(f"{option} {path}: directory {parent} does not exist")
    if not os.path.isdir(parent):
        raise DwsError(f"{option} {path}: {parent} is not a directory")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise DwsError(f"{option} {path}: the file is not writable")
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise DwsError(f"{option} {path}: directory {parent} is not writable")


def check_outputs(args: argparse.Namespace) -> None:
    """Every file the run will write is writable, and no two options name the same file."""
    named: dict[str, str] = {}
    for option, path in (("--plot", args.plot), ("--log", args.log), ("--json", args.json)):
        if path is None or (option == "--json" and path == "-"):
            continue
        check_output_path(option, path)
        real = os.path.realpath(path)
        if real in named:
            raise DwsError(f"{option} {path}: the same file as {named[real]}")
        named[real] = f"{option} {path}"
    if args.plot:
        from flux_dws.cli.plot import check_plotting

        check_plotting(args.plot)


def _write_json(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    except OSError as exc:
        raise DwsError(f"--json {path}: cannot write: {exc.strerror or exc}") from None


def _duration(text: str) -> float:
    """--timeout: a Flux Standard Duration ("90s", "10m") or seconds, more than 0."""
    try:
        seconds = parse_fsd(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text!r}")
    return seconds


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Driven:
    """What driving the jobs gave: their endings, and what an expired --timeout cut short."""

    endings: list[Ending]
    timeout_expired: float | None = None
    cancelled: int = 0
    not_submitted: int = 0


def run(
    args: argparse.Namespace,
    out: TextIO,
    *,
    err: TextIO | None = None,
    backend_factory: Callable[..., Any] = StackBackend,
    environ: Mapping[str, str] = os.environ,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    drain_timeout: float = DRAIN_TIMEOUT,
) -> int:
    """Run the simulation; 0 only if every job ended as expected and no workflow was left."""
    err = err if err is not None else sys.stderr
    if args.jobs < 1:
        raise DwsError(f"--jobs must be at least 1, not {args.jobs}")
    if not args.speed > 0:
        raise DwsError(f"--speed must be more than 0, not {args.speed}")
    weights = parse_mix(args.mix)
    check_outputs(args)
    real = choose_backend(args.backend, environ)
    planned = plan_jobs(args.jobs, weights, seed=args.seed, speed=args.speed)
    prefix = f58_prefix(out)
    time_scale = TIME_SCALE / args.speed
    json_out = args.json == "-"
    info = err if json_out else out  # the per-job lines; stdout keeps to the JSON
    with _quiet_logs(args.log):
        backend = backend_factory(speed=args.speed, seed=args.seed, real_flux=real)
        print(
            f"flux dws simulate: {args.jobs} jobs (seed {args.seed}, speed {args.speed:g}) on"
            f" {backend.name}, an embedded Kubernetes API server and the DWS simulator",
            file=info,
            flush=True,
        )
        if any(_has_container(job) for job in planned):
            from flux_dws.testing.dwssim.containers import DEFAULT_POSTRUN_TIMEOUT as profile

            print(
                f"flux dws simulate: container profile timeouts are scaled by {time_scale:g}"
                f" (a {profile}-second one fires after {format_duration(profile * time_scale)})",
                file=info,
                flush=True,
            )
        backend.start()
        try:
            start = clock()
            progress = Progress(
                info, err, total=args.jobs, start=start, prefix=prefix, time_scale=time_scale
            )
            try:
                driven = _drive(backend, planned, progress, args.timeout, clock, start, sleep)
            finally:
                progress.close(clock())
            elapsed = clock() - start
            left = _drain(backend, clock, drain_timeout, sleep)
            summary = summarize(
                driven.endings,
                [k for k, w in weights.items() if w > 0],
                request_counts=backend.request_counts(),
                workflows_left=left,
                elapsed=elapsed,
                time_scale=time_scale,
                timeout_expired=driven.timeout_expired,
                cancelled=driven.cancelled,
                not_submitted=driven.not_submitted,
            )
        finally:
            backend.stop()
    if args.json:
        from flux_dws.cli.render import dumps

        text = dumps({"summary": summary, "ok": summary.ok})
        if json_out:
            print(text, file=out)
        else:
            _write_json(args.json, text)
    if not json_out:
        print("\n".join(render_summary(summary, prefix=prefix)), file=out)
    if args.plot:
        from flux_dws.cli.plot import plot_timeline

        plot_timeline(driven.endings, args.plot, start=start)
        print(f"timeline written to {args.plot}", file=info)
    if args.json and not json_out:
        print(f"summary written to {args.json}", file=info)
    return 0 if summary.ok else 1


def _has_container(job: PlannedJob) -> bool:
    return any(d.startswith("#DW container") for d in job.directives)


def _drive(
    backend: Any,
    planned: Sequence[PlannedJob],
    progress: Progress,
    timeout: float,
    clock: Callable[[], float],
    start: float,
    sleep: Callable[[float], None] = time.sleep,
) -> Driven:
    """Submit each job at its arrival time and poll until every one has ended, or until the
    --timeout: then cancel what is left, say so, and judge it DRAIN_TIMEOUT later."""
    queue = list(planned)
    jobs: dict[int, PlannedJob] = {}
    endings: dict[int, Ending] = {}
    cancelled_at: float | None = None
    cancelled = not_submitted = 0
    while queue or len(endings) < len(jobs):
        now = clock()
        while queue and queue[0].arrival <= now - start:
            job = queue.pop(0)
            jobs[backend.submit(job)] = job
        active = []
        for jobid, job in jobs.items():
            if jobid in endings:
                continue
            eventlog = backend.eventlog(jobid)
            where, since = stage(eventlog)
            if where == "ended":
                endings[jobid] = judge(job, jobid, eventlog, now=now)
                progress.ended(endings[jobid], now)
            else:
                active.append((jobid, job, where, since))
        progress.tick(active, now)
        if now - start > timeout and cancelled_at is None and (active or queue):
            not_submitted, cancelled = len(queue), len(active)
            never = f" and {not_submitted} not yet submitted" if not_submitted else ""
            progress.say(
                f"the --timeout of {format_duration(timeout)} expired with {len(active)} of"
                f" {len(planned)} jobs not ended{never}: cancelling them"
            )
            queue.clear()
            for jobid, *_ in active:
                backend.cancel(jobid)
            cancelled_at = now
        if cancelled_at is not None and now - cancelled_at > DRAIN_TIMEOUT:
            for jobid, job, *_ in active:
                endings[jobid] = judge(job, jobid, backend.eventlog(jobid), now=now)
                progress.ended(endings[jobid], now)
            break
        sleep(1.0 / REFRESH_HZ)
    return Driven(
        endings=[endings[j] for j in sorted(endings, key=lambda j: jobs[j].index)],
        timeout_expired=None if cancelled_at is None else timeout,
        cancelled=cancelled,
        not_submitted=not_submitted,
    )


def _drain(
    backend: Any, clock: Callable[[], float], timeout: float, sleep: Callable[[float], None]
) -> int:
    """Workflows left once every job ended, after giving deletions a moment to land."""
    deadline = clock() + timeout
    while True:
        left = backend.workflows_left()
        if left == 0 or clock() > deadline:
            return left
        sleep(0.1)


@contextlib.contextmanager
def _quiet_logs(path: str | None) -> Iterator[None]:
    """The service's log goes to ``path`` if given, else nowhere (the live view owns the
    terminal; a job's trouble shows in its ending).  The logging set-up is restored after."""
    root = logging.getLogger()
    saved = root.level
    handler: logging.Handler = logging.FileHandler(path) if path else logging.NullHandler()
    # the service's own formatter: the log holds DWS's and users' text, read on a terminal
    handler.setFormatter(ReadableFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO if path else logging.CRITICAL)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        root.setLevel(saved)
