"""``--network-check`` on real launchers, one on each of 5 hosts in network namespaces this test creates (and
removes): the store on host 0, plain ``--no-python sh`` workers. A host whose received packets are held 60 ms
(``tests/nfqueue.py``, ``netns.delayed``) is excluded by the check before any worker starts: its launcher exits 4 with
the check's figures, the other four re-form without it and finish 0; without the delay nobody is excluded."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

import netns
from conftest import PY, clean_environ

pytestmark = pytest.mark.usefixtures("private_tmpdir")

HOSTS = 5
DELAY = 0.060  # 6 x the check's margin over the median; at 150 ms its 2 MB transfers took 11 s of the test's 13
PORT = 29400  # inside the namespaces: nobody else's
WORKER = ("--no-python", "sh", "-c", 'echo "ran $RANK of $WORLD_SIZE"')
CHECKED = r"network check of (\d) nodes in ([\d.]+) s: "


@pytest.fixture
def sw() -> Iterator[netns.Switch]:
    with netns.switch(HOSTS) as made:
        yield made


def _job(sw: netns.Switch, launch) -> list:
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "netcheck-secret"}
    launchers = []
    for i in range(HOSTS):
        conf = f"is_host={int(i == 0)},last_call_timeout=20,join_timeout=60"
        launchers.append(launch("--nnodes", "3:5", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                                "--rdzv-endpoint", f"{sw.addr(0)}:{PORT}", "--rdzv-id", "netcheck", "--rdzv-conf", conf,
                                "--local-addr", sw.addr(i), "--network-check", *WORKER, env=dict(env),
                                cmd=(*sw.exec(i), PY, "-m", "rankrun")))
    return launchers


def _checks(host) -> list[tuple[int, float, str]]:
    """The coordinator's lines about each round's check: (nodes, seconds, what it found)."""
    found = []
    for line in host.err:
        m = re.search(CHECKED + "(.*)$", line)
        if m:
            found.append((int(m.group(1)), float(m.group(2)), m.group(3)))
    return found


def test_a_host_whose_packets_are_late_is_excluded_and_the_others_finish(sw, launch):
    netns.skip_unless_iptables()
    late = 3
    with netns.delayed(sw, late, launch, DELAY):
        launchers = _job(sw, launch)
        codes = [run.finish(timeout=60) for run in launchers]
    assert codes == [0, 0, 0, 4, 0], [run.err for run in launchers]
    said = [line for line in launchers[late].err if "excluded from job" in line]
    assert len(said) == 1, launchers[late].err
    assert f"({sw.addr(late)}): network check: " in said[0] and " ms round trip to its neighbours (median " in said[0]
    assert not any(line.startswith("ran") for line in launchers[late].out)  # no worker on the late host
    host = launchers[0].err
    named = [line for line in host if f"({sw.addr(late)}): network check: " in line]
    assert named and named[0].startswith("rankrun: node "), host
    checks = _checks(launchers[0])
    assert [(n, found) for n, _, found in checks] == [(5, "1 unhealthy, re-forming without them"),
                                                       (4, "nobody unhealthy")], host
    ran = sorted(line for run in launchers for line in run.out if line.startswith("ran"))
    assert ran == [f"ran {r} of 4" for r in range(4)]
    print("network check (5 nodes, one late; 4 nodes):", checks)


def test_without_a_delay_nobody_is_excluded(sw, launch):
    launchers = _job(sw, launch)
    codes = [run.finish(timeout=60) for run in launchers]
    assert codes == [0] * HOSTS, [run.err for run in launchers]
    checks = _checks(launchers[0])
    assert [(n, found) for n, _, found in checks] == [(5, "nobody unhealthy")], launchers[0].err
    ran = sorted(line for run in launchers for line in run.out if line.startswith("ran"))
    assert ran == [f"ran {r} of 5" for r in range(5)]
    print("network check (5 nodes, clean):", checks)
