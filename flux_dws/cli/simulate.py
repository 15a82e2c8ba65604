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
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable, TextIO

from flux_dws.cli.jobid import f58, f58_prefix
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
from flux_dws.errors import DwsError
from flux_dws.states import STATE_ORDER

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
    parser.add_argument("--plot", metavar="FILE.png", help="save a timeline of the jobs' states")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="give up on jobs not ended after this many seconds (default 600)",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "fake", "flux"),
        default="auto",
        help="job-manager: fakeflux, or a real Flux test instance (auto: flux under Flux)",
    )
    parser.add_argument("--log", metavar="FILE", help="write the service's log to FILE")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


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
        from flux_dws.testing.realflux import flux_command
    except ImportError:
        if choice == "flux":
            raise DwsError("--backend flux: this install has no real-Flux test backend") from None
        return False

    found = flux_command() is not None
    if choice == "flux" and not found:
        raise DwsError("--backend flux: flux-core is not installed (no `flux` command)")
    return found and (choice == "flux" or bool(environ.get("FLUX_URI")))


# --------------------------------------------------------------------------- progress


class LineProgress:
    """Without a TTY: one line per job as it ends, nothing redrawn."""

    def __init__(self, out: TextIO, prefix: str) -> None:
        self.out, self.prefix = out, prefix

    def update(
        self, active: Sequence[tuple[int, PlannedJob, str, float | None]], now: float
    ) -> None:
        pass

    def ended(self, ending: Ending, now: float) -> None:
        took = (ending.ended or now) - ending.submitted
        verdict = "as expected" if ending.as_expected else "NOT as expected"
        note = f" ({ending.note})" if ending.note else ""
        print(
            f"{f58(ending.jobid, self.prefix):>12} {ending.job.kind:<13}"
            f" {ending.result or 'not ended':<9} {verdict:<15} {format_duration(took):>7}{note}",
            file=self.out,
            flush=True,
        )

    def close(self) -> None:
        pass


class LiveProgress:
    """On a TTY: a progress bar, jobs per stage and the active jobs, redrawn in place."""

    def __init__(self, out: TextIO, prefix: str, total: int, start: float) -> None:
        self.out, self.prefix, self.total, self.start = out, prefix, total, start
        self.done = 0
        self.good = 0
        self.drawn = 0
        self.out.write("\x1b[?25l")  # hide the cursor while redrawing

    def ended(self, ending: Ending, now: float) -> None:
        self.done += 1
        self.good += ending.as_expected

    def update(
        self, active: Sequence[tuple[int, PlannedJob, str, float | None]], now: float
    ) -> None:
        size = shutil.get_terminal_size((100, 30))
        lines = live_screen(
            active,
            done=self.done,
            good=self.good,
            total=self.total,
            elapsed=now - self.start,
            now=now,
            width=size.columns,
            height=size.lines,
            prefix=self.prefix,
        )
        up = f"\x1b[{self.drawn}F" if self.drawn else ""
        self.out.write(up + "\x1b[J" + "\n".join(lines) + "\n")
        self.out.flush()
        self.drawn = len(lines)

    def close(self) -> None:
        self.out.write("\x1b[?25h")
        self.out.flush()


def live_screen(
    active: Sequence[tuple[int, PlannedJob, str, float | None]],
    *,
    done: int,
    good: int,
    total: int,
    elapsed: float,
    now: float,
    width: int,
    height: int,
    prefix: str,
) -> list[str]:
    """The live view's lines, each cut to ``width``, at most ``height - 1`` of them."""
    bar_width = max(10, min(40, width - 50))
    filled = int(bar_width * done / total) if total else bar_width
    bad = done - good
    lines = [
        f"[{'#' * filled}{'.' * (bar_width - filled)}] {done}/{total} ended,"
        f" {good} as expected, {bad} not   {format_duration(elapsed)}"
    ]
    order = ["submitted", *(s.value for s in STATE_ORDER[:4]), "running"]
    order += [s.value for s in STATE_ORDER[4:]]
    counts = {name: 0 for name in order}
    for _, _, where, _ in active:
        counts[where] = counts.get(where, 0) + 1
    lines.append("  ".join(f"{name} {n}" for name, n in counts.items()))
    lines.append(f"{'JOBID':>12} {'KIND':<13} {'STAGE':<10} {'FOR':>7}")
    room = max(0, height - 1 - len(lines))
    shown = sorted(active, key=lambda a: a[1].index)
    for jobid, job, where, since in shown[:room]:
        stay = format_duration(now - since) if since is not None else "-"
        lines.append(f"{f58(jobid, prefix):>12} {job.kind:<13} {where:<10} {stay:>7}")
    if len(shown) > room and room:
        lines[-1] = f"{'':>12} ... and {len(shown) - room + 1} more"
    return [line[:width] for line in lines]


# --------------------------------------------------------------------------- the run


def run(
    args: argparse.Namespace,
    out: TextIO,
    *,
    backend_factory: Callable[..., Any] = StackBackend,
    environ: Mapping[str, str] = os.environ,
    clock: Callable[[], float] = time.time,
    drain_timeout: float = DRAIN_TIMEOUT,
) -> int:
    """Run the simulation; 0 only if every job ended as expected and no workflow was left."""
    if args.jobs < 1:
        raise DwsError(f"--jobs must be at least 1, not {args.jobs}")
    if not args.speed > 0:
        raise DwsError(f"--speed must be more than 0, not {args.speed}")
    weights = parse_mix(args.mix)
    if args.plot:
        from flux_dws.cli.plot import check_plotting

        check_plotting()
    real = choose_backend(args.backend, environ)
    planned = plan_jobs(args.jobs, weights, seed=args.seed, speed=args.speed)
    prefix = f58_prefix(out)
    tty = out.isatty() and not args.json
    info = out if not args.json else sys.stderr
    with _quiet_logs(args.log):
        backend = backend_factory(speed=args.speed, seed=args.seed, real_flux=real)
        print(
            f"flux dws simulate: {args.jobs} jobs (seed {args.seed}, speed {args.speed:g}) on"
            f" {backend.name}, an embedded Kubernetes API server and the DWS simulator",
            file=info,
            flush=True,
        )
        backend.start()
        try:
            start = clock()
            progress: Any = (
                LiveProgress(out, prefix, args.jobs, start) if tty else LineProgress(info, prefix)
            )
            try:
                endings = _drive(backend, planned, progress, args.timeout, clock, start)
            finally:
                progress.close()
            elapsed = clock() - start
            left = _drain(backend, clock, drain_timeout)
            summary = summarize(
                endings,
                [k for k, w in weights.items() if w > 0],
                request_counts=backend.request_counts(),
                workflows_left=left,
                elapsed=elapsed,
            )
        finally:
            backend.stop()
    if args.json:
        from flux_dws.cli.render import dumps

        print(dumps({"summary": summary, "ok": summary.ok}), file=out)
    else:
        print("\n".join(render_summary(summary, prefix=prefix)), file=out)
    if args.plot:
        from flux_dws.cli.plot import plot_timeline

        plot_timeline(endings, args.plot, start=start)
        print(f"timeline written to {args.plot}", file=info)
    return 0 if summary.ok else 1


def _drive(
    backend: Any,
    planned: Sequence[PlannedJob],
    progress: Any,
    timeout: float,
    clock: Callable[[], float],
    start: float,
) -> list[Ending]:
    """Submit each job at its arrival time and poll until every one has ended (or timeout)."""
    queue = list(planned)
    jobs: dict[int, PlannedJob] = {}
    endings: dict[int, Ending] = {}
    cancelled_at: float | None = None
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
        progress.update(active, now)
        if now - start > timeout and cancelled_at is None:
            queue.clear()
            for jobid, *_ in active:
                backend.cancel(jobid)
            cancelled_at = now
        if cancelled_at is not None and now - cancelled_at > DRAIN_TIMEOUT:
            for jobid, job, *_ in active:
                endings[jobid] = judge(job, jobid, backend.eventlog(jobid), now=now)
            break
        time.sleep(1.0 / REFRESH_HZ)
    return [endings[j] for j in sorted(endings, key=lambda j: jobs[j].index)]


def _drain(backend: Any, clock: Callable[[], float], timeout: float) -> int:
    """Workflows left once every job ended, after giving deletions a moment to land."""
    deadline = clock() + timeout
    while True:
        left = backend.workflows_left()
        if left == 0 or clock() > deadline:
            return left
        time.sleep(0.1)


@contextlib.contextmanager
def _quiet_logs(path: str | None) -> Iterator[None]:
    """The service's log goes to ``path`` if given, else nowhere (the live view owns the
    terminal; a job's trouble shows in its ending).  The logging set-up is restored after."""
    root = logging.getLogger()
    saved = root.level
    handler: logging.Handler = logging.FileHandler(path) if path else logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO if path else logging.CRITICAL)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        root.setLevel(saved)
