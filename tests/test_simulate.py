# SPDX-License-Identifier: LGPL-3.0-only
"""`flux dws simulate`: the job plan, the judging of endings, the summary, the live view, and
one whole simulation through main() (kubeapi + dwssim + fakeflux + the real service)."""

from __future__ import annotations

import argparse
import io
import json
import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flux_dws.base.errors import DwsError
from flux_dws.cli import main
from flux_dws.cli.simplan import (
    DEFAULT_MIX,
    KINDS,
    apportion,
    judge,
    parse_mix,
    plan_jobs,
    render_summary,
    scaled_note,
    summarize,
)
from flux_dws.cli.simulate import run

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
    assert parse_mix("storage=3, hang=0.5,copies=1") == {"storage": 3, "hang": 0.5, "copies": 1}
    assert set(parse_mix(DEFAULT_MIX)) <= set(KINDS)
    for text, word in [
        ("storage", "'storage' has no weight"),
        ("storage=3,copies", "'copies' has no weight"),
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


def test_quoted_profile_timeouts_say_they_are_scaled():
    note = "PostRun failed: user container(s) failed to complete after 300 seconds"
    assert scaled_note(note, 1.0) == note
    scaled = scaled_note(note, 0.02)
    assert scaled.startswith(note) and "scaled by 0.02: 6.0s here" in scaled
    assert scaled_note("PostRun failed: 7 attempts", 0.02) == "PostRun failed: 7 attempts"
    (job,) = plan_jobs(1, {"hang": 1}, seed=0)
    summary = summarize(
        [judge(job, 5, ended_log(note="Setup failed after 30 seconds"), now=T0 + 10)],
        ["hang"],
        request_counts=None,
        workflows_left=0,
        elapsed=6.0,
        time_scale=0.5,
    )
    assert "after 30 seconds (profile time, scaled by 0.5: 15s here)" in "\n".join(
        render_summary(summary)
    )


# --------------------------------------------------------------------------- the run


class ReplayBackend:
    """Plays back finished eventlogs (no cluster): checks run()'s verdict and exit status."""

    name = "replay"

    def __init__(self, logs, left=0):
        self.logs, self.left, self.submitted = logs, left, []
        self.made = self.cancelled = 0

    def __call__(self, **_):
        self.made += 1
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
        self.cancelled += 1

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
        json=None,
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


class FakeClock:
    """Time that passes only when run() sleeps (``step`` seconds per nap)."""

    def __init__(self, step=1.0):
        self.t, self.step = T0, step

    def __call__(self):
        return self.t

    def sleep(self, _seconds):
        self.t += self.step


class TTY(io.StringIO):
    """A terminal that cannot tell its size."""

    def isatty(self):
        return True


def test_the_progress_line_comes_first_and_again_while_jobs_run():
    never = ended_log()[:4]  # submitted, running: it never ends
    backend = ReplayBackend({"storage": ended_log(), "hang": never})
    both = io.StringIO()
    clock = FakeClock(step=1.0)
    code = run(
        args(timeout=35.0),
        both,
        err=both,
        backend_factory=backend,
        environ={},
        clock=clock,
        sleep=clock.sleep,
        drain_timeout=0,
    )
    assert code == 1
    text = both.getvalue()
    first_status = text.index("0/2 jobs ended, 0 failed, 0 not as expected, 0.00s elapsed")
    assert first_status < text.index(" storage ")  # before any job ended
    statuses = re.findall(r"(\d)/2 jobs ended, \d failed, \d not as expected", text)
    assert len(statuses) >= 4  # every PLAIN_EVERY seconds: 0s, 10s, 20s, 30s, ... and at the end
    assert statuses[-1] == "2"
    assert "\r" not in text and "\x1b" not in text  # not a terminal: nothing redrawn


def test_the_progress_line_is_drawn_in_place_on_a_terminal():
    backend = ReplayBackend({"storage": ended_log(), "hang": ended_log(note="x")})
    out, err = io.StringIO(), TTY()
    assert run(args(), out, err=err, backend_factory=backend, environ={}, drain_timeout=0) == 1
    drawn = err.getvalue()
    assert "\r" in drawn and "0/2 jobs ended |" in drawn
    assert re.search(r"2/2 jobs ended \|.*elapsed, 1 failed, 1 not as expected", drawn)
    assert "flux dws simulate: 0/2" not in drawn  # no plain lines besides the bar
    assert "\r" not in out.getvalue()
    assert len(re.findall(r"^ +\S+ (storage|hang) ", out.getvalue(), re.MULTILINE)) == 2


def test_an_expired_timeout_is_said_in_words():
    never = ended_log()[:4]
    backend = ReplayBackend({"storage": never, "hang": never})
    out, err = io.StringIO(), io.StringIO()
    clock = FakeClock(step=2.0)
    code = run(
        args(jobs=4, timeout=30.0),
        out,
        err=err,
        backend_factory=backend,
        environ={},
        clock=clock,
        sleep=clock.sleep,
        drain_timeout=0,
    )
    assert code == 1 and backend.cancelled == 4
    assert "flux dws simulate: the --timeout of 30s expired with 4 of 4 jobs not ended" in (
        err.getvalue()
    )
    summary = out.getvalue()
    said = "The --timeout of 30s expired before every job ended: 4 jobs had not ended and were"
    assert f"{said} cancelled." in summary
    assert "FAIL:" in summary and "(the --timeout expired)" in summary


def test_a_timeout_before_every_job_was_submitted_fails_the_run():
    from flux_dws.cli.simplan import Summary

    (job,) = plan_jobs(1, {"storage": 1}, seed=0)
    endings = [judge(job, 5, ended_log(), now=T0 + 10)]
    cut = summarize(
        endings,
        ["storage"],
        request_counts=None,
        workflows_left=0,
        elapsed=6.0,
        timeout_expired=5.0,
        not_submitted=3,
    )
    assert isinstance(cut, Summary) and not cut.ok
    text = "\n".join(render_summary(cut))
    assert "0 jobs had not ended and were cancelled and 3 jobs were never submitted" in text


def test_timeout_takes_a_flux_standard_duration():
    from flux_dws.cli import build_parser

    parsed = build_parser().parse_args(["simulate", "--timeout", "2m"])
    assert parsed.timeout == 120.0
    assert build_parser().parse_args(["simulate"]).timeout == 600.0


@pytest.mark.parametrize(
    "option,make,words",
    [
        ("--log", lambda d: d / "nosuch" / "log", "does not exist"),
        ("--json", lambda d: d / "nosuch" / "s.json", "does not exist"),
        ("--plot", lambda d: d / "nosuch" / "t.png", "does not exist"),
        ("--log", lambda d: d, "is a directory"),
        ("--json", lambda d: d / "file" / "s.json", "is not a directory"),
    ],
)
def test_output_paths_are_checked_before_the_run(tmp_path, option, make, words):
    (tmp_path / "file").write_text("")
    path = str(make(tmp_path))
    backend = ReplayBackend({})
    with pytest.raises(DwsError, match=words) as caught:
        run(args(**{option[2:]: path}), io.StringIO(), backend_factory=backend, environ={})
    assert str(caught.value).startswith(f"{option} {path}: ")
    assert backend.made == 0  # refused before anything started


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_directory_is_refused_before_the_run(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(DwsError, match="is not writable"):
            run(args(log=str(tmp_path / "log")), io.StringIO(), environ={})
    finally:
        tmp_path.chmod(0o700)


def test_two_outputs_cannot_be_one_file(tmp_path):
    same = str(tmp_path / "x.json")
    with pytest.raises(DwsError, match="the same file as --log"):
        run(args(log=same, json=same), io.StringIO(), backend_factory=ReplayBackend({}))


def test_json_to_a_file_keeps_the_usual_output(tmp_path):
    backend = ReplayBackend({"storage": ended_log(), "hang": ended_log(note="x")})
    out, path = io.StringIO(), tmp_path / "summary.json"
    run(args(json=str(path)), out, err=io.StringIO(), backend_factory=backend, drain_timeout=0)
    written = json.loads(path.read_text())
    assert written["ok"] is False and written["summary"]["jobs"] == 2
    assert "Jobs by kind and result" in out.getvalue()
    assert f"summary written to {path}" in out.getvalue()


def test_json_on_stdout_is_the_only_thing_there():
    backend = ReplayBackend({"storage": ended_log(), "hang": ended_log(note="x")})
    out, err = io.StringIO(), io.StringIO()
    assert run(args(json="-"), out, err=err, backend_factory=backend, drain_timeout=0) == 1
    assert json.loads(out.getvalue())["summary"]["jobs"] == 2
    assert "2/2 jobs ended" in err.getvalue() and " storage " in err.getvalue()


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


def _copies_and_a_failure():
    """A copies job (a short DataIn and a real DataOut) and a hang job that failed."""
    copies, hang = sorted(plan_jobs(2, {"copies": 1, "hang": 1}, seed=0), key=lambda j: j.kind)
    log = [
        ev(0, "submit", userid=1),
        ev(0.5, "dws-state", state="Proposal"),
        ev(1.5, "dws-state", state="Setup"),
        ev(3.0, "dws-state", state="DataIn"),
        ev(3.01, "dws-state", state="PreRun"),
        ev(4, "start"),
        ev(19, "finish", status=0),
        ev(20, "dws-state", state="PostRun"),
        ev(22, "dws-state", state="DataOut"),
        ev(28, "dws-state", state="Teardown"),
        ev(30, "clean"),
    ]
    note = "PostRun failed: user container(s) failed to complete after 300 seconds"
    failed = [*log[:8], ev(25, "exception", type="dws", severity=0, note=note), *log[9:]]
    return [judge(copies, 1, log, now=T0 + 40), judge(hang, 2, failed, now=T0 + 40)]


def test_plot_shows_every_state_and_tells_failed_jobs_apart():
    from flux_dws.cli.plot import MIN_WIDTH, timeline_bars
    from flux_dws.core.states import State

    ok, failed = _copies_and_a_failure()
    assert failed.failed and not ok.failed and failed.failed_at == T0 + 25
    bars = timeline_bars([ok, failed], start=T0)
    datain = [b for b in bars if b.state is State.DATAIN]
    assert len(datain) == 2 and all(b.width == pytest.approx(MIN_WIDTH * 29.5) for b in datain)
    assert all(b.widened for b in datain)  # 10 ms, drawn so that it is seen
    (dataout,) = [b for b in bars if b.state is State.DATAOUT]  # the failed job had none
    assert dataout.row == 0 and dataout.width == pytest.approx(6) and not dataout.widened
    assert {b.failed for b in bars if b.row == 1} == {True}
    assert {b.failed for b in bars if b.row == 0} == {False}


def test_plot_draws_failed_jobs_hatched_and_in_red():
    pytest.importorskip("matplotlib")
    from flux_dws.cli.plot import _pyplot, draw_timeline

    ok, failed = _copies_and_a_failure()
    fig = draw_timeline([ok, failed], start=T0)
    try:
        (ax,) = fig.axes
        rows = {}
        for patch in ax.patches:
            row = round(patch.get_y() + patch.get_height() / 2)
            rows.setdefault(row, set()).add(patch.get_hatch())
        assert rows == {0: {None}, 1: {"////"}}
        colours = [t.get_color() for t in ax.get_yticklabels()]
        assert colours[1] == "red" and colours[0] != "red"
        assert "FAILED" in ax.get_yticklabels()[1].get_text()
    finally:
        _pyplot().close(fig)


def test_plot_format_is_checked_before_the_run(tmp_path):
    pytest.importorskip("matplotlib")
    for name, words in [("t.bmp", "cannot write .bmp (only "), ("t", "no extension")]:
        out, err = io.StringIO(), io.StringIO()
        argv = ["simulate", "--plot", str(tmp_path / name)]
        assert main(argv, out=out, err=err, environ={}) == 1
        assert err.getvalue().count("\n") == 1 and words in err.getvalue()
        assert out.getvalue() == ""  # nothing ran


def test_bad_options_are_one_line():
    for argv, word in [
        (["simulate", "--jobs", "0"], "--jobs"),
        (["simulate", "--mix", "storage=1,nope=2"], "nope"),
        (["simulate", "--speed", "0"], "--speed"),
        (["simulate", "--mix", "storage"], "'storage' has no weight"),
        (["simulate", "--log", "/nonexistent/dir/log"], "--log /nonexistent/dir/log"),
        (["simulate", "--timeout", "soon"], "--timeout: invalid duration 'soon'"),
    ]:
        out, err = io.StringIO(), io.StringIO()
        assert main(argv, out=out, err=err, environ={}) == (2 if "timeout" in word else 1)
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


def test_the_man_page_gives_the_progress_period():
    from pathlib import Path

    from flux_dws.cli.progress import PLAIN_EVERY

    man = Path(__file__).resolve().parent.parent / "doc" / "man1" / "flux-dws.rst"
    text = " ".join(man.read_text(encoding="utf-8").split())
    assert f"printed as a plain line every {PLAIN_EVERY:g} seconds" in text


def test_the_simulation_log_file_holds_only_readable_lines(tmp_path) -> None:
    """--log writes the service's log as the service does: escapes and one line each."""
    import logging

    from flux_dws.cli.simulate import _quiet_logs

    path = tmp_path / "sim.log"
    with _quiet_logs(str(path)):
        logging.getLogger("flux-dws.test").error("workflow says %s", "\x1b]0;owned\x07\nforged")
    (line,) = path.read_text().splitlines()
    assert line.endswith("workflow says \\x1b]0;owned\\x07\\nforged")
