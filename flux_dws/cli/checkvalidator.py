# SPDX-License-Identifier: LGPL-3.0-only
"""``flux dws check-validator``: does the ingest validator load in job-ingest's Python?

job-ingest runs its validators with ``flux job-validator``, under flux-core's own Python.  A
validator that cannot be loaded there makes every submission fail, #DW or not, so this runs
that very command on two probe jobs, a plain one and a #DW one with a bad directive, and
says whether the plain one is accepted and the #DW one checked.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

from flux_dws.flux.bindings import flux_command

#: Seconds ``flux job-validator`` may take for the two probe jobs.
CHECK_TIMEOUT = 60.0
#: The #DW probe lacks its name= key: any working validator rejects it.
BAD_DIRECTIVE = "#DW jobdw type=xfs capacity=1GiB"


def probe_jobspec(system: dict[str, object]) -> dict[str, object]:
    """A minimal valid V1 jobspec (one task, `true`) with these attributes.system."""
    return {
        "version": 1,
        "resources": [
            {"type": "slot", "count": 1, "label": "task", "with": [{"type": "core", "count": 1}]}
        ],
        "tasks": [{"command": ["true"], "slot": "task", "count": {"per_slot": 1}}],
        "attributes": {"system": {"duration": 0, "cwd": "/", "environment": {}, **system}},
    }


def probe_input() -> str:
    lines = [probe_jobspec({}), probe_jobspec({"dw": BAD_DIRECTIVE})]
    return "".join(json.dumps(spec) + "\n" for spec in lines)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str


def judge(path: str, stdout: str, stderr: str, under_instance: bool = True) -> Verdict:
    """What `flux job-validator` said about the probes, as one line.

    Outside an instance the validator cannot read a [dws] table and says so for #DW jobs:
    that still shows it loaded and checks them.
    """
    answers = []
    for line in stdout.splitlines():
        try:
            answers.append(json.loads(line))
        except ValueError:
            continue
    said = " ".join((stderr.strip().splitlines() or ["no output"])[-1].split())
    if len(answers) < 2 or not all(isinstance(a, dict) for a in answers):
        return Verdict(
            False,
            f"job-ingest's Python cannot load {path} ({said}): with it in "
            "[ingest.validator] every submission would fail",
        )
    plain, dws = answers[0], answers[1]
    if plain.get("errnum", 0) != 0:
        return Verdict(False, f"{path} rejects a job without #DW: {plain.get('errstr', '')}")
    if dws.get("errnum", 0) == 0:
        return Verdict(False, f"{path} loads but accepted a bad #DW directive: is it flux-dws's?")
    reason = str(dws.get("errstr", ""))
    loads = f"{path} loads in job-ingest's Python and checks #DW jobs"
    if "configuration is invalid" in reason and under_instance:
        return Verdict(False, f"{path} loads, but rejects every #DW job: {reason}")
    if not under_instance:
        return Verdict(True, f"{loads} (run it under the instance to check its [dws] table)")
    return Verdict(True, loads)


def default_path() -> str:
    """This install's validator file, the path to put in [ingest.validator]."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "validator.py")


def check(path: str | None = None) -> Verdict:
    """Run ``flux job-validator --plugins=jobspec,PATH`` on the probes, as job-ingest does.

    It runs from ``/`` without PYTHONPATH, as under a system instance, so neither this
    checkout nor this Python's path can make it pass.
    """
    path = os.path.abspath(path or default_path())
    flux = flux_command()
    if flux is None:
        return Verdict(False, "flux-core is not installed (no flux on PATH or in /opt/flux/bin)")
    if not os.path.isfile(path):
        return Verdict(False, f"{path}: no such file")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        done = subprocess.run(
            [flux, "job-validator", "--jobspec-only", f"--plugins=jobspec,{path}"],
            input=probe_input(),
            capture_output=True,
            text=True,
            cwd="/",
            env=env,
            timeout=CHECK_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Verdict(False, f"flux job-validator did not answer within {CHECK_TIMEOUT:g}s")
    except OSError as exc:
        return Verdict(False, f"cannot run {flux}: {exc.strerror or exc}")
    return judge(path, done.stdout, done.stderr, under_instance=bool(os.environ.get("FLUX_URI")))
