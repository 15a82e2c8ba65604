# SPDX-License-Identifier: LGPL-3.0-only
"""One sanitiser for what people read (flux_dws.base.untrusted.readable), held to every sink.

End to end, through kubeapi, dwssim and fakeflux with the service in this process: hostile
text (ESC, CSI and OSC sequences, C1 controls, bidi overrides, NUL, lone surrogates, line
separators, invalid UTF-8), a megabyte of it where the channel takes that much, is put where
a user or Kubernetes can put it: a user's ``#DW Teardown action=error message=``, a copy's
source path, a ClientMount's ``status.error.userMessage``, the workflow's status, a
container's log and its status reason, a Storage's status, a PersistentStorageInstance, a
file path given to ``flux dws rabbit-graph``.  Then every sink must show it only as readable
text no longer than that sink's bound: drain reasons, events, exception notes, memos, the
job's KVS records, the service's log lines and everything ``flux dws`` prints (status, list,
logs, rabbits, persistent list, rabbit-graph, cleanup).  A sink that skipped readable() or
its bound fails here; test_only_the_sinks_print checks that the CLI has no other way out.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import pathlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from flux_dws.base.untrusted import (
    CUT,
    LINE_LIMIT,
    LOG_LIMIT,
    RECORD_LIMIT,
    readable,
)
from flux_dws.cli import main as cli_main
from flux_dws.cli.sources import StackSource
from flux_dws.core.health import MAX_REASON
from flux_dws.core.output import OUTPUT_KEY, read_saved
from flux_dws.flux.jobmanager import NOTE_LIMIT
from flux_dws.service.daemon import TRACEBACK_LIMIT, ReadableFormatter
from flux_dws.testing.kubeapi.podlog import logs_of
from flux_dws.testing.stack import Stack

#: What a #DW word may hold (no whitespace: U+2028 and U+0085 split words; no NUL or lone
#: surrogate: jansson refuses those in a jobspec before any of it reaches flux-dws).
WORD = "\x1b]0;owned\x07\x1b[31mred\x1b[0m\u202eevil\u2066\x9b2J\x7fend"
#: What Kubernetes may hold: anything.
ANY = WORD + "\x00nul\udcff\u2028next\r\x1b[2Kline\n\x1b[1Aup\x85"
#: A megabyte of it: what a DWS message, a pod's status or a container's output may be.
HUGE = (ANY * (2**20 // len(ANY) + 1))[: 2**20]

JOBDW = "#DW jobdw type=xfs capacity=10GiB name=scratch"
GFS2 = "#DW jobdw type=gfs2 capacity=10GiB name=shared"
CONFIG = {"heartbeat": "2s", "health-interval": "0.2s", "failure-tolerance-max": 2}
#: What the service's log handler writes before the message (flux_dws.service.daemon).
LOG_FORMAT = "flux-dws: %(levelname)s: %(message)s"


def clean(value: str, *, lines: bool = False) -> bool:
    return value == readable(value, None, lines=lines)


def within(value: str, limit: int, *, lines: bool = False) -> bool:
    """Readable and at most ``limit`` characters."""
    return clean(value, lines=lines) and len(value) <= limit


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


def _oversized(value: Any) -> Any:
    """Every string of ``value`` with the user's WORD grown into HUGE (once: not again)."""
    if isinstance(value, str):
        return value.replace(WORD, HUGE, 1) if WORD in value and len(value) < len(HUGE) else value
    if isinstance(value, dict):
        return {k: _oversized(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_oversized(v) for v in value]
    return value


def _hostile_status(operation: str, old: dict | None, new: dict) -> dict:
    """DWS repeats what the user wrote in a #DW directive (a Teardown message, a copy's path)
    in a status: there it is a megabyte long."""
    if isinstance(new.get("status"), dict):
        new["status"] = _oversized(new["status"])
    return new


def _hostile_mounts(operation: str, old: dict | None, new: dict) -> dict:
    error = (new.get("status") or {}).get("error")
    if isinstance(error, dict) and error.get("userMessage"):
        error["userMessage"] = f"could not mount: {HUGE}"
    return new


def _hostile_pods(operation: str, old: dict | None, new: dict) -> dict:
    for status in (new.get("status") or {}).get("containerStatuses") or []:
        for state in (status.get("state") or {}).values():
            if isinstance(state, dict) and "reason" in state:
                state["reason"] = f"Completed{HUGE}"
    return new


def _hostile_storages(operation: str, old: dict | None, new: dict) -> dict:
    if isinstance(new.get("status"), dict):
        new["status"]["message"] = HUGE
    return new


def _hostile_persistent(stack: Stack) -> None:
    """Persistent storage as nnf-sos could leave it: its state and users are anything."""
    assert stack.api is not None
    stack.api.store.create(
        "persistentstorageinstances",
        "default",
        {
            "apiVersion": "dataworkflowservices.github.io/v1alpha7",
            "kind": "PersistentStorageInstance",
            "metadata": {"name": "hostile"},
            "spec": {
                "name": "hostile",
                "fsType": WORD,
                "userID": 4242,
                "state": "Active",
                "dwDirective": "#DW create_persistent type=lustre name=hostile",
                "consumerReferences": [{"name": ANY[:200] + str(i)} for i in range(64)],
            },
            "status": {"state": ANY},
        },
    )


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    rabbits = {"rabbit-0": ["compute-01", "compute-02"], "rabbit-1": ["compute-03", "compute-04"]}
    with Stack(CONFIG, hosts=4, rabbits=rabbits, identity="sinks") as stack:
        assert stack.api is not None
        store = stack.api.store
        for plural in ("workflows", "nnfdatamovements"):
            store.add_admission(plural, _hostile_status)
        store.add_admission("clientmounts", _hostile_mounts)
        store.add_admission("pods", _hostile_pods)
        logs = logs_of(store)
        write = logs.write

        def hostile_write(namespace, pod, container, text, **kw):  # the container's own output
            extra = f"\n{HUGE}\n".encode("utf-8", "surrogatepass") + b"\xff\xfe bad utf-8\n"
            data = text.encode() if isinstance(text, str) else bytes(text)
            write(namespace, pod, container, data + extra, **kw)

        logs.write = hostile_write  # type: ignore[method-assign]
        yield stack


def run_cli(stack: Stack | None, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    source = StackSource(stack) if stack is not None else None
    factory = (lambda: source) if source is not None else None
    code = cli_main(list(args), out=out, err=err, source_factory=factory, environ={})
    return code, out.getvalue(), err.getvalue()


def cli(stack: Stack, *args: str) -> str:
    code, out, err = run_cli(stack, *args)
    assert code == 0, err
    return out + err


def printed_problems(command: str, out: str, *, json_limit: int = LINE_LIMIT) -> list[str]:
    """What ``flux dws COMMAND`` printed that is not readable or longer than its bound: each
    line at most LINE_LIMIT, or each string of the JSON it printed at most ``json_limit``."""
    problems = []
    for line in out.splitlines():
        if line.startswith(("{", "[")):
            try:
                value = json.loads(line)
            except ValueError:
                problems.append(f"{command}: not JSON: {line[:200]!r}")
                continue
            problems += [
                f"{command}: JSON string of {len(s)}: {s[:200]!r}"
                for s in strings(value)
                if not within(s, json_limit, lines=True)
            ]
        elif not within(line, LINE_LIMIT):
            problems.append(f"{command}: line of {len(line)}: {line[:200]!r}")
    if not clean(out, lines=True):
        problems.append(f"{command}: not readable: {out[:200]!r}")
    return problems


def cut(value: str, limit: int) -> bool:
    """``value`` is a text cut at ``limit`` (so the oversized text did arrive there)."""
    return len(value) == limit and value.endswith(CUT)


def test_hostile_text_reaches_every_sink_only_as_readable_text(stack, caplog):
    caplog.set_level(logging.DEBUG)
    stack.sim.faults.fail_mount("compute-03")
    submits = [  # one at a time: the jobs drain nodes, which later jobs then cannot have
        dict(dw=JOBDW, nnodes=4, tolerance=1),  # compute-03's mount fails: it is drained
        dict(dw=[JOBDW, f"#DW Teardown action=error message={WORD} severity=Fatal"], nnodes=2),
        dict(dw=[JOBDW, f"#DW copy_in source=/lus/missing/{WORD} destination=$DW_JOB_scratch/x"]),
        dict(dw=[GFS2, "#DW container name=app profile=ok DW_JOB_local_storage=shared"]),
    ]
    jobs, infos = [], []
    for submit in submits:
        jobs.append(stack.submit(submit.pop("dw"), **submit))
        infos.append(stack.wait(jobs[-1], timeout=60))
    stack.sim.faults.fail_mount("compute-03", False)
    running = stack.submit(JOBDW, runtime=None)  # for a memo: only a held job takes one
    stack.wait_event(running, "start")
    memo_answer = send_memo(stack, running, {"rabbits": HUGE, HUGE: ANY})
    stack.flux.finish(running)
    infos.append(stack.wait(running, timeout=60))
    jobs.append(running)

    # the hostile text did arrive (else this test proves nothing)
    drained = stack.flux.drained_ranks()
    assert any("owned" in r for r in drained.values()), drained
    assert any("could not mount" in r for r in drained.values()), drained
    assert "owned" in infos[2].exception["note"]
    assert memo_answer is None, memo_answer  # the plugin took the memo
    problems: list[str] = []

    # drain reasons (what `flux resource drain` prints raw)
    problems += [f"drain reason {r!r}" for r in drained.values() if not within(r, MAX_REASON)]
    assert any(cut(r, MAX_REASON) for r in drained.values()), drained
    event_strings = []
    for info in infos:
        # events, exception notes and memos (what `flux job eventlog`, `flux jobs` print)
        for entry in info.eventlog:
            name, context = entry.get("name"), entry.get("context") or {}
            event_strings += list(strings(context))
            problems += [
                f"event {name}: {len(s)}: {s[:200]!r}"
                for s in strings(context)
                if not within(s, RECORD_LIMIT)
            ]
            if name == "exception":
                note = context.get("note", "")
                problems += [f"exception note {note[:200]!r}"] if len(note) > NOTE_LIMIT else []
    assert any(cut(s, RECORD_LIMIT) for s in event_strings)  # a DWS message, in an event
    memos = [e["context"] for e in infos[-1].eventlog if e.get("name") == "memo"]
    assert any(cut(m.get("rabbits", ""), RECORD_LIMIT) for m in memos), memos
    # the KVS record of the container job (what `flux dws logs --json` and users read)
    record = json.loads(stack.saved(jobs[3], OUTPUT_KEY))
    saved = read_saved(record)
    assert saved is not None and "owned" in json.dumps(record), record
    problems += [
        f"KVS {len(s)}: {s[:200]!r}"
        for s in strings(record)
        if not within(s, saved.text_limit, lines=True)
    ]
    assert any("owned" in c.log for c in saved.containers)  # the megabyte log: its tail
    # everything flux dws prints
    for jobid in jobs:
        for args in (("status",), ("status", "--json"), ("logs",)):
            problems += printed_problems(f"{args} {jobid}", cli(stack, *args, str(jobid)))
        out = cli(stack, "logs", "--json", str(jobid))
        problems += printed_problems(f"logs --json {jobid}", out, json_limit=saved.text_limit)
    for args in (("status",), ("status", "--json")):  # the service's state
        problems += printed_problems(" ".join(args), cli(stack, *args))
    status = cli(stack, "status", str(jobs[1]))
    assert any(cut(line, LINE_LIMIT) for line in status.splitlines()), status[:2000]
    # the service's log lines, as its handler writes them (the stand-ins' are not read)
    formatter = ReadableFormatter(LOG_FORMAT)
    for rec in caplog.records:
        ours = rec.name.startswith("flux-dws") and not rec.name.startswith("flux-dws.testing")
        if not ours:
            continue
        if not clean(rec.getMessage()):  # call sites make their arguments readable too
            problems.append(f"log {rec.name}: {rec.getMessage()[:200]!r}")
        message, _, trace = formatter.format(rec).partition("\n")
        if not within(message, log_bound(rec)) or not within(trace, TRACEBACK_LIMIT, lines=True):
            problems.append(f"log line of {len(message)}: {message[:200]!r}")
    assert not problems, "\n".join(problems[:20])
    for rank in drained:
        stack.flux.undrain(str(rank))


def log_bound(record: logging.LogRecord) -> int:
    """The longest line the service's handler may write for ``record`` (its traceback, if
    any, follows on lines of its own: at most TRACEBACK_LIMIT)."""
    return len(LOG_FORMAT % {"levelname": record.levelname, "message": ""}) + LOG_LIMIT


def test_the_service_log_handler_writes_a_megabyte_readable_and_bounded():
    try:
        raise ValueError(HUGE)
    except ValueError:
        failure = sys.exc_info()
    record = logging.LogRecord("flux-dws", logging.ERROR, __file__, 1, "said %s", (HUGE,), None)
    line = ReadableFormatter(LOG_FORMAT).format(record)
    assert within(line, log_bound(record)) and cut(line, log_bound(record)), line[:200]
    record.exc_info = failure
    line = ReadableFormatter(LOG_FORMAT).format(record)
    message, _, trace = line.partition("\n")
    assert within(message, log_bound(record)) and cut(message, log_bound(record))
    assert within(trace, TRACEBACK_LIMIT, lines=True) and cut(trace, TRACEBACK_LIMIT)
    assert "ValueError" in trace and "owned" in trace


def send_memo(stack: Stack, jobid: int, memo: dict[str, Any]) -> Any:
    """The service's own JobManager.memo, on its loop, as it sets the job's rabbits memo;
    the plugin's error (None: taken)."""
    assert stack.loop is not None and stack.service is not None
    done, answer = threading.Event(), []

    def answered(_response: Any, error: Any) -> None:
        answer.append(error)
        done.set()

    stack.loop.call_soon(stack.service.jm.memo, jobid, memo, answered)
    assert done.wait(30), "no answer to the memo"
    return answer[0]


def test_rabbits_persistent_and_rabbit_graph_print_only_readable_bounded_text(stack, tmp_path):
    assert stack.api is not None
    stack.api.store.add_admission("storages", _hostile_storages)
    stack.set_rabbit("rabbit-1", "Degraded")
    _hostile_persistent(stack)
    problems: list[str] = []
    live = ("--kubeconfig", stack.kubeconfig)
    rabbits = cli(stack, "rabbits", *live, "-o", "{name} {reasons}")
    assert "owned" in rabbits, rabbits  # the Storage's message did arrive
    for args in ((), ("--json",), ("-o", "{name} {reasons} {reasons} {reasons}")):
        problems += printed_problems(f"rabbits {args}", cli(stack, "rabbits", *live, *args))
    listed = cli(stack, "persistent", "list", *live)
    assert "owned" in listed, listed
    for args in ((), ("--json",), ("-o", "{name} {state} {type} {jobs}")):
        out = cli(stack, "persistent", "list", *live, *args)
        problems += printed_problems(f"persistent list {args}", out)
    # an error line: the path given to -R is the user's (a NUL makes open() refuse it)
    code, out, err = run_cli(None, "rabbit-graph", "-R", f"/nonexistent/{HUGE}", *live)
    assert code == 1 and out == "" and "owned" in err, err[:200]
    problems += printed_problems("rabbit-graph", err)
    assert cut(err.rstrip("\n"), LINE_LIMIT), err[-200:]
    assert not problems, "\n".join(problems[:20])


def _hostile_message(operation: str, old: dict | None, new: dict) -> dict:
    """A workflow whose status message, from DWS, is a megabyte of anything."""
    if isinstance(new.get("status"), dict):
        new["status"]["message"] = HUGE
    return new


def test_list_and_cleanup_print_a_hostile_workflow_readable_and_bounded():
    from flux_dws.k8s import KubeClient

    with Stack(identity="sweeper") as stack:
        assert stack.api is not None
        stack.api.store.add_admission("workflows", _hostile_message)
        stack.kill_service()  # otherwise the service would sweep the orphan itself
        kube = KubeClient.connect(
            namespace="default", identity="sweeper", kubeconfig=stack.kubeconfig
        )
        try:
            teardown = "#DW Teardown action=error message=failed severity=Fatal"
            kube.create_workflow(jobid=7, userid=0, groupid=0, directives=[JOBDW, teardown])
        finally:
            kube.close()
        problems: list[str] = []
        for args in ((), ("-o", "long"), ("-o", "{jobid} {message}"), ("--json",)):
            out = cli(stack, "list", "-A", *args)
            problems += printed_problems(f"list {args}", out)
        listed = cli(stack, "list", "-A", "-o", "{message}", "-n")
        assert "owned" in listed and cut(listed.rstrip("\n"), LINE_LIMIT), listed[:500]
        code, out, err = run_cli(stack, "cleanup", "--timeout", "20")
    assert "Teardown failed" in out and "owned" in out, (code, out[:500], err[:500])
    assert any(cut(line, LINE_LIMIT) for line in out.splitlines()), out[:2000]
    problems += printed_problems("cleanup", out + err)
    assert not problems, "\n".join(problems[:20])


def test_only_the_sinks_print():
    """``flux dws`` has no way out but flux_dws.cli.render.show and show_json: no print() and
    no write() anywhere else in flux_dws/cli, so a new command cannot skip readable()."""
    root = pathlib.Path(__file__).resolve().parent.parent / "flux_dws" / "cli"
    # the simulator's tools print the simulated cluster's own figures, not untrusted text
    tools = {"simulate.py", "simplan.py", "plot.py", "progress.py"}
    allowed = {
        ("render.py", "show"),
        ("render.py", "show_json"),
        ("render.py", "show_line"),
        ("rabbitgraph.py", "run"),  # writes R (JSON) for Fluxion, not for people
    }
    found = set()
    for path in sorted(root.glob("*.py")):
        if path.name in tools:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if not isinstance(node, ast.Call):
                    continue
                callee = node.func
                prints = isinstance(callee, ast.Name) and callee.id == "print"
                writes = isinstance(callee, ast.Attribute) and callee.attr == "write"
                if prints or writes:
                    found.add((path.name, func.name, node.lineno))
    outside = sorted(f"{f}:{line} in {fn}()" for f, fn, line in found if (f, fn) not in allowed)
    assert not outside, "print or write outside the sinks: " + ", ".join(outside)
    assert {(f, fn) for f, fn, _ in found} == allowed  # no stale exemption
