# SPDX-License-Identifier: LGPL-3.0-only
"""systemd's service notification protocol (sd_notify(3)), for ``Type=notify`` units.

The protocol is one datagram per message to the AF_UNIX socket named in ``$NOTIFY_SOCKET``
(a leading ``@`` names the abstract namespace), holding newline-separated ``KEY=VALUE``
assignments: ``READY=1``, ``STATUS=...``, ``WATCHDOG=1``, ``STOPPING=1``.  systemd sets
``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``) when the unit has ``WatchdogSec=``; a service that
sends no ``WATCHDOG=1`` within that time is killed (SIGABRT) and, with ``Restart=``, restarted.

Without ``$NOTIFY_SOCKET`` (not under systemd) every call does nothing.  Sending never blocks
and never raises: a supervisor that went away must not stop the service.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

from flux_dws.base import untrusted

log = logging.getLogger("flux-dws")


class Notifier:
    """Messages to the service manager; a no-op when there is none."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        path = env.get("NOTIFY_SOCKET", "")
        self.address: str | bytes | None = None
        if path.startswith("@"):
            self.address = b"\0" + path[1:].encode()
        elif path.startswith("/"):
            self.address = path
        self.watchdog = _watchdog_seconds(env)
        self._sock: socket.socket | None = None
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, **fields: str) -> bool:
        """Send ``KEY=VALUE`` lines (``ready="1"`` -> ``READY=1``); False if it could not."""
        if self.address is None:
            return False
        lines = [
            f"{key.upper()}={untrusted.text(' '.join(str(value).split()), None)}"
            for key, value in fields.items()
        ]
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(lines).encode(), self.address)
        except OSError as exc:
            if not self._warned:
                log.warning("systemd notify socket: %s (further failures not logged)", exc)
                self._warned = True
            return False
        return True

    def ready(self, status: str) -> None:
        self.send(ready="1", status=status)

    def status(self, status: str) -> None:
        self.send(status=status)

    def ping(self) -> None:
        self.send(watchdog="1")

    def stopping(self, status: str) -> None:
        self.send(stopping="1", status=status)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _watchdog_seconds(env: Mapping[str, str]) -> float | None:
    """The watchdog timeout meant for this process, or None (no watchdog, or another PID's)."""
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    timeout = untrusted.decimal(usec)
    if not timeout:
        return None
    if pid and untrusted.decimal(pid) != os.getpid():
        return None
    return timeout / 1e6
