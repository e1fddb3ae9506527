"""The neighbour copy's keep endpoint and its client calls (``rankrun.checkpoint.peer``) on 127.0.0.x: real sockets,
real memory files, no torch."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import mmap
import os

import pytest

from rankrun import handshake
from rankrun.checkpoint import peer
from rankrun.checkpoint.peer import PeerError, PeerServer
from rankrun.listen import listen

BOUND = 60.0
SECRET = b"s3cret-of-this-job"
HOST = "127.0.0.1"


def _run(body, room=lambda n: None, **options) -> None:
    async def main() -> None:
        server = PeerServer(HOST, SECRET, room=room, **options)
        port = await server.start()
        try:
            async with asyncio.timeout(BOUND):
                await body(server, port)
        finally:
            await server.close()
        assert asyncio.all_tasks() == {asyncio.current_task()}  # close leaves nothing of the server running
        assert _memfds() == 0  # ... and no copy held

    asyncio.run(main())


def _memfds() -> int:
    """The keep endpoint's memory files open in this process now."""
    count = 0
    for entry in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            count += os.readlink(f"/proc/self/fd/{entry}").startswith(f"/memfd:{peer.NAME}-")
    return count


def _source(data: bytes) -> int:
    fd = os.memfd_create("test-source", os.MFD_CLOEXEC)
    os.write(fd, data)
    return fd


def _digest(fd: int) -> tuple[int, str]:
    size = os.fstat(fd).st_size
    if not size:
        return 0, hashlib.sha256().hexdigest()
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
        return size, hashlib.sha256(mapped).hexdigest()


async def _put(port: int, fd: int, *, node: str = "n1", rank: int = 0, step: int = 1, world: int = 8,
               secret: bytes | None = SECRET) -> None:
    await peer.put(HOST, port, secret, node=node, rank=rank, step=step, world=world, fd=fd, length=os.fstat(fd).st_size)


async def _held_bytes(server: PeerServer, node: str, rank: int) -> bytes:
    where = server.fd_of(node, rank)
    assert where is not None
    fd, length = where
    return os.pread(fd, length, 0)


async def _drained(server: PeerServer) -> None:
    async with asyncio.timeout(10):
        while server.connections:
            await asyncio.sleep(0.01)


async def _authenticated(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(HOST, port)
    await handshake.prove(reader, writer, peer.MAGIC, SECRET)
    return reader, writer


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    op, n = peer._HEAD.unpack(await reader.readexactly(peer._HEAD.size))
    return op, await reader.readexactly(n)


@pytest.mark.parametrize("size", [3 << 20, 64 << 20, 0])
def test_a_put_then_a_get_gives_the_same_bytes(size):
    data = os.urandom(size)
    changes = []

    async def body(server, port):
        fd = _source(data)
        await _put(port, fd, node="n1", rank=5, step=7, world=16)
        os.close(fd)
        assert changes == ["changed"]
        assert server.held() == {"n1": {5: (7, 16, size)}}
        held_fd, length = server.fd_of("n1", 5)
        assert length == size and _digest(held_fd) == (size, hashlib.sha256(data).hexdigest())
        copy = await peer.get(HOST, port, SECRET, node="n1", rank=5, step=7)
        try:
            assert _digest(copy) == (size, hashlib.sha256(data).hexdigest())
        finally:
            os.close(copy)

    _run(body, on_change=lambda: changes.append("changed"))


def test_a_put_sends_only_the_length_given_and_refuses_more_than_the_file_holds():
    async def body(server, port):
        fd = _source(b"abcdefgh")
        await peer.put(HOST, port, SECRET, node="n1", rank=0, step=1, world=1, fd=fd, length=5)
        assert await _held_bytes(server, "n1", 0) == b"abcde"
        with pytest.raises(PeerError, match=rf"checkpoint peer 127\.0\.0\.1:{port}: a copy of 9 bytes from a memory file "
                                            "of 8"):
            await peer.put(HOST, port, SECRET, node="n1", rank=0, step=2, world=1, fd=fd, length=9)
        os.close(fd)
        assert server.held() == {"n1": {0: (1, 1, 5)}}

    _run(body)


def test_a_newer_put_replaces_the_older_only_once_complete():
    old, new = os.urandom(1 << 20), os.urandom(4 << 20)

    async def body(server, port):
        fd = _source(old)
        await _put(port, fd, step=1)
        os.close(fd)
        # a put of step 2 cut off halfway by its client: the copy of step 1 stays, and no memory of step 2
        reader, writer = await _authenticated(port)
        writer.write(peer._encode(b"P", {"node": "n1", "rank": 0, "step": 2, "world": 8, "bytes": len(new)}))
        assert await _answer(reader) == (b"K", b"{}")  # go ahead
        writer.write(new[:len(new) // 2])
        await writer.drain()
        writer.close()
        await _drained(server)
        assert server.held() == {"n1": {0: (1, 8, len(old))}}
        assert await _held_bytes(server, "n1", 0) == old
        assert _memfds() == 1
        # the whole of it: step 2 is the newest, step 1 still held as the one before (the node's other ranks may
        # not have theirs of step 2 here yet); step 3 then frees step 1's memory
        fd = _source(new)
        await _put(port, fd, step=2)
        os.close(fd)
        assert server.held() == {"n1": {0: (2, 8, len(new))}}
        assert server.steps() == {"n1": {0: [(2, 8), (1, 8)]}}
        assert await _held_bytes(server, "n1", 0) == new
        assert _memfds() == 2
        fd = _source(old)
        await _put(port, fd, step=3)
        os.close(fd)
        assert server.steps() == {"n1": {0: [(3, 8), (2, 8)]}} and _memfds() == 2
        assert server.find(0, 2) is not None and server.find(0, 1) is None and server.find(1, 3) is None

    _run(body)


def test_a_put_that_stalls_is_cut_at_its_deadline_and_the_older_copy_stays():
    async def body(server, port):
        fd = _source(b"old")
        await _put(port, fd, step=1)
        os.close(fd)
        reader, writer = await _authenticated(port)
        writer.write(peer._encode(b"P", {"node": "n1", "rank": 0, "step": 2, "world": 8, "bytes": 1 << 20}))
        assert await _answer(reader) == (b"K", b"{}")
        writer.write(b"x" * 1000)  # and no more
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await reader.read() == b""  # closed by the server
        assert 0.3 < loop.time() - start < 5.0
        writer.close()
        await _drained(server)
        assert server.held() == {"n1": {0: (1, 8, 3)}} and _memfds() == 1

    _run(body, floor=0.5)


def test_a_wrong_secret_is_refused_holds_nothing_and_is_logged_once(caplog):
    async def body(server, port):
        fd = _source(b"weights")
        for _ in range(3):
            with pytest.raises(PeerError, match=rf"checkpoint peer 127\.0\.0\.1:{port}: refused: authentication "
                                                "failed: this job's neighbour copy needs its secret"):
                await _put(port, fd, secret=b"not the secret")
        with pytest.raises(PeerError, match="refused: authentication failed"):
            await peer.held(HOST, port, b"not the secret")
        os.close(fd)
        await _drained(server)
        assert server.held() == {} and _memfds() == 0

    with caplog.at_level(logging.DEBUG, logger="rankrun.checkpoint.peer"):
        _run(body)
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert loud == ["checkpoint peer: rejected a connection from 127.0.0.1 that does not know this job's secret"]


def test_an_endpoint_that_does_not_prove_the_secret_is_sent_nothing():
    """Weights never go to an endpoint that cannot prove it knows the secret, and none are taken from it."""
    received = []

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if await handshake.accept(reader, writer, peer.MAGIC, None, "no"):  # asks no proof, cannot give one
                received.append(await reader.read(1 << 16))
        finally:
            writer.close()

    async def main() -> None:
        def protocol() -> asyncio.StreamReaderProtocol:
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(), lambda r, w: tasks.add(asyncio.create_task(impostor(r, w))))

        tasks: set[asyncio.Task[None]] = set()
        server, port = await listen(HOST, 0, protocol)
        fd = _source(b"weights")
        with pytest.raises(PeerError, match=rf"checkpoint peer 127\.0\.0\.1:{port}: the endpoint does not know this "
                                            "job's secret"):
            await _put(port, fd)
        with pytest.raises(PeerError, match="does not know this job's secret"):
            await peer.get(HOST, port, SECRET, node="n1", rank=0, step=1)
        os.close(fd)
        await asyncio.gather(*tasks)
        server.close()
        await server.wait_closed()
        assert received == [b"", b""]  # the client closed without a request

    asyncio.run(main())


def test_without_a_secret_there_is_no_neighbour_copy():
    for secret in (None, b""):
        with pytest.raises(PeerError, match=r"checkpoint peer: no job secret \(RANKRUN_RDZV_SECRET\): the neighbour "
                                            r"copy carries the model's weights and is off"):
            PeerServer(HOST, secret, room=lambda n: None)

    async def body(server, port):
        fd = _source(b"weights")
        with pytest.raises(PeerError, match=rf"checkpoint peer 127\.0\.0\.1:{port}: no job secret"):
            await _put(port, fd, secret=None)
        os.close(fd)
        with pytest.raises(PeerError, match="no job secret"):
            await peer.get(HOST, port, None, node="n1", rank=0, step=1)
        with pytest.raises(PeerError, match="no job secret"):
            await peer.held(HOST, port, b"")
        # a client that offers no proof at all is refused by the endpoint
        reader, writer = await asyncio.open_connection(HOST, port)
        with pytest.raises(handshake.HandshakeError, match="refused: authentication failed"):
            await handshake.prove(reader, writer, peer.MAGIC, None)
        writer.close()
        await _drained(server)
        assert server.held() == {}

    _run(body)


def test_a_put_the_room_does_not_take_is_refused_and_the_older_copy_stays():
    asked = []

    def room(nbytes: int) -> str | None:
        asked.append(nbytes)
        return None if nbytes <= 1 << 20 else "this node has 1.0 MiB of room"

    async def body(server, port):
        small, big = _source(b"s" * 100), _source(b"b" * (2 << 20))
        await _put(port, small, step=1)
        with pytest.raises(PeerError, match=rf"checkpoint peer 127\.0\.0\.1:{port}: refused: no room for a copy of "
                                            r"2097152 bytes \(node n1 rank 0 step 2\): this node has 1\.0 MiB of room$"):
            await _put(port, big, step=2)
        for fd in (small, big):
            os.close(fd)
        assert asked == [100, 2 << 20]
        assert server.held() == {"n1": {0: (1, 8, 100)}} and _memfds() == 1

    _run(body, room=room)


def test_a_get_of_a_copy_not_held_is_an_error():
    async def body(server, port):
        fd = _source(b"kept")
        await _put(port, fd, node="n1", rank=2, step=4)
        os.close(fd)
        with pytest.raises(PeerError, match=rf"checkpoint peer 127\.0\.0\.1:{port}: refused: no copy of node n9 rank 2 "
                                            "is held here"):
            await peer.get(HOST, port, SECRET, node="n9", rank=2, step=4)
        with pytest.raises(PeerError, match="refused: no copy of node n1 rank 3 is held here"):
            await peer.get(HOST, port, SECRET, node="n1", rank=3, step=4)
        with pytest.raises(PeerError, match="refused: the copy of node n1 rank 2 held here is of step 4, not 5"):
            await peer.get(HOST, port, SECRET, node="n1", rank=2, step=5)
        assert _memfds() == 1  # the copy's: none left behind by the failed gets

    _run(body)


def test_held_lists_every_copy_here_and_there_and_drop_frees_them():
    changes = []

    async def body(server, port):
        listing = {"n1": {0: (3, 4, 10), 1: (3, 4, 11)}, "n2": {2: (5, 4, 12)}}
        for node, ranks in listing.items():
            for rank, (step, world, size) in ranks.items():
                fd = _source(b"x" * size)
                await _put(port, fd, node=node, rank=rank, step=step, world=world)
                os.close(fd)
        assert server.held() == listing
        assert await peer.held(HOST, port, SECRET) == listing
        assert server.fd_of("n2", 0) is None
        server.drop("n1", 1)
        assert server.held() == {"n1": {0: (3, 4, 10)}, "n2": {2: (5, 4, 12)}} and _memfds() == 2
        server.drop("n2")
        server.drop("n3")  # nothing of it: no change
        assert await peer.held(HOST, port, SECRET) == {"n1": {0: (3, 4, 10)}} and _memfds() == 1
        assert len(changes) == 3 + 2

    _run(body, on_change=lambda: changes.append(1))


def test_close_frees_every_copy():
    async def main() -> None:
        server = PeerServer(HOST, SECRET, room=lambda n: None)
        port = await server.start()
        for rank in range(3):
            fd = _source(os.urandom(1 << 20))
            await _put(port, fd, rank=rank)
            os.close(fd)
        assert _memfds() == 3
        idle = await _authenticated(port)  # a connection open at close: ended too
        await server.close()
        assert _memfds() == 0 and server.held() == {} and server.fd_of("n1", 0) is None
        assert await idle[0].read() == b""
        idle[1].close()

    asyncio.run(main())


def test_a_get_reads_the_copy_it_asked_for_even_if_a_newer_one_replaces_it_meanwhile():
    old, new = os.urandom(32 << 20), os.urandom(1 << 20)

    async def body(server, port):
        fd = _source(old)
        await _put(port, fd, step=1)
        os.close(fd)
        reader, writer = await _authenticated(port)
        writer.write(peer._encode(b"G", {"node": "n1", "rank": 0, "step": 1}))
        op, meta = await _answer(reader)
        assert op == b"K" and b'"bytes":33554432' in meta
        first = await reader.readexactly(1 << 20)  # the rest waits in the socket while step 2 arrives
        fd = _source(new)
        await _put(port, fd, step=2)
        os.close(fd)
        rest = await reader.readexactly(len(old) - len(first))
        assert first + rest == old
        writer.close()
        assert await _held_bytes(server, "n1", 0) == new

    _run(body)


@pytest.mark.parametrize(("request_", "refusal"), [
    ({"node": "n1", "rank": -1, "step": 1, "world": 8, "bytes": 1}, "a request whose 'rank' is -1"),
    ({"node": "", "rank": 0, "step": 1, "world": 8, "bytes": 1}, "a request whose 'node' is ''"),
    ({"node": "n1", "rank": 0, "step": 1, "world": 0, "bytes": 1}, "a request whose 'world' is 0"),
    ({"node": "n1", "rank": 0, "step": True, "world": 1, "bytes": 1}, "a request whose 'step' is True"),
    ({"node": "n1", "rank": 0, "step": 1, "world": 1}, "a request whose 'bytes' is None"),
])
def test_a_malformed_put_is_refused_and_the_connection_closed(request_, refusal):
    async def body(server, port):
        reader, writer = await _authenticated(port)
        writer.write(peer._encode(b"P", request_))
        op, message = await _answer(reader)
        assert op == b"X" and message.decode().startswith(refusal)
        assert await reader.read() == b""
        writer.close()
        assert server.held() == {}

    _run(body)


def test_an_unknown_or_oversized_request_is_refused():
    async def body(server, port):
        for head, refusal in ((peer._HEAD.pack(b"Z", 0), b"an unknown request b'Z'"),
                              (peer._HEAD.pack(b"P", peer.MAX_REQUEST + 1), b"a request of 1025 bytes (limit 1024)")):
            reader, writer = await _authenticated(port)
            writer.write(head)
            assert await _answer(reader) == (b"X", refusal)
            writer.close()

    _run(body)


def test_connections_are_bounded_and_a_silent_one_is_cut_at_the_timeout():
    async def body(server, port):
        first = await asyncio.open_connection(HOST, port)  # connects, says nothing
        second = await _authenticated(port)  # proved, asks nothing
        async with asyncio.timeout(5):
            while server.connections < 2:
                await asyncio.sleep(0.01)
        third = await asyncio.open_connection(HOST, port)
        assert await third[0].read() == b""  # full: closed at once
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await first[0].read() == b"" and await second[0].read() == b""
        assert 0.3 < loop.time() - start < 5.0
        for _, writer in (first, second, third):
            writer.close()

    _run(body, max_connections=2, timeout=0.5)


def test_a_stranger_that_goes_on_after_its_refusal_is_served_nothing():
    async def body(server, port):
        reader, writer = await asyncio.open_connection(HOST, port)
        with pytest.raises(handshake.HandshakeError, match="refused: authentication failed"):
            await handshake.prove(reader, writer, peer.MAGIC, b"not the secret")
        with contextlib.suppress(OSError):  # as if it had been let in (the server may have closed already)
            writer.write(peer._encode(b"H", {}))
            writer.write(peer._encode(b"P", {"node": "n1", "rank": 0, "step": 1, "world": 1, "bytes": 3}) + b"abc")
            await writer.drain()
        got = b""
        with contextlib.suppress(OSError):  # reset, or the write's broken pipe: closed either way
            got = await reader.read()
        assert got == b""  # closed: no listing, no go-ahead
        writer.close()
        await _drained(server)
        assert server.held() == {"n1": {0: (1, 8, 4)}}

    fd = _source(b"kept")

    async def with_a_copy(server, port):
        await _put(port, fd)
        await body(server, port)

    _run(with_a_copy)
    os.close(fd)


def test_one_connection_serves_its_requests_in_turn():
    first, second = os.urandom(3 << 20), os.urandom(1 << 20)

    async def body(server, port):
        reader, writer = await _authenticated(port)
        for step, data in ((1, first), (2, second)):
            request = {"node": "n1", "rank": 0, "step": step, "world": 2, "bytes": len(data)}
            encoded = peer._encode(b"P", request | {"pad": ""})
            pad = peer.MAX_REQUEST - (len(encoded) - peer._HEAD.size)  # a request of exactly the most it may be
            writer.write(peer._encode(b"P", request | {"pad": "x" * pad}))
            assert await _answer(reader) == (b"K", b"{}")
            writer.write(data)
            assert await _answer(reader) == (b"K", b"{}")
        writer.write(peer._encode(b"H", {}))
        assert await _answer(reader) == (b"K", b'{"n1":{"0":[2,2,1048576]}}')
        writer.write(peer._encode(b"G", {"node": "n1", "rank": 0, "step": 2}))
        assert await _answer(reader) == (b"K", b'{"step":2,"world":2,"bytes":1048576}')
        assert await reader.readexactly(len(second)) == second
        writer.write(peer._encode(b"G", {"node": "n1", "rank": 0, "step": 1}))  # the one before: held too
        assert await _answer(reader) == (b"K", b'{"step":1,"world":2,"bytes":3145728}')
        assert await reader.readexactly(len(first)) == first
        writer.close()
        assert await _held_bytes(server, "n1", 0) == second and _memfds() == 2

    _run(body)


def test_the_memory_files_are_closed_on_exec():
    async def body(server, port):
        fd = _source(b"kept")
        await _put(port, fd)
        os.close(fd)
        copy = await peer.get(HOST, port, SECRET, node="n1", rank=0, step=1)
        held_fd, _ = server.fd_of("n1", 0)
        assert not os.get_inheritable(copy) and not os.get_inheritable(held_fd)
        os.close(copy)

    _run(body)


def test_a_request_that_is_not_an_object_is_refused():
    async def body(server, port):
        reader, writer = await _authenticated(port)
        writer.write(peer._HEAD.pack(b"H", 2) + b"[]")
        assert await _answer(reader) == (b"X", b"a request that is not a JSON object")
        writer.close()

    _run(body)


def test_a_client_says_in_one_line_what_it_met_instead_of_a_keep_endpoint():
    async def main() -> None:
        async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(len(peer.MAGIC))
            writer.close()

        async def garbling(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"\x00\x02[]")  # a frame, but not an object
            await writer.drain()
            await reader.read()
            writer.close()

        tasks: set[asyncio.Task[None]] = set()
        for serve, said in ((closing, "the endpoint closed the connection"),
                            (garbling, r"not a rankrun keep endpoint \(a handshake frame that is not an object\)")):
            def protocol(serve=serve) -> asyncio.StreamReaderProtocol:
                return asyncio.StreamReaderProtocol(asyncio.StreamReader(), lambda r, w: tasks.add(asyncio.create_task(serve(r, w))))

            server, port = await listen(HOST, 0, protocol)
            with pytest.raises(PeerError, match=rf"^checkpoint peer 127\.0\.0\.1:{port}: {said}"):
                await peer.held(HOST, port, SECRET)
            server.close()
            await server.wait_closed()
        await asyncio.gather(*tasks)
        # and nobody there: the port was just freed
        with pytest.raises(PeerError, match=rf"^checkpoint peer 127\.0\.0\.1:{port}: .*[Cc]onnect"):
            await peer.held(HOST, port, SECRET)

    asyncio.run(main())


def test_a_get_of_the_servers_own_node_is_answered_by_its_keeper():
    """A rank whose kept state this launcher holds in its own slots (``own``): served with a descriptor of the
    keeper's, closed once sent; a step the keeper does not hold is refused by name."""
    data = os.urandom(1 << 20)
    asked: list[tuple[int, int]] = []

    async def own(rank: int, step: int) -> tuple[int, int, int] | None:
        asked.append((rank, step))
        return (_source(data), 4, len(data)) if step == 7 else None

    async def body(server, port):
        fd = await peer.get(HOST, port, SECRET, node="me", rank=3, step=7)
        try:
            assert os.pread(fd, len(data) + 1, 0) == data
        finally:
            os.close(fd)
        with pytest.raises(peer.PeerError, match="rank 3's step 8 is not kept on node me"):
            await peer.get(HOST, port, SECRET, node="me", rank=3, step=8)
        assert asked == [(3, 7), (3, 8)]

    _run(body, node="me", own=own)


def test_the_sender_puts_each_step_to_its_neighbour_and_says_a_failure_once():
    lines: list[str] = []
    sent: list[tuple[int, str, int, str]] = []

    async def body(server, port):
        sender = peer.Sender(SECRET, "n1", say=lines.append,
                             sent=lambda step, where, n, seconds, state: sent.append((step, where, n, state)))
        try:
            sender.to = (HOST, port)
            sender.offer(4, 2, {0: (_source(b"a" * 10), 10), 1: (_source(b"b" * 20), 20)})
            await sender._task
            assert server.steps() == {"n1": {0: [(4, 2)], 1: [(4, 2)]}}
            assert sent == [(4, f"{HOST}:{port}", 30, "complete")]
            sender.to = (HOST, 1)  # nobody there
            for step in (5, 6):
                sender.offer(step, 2, {0: (_source(b"c"), 1)})
                await sender._task
            assert [s[3] for s in sent[1:]] == ["abandoned", "abandoned"]
            assert len(lines) == 1 and lines[0].startswith("checkpoint: the neighbour's copy of step 5 was not made: ")
        finally:
            await sender.close()

    _run(body)
