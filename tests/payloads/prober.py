"""One host's side of the network check (a test payload): serves ``rankrun.health.probe``'s endpoint on the address
given (argv[1]), prints ``READY <port>``, then for each stdin line ``measure HOST PORT SIZE [PINGS]`` prints
``LINK HOST rtt forward backward`` (seconds, bytes/s) or ``NOANSWER HOST why``; ends at the end of stdin. PINGS:
the round trips whose median is the rtt (``measure``'s default where not given; the network check's is 5).
The job's secret is ``PROBE_SECRET``."""

import asyncio
import os
import signal
import sys

from rankrun.health.probe import ProbeError, ProbeServer, measure

signal.alarm(120)  # safety net: never outlive a broken test


async def main(addr: str) -> None:
    secret = os.environ["PROBE_SECRET"].encode()
    server = ProbeServer(addr, secret)
    port = await server.start()
    print(f"READY {port}", flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        _, host, peer_port, size, *pings = line.split()
        try:
            link = await measure(host, int(peer_port), secret, size=int(size), timeout=20.0,
                                 **({"pings": int(pings[0])} if pings else {}))
        except ProbeError as exc:
            print(f"NOANSWER {host} {exc}", flush=True)
        else:
            print(f"LINK {host} {link.rtt!r} {link.forward!r} {link.backward!r}", flush=True)
    await server.close()


asyncio.run(main(sys.argv[1]))
