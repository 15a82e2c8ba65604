# SPDX-License-Identifier: LGPL-3.0-only
"""``flux dws``: status, list, logs, cleanup, service, check-validator and simulate.

Installed as the ``flux-dws`` executable, which Flux runs for ``flux dws`` (it looks in its
exec path for ``flux-<command>``); ``python -m flux_dws`` is the same.  Every error is one line,
``flux-dws <command>: <what went wrong>`` (flux-core's own ``flux-<command>:`` form), and
nothing assumes a terminal.  A bare ``flux dws`` prints its usage and fails, as ``flux`` does.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable, TextIO

from flux_dws import __version__
from flux_dws.base import untrusted
from flux_dws.base.errors import DwsError
from flux_dws.base.usage import PROG, UsageError
from flux_dws.base.usage import OneLineParser as _Parser
from flux_dws.cli import commands
from flux_dws.cli.render import LIST_FIELDS, LIST_FORMATS, show, show_line
from flux_dws.cli.sources import FluxSource, Source, SourceError, flux_uri_problem
from flux_dws.core.rabbits import RabbitError
from flux_dws.k8s import KubeError

#: Commands that read a Flux instance (and need FLUX_URI).
INSTANCE_COMMANDS = ("status", "list", "logs", "cleanup")

__all__ = ["main", "build_parser", "UsageError", "PROG"]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="DWS (rabbit) workflows of this Flux instance's jobs.")
    parser.add_argument("--version", action="version", version=f"flux-dws {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "status",
        help="a job's workflow: timeline, timeouts, outcome; without JOBID, the service's health",
    )
    p.add_argument("jobid", metavar="JOBID", nargs="?")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("list", help="this instance's workflows")
    p.add_argument("-A", "--all", action="store_true", help="every user's workflows")
    p.add_argument("-u", "--user", help="only this user's (name, uid or 'all')")
    p.add_argument("-s", "--state", help="only these states (comma-separated, e.g. setup,prerun)")
    fields = ", ".join(LIST_FIELDS)
    p.add_argument(
        "-o",
        "--format",
        help=f"{'/'.join(LIST_FORMATS)} or a format string like '{{jobid}} {{state}}'"
        f" (fields: {fields})",
    )
    p.add_argument("-n", "--no-header", action="store_true", help="omit the header line")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("logs", help="a job's saved container outcome and driver errors")
    p.add_argument("jobid", metavar="JOBID")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("cleanup", help="tear down and delete orphaned workflows (admin)")
    p.add_argument("--dry-run", action="store_true", help="only say what would be swept")
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for each Teardown (default 60)",
    )
    p.add_argument(
        "--force", action="store_true", help="delete even when Teardown did not finish in time"
    )

    p = sub.add_parser(
        "service", help="run the flux-dws service (used by the systemd unit)", add_help=False
    )
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the service")

    p = sub.add_parser(
        "check-validator", help="check that the ingest validator loads in job-ingest's Python"
    )
    p.add_argument("path", nargs="?", metavar="PATH", help="validator.py (default: this install's)")

    p = sub.add_parser("rabbit-graph", help="write the instance's R with rabbits for Fluxion")
    from flux_dws.cli.rabbitgraph import add_arguments as rabbit_graph_arguments

    rabbit_graph_arguments(p)

    p = sub.add_parser("rabbits", help="rabbits: their nodes, health and capacity")
    from flux_dws.cli.rabbits import add_arguments as rabbits_arguments

    rabbits_arguments(p)

    p = sub.add_parser("persistent", help="persistent storage: list, create, destroy, share")
    from flux_dws.cli.persistent import add_arguments as persistent_arguments

    persistent_arguments(p, _Parser)

    p = sub.add_parser("simulate", help="run a mix of #DW jobs against a simulated cluster")
    from flux_dws.cli.simulate import add_arguments

    add_arguments(p)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    source_factory: Callable[[], Source] | None = None,
    environ: Mapping[str, str] | None = None,
    now: Callable[[], float] = time.time,
) -> int:
    """Run one ``flux dws`` command; the exit status.

    ``source_factory`` replaces the Flux instance (tests pass a StackSource).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    environ = os.environ if environ is None else environ
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # like a bare `flux`: the usage, and a failure
        parser.print_help(err)
        return 2
    if argv[0] == "service":  # everything after it is the service's own (--help included)
        argv = ["service", "--", *argv[1:]]
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        show_line(str(exc), err)
        return 2
    command = args.command
    if command is None:
        parser.print_help(err)
        return 2
    prog = f"{PROG} {command}"
    try:
        return _run(args, out, environ, source_factory, now)
    except (DwsError, SourceError, KubeError, LookupError, RabbitError) as exc:
        show_line(f"{prog}: {_one_line(exc)}", err)
        return 1
    except KeyboardInterrupt:
        show_line(f"{prog}: interrupted", err)
        return 130
    except BrokenPipeError:  # `flux dws list | head`: the reader has all it wanted
        return 1
    except Exception as exc:  # a bug, but still one line; FLUX_DWS_DEBUG=1 shows the trace
        if environ.get("FLUX_DWS_DEBUG"):
            raise
        kind = type(exc).__name__
        show_line(
            f"{prog}: internal error: {kind}: {_one_line(exc)} (FLUX_DWS_DEBUG=1 for more)", err
        )
        return 1


def _run(
    args: argparse.Namespace,
    out: TextIO,
    environ: Mapping[str, str],
    source_factory: Callable[[], Source] | None,
    now: Callable[[], float],
) -> int:
    if args.command == "service":
        return commands.service(args)
    if args.command == "check-validator":
        from flux_dws.cli.checkvalidator import check

        verdict = check(args.path)
        if not verdict.ok:
            raise DwsError(verdict.message)
        show(verdict.message, out)
        return 0
    if args.command == "simulate":
        from flux_dws.cli import simulate

        _interrupt_on_termination()  # SIGTERM/SIGHUP unwind like Ctrl-C: nothing left running

        return simulate.run(args, out, environ=environ)
    if args.command == "rabbit-graph":
        from flux_dws.cli import rabbitgraph

        return rabbitgraph.run(args, out)
    if args.command == "persistent":
        from flux_dws.cli import persistent

        return persistent.run(args, out, environ, source_factory=source_factory)
    if args.command == "rabbits":
        from flux_dws.cli import rabbits

        return rabbits.run(args, out, environ)
    if source_factory is None:
        problem = flux_uri_problem(environ)
        if problem:
            raise SourceError(problem)
        command = f"flux dws {args.command} ..."

        def source_factory() -> Source:
            return FluxSource(command=command, environ=environ)

    source = source_factory()
    handler: dict[str, Any] = {
        "status": commands.status,
        "list": commands.list_,
        "logs": commands.logs,
        "cleanup": commands.cleanup,
    }
    try:
        return handler[args.command](args, source, out, now())
    finally:
        source.close()


def _interrupt_on_termination() -> None:
    """Turn SIGTERM and SIGHUP into KeyboardInterrupt, so clean-up code runs as for Ctrl-C."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, interrupt)


def _one_line(exc: BaseException) -> str:
    """An error as one safe line (its text may come from Kubernetes or a user)."""
    return untrusted.text(exc) or type(exc).__name__
