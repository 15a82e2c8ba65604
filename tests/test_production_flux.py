# SPDX-License-Identifier: LGPL-3.0-only
"""Running the service in production, on a real Flux instance with the real jobtap plugin.

- a hung API server (SIGSTOP) is alarmed within ``[dws] api-alarm``;
- the service ends with its instance (`flux shutdown`): one line, exit status 69;
- a started job whose ``release`` never comes (cleanup off, instance restart) is still held
  from CLEANUP and gets its PostRun, DataOut and Teardown;
- a second service waits as a standby and takes over when the active one is killed.

Skipped where flux-core is not installed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from waiting import wait_for

from flux_dws.flux.bindings import flux_command
from flux_dws.service.daemon import EXIT_UNAVAILABLE
from flux_dws.testing.stack import Stack

pytestmark = pytest.mark.skipif(
    flux_command() is None,
    reason="flux-core is not installed (no flux on PATH or /opt/flux/bin): real Flux skipped",
)

JOBDW = "#DW jobdw type=xfs capacity=1GiB name=scratch"
AFTER_RUN = ("PostRun", "DataOut", "Teardown")
API_HEALTH = re.compile(r"flux-dws: \w+: Kubernetes API (unreachable|reachable again)")


def asked(info) -> Counter[str]:
    return Counter(e["context"]["state"] for e in info.events("dws-state"))


def test_a_hung_api_server_is_alarmed_within_api_alarm() -> None:
    config = {"heartbeat": "1s", "api-alarm": "5s"}
    with Stack(config, hosts=2, backend="flux", api_process=True) as stack:
        api = stack._process  # noqa: SLF001 (the kubeapi + dwssim process)
        assert api is not None
        wait_for(lambda: "job snapshot" in stack.flux.service_log(), "the service", 60)
        os.kill(api.pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            jobid = stack.submit(JOBDW, runtime=0.1)
            event = stack.wait_event(jobid, "dws-api-unreachable", timeout=60)
            noticed = time.monotonic() - stopped
            log = stack.flux.service_log()
            assert "WARNING: Kubernetes API unreachable" in log
            assert "ERROR: Kubernetes API unreachable for more than 5s" in log
            assert event["context"]["note"] == "Kubernetes API unreachable; the job waits"
            print(f"hung API server alarmed {noticed:.1f}s after SIGSTOP")

            def status() -> str | None:
                out = subprocess.run(
                    [sys.executable, "-m", "flux_dws", "status"],
                    env=stack.flux._env(),  # noqa: SLF001 (the instance's environment)
                    capture_output=True,
                    text=True,
                    timeout=60,
                ).stdout
                return out if "API:      UNREACHABLE since" in out else None

            shown = wait_for(status, "flux dws status to show it", 30)
            assert "last errors:" in shown and "Kubernetes API unreachable" in shown
        finally:
            os.kill(api.pid, signal.SIGCONT)
        assert stack.wait(jobid, timeout=90).result == "COMPLETED"
        wait_for(
            lambda: "Kubernetes API reachable again" in stack.flux.service_log(), "recovery", 30
        )


def test_the_service_ends_with_its_instance() -> None:
    with Stack({"heartbeat": "1s"}, hosts=2, backend="flux") as stack:
        assert stack.wait(stack.submit(JOBDW, runtime=0.05), timeout=60).result == "COMPLETED"
        before = len(stack.flux.service_log().splitlines())
        stack.flux.shutdown()
        status = stack.flux.service_exit(30)
        assert status == EXIT_UNAVAILABLE, stack.flux.service_log()[-3000:]
        after = [
            line
            for line in stack.flux.service_log().splitlines()[before:]
            if not API_HEALTH.match(line)  # the Kubernetes side may be judged at any tick
        ]
        assert len(after) == 1, after  # one line, no traceback, no reconnection
        assert after[0].startswith("flux-dws: WARNING: the Flux instance is gone (")
        assert after[0].endswith("); stopping")


def test_the_loop_tells_a_reactor_failure_on_a_live_instance_from_a_lost_instance() -> None:
    import flux

    from flux_dws.flux.reactor import FluxLoop, FluxTransport
    from flux_dws.testing.realflux import RealFlux

    instance = RealFlux(["node0"], {}).start()
    try:
        handle = flux.Flux(instance.uri)
        loop = FluxLoop(handle)
        loop.call_soon(handle.reactor_stop_error)  # as libflux does when receiving fails
        loop.run()  # returns: never raises
        assert isinstance(loop.broken, OSError)
        assert loop.instance_answers()  # the daemon then exits 1, to be restarted

        answered = []

        def buggy(response: object, error: object) -> None:
            answered.append(error)
            raise ValueError("a bug in a response callback")

        FluxTransport(handle).rpc("no-such-method", {}, buggy)
        loop.call_later(5.0, loop.stop)
        loop.run()  # the callback's exception is logged; the reactor runs on until stop()
        assert len(answered) == 1 and loop.broken is None

        def raising(*_: object) -> None:
            raise RuntimeError("a bug in a watcher")

        watcher = handle.timer_watcher_create(0.01, raising)
        watcher.start()
        loop.run()  # the bindings stop the reactor and re-raise: kept, not raised
        assert isinstance(loop.broken, RuntimeError)
        instance.stop()
        assert not loop.instance_answers()  # the instance is gone: the daemon exits 69
    finally:
        instance.stop()


def test_a_started_job_without_release_is_torn_down_after_an_instance_restart() -> None:
    options = {"persist": True, "broker_env": {"FLUX_DISABLE_JOB_CLEANUP": "t"}}
    with Stack({"heartbeat": "1s"}, hosts=2, backend="flux", realflux=options) as stack:
        jobid = stack.submit(JOBDW, runtime=None)
        stack.wait_event(jobid, "start", timeout=60)
        stack.flux.shutdown()  # cleanup off: the running job is not cancelled, never released
        assert stack.flux.service_exit(30) == EXIT_UNAVAILABLE
        stack.flux.restart()  # the exec system cannot reattach: an exec exception, no release
        stack.flux.start_service()
        info = stack.wait(jobid, timeout=120)
        names = info.event_names()
        # Held from CLEANUP: before any release (Flux 0.88 sometimes posts none at all, and
        # then the job counts as released because it started under the previous broker).
        assert names.index("exception") < names.index("epilog-start") < names.index("free")
        if "release" in names:
            assert names.index("epilog-start") < names.index("release")
        assert all(asked(info)[state] == 1 for state in AFTER_RUN), asked(info)
        assert names.index("epilog-finish") < names.index("free")
        assert stack.workflows_left() == []


def test_a_standby_service_takes_over_when_the_active_one_is_killed() -> None:
    with Stack({"heartbeat": "1s"}, hosts=2, backend="flux") as stack:
        flux = stack.flux
        wait_for(lambda: "job snapshot" in flux.service_log(), "the first service", 60)
        standby_log = flux.workdir / "standby.log"
        with open(standby_log, "w") as out:
            standby = subprocess.Popen(
                [sys.executable, "-m", "flux_dws.daemon"],
                env=flux._env(),  # noqa: SLF001 (the instance's environment)
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for(lambda: "standby:" in standby_log.read_text(), "the standby", 60)
            wait_for(lambda: "a standby waits" in flux.service_log(), "the active one told", 60)
            first = stack.submit(JOBDW, runtime=0.1)
            assert stack.wait(first, timeout=60).result == "COMPLETED"  # the first one served it
            assert "job snapshot" not in standby_log.read_text()
            running = stack.submit(JOBDW, runtime=3)
            stack.wait_event(running, "start", timeout=60)
            killed = time.monotonic()
            stack.kill_service()  # SIGKILL the active one with a job running
            wait_for(lambda: "taking over from pid" in standby_log.read_text(), "takeover", 60)
            print(
                f"standby took over {time.monotonic() - killed:.2f}s after SIGKILL (heartbeat 1s)"
            )
            later = stack.submit(JOBDW, runtime=0.1)
            for jobid in (running, later):
                info = stack.wait(jobid, timeout=90)
                assert info.result == "COMPLETED"
                assert max(asked(info).values()) == 1, asked(info)  # nothing done twice
                assert not info.events("dws-waiting")
            assert standby.poll() is None
        finally:
            standby.send_signal(signal.SIGTERM)
            assert standby.wait(30) == 0


def test_the_daemon_tells_systemd_ready_status_and_watchdog(tmp_path, monkeypatch) -> None:
    import socket

    path = str(tmp_path / "notify")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    listener.settimeout(60)
    try:
        with Stack({"heartbeat": "1s"}, hosts=2, backend="flux") as stack:
            stack.kill_service()  # started again with systemd's variables, the broker without
            monkeypatch.setenv("NOTIFY_SOCKET", path)
            monkeypatch.setenv("WATCHDOG_USEC", "3000000")
            stack.flux.start_service()
            messages = []
            while not any("READY=1" in m for m in messages):
                messages.append(listener.recv(4096).decode())
            ready = next(m for m in messages if "READY=1" in m)
            assert "STATUS=active: 0 #DW job(s) held; API reachable" in ready
            assert "workflow list" in stack.flux.service_log()  # ready after the first reconcile
            # pings go on after READY; a STATUS= change (the API judged unreachable on a
            # slow tick, then reachable again) may come between them, and is not counted
            pings = 0
            while pings < 2:  # each recv waits at most the socket's 60 s timeout
                pings += listener.recv(4096).decode() == "WATCHDOG=1"
    finally:
        listener.close()
