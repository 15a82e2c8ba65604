# SPDX-License-Identifier: LGPL-3.0-only
"""``flux dws rabbit-graph``: write the instance's R with rabbits for Fluxion.

Reads R (RFC 20) from a file or standard input, the rabbits from the live Kubernetes API or
from a JSON file an admin saved (``kubectl get systemconfigurations,storages,servers -A -o
json``: Servers of persistent and system storage shrink the pools), and writes R
with a JGF ``scheduling`` key (flux_dws.core.rabbits.resource_graph).  The same
input always gives the same bytes, so a changed file means a changed system.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from flux_dws.base import untrusted
from flux_dws.base.errors import PolicyError
from flux_dws.cli.render import show_line
from flux_dws.cli.sources import SourceError
from flux_dws.core.policy import load_config
from flux_dws.core.rabbits import (
    DEFAULT_CHUNKS,
    RABBIT_TYPE,
    RabbitError,
    RabbitPool,
    excluded_hosts,
    rabbit_inventory,
    resource_graph,
)

SYSTEM_CONFIGURATION_KIND = "SystemConfiguration"
STORAGE_KIND = "Storage"
SERVERS_KIND = "Servers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-R",
        "--resources",
        metavar="FILE",
        default="-",
        help="the instance's R to add the rabbits to (default: standard input)",
    )
    parser.add_argument(
        "--from-file",
        metavar="FILE",
        help="read the SystemConfiguration and Storage resources from this saved JSON "
        "(kubectl get systemconfigurations,storages,servers -A -o json) instead of the live API",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig for the live API")
    parser.add_argument(
        "--cluster", default="cluster0", help="name of the graph's root vertex (default cluster0)"
    )
    parser.add_argument(
        "--chunks",
        type=int,
        default=DEFAULT_CHUNKS,
        metavar="N",
        help=f"parts each rabbit's SSD pool is split into (default {DEFAULT_CHUNKS})",
    )
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="the instance's config file or directory, for [resource] exclude "
        "(default: /etc/flux/system/conf.d when it exists)",
    )
    parser.add_argument(
        "--exclude",
        metavar="TARGETS",
        help="ranks (idset) or hosts (hostlist) to leave out of the graph, as [resource] "
        "exclude; overrides the config's",
    )
    parser.add_argument(
        "-o", "--output", metavar="FILE", help="write R here (default: standard output)"
    )


def split_objects(saved: Any) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(SystemConfiguration, Storages, Servers) from a saved kubectl List, or a plain list of
    objects."""
    items = saved.get("items") if isinstance(saved, Mapping) else saved
    if not isinstance(items, list):
        raise RabbitError("the saved file is neither a kubectl List nor a JSON array")
    configs = [
        i for i in items if isinstance(i, dict) and i.get("kind") == SYSTEM_CONFIGURATION_KIND
    ]
    storages = [i for i in items if isinstance(i, dict) and i.get("kind") == STORAGE_KIND]
    servers = [i for i in items if isinstance(i, dict) and i.get("kind") == SERVERS_KIND]
    if not configs:
        raise RabbitError("the saved file holds no SystemConfiguration")
    named = [c for c in configs if (c.get("metadata") or {}).get("name") == "default"]
    return (named or configs)[0], storages, servers


def read_json(path: str, what: str, stdin: TextIO) -> Any:
    try:
        if path == "-":
            return json.load(stdin)
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise SourceError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        where = "standard input" if path == "-" else path
        raise SourceError(f"{what} in {where} is not JSON: {exc}") from None


def live_objects(
    kubeconfig: str | None,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(SystemConfiguration, Storages, Servers) from the Kubernetes API."""
    from flux_dws.k8s import KubeClient

    kube = KubeClient.connect(namespace="default", identity="rabbit-graph", kubeconfig=kubeconfig)
    try:
        config = kube.read_system_configuration()
        if config is None:
            raise RabbitError("the API has no SystemConfiguration default/default")
        return config, kube.list_storages()[0], kube.list_servers()[0]
    finally:
        kube.close()


#: Where a system instance keeps its config (flux-core's default for the system instance).
SYSTEM_CONFIG = "/etc/flux/system/conf.d"


def instance_config(path: str | None) -> tuple[str | None, dict[str, Any]]:
    """(where it was read, the instance's config): from ``path`` (``--config``), else the
    system instance's directory when it exists, else nothing (never FLUX_URI: rabbit-graph
    runs before the instance it makes R for)."""
    path = path or (SYSTEM_CONFIG if os.path.isdir(SYSTEM_CONFIG) else None)
    if path is None:
        return None, {}
    try:
        return path, load_config(path)
    except PolicyError as exc:
        raise SourceError(str(exc)) from None


def _exclude(args: argparse.Namespace) -> str | None:
    """``--exclude``, else ``[resource] exclude`` of the instance's config."""
    if args.exclude is not None:
        return args.exclude
    path, config = instance_config(args.config)
    value = untrusted.mapping(config.get("resource")).get("exclude")
    if value is not None and not isinstance(value, str):
        raise SourceError(f"{path}: resource.exclude is not a string")
    return value


def summary(rabbits: Mapping[str, RabbitPool], graph: Mapping[str, Any]) -> str:
    """One line for the admin: what went into the graph."""
    vertices = graph["scheduling"]["graph"]["nodes"]
    placed = [v["metadata"]["name"] for v in vertices if v["metadata"]["type"] == RABBIT_TYPE]
    parts = sum(1 for v in vertices if v["metadata"]["type"] == "ssd")
    down = [r for r in placed if not rabbits[r].usable]
    gib = sum(rabbits[r].gib for r in placed)
    text = f"{len(placed)} rabbit(s) with {gib} GiB of SSD in {parts} part(s)"
    return text + (f"; down now: {', '.join(down)}" if down else "")


def run(args: argparse.Namespace, out: TextIO, err: TextIO | None = None) -> int:
    R = read_json(args.resources, "R", sys.stdin)
    if args.from_file:
        saved = read_json(args.from_file, "saved resources", sys.stdin)
        config, storages, servers = split_objects(saved)
    else:
        config, storages, servers = live_objects(args.kubeconfig)
    rabbits = rabbit_inventory(config, storages, servers)
    left_out = excluded_hosts(R, _exclude(args))
    graph = resource_graph(R, rabbits, cluster=args.cluster, chunks=args.chunks, exclude=left_out)
    text = json.dumps(graph, sort_keys=True, separators=(",", ":")) + "\n"
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise SourceError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    else:
        out.write(text)
    show_line(f"flux dws rabbit-graph: {summary(rabbits, graph)}", err or sys.stderr)
    return 0
