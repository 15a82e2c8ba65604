# SPDX-License-Identifier: LGPL-3.0-only
"""Finding flux-core from any Python: its ``flux`` command and its Python bindings.

flux-core installs its bindings for the Python it was built with, outside that Python's
default path (e.g. ``/opt/flux/lib/flux/python3.11``), and ``flux`` (0.88) runs a
``flux-dws`` found on PATH without putting them on ``PYTHONPATH``.  So flux-dws asks
``flux`` where they are (``flux config builtin python_path``, which runs no Python) and
imports them into the Python it runs under: the service, ``flux dws`` and the test suite
never run under ``flux python``'s interpreter, which may lack ``kubernetes``.

``FLUX_DWS_FLUX`` names the ``flux`` command to use; ``FLUX_DWS_FLUX=none`` makes flux-dws
behave as if flux-core were not installed (the test suite's real-Flux parts then skip).
"""

from __future__ import annotations

import glob
import importlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from types import ModuleType

from flux_dws.base.errors import DwsError

#: The environment variable naming the ``flux`` command ("none": behave as without flux-core).
FLUX_ENV = "FLUX_DWS_FLUX"
#: Where flux-core is looked for when ``flux`` is not on PATH.
FLUX_PREFIXES = ("/opt/flux", "/usr/local", "/usr")
#: Seconds ``flux config builtin`` may take (it starts no broker).
ASK_TIMEOUT = 30.0
#: flux-core installs its bindings in a directory named for the Python they were built for.
_VERSION_DIR = re.compile(r"python(\d+\.\d+)/?$")


class FluxUnavailable(DwsError):
    """flux-core or its bindings cannot be used here; str() is one line saying why."""


def flux_command(environ: Mapping[str, str] | None = None) -> str | None:
    """The ``flux`` executable, or None when flux-core is not installed (or switched off)."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(FLUX_ENV, "")
    if chosen.lower() == "none":
        return None
    if chosen:
        return chosen if os.access(chosen, os.X_OK) else None
    found = shutil.which("flux", path=environ.get("PATH"))
    if found:
        return found
    for prefix in FLUX_PREFIXES:
        candidate = os.path.join(prefix, "bin", "flux")
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def bindings_path(flux: str) -> list[str]:
    """The directories holding flux-core's ``flux`` Python package, as flux-core says.

    Asks ``flux config builtin python_path`` (no Python, no broker); when that fails, the
    prefix's ``lib*/flux/python3.*`` matching this Python's version, then any.
    """
    try:
        answer = subprocess.run(
            [flux, "config", "builtin", "python_path"],
            capture_output=True,
            text=True,
            timeout=ASK_TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        said = [p for p in answer.stdout.strip().split(":") if p] if answer.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        said = []
    found = [p for p in said if os.path.isdir(os.path.join(p, "flux"))]
    if found:
        return found
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(flux)))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for pattern in (f"lib*/flux/{version}", "lib*/flux/python3*"):
        matches = sorted(glob.glob(os.path.join(prefix, pattern)))
        if matches:
            return matches[:1]
    return said


def import_flux(environ: Mapping[str, str] | None = None) -> ModuleType:
    """flux-core's ``flux`` package, importable from this Python, or FluxUnavailable.

    An ``import flux`` that already works is used as it is; otherwise the bindings of the
    flux-core found by :func:`flux_command` are added to the end of ``sys.path``.
    """
    environ = os.environ if environ is None else environ
    switched_off = environ.get(FLUX_ENV, "").lower() == "none"
    if not switched_off:
        try:
            return importlib.import_module("flux")
        except ImportError:
            pass
    flux = flux_command(environ)
    if flux is None:
        why = f"{FLUX_ENV}=none" if switched_off else "no flux on PATH or in /opt/flux/bin"
        raise FluxUnavailable(f"flux-core is not installed ({why})")
    paths = bindings_path(flux)
    if not paths:
        raise FluxUnavailable(f"{flux} does not say where its Python bindings are")
    built_for = {m.group(1) for p in paths for m in [_VERSION_DIR.search(p)] if m}
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if built_for and running not in built_for:  # loading them could crash, not just fail
        raise FluxUnavailable(
            f"flux-core's Python bindings in {':'.join(paths)} were built for Python "
            f"{', '.join(sorted(built_for))}, not {running} ({sys.executable})"
        )
    for path in paths:
        if path not in sys.path:
            sys.path.append(path)
    _forget_failed_flux()
    try:
        return importlib.import_module("flux")
    except ImportError as exc:
        raise FluxUnavailable(_import_problem(exc, paths)) from None
    except Exception as exc:  # a broken build: still one line, never a trace
        raise FluxUnavailable(_import_problem(exc, paths)) from None


def bindings_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """Why this Python cannot use flux-core's bindings (one line), or None when it can."""
    try:
        import_flux(environ)
    except FluxUnavailable as exc:
        return str(exc)
    return None


def _forget_failed_flux() -> None:
    """Drop a half-imported ``flux`` (an earlier failed import) so the next one starts clean."""
    for name in [n for n in sys.modules if n == "flux" or n.startswith("flux.")]:
        if sys.modules[name] is None or name == "flux":
            del sys.modules[name]


def _import_problem(exc: BaseException, paths: list[str]) -> str:
    where = ":".join(paths)
    python = f"{sys.executable} ({sys.version_info.major}.{sys.version_info.minor})"
    what = " ".join(str(exc).split()) or type(exc).__name__
    hint = ""
    missing = getattr(exc, "name", None)
    if missing in ("_cffi_backend", "cffi", "ply"):
        hint = f"; install {missing.replace('_cffi_backend', 'cffi')} into this Python"
    elif "_core" in what or "cpython" in what:
        hint = "; they were built for another Python version"
    return f"flux-core's Python bindings in {where} cannot be imported by {python}: {what}{hint}"


def run_under_flux_hint(command: str, environ: Mapping[str, str] | None = None) -> str:
    """ " (run it as `flux dws ...`)" where that would help, else "".

    It helps only when no ``flux`` was found and this process was not started by ``flux``
    (which puts itself on PATH and sets FLUX_EXEC_PATH for the commands it runs).
    """
    environ = os.environ if environ is None else environ
    if environ.get(FLUX_ENV) or environ.get("FLUX_EXEC_PATH") or flux_command(environ):
        return ""
    return f" (run it as `{command}`, or put flux-core's bin directory on PATH)"
