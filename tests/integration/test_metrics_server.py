"""``rankrun.events.metrics.MetricsServer`` on a real socket: what a client gets over HTTP (urllib and raw sockets),
that a slow or silent client neither blocks another's answer nor stays open, the answer time while events are
folded in, and a real Prometheus (Debian's ``prometheus`` package) scraping it, asked through its HTTP API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import re
import shutil
import socket
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import Reaper
from rankrun.events import metrics as metrics_module
from rankrun.events.metrics import CONTENT_TYPE, Metrics, MetricsServer, url
from rankrun.events.records import Record, from_json

HOST = "127.0.0.1"
RUN = "job-7"
PROMETHEUS = shutil.which("prometheus")
WAIT = 60.0  # seconds any one wait may take on a loaded machine


def event(name: str, **keys: Any) -> Record:
    return from_json({"v": 1, "ts": 1.7e9, "mono": 1.0, "run": RUN, "node": HOST, "event": name, **keys})


def failing_job(nproc: int) -> list[Record]:
    """Attempt 0 of ``nproc`` workers fails at rank 1 and is stopped; no restart yet."""
    return [
        event("job.start", nproc_per_node=nproc, nnodes="1", max_restarts=1, rdzv_backend="c10d", entry="train.py"),
        event("rdzv.round", round=0, nodes=1, world_size=nproc, group_rank=0, seconds=0.1),
        event("workers.start", attempt=0, ranks=f"0-{nproc - 1}", pids=list(range(100, 100 + nproc))),
        event("failure", attempt=0, rank=1, host=HOST, exit_code=1, signal=None, exception="RuntimeError: boom"),
        event("workers.end", attempt=0, outcome="failed"),
    ]


def folded(events: list[Record]) -> Metrics:
    """The series of ``events``, on a clock that stands 2 s after them: the same events render the same text."""
    m = Metrics(monotonic=lambda: 3.0)
    for e in events:
        m.on_event(e)
    return m


def get(address: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """One request with urllib: status, headers, body (an error status too)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(address, method=method), timeout=WAIT) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read()


def raw(port: int, data: bytes) -> bytes:
    """What the server sends back for ``data`` on a raw connection, until it closes it."""
    with socket.create_connection((HOST, port), timeout=WAIT) as sock:
        sock.sendall(data)
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_get_metrics_over_a_real_socket() -> None:
    async def main() -> None:
        m = folded(failing_job(8))
        async with MetricsServer(m, HOST, 0) as server:
            assert server.port > 0
            status, headers, body = await asyncio.to_thread(get, url(HOST, server.port))
            assert status == 200
            assert headers["Content-Type"] == CONTENT_TYPE
            assert int(headers["Content-Length"]) == len(body)
            assert headers["Connection"] == "close"
            values = {(s.name, s.labels.get("state")): s.value
                      for f in text_string_to_metric_families(body.decode()) for s in f.samples}
            assert values[("rankrun_workers", "failed")] == 1
            assert values[("rankrun_workers", "stopped")] == 7
            assert values[("rankrun_up", None)] == 1

            m.on_event(event("restart", attempt=1, reason="a worker failed", restarts_left=0))  # served as it is now
            _, _, body = await asyncio.to_thread(get, url(HOST, server.port))
            assert b'rankrun_restarts_total{run="job-7"} 1\n' in body

            status, _, body = await asyncio.to_thread(get, f"http://{HOST}:{server.port}/")
            assert (status, body) == (404, b"404 Not Found\n")
            status, headers, _ = await asyncio.to_thread(get, url(HOST, server.port), "POST")
            assert (status, headers["Allow"]) == (405, "GET, HEAD")
            status, headers, body = await asyncio.to_thread(get, url(HOST, server.port), "HEAD")
            assert (status, body) == (200, b"")
            assert int(headers["Content-Length"]) == len(m.render())
            reply = await asyncio.to_thread(raw, server.port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000)
            assert reply.startswith(b"HTTP/1.1 431 ")
            reply = await asyncio.to_thread(raw, server.port, b"nonsense\r\n\r\n")
            assert reply.startswith(b"HTTP/1.1 400 ")
            assert server.open == set()
        assert await asyncio.to_thread(connect_refused, server.port)

    asyncio.run(main())


def connect_refused(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=WAIT).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_silent_client_does_not_hold_up_another_and_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    timeout = 2.0  # far above an answer's few milliseconds, even on a loaded machine
    monkeypatch.setattr(metrics_module, "TIMEOUT", timeout)

    async def main() -> None:
        async with MetricsServer(folded(failing_job(8)), HOST, 0) as server:
            before = time.monotonic()  # the silent clients' deadlines run from their connections, after this
            silent = await asyncio.to_thread(socket.create_connection, (HOST, server.port), WAIT)
            halfway = await asyncio.to_thread(socket.create_connection, (HOST, server.port), WAIT)
            with silent, halfway:
                halfway.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the empty line
                started = time.monotonic()
                status, _, _ = await asyncio.to_thread(get, url(HOST, server.port))
                took = time.monotonic() - started
                assert status == 200
                assert took < timeout, f"the answer waited {took:.2f} s, as if for the silent clients"
                assert len(server.open) == 2
                for sock in (silent, halfway):
                    sock.settimeout(timeout * 5)  # a server that never cuts them off fails here
                    assert await asyncio.to_thread(read_all, sock) == b""  # closed without an answer
                assert time.monotonic() - before >= timeout * 0.95  # by the deadline, not at once
                assert server.open == set()

    asyncio.run(main())


def test_connections_beyond_the_limit_are_turned_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_module, "MAX_CONNECTIONS", 2)

    async def main() -> None:
        async with MetricsServer(folded(failing_job(8)), HOST, 0) as server:
            held = [await asyncio.to_thread(socket.create_connection, (HOST, server.port), WAIT) for _ in range(2)]
            try:
                while len(server.open) < 2:  # the server has taken both (bounded by the test's timeout)
                    await asyncio.sleep(0.01)
                reply = await asyncio.to_thread(raw_unsent, server.port)
                assert reply.startswith(b"HTTP/1.1 503 ")
            finally:
                for sock in held:
                    sock.close()
            while server.open:
                await asyncio.sleep(0.01)
            status, _, _ = await asyncio.to_thread(get, url(HOST, server.port))
            assert status == 200

    asyncio.run(main())


def raw_unsent(port: int) -> bytes:
    """What the server says to a connection before it sends anything."""
    with socket.create_connection((HOST, port), timeout=WAIT) as sock:
        return read_all(sock)


def test_it_answers_within_50_ms_while_events_pour_in() -> None:
    """The median of 100 requests, while a 512-worker attempt fails and restarts again and again on the same loop."""

    async def main() -> list[float]:
        m = Metrics()
        async with MetricsServer(m, HOST, 0) as server:
            done = asyncio.Event()

            async def feed() -> None:
                while not done.is_set():
                    for e in [*failing_job(512), event("restart", attempt=1, reason="x", restarts_left=1)]:
                        m.on_event(e)
                        await asyncio.sleep(0)

            feeder = asyncio.create_task(feed())
            try:
                return await asyncio.to_thread(timed_gets, url(HOST, server.port), 100)
            finally:
                done.set()
                await feeder

    times = asyncio.run(main())
    median = statistics.median(times)
    print(f"GET /metrics: median {median * 1e3:.2f} ms, max {max(times) * 1e3:.2f} ms over {len(times)}")
    assert median < 0.050


def timed_gets(address: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        status, _, body = get(address)
        times.append(time.perf_counter() - started)
        assert status == 200
        assert body
    return times


@contextlib.contextmanager
def prometheus(tmp_path: Path, target: str, reaper: Reaper) -> Iterator[str]:
    """A real Prometheus scraping ``target`` every second; the address of its HTTP API. It binds port 0 and says
    which port it got in its log ("Listening on"), so nothing is probed; it is killed by PID at the end."""
    assert PROMETHEUS is not None
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "rankrun", "static_configs": [{"targets": [target]}]}],
    }))
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address={HOST}:0", "--log.level=info"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, cwd=tmp_path,
    )
    reaper.pids.add(proc.pid)  # killed below; the reaper checks it is gone
    lines: queue.Queue[str | None] = queue.Queue()
    log: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line.decode(errors="replace"))
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + WAIT
        port = None
        while (line := next_line(lines, deadline, log)) is not None:
            log.append(line)
            if found := re.search(rf'msg="Listening on" address={re.escape(HOST)}:(\d+)', line):
                port = found.group(1)
            if port is not None and 'msg="Server is ready to receive web requests."' in line:
                break  # its API answers queries from now on (503 before)
        else:
            raise AssertionError(f"prometheus ended before it was ready: {''.join(log)}")
        yield f"http://{HOST}:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)
        reader.join(WAIT)
        assert proc.stderr is not None
        proc.stderr.close()


def next_line(lines: queue.Queue[str | None], deadline: float, log: list[str]) -> str | None:
    try:
        return lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        raise AssertionError(f"prometheus was not ready within {WAIT:g} s: {''.join(log)}") from None


def query(api: str, expr: str) -> list[Record]:
    """The result of an instant query through Prometheus's HTTP API."""
    with urllib.request.urlopen(f"{api}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=WAIT) as reply:
        answer = json.load(reply)
    assert answer["status"] == "success", answer
    result: list[Record] = answer["data"]["result"]
    return result


def wait_for_value(api: str, expr: str, expected: str) -> dict[str, Any]:
    """Ask (bounded) until the query's one series has the value ``expected``: Prometheus scrapes every second."""
    deadline = time.monotonic() + WAIT
    result: list[Record] = []
    while time.monotonic() < deadline:
        result = query(api, expr)
        if len(result) == 1 and result[0]["value"][1] == expected:
            return result[0]
        time.sleep(0.2)
    raise AssertionError(f"{expr} never became {expected} within {WAIT:g} s: last {result}")


NO_SECONDS = dict.fromkeys(("productive", "waiting", "startup", "restart", "stall", "lost"), "0")


def job_seconds(api: str) -> dict[str, str]:
    """``rankrun_job_seconds_total`` as Prometheus stored it, by category."""
    found = query(api, "rankrun_job_seconds_total")
    assert all(set(s["metric"]) == {"__name__", "run", "job", "instance", "category"} for s in found), found
    return {s["metric"]["category"]: s["value"][1] for s in found}


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary: Debian's prometheus package is not installed "
                                                "(scripts/test and CI install it)")
def test_a_real_prometheus_scrapes_it(tmp_path: Path, reaper: Reaper) -> None:
    async def main() -> None:
        m = folded(failing_job(8))
        async with MetricsServer(m, HOST, 0) as server:
            with prometheus(tmp_path, f"{HOST}:{server.port}", reaper) as api:
                up = await asyncio.to_thread(wait_for_value, api, "rankrun_up", "1")
                assert up["metric"] == {"__name__": "rankrun_up", "run": RUN, "job": "rankrun",
                                        "instance": f"{HOST}:{server.port}"}
                await asyncio.to_thread(wait_for_value, api, 'up{job="rankrun"}', "1")  # the scrape is healthy
                [failed] = await asyncio.to_thread(query, api, 'rankrun_workers{state="failed"}')
                assert failed["value"][1] == "1"
                assert len(await asyncio.to_thread(query, api, '{__name__=~"rankrun_.*"}')) <= 60
                # the goodput account, from the same scrape: attempt 0 failed as it started, restarting for 2 s since
                assert await asyncio.to_thread(job_seconds, api) == {**NO_SECONDS, "restart": "2"}

                m.on_event(event("restart", attempt=1, reason="a worker failed", restarts_left=0))
                m.on_event(event("job.end", exit_code=1, outcome="failed"))
                await asyncio.to_thread(wait_for_value, api, "rankrun_restarts_total", "1")
                await asyncio.to_thread(wait_for_value, api, "rankrun_up", "0")
                # the final account has the job end where attempt 0 did, so no restart time: the counter keeps its 2 s
                assert await asyncio.to_thread(job_seconds, api) == {**NO_SECONDS, "restart": "2"}

    asyncio.run(main())
