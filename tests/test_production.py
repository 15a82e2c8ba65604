# SPDX-License-Identifier: LGPL-3.0-only
"""Running the service in production: metrics, the systemd watchdog, API health, standbys.

Everything goes through a Stack (kubeapi over HTTP, dwssim, fakeflux, the real service).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter

import pytest
from waiting import wait_for

from flux_dws.core.states import State
from flux_dws.service.metrics import PromMetrics
from flux_dws.testing.stack import Stack

DW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
LIFECYCLE = ("Proposal", "Setup", "DataIn", "PreRun", "PostRun", "DataOut", "Teardown")


def scrape(address: tuple[str, int]) -> dict[str, float]:
    """The endpoint's samples: 'name{labels}' -> value (what Prometheus would store)."""
    host, port = address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def test_metrics_endpoint_shows_what_happened() -> None:
    config = {"metrics-address": "127.0.0.1:0"}
    with Stack(config, hosts=2) as stack:
        service = stack.service
        assert service is not None
        metrics = service.upkeep.metrics
        assert isinstance(metrics, PromMetrics)
        address = wait_for(lambda: metrics.address, "the metrics endpoint")
        assert address[0] == "127.0.0.1" and address[1] > 0
        jobs = [stack.submit(DW, runtime=0.01) for _ in range(3)]
        for jobid in jobs:
            assert stack.wait(jobid).result == "COMPLETED"
        held = stack.submit(DW, runtime=None)  # one job still running at the scrape
        stack.wait_event(held, "start")

        def settled() -> dict[str, float] | None:
            samples = scrape(address)
            done = samples.get('flux_dws_transitions_total{state="Teardown"}') == 3
            running = samples.get('flux_dws_jobs{phase="run"}') == 1
            # a request slower than the 5 s timeout on a loaded machine is judged unreachable
            # for a moment: the scrape is taken once it is reachable (as it is most of the time)
            reachable = samples.get("flux_dws_api_reachable") == 1
            return samples if done and running and reachable else None

        samples = wait_for(settled, "the scrape to show three torn-down jobs", timeout=60)
        for state in LIFECYCLE[1:]:  # a workflow is created in Proposal: no transition
            expected = 4 if state in ("Setup", "DataIn", "PreRun") else 3
            assert samples[f'flux_dws_transitions_total{{state="{state}"}}'] == expected, state
        assert samples["flux_dws_reaction_seconds_count"] == 4 * 3 + 3 * 3
        creates = sum(
            v
            for k, v in samples.items()
            if k.startswith("flux_dws_kube_requests_total{") and 'verb="create"' in k
        )
        assert creates == 4
        assert samples['flux_dws_jobs{phase="depend"}'] == 0
        assert samples['flux_dws_workflows{state="PreRun"}'] == 1
        assert samples["flux_dws_api_reachable"] == 1
        assert samples["flux_dws_active"] == 1
        assert samples["flux_dws_watch_relists_total"] == 1
        assert samples["flux_dws_plugin_heartbeat_age_seconds"] >= 0
        assert samples['flux_dws_queue_depth{queue="kube"}'] == 0
        assert 'flux_dws_jobs_past_deadline{state="PreRun"}' not in samples or (
            samples['flux_dws_jobs_past_deadline{state="PreRun"}'] == 0
        )
        stack.cancel(held)
        assert stack.wait(held).result == "CANCELED"


def test_metrics_are_off_by_default_and_a_bare_port_is_loopback() -> None:
    from flux_dws.base.errors import PolicyError
    from flux_dws.core.policy import policy_from_table

    assert policy_from_table({}).metrics_address is None
    assert policy_from_table({"metrics-address": "9464"}).metrics_address == ("127.0.0.1", 9464)
    assert policy_from_table({"metrics-address": "[::1]:9"}).metrics_address == ("::1", 9)
    with pytest.raises(PolicyError, match=r"\[dws\] metrics-address: invalid address 'x:y'"):
        policy_from_table({"metrics-address": "x:y"})
    assert policy_from_table({"metrics-address": "host:0"}).metrics_address == ("host", 0)
    # "²" is a digit to str.isdigit but not to int(): a PolicyError, not a plain ValueError;
    # an IPv6 address without brackets is not host ":" port 1
    for bad, why in (("²", "invalid address '²'"), ("h:²", "invalid"), ("::1", "in brackets")):
        with pytest.raises(PolicyError, match=why):
            policy_from_table({"metrics-address": bad})


# ----------------------------------------------------------------------------- watchdog


class NotifySocket:
    """What systemd listens on: one datagram per notification."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.messages: list[str] = []

    def read(self, timeout: float) -> list[str]:
        """Every message that arrives within ``timeout`` seconds."""
        got = []
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                got.append(self.sock.recv(4096).decode())
            except socket.timeout:
                break
        self.messages += got
        return got

    def until(self, text: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in m for m in self.read(0.2)):
                return
        pytest.fail(f"no {text!r} from the service within {timeout}s: {self.messages[-5:]}")


def test_watchdog_pings_stop_when_the_loop_stalls_not_when_the_api_is_slow(
    tmp_path, monkeypatch
) -> None:
    notify = NotifySocket(str(tmp_path / "notify"))
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    monkeypatch.setenv("WATCHDOG_USEC", "300000")  # 0.3 s: pings every 0.1 s
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    with Stack(hosts=2) as stack:
        assert stack.service is not None and stack.loop is not None and stack.api is not None
        notify.until("READY=1")
        assert any("STATUS=active" in m for m in notify.messages)
        notify.until("WATCHDOG=1")

        # A slow API server: the request waits on a worker thread, the loop keeps pinging.
        stack.api.faults.set(latency=1.5)
        jobid = stack.submit(DW, runtime=0.01)
        slow = notify.read(1.0)
        assert slow.count("WATCHDOG=1") >= 3
        stack.api.faults.clear()
        assert stack.wait(jobid).result == "COMPLETED"

        # A stalled loop: no ping at all while it is stuck.
        release = threading.Event()
        stuck = threading.Event()

        def stall() -> None:
            stuck.set()
            release.wait(10)

        stack.loop.call_soon(stall)
        assert stuck.wait(10)
        notify.read(0.2)  # a ping sent just before the stall may still be in the socket
        assert notify.read(1.0) == []  # ten ping periods: systemd would have killed it
        release.set()
        notify.until("WATCHDOG=1", timeout=30)


# ----------------------------------------------------------------------------- API health


def test_a_hung_api_server_is_alarmed_within_api_alarm() -> None:
    with Stack({"api-alarm": "1s"}, hosts=2) as stack:
        assert stack.api is not None and stack.service is not None
        service = stack.service
        wait_for(lambda: service.reconciled_at, "the first reconcile")
        stack.api.faults.set(latency=12.0)  # longer than the client's 5 s request timeout
        jobid = stack.submit(DW, runtime=0.01)
        event = stack.wait_event(jobid, "dws-api-unreachable", timeout=30)
        assert event["context"]["note"] == "Kubernetes API unreachable; the job waits"
        assert service.presence.api_down_since is not None
        assert any("Kubernetes API unreachable" in text for _, text in service.presence.errors)
        stack.api.faults.clear()
        assert stack.wait(jobid, timeout=60).result == "COMPLETED"
        wait_for(lambda: service.presence.api_down_since is None, "the API to count as reachable")


# ----------------------------------------------------------------------------- standby


def _service_cmd(stack: Stack) -> list[str]:
    return [
        sys.executable,
        "-m",
        "flux_dws.testing.fakeflux.remote",
        "--socket",
        stack._server.path,  # noqa: SLF001 (the stack's own fakeflux socket)
        "--kubeconfig",
        stack.kubeconfig,
        "--table",
        json.dumps(stack.table),
    ]


def test_a_standby_process_takes_over_when_the_active_one_is_killed() -> None:
    with Stack(hosts=4, service_process=True, delays=0.2) as stack:
        plugin = stack.flux._plugin  # noqa: SLF001 (the plugin's own view of its watchers)
        wait_for(lambda: any(w.service for w in plugin.watchers), "the first service")
        before = [stack.submit(DW, runtime=0.3) for _ in range(3)]
        standby = subprocess.Popen(_service_cmd(stack), stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: len(plugin.standbys) == 1, "the second service to wait as standby")
            assert stack.service_running()  # the first one was not replaced
            stack.wait_event(before[0], "dws-state")
            stack.kill_service()  # SIGKILL the active one, jobs in flight
            during = [stack.submit(DW, runtime=0.1) for _ in range(2)]
            for jobid in before + during:
                info = stack.wait(jobid, timeout=60)
                assert info.result == "COMPLETED", jobid
                asked = Counter(e["context"]["state"] for e in info.events("dws-state"))
                assert set(asked) == set(LIFECYCLE) and max(asked.values()) == 1, asked
                assert not info.events("dws-waiting")
            assert standby.poll() is None  # still running: the active one now, no flapping
            assert not plugin.standbys and any(w.service for w in plugin.watchers)
        finally:
            standby.send_signal(signal.SIGTERM)
            _, err = standby.communicate(timeout=30)
        assert "standby: the active flux-dws service for this instance is pid" in err


def test_a_second_in_process_service_stays_standby_until_the_first_goes() -> None:
    with Stack(hosts=2) as stack:
        first = stack.service
        assert first is not None
        wait_for(lambda: first.presence.role == "active", "the first service to be active")
        second = stack.start_service()  # the stack now drives the second one
        assert second is not None
        wait_for(lambda: second.presence.role == "standby", "the second service to wait")
        jobid = stack.submit(DW, runtime=0.01)
        assert stack.wait(jobid).result == "COMPLETED"
        assert first.presence.role == "active"
        assert second.reconciled_at is None  # never decided anything
        assert all(t.record is None for t in second.jobs.values())  # no job was given to it
        assert second.upkeep.status_line().startswith("standby: pid")
        first.stop()
        first.loop.stop()
        first.jm.transport.close()  # the first one's connection goes: the plugin promotes
        wait_for(lambda: second.presence.role == "active", "the standby to take over")
        jobid = stack.submit(DW, runtime=0.01)
        assert stack.wait(jobid).result == "COMPLETED"
        assert len(stack.wait(jobid).events("dws-workflow")) == 1


# ----------------------------------------------------------------------------- flux dws status


def cli(argv: list[str], stack: Stack) -> tuple[int, str, str]:
    import io

    from flux_dws.cli import main
    from flux_dws.cli.sources import StackSource

    out, err = io.StringIO(), io.StringIO()
    code = main(argv, out=out, err=err, source_factory=lambda: StackSource(stack), environ={})
    return code, out.getvalue(), err.getvalue()


def test_status_without_a_job_shows_the_service_at_a_glance() -> None:
    with Stack({"heartbeat": "0.2s"}, hosts=2) as stack:
        service = stack.service
        assert service is not None
        waiting = stack.submit([DW, "#DW PreRun action=wait"], timeouts={"prerun": "1s"})
        stack.wait_workflow(waiting, State.PRERUN)
        stack.wait_event(waiting, "exception", timeout=60)  # PreRun's deadline passed
        held = stack.submit([DW, "#DW PreRun action=wait"], timeouts={"prerun": "1h"})
        stack.wait_workflow(held, State.PRERUN)

        def shown() -> str | None:
            code, out, err = cli(["status"], stack)
            assert code == 0, err
            reachable = "API:      reachable" in out.splitlines()  # (see settled() above)
            return out if "last heartbeat" in out and "PreRun" in out and reachable else None

        out = wait_for(shown, "flux dws status to show the service", timeout=60)
        lines = out.splitlines()
        assert lines[0].startswith(f"service:  active, pid {os.getpid()} on ")
        assert "up since" in lines[0]
        assert "API:      reachable" in lines
        (prerun,) = [line for line in lines if line.split()[:1] == ["PreRun"]]
        assert prerun.split()[1] == "1" and " in 59m" in prerun
        code, out, _ = cli(["status", "--json"], stack)
        view = json.loads(out)
        assert view["service"] == "active" and view["api_reachable"] is True
        assert view["ready"] is True and view["standbys"] == 0
        stack.kill_service()
        code, out, _ = cli(["status"], stack)
        assert out.splitlines()[0].startswith("service:  NOT RUNNING")
        stack.start_service()
        stack.cancel(held)
        stack.wait(held, timeout=60)


def test_health_view_survives_any_answer() -> None:
    from flux_dws.cli.servicestatus import build_service_status, render_service_status

    now = 1_764_450_000.0
    odd = [
        {},
        {"jobs": None, "service": "x"},
        {"jobs": [{"id": 5, "dws": {"dws-state": {"state": 7, "deadline": "soon"}}}]},
        {"jobs": [], "service": {"active": {"pid": True, "report": {"api": [], "errors": [1]}}}},
        {
            "jobs": [{"id": 9, "phase": "run", "dws": {"dws-state": {"state": "PreRun",
                      "timeout": "1m", "deadline": now - 5}}}],
            "service": {"active": {"pid": 3, "host": "h" * 999, "heard": float("nan"),
                        "report": {"api": {"reachable": False, "since": now - 60},
                                   "errors": [[now, "x\nNUL\0 y"]]}}, "standbys": 2},
        },
    ]  # fmt: skip
    for answer in odd:
        view = build_service_status(answer, now)
        lines = render_service_status(view, now, str)
        assert lines and all("\n" not in line for line in lines)
    assert "UNREACHABLE since" in "\n".join(lines)
    assert "PASSED 5.0s ago (1 past deadline)" in "\n".join(lines)
    assert "2 standby service(s) waiting" in "\n".join(lines)


def test_notifier_speaks_the_sd_notify_protocol(tmp_path) -> None:
    from flux_dws.service.notify import Notifier

    assert Notifier({}).send(ready="1") is False  # not under systemd: nothing, no error
    other = Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "5000000", "WATCHDOG_PID": "1"})
    assert other.watchdog is None  # the watchdog is another process's
    mine = Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "5000000"})
    assert mine.watchdog == 5.0
    name = f"flux-dws-test-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(b"\0" + name.encode())  # "@name": the abstract namespace
    try:
        notifier = Notifier({"NOTIFY_SOCKET": f"@{name}"})
        notifier.ready("active: 2 #DW job(s)\nheld")
        assert listener.recv(4096) == b"READY=1\nSTATUS=active: 2 #DW job(s) held"
        notifier.close()
    finally:
        listener.close()
    gone = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    assert gone.send(watchdog="1") is False  # no listener: logged once, never raised


def test_api_health_tells_a_hung_server_from_a_slow_one() -> None:
    from flux_dws.service.apihealth import ApiHealth

    now = [1000.0]
    health = ApiHealth(overdue=10.0, clock=lambda: now[0])
    slow = health.begin("patch workflow")
    now[0] += 9.0
    assert health.judge().reachable  # slow, within the request timeout
    health.end(slow, answered=True)
    hung = health.begin("get workflow")
    now[0] += 10.0
    verdict = health.judge()
    assert not verdict.reachable and verdict.since == 1009.0 and "server hung?" in verdict.why
    health.end(hung, answered=False, why="get: ReadTimeoutError")
    assert health.judge().since == 1009.0  # still down, since the first unanswered attempt
    health.note(True)  # any answer (the watch's too) means the server is back
    assert health.judge().reachable
    refused = health.begin("create workflow")
    health.end(refused, answered=False, why="create: ConnectionRefusedError")
    assert not health.judge().reachable  # refused: at once, no waiting for a timeout
    health.note(True)
    answered = now[0]
    now[0] += 60.0  # idle for a minute, then a request hangs
    probe = health.begin("get version")
    now[0] += 10.0
    assert health.judge().since == answered  # unreachable since its last answer
    health.end(probe, answered=True)


def test_api_health_does_not_blame_the_server_for_its_own_pause() -> None:
    from flux_dws.service.apihealth import ApiHealth

    now = [1000.0]
    health = ApiHealth(overdue=10.0, clock=lambda: now[0], tick=1.0)
    assert health.judge().reachable
    pending = health.begin("patch workflow")
    now[0] += 30.0  # this process did not run for 30 s (SIGSTOP, swap, a paused VM)
    assert health.judge().reachable  # the request waited 2 s of the time we were running
    now[0] += 1.0
    assert health.judge().reachable
    for _ in range(7):  # then it goes on waiting while we run and watch: hung after all
        now[0] += 1.0
        verdict = health.judge()
    assert not verdict.reachable and "no answer for 10s" in verdict.why
    assert verdict.since == 1000.0  # since its start, as without the pause
    health.end(pending, answered=True)
    assert health.judge().reachable
    blind = ApiHealth(overdue=10.0, clock=lambda: now[0])  # no tick: wall time only
    blind.judge()
    blind.begin("get workflow")
    now[0] += 30.0
    assert not blind.judge().reachable


def test_the_admin_guide_lists_exactly_the_metrics() -> None:
    import re
    from pathlib import Path

    guide = (Path(__file__).parents[1] / "doc" / "guide" / "admin.rst").read_text()
    section = guide[guide.index("\nMetrics\n") : guide.index("Two example alerts")]
    listed = {re.sub(r"_total$", "", m) for m in re.findall(r"``(flux_dws_\w+)", section)}
    families = {family.name for family in PromMetrics().registry.collect()}
    assert listed == families
