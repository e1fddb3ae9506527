"""Hosts on a switch, in network namespaces a test creates and removes, and silent faults between them.

``Switch`` makes a "switch" namespace holding a bridge and, per host, a namespace joined to the
bridge by a veth pair (``10.<a>.<b>.<n>/24``: a random subnet of 10/8, reached only from inside the
namespaces). Faults are silent, as a pulled cable or a dropping switch port is (no RST, no FIN):

- ``link_down(host)``: the host's own interface goes down (``ip link set ... down`` inside it);
- ``cut(host)``: the switch drops every frame to and from the host's port (an nftables bridge rule).

Every fault is undone, and checked undone, by ``heal()``; ``close()`` removes the namespaces (and so
the veth pairs). Nothing here ever touches the test machine's own namespace beyond creating veths.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest


def _run(*args: str) -> str:
    return subprocess.run(list(args), check=True, capture_output=True, text=True, timeout=30).stdout


def skip_unless_possible(*, nft: bool = False) -> None:
    """Skip (with the reason) where namespaces cannot be made: not root, no iproute2, or (for cuts) no nft."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    if nft and shutil.which("nft") is None:
        pytest.skip("switch-port faults need nftables (apt-get install nftables)")


class Switch:
    def __init__(self, hosts: int) -> None:
        self.tag = os.urandom(3).hex()
        self.subnet = f"10.{200 + os.urandom(1)[0] % 50}.{os.urandom(1)[0]}"
        self.switch = f"rs_{self.tag}"
        self.names = [f"rh{i}_{self.tag}" for i in range(hosts)]
        self._made: list[str] = []
        self._etc: list[Path] = []  # /etc/netns/<name>/ folders made for per-host files
        self._faults: list[tuple[str, int]] = []
        try:
            self._build()
        except subprocess.CalledProcessError as exc:
            self.close()
            pytest.skip(f"cannot build network namespaces here: {exc.stderr.strip()}")

    def _build(self) -> None:
        _run("ip", "netns", "add", self.switch)
        self._made.append(self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
            dev, port = self.dev(i), self.port(i)
            _run("ip", "link", "add", dev, "type", "veth", "peer", "name", port)
            _run("ip", "link", "set", dev, "netns", ns)
            _run("ip", "link", "set", port, "netns", self.switch)
            _run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
            _run("ip", "-n", self.switch, "link", "set", port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def dev(self, i: int) -> str:
        return f"vh{i}{self.tag}"  # the host's side (15 characters at most)

    def port(self, i: int) -> str:
        return f"vs{i}{self.tag}"  # the switch's side

    def addr(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def exec(self, i: int) -> tuple[str, ...]:
        """The command prefix that runs a program on host ``i``."""
        return ("ip", "netns", "exec", self.names[i])

    def hosts(self, i: int, entries: dict[str, str]) -> Path:
        """Host ``i``'s own ``/etc/hosts`` (``ip netns exec`` binds ``/etc/netns/<name>/hosts`` over it): localhost
        and ``entries`` (name → address), and a ``resolv.conf`` that sends DNS to the host's own loopback. Append to
        the returned file in place (the bind mount keeps its inode) to add a name later."""
        folder = Path("/etc/netns") / self.names[i]
        folder.mkdir(parents=True, exist_ok=True)
        self._etc.append(folder)
        path = folder / "hosts"
        path.write_text("127.0.0.1 localhost\n" + "".join(f"{addr} {name}\n" for name, addr in entries.items()))
        # and a resolver that asks nobody outside: a name not in the file fails at once, never leaving the host
        (folder / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        return path

    # -- faults

    def link_down(self, i: int) -> None:
        _run("ip", "-n", self.names[i], "link", "set", self.dev(i), "down")
        self._faults.append(("down", i))

    def cut(self, i: int) -> None:
        """The switch silently drops everything to and from host ``i``."""
        table = f"cut{i}"
        _run("ip", "netns", "exec", self.switch, "nft", "add", "table", "bridge", table)
        _run("ip", "netns", "exec", self.switch, "nft", f"add chain bridge {table} c {{ type filter hook forward priority 0; }}")
        _run("ip", "netns", "exec", self.switch, "nft", "add", "rule", "bridge", table, "c", "iifname", self.port(i), "drop")
        _run("ip", "netns", "exec", self.switch, "nft", "add", "rule", "bridge", table, "c", "oifname", self.port(i), "drop")
        self._faults.append(("cut", i))

    def heal(self) -> None:
        """Undo every fault, and check that it is undone."""
        for kind, i in reversed(self._faults):
            if kind == "down":
                _run("ip", "-n", self.names[i], "link", "set", self.dev(i), "up")
                assert "UP" in _run("ip", "-n", self.names[i], "-br", "link", "show", self.dev(i)).split()[1]
            else:
                _run("ip", "netns", "exec", self.switch, "nft", "delete", "table", "bridge", f"cut{i}")
                assert f"cut{i}" not in _run("ip", "netns", "exec", self.switch, "nft", "list", "tables")
        self._faults.clear()

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired, AssertionError):
            self.heal()
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
        self._made.clear()
        for folder in self._etc:
            shutil.rmtree(folder, ignore_errors=True)
        self._etc.clear()


@contextlib.contextmanager
def switch(hosts: int, *, nft: bool = False) -> Iterator[Switch]:
    skip_unless_possible(nft=nft)
    sw = Switch(hosts)
    try:
        yield sw
    finally:
        sw.close()


def namespaces_left(names: Sequence[str]) -> list[str]:
    listed = _run("ip", "netns", "list")
    return [n for n in names if n in listed]


NFQUEUE = str(Path(__file__).resolve().parent / "nfqueue.py")


def skip_unless_iptables() -> None:
    if shutil.which("iptables") is None:
        pytest.skip("queueing a host's packets here needs iptables' NFQUEUE target (apt-get install iptables)")


@contextlib.contextmanager
def delayed(sw: Switch, host: int, launch, delay: float) -> Iterator[None]:
    """Every packet host ``host`` receives is held ``delay`` seconds (``tests/nfqueue.py``, one of ``launch``'s
    processes), until the block ends; the rule and the holder are removed, and checked removed.
    Received, not sent: a packet held on its sender's way out still counts against its socket's small queue (TCP
    small queues), which then lets about two packets out per delay: 20 kB/s, and transfers that time out."""
    import sys  # noqa: PLC0415

    holder = launch("0", str(delay), cmd=(*sw.exec(host), sys.executable, NFQUEUE), stdin=subprocess.PIPE)
    holder.wait_for(r"^READY$", timeout=30)
    rule = ("INPUT", "-i", sw.dev(host), "-j", "NFQUEUE", "--queue-num", "0", "--queue-bypass")
    iptables = ("ip", "netns", "exec", sw.names[host], "iptables")
    subprocess.run([*iptables, "-A", *rule], check=True, capture_output=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run([*iptables, "-D", *rule], check=True, capture_output=True, timeout=30)
        listed = subprocess.run([*iptables, "-S", "INPUT"], check=True, capture_output=True, text=True, timeout=30)
        assert "NFQUEUE" not in listed.stdout
        assert holder.proc.stdin is not None
        holder.proc.stdin.close()
        assert holder.finish(timeout=30) == 0

