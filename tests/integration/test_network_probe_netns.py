"""The network check's measurements between hosts in network namespaces this test creates (and removes): one prober
per host (``payloads/prober.py``, ``rankrun.health.probe``) measures its ring neighbour, the suspects are re-probed
against a known-good node, and ``health.outliers`` names the slow host, or nobody.

The kernel here has no netem. A host of low throughput is made with a token bucket on its interface
(``tc qdisc ... tbf``); a host whose packets are late, by holding each packet it receives 150 ms in a netfilter queue
(``tests/nfqueue.py``; the rule that queues them is iptables' ``NFQUEUE`` target, since this kernel lacks nftables'
``queue`` expression: that test skips where ``iptables`` is not installed). Every qdisc, rule and holder is removed,
and checked removed, before the namespaces go."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Sequence

import pytest

import netns
from conftest import PY, clean_environ, payload
from rankrun.health.outliers import Link, confirm, find_suspects, network_line
from rankrun.rendezvous import netcheck

pytestmark = pytest.mark.usefixtures("private_tmpdir")

HOSTS = 5
SIZE = 1 << 20  # each way: a fast veth moves it in a few ms, the throttled host in ~0.2 s
RATE = "40mbit"  # the slow host's egress: 5 MB/s, where a veth through a bridge moves hundreds of MB/s
SECRET = "netns-probe-secret"
DELAY = 0.150  # seconds each packet of the late host is held


class Ring:
    """One prober per host; ``measure`` asks several of them at once, as the agents of a round do."""

    def __init__(self, sw: netns.Switch, launch) -> None:
        self.sw = sw
        self.size = SIZE
        self.pings: int | None = None  # measure's default
        env = clean_environ() | {"PROBE_SECRET": SECRET}
        self.probers = [launch(sw.addr(i), env=dict(env), cmd=(*sw.exec(i), PY, payload("prober.py")),
                               stdin=subprocess.PIPE) for i in range(HOSTS)]
        self.ports = [int(p.wait_for(r"^READY \d+$", timeout=60)[0].split()[1]) for p in self.probers]

    def measure(self, pairs: Sequence[tuple[int, int]]) -> list[Link | None]:
        """Host ``a`` measures its link to host ``b``, for every pair at once."""
        for a, b in pairs:
            stdin = self.probers[a].proc.stdin
            assert stdin is not None
            pings = "" if self.pings is None else f" {self.pings}"
            stdin.write(f"measure {self.sw.addr(b)} {self.ports[b]} {self.size}{pings}\n".encode())
            stdin.flush()
        links: list[Link | None] = []
        for a, b in pairs:
            (line,) = self.probers[a].wait_for(rf"^(LINK|NOANSWER) {self.sw.addr(b)} ", timeout=60)
            word, _, *figures = line.split()
            links.append(Link(*map(float, figures)) if word == "LINK" else None)
        return links

    def check(self) -> tuple[list[Link], dict[int, str]]:
        """The network check's round: the ring, then each suspect re-probed against its known-good partner."""
        ring = [link or Link(float("inf"), 0.0, 0.0) for link in self.measure([(i, (i + 1) % HOSTS) for i in range(HOSTS)])]
        found = find_suspects(ring)
        pairs = sorted(found.partners.items())
        reprobes = dict(zip([node for node, _ in pairs], self.measure(pairs), strict=True))
        return ring, confirm(found, ring, reprobes)

    def close(self) -> None:
        for prober in self.probers:
            if prober.proc.stdin is not None:
                prober.proc.stdin.close()  # the end of its commands: it closes its endpoint and exits
        assert [prober.finish(timeout=30) for prober in self.probers] == [0] * HOSTS


@pytest.fixture
def hosts(launch) -> Iterator[Ring]:
    with netns.switch(HOSTS) as sw:
        ring = Ring(sw, launch)
        yield ring
        ring.close()


@contextlib.contextmanager
def _throttled(sw: netns.Switch, host: int) -> Iterator[None]:
    """Host ``host`` sends at ``RATE`` at most (a token bucket on its interface), until the block ends."""
    tc = ("ip", "netns", "exec", sw.names[host], "tc", "qdisc")
    subprocess.run([*tc, "add", "dev", sw.dev(host), "root", "tbf", "rate", RATE, "burst", "32kb", "latency", "100ms"],
                   check=True, capture_output=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run([*tc, "del", "dev", sw.dev(host), "root"], check=True, capture_output=True, timeout=30)
        shown = subprocess.run([*tc, "show", "dev", sw.dev(host)], check=True, capture_output=True, text=True, timeout=30)
        assert "tbf" not in shown.stdout


def test_a_throttled_host_is_named_and_without_the_throttle_nobody(hosts):
    ring, unhealthy = hosts.check()
    assert unhealthy == {}, ring  # a clean ring: nobody
    slow = 2
    with _throttled(hosts.sw, slow):
        ring, unhealthy = hosts.check()
    touching = {slow - 1, slow}  # ring[i] is host i's pair with host i + 1
    worst_other = min(ring[i].throughput for i in range(HOSTS) if i not in touching)
    assert all(ring[i].throughput < worst_other / 3 for i in touching), ring
    assert list(unhealthy) == [slow], (ring, unhealthy)
    assert "throughput with its neighbours (median" in unhealthy[slow]
    line = network_line(slow, hosts.sw.addr(slow), unhealthy[slow])
    assert line.startswith(f"node 2 ({hosts.sw.addr(slow)}): network check: ") and "B/s throughput" in line
    ring, unhealthy = hosts.check()
    assert unhealthy == {}, ring  # the throttle gone, nobody again


def test_a_host_whose_packets_are_late_is_named_by_its_round_trips(hosts, launch):
    netns.skip_unless_iptables()
    # at 150 ms a round trip every one counts: transfers short (64 kB, 4 parts each way, a round trip or two each in
    # slow start) and the network check's own 5 pings, not measure's 10 (256 kB and 10 pings: 10 s, now 7)
    hosts.size, hosts.pings = 64 << 10, netcheck.PINGS
    late = 3
    with netns.delayed(hosts.sw, late, launch, DELAY):
        ring, unhealthy = hosts.check()
    touching = {late - 1, late}
    assert all(ring[i].rtt >= DELAY for i in touching), ring
    assert all(ring[i].rtt < DELAY / 3 for i in range(HOSTS) if i not in touching), ring
    assert list(unhealthy) == [late], (ring, unhealthy)
    assert " ms round trip to its neighbours (median " in unhealthy[late]
    ring, unhealthy = hosts.check()
    assert unhealthy == {}, ring
