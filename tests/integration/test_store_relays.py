"""Store relays chosen automatically, with real launchers: three loopback nodes whose open-files limit cannot hold one
store connection per rank on the host, but can with relays (``fdlimit.relays_wanted``). The host says relays are
used, the other two nodes start theirs and name them to their workers, and the workers (raw TCPStore clients, no
torch) meet in the one store: every rank's ADD is counted there, and the last one's SET releases all their WAITs.
With ``--store-relays 0`` nothing is relayed and the host says the job does not fit."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import Launcher, clean_environ, fresh_loopback, under_nofile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# a rank of a 6-rank job, as init_process_group's store traffic: ADD a counter; the last arrival SETs "go"; WAIT for it
WORKER = """\
import os, socket, struct
addr, port, world = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"])
s = lambda b: struct.pack("<Q", len(b)) + b
def recv(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the store closed the connection"
        data += chunk
    return data
sock = socket.create_connection((addr, port), timeout=30)
sock.sendall(b"\\x00" + struct.pack("<I", 0x3C85F7CE) + b"\\x04" + s(b"arrived") + struct.pack("<q", 1))
(arrived,) = struct.unpack("<q", recv(sock, 8))
sock.sendall((b"\\x01" + s(b"go") + s(b"1") if arrived == world else b"") + b"\\x06" + struct.pack("<Q", 1) + s(b"go"))
assert recv(sock, 1) == b"\\x00"
print("rank", os.environ["RANK"], "via", f"{addr}:{port}", flush=True)
"""

NODES, NPROC = 3, 2
# the host's need (fdlimit.fd_budget): one connection per rank (6) + one per node (3) + 8 per local worker + 64 = 89;
# with relays one per node and one per local worker (5) in place of 6: 88
LIMIT = 88


def _nodes(launch: Callable[..., Launcher], tmp_path: Path, *extra: str) -> tuple[list[Launcher], str]:
    script = tmp_path / "rank.py"
    script.write_text(WORKER)
    addr = fresh_loopback()
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "relays-auto"}
    cmd = under_nofile(LIMIT, LIMIT)
    runs = [launch("--nnodes", str(NODES), "--node-rank", str(r), "--master-addr", addr, "--master-port", "29500",
                   "--nproc-per-node", str(NPROC), *extra, str(script), env=dict(env), cmd=cmd) for r in (2, 1, 0)]
    assert [r.finish() for r in runs] == [0] * NODES, [r.err for r in runs]
    return runs, addr


def test_relays_are_used_when_the_host_cannot_hold_one_connection_per_rank(launch, tmp_path):
    (*others, host), addr = _nodes(launch, tmp_path)
    assert any("store relays are used" in line for line in host.err), host.err
    assert not any("needs about" in line for line in host.err), host.err  # with relays it fits: no such line
    for node in others:
        said = [line for line in node.err if "store relay: this node's workers reach the job's store" in line]
        assert len(said) == 1, node.err
        relay = re.search(r"through (\S+:\d+) \(their", said[0])
        assert relay is not None
        ranks = [line for line in node.out if " via " in line]
        assert len(ranks) == NPROC
        assert all(line.endswith(f"via {relay.group(1)}") for line in ranks), ranks
    assert all(line.endswith(f"via {addr}:29500") for line in host.out if " via " in line)
    assert sorted(int(re.search(r"rank (\d+)", line).group(1)) for r in (*others, host) for line in r.out
                  if " via " in line) == list(range(NODES * NPROC))


def test_no_relays_with_store_relays_0(launch, tmp_path):
    (*others, host), addr = _nodes(launch, tmp_path, "--store-relays", "0")
    assert any("needs about 89 open files" in line for line in host.err), host.err
    assert not any("store relay" in line for r in (*others, host) for line in r.err)
    assert all(line.endswith(f"via {addr}:29500") for r in (*others, host) for line in r.out if " via " in line)
