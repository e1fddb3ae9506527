"""What only the embedded store has: connections that own leases, authentication, the wire, binding."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from pathlib import Path

import pytest

from fakes import FakeTimers
from rankrun.proof import client_proof, server_proof
from rankrun.rendezvous.listener import SharedListener
from rankrun.store.api import AuthenticationFailed, EventKind, RendezvousHeld, StoreUnavailable
from rankrun.store.embedded import wire
from rankrun.store.embedded.client import StoreClient
from rankrun.store.embedded.server import StoreServer
from rankrun.store.memory import MemoryStore
from rankrun.workerstore.tcpstore import TCPStoreServer

BOUND = 20.0
SECRET = b"s3cret-of-this-job"


def _run(body) -> None:
    async def main() -> None:
        store = MemoryStore(FakeTimers())
        server = StoreServer(store, secret=SECRET)
        port = await server.start("127.0.0.1", 0)
        try:
            await body(store, server, port)
        finally:
            await server.close()
            await store.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))


def test_a_connection_that_goes_takes_its_leased_keys_with_it():
    async def body(store, server, port):
        owner = await StoreClient.connect("127.0.0.1", port, SECRET)
        peer = await StoreClient.connect("127.0.0.1", port, SECRET)
        lease = await owner.grant(3600.0)  # would not expire for an hour
        await owner.put("/job/nodes/a", b"a", lease=lease.id)
        _, revision = await peer.range("/job/nodes/")
        watch = await peer.watch("/job/nodes/", after=revision)
        owner.lost("simulated crash")  # the socket is reset, as when the owner's host dies
        event = await anext(watch.__aiter__())
        assert (event.kind, event.key) == (EventKind.DELETE, "/job/nodes/a")
        assert await peer.get("/job/nodes/a") is None
        assert lease.lost.is_set()
        await watch.close()
        await peer.close()

    _run(body)


def test_wrong_missing_or_unexpected_secrets_are_refused_with_the_endpoint_named(caplog):
    async def body(store, server, port):
        for _ in range(3):
            with pytest.raises(AuthenticationFailed, match=rf"rendezvous 127\.0\.0\.1:{port}: authentication failed"):
                await StoreClient.connect("127.0.0.1", port, b"not the secret")
        with pytest.raises(AuthenticationFailed, match=r"needs a secret .*RANKRUN_RDZV_SECRET"):
            await StoreClient.connect("127.0.0.1", port, None)
        open_server = StoreServer(store, secret=None)
        open_port = await open_server.start("127.0.0.1", 0)
        with pytest.raises(AuthenticationFailed, match="does not authenticate, but this node has a secret"):
            await StoreClient.connect("127.0.0.1", open_port, SECRET)
        await open_server.close()
        assert store.revision == 0  # nothing was done by anyone who was refused

    with caplog.at_level(logging.WARNING, logger="rankrun.store.embedded.server"):
        _run(body)
    rejections = [r for r in caplog.records if "rejected a connection from 127.0.0.1" in r.getMessage()]
    assert len(rejections) == 1  # logged once per address, not once per attempt


def test_a_client_of_another_job_is_refused_at_once_and_told_the_job_only_if_it_proved_the_secret():
    """Issue 34: a second job's node on a running job's endpoint joined keys nobody coordinates and waited out its
    join_timeout. The host serves one job (its run id); another job's hello is refused at the proof."""
    async def main() -> None:
        store = MemoryStore(FakeTimers())
        server = StoreServer(store, secret=SECRET, job="job-a")
        port = await server.start("127.0.0.1", 0)
        try:
            for job in ("job-a", None):  # its own job's node; a node whose hello names no job (an older launcher)
                client = await StoreClient.connect("127.0.0.1", port, SECRET, job=job)
                await client.close()
            with pytest.raises(RendezvousHeld) as held:
                await StoreClient.connect("127.0.0.1", port, SECRET, job="job-b")
            assert str(held.value) == (f"rendezvous 127.0.0.1:{port}: held by job job-a, not this node's job job-b "
                                       "(--rdzv-id): another job's rendezvous runs on this endpoint; give this job an "
                                       "endpoint of its own (--rdzv-endpoint HOST:PORT)")
            with pytest.raises(AuthenticationFailed) as guessed:  # without the secret: not told which job
                await StoreClient.connect("127.0.0.1", port, b"job-b's own secret", job="job-b")
            assert not isinstance(guessed.value, RendezvousHeld)
            assert str(guessed.value) == (f"rendezvous 127.0.0.1:{port}: authentication failed: this endpoint serves "
                                          "another job's rendezvous, not job job-b's, with a secret this node does not have")
            assert store.revision == 0  # nothing was done by anyone who was refused
        finally:
            await server.close()
            await store.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))


async def _raw_handshake(port: int, proof_for) -> tuple[bytes, dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    frames = wire.FrameReader()
    nonce = b"n" * 16
    writer.write(wire.MAGIC + wire.frame({"hello": wire.VERSION, "nonce": wire.b64(nonce)}))

    async def next_frame() -> dict:
        while True:
            got = frames.feed(await reader.read(4096))
            if got:
                return got[0]

    hello = await next_frame()
    challenge = wire.unb64(hello["challenge"])
    writer.write(wire.frame({"proof": proof_for(challenge, nonce)}))
    answer = await next_frame()
    writer.close()
    return challenge, answer


def test_a_recorded_proof_cannot_be_replayed():
    async def body(store, server, port):
        recorded: list[str] = []

        def honest(challenge: bytes, nonce: bytes) -> str:
            recorded.append(client_proof(SECRET, challenge, nonce))
            return recorded[-1]

        first_challenge, answer = await _raw_handshake(port, honest)
        assert answer["ok"] is True
        second_challenge, replayed = await _raw_handshake(port, lambda c, n: recorded[0])
        assert second_challenge != first_challenge
        assert replayed["ok"] is False

    _run(body)


def test_a_foreign_protocol_is_closed_and_harmless():
    async def body(store, server, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        assert await asyncio.wait_for(reader.read(), BOUND) == b""  # closed without a word
        writer.close()
        client = await StoreClient.connect("127.0.0.1", port, SECRET)  # the server still serves
        assert await client.put("/x", b"1") == 1
        await client.close()

    _run(body)


def test_the_server_binds_only_the_address_it_was_given():
    async def body(store, server, port):
        sockets = server._server.sockets  # what the kernel bound
        assert {s.getsockname()[0] for s in sockets} == {"127.0.0.1"}
        alias = StoreServer(store)
        alias_port = await alias.start("127.0.0.2", 0)  # another loopback "node" address
        with socket.create_connection(("127.0.0.2", alias_port), timeout=BOUND):
            pass
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", alias_port), timeout=BOUND).close()
        await alias.close()

    _run(body)


def test_an_unreachable_endpoint_is_named():
    async def main() -> None:
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = holder.getsockname()[1]
        try:
            with pytest.raises(StoreUnavailable, match=rf"rendezvous 127\.0\.0\.1:{port}: Connection refused"):
                await StoreClient.connect("127.0.0.1", port, SECRET)
        finally:
            holder.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))


def test_one_port_serves_agents_and_torch_store_clients():
    from rankrun.rendezvous.listener import SharedListener  # noqa: PLC0415
    from rankrun.workerstore.tcpstore import MAGIC  # noqa: PLC0415

    async def main() -> None:
        store = MemoryStore(FakeTimers())
        workers = TCPStoreServer()
        listener = SharedListener(StoreServer(store, secret=SECRET), workers)
        port = await listener.start("127.0.0.1", 0)
        try:
            agent = await StoreClient.connect("127.0.0.1", port, SECRET)
            assert await agent.put("/agents/a", b"here") == 1
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            # a torch client's handshake, then SET "/k" = "v" and GET "/k": VALIDATE, PING, SET, GET
            writer.write(b"\x00" + MAGIC.to_bytes(4, "little") + b"\x0d" + (1234).to_bytes(4, "little"))
            writer.write(b"\x01" + (2).to_bytes(8, "little") + b"/k" + (1).to_bytes(8, "little") + b"v")
            writer.write(b"\x03" + (2).to_bytes(8, "little") + b"/k")
            assert await asyncio.wait_for(reader.readexactly(4 + 9), BOUND) == (1234).to_bytes(4, "little") + (1).to_bytes(8, "little") + b"v"
            assert workers.snapshot() == {b"/k": b"v"}
            writer.close()
            await agent.close()
        finally:
            await listener.close()
            await workers.close()
            await store.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))


def test_an_impostor_host_without_the_secret_is_refused_by_the_client():
    """The handshake is mutual: a server that cannot prove it knows the secret is not trusted with the job."""

    async def main() -> None:
        async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            frames = wire.FrameReader()
            await reader.readexactly(len(wire.MAGIC))
            while not frames.feed(await reader.read(4096)):
                pass  # the hello
            writer.write(wire.frame({"version": wire.VERSION, "challenge": wire.b64(b"c" * 16), "auth": True}))
            while not frames.feed(await reader.read(4096)):
                pass  # the client's proof: accepted, as an impostor would
            writer.write(wire.frame({"ok": True, "proof": server_proof(b"a guess", b"c" * 16, b"n" * 16)}))
            await writer.drain()
            await reader.read()
            writer.close()

        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(AuthenticationFailed, match="the server does not know this job's secret"):
                await StoreClient.connect("127.0.0.1", port, SECRET)
        finally:
            server.close()
            await server.wait_closed()  # the impostor saw the client go and closed its side (else: unclosed at exit on 3.12)

    asyncio.run(asyncio.wait_for(main(), BOUND))


def test_a_job_rerun_on_the_same_endpoint_binds_it_while_the_last_ones_sockets_sit_in_time_wait():
    """The endpoint is a fixed port every node knows: the next job must get it back at once (SO_REUSEADDR)."""

    def client(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=BOUND) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n\r\n")  # a foreign protocol: the listener closes first, so its side waits
            assert sock.recv(1) == b""
            # a lingering close returns once our FIN is acknowledged, which the listener's side does as it enters
            # TIME_WAIT (a plain close returns at once, and asyncio's only on a later turn of the loop)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, int(BOUND)))

    async def main() -> None:
        store = MemoryStore(FakeTimers())
        first = SharedListener(StoreServer(store), None)
        port = await first.start("127.0.0.1", 0)
        await asyncio.to_thread(client, port)
        await first.close()
        rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
        time_wait = [r for r in rows if r[1].endswith(f":{port:04X}") and r[3] == "06"]
        assert time_wait, "no TIME_WAIT on the endpoint: the rebind below would prove nothing"
        second = SharedListener(StoreServer(store), None)
        assert await second.start("127.0.0.1", port) == port
        await second.close()
        await store.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))
