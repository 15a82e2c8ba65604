# SPDX-License-Identifier: LGPL-3.0-only
"""One sanitiser for what people read (flux_dws.base.untrusted.readable), held to every sink.

End to end, through kubeapi, dwssim and fakeflux with the service in this process: hostile
text (ESC, CSI and OSC sequences, C1 controls, bidi overrides, NUL, lone surrogates, line
separators) is put where a user or Kubernetes can put it: a user's ``#DW Teardown
action=error message=``, a copy's source path, a ClientMount's ``status.error.userMessage``,
a container's log and its status reason.  Then every sink must show it only as readable
text: drain reasons, events, exception notes, the job's KVS records, the service's log lines
and everything ``flux dws`` prints.  A sink that skipped readable() fails here.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from flux_dws.base.untrusted import readable
from flux_dws.cli import main as cli_main
from flux_dws.cli.sources import StackSource
from flux_dws.core.output import OUTPUT_KEY
from flux_dws.testing.kubeapi.podlog import logs_of
from flux_dws.testing.stack import Stack

#: What a #DW word may hold (no whitespace: U+2028 and U+0085 split words; no NUL or lone
#: surrogate: jansson refuses those in a jobspec before any of it reaches flux-dws).
WORD = "\x1b]0;owned\x07\x1b[31mred\x1b[0m\u202eevil\u2066\x9b2J\x7fend"
#: What Kubernetes may hold: anything.
ANY = WORD + "\x00nul\udcff\u2028next\r\x1b[2Kline\n\x1b[1Aup\x85"

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
GFS2 = "#DW jobdw type=gfs2 capacity=10GiB name=shared"
CONFIG = {"heartbeat": "2s", "health-interval": "0.2s", "failure-tolerance-max": 2}


def clean(value: str, *, lines: bool = False) -> bool:
    return value == readable(value, None, lines=lines)


def strings(obj: Any) -> Iterator[str]:
    """Every string (keys too) in a JSON value."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for key, item in obj.items():
            yield str(key)
            yield from strings(item)
    elif isinstance(obj, list):
        for item in obj:
            yield from strings(item)


def _hostile_mounts(operation: str, old: dict | None, new: dict) -> dict:
    error = (new.get("status") or {}).get("error")
    if isinstance(error, dict) and error.get("userMessage"):
        error["userMessage"] = f"could not mount: {ANY}"
    return new


def _hostile_pods(operation: str, old: dict | None, new: dict) -> dict:
    for status in (new.get("status") or {}).get("containerStatuses") or []:
        for state in (status.get("state") or {}).values():
            if isinstance(state, dict) and "reason" in state:
                state["reason"] = f"Completed{ANY}"
    return new


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    rabbits = {"rabbit-0": ["compute-01", "compute-02"], "rabbit-1": ["compute-03", "compute-04"]}
    with Stack(CONFIG, hosts=4, rabbits=rabbits, identity="sinks") as stack:
        assert stack.api is not None
        store = stack.api.store
        store.add_admission("clientmounts", _hostile_mounts)
        store.add_admission("pods", _hostile_pods)
        logs = logs_of(store)
        write = logs.write

        def hostile_write(namespace, pod, container, text, **kw):  # the container's own output
            extra = f"\n{ANY}\n".encode("utf-8", "surrogatepass") + b"\xff\xfe bad utf-8\n"
            data = text.encode() if isinstance(text, str) else bytes(text)
            write(namespace, pod, container, data + extra, **kw)

        logs.write = hostile_write  # type: ignore[method-assign]
        yield stack


def cli(stack: Stack, *args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    source = StackSource(stack)
    code = cli_main(list(args), out=out, err=err, source_factory=lambda: source, environ={})
    assert code == 0, err.getvalue()
    return out.getvalue() + err.getvalue()


def test_hostile_text_reaches_every_sink_only_as_readable_text(stack, caplog):
    caplog.set_level(logging.DEBUG)
    stack.sim.faults.fail_mount("compute-03")
    submits = [  # one at a time: the jobs drain nodes, which later jobs then cannot have
        dict(dw=JOBDW, nnodes=4, tolerance=1),  # compute-03's mount fails: it is drained
        dict(dw=[JOBDW, f"#DW Teardown action=error message={WORD} severity=Fatal"], nnodes=2),
        dict(dw=[JOBDW, f"#DW copy_in source=/lus/missing/{WORD} destination=$DW_JOB_scratch/x"]),
        dict(dw=[GFS2, "#DW container name=app profile=ok DW_JOB_data=shared"]),
    ]
    jobs, infos = [], []
    for submit in submits:
        jobs.append(stack.submit(submit.pop("dw"), **submit))
        infos.append(stack.wait(jobs[-1], timeout=60))
    stack.sim.faults.fail_mount("compute-03", False)

    # the hostile text did arrive (else this test proves nothing)
    drained = stack.flux.drained_ranks()
    assert any("owned" in r for r in drained.values()), drained
    assert any("could not mount" in r for r in drained.values()), drained
    assert "owned" in infos[2].exception["note"]
    problems: list[str] = []

    # drain reasons (what `flux resource drain` prints raw)
    problems += [f"drain reason {r!r}" for r in drained.values() if not clean(r)]
    for info in infos:
        # events and exception notes (what `flux job eventlog` prints)
        for entry in info.eventlog:
            problems += [
                f"event {entry.get('name')}: {s!r}"
                for s in strings(entry.get("context") or {})
                if not clean(s)
            ]
    # the KVS record of the container job (what `flux dws logs --json` and users read)
    record = json.loads(stack.saved(jobs[3], OUTPUT_KEY))
    assert "owned" in json.dumps(record), record
    problems += [f"KVS {s!r}" for s in strings(record) if not clean(s, lines=True)]
    # everything flux dws prints
    for jobid in jobs:
        for args in (("status",), ("status", "--json"), ("logs",), ("logs", "--json")):
            out = cli(stack, *args, str(jobid))
            if not clean(out, lines=True):
                problems.append(f"flux dws {' '.join(args)} {jobid}: {out!r}")
    for args in (("list",), ("status",)):
        out = cli(stack, *args)
        if not clean(out, lines=True):
            problems.append(f"flux dws {' '.join(args)}: {out!r}")
    # the service's log lines: each is one readable line (the stand-ins' own logs are not read)
    for rec in caplog.records:
        ours = rec.name.startswith("flux-dws") and not rec.name.startswith("flux-dws.testing")
        if ours and not clean(rec.getMessage()):
            problems.append(f"log {rec.name}: {rec.getMessage()!r}")
    assert not problems, "\n".join(problems[:20])
    for rank in drained:
        stack.flux.undrain(str(rank))
