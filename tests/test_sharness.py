"""The sharness tests in t/ (real Flux, the real dws jobtap plugin), one pytest test per file.

Each t/tNNNN-*.t script runs with bash from t/ and starts its own Flux test instance; the
whole module is skipped where flux-core is not installed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
T_DIR = ROOT / "t"
#: Where flux-core is installed when it is not on PATH.
FLUX_FALLBACK = Path("/opt/flux/bin/flux")
SHARNESS_CANDIDATES = (
    Path("/usr/share/sharness/sharness.sh"),
    Path("/usr/local/share/sharness/sharness.sh"),
)
#: Bound on one test file's run (it starts and stops Flux instances).
TIMEOUT = float(os.environ.get("DWS_SHARNESS_TIMEOUT", "600"))
OUTPUT_TAIL_LINES = 60


def find_flux() -> Path | None:
    found = shutil.which("flux")
    if found:
        return Path(found)
    return FLUX_FALLBACK if os.access(FLUX_FALLBACK, os.X_OK) else None


def find_sharness() -> Path | None:
    configured = os.environ.get("SHARNESS")
    candidates = ((Path(configured),) if configured else ()) + SHARNESS_CANDIDATES
    return next((path for path in candidates if path.is_file()), None)


FLUX = find_flux()

pytestmark = pytest.mark.skipif(
    FLUX is None,
    reason="flux-core is not installed (no flux on PATH or in /opt/flux/bin): t/ skipped",
)


def tail(text: str, lines: int = OUTPUT_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


@pytest.mark.parametrize("script", sorted(T_DIR.glob("t[0-9]*.t")), ids=lambda p: p.name)
def test_sharness_file(script: Path) -> None:
    sharness = find_sharness()
    if sharness is None:
        pytest.fail(
            "sharness is not installed (no /usr/share/sharness/sharness.sh): "
            "apt-get install sharness (or set SHARNESS=/path/to/sharness.sh)"
        )
    assert FLUX is not None
    env = dict(os.environ, SHARNESS=str(sharness))
    env["PATH"] = f"{FLUX.parent}{os.pathsep}{env.get('PATH', '')}"
    output, returncode = run_script(script, env)
    assert returncode == 0, f"t/{script.name} failed (exit {returncode}):\n{tail(output)}"


def run_script(script: Path, env: dict[str, str]) -> tuple[str, int]:
    """Run one test file in its own process group, so a timeout ends its Flux instance too."""
    proc = subprocess.Popen(
        ["bash", script.name],
        cwd=T_DIR,
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
