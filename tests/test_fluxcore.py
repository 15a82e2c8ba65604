# SPDX-License-Identifier: LGPL-3.0-only
"""Finding flux-core and its bindings from any Python (flux_dws.flux.bindings), against fake
``flux`` commands: installed and importable, importable only with missing pieces, built for
another Python, switched off.  Each case runs in a fresh interpreter, since a Python that
imported ``flux`` once keeps it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flux_dws.flux.bindings import flux_command

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
PROBE = (
    "from flux_dws.flux.bindings import bindings_problem, import_flux\n"
    "problem = bindings_problem()\n"
    "print(problem if problem else 'ok ' + import_flux().__file__)\n"
)


def fake_flux(tmp_path: Path, version: str, package: str) -> Path:
    """A `flux` whose `config builtin python_path` names bindings for Python ``version``."""
    bindings = tmp_path / "lib" / "flux" / f"python{version}"
    (bindings / "flux").mkdir(parents=True)
    (bindings / "flux" / "__init__.py").write_text(package)
    flux = tmp_path / "bin" / "flux"
    flux.parent.mkdir()
    flux.write_text(
        f'#!/bin/sh\ntest "$*" = "config builtin python_path" && echo {bindings} && exit 0\n'
        "exit 1\n"
    )
    flux.chmod(0o755)
    return flux


def probe(flux: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["FLUX_DWS_FLUX"] = flux
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(autouse=True)
def _no_flux_in_this_python():
    done = subprocess.run([sys.executable, "-c", "import flux"], capture_output=True, timeout=60)
    if done.returncode == 0:
        pytest.skip("flux is importable in this Python without help: nothing to find")


def test_bindings_that_flux_names_are_imported(tmp_path):
    flux = fake_flux(tmp_path, VERSION, "def Flux():\n    return None\n")
    out = probe(str(flux))
    assert out == f"ok {tmp_path}/lib/flux/python{VERSION}/flux/__init__.py\n"


def test_bindings_missing_a_dependency_say_which_in_one_line(tmp_path):
    missing = "raise ModuleNotFoundError(\"No module named '_cffi_backend'\", name='_cffi_backend')"
    flux = fake_flux(tmp_path, VERSION, missing)
    out = probe(str(flux))
    assert len(out.splitlines()) == 1
    assert "cannot be imported by" in out and "install cffi into this Python" in out


def test_bindings_built_for_another_python_are_not_loaded(tmp_path):
    flux = fake_flux(tmp_path, "3.1", "raise SystemExit('loaded bindings of another Python')")
    out = probe(str(flux))
    assert out == (
        f"flux-core's Python bindings in {tmp_path}/lib/flux/python3.1 were built for "
        f"Python 3.1, not {VERSION} ({sys.executable})\n"
    )


def test_switched_off_it_behaves_as_without_flux_core(tmp_path):
    assert probe("none") == "flux-core is not installed (FLUX_DWS_FLUX=none)\n"
    assert flux_command({"FLUX_DWS_FLUX": "none", "PATH": os.environ["PATH"]}) is None
    assert flux_command({"FLUX_DWS_FLUX": str(tmp_path / "nothing")}) is None
    flux = fake_flux(tmp_path, VERSION, "")
    assert flux_command({"FLUX_DWS_FLUX": "", "PATH": str(flux.parent)}) == str(flux)
