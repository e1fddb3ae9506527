"""What a session's backend states of itself for the rounds (``Session.hosting``, ``Session.relayable``), from the
real backends: the embedded store's host, a node joining it, and etcd. The rounds ask these, not the spec."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from etcdserver import etcd_cluster
from rankrun.cli import spec_from_args
from rankrun.rendezvous.session import open_session
from rankrun.spec import LaunchSpec
from rankrun.store.embedded.server import StoreServer
from rankrun.store.memory import MemoryStore
from rankrun.workerstore.tcpstore import TCPStoreServer

BOUND = 30.0
SECRET = "facts-secret"


def _spec(tmp_path: Path, *flags: str) -> LaunchSpec:
    script = tmp_path / "train.py"
    script.write_text("")
    argv = ["--nnodes", "1:2", "--rdzv-id", "facts", "--nproc-per-node", "1", *flags, str(script)]
    return spec_from_args(argv, {"PATH": "/usr/bin", "RANKRUN_RDZV_SECRET": SECRET})


async def _facts(spec: LaunchSpec) -> tuple[bool, bool]:
    """(hosting, relayable) of a session opened on ``spec``'s real backend, then closed."""
    worker_store = TCPStoreServer()
    try:
        async with open_session(spec, worker_store, lambda line: None) as session:
            return session.hosting, session.relayable
    finally:
        await worker_store.close()


def test_the_embedded_stores_host_hosts_and_its_workers_store_may_be_relayed(tmp_path):
    spec = _spec(tmp_path, "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-conf", "is_host=1")
    assert asyncio.run(asyncio.wait_for(_facts(spec), BOUND)) == (True, True)


def test_a_node_joining_the_embedded_store_does_not_host(tmp_path):
    async def main() -> tuple[bool, bool]:
        memory = MemoryStore()
        server = StoreServer(memory, SECRET.encode(), job="facts")  # another agent's, hosting
        try:
            port = await server.start("127.0.0.1", 0)
            return await _facts(_spec(tmp_path, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                      "--rdzv-conf", "is_host=0"))
        finally:
            await server.close()
            await memory.close()

    assert asyncio.run(asyncio.wait_for(main(), BOUND)) == (False, True)


@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd is not installed (scripts/test installs etcd-server)")
def test_on_etcd_no_node_hosts_and_the_workers_store_is_never_relayed(tmp_path):
    with etcd_cluster(tmp_path, 1) as cluster:
        spec = _spec(tmp_path, "--rdzv-backend", "etcd", "--rdzv-endpoint", cluster.endpoints)
        assert asyncio.run(asyncio.wait_for(_facts(spec), BOUND)) == (False, False)
