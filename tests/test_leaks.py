# SPDX-License-Identifier: LGPL-3.0-only
"""Nothing a test run starts outlives it: the reaper finds exactly this run's processes.

conftest.py marks the run (``FLUX_DWS_TEST_RUN``), checks after every module that none of
its processes is left, and ends whatever is left when the run ends (a failed fixture,
Ctrl-C).  These tests check the pieces that makes that true.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from waiting import wait_for

from flux_dws.testing import reaper
from flux_dws.testing.fluxsetup import real_flux_problem


def _spawn(token: str, script: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, **{reaper.RUN_ENV: token})
    return subprocess.Popen(["sh", "-c", script], env=env, start_new_session=True)


def test_children_of_the_run_carry_its_token():
    said = subprocess.run(
        ["sh", "-c", f'echo "${reaper.RUN_ENV}"'], capture_output=True, text=True, check=True
    )
    assert said.stdout.strip() == os.environ[reaper.RUN_ENV] != ""


def test_reap_ends_a_run_s_processes_and_their_children_and_nothing_else():
    ours, theirs = reaper.new_token(), reaper.new_token()
    parent = _spawn(ours, "sleep 300 & sleep 300")
    other = _spawn(theirs, "sleep 300")
    try:
        found = wait_for(lambda: len(reaper.leftovers(ours)) == 3 and reaper.leftovers(ours))
        assert {p.pid for p in found} >= {parent.pid}
        assert other.pid not in {p.pid for p in found}
        ended = reaper.reap(ours)
        assert {p.pid for p in ended} == {p.pid for p in found}
        assert reaper.leftovers(ours) == []
        parent.wait(10)
        assert other.poll() is None  # another run's process is left alone
        assert other.pid in {p.pid for p in reaper.leftovers(theirs)}
    finally:
        reaper.reap(ours)
        reaper.reap(theirs)
        other.wait(10)
        parent.wait(10)


def test_reap_never_ends_the_process_that_calls_it():
    token = reaper.new_token()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from flux_dws.testing import reaper; import sys;print(len(reaper.reap(sys.argv[1])))",
            token,
        ],
        env=dict(os.environ, **{reaper.RUN_ENV: token}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert child.stdout.strip() == "0"


OWNER_DIES = """
    import os
    from flux_dws.testing.realflux import RealFlux
    flux = RealFlux(["compute-01", "compute-02"], {"instance": "leak"}).start()
    print(flux.uri, flux._instance.pid, flush=True)
    os._exit(9)  # as SIGKILL would: no stop(), no clean-up
"""


@pytest.mark.realflux
@pytest.mark.skipif(
    real_flux_problem() is not None, reason=f"real Flux skipped: {real_flux_problem()}"
)
def test_a_flux_instance_shuts_down_when_its_owner_dies_without_stopping_it():
    token = reaper.new_token()
    owner = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OWNER_DIES)],
        env=dict(os.environ, **{reaper.RUN_ENV: token}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        assert owner.returncode == 9, owner.stderr[-2000:]
        assert owner.stdout.strip(), owner.stderr[-2000:]
        deadline = time.monotonic() + 60
        while reaper.leftovers(token):
            assert time.monotonic() < deadline, [str(p) for p in reaper.leftovers(token)]
            time.sleep(0.2)
    finally:
        reaper.reap(token)
