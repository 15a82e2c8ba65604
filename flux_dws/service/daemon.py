# SPDX-License-Identifier: LGPL-3.0-only
"""`flux dws service`: run the flux-dws service for the Flux instance in FLUX_URI.

Start-up is the only place that may block: it reads the instance's [dws] table, connects to
Kubernetes (discovering the served DWS versions), and then hands everything to the reactor.
A configuration that cannot work exits with EXIT_CONFIG (78, EX_CONFIG); when there is no
Flux instance to serve, or the one it served went away (``flux shutdown``), it exits with
EXIT_UNAVAILABLE (69, EX_UNAVAILABLE).  The systemd unit lists both in
RestartPreventExitStatus, so neither is restarted in a loop (the unit is bound to
flux.service, which starts it again with the instance); an API server that is merely
unreachable is retried (with backoff) while the jobs stay held.  SIGTERM ends it with 0.  A
reactor that fails on an instance that still answers ends it with EXIT_FAILED (1): the unit
restarts it.

Under systemd (``Type=notify``) it reports through flux_dws.service.notify: STATUS= lines, READY=1
after the first reconcile, WATCHDOG=1 from the event loop (flux_dws.service.upkeep).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import time
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.errors import PolicyError
from flux_dws.core.identity import check_identity, default_identity
from flux_dws.core.policy import Policy, policy_from_table
from flux_dws.flux.bindings import FluxUnavailable, import_flux, run_under_flux_hint

EXIT_CONFIG = 78  # EX_CONFIG from sysexits.h
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: no Flux instance to serve, or it went away
EXIT_FAILED = 1  # the reactor failed on a live instance: systemd restarts the service
CONNECT_RETRY_MAX = 60.0  # seconds between attempts to reach an unreachable API at start-up
#: A traceback in the log (its exception text may quote a whole Kubernetes answer).
TRACEBACK_LIMIT = 4 * untrusted.LOG_LIMIT

log = logging.getLogger("flux-dws")


def instance_identity(handle: Any, policy: Policy) -> str:
    """The configured identity, or a stable one derived from this instance."""
    if policy.instance:
        return policy.instance
    hostlist = str(handle.attr_get("hostlist"))
    first = hostlist.split(",")[0].split("[")[0] or "flux"
    try:
        parent = str(handle.attr_get("jobid"))
    except OSError:
        parent = ""
    owner = int(handle.attr_get("security.owner"))
    return check_identity(default_identity(first, owner, parent))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The service's options; UsageError (one line) for bad ones."""
    from flux_dws.base.usage import PROG, OneLineParser

    parser = OneLineParser(
        prog=f"{PROG} service",
        description="Drive the DWS workflows of this Flux instance's #DW jobs.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    return parser.parse_args(argv)


class ReadableFormatter(logging.Formatter):
    """Every log line through flux_dws.base.untrusted.readable: a message is one line of at
    most LOG_LIMIT characters, and neither it nor a traceback (whose exception text may quote
    Kubernetes; at most TRACEBACK_LIMIT) can put an escape sequence on an admin's terminal,
    forge a log line or fill the journal.  Call sites make their untrusted arguments readable
    too (tests/test_sinks.py); this is the last word."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = untrusted.readable(record.message, untrusted.LOG_LIMIT)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:  # noqa: N802
        return untrusted.readable(super().formatException(ei), TRACEBACK_LIMIT, lines=True)

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return untrusted.readable(stack_info, TRACEBACK_LIMIT, lines=True)


def main(argv: list[str] | None = None) -> int:
    from flux_dws.base.usage import UsageError

    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ReadableFormatter("flux-dws: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[handler])
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        flux = import_flux()
    except FluxUnavailable as exc:
        log.error("%s%s", exc, run_under_flux_hint("flux dws service"))
        return EXIT_UNAVAILABLE
    try:
        handle = flux.Flux()
    except OSError as exc:
        unset = "" if os.environ.get("FLUX_URI") else " (FLUX_URI is not set)"
        log.error("cannot connect to a Flux instance%s: %s", unset, exc.strerror or exc)
        return EXIT_UNAVAILABLE
    try:
        policy = policy_from_table(handle.conf_get("dws") or {})
        identity = instance_identity(handle, policy)
    except (PolicyError, ValueError) as exc:
        log.error("configuration: %s; not starting", exc)
        return EXIT_CONFIG
    return serve(handle, policy, identity)


def serve(handle: Any, policy: Policy, identity: str) -> int:
    """Connect to Kubernetes and run the service on the Flux reactor until SIGTERM/SIGINT."""
    from flux_dws.flux.jobmanager import JobManager
    from flux_dws.flux.reactor import FluxLoop, FluxTransport
    from flux_dws.flux.resource import FluxNodes
    from flux_dws.k8s import KubeClient, KubeSetupError
    from flux_dws.service.notify import Notifier
    from flux_dws.service.service import Service

    # Block SIGTERM/SIGINT before any thread starts (threads inherit the mask): the Flux
    # reactor's signal watchers then get them, not a worker thread's default action.
    stops = (signal.SIGTERM, signal.SIGINT)
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    notifier = Notifier()
    notifier.status("connecting to Kubernetes")
    delay = 1.0
    while True:
        try:
            kube = KubeClient.connect(
                namespace=policy.namespace,
                identity=identity,
                kubeconfig=policy.kubeconfig,
                workflow_version=policy.workflow_version,
                nnf_version=policy.nnf_version,
            )
            break
        except KubeSetupError as exc:
            if not exc.transient:
                log.error("%s; not starting", exc)
                return EXIT_CONFIG
            log.warning("%s; #DW jobs stay held; retrying in %.0fs", exc, delay)
            notifier.status(f"Kubernetes unreachable at start-up; retrying: {exc}")
            _sleep_pinging(notifier, delay)
            delay = min(delay * 2, CONNECT_RETRY_MAX)
    loop = FluxLoop(handle)
    service = Service(
        policy=policy,
        loop=loop,
        jobmanager=JobManager(FluxTransport(handle, defer=loop.call_soon)),
        kube=kube,
        owner_uid=int(handle.attr_get("security.owner")),
        nodes=FluxNodes(handle),
        notifier=notifier,
    )

    asked_to_stop = []

    def shutdown(*_: Any) -> None:
        log.info("stopping; jobs stay held until the service runs again")
        asked_to_stop.append(True)
        loop.stop()

    watchers = [handle.signal_watcher_create(s, shutdown) for s in stops]
    for watcher in watchers:
        watcher.start()
    log.info(
        "serving instance %s (pid %d): namespace %s, workflows labelled %s",
        identity,
        os.getpid(),
        policy.namespace,
        identity,
    )
    loop.call_soon(service.start)
    loop.run()
    failed = False
    if not asked_to_stop and not service.presence.instance_gone:
        # The reactor ended by itself: the handle's connection to the broker closed or broke
        # (libflux stops the reactor with an error when receiving fails) -- or it failed on an
        # instance that is still there, which a restart of this service mends.
        broken = loop.broken
        if broken is not None and loop.instance_answers():
            log.error(
                "the Flux reactor stopped with an error (%s) while the instance still "
                "answers; exiting so that the service is restarted; jobs stay held",
                _describe(broken),
                exc_info=None if isinstance(broken, OSError) else broken,  # a callback's bug
            )
            failed = True
        else:
            why = (
                f"its connection broke: {_describe(broken)}" if broken else "its connection closed"
            )
            log.warning("the Flux instance is gone (%s); stopping", why)
            service.presence.instance_gone = True
    service.stop()
    kube.close()
    notifier.close()
    if service.presence.instance_gone:
        return EXIT_UNAVAILABLE  # said in one line already
    if failed:
        return EXIT_FAILED
    log.info("stopped")
    return 0


def _describe(error: BaseException) -> str:
    """``ECONNRESET: Connection reset by peer`` (as flux_dws.flux.transport's RpcError says),
    or the exception a callback raised, with its type."""
    if not isinstance(error, OSError):
        return f"{type(error).__name__}: {error}"
    name = errno.errorcode.get(error.errno or 0, "") if error.errno else ""
    text = error.strerror or str(error) or "no reason given"
    return f"{name}: {text}" if name else text


def _sleep_pinging(notifier: Any, seconds: float) -> None:
    """Sleep, still telling the watchdog (if any) that start-up is alive."""
    step = min(1.0, notifier.watchdog / 3) if notifier.watchdog else seconds
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        notifier.ping()
        time.sleep(min(step, left))
