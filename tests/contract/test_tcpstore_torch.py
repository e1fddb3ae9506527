"""rankrun's TCPStore server against real torch clients and real gloo jobs.

The server runs in a child process (a tiny script that prints ``READY <port>`` and takes
``RESET`` / ``KEYS`` commands on stdin), so torch's blocking client calls can never stall
its event loop. The full client API is run against it *and* against torch's own server;
the results must be identical.
"""

from __future__ import annotations

import ast
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

pytestmark = pytest.mark.timeout(120)

HOST = "127.0.0.1"
SRC = Path(__file__).resolve().parents[2] / "src"
WORLD_SIZE = 4
STEP_TIMEOUT_S = 10.0
JOB_TIMEOUT_S = 60.0

SERVER_SCRIPT = """
import asyncio, sys
from rankrun.workerstore.tcpstore import TCPStoreServer

async def main() -> None:
    server = TCPStoreServer()
    port = await server.start("127.0.0.1", 0)
    print(f"READY {port}", flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := await stdin.readline():
        if line.strip() == b"RESET":
            await server.reset()
            print("RESET-OK", flush=True)
        elif line.strip() == b"KEYS":
            print(repr(sorted(server.snapshot())), flush=True)
    await server.close()

asyncio.run(main())
"""

WORKER_SCRIPT = """
import os
from datetime import timedelta
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=30))
ones = torch.ones(2)
dist.all_reduce(ones)
assert ones.tolist() == [4.0, 4.0], ones
group = dist.new_group()
dist.barrier(group=group)
pair = dist.new_group([0, 1])
if dist.get_rank() in (0, 1):
    x = torch.ones(1)
    dist.all_reduce(x, group=pair)
    assert x.item() == 2.0, x
dist.barrier()
dist.destroy_process_group()
print("WORKER-OK", os.environ["RANK"], flush=True)
"""


class ServerProcess:
    """The store server in a child process, driven through its stdin/stdout."""

    def __init__(self, script: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            bufsize=0,
        )
        self._buffer = b""
        ready = self.read_line()
        assert ready.startswith("READY "), ready
        self.port = int(ready.split()[1])

    def read_line(self) -> str:
        """The next stdout line, waiting at most STEP_TIMEOUT_S."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(left, 0))
            if not ready:
                raise TimeoutError("store server did not answer")
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise EOFError(f"store server exited: {self.proc.wait(STEP_TIMEOUT_S)}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def command(self, cmd: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd.encode() + b"\n")
        return self.read_line()

    def keys(self) -> list[bytes]:
        keys: list[bytes] = ast.literal_eval(self.command("KEYS"))
        return keys

    def reset(self) -> None:
        assert self.command("RESET") == "RESET-OK"

    def stop(self) -> None:
        """Close stdin (a clean shutdown), then kill if it lingers; always waits."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(STEP_TIMEOUT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(STEP_TIMEOUT_S)
            if self.proc.stdout is not None:
                self.proc.stdout.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    script = tmp_path / "store_server.py"
    script.write_text(SERVER_SCRIPT)
    served = ServerProcess(script)
    try:
        yield served
    finally:
        served.stop()


def client(port: int, seconds: float = 5.0) -> Any:
    return dist.TCPStore(HOST, port, is_master=False, timeout=timedelta(seconds=seconds))


# -- the client API, compared with torch's own server ------------------------------------


def outcome(fn: Callable[[], object]) -> object:
    """A comparable record of a call: its result, or its exception type and message."""
    try:
        return fn()
    except Exception as exc:  # the exception is the result being compared
        return (type(exc).__name__, str(exc).split("\n")[0])


def wait_from_thread(port: int, keys: list[str], writer: Any) -> object:
    """Block a second client in wait(keys) while ``writer`` creates them."""
    waiter = client(port)
    done: list[object] = []
    thread = threading.Thread(target=lambda: done.append(outcome(lambda: waiter.wait(keys))))
    thread.start()
    for key in keys:
        writer.set(key, "x")
    thread.join(STEP_TIMEOUT_S)
    assert not thread.is_alive()
    return done


def barrier_from_threads(port: int, key: str, parties: int) -> list[object]:
    stores = [client(port) for _ in range(parties)]
    results: list[object] = []
    threads = [threading.Thread(target=lambda s=s: results.append(outcome(lambda: s.barrier(key, parties)))) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(STEP_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads)
    return results


def api_scenario(port: int) -> list[tuple[str, object]]:
    """Every TCPStore client call of torch 2.13; returns (label, outcome) pairs."""
    s = client(port)
    short = timedelta(seconds=0.3)
    steps: list[tuple[str, Callable[[], object]]] = [
        ("set", lambda: s.set("k", "v")),
        ("get", lambda: s.get("k")),
        ("add+", lambda: s.add("n", 5)),
        ("add-", lambda: s.add("n", -8)),
        ("get-add", lambda: s.get("n")),
        ("cas-missing-empty", lambda: s.compare_set("c1", "", "new")),
        ("cas-missing-nonempty", lambda: s.compare_set("c2", "old", "new")),
        ("check-c2", lambda: s.check(["c2"])),
        ("cas-match", lambda: s.compare_set("c1", "new", "newer")),
        ("cas-mismatch", lambda: s.compare_set("c1", "bogus", "z")),
        ("check-true", lambda: s.check(["k", "n"])),
        ("check-false", lambda: s.check(["k", "missing"])),
        ("wait-present", lambda: s.wait(["k", "n"])),
        ("wait-woken", lambda: wait_from_thread(port, ["w1", "w2"], s)),
        ("wait-timeout", lambda: s.wait(["missing"], short)),
        ("num-keys", s.num_keys),
        ("delete-1", lambda: s.delete_key("k")),
        ("delete-0", lambda: s.delete_key("k")),
        ("append", lambda: (s.append("a", "x"), s.append("a", "yz"), s.get("a"))),
        ("multi-set", lambda: s.multi_set(["m1", "m2"], ["1", "22"])),
        ("multi-get", lambda: s.multi_get(["m1", "m2", "a"])),
        ("set-timeout", lambda: s.set_timeout(short)),
        ("get-timeout", lambda: s.get("missing")),
        ("restore-timeout", lambda: s.set_timeout(timedelta(seconds=5))),
        ("queue-push", lambda: (s.queue_push("q", "a"), s.queue_push("q", "b"))),
        ("queue-len", lambda: s.queue_len("q")),
        ("queue-pop", lambda: (s.queue_pop("q"), s.queue_pop("q", block=False))),
        ("queue-pop-empty", lambda: s.queue_pop("q", block=False)),
        ("queue-len-0", lambda: s.queue_len("q")),
        ("list-keys", lambda: sorted(s.list_keys())),
    ]
    if hasattr(s, "barrier"):
        steps += [
            ("barrier-2", lambda: barrier_from_threads(port, "bar", 2)),
            ("barrier-reuse", lambda: s.barrier("bar", 2)),
            ("barrier-counter", lambda: s.get("bar")),
            ("barrier-timeout", lambda: s.barrier("bar2", 2, short)),
            ("barrier-arrival-kept", lambda: s.barrier("bar2", 2)),
        ]
    steps.append(("num-keys-end", s.num_keys))
    return [(label, outcome(step)) for label, step in steps]


@pytest.fixture(scope="module")
def torch_reference() -> list[tuple[str, object]]:
    """The scenario against torch's own (libuv) server, in this process."""
    master = dist.TCPStore(HOST, 0, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    result = api_scenario(master.port)
    del master
    return result


def test_client_api_matches_torch_server(server: ServerProcess, torch_reference: list[tuple[str, object]]) -> None:
    ours = api_scenario(server.port)
    assert [label for label, _ in ours] == [label for label, _ in torch_reference]
    for (label, got), (_, want) in zip(ours, torch_reference, strict=True):
        assert got == want, label


def test_client_api_spot_checks(server: ServerProcess) -> None:
    """The comparison above could pass with both servers wrong; pin the key facts."""
    results = dict(api_scenario(server.port))
    assert results["get"] == b"v"
    assert results["cas-missing-nonempty"] == b"old"
    assert results["cas-mismatch"] == b"newer"
    assert results["multi-get"] == [b"1", b"22", b"xyz"]
    assert results["wait-timeout"] == (
        "DistStoreError",
        "wait timeout after 300ms, keys: /missing",
    )
    assert results["queue-pop"] == (b"a", b"b")
    assert results["queue-pop-empty"][0] == "QueueEmptyError"  # type: ignore[index]
    assert "init/" not in results["list-keys"]  # type: ignore[operator]


def test_wait_timeout_takes_the_timeout(server: ServerProcess) -> None:
    s = client(server.port)
    start = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="wait timeout"):
        s.wait(["never"], timedelta(seconds=0.3))
    assert 0.25 < time.monotonic() - start < 3.0
    s.set("after", "1")  # the connection survived the CANCEL_WAIT dance
    assert s.get("after") == b"1"


# -- real gloo jobs ----------------------------------------------------------------------


def worker_environ(rank: int, port: int) -> dict[str, str]:
    """torchrun-style worker env on a scrubbed copy of ours (nothing launcher-ish leaks in)."""
    scrub = ("PET_", "TORCHELASTIC_", "TORCH_ELASTIC_", "MASTER_", "RANK", "LOCAL_", "WORLD_SIZE", "GROUP_", "ROLE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(scrub)}
    return {
        **env,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(WORLD_SIZE),
        "LOCAL_WORLD_SIZE": str(WORLD_SIZE),
        "MASTER_ADDR": HOST,
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }


def run_job(port: int, tmp_path: Path, name: str) -> list[tuple[int | None, str]]:
    """Run WORLD_SIZE gloo workers against the store; (returncode, output) per rank."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    procs: list[subprocess.Popen[bytes]] = []
    logs = [tmp_path / f"{name}-rank{rank}.log" for rank in range(WORLD_SIZE)]
    try:
        for rank, log in enumerate(logs):
            env = worker_environ(rank, port)
            with log.open("wb") as out:
                procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=out, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + JOB_TIMEOUT_S
        codes: list[int | None] = []
        for p in procs:
            try:
                codes.append(p.wait(max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                codes.append(None)  # killed below; reported with its log
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(STEP_TIMEOUT_S)
    return [(code, log.read_text(errors="replace")) for code, log in zip(codes, logs, strict=True)]


def assert_job_ok(results: list[tuple[int | None, str]]) -> None:
    for rank, (code, output) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{output}"
        assert f"WORKER-OK {rank}" in output


def after_a_job(script: Path, tmp_path: Path) -> Iterator[tuple[ServerProcess, list[bytes]]]:
    """The server of ``script`` once a gloo job of WORLD_SIZE ranks went through it, and the keys the job left."""
    served = ServerProcess(script)
    try:
        assert_job_ok(run_job(served.port, tmp_path, "attempt1"))
        yield served, served.keys()
    finally:
        served.stop()


@pytest.fixture(scope="module")
def first_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[bytes]]]:
    """One job for two tests (4 torch imports fewer): the bootstrap test reads the keys it left, the restart test
    resets the server and runs the second attempt."""
    tmp = tmp_path_factory.mktemp("first-job")
    script = tmp / "store_server.py"
    script.write_text(SERVER_SCRIPT)
    yield from after_a_job(script, tmp)


def test_gloo_job_bootstraps_through_the_store(first_job: tuple[ServerProcess, list[bytes]]) -> None:
    _, keys = first_job
    assert b"init/" in keys
    assert b"/default_pg/0//cpu//0/0" in keys


def test_restart_after_reset_sees_no_stale_keys(first_job: tuple[ServerProcess, list[bytes]], tmp_path: Path) -> None:
    server, keys = first_job
    assert keys, "attempt 1 should have left keys behind"
    server.reset()
    assert server.keys() == []
    assert_job_ok(run_job(server.port, tmp_path, "attempt2"))
