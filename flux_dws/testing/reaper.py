# SPDX-License-Identifier: LGPL-3.0-only
"""Find and end every process one test run started, and no other.

The test session puts a token of its own in ``FLUX_DWS_TEST_RUN`` before it starts anything;
every process it starts (Flux brokers, the service, dwssim, sharness scripts and what they
start) inherits it.  :func:`leftovers` finds the live processes carrying this run's token in
``/proc/PID/environ``, so Flux brokers of other runs or other users on the same machine are
never counted or touched; :func:`reap` ends them, their process groups first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass

#: The environment variable holding the test run's token.
RUN_ENV = "FLUX_DWS_TEST_RUN"


@dataclass(frozen=True)
class Leftover:
    """A live process of the run: its id, process group and command line."""

    pid: int
    pgid: int
    command: str

    def __str__(self) -> str:
        return f"{self.pid} {self.command[:120]}"


def new_token() -> str:
    return uuid.uuid4().hex


def mark(environ: dict[str, str] | os._Environ[str], token: str | None = None) -> str:
    """Give ``environ`` (os.environ: this process's children) a run token; the token."""
    token = token or new_token()
    environ[RUN_ENV] = token
    return token


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def _ancestors() -> set[int]:
    """This process and its parents: they may carry the token and must never be ended."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def leftovers(token: str) -> list[Leftover]:
    """The live processes carrying ``token``, except this one and its ancestors."""
    needle = f"{RUN_ENV}={token}".encode()
    spared = _ancestors()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spared:
            continue
        pid = int(entry)
        if _environ_has(pid, needle) and not _zombie(pid):
            try:
                pgid = os.getpgid(pid)
            except ProcessLookupError:
                continue
            found.append(Leftover(pid, pgid, _command(pid)))
    return found


def reap(token: str, grace: float = 3.0) -> list[Leftover]:
    """End every process of the run: SIGTERM, then SIGKILL after ``grace``; those found.

    A process group is signalled whole when it is not this process's own (a test's Flux
    instance runs in a session of its own), so children that cleared their environment go
    too; otherwise the process alone.
    """
    found = leftovers(token)
    if not found:
        return []
    own_group = os.getpgrp()
    deadline = time.monotonic() + grace
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in leftovers(token):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if proc.pgid != own_group and proc.pgid > 1:
                    os.killpg(proc.pgid, sig)
                else:
                    os.kill(proc.pid, sig)
        while leftovers(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        deadline = time.monotonic() + grace
    return found
