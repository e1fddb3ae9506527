"""--store-relays with real torch: init_process_group("gloo") of 64 ranks, 2 loopback nodes x 32, the second node's
workers reaching the store through its relay (MASTER_ADDR/MASTER_PORT name the relay).

64 ``import torch`` cost about 3 s of CPU each: the ranks are forks of one zygote that imported torch once
(``payloads/gloo_zygote.py``); each runs torch's own TCPStore client and gloo with exactly the environment rankrun gave
its worker process.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import clean_environ, fresh_loopback, payload

pytestmark = [pytest.mark.usefixtures("private_tmpdir"), pytest.mark.timeout(240)]
pytest.importorskip("torch")

NPROC = 32


@pytest.fixture
def zygote(tmp_path):
    path = tmp_path / "z.sock"
    proc = subprocess.Popen([sys.executable, payload("gloo_zygote.py"), "serve", str(path)], stdout=subprocess.PIPE,
                            env=clean_environ(), start_new_session=True, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        yield str(path)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the zygote and any fork of it still there: the group this test started
        proc.wait(10)
        proc.stdout.close()


def test_gloo_init_of_64_ranks_through_a_relay(launch, tmp_path, zygote):
    addr = fresh_loopback()
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "relay-e2e", "GLOO_SOCKET_IFNAME": "lo"}
    started = time.monotonic()
    runs = [launch("--nnodes", "2", "--node-rank", str(r), "--master-addr", addr, "--master-port", "29500",
                   "--nproc-per-node", str(NPROC), "--store-relays", "--no-python", sys.executable, payload("gloo_zygote.py"),
                   zygote, env=dict(env)) for r in (1, 0)]
    assert [r.finish(timeout=180) for r in runs] == [0, 0], [r.err for r in runs]
    took = time.monotonic() - started
    relayed, host = runs
    lines = [re.sub(r"^\[default\d+\]:", "", line) for r in runs for line in r.out if " via " in line]
    assert sorted(int(line.split()[1]) for line in lines) == list(range(2 * NPROC))
    assert all(f"of {2 * NPROC} restart 0 via" in line for line in lines)
    said = [line for line in relayed.err if "store relay: this node's workers reach the job's store" in line]
    assert len(said) == 1, relayed.err
    relay = re.search(r"through (\S+:\d+) \(their MASTER_ADDR", said[0])  # the node's own address, as its agent's
    assert relay is not None, said
    via_relay = [line for line in relayed.out if " via " in line]
    assert len(via_relay) == NPROC
    assert all(line.endswith(f"via {relay.group(1)}") for line in via_relay), via_relay
    assert all(line.endswith(f"via {addr}:29500") for line in host.out if " via " in line)
    print(f"64 gloo ranks through a relay: {took:.1f} s")


def test_a_restart_after_init_process_group_through_a_relay(launch, tmp_path, zygote):
    """A relayed rank fails after init_process_group; the next attempt's ranks meet in a fresh keyspace, the relayed
    ones through the same relay (the store's reset() closed the old attempt's connections, the relay's clients too)."""
    addr = fresh_loopback()
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "relay-e2e", "GLOO_SOCKET_IFNAME": "lo", "FAIL_RANK": "5"}
    runs = [launch("--nnodes", "2", "--node-rank", str(r), "--master-addr", addr, "--master-port", "29500",
                   "--nproc-per-node", "4", "--max-restarts", "1", "--store-relays", "--no-python", sys.executable,
                   payload("gloo_zygote.py"), zygote, env=dict(env)) for r in (1, 0)]
    assert [r.finish(timeout=180) for r in runs] == [0, 0], [r.err for r in runs]
    lines = [line for r in runs for line in r.out if " via " in line]
    assert sorted(int(re.search(r"rank (\d+)", line).group(1)) for line in lines) == list(range(8))
    assert all("of 8 restart 1 via" in line for line in lines), lines
    assert sum("store relay: this node's workers reach" in line for line in runs[0].err) == 1  # one relay, kept
