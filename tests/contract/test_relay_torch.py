"""torch's own TCPStore client, and real gloo jobs, through a store relay (``--store-relays``).

The same scenarios as ``test_tcpstore_torch`` (every client call compared with torch's own server, a gloo job, a
restart after ``reset()`` that must see no stale key), with the server process serving them through a
``StoreRelay`` in front of the store: the clients connect to the relay, the relay to the store over its one
authenticated, multiplexed connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import test_tcpstore_torch as direct
from test_tcpstore_torch import ServerProcess, torch_reference

pytestmark = pytest.mark.timeout(120)

RELAYED_SERVER_SCRIPT = """
import asyncio, sys
from rankrun.workerstore.relay import StoreRelay
from rankrun.workerstore.relayhost import StoreRelayHost
from rankrun.workerstore.tcpstore import TCPStoreServer

async def main() -> None:
    server = TCPStoreServer()
    await server.start("127.0.0.1", 0)
    host = StoreRelayHost(server, b"contract secret")
    relay = StoreRelay(("127.0.0.1", await host.start("127.0.0.1", 0)), b"contract secret", bind="127.0.0.1")
    port = await relay.start("127.0.0.1", 0)
    print(f"READY {port}", flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := await stdin.readline():
        if line.strip() == b"RESET":
            await server.reset()
            print("RESET-OK", flush=True)
        elif line.strip() == b"KEYS":
            print(repr(sorted(server.snapshot())), flush=True)
    await relay.close()
    await host.close()
    await server.close()

asyncio.run(main())
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    script = tmp_path / "relayed_server.py"
    script.write_text(RELAYED_SERVER_SCRIPT)
    served = ServerProcess(script)
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def first_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[bytes]]]:
    """``test_tcpstore_torch.first_job`` through the relay."""
    tmp = tmp_path_factory.mktemp("first-job")
    script = tmp / "relayed_server.py"
    script.write_text(RELAYED_SERVER_SCRIPT)
    yield from direct.after_a_job(script, tmp)


test_client_api_matches_torch_server = direct.test_client_api_matches_torch_server
test_client_api_spot_checks = direct.test_client_api_spot_checks
test_wait_timeout_takes_the_timeout = direct.test_wait_timeout_takes_the_timeout
test_gloo_job_bootstraps_through_the_store = direct.test_gloo_job_bootstraps_through_the_store
test_restart_after_reset_sees_no_stale_keys = direct.test_restart_after_reset_sees_no_stale_keys
__all__ = ["torch_reference"]  # the module-scoped fixture, imported so that the comparison finds it
