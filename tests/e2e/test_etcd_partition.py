"""A real partition: the etcd member an agent talks to is cut off, silently, and the agent keeps its lease.

Four hosts on a switch (``netns.switch``): a 3-member etcd, one member a host (peer and client URLs
on that host's address, heartbeat 50 ms, election timeout 500 ms), and a client on the fourth: a
small Python program that holds a lease the way an agent does (``Member.keep_alive`` through all
three endpoints) and prints what happens as lines. The switch then drops every frame of the
member the client talks to (no RST, no FIN: only time tells), and the test reads on: the lease
must be kept (keep-alives answered by another member, never lost), with a 3 s lease (a keep-alive
every 1 s, lost after 3 s) and with the default one (every 5 s, 15 s). Everything runs as root in
namespaces the test makes and removes; skipped, with the reason, where that is not possible.
"""

from __future__ import annotations

import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import netns
from etcdserver import Cluster, Member, etcd_cluster

pytestmark = [pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd is not installed (apt-get install etcd-server)")]

CLIENT = """
import asyncio, sys, time
from rankrun.store.etcd.store import EtcdStore
from rankrun.store.etcd.gateway import Gateway
from rankrun.rendezvous.keys import Keys
from rankrun.rendezvous.member import Member
from rankrun.spec import parse_etcd_endpoints


async def main(endpoints: str, interval: float, attempts: int) -> None:
    store = EtcdStore(Gateway(parse_etcd_endpoints(endpoints), retry_for=60.0))
    lease = await store.grant(interval * attempts)
    keep_alive = lease.keep_alive

    async def told() -> None:  # each keep-alive's outcome, as a line: OK <monotonic> <member> | MISS <monotonic> <why>
        try:
            await keep_alive()
        except BaseException as exc:
            print("MISS", time.monotonic(), type(exc).__name__, exc, flush=True)
            raise
        print("OK", time.monotonic(), store.gateway.serving.host, flush=True)

    lease.keep_alive = told
    print("READY", time.monotonic(), store.gateway.serving.host, flush=True)
    member = Member(store, Keys.for_run("partition"), None, lease)
    keeping = asyncio.create_task(member.keep_alive(interval, attempts))
    await lease.lost.wait()
    print("LOST", time.monotonic(), lease.why, flush=True)
    keeping.cancel()


asyncio.run(main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3])))
"""


class Client:
    """The client program on its namespace host; its lines as they come (a reader thread), killed by PID at the end."""

    def __init__(self, prefix: tuple[str, ...], script: Path, endpoints: str, interval: float, attempts: int) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen([*prefix, sys.executable, str(script), endpoints, str(interval), str(attempts)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def next_line(self, until: float) -> str | None:
        """The next line, or None once ``until`` (monotonic) has passed; a line that says the lease was lost fails."""
        try:
            line = self._queue.get(timeout=max(0.0, until - time.monotonic()))
        except queue.Empty:
            return None
        if line is None:
            raise AssertionError(f"the client exited: {self.lines[-20:]}")
        self.lines.append(line)
        assert not line.startswith("LOST"), f"the lease was lost: {line}\n" + "\n".join(self.lines[-20:])
        return line

    def wait_for(self, word: str, timeout: float, member: str | None = None, avoid: str | None = None) -> list[str]:
        """The next line starting with ``word`` (answered by ``member``, or by any member but ``avoid``), split."""
        until = time.monotonic() + timeout
        while (line := self.next_line(until)) is not None:
            parts = line.split()
            if parts[0] == word and (member is None or parts[2] == member) and (avoid is None or parts[2] != avoid):
                return parts
        raise AssertionError(f"no {word} line within {timeout} s: " + "\n".join(self.lines[-20:]))

    def read_until(self, when: float) -> None:
        while self.next_line(when) is not None:
            pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self._reader.join(timeout=30)  # it reads to the end of the pipe, then stops
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[netns.Switch, Cluster]]:
    """Hosts 0-2: etcd members; host 3: the client."""
    with netns.switch(4, nft=True) as sw, etcd_cluster(
            tmp_path, 3, addresses=[sw.addr(i) for i in range(3)], prefixes=[sw.exec(i) for i in range(3)]) as cluster:
        yield sw, cluster


def _client(sw: netns.Switch, cluster: Cluster, first: Member, tmp_path: Path, interval: float, attempts: int) -> Client:
    """A client whose first member is ``first``: its grant goes there, and so do its keep-alives until it fails."""
    script = tmp_path / "lease_client.py"
    script.write_text(CLIENT)
    endpoints = ",".join(m.endpoint for m in [first, *(m for m in cluster.members if m is not first)])
    return Client(sw.exec(3), script, endpoints, interval, attempts)


@pytest.mark.parametrize("cut", ["leader", "follower"])
def test_a_3_s_lease_is_kept_when_its_member_is_cut_off(hosts, tmp_path, cut):
    """keep_alive_interval=1, keep_alive_max_attempt=3: the lease outlives the cut, whichever member it was on."""
    sw, cluster = hosts
    leader = cluster.leader()
    member = leader if cut == "leader" else next(m for m in cluster.members if m is not leader)
    client = _client(sw, cluster, member, tmp_path, 1.0, 3)
    try:
        client.wait_for("READY", 30, member=member.address)
        client.wait_for("OK", 10, member=member.address)  # a keep-alive answered there: the cut comes between two
        sw.cut(cluster.members.index(member))
        cut_at = time.monotonic()
        client.wait_for("OK", 6.0, avoid=member.address)  # by another member (an OK: etcd still holds the lease)
        client.read_until(cut_at + 6.0)  # two TTLs after the cut: never lost
        answered = [line.split() for line in client.lines if line.startswith("OK")]
        assert float(answered[-1][1]) > cut_at + 4.0, client.lines  # and still kept alive, by the others
    finally:
        client.kill()


def test_the_default_15_s_lease_is_kept_when_its_member_is_cut_off(hosts, tmp_path):
    """keep_alive_interval=5, keep_alive_max_attempt=3 (torchrun's defaults): the leader cut right after the grant."""
    sw, cluster = hosts
    leader = cluster.leader()
    client = _client(sw, cluster, leader, tmp_path, 5.0, 3)
    try:
        client.wait_for("READY", 30, member=leader.address)
        sw.cut(cluster.members.index(leader))
        cut_at = time.monotonic()
        moved = client.wait_for("OK", 15.0, avoid=leader.address)  # the first keep-alive after the cut fails over
        assert float(moved[1]) - cut_at < 15.0
    finally:
        client.kill()
