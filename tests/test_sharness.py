# SPDX-License-Identifier: LGPL-3.0-only
"""The sharness tests in t/ (real Flux, the real dws jobtap plugin), one pytest test per file.

Each t/tNNNN-*.t script runs with bash from t/ and starts its own Flux test instance, with
the service and the simulator under this very Python (``DWS_PYTHON``), never under
``flux python``'s.  The whole module is skipped, with one line saying why, where flux-core
is not installed or its Python bindings cannot be imported here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flux_dws.flux.bindings import flux_command
from flux_dws.testing.fluxsetup import real_flux_problem

ROOT = Path(__file__).resolve().parent.parent
T_DIR = ROOT / "t"
SHARNESS_CANDIDATES = (
    Path("/usr/share/sharness/sharness.sh"),
    Path("/usr/local/share/sharness/sharness.sh"),
)
#: Bound on one test file's run (it starts and stops Flux instances); a backstop only: a
#: script whose set-up fails stops at once (t/lib.sh dws_setup).
TIMEOUT = float(os.environ.get("DWS_SHARNESS_TIMEOUT", "600"))
OUTPUT_TAIL_LINES = 60

PROBLEM = real_flux_problem()
pytestmark = [
    pytest.mark.realflux,
    pytest.mark.skipif(PROBLEM is not None, reason=f"real Flux (t/) skipped: {PROBLEM}"),
]


def find_sharness() -> Path | None:
    configured = os.environ.get("SHARNESS")
    candidates = ((Path(configured),) if configured else ()) + SHARNESS_CANDIDATES
    return next((path for path in candidates if path.is_file()), None)


def tail(text: str, lines: int = OUTPUT_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def script_env() -> dict[str, str]:
    sharness = find_sharness()
    if sharness is None:
        pytest.fail(
            "sharness is not installed (no /usr/share/sharness/sharness.sh): "
            "apt-get install sharness (or set SHARNESS=/path/to/sharness.sh)"
        )
    flux = flux_command()
    assert flux is not None
    env = dict(os.environ, SHARNESS=str(sharness), DWS_PYTHON=sys.executable)
    env["PATH"] = f"{os.path.dirname(flux)}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.parametrize("script", sorted(T_DIR.glob("t[0-9]*.t")), ids=lambda p: p.name)
def test_sharness_file(script: Path) -> None:
    output, returncode = run_script(script, script_env())
    assert returncode == 0, f"t/{script.name} failed (exit {returncode}):\n{tail(output)}"


FAILING_SETUP = """\
test_description='a set-up that fails'
. "$SHARNESS"
. "$DWS_SRCDIR/t/lib.sh"
dws_setup 'setup: start what the tests need' '
    echo "the set-up said why" &&
    false
'
test_expect_success 'a test that needs the set-up' 'true'
test_done
"""


def test_a_failed_set_up_stops_the_script_at_once_with_its_output(tmp_path: Path) -> None:
    script = tmp_path / "t9999-failing-setup.t"
    script.write_text(FAILING_SETUP)
    env = dict(script_env(), DWS_SRCDIR=str(ROOT))
    output, returncode = run_script(script, env)
    assert returncode != 0
    assert "the set-up said why" in output
    assert "set-up failed: stopping here" in output
    assert "a test that needs the set-up" not in output


def run_script(script: Path, env: dict[str, str]) -> tuple[str, int]:
    """Run one test file in its own process group, so a timeout ends its Flux instance too."""
    proc = subprocess.Popen(
        ["bash", script.name],
        cwd=script.parent,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=30)
        pytest.fail(f"t/{script.name} did not finish within {TIMEOUT:g}s:\n{tail(output)}")
    return output, proc.returncode
