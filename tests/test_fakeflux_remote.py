# SPDX-License-Identifier: LGPL-3.0-only
"""fakeflux over a Unix socket (flux_dws.testing.fakeflux.remote), as the service sees it.

The scenario suite runs whole jobs this way (conftest's "fakeflux-process" backend); here are
the transport's own promises: answers and errors arrive on the client's loop, a cancelled or
closed stream goes quiet, a lost server fails what is pending, and the server knows its
client's userid from the socket, as a Flux broker does.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import shutil
import socket
import tempfile
import threading

import pytest

from flux_dws.base.loop import Loop
from flux_dws.flux.transport import RpcError
from flux_dws.testing.fakeflux import FakeFlux
from flux_dws.testing.fakeflux.remote import FakeFluxServer, SocketTransport

DW = {"dw": "#DW jobdw type=xfs capacity=10GiB name=scratch"}
TIMEOUT = 5.0


@pytest.fixture
def ff():
    fake = FakeFlux(["compute-01"], owner_uid=os.getuid()).start()
    yield fake
    fake.stop()


@pytest.fixture
def server(ff, tmp_path):
    running = FakeFluxServer(ff, str(tmp_path / "fakeflux.sock")).start()
    yield running
    running.stop()


@pytest.fixture
def client(server):
    loop = Loop(name="client").start_thread()
    transport = SocketTransport(server.path, loop)
    answers: queue.Queue = queue.Queue()
    transport.answers = answers
    yield transport
    transport.close()
    loop.stop()


def on_loop(transport: SocketTransport, tag: str):
    """A callback that notes which thread ran it: every one must run on the client's loop."""

    def callback(payload, err):
        transport.answers.put((tag, payload, err, threading.get_ident()))

    return callback


def answer(transport: SocketTransport):
    tag, payload, err, thread = transport.answers.get(timeout=TIMEOUT)
    assert thread == transport.loop._thread.ident  # not the socket's reader thread
    return tag, payload, err


def test_rpc_answers_and_errors_arrive_on_the_clients_loop(client):
    client.rpc("heartbeat", {}, on_loop(client, "heartbeat"))
    client.rpc("no-such-method", {}, on_loop(client, "bad"))
    got = {tag: (payload, err) for tag, payload, err in (answer(client), answer(client))}
    assert got["heartbeat"][1] is None
    err = got["bad"][1]
    assert isinstance(err, RpcError) and err.errnum == errno.ENOSYS
    assert "no-such-method" in err.message


def test_a_stream_delivers_until_cancelled(client, ff):
    cancel = client.stream("watch", {"service": True}, on_loop(client, "watch"))
    _, snapshot, err = answer(client)
    assert err is None and snapshot["snapshot"] is True and snapshot["jobs"] == []
    jobid = ff.submit(DW)
    _, update, err = answer(client)
    assert err is None and [r["id"] for r in update["jobs"]] == [jobid]
    cancel()
    client.rpc("heartbeat", {}, on_loop(client, "after"))  # answered after the cancel
    ff.submit(DW)
    tag, _, err = answer(client)
    assert tag == "after" and err is None
    ff.loop.run_sync(lambda: None)
    client.rpc("heartbeat", {}, on_loop(client, "last"))
    assert answer(client)[0] == "last"  # no watch update came between


def test_a_lost_server_fails_what_is_pending_and_refuses_more(client, server):
    client.stream("watch", {"service": True}, on_loop(client, "watch"))
    assert answer(client)[2] is None  # the snapshot
    server.stop()
    tag, payload, err = answer(client)
    assert tag == "watch" and payload is None and err.errnum == errno.ECONNRESET
    client.rpc("heartbeat", {}, on_loop(client, "late"))
    tag, _, err = answer(client)
    assert tag == "late" and err.errnum == errno.ENOTCONN


def test_after_close_streams_go_quiet_and_requests_fail(client, ff):
    client.stream("watch", {"service": True}, on_loop(client, "watch"))
    assert answer(client)[2] is None
    client.close()
    ff.submit(DW)  # an update the closed watch must not deliver
    ff.loop.run_sync(lambda: None)
    client.rpc("heartbeat", {}, on_loop(client, "closed"))
    tag, _, err = answer(client)
    assert tag == "closed" and err.errnum == errno.ENOTCONN
    with pytest.raises(queue.Empty):
        client.answers.get(timeout=0.2)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_the_server_knows_the_clients_userid_from_the_socket(ff):
    """Only the instance owner may call the plugin: the userid comes from SO_PEERCRED."""
    directory = tempfile.mkdtemp(prefix="fakeflux-")
    os.chmod(directory, 0o755)
    server = FakeFluxServer(ff, os.path.join(directory, "socket")).start()
    os.chmod(server.path, 0o777)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # no threads here: a plain socket and one request, as user "nobody"
        try:
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(TIMEOUT)
                sock.connect(server.path)
                request = {"id": 1, "method": "heartbeat", "payload": {}, "stream": False}
                sock.sendall((json.dumps(request) + "\n").encode())
                reply = json.loads(sock.makefile("rb").readline())
            os.write(write, str(reply.get("errnum", 0)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as child:
        errnum = int(child.read() or -1)
    os.waitpid(pid, 0)
    server.stop()
    shutil.rmtree(directory)
    assert errnum == errno.EPERM
