"""The workers' store out of file descriptors, in a real server process under a small ``RLIMIT_NOFILE``: 600 clients
against a soft limit of 256. The server accepts what it can, says so once in one line (no traceback), does not spin
(its CPU over seconds, from ``/proc/<pid>/stat``), and once the clients leave serves a new one.

asyncio's own accept loop, here, logged a traceback and scheduled a retry for up to ``backlog`` attempts per wake-up:
a core busy and hundreds of MB of stderr (issue 24)."""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tcpwire import add, i64, validate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SOFT = 256
CLIENTS = 600
WINDOW_S = 2.0  # the CPU is measured over this window while the server is out of descriptors
SRC = Path(__file__).resolve().parents[2] / "src"

SERVER = """\
import asyncio, resource, sys
from rankrun.workerstore.tcpstore import TCPStoreServer

resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


async def main() -> None:
    server = TCPStoreServer()
    print("port", await server.start("127.0.0.1", 0), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # served until the test closes stdin
    await server.close()


asyncio.run(main())
"""


class Server:
    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(SOFT)], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.err: list[str] = []
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline().split()[1])

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line.rstrip("\n"))
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if text in line:
                return line
        raise AssertionError(f"no {text!r} on the server's stderr in {timeout} s: {self.err[:12]} ({len(self.err)} lines)")

    def cpu_s(self) -> float:
        """utime + stime of the server process, in seconds (/proc/<pid>/stat, fields 14 and 15)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._reader.join(30)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def server() -> Iterator[Server]:
    served = Server()
    try:
        yield served
    finally:
        served.stop()


def _client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)  # completes in the listen queue, accepted or not
    sock.sendall(validate())
    return sock


def test_out_of_descriptors_the_server_pauses_says_so_once_and_serves_again(server: Server) -> None:
    clients = [_client(server.port) for _ in range(CLIENTS)]
    try:
        line = server.wait_for("cannot accept connections", timeout=30)
        assert f"this process has its {SOFT} open files (RLIMIT_NOFILE" in line
        assert "ulimit -n" in line
        before = server.cpu_s()
        time.sleep(WINDOW_S)  # a measurement window, not a synchronisation
        spent = server.cpu_s() - before
        assert spent < 0.25 * WINDOW_S, f"the server spent {spent:.2f} s of CPU in {WINDOW_S} s while out of descriptors"
    finally:
        for sock in clients:
            sock.close()
    late = _client(server.port)  # once the others are gone, descriptors free up: accepting resumes
    with late:
        late.sendall(add(b"after", 1))
        got = b""
        while len(got) < 8:
            chunk = late.recv(8 - len(got))
            assert chunk, "the server closed a new client's connection"
            got += chunk
        assert got == i64(1)
    server.stop()
    assert server.proc.returncode == 0, server.err
    said = [line for line in server.err if "cannot accept connections" in line]
    assert len(said) == 1, server.err[:20]
    assert not any("Traceback" in line for line in server.err), server.err[:40]
    assert len(server.err) == 1, server.err[:20]  # the one line and nothing else
