# SPDX-License-Identifier: LGPL-3.0-only
"""fakeflux over a Unix socket: the flux-dws service in a process of its own.

Under real Flux the service is its own process, talking to the job-manager in the broker.
Benchmarks need the same shape, so the service's figures (CPU, memory, reaction times) are
its own and not shared with the stand-in job-manager.  The messages are the in-process
connection's, one JSON object per line:

    request    {"id": N, "method": "watch", "payload": {...}, "stream": true}
    cancel     {"cancel": N}
    response   {"id": N, "payload": {...}}  or  {"id": N, "errnum": E, "message": "..."}

The server learns the client's userid from the socket (SO_PEERCRED), as a Flux broker does.

    python -m flux_dws.testing.fakeflux.remote --socket S --kubeconfig K --table JSON
        [--metrics FILE]

runs the real service against the fakeflux listening on S; on SIGTERM it stops and, with
``--metrics``, writes its figures (reactions, requests, memory) as JSON to FILE.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import resource
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any, Callable

from flux_dws.base.loop import Loop
from flux_dws.flux.transport import Callback, Payload, RpcError
from flux_dws.testing.fakeflux.nodes import DrainError, TransportNodes, serve_resource

log = logging.getLogger("flux-dws.testing.fakeflux.remote")

_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid


class _Immediately:
    """A client "loop" that runs a response at once, on the job-manager's thread: the
    response only has to be written to the client's socket."""

    @staticmethod
    def call_soon(fn: Callable[..., Any], *args: Any) -> None:
        fn(*args)


class FakeFluxServer:
    """Serve one FakeFlux's job-manager on a Unix socket; one connection per client."""

    def __init__(self, flux: Any, path: str) -> None:
        self.flux, self.path = flux, path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._clients: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> FakeFluxServer:
        self._listener.bind(self.path)
        self._listener.listen(16)
        threading.Thread(target=self._accept, name="fakeflux-socket", daemon=True).start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            clients, self._clients = self._clients, []
        self._listener.close()
        for sock in clients:
            _hang_up(sock)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # stopped
            with self._lock:
                if self._closed:
                    sock.close()
                    return
                self._clients.append(sock)
            threading.Thread(
                target=self._serve, args=(sock,), name="fakeflux-client", daemon=True
            ).start()

    def _serve(self, sock: socket.socket) -> None:
        _, uid, _ = _CREDENTIALS.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
        )
        conn = self.flux.connect(_Immediately(), userid=uid)
        writing = threading.Lock()
        cancels: dict[int, Callable[[], None]] = {}

        def answer(ident: int) -> Callback:
            def send(payload: Payload | None, err: RpcError | None) -> None:
                message: dict[str, Any] = {"id": ident}
                if err is None:
                    message["payload"] = payload
                else:
                    message.update(errnum=err.errnum, message=err.message)
                    cancels.pop(ident, None)
                data = (json.dumps(message) + "\n").encode()
                with writing, contextlib.suppress(OSError):  # gone: the reader sees EOF
                    sock.sendall(data)

            return send

        try:
            for line in sock.makefile("rb"):
                request = json.loads(line)
                if "cancel" in request:
                    cancel = cancels.pop(int(request["cancel"]), None)
                    if cancel is not None:
                        cancel()
                    continue
                ident, method = int(request["id"]), str(request["method"])
                payload = request.get("payload")
                if method.startswith("resource."):  # flux-core's resource module
                    self._resource(method, payload, answer(ident))
                elif request.get("stream"):
                    cancels[ident] = conn.stream(method, payload, answer(ident))
                else:
                    conn.rpc(method, payload, answer(ident))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("fakeflux socket: dropping a client: %s", exc)
        finally:
            conn.close()  # as a broker does when a client disconnects
            with self._lock:
                if sock in self._clients:
                    self._clients.remove(sock)
            _hang_up(sock)

    def _resource(self, method: str, payload: Any, send: Callback) -> None:
        def run() -> None:
            try:
                send(serve_resource(self.flux, method, payload), None)
            except DrainError as exc:
                send(None, RpcError(exc.errno or errno.EINVAL, exc.strerror or str(exc)))

        self.flux.loop.call_soon(run)


def _hang_up(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class SocketTransport:
    """The service's :class:`~flux_dws.flux.transport.Transport` to a FakeFluxServer.

    Every callback runs on ``loop``.  If the server goes away, every pending request gets
    ECONNRESET once, as a lost broker connection would give.
    """

    def __init__(self, path: str, loop: Loop, timeout: float = 10.0) -> None:
        self.loop = loop
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._sock.connect(path)
        self._sock.settimeout(None)
        self._pending: dict[int, tuple[Callback, bool]] = {}
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        self._next_id = 0
        self._closed = False  # no more requests: closed here, or the connection ended
        self._closed_here = False  # close() was called: no callback runs any more
        self._cancelled: set[int] = set()
        threading.Thread(target=self._read, name="fakeflux-transport", daemon=True).start()

    def rpc(self, method: str, payload: Payload, on_done: Callback) -> None:
        self._send(method, payload, on_done, stream=False)

    def stream(self, method: str, payload: Payload, on_response: Callback) -> Callable[[], None]:
        ident = self._send(method, payload, on_response, stream=True)

        def cancel() -> None:
            with self._lock:
                self._cancelled.add(ident)
                if self._pending.pop(ident, None) is None or self._closed:
                    return
            self._write({"cancel": ident})

        return cancel

    def close(self) -> None:
        with self._lock:
            if self._closed_here:
                return
            self._closed = self._closed_here = True
            self._pending.clear()
        _hang_up(self._sock)

    def _send(self, method: str, payload: Payload, callback: Callback, *, stream: bool) -> int:
        text = json.dumps(payload)  # a payload that is not JSON is the caller's bug: raise here
        with self._lock:
            if self._closed:
                err = RpcError(errno.ENOTCONN, "connection to the job-manager is closed")
                self.loop.call_soon(callback, None, err)
                return -1
            self._next_id += 1
            ident = self._next_id
            self._pending[ident] = (callback, stream)
        message = f'{{"id": {ident}, "method": {json.dumps(method)}, "stream": {json.dumps(stream)}'
        self._write_text(f'{message}, "payload": {text}}}\n')
        return ident

    def _write(self, message: dict[str, Any]) -> None:
        self._write_text(json.dumps(message) + "\n")

    def _write_text(self, text: str) -> None:
        data = text.encode()
        with self._writing, contextlib.suppress(OSError):  # the reader sees the end
            self._sock.sendall(data)

    def _read(self) -> None:
        try:
            for line in self._sock.makefile("rb"):
                message = json.loads(line)
                ident = int(message["id"])
                error = None
                if "errnum" in message:
                    error = RpcError(int(message["errnum"]), str(message.get("message", "")))
                with self._lock:
                    entry = self._pending.get(ident)
                    if entry is not None and (error is not None or not entry[1]):
                        del self._pending[ident]  # an rpc's only answer, or a stream's end
                if entry is not None:
                    payload = message.get("payload")
                    self.loop.call_soon(self._deliver, ident, entry[0], payload, error)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # gone, or not our protocol
            log.debug("fakeflux transport: connection ended: %s", exc)
        with self._lock:
            lost = list(self._pending.items())
            self._pending.clear()
            self._closed = True
        reset = RpcError(errno.ECONNRESET, "connection to the job-manager was lost")
        for ident, (callback, _) in lost:
            self.loop.call_soon(self._deliver, ident, callback, None, reset)

    def _deliver(
        self, ident: int, callback: Callback, payload: Payload | None, error: RpcError | None
    ) -> None:
        with self._lock:  # nothing runs once the service closed or cancelled that stream
            gone = self._closed_here or ident in self._cancelled
        if not gone:
            callback(None if error is not None else payload, error)


# ------------------------------------------------------------------ the service process


def rss_mib() -> float:
    """This process's resident set size (Linux /proc), MiB."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def cpu_s() -> float:
    """CPU seconds (user + system) this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_by_thread() -> dict[str, float]:
    """CPU seconds of each live thread, summed by name (digits dropped: one pool, one entry)."""
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident or 0))
        except (OSError, AttributeError, OverflowError):
            continue
        name = thread.name.rstrip("0123456789-_ ") or thread.name
        out[name] = round(out.get(name, 0.0) + seconds, 3)
    return out


def service_figures(service: Any) -> dict[str, Any]:
    """A service's figures as JSON data: reactions (state, seconds), requests, actions."""
    metrics = service.metrics
    return {
        "reactions": [(state.value, seconds) for state, seconds in metrics.reactions],
        "requests": service.kube.request_counts(),
        "actions": dict(metrics.actions),
        "failures": dict(metrics.failures),
        # records' reads answered by the watched pods / NnfDataMovements, and those listed
        "record_reads": {
            name: {"cached": cache.hits, "listed": cache.misses, "waited_s": round(cache.waited, 3)}
            for name, cache in (
                ("pods", service.records.pods),
                ("datamovements", service.records.movements),
            )
        },
    }


def main(argv: list[str] | None = None) -> int:
    from flux_dws.core.policy import policy_from_table
    from flux_dws.flux.jobmanager import JobManager
    from flux_dws.k8s import KubeClient
    from flux_dws.service.service import Service

    parser = argparse.ArgumentParser(description="the flux-dws service, against fakeflux")
    parser.add_argument("--socket", required=True, help="the FakeFluxServer's Unix socket")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--table", required=True, help="the [dws] table, as JSON")
    parser.add_argument("--metrics", help="write the service's figures here at exit (JSON)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="flux-dws: %(levelname)s: %(message)s", stream=sys.stderr
    )
    policy = policy_from_table(json.loads(args.table))
    loop = Loop(name="flux-dws")
    kube = KubeClient.connect(
        namespace=policy.namespace,
        identity=policy.instance,
        kubeconfig=args.kubeconfig,
        timeout=5.0,
    )
    transport = SocketTransport(args.socket, loop)
    service = Service(
        policy=policy,
        loop=loop,
        jobmanager=JobManager(transport),
        kube=kube,
        owner_uid=os.getuid(),
        nodes=TransportNodes(transport),
    )
    memory = {"baseline_mib": rss_mib(), "peak_tracked": 0, "rss_at_peak_mib": 0.0}
    cpu_at_start = cpu_s()  # after imports and connecting: the jobs' share is what follows

    def sample() -> None:  # memory per tracked workflow: RSS when the most are tracked
        if len(service.jobs) >= memory["peak_tracked"]:
            memory.update(peak_tracked=len(service.jobs), rss_at_peak_mib=rss_mib())
        loop.call_later(0.5, sample)

    signal.signal(signal.SIGTERM, lambda *_: loop.stop())
    loop.call_soon(service.start)
    if args.metrics:
        loop.call_soon(sample)
    profile_to = os.environ.get("FLUX_DWS_PROFILE_LOOP")  # bench: where the loop's CPU goes
    if profile_to:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)
        profiler.runcall(loop.run)
        profiler.dump_stats(profile_to)
    else:
        loop.run()
    threads = cpu_by_thread()  # before stopping: the threads are still there
    service.stop()
    transport.close()
    if args.metrics:
        memory["cpu_by_thread"] = threads
        with open(args.metrics, "w") as out:
            json.dump({**service_figures(service), **memory, "cpu_s": cpu_s() - cpu_at_start}, out)
    kube.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
