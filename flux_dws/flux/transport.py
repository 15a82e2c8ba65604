# SPDX-License-Identifier: LGPL-3.0-only
"""How the service reaches the job-manager: RPCs and one streaming RPC, results on the loop.

Two implementations speak the same messages (doc/protocol.rst): the real one over a Flux
handle (flux_dws.flux.reactor) and fakeflux's in-process one.  The payload building and
parsing is shared (flux_dws.flux.jobmanager), so the stand-in cannot drift from the real thing.
"""

from __future__ import annotations

import errno as errno_mod
from typing import Any, Callable, Optional, Protocol

Payload = dict[str, Any]
Callback = Callable[[Optional[Payload], Optional["RpcError"]], None]

TOPIC_PREFIX = "job-manager.dws."


class RpcError(Exception):
    """An error response: errno and the responder's one-line message."""

    def __init__(self, errnum: int, message: str = "") -> None:
        self.errnum = errnum
        self.message = message or errno_mod.errorcode.get(errnum, str(errnum))
        super().__init__(f"{self.message} ({errno_mod.errorcode.get(errnum, errnum)})")


class Transport(Protocol):
    """Requests to the job-manager; every callback runs on the service's loop."""

    def rpc(self, method: str, payload: Payload, on_done: Callback) -> None:
        """One request ``job-manager.dws.<method>``; ``on_done(response, error)`` once."""

    def stream(self, method: str, payload: Payload, on_response: Callback) -> Callable[[], None]:
        """A streaming request; ``on_response`` per response until an error ends it.

        Returns a function that cancels the stream (the client disconnects).
        """

    def close(self) -> None:
        """Disconnect: the job-manager sees every stream of this client end."""
