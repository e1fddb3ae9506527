"""This node's store relay as its agent runs it (``rankrun.agent.store_relay``), in-process over loopback: with
``--store-relays`` a node that does not host the store starts a relay for its first round, names it to its workers,
keeps it while the store stays where it is and replaces it when the store moves; the node hosting the store never
relays, and a relay that cannot reach the store is said while the workers connect directly."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rankrun.agent.store_relay import NodeStoreRelay
from rankrun.cli import spec_from_args
from rankrun.ranks import NodeRanks
from rankrun.rendezvous.keys import Assignment
from rankrun.spec import LaunchSpec
from rankrun.workerstore.relayhost import StoreRelayHost
from rankrun.workerstore.tcpstore import TCPStoreServer
from tcpwire import get, ping, validate

HOST = "127.0.0.1"
BOUND = 30.0


def _spec(tmp_path: Path, *flags: str) -> LaunchSpec:
    script = tmp_path / "train.py"
    script.write_text("")
    return spec_from_args(["--nnodes", "2", "--nproc-per-node", "2", *flags, str(script)], {"PATH": "/usr/bin:/bin"})


def _word(round_: int, port: int) -> Assignment:
    return Assignment(round_, 1, 2, NodeRanks(2, 4, 2, 4), HOST, port, 0)


async def _store() -> tuple[TCPStoreServer, StoreRelayHost, int]:
    server = TCPStoreServer()
    await server.start(HOST, 0)
    host = StoreRelayHost(server, None)
    return server, host, await host.start(HOST, 0)


async def _served(port: int) -> bool:
    """A worker's first words through ``port``: the store answers its PING and a GET."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(validate() + ping(b"\x2a\x00\x00\x00") + get(b"/k"))
        return await reader.readexactly(12) == b"\x2a\x00\x00\x00" + b"\x00" * 8
    finally:
        writer.close()
        await writer.wait_closed()


def test_a_node_relays_its_workers_and_keeps_the_relay_while_the_store_stays(tmp_path):
    lines: list[str] = []

    async def main() -> None:
        stores = [await _store() for _ in range(2)]
        relay = NodeStoreRelay(_spec(tmp_path, "--store-relays", "1"), lines.append, hosting=False, relayable=True, address=HOST)
        try:
            addr, port = await relay.master(_word(1, stores[0][2]))
            assert addr == HOST and port != stores[0][2]
            assert lines == [f"store relay: this node's workers reach the job's store at {HOST}:{stores[0][2]} "
                             f"through {HOST}:{port} (their MASTER_ADDR and MASTER_PORT)"]
            assert await _served(port)
            assert await relay.master(_word(2, stores[0][2])) == (HOST, port)  # the same store: the same relay
            assert len(lines) == 1
            moved = await relay.master(_word(3, stores[1][2]))  # the store moved (a new host): a new relay
            assert moved[1] != port and len(lines) == 2 and f":{stores[1][2]} through" in lines[1]
            assert await _served(moved[1])
        finally:
            await relay.close()
            for server, host, _ in stores:
                await host.close()
                await server.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))


def test_the_node_hosting_the_store_or_a_job_without_relays_connects_directly(tmp_path):
    lines: list[str] = []

    async def main() -> None:
        for flags, hosting in ((("--store-relays", "1"), True), (("--store-relays", "0"), False)):
            relay = NodeStoreRelay(_spec(tmp_path, *flags), lines.append, hosting=hosting, relayable=True, address=HOST)
            assert await relay.master(_word(1, 29500)) == (HOST, 29500)
            await relay.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))
    assert lines == []


def test_a_relay_that_cannot_reach_the_store_is_said_and_the_workers_connect_directly(tmp_path):
    lines: list[str] = []

    async def main() -> tuple[tuple[str, int], int]:
        server, host, port = await _store()
        await host.close()  # nobody listens there any more
        await server.close()
        relay = NodeStoreRelay(_spec(tmp_path, "--store-relays", "1"), lines.append, hosting=False, relayable=True, address=HOST)
        try:
            return await relay.master(_word(1, port)), port
        finally:
            await relay.close()

    master, port = asyncio.run(asyncio.wait_for(main(), BOUND))
    assert master == (HOST, port)
    [line] = lines
    assert line.endswith("; this node's workers connect to the job's store directly")


def test_on_etcd_the_workers_connect_directly_and_it_is_said_once(tmp_path, capsys):
    lines: list[str] = []
    spec = _spec(tmp_path, "--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "127.0.0.1:2379", "--rdzv-id", "job",
                 "--store-relays", "1")
    capsys.readouterr()  # (the note on etcd-v2's API)

    async def main() -> list[tuple[str, int]]:
        relay = NodeStoreRelay(spec, lines.append, hosting=False, relayable=False, address=HOST)  # etcd's session
        try:
            return [await relay.master(_word(n, 29500)) for n in (1, 2)]
        finally:
            await relay.close()

    assert asyncio.run(asyncio.wait_for(main(), BOUND)) == [(HOST, 29500)] * 2
    assert lines == ["--store-relays: not with the etcd rendezvous (the store is a node's own, reached on a port that "
                     "speaks only torch's protocol); this node's workers connect to it directly"]


def test_by_default_a_node_relays_only_past_what_the_host_can_hold(tmp_path):
    """``--store-relays auto``: 4 ranks fit any host; 10 million do not (one connection per rank)."""
    lines: list[str] = []

    async def main() -> tuple[tuple[str, int], tuple[str, int], int]:
        server, host, port = await _store()
        relay = NodeStoreRelay(_spec(tmp_path), lines.append, hosting=False, relayable=True, address=HOST)
        try:
            small = await relay.master(_word(1, port))
            huge = await relay.master(Assignment(2, 1, 5000, NodeRanks(2, 10_000_000, 2, 10_000_000), HOST, port, 0))
            return small, huge, port
        finally:
            await relay.close()
            await host.close()
            await server.close()

    small, huge, port = asyncio.run(asyncio.wait_for(main(), BOUND))
    assert small == (HOST, port) and huge[0] == HOST and huge[1] != port
    [line] = lines
    assert line.startswith("store relay: this node's workers reach the job's store at")
