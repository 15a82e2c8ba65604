# SPDX-License-Identifier: LGPL-3.0-only
"""What a real Flux test instance needs, found or made: whether flux-core and its bindings can
be used from this Python (and why not), Fluxion, the jobtap and shell plugins built from this
checkout, an R for a test instance's hosts, and its TOML config.  The instance itself is
flux_dws.testing.realflux; nothing here imports ``flux`` at module load.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flux_dws.flux.bindings import bindings_path, bindings_problem, flux_command

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def real_flux_problem() -> str | None:
    """Why the real-Flux tests cannot run in this Python (one line), or None when they can.

    They need flux-core (``flux``) and its Python bindings importable here: the tests and the
    service talk to the instance from this Python, never from ``flux python``'s.
    """
    if flux_command() is None:  # even if some `flux` package is importable: none to start
        return bindings_problem() or "flux-core is not installed (no flux on PATH or /opt/flux)"
    return bindings_problem()


def flux_pythonpath(flux: str) -> str:
    """Where flux-core's Python bindings live, for `import flux` in our processes."""
    return ":".join(bindings_path(flux))


def fluxion_installed(flux: str | None = None) -> bool:
    """Is Fluxion (flux-sched) installed beside flux-core?  It then schedules every instance."""
    found = flux or flux_command()
    if found is None:
        return False
    prefix = os.path.dirname(os.path.dirname(found))
    return os.path.exists(
        os.path.join(prefix, "lib", "flux", "modules", "sched-fluxion-qmanager.so")
    )


def plain_R(hosts: Sequence[str], cores: str = "0") -> dict[str, Any]:
    """An RFC 20 R with one rank per host (the fake hosts of a test instance)."""
    return {
        "version": 1,
        "execution": {
            "R_lite": [{"rank": f"0-{len(hosts) - 1}", "children": {"core": cores}}],
            "starttime": 0.0,
            "expiration": 0.0,
            "nodelist": [",".join(hosts)],
        },
    }


def build_plugins(flux: str) -> dict[str, str]:
    """Build the jobtap and shell plugins; their paths by name."""
    env = {**os.environ, "PATH": f"{os.path.dirname(flux)}:{os.environ.get('PATH', '')}"}
    prefix = os.path.dirname(os.path.dirname(flux))
    env.setdefault("PKG_CONFIG_PATH", os.path.join(prefix, "lib", "pkgconfig"))
    built = {}
    for directory, name in (("jobtap", "dws-jobtap.so"), ("shell", "dws-env.so")):
        subprocess.run(
            ["make", "-s", "-C", str(ROOT / directory)], env=env, check=True, timeout=300
        )
        built[name] = str(ROOT / directory / name)
    return built


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def write_toml(tables: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    """A small TOML writer for the instance's config (nested tables as dotted headers)."""
    lines: list[str] = []

    def table(name: str, body: Mapping[str, Any]) -> None:
        scalars = {k: v for k, v in body.items() if not isinstance(v, Mapping)}
        lines.append(f"[{name}]")
        lines.extend(f'"{k}" = {_toml(v)}' for k, v in scalars.items())
        for key, value in body.items():
            if isinstance(value, Mapping):
                table(f'{name}."{key}"', value)

    for name, body in tables.items():
        table(name, body)
    path.write_text("\n".join(lines) + "\n")
