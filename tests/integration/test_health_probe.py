"""The network check's probe endpoint and prober (``rankrun.health.probe``) on 127.0.0.1: real sockets, real timing."""

from __future__ import annotations

import asyncio
import logging
import math
import time

import pytest

from rankrun.health import probe
from rankrun.health.probe import ProbeError, ProbeServer, measure
from rankrun.listen import listen

BOUND = 30.0
SECRET = b"s3cret-of-this-job"
HOST = "127.0.0.1"


def _run(body, **options) -> None:
    async def main() -> None:
        server = ProbeServer(HOST, options.pop("secret", SECRET), **options)
        port = await server.start()
        try:
            async with asyncio.timeout(BOUND):
                await body(server, port)
        finally:
            await server.close()
        assert asyncio.all_tasks() == {asyncio.current_task()}  # close leaves nothing of the server running

    asyncio.run(main())


async def _eof_within(reader: asyncio.StreamReader, bound: float) -> float:
    """Seconds until the server closes the connection (nothing read but the end, or a reset)."""
    start = time.monotonic()
    async with asyncio.timeout(bound):
        try:
            while await reader.read(4096):
                pass
        except ConnectionResetError:
            pass
    return time.monotonic() - start


async def _authenticated(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(HOST, port)
    await probe._prove(reader, writer, SECRET, f"{HOST}:{port}")
    return reader, writer


def test_a_measure_on_loopback_gives_sane_figures():
    async def body(server, port):
        start = time.perf_counter()
        link = await measure(HOST, port, SECRET, pings=10, size=4 << 20)
        took = time.perf_counter() - start
        assert 0 < link.rtt < 0.05  # loopback: tens of microseconds, a loaded machine's scheduling at worst
        # 4 MiB each way on loopback: hundreds of MB/s at the least, and never beyond what memory copies allow
        assert 50e6 < link.forward < 100e9 and 50e6 < link.backward < 100e9
        assert link.rtt < took and (4 << 20) / link.forward < took and (4 << 20) / link.backward < took
        assert took < 2.0
        assert server.connections == 0 or await _drained(server)

    _run(body)


async def _drained(server: ProbeServer) -> bool:
    async with asyncio.timeout(5):
        while server.connections:
            await asyncio.sleep(0.01)
    return True


def test_without_a_secret_anyone_may_measure():
    async def body(server, port):
        link = await measure(HOST, port, None, pings=3, size=64 << 10)
        assert math.isfinite(link.rtt) and link.forward > 0 and link.backward > 0

    _run(body, secret=None)


def test_a_wrong_or_missing_secret_is_refused_and_logged_once(caplog):
    async def body(server, port):
        for _ in range(5):
            with pytest.raises(ProbeError, match=rf"network probe 127\.0\.0\.1:{port}: refused: authentication failed"):
                await measure(HOST, port, b"not the secret", pings=1, size=1)
        with pytest.raises(ProbeError, match="refused: authentication failed"):
            await measure(HOST, port, None, pings=1, size=1)
        # and an endpoint that does not prove the secret cannot answer for a node of the job
        impostor = ProbeServer(HOST, None)
        impostor_port = await impostor.start()
        with pytest.raises(ProbeError, match="does not know this job's secret"):
            await measure(HOST, impostor_port, SECRET, pings=1, size=1)
        await impostor.close()
        await _drained(server)

    with caplog.at_level(logging.DEBUG, logger="rankrun.health.probe"):
        _run(body)
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert loud == ["network probe: rejected a connection from 127.0.0.1 that does not know this job's secret"]


def test_a_client_that_says_nothing_or_stalls_is_cut_at_the_timeout(caplog):
    async def body(server, port):
        reader, writer = await asyncio.open_connection(HOST, port)  # connects, says nothing
        stalled_reader, stalled_writer = await _authenticated(port)
        stalled_writer.write(probe._HEAD.pack(b"W", 1 << 20) + b"x" * 100)  # a transfer it never finishes
        took = await _eof_within(reader, 5.0)
        assert 0.3 <= took < 3.0
        assert await _eof_within(stalled_reader, 5.0) < 3.0
        await _drained(server)
        for w in (writer, stalled_writer):
            w.close()

    with caplog.at_level(logging.DEBUG, logger="rankrun.health.probe"):
        _run(body, timeout=0.5)
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]  # strangers' silence is not news


def test_a_transfer_over_the_cap_is_refused_and_one_at_the_cap_served():
    async def body(server, port):
        reader, writer = await _authenticated(port)  # one transfer each way (``measure`` splits its bytes in parts)
        assert await probe._forward(reader, writer, 1 << 20, "here") > 0  # exactly the cap
        assert await probe._backward(reader, writer, 1 << 20, "here") > 0
        with pytest.raises(ProbeError, match=r"refused: a transfer of 1048577 bytes \(limit 1048576\)"):
            await probe._forward(reader, writer, (1 << 20) + 1, "here")
        writer.close()
        # an echo over its limit, and a request the endpoint does not know, end the connection the same way
        for head in (probe._HEAD.pack(b"E", probe.MAX_ECHO + 1), probe._HEAD.pack(b"Z", 0)):
            reader, writer = await _authenticated(port)
            writer.write(head)
            with pytest.raises(ProbeError, match=r"refused: an (echo of 1025 bytes|unknown request)"):
                await probe._reply(reader, "here")
            await _eof_within(reader, 5.0)
            writer.close()

    _run(body, max_bytes=1 << 20)


def test_the_default_cap_is_16_MiB():
    async def body(server, port):
        reader, writer = await _authenticated(port)
        with pytest.raises(ProbeError, match=r"a transfer of 16777217 bytes \(limit 16777216\)"):
            await probe._backward(reader, writer, (16 << 20) + 1, "here")
        writer.close()

    _run(body)


def test_many_connections_do_not_exhaust_it():
    async def body(server, port):
        held = [await asyncio.open_connection(HOST, port) for _ in range(40)]  # strangers that say nothing
        await asyncio.sleep(0.1)
        assert server.connections == 8  # the cap: the other 32 were closed at once

        async def closed(reader: asyncio.StreamReader) -> bool:
            try:
                async with asyncio.timeout(0.2):
                    return await reader.read(1) == b""
            except ConnectionResetError:
                return True
            except TimeoutError:
                return False

        assert sum(await asyncio.gather(*(closed(reader) for reader, _ in held))) == 32
        with pytest.raises(ProbeError):
            await measure(HOST, port, SECRET, pings=1, size=1)  # full: no answer, at once
        await _drained(server)  # the held ones are cut at their timeout
        for _, writer in held:
            writer.close()
        # then the job's own agents measure, many at once: they take turns at the two active slots
        links = await asyncio.gather(*(measure(HOST, port, SECRET, pings=3, size=256 << 10) for _ in range(8)))
        assert all(link.forward > 0 and link.backward > 0 for link in links)

    _run(body, timeout=2.0, max_connections=8)


def test_close_ends_every_connection_and_leaves_no_task():
    async def body(server, port):
        silent = await asyncio.open_connection(HOST, port)
        sending_reader, sending_writer = await _authenticated(port)
        sending_writer.write(probe._HEAD.pack(b"W", 8 << 20) + b"x" * 1000)
        await asyncio.sleep(0.05)
        assert server.connections == 2
        await server.close()
        assert server.connections == 0
        assert asyncio.all_tasks() == {asyncio.current_task()}
        await _eof_within(silent[0], 5.0)
        await _eof_within(sending_reader, 5.0)
        with pytest.raises(ProbeError):
            await measure(HOST, port, SECRET, pings=1, size=1, timeout=5.0)  # nobody listens there any more
        for w in (silent[1], sending_writer):
            w.close()

    _run(body, timeout=60.0)  # long: only close() can end them within the test's bound


def test_an_endpoint_that_never_answers_is_no_answer_at_the_timeout():
    class Mute(asyncio.Protocol):
        pass

    async def main() -> None:
        server, port = await listen(HOST, 0, Mute)
        start = time.monotonic()
        with pytest.raises(ProbeError, match=rf"network probe 127\.0\.0\.1:{port}: no measurement within 0.3 s"):
            await measure(HOST, port, SECRET, timeout=0.3)
        assert time.monotonic() - start < 3.0
        server.close()
        await server.wait_closed()

    asyncio.run(asyncio.wait_for(main(), BOUND))


def test_the_round_trip_is_the_median_of_the_pings():
    """One slow echo among five (a scheduling hiccup) does not make the link slow."""
    echoes = []

    class SlowFirst(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport

        def data_received(self, data):
            echoes.append(data)
            delay = 0.3 if len(echoes) == 1 else 0.0
            asyncio.get_running_loop().call_later(delay, self.transport.write, data)

    async def main() -> None:
        server, port = await listen(HOST, 0, SlowFirst)
        reader, writer = await asyncio.open_connection(HOST, port)
        async with asyncio.timeout(BOUND):
            rtt = await probe._round_trips(reader, writer, 5, "here")
        assert len(echoes) == 5
        assert rtt < 0.1  # the median: the 0.3 s one set aside
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_a_transfer_slowed_once_does_not_make_the_link_slow(monkeypatch):
    """``measure`` counts the fastest of its ``PARTS`` transfers each way: the first one each way held up 50 ms (a time
    slice lost on a busy host) leaves the rate of the others, well past what that one transfer managed. (The endpoint
    runs in this process: it sends and drops through the same functions, so each way is ``PARTS`` calls of each.)"""
    part = (4 << 20) // probe.PARTS
    held = 0.05
    send = probe._send
    calls = {"send": 0}

    async def slow_first_send_each_way(writer, n):  # forward: this side's sends; backward: the endpoint's
        calls["send"] += 1
        if calls["send"] in {1, probe.PARTS + 1}:
            await asyncio.sleep(held)
        await send(writer, n)

    monkeypatch.setattr(probe, "_send", slow_first_send_each_way)

    async def body(server, port):
        link = await measure(HOST, port, SECRET, pings=1, size=4 << 20)
        assert calls == {"send": 2 * probe.PARTS}
        assert link.forward > part / held and link.backward > part / held, link

    _run(body)
