"""``--network-check`` on real launchers on loopback "nodes", each its own ``--local-addr`` (no namespaces: runs
where root is not at hand; the slow host is ``test_network_check_netns.py``'s): a round of 3 is checked before its
workers start and nobody is excluded; a round of 2 is not checked (two nodes cannot tell which of them is slow)."""

from __future__ import annotations

import re

import pytest

from conftest import clean_environ, fresh_loopback

pytestmark = pytest.mark.usefixtures("private_tmpdir")

PORT = 29417  # fixed, as every node must know it; not 29400, which a wildcard bind elsewhere on the machine may hold
WORKER = ("--no-python", "sh", "-c", 'echo "ran $RANK of $WORLD_SIZE"')


def _job(launch, nodes: int) -> list:
    addrs = [fresh_loopback() for _ in range(nodes)]
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "netcheck-secret"}
    return [launch("--nnodes", f"{nodes}:{nodes}", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"{addrs[0]}:{PORT}", "--rdzv-id", "netcheck",
                   "--rdzv-conf", f"is_host={int(i == 0)},join_timeout=60", "--local-addr", addr, "--network-check",
                   *WORKER, env=dict(env))
            for i, addr in enumerate(addrs)]


def test_a_round_of_three_is_checked_before_its_workers_and_nobody_is_excluded(launch):
    launchers = _job(launch, 3)
    assert [run.finish(timeout=60) for run in launchers] == [0, 0, 0], [run.err for run in launchers]
    checked = [line for line in launchers[0].err if "network check" in line]
    assert len(checked) == 1 and re.fullmatch(r"rankrun: rendezvous round 1: network check of 3 nodes in [\d.]+ s: "
                                              r"nobody unhealthy", checked[0]), launchers[0].err
    assert sorted(line for run in launchers for line in run.out) == [f"ran {r} of 3" for r in range(3)]


def test_a_round_of_two_is_not_checked(launch):
    launchers = _job(launch, 2)
    assert [run.finish(timeout=60) for run in launchers] == [0, 0], [run.err for run in launchers]
    assert not any("network check" in line for run in launchers for line in run.err)
