"""rankrun's TCPStoreServer in its own process, for ``store_bench``: the launcher's default asyncio loop, nothing else.

Usage: ``store_rankrun_server.py``. Prints ``READY <port>`` once listening on 127.0.0.1:<port>. Commands on stdin, one per
line: ``RESET`` (fresh keyspace, answered ``RESET-OK``), ``PROFILE-START`` / ``PROFILE-STOP <file>`` (cProfile of the
event loop between the two, dumped to <file>; answered ``PROFILE-OK``). EOF on stdin closes the server and exits.
"""

import asyncio
import cProfile
import sys

from rankrun.workerstore.tcpstore import TCPStoreServer


async def main() -> None:
    server = TCPStoreServer()
    port = await server.start("127.0.0.1", 0)
    print(f"READY {port}", flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    profile: cProfile.Profile | None = None
    while line := await stdin.readline():
        command, _, arg = line.decode().strip().partition(" ")
        if command == "RESET":
            await server.reset()
            print("RESET-OK", flush=True)
        elif command == "PROFILE-START":
            profile = cProfile.Profile()
            profile.enable()
            print("PROFILE-OK", flush=True)
        elif command == "PROFILE-STOP" and profile is not None:
            profile.disable()
            profile.dump_stats(arg)
            profile = None
            print("PROFILE-OK", flush=True)
    await server.close()


asyncio.run(main())
