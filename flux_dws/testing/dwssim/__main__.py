# SPDX-License-Identifier: LGPL-3.0-only
"""python -m flux_dws.testing.dwssim: a stand-in DWS system to run flux-dws against.

Serves the stand-in Kubernetes API (flux_dws.testing.kubeapi) on loopback, seeds it with a
SystemConfiguration and the simulator's container profiles, and plays DWS and NNF with
realistic per-state delays until SIGINT/SIGTERM.  Prints the URL and the kubeconfig path,
one per line, once serving.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading

from flux_dws.core.directives import DirectiveError, parse_size
from flux_dws.core.health import STATUSES
from flux_dws.core.states import State
from flux_dws.testing.dwssim.companions import RABBIT_CAPACITY, group_computes
from flux_dws.testing.dwssim.controller import REALISTIC_DELAYS, DwsSim, resolve_delays
from flux_dws.testing.dwssim.faults import set_rabbit_status
from flux_dws.testing.dwssim.seed import compute_names, seed
from flux_dws.testing.kubeapi import Store
from flux_dws.testing.kubeapi.server import KubeApi


def delay_arg(text: str) -> tuple[State, float]:
    """ "PreRun=5" -> (State.PRERUN, 5.0); argparse shows the ValueError's message."""
    state, sep, seconds = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: expected <State>=<seconds>, e.g. PreRun=5")
    try:
        return State.parse(state), float(seconds)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m flux_dws.testing.dwssim",
        description="A simulated DWS + NNF system behind a stand-in Kubernetes API (tests only).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (0: a free one)")
    parser.add_argument("--kubeconfig", help="where to write the kubeconfig (default: a temp dir)")
    parser.add_argument("--computes", type=int, default=16, help="compute nodes (compute-01...)")
    parser.add_argument("--per-rabbit", type=int, default=16, help="compute nodes per rabbit")
    parser.add_argument(
        "--delay",
        type=delay_arg,
        action="append",
        default=[],
        metavar="STATE=SECONDS",
        help="seconds a state's drivers take (repeatable; default: realistic delays)",
    )
    parser.add_argument("--no-delays", action="store_true", help="every state acts at once")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="multiplier for container profile seconds"
    )
    parser.add_argument(
        "--capacity",
        type=capacity_arg,
        action="append",
        default=[],
        metavar="[RABBIT=]SIZE",
        help="each rabbit's drives in all (e.g. 2TiB), or one rabbit's (rabbit-1=500GiB); "
        "repeatable (default 32TiB)",
    )
    parser.add_argument(
        "--rabbit-status",
        type=status_arg,
        action="append",
        default=[],
        metavar="RABBIT=STATUS",
        help="a rabbit's Storage status.status at start (e.g. rabbit-1=Offline); repeatable",
    )
    parser.add_argument(
        "--fail-mount",
        action="append",
        default=[],
        metavar="COMPUTE",
        help="a compute node whose mount fails in PreRun (repeatable)",
    )
    parser.add_argument(
        "--hang-unmount",
        action="append",
        default=[],
        metavar="COMPUTE",
        help="a compute node whose unmount hangs: PostRun waits, Teardown fails (repeatable)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    return parser.parse_args(argv)


def capacity_arg(text: str) -> tuple[str | None, int]:
    """ "2TiB" -> (None, bytes); "rabbit-1=500GiB" -> ("rabbit-1", bytes)."""
    rabbit, sep, size = text.rpartition("=")
    try:
        return (rabbit if sep else None), parse_size(size)
    except DirectiveError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def status_arg(text: str) -> tuple[str, str]:
    rabbit, sep, status = text.partition("=")
    if not sep or status not in STATUSES:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected RABBIT=STATUS, STATUS one of {', '.join(STATUSES)}"
        )
    return rabbit, status


def build(args: argparse.Namespace, delays: dict[State, float]) -> tuple[Store, DwsSim]:
    """The seeded store and the simulator the command line asks for (ValueError if not)."""
    store = Store()
    sizes = dict(args.capacity)
    every = sizes.pop(None, RABBIT_CAPACITY)
    mapping = group_computes(compute_names(args.computes), args.per_rabbit)
    unknown = sorted(({*sizes} | {r for r, _ in args.rabbit_status}) - set(mapping))
    if unknown:
        raise ValueError(f"no such rabbit: {', '.join(unknown)} (known: {', '.join(mapping)})")
    seed(store, rabbits=mapping, capacity={r: sizes.get(r, every) for r in mapping})
    for rabbit, status in args.rabbit_status:
        set_rabbit_status(store, rabbit, status)
    sim = DwsSim(store, delays=delays, time_scale=args.time_scale)
    for compute in args.fail_mount:
        sim.faults.fail_mount(compute)
    for compute in args.hang_unmount:
        sim.faults.hang_unmount(compute)
    return store, sim


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    delays = dict.fromkeys(State, 0.0) if args.no_delays else dict(REALISTIC_DELAYS)
    delays.update(dict(args.delay))
    try:
        resolve_delays(delays)
        store, sim = build(args, delays)
    except ValueError as exc:
        print(f"dwssim: {exc}", file=sys.stderr)
        return 2
    api = KubeApi(store, host=args.host, port=args.port)
    try:
        api.start()
    except OSError as exc:
        print(f"dwssim: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    kubeconfig = args.kubeconfig or os.path.join(tempfile.mkdtemp(prefix="dwssim-"), "kubeconfig")
    api.write_kubeconfig(kubeconfig)
    sim.start()
    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):  # before saying where: then it may come
        signal.signal(signum, lambda *_: done.set())
    print(api.url, flush=True)
    print(kubeconfig, flush=True)
    done.wait()
    sim.stop()
    api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
