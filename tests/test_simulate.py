"""`flux dws simulate`: the job plan, the judging of endings, the summary, the live view, and
one whole simulation through main() (kubeapi + dwssim + fakeflux + the real service)."""

from __future__ import annotations

import argparse
import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flux_dws.cli import main
from flux_dws.cli.simplan import (
    DEFAULT_MIX,
    KINDS,
    apportion,
    judge,
    parse_mix,
    plan_jobs,
    render_summary,
    summarize,
)
from flux_dws.cli.simulate import live_screen, run
from flux_dws.errors import DwsError

T0 = 1_700_000_000.0


def ev(offset: float, event: str, **context) -> dict:
    return {"timestamp": T0 + offset, "name": event, "context": context}


def ended_log(*, note: str | None = None, status: int = 0) -> list[dict]:
    log = [
        ev(0, "submit", userid=1),
        ev(0.5, "dws-state", state="Proposal", timeout="10m", deadline=T0 + 600),
        ev(1, "alloc"),
        ev(1.5, "dws-state", state="Setup", timeout="30m", deadline=T0 + 1800),
        ev(3, "start"),
        ev(4, "finish", status=status),
    ]
    if note is not None:
        log.append(ev(4.5, "exception", type="dws", severity=0, note=note))
    log += [ev(5, "dws-state", state="Teardown", timeout="30m", deadline=None), ev(6, "clean")]
    return log


# --------------------------------------------------------------------------- the plan


def test_parse_mix_reads_weights_and_names_bad_words():
    assert parse_mix("storage=3, hang=0.5,copies") == {"storage": 3, "hang": 0.5, "copies": 1}
    assert set(parse_mix(DEFAULT_MIX)) <= set(KINDS)
    for text, word in [
        ("storage=1,bogus=2", "bogus"),
        ("storage=x", "storage"),
        ("storage=-1", "storage"),
        ("storage=1,storage=2", "twice"),
        ("storage=0", "above 0"),
    ]:
        with pytest.raises(DwsError) as caught:
            parse_mix(text)
        assert word in str(caught.value)


@given(
    st.integers(1, 200),
    st.dictionaries(st.sampled_from(sorted(KINDS)), st.integers(0, 50), min_size=1).filter(
        lambda w: any(w.values())
    ),
)
def test_apportion_gives_every_job_a_kind_and_every_weighted_kind_a_job(total, weights):
    counts = apportion(total, weights)
    assert sum(counts.values()) == total
    assert all(weights[k] > 0 for k in counts)
    if total >= len([w for w in weights.values() if w]):
        assert all(n >= 1 for n in counts.values())


def test_plan_is_reproducible_from_the_seed_and_every_error_job_names_its_state():
    weights = parse_mix(DEFAULT_MIX)
    first = plan_jobs(40, weights, seed=7)
    assert first == plan_jobs(40, weights, seed=7)
    assert first != plan_jobs(40, weights, seed=8)
    assert [j.arrival for j in first] == sorted(j.arrival for j in first)
    for job in first:
        if job.kind == "error":
            state = job.reason.split()[0]
            assert f"#DW {state} action=error" in job.directives[-1]


def test_judge_checks_result_and_reason():
    storage, crash = plan_jobs(2, {"storage": 1, "crash-loop": 1}, seed=0, speed=1)
    crash, storage = sorted((storage, crash), key=lambda j: j.kind)
    assert judge(storage, 5, ended_log(), now=T0 + 10).as_expected
    note = "PostRun failed: user container(s) failed to run successfully after 7 attempts"
    assert judge(crash, 6, ended_log(note=note), now=T0 + 10).as_expected
    assert not judge(crash, 6, ended_log(), now=T0 + 10).as_expected
    assert not judge(crash, 6, ended_log(note="PostRun failed: other"), now=T0 + 10).as_expected
    assert not judge(storage, 5, ended_log(note="Setup failed"), now=T0 + 10).as_expected
    ending = judge(storage, 5, ended_log(), now=T0 + 10)
    assert [round(s.duration, 3) for s in ending.spans] == [1.0, 3.5, 1.0]
    assert ending.ran == (T0 + 3, T0 + 4)


def test_summary_counts_by_kind_times_states_and_fails_on_a_leftover_workflow():
    (job,) = plan_jobs(1, {"storage": 1}, seed=0)
    endings = [judge(job, 5, ended_log(), now=T0 + 10)]
    good = summarize(
        endings,
        ["storage", "hang"],
        request_counts={"get": 6, "patch": 4},
        workflows_left=0,
        elapsed=6.0,
    )
    assert good.ok
    text = "\n".join(render_summary(good))
    assert "hang" in text  # a kind of the mix with no job still gets its row
    assert "Kubernetes requests per job: 10.0" in text
    assert text.strip().endswith("0 workflows left") and "PASS" in text
    leftover = summarize(endings, ["storage"], request_counts=None, workflows_left=1, elapsed=6.0)
    assert not leftover.ok and "FAIL" in "\n".join(render_summary(leftover))


def test_live_screen_fits_the_terminal():
    jobs = plan_jobs(30, {"storage": 1}, seed=0)
    active = [(1000 + j.index, j, "Setup", T0) for j in jobs]
    lines = live_screen(
        active, done=3, good=2, total=33, elapsed=12, now=T0 + 2, width=40, height=10, prefix="f"
    )
    assert len(lines) <= 9 and all(len(line) <= 40 for line in lines)
    assert "3/33" in lines[0] and "more" in lines[-1]


# --------------------------------------------------------------------------- the run


class ReplayBackend:
    """Plays back finished eventlogs (no cluster): checks run()'s verdict and exit status."""

    name = "replay"

    def __init__(self, logs, left):
        self.logs, self.left, self.submitted = logs, left, []

    def __call__(self, **_):
        return self

    def start(self):
        pass

    def stop(self):
        pass

    def submit(self, job):
        self.submitted.append(job)
        return len(self.submitted)

    def eventlog(self, jobid):
        return self.logs[self.submitted[jobid - 1].kind]

    def cancel(self, jobid):
        pass

    def request_counts(self):
        return {"get": 3}

    def workflows_left(self):
        return self.left


def args(**overrides):
    values = dict(
        jobs=2,
        mix="storage=1,hang=1",
        seed=0,
        speed=1000.0,
        plot=None,
        timeout=60.0,
        backend="fake",
        log=None,
        json=False,
    )
    return argparse.Namespace(**{**values, **overrides})


@pytest.mark.parametrize(
    "hang_note,left,code",
    [
        ("PostRun failed: user container(s) failed to complete after 300 seconds", 0, 0),
        ("PostRun failed: something else", 0, 1),
        ("PostRun failed: user container(s) failed to complete after 300 seconds", 2, 1),
    ],
)
def test_exit_status_is_zero_only_if_every_job_ended_as_expected_and_nothing_was_left(
    hang_note, left, code
):
    backend = ReplayBackend({"storage": ended_log(), "hang": ended_log(note=hang_note)}, left)
    out = io.StringIO()
    assert run(args(), out, backend_factory=backend, environ={}, drain_timeout=0.3) == code
    assert len(backend.submitted) == 2
    assert f"Workflows left in Kubernetes: {left}" in out.getvalue()


def test_simulate_end_to_end_through_main():
    out, err = io.StringIO(), io.StringIO()
    argv = ["simulate", "--jobs", "8", "--seed", "1", "--speed", "20", "--backend", "fake"]
    code = main(argv, out=out, err=err, environ={})
    text = out.getvalue()
    assert code == 0, text + err.getvalue()
    summary = text[text.index("Jobs by kind and result") :]
    for kind in parse_mix(DEFAULT_MIX):
        assert f"\n{kind} " in summary
    assert "8/8" in summary
    assert "Workflows left in Kubernetes: 0" in summary
    assert "\x1b" not in text  # not a TTY: no redrawing
    ends = [line for line in text.splitlines() if line.lstrip().startswith("ƒ")]
    assert len(ends) == 8 and all(" as expected " in line for line in ends)


def test_plot_needs_matplotlib_and_says_how_to_get_it(tmp_path):
    path = tmp_path / "timeline.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        out, err = io.StringIO(), io.StringIO()
        code = main(["simulate", "--plot", str(path)], out=out, err=err, environ={})
        assert code == 1 and out.getvalue() == ""
        assert err.getvalue().count("\n") == 1 and "pip install flux-dws[plot]" in err.getvalue()
        return
    argv = ["simulate", "--jobs", "3", "--speed", "20", "--plot", str(path), "--backend", "fake"]
    assert main(argv, out=io.StringIO(), err=io.StringIO(), environ={}) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_options_are_one_line():
    for argv, word in [
        (["simulate", "--jobs", "0"], "--jobs"),
        (["simulate", "--mix", "storage=1,nope=2"], "nope"),
        (["simulate", "--speed", "0"], "--speed"),
    ]:
        out, err = io.StringIO(), io.StringIO()
        assert main(argv, out=out, err=err, environ={}) == 1
        assert err.getvalue().count("\n") == 1 and word in err.getvalue()


def test_the_story_is_judged_by_what_flux_run_reports():
    from flux_dws.cli.simplan import user_outcome

    def ev(name, **context):
        return {"timestamp": 0.0, "name": name, "context": context}

    ran_then_failed = [
        ev("start"),
        ev("finish", status=0),
        ev("exception", type="dws", severity=0, note="PostRun failed: x"),
        ev("clean"),
    ]
    assert user_outcome(ran_then_failed) == "FAILED"  # job-list says COMPLETED; flux run exits 1
    assert user_outcome([ev("start"), ev("finish", status=0), ev("clean")]) == "COMPLETED"
    cancelled = [ev("exception", type="cancel", severity=0, note=""), ev("clean")]
    assert user_outcome(cancelled) == "CANCELED"
