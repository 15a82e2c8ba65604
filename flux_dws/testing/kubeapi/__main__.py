# SPDX-License-Identifier: LGPL-3.0-only
"""python -m flux_dws.testing.kubeapi: serve the stand-in Kubernetes API until SIGINT/SIGTERM.

Prints the URL and the kubeconfig path (one per line) once serving, so scripts can read them.
With --state, objects are loaded from the file at start and saved to it every few seconds
and at exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import time

import yaml

from . import crds, resources
from .server import KubeApi
from .store import DEFAULT_HISTORY, Store

SAVE_INTERVAL = 2.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m flux_dws.testing.kubeapi",
        description="A Kubernetes API server for flux-dws's resources (tests only).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (0: a free one)")
    parser.add_argument("--kubeconfig", help="where to write the kubeconfig (default: a temp dir)")
    parser.add_argument("--state", help="JSON file to load objects from and save them to")
    parser.add_argument("--namespace", action="append", default=[], help="create this namespace")
    parser.add_argument("--bookmark-interval", type=float, default=1.0, metavar="SECONDS")
    parser.add_argument("--history", type=int, default=DEFAULT_HISTORY, metavar="EVENTS")
    parser.add_argument("--no-webhooks", action="store_true", help="no Workflow admission")
    parser.add_argument(
        "--crd",
        action="append",
        default=[],
        metavar="PATH",
        help="serve the kinds of these CRD manifests (files or directories), in place of ours",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every request")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if args.crd:
        try:
            resources.register(crds.load(args.crd))
        except (OSError, ValueError, yaml.YAMLError) as exc:
            print(f"kubeapi: cannot serve the CRDs: {exc}", file=sys.stderr)
            return 1
    namespaces = tuple(dict.fromkeys(["default", *args.namespace]))
    store = Store(history_limit=args.history, webhooks=not args.no_webhooks, namespaces=namespaces)
    if args.state and os.path.exists(args.state):
        try:
            with open(args.state) as handle:
                store.load(json.load(handle))
        except (OSError, ValueError) as exc:
            print(f"kubeapi: cannot load state file {args.state}: {exc}", file=sys.stderr)
            return 1
    api = KubeApi(store, host=args.host, port=args.port, bookmark_interval=args.bookmark_interval)
    try:
        api.start()
    except OSError as exc:
        print(f"kubeapi: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    kubeconfig = args.kubeconfig or os.path.join(tempfile.mkdtemp(prefix="kubeapi-"), "kubeconfig")
    api.write_kubeconfig(kubeconfig)
    stopping: list[int] = []  # a plain flag: the handler must not take locks
    for signum in (signal.SIGINT, signal.SIGTERM):  # before saying where: then it may come
        signal.signal(signum, lambda signum, _frame: stopping.append(signum))
    print(api.url, flush=True)
    print(kubeconfig, flush=True)
    saved = None
    next_save = time.monotonic() + SAVE_INTERVAL
    while not stopping:
        time.sleep(0.1)
        if time.monotonic() >= next_save:
            saved = _save(store, args.state, saved)
            next_save = time.monotonic() + SAVE_INTERVAL
    api.stop()
    _save(store, args.state, saved)
    return 0


def _save(store: Store, path: str | None, saved: str | None) -> str | None:
    """Write the store to ``path`` atomically when it changed; returns the version saved."""
    if not path or store.resource_version == saved:
        return saved
    state = store.dump()
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(state, handle)
    os.replace(temporary, path)
    return str(state["resourceVersion"])


if __name__ == "__main__":
    sys.exit(main())
