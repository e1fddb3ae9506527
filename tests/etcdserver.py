"""Real etcd servers for tests and benchmarks: one member or a cluster, each its own process on a fresh address.

Every member listens on a loopback address nobody else uses (``conftest.fresh_loopback``'s
scheme) with etcd's standard ports, has its own data directory, and is killed by PID when the
``with`` block ends. Readiness is etcd's own ``/health`` answering ``true`` (bounded).

A member may run inside a network namespace (``prefixes``: the command prefix of its host, e.g.
``netns.Switch.exec(i)``, with ``addresses`` on that host): ``ip netns exec`` execs etcd, so the PID
is still etcd's; this side reaches such a member through a small Python run with the same prefix.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ETCD = shutil.which("etcd")
READY_WITHIN = 30.0


def fresh_address() -> str:
    """A loopback address outside 127.0.0.x, random: a fixed port on it cannot collide (tests, benchmarks, etcd)."""
    a, b, c = os.urandom(3)
    return f"127.{1 + a % 254}.{b}.{1 + c % 254}"


@dataclass
class Member:
    name: str
    address: str
    data_dir: Path
    log: Path
    scheme: str = "http"
    prefix: tuple[str, ...] = ()  # runs it (and reaches it) on a namespace host: ("ip", "netns", "exec", NAME)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{self.address}:2379"

    @property
    def peer_url(self) -> str:
        return f"http://{self.address}:2380"

    @property
    def endpoint(self) -> str:
        return f"{self.address}:2379"


@dataclass
class Cluster:
    members: list[Member]
    token: str
    tls: tuple[Path, Path, Path] | None = None  # ca, cert, key of the client side (server cert and key for etcd)
    extra: tuple[str, ...] = ()
    _context: ssl.SSLContext | None = field(default=None, repr=False)

    @property
    def endpoints(self) -> str:
        return ",".join(m.client_url if self.tls else m.endpoint for m in self.members)

    def start(self, member: Member, state: str = "new") -> None:
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        args = [*member.prefix, ETCD or "etcd", "--name", member.name, "--data-dir", str(member.data_dir),
                "--listen-client-urls", member.client_url, "--advertise-client-urls", member.client_url,
                "--listen-peer-urls", member.peer_url, "--initial-advertise-peer-urls", member.peer_url,
                "--initial-cluster", initial, "--initial-cluster-token", self.token, "--initial-cluster-state", state,
                "--heartbeat-interval", "50", "--election-timeout", "500", *self.extra]
        if self.tls is not None:
            _, cert, key = self.tls
            args += ["--cert-file", str(cert), "--key-file", str(key)]
        with member.log.open("ab") as log:
            member.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_healthy(self, members: list[Member] | None = None) -> None:
        deadline = time.monotonic() + READY_WITHIN
        for member in members or self.members:
            while not self._healthy(member):
                if member.proc is not None and member.proc.poll() is not None:
                    raise RuntimeError(f"etcd {member.name} exited {member.proc.returncode}: {member.log.read_text()[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd {member.name} not healthy in {READY_WITHIN} s: {member.log.read_text()[-2000:]}")
                time.sleep(0.02)  # no event announces readiness: etcd's /health is the documented probe

    def _healthy(self, member: Member) -> bool:
        try:
            return bool(self._fetch(member, "/health", None, 1.0).get("health") == "true")
        except (OSError, ValueError):
            return False

    def _fetch(self, member: Member, path: str, body: dict[str, object] | None, timeout: float) -> dict[str, object]:
        """GET (no body) or POST a JSON body; the JSON answer. ``OSError`` when the member cannot be reached."""
        url, data = member.client_url + path, json.dumps(body) if body is not None else ""
        if member.prefix:  # in its namespace: only a process there reaches it
            done = subprocess.run([*member.prefix, sys.executable, "-c", _FETCH, url, data, str(timeout)],
                                  capture_output=True, text=True, timeout=timeout + 30, check=False)
            if done.returncode != 0:
                raise OSError(f"{url}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
            return dict(json.loads(done.stdout))
        request = urllib.request.Request(url, data=data.encode() or None, method="POST" if data else "GET")
        with urllib.request.urlopen(request, timeout=timeout, context=self._ssl()) as answer:
            return dict(json.loads(answer.read()))

    def _ssl(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        if self._context is None:
            self._context = ssl.create_default_context(cafile=str(self.tls[0]))
            self._context.load_cert_chain(str(self.tls[1]), str(self.tls[2]))  # in case etcd wants client certificates
        return self._context

    def call(self, member: Member, path: str, body: dict[str, object]) -> dict[str, object]:
        return self._fetch(member, path, body, 5.0)

    def leader(self) -> Member:
        """The member the live members agree leads (bounded wait for an election to finish)."""
        deadline = time.monotonic() + READY_WITHIN
        while time.monotonic() < deadline:
            for member in self.live():
                try:
                    status = self.call(member, "/v3/maintenance/status", {})
                except OSError:
                    continue
                leader = str(status.get("leader", "0"))
                if leader != "0" and leader == str(dict(status["header"]).get("member_id")):  # type: ignore[call-overload]
                    return member
            time.sleep(0.02)  # an election is under way: no event to wait on from outside
        raise RuntimeError("no etcd leader")

    def live(self) -> list[Member]:
        return [m for m in self.members if m.proc is not None and m.proc.poll() is None]

    def kill(self, member: Member) -> None:
        if member.proc is not None and member.proc.poll() is None:
            member.proc.send_signal(signal.SIGKILL)
            member.proc.wait(timeout=10)

    def stop_all(self) -> None:
        for member in self.members:
            self.kill(member)

    def keys(self, prefix: str) -> list[dict[str, object]]:
        """Every key under ``prefix`` as etcd holds it (base64 decoded), from any live member."""
        import base64  # noqa: PLC0415 - test helper

        raw = prefix.encode()
        end = raw[:-1] + bytes([raw[-1] + 1])
        answer = self.call(self.live()[0], "/v3/kv/range", {"key": base64.b64encode(raw).decode(),
                                                            "range_end": base64.b64encode(end).decode()})
        kvs = answer.get("kvs", [])
        assert isinstance(kvs, list)
        return [{"key": base64.b64decode(kv["key"]).decode(), "lease": int(kv.get("lease", 0))} for kv in kvs]


_FETCH = """
import sys, urllib.request
url, data, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
request = urllib.request.Request(url, data=data.encode() or None, method="POST" if data else "GET")
with urllib.request.urlopen(request, timeout=timeout) as answer:
    sys.stdout.write(answer.read().decode())
"""


@contextlib.contextmanager
def etcd_cluster(tmp_path: Path, size: int = 1, *, tls: tuple[Path, Path, Path] | None = None,
                 extra: tuple[str, ...] = (), addresses: list[str] | None = None,
                 prefixes: list[tuple[str, ...]] | None = None) -> Iterator[Cluster]:
    """``size`` members, all healthy on return; every one killed by PID on exit.

    ``prefixes``: each member's command prefix (its namespace host), with ``addresses`` on those hosts.
    """
    if ETCD is None:
        raise RuntimeError("etcd is not installed (apt-get install etcd-server)")
    base = tmp_path / f"etcd-{os.urandom(3).hex()}"
    base.mkdir()
    scheme = "https" if tls else "http"
    addresses = addresses or [fresh_address() for _ in range(size)]
    members = [Member(f"m{i}", addresses[i], base / f"m{i}.data", base / f"m{i}.log", scheme,
                      prefixes[i] if prefixes else ()) for i in range(size)]
    cluster = Cluster(members, f"t-{os.urandom(4).hex()}", tls, extra)
    try:
        for member in members:
            cluster.start(member)
        cluster.wait_healthy()
        yield cluster
    finally:
        cluster.stop_all()
