"""A rendezvous relay (``store.embedded.relay``) in-process, over loopback: what agents say in one turn of the relay's
loop goes to the host in batches of at most ``wire.BATCH`` frames, and the host's replies come back batched the same
way. A job with a large ``relay_group`` sends more than one batch a turn (every agent joining at once): not one frame
of them may be lost, or a join goes unanswered and a lease is lost."""

from __future__ import annotations

import asyncio

from rankrun.store.embedded import wire
from rankrun.store.embedded.client import StoreClient
from rankrun.store.embedded.relay import Relay
from rankrun.store.embedded.server import StoreServer
from rankrun.store.memory import MemoryStore

SECRET = b"relay-secret"
BOUND = 60.0
FRAMES = 2 * wire.BATCH + 3  # three batches each way, the last one short


def test_more_than_a_batch_of_frames_in_one_turn_all_reach_the_host_and_all_replies_come_back():
    async def main() -> None:
        memory = MemoryStore()
        server = StoreServer(memory, SECRET)
        port = await server.start("127.0.0.1", 0)
        relay = Relay(SECRET)
        relay_port = await relay.start("127.0.0.1", 0, ("127.0.0.1", port))
        agents = [await StoreClient.connect("127.0.0.1", relay_port, SECRET) for _ in range(3)]
        try:
            # every request is written before any is read: the relay reads them in a turn or two, the host answers
            # each turn's in one batch per relay
            puts = [agents[n % 3].put(f"/k/{n}", b"%d" % n) for n in range(FRAMES)]
            await asyncio.wait_for(asyncio.gather(*puts), 20)
            assert len(memory.scan("/k/")[0]) == FRAMES
            gets = [agents[n % 3].get(f"/k/{n}") for n in range(FRAMES)]
            found = await asyncio.wait_for(asyncio.gather(*gets), 20)
            assert [entry.value if entry else None for entry in found] == [b"%d" % n for n in range(FRAMES)]
        finally:
            for agent in agents:
                await agent.close()
            await relay.close()
            await server.close()
            await memory.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))
