# SPDX-License-Identifier: LGPL-3.0-only
"""``flux dws simulate``, the pure part: which jobs to run, how each should end, the summary.

Every job kind tells a story with a known ending (COMPLETED, or FAILED with a reason the user
would read in the exception note), so a simulation is also a check: it passes only if every
job ended as its story says and no workflow was left behind.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flux_dws.base.errors import DwsError
from flux_dws.base.jobid import f58
from flux_dws.cli.views import (
    StateSpan,
    fatal_exception,
    format_duration,
    timeline,
)
from flux_dws.core.states import STATE_ORDER, State
from flux_dws.flux import results

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
GFS2 = "#DW jobdw type=gfs2 capacity=10GiB name=shared"
COPY_IN = "#DW copy_in source=/lus/in destination=$DW_JOB_scratch/in"
COPY_OUT = "#DW copy_out source=$DW_JOB_scratch/out destination=/lus/out"
#: States whose drivers the "error" kind makes fail (Teardown failing does not fail a job).
ERROR_STATES = (
    State.PROPOSAL,
    State.SETUP,
    State.DATAIN,
    State.PRERUN,
    State.POSTRUN,
    State.DATAOUT,
)


def _container(profile: str) -> tuple[str, ...]:
    return (GFS2, f"#DW container name=app profile={profile} DW_JOB_local_storage=shared")


@dataclass(frozen=True)
class Kind:
    """A job story: its #DW directives and how it must end."""

    name: str
    story: str
    directives: tuple[str, ...]
    result: str = "COMPLETED"
    reason: str = ""  # a substring of the exception note, for a FAILED ending


KINDS: Mapping[str, Kind] = {
    k.name: k
    for k in (
        Kind("storage", "XFS scratch storage", (JOBDW,)),
        Kind("copies", "storage with copy-in and copy-out", (JOBDW, COPY_IN, COPY_OUT)),
        Kind("container-ok", "a user container that succeeds", _container("ok")),
        Kind(
            "never-start",
            "a container that never starts",
            _container("never-start"),
            "FAILED",
            "failed to start after",
        ),
        Kind(
            "start-fail",
            "a container whose image cannot be pulled",
            _container("start-fail"),
            "FAILED",
            "PreRun failed",
        ),
        Kind(
            "crash-loop",
            "a container that crashes on every attempt",
            _container("crash-loop"),
            "FAILED",
            "failed to run successfully after",
        ),
        Kind(
            "hang",
            "a container that never exits",
            _container("hang"),
            "FAILED",
            "failed to complete after",
        ),
        Kind(
            "exit-nonzero",
            "a container that exits 1",
            _container("exit-nonzero"),
            "FAILED",
            "container job",
        ),
        Kind(
            "error",
            "a driver that reports a fatal error in one state",
            (JOBDW,),
            "FAILED",
            " failed",
        ),
    )
}
DEFAULT_MIX = (
    "storage=40,copies=20,container-ok=15,never-start=5,crash-loop=5,hang=5,exit-nonzero=5,error=5"
)


def parse_mix(text: str) -> dict[str, float]:
    """ "storage=40,hang=5" -> weights by kind; DwsError names the word that is wrong.

    Every kind needs its weight: a bare "storage" reads like "only storage" but would be
    one share among the others, so it is refused rather than guessed.
    """
    weights: dict[str, float] = {}
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        name, sep, value = word.partition("=")
        name = name.strip()
        if name not in KINDS:
            raise DwsError(f"--mix: unknown job kind {name!r} (known: {', '.join(KINDS)})")
        if name in weights:
            raise DwsError(f"--mix: {name!r} is given twice")
        if not sep:
            raise DwsError(f"--mix: {name!r} has no weight (write {name}=N, e.g. {name}=1)")
        try:
            weight = float(value)
        except ValueError:
            raise DwsError(f"--mix: weight of {name!r} is not a number: {value!r}") from None
        if not (weight >= 0 and math.isfinite(weight)):
            raise DwsError(f"--mix: weight of {name!r} must be a number >= 0, not {value!r}")
        weights[name] = weight
    if not any(weights.values()):
        raise DwsError("--mix: no job kind has a weight above 0")
    return weights


def apportion(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split ``total`` jobs by weight (largest remainder), at least one of each weighted kind
    when there are enough jobs, so that a short run still tells every story."""
    kinds = [k for k, w in weights.items() if w > 0]
    whole = sum(weights[k] for k in kinds)
    exact = {k: total * weights[k] / whole for k in kinds}
    counts = {k: math.floor(v) for k, v in exact.items()}
    by_remainder = sorted(kinds, key=lambda k: (-(exact[k] - counts[k]), kinds.index(k)))
    for k in by_remainder[: total - sum(counts.values())]:
        counts[k] += 1
    if total >= len(kinds):
        for k in kinds:
            if counts[k] == 0:
                donor = max(kinds, key=lambda d: (counts[d], -kinds.index(d)))
                counts[donor] -= 1
                counts[k] = 1
    return counts


@dataclass(frozen=True)
class PlannedJob:
    """One job of the simulation, decided up front from the seed."""

    index: int
    kind: str
    directives: tuple[str, ...]
    runtime: float  # seconds the tasks run
    arrival: float  # seconds after the simulation starts
    result: str
    reason: str


def plan_jobs(
    total: int, weights: Mapping[str, float], *, seed: int, speed: float = 1.0
) -> list[PlannedJob]:
    """The jobs to submit, in arrival order; the same seed gives the same plan."""
    rng = random.Random(seed)
    kinds = [k for k, n in apportion(total, weights).items() for _ in range(n)]
    rng.shuffle(kinds)
    jobs, arrival = [], 0.0
    for index, name in enumerate(kinds):
        kind = KINDS[name]
        directives, reason = kind.directives, kind.reason
        if name == "error":
            state = rng.choice(ERROR_STATES)
            directives = (
                *directives,
                f"#DW {state.value} action=error message=simulated_{state.key}_failure"
                " severity=Fatal",
            )
            reason = f"{state.value} failed"
        jobs.append(
            PlannedJob(
                index=index,
                kind=name,
                directives=directives,
                runtime=round(rng.uniform(1.0, 4.0) / speed, 3),
                arrival=round(arrival, 3),
                result=kind.result,
                reason=reason,
            )
        )
        arrival += rng.expovariate(1.0) * 0.4 / speed
    return jobs


# --------------------------------------------------------------------------- endings

#: A container profile timeout as nnf-sos quotes it ("... after 300 seconds").
_PROFILE_SECONDS = re.compile(r"\bafter (\d+(?:\.\d+)?) seconds\b")


def scaled_note(note: str, time_scale: float) -> str:
    """``note`` with each quoted profile timeout followed by the time it took here.

    The simulator runs container profile timeouts ``time_scale`` times as fast as the profile
    says (a 300 s PostRun timeout fires after 6 s at scale 0.02), but nnf-sos words the failure
    with the profile's own figure; the person watching sees both, and that it was scaled.
    """
    if time_scale == 1.0:
        return note

    def both(match: re.Match[str]) -> str:
        here = format_duration(float(match.group(1)) * time_scale)
        return f"{match.group(0)} (profile time, scaled by {time_scale:g}: {here} here)"

    return _PROFILE_SECONDS.sub(both, note)


@dataclass(frozen=True)
class Ending:
    """How one simulated job ended, judged against its story."""

    job: PlannedJob
    jobid: int
    result: str | None  # None: it had not ended when the simulation gave up
    note: str
    as_expected: bool
    spans: tuple[StateSpan, ...]
    submitted: float
    ended: float | None
    ran: tuple[float, float] | None = None  # the tasks' start and finish
    failed_at: float | None = None  # when the fatal exception came, if one did

    @property
    def failed(self) -> bool:
        """Whether the job failed for its user (FAILED or CANCELED), as its story may say."""
        return self.result not in ("COMPLETED", None)


def user_outcome(eventlog: Sequence[Mapping[str, Any]]) -> str:
    """How the job ended for its user, as `flux run` reports it: COMPLETED when it exits 0,
    else CANCELED or FAILED by the fatal exception.  (Flux's job-list result stays COMPLETED
    for a failure after the tasks ended, e.g. in PostRun; `flux run` still exits 1.)"""
    if results.attach_status(eventlog) == 0:
        return "COMPLETED"
    exc = fatal_exception(eventlog) or {}
    return "CANCELED" if exc.get("type") == "cancel" else "FAILED"


def judge(
    job: PlannedJob, jobid: int, eventlog: Sequence[Mapping[str, Any]], *, now: float
) -> Ending:
    """Whether the job ended as its story says: the result, and the reason in the note."""
    exc = fatal_exception(eventlog) or {}
    note = str(exc.get("note", ""))
    result = user_outcome(eventlog)
    expected = result == job.result and (job.reason in note if job.reason else not note)
    times = {e.get("name"): e.get("timestamp") for e in reversed(eventlog)}
    ended = [e["timestamp"] for e in eventlog if e.get("name") == "clean"]
    start, finish = times.get("start"), times.get("finish")
    fatal = [
        e.get("timestamp")
        for e in eventlog
        if e.get("name") == "exception"
        and isinstance(e.get("context"), Mapping)
        and e["context"].get("severity") == 0
        and isinstance(e.get("timestamp"), (int, float))
    ]
    return Ending(
        job=job,
        jobid=jobid,
        result=result,
        note=note,
        as_expected=expected,
        spans=timeline(eventlog, now=now, active=not ended),
        submitted=float(times.get("submit") or 0.0),
        ended=float(ended[-1]) if ended else None,
        ran=(float(start), float(finish)) if start and finish else None,
        failed_at=float(fatal[0]) if fatal else None,
    )


def stage(eventlog: Sequence[Mapping[str, Any]]) -> tuple[str, float | None]:
    """Where an active job is for the live view ("Setup", "running", ...) and since when."""
    where, since = "submitted", None
    running = False
    for event in eventlog:
        name = event.get("name")
        if name == "dws-state":
            where, since = str((event.get("context") or {}).get("state")), event.get("timestamp")
            if running:
                where = "running"
        elif name == "start":
            where, since, running = "running", event.get("timestamp"), True
        elif name == "finish":
            running = False
        elif name == "clean":
            return "ended", event.get("timestamp")
    return where, since


# --------------------------------------------------------------------------- summary


@dataclass(frozen=True)
class KindRow:
    kind: str
    jobs: int
    results: Mapping[str, int] = field(hash=False)
    as_expected: int


@dataclass(frozen=True)
class StateRow:
    state: str
    jobs: int
    p50: float
    max: float


@dataclass(frozen=True)
class Summary:
    kinds: tuple[KindRow, ...]
    results: tuple[str, ...]  # the result columns, in a fixed order
    unexpected: tuple[Ending, ...]
    states: tuple[StateRow, ...]
    requests_per_job: Mapping[str, float] | None = field(hash=False)
    workflows_left: int
    elapsed: float
    jobs: int
    time_scale: float = 1.0  # container profile seconds count this much (see scaled_note)
    timeout_expired: float | None = None  # the --timeout, if it expired before every job ended
    not_submitted: int = 0  # jobs never submitted because the --timeout expired first
    cancelled: int = 0  # jobs cancelled because the --timeout expired before they ended

    @property
    def ok(self) -> bool:
        return (
            not self.unexpected
            and self.workflows_left == 0
            and self.timeout_expired is None
            and self.not_submitted == 0
        )


_RESULT_ORDER = ("COMPLETED", "FAILED", "CANCELED", "TIMEOUT")


def summarize(
    endings: Sequence[Ending],
    kinds: Iterable[str],
    *,
    request_counts: Mapping[str, int] | None,
    workflows_left: int,
    elapsed: float,
    time_scale: float = 1.0,
    timeout_expired: float | None = None,
    not_submitted: int = 0,
    cancelled: int = 0,
) -> Summary:
    """The figures the summary shows; every kind in ``kinds`` gets a row, even with no jobs."""
    rows = []
    for kind in kinds:
        mine = [e for e in endings if e.job.kind == kind]
        counts: dict[str, int] = {}
        for e in mine:
            key = e.result or "unfinished"
            counts[key] = counts.get(key, 0) + 1
        rows.append(KindRow(kind, len(mine), counts, sum(e.as_expected for e in mine)))
    seen = {r for row in rows for r in row.results}
    results = tuple(r for r in _RESULT_ORDER if r in seen or r in ("COMPLETED", "FAILED"))
    results += tuple(sorted(seen - set(results)))
    states = []
    for state in STATE_ORDER:
        times = [s.duration for e in endings for s in e.spans if s.state is state]
        if times:
            states.append(StateRow(state.value, len(times), statistics.median(times), max(times)))
    per_job = None
    if request_counts is not None and endings:
        per_job = {verb: n / len(endings) for verb, n in sorted(request_counts.items())}
    return Summary(
        kinds=tuple(rows),
        results=results,
        unexpected=tuple(e for e in endings if not e.as_expected),
        states=tuple(states),
        requests_per_job=per_job,
        workflows_left=workflows_left,
        elapsed=elapsed,
        jobs=len(endings),
        time_scale=time_scale,
        timeout_expired=timeout_expired,
        not_submitted=not_submitted,
        cancelled=cancelled,
    )


def _table(rows: Sequence[Sequence[str]], right: Iterable[int] = ()) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = set(right)
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in rows
    ]


def render_summary(summary: Summary, *, prefix: str = "ƒ") -> list[str]:
    lines = ["", "Jobs by kind and result"]
    head = ["KIND", "JOBS", *summary.results, "AS-EXPECTED"]
    rows = [head]
    for row in summary.kinds:
        cells = [row.kind, str(row.jobs), *(str(row.results.get(r, 0)) for r in summary.results)]
        rows.append([*cells, f"{row.as_expected}/{row.jobs}"])
    total_expected = sum(r.as_expected for r in summary.kinds)
    totals = [str(sum(r.results.get(k, 0) for r in summary.kinds)) for k in summary.results]
    rows.append(["total", str(summary.jobs), *totals, f"{total_expected}/{summary.jobs}"])
    lines += _table(rows, right=range(1, len(head)))
    if summary.unexpected:
        lines += ["", "Jobs that did not end as their story says"]
        for e in summary.unexpected:
            want = e.job.result + (f' with "{e.job.reason.strip()}"' if e.job.reason else "")
            got = e.result or "not ended"
            note = scaled_note(e.note, summary.time_scale)
            lines.append(
                f"  {f58(e.jobid, prefix)} {e.job.kind}: {got}"
                + (f" ({note})" if note else "")
                + f"; expected {want}"
            )
    if summary.states:
        lines += ["", "Time per state (from the jobs' dws-state events)"]
        rows = [["STATE", "JOBS", "P50", "MAX"]]
        for s in summary.states:
            rows.append([s.state, str(s.jobs), format_duration(s.p50), format_duration(s.max)])
        lines += _table(rows, right=(1, 2, 3))
        lines.append("(Proposal includes waiting for nodes; PreRun includes the job's own run)")
    lines.append("")
    if summary.requests_per_job is None:
        lines.append(
            "Kubernetes requests per job: not counted (the service runs in its own process)"
        )
    else:
        total = sum(summary.requests_per_job.values())
        parts = "  ".join(f"{verb} {n:.1f}" for verb, n in summary.requests_per_job.items())
        lines.append(f"Kubernetes requests per job: {total:.1f} ({parts})")
    lines.append(f"Workflows left in Kubernetes: {summary.workflows_left}")
    expired = timeout_sentence(summary)
    if expired:
        lines.append(expired)
    good = sum(r.as_expected for r in summary.kinds)
    verdict = "PASS" if summary.ok else "FAIL"
    lines.append(
        f"{verdict}: {good} of {summary.jobs} jobs ended as expected in"
        f" {format_duration(summary.elapsed)}, {summary.workflows_left} workflows left"
        + (" (the --timeout expired)" if summary.timeout_expired is not None else "")
    )
    return lines


def timeout_sentence(summary: Summary) -> str:
    """What an expired --timeout did, in words; "" if it did not expire."""
    if summary.timeout_expired is None:
        return ""
    n, never = summary.cancelled, summary.not_submitted
    parts = [f"{_jobs(n)} had not ended and {'was' if n == 1 else 'were'} cancelled"]
    if never:
        parts.append(f"{_jobs(never)} {'was' if never == 1 else 'were'} never submitted")
    return (
        f"The --timeout of {format_duration(summary.timeout_expired)} expired before every job"
        f" ended: {' and '.join(parts)}."
    )


def _jobs(n: int) -> str:
    return "1 job" if n == 1 else f"{n} jobs"
