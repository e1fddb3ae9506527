"""The job's observers on a node (``rankrun.agent.observers``) in-process: ``--events`` written from ``job.start`` to
``job.end``, whatever ended the job, and closed; ``--metrics-port`` served once the node's address is known, announced
in one line, answering ``rankrun_up 1`` while the job runs and closed at its end; a port that is taken, or a log that
cannot be written, is the user's error naming the flag; torchelastic's lines and dcgm-exporter's files where asked
for."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path

import pytest

from rankrun.agent.facts import job_outcome
from rankrun.agent.observers import JobObservers
from rankrun.cli import spec_from_args
from rankrun.errors import UsageError
from rankrun.events.records import JobEnd, Record, WorkersStart
from rankrun.events.stream import EventStream
from rankrun.logs.console import Console
from rankrun.spec import LaunchSpec

BOUND = 30.0


def _spec(tmp_path: Path, *flags: str) -> LaunchSpec:
    script = tmp_path / "train.py"
    script.write_text("")
    return spec_from_args([*flags, str(script)], {"PATH": "/usr/bin:/bin"})


class Said:
    """The console as the observers write to it: the lines said on its stderr, kept in ``lines``."""

    stdout_fd, stderr_fd = 1, 2

    def __init__(self, lines: list[str] | None = None) -> None:
        self.lines = [] if lines is None else lines

    def write_blocking(self, fd: int, data: bytes) -> None:
        assert fd == self.stderr_fd and data.endswith(b"\n")
        self.lines.append(data.decode().removesuffix("\n"))


def _events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_event_log_holds_the_jobs_start_and_end_once(tmp_path):
    log = tmp_path / "events.jsonl"
    lines: list[str] = []

    async def main() -> None:
        observers = JobObservers(_spec(tmp_path, "--events", str(log)), EventStream("run-1", ""), Said(lines))
        observers.open()
        await observers.begin("127.0.0.2")
        await observers.begin("127.0.0.2")
        await observers.end(3)
        await observers.end(3)

    asyncio.run(asyncio.wait_for(main(), BOUND))
    found = _events(log)
    assert [(e["event"], e["node"]) for e in found] == [("job.start", "127.0.0.2"), ("job.end", "127.0.0.2")]
    assert found[1]["exit_code"] == 3
    assert found[1]["goodput"]["wall_s"] >= 0  # the account, always kept
    assert lines == []  # and no line: no workers ran, so no training to account for


def test_a_job_that_ends_before_its_address_is_known_still_starts_then_ends(tmp_path):
    log = tmp_path / "events.jsonl"

    async def main() -> None:
        observers = JobObservers(_spec(tmp_path, "--events", str(log)), EventStream("run-1", ""), Said())
        observers.open()
        await observers.end(1, error=True, node="node-4")

    asyncio.run(asyncio.wait_for(main(), BOUND))
    assert [(e["event"], e["node"]) for e in _events(log)] == [("job.start", "node-4"), ("job.end", "node-4")]


def test_an_event_log_that_cannot_be_written_names_the_flag(tmp_path):
    observers = JobObservers(_spec(tmp_path, "--events", str(tmp_path / "missing" / "e.jsonl")),
                             EventStream("run-1", ""), Said())
    with pytest.raises(UsageError, match="--events"):
        observers.open()


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    return data


@pytest.mark.parametrize("path", ["/dev/stdout", "/dev/stderr"])
def test_events_on_the_launchers_own_stdout_or_stderr_go_through_its_console_in_order_with_its_lines(tmp_path, path):
    """The console is the only writer of the launcher's stdout and stderr (here two pipes): an event's line is one of
    its lines, queued in order with the others."""
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    console = Console(out_w, err_w, merged=False)

    async def main() -> None:
        observers = JobObservers(_spec(tmp_path, "--events", path), EventStream("run-1", ""), console)
        observers.open()
        console.say("before")
        await observers.begin("127.0.0.2")
        console.say("between")
        await observers.end(0)
        console.say("after")

    try:
        asyncio.run(asyncio.wait_for(main(), BOUND))
        console.close()
    finally:
        os.close(out_w)
        os.close(err_w)
    out, err = _read_all(out_r).decode().splitlines(), _read_all(err_r).decode().splitlines()
    said = ["rankrun: before", "rankrun: between", "rankrun: after"]
    if path == "/dev/stdout":
        assert [json.loads(line)["event"] for line in out] == ["job.start", "job.end"]
        assert err == said
    else:
        assert out == []
        assert [json.loads(line)["event"] if line.startswith("{") else line for line in err] == [
            "rankrun: before", "job.start", "rankrun: between", "job.end", "rankrun: after"]


async def _scrape(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    body = await reader.read()
    writer.close()
    await writer.wait_closed()
    return body.decode()


def test_the_metrics_are_served_while_the_job_runs_and_closed_at_its_end(tmp_path):
    lines: list[str] = []

    async def main() -> None:
        observers = JobObservers(_spec(tmp_path, "--metrics-port", "0"), EventStream("run-1", ""), Said(lines))
        observers.open()
        await observers.begin("127.0.0.1")
        [line] = lines
        assert line.startswith("rankrun: metrics at http://127.0.0.1:") and line.endswith("/metrics")
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        assert '\nrankrun_up{run="run-1"} 1\n' in await _scrape(port)
        await observers.end(0)
        with pytest.raises(ConnectionRefusedError):
            await _scrape(port)

    asyncio.run(asyncio.wait_for(main(), BOUND))


def test_a_metrics_port_that_is_taken_names_the_flag(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        async def main() -> None:
            observers = JobObservers(_spec(tmp_path, "--metrics-port", str(port)), EventStream("run-1", ""),
                                     Said())
            observers.open()
            with pytest.raises(UsageError, match=f"--metrics-port.*{port}.*cannot listen on 127.0.0.1"):
                await observers.begin("127.0.0.1")

        asyncio.run(asyncio.wait_for(main(), BOUND))


class Recorded:
    def __init__(self) -> None:
        self.events: list[Record] = []

    def on_event(self, event: Record) -> None:
        self.events.append(event)


def test_the_job_ends_once_with_its_outcome(tmp_path):
    recorded = Recorded()

    async def main() -> None:
        observers = JobObservers(_spec(tmp_path), EventStream("run-1", "", [recorded]), Said())
        observers.open()
        await observers.begin("127.0.0.2")
        await observers.end(1, error=True)
        await observers.end(0)

    asyncio.run(asyncio.wait_for(main(), BOUND))
    assert [type(e).__name__ for e in recorded.events] == ["JobStart", "JobEnd"]
    end = recorded.events[1]
    assert isinstance(end, JobEnd) and (end.exit_code, end.outcome) == (1, job_outcome(1, True))


def test_torchelastics_lines_are_said_with_event_log_handler_console(tmp_path):
    lines: list[str] = []

    async def main() -> None:
        observers = JobObservers(_spec(tmp_path, "--event-log-handler", "console"), EventStream("run-1", ""),
                                 Said(lines))
        observers.open()
        await observers.begin("127.0.0.2")
        await observers.end(0)

    asyncio.run(asyncio.wait_for(main(), BOUND))
    assert [json.loads(line)["name"] for line in lines if line.startswith("{")] == ["torchelastic.worker.status.SUCCEEDED"]


def test_dcgms_files_are_written_as_the_workers_start_and_owned_by_the_watchdog(tmp_path):
    mapping = tmp_path / "dcgm"
    mapping.mkdir()
    owned: list[tuple[str, ...]] = []
    script = tmp_path / "train.py"
    script.write_text("")
    spec = spec_from_args(["--nproc-per-node", "2", str(script)],
                          {"PATH": "/usr/bin:/bin", "DCGM_HPC_JOB_MAPPING_DIR": str(mapping),
                           "CUDA_VISIBLE_DEVICES": "3,5"})

    async def main() -> list[str]:
        events = EventStream("run-1", "")
        observers = JobObservers(spec, events, Said(),
                                 (lambda path, content: owned.append((path, content)), lambda path: owned.append((path,))))
        observers.open()
        await observers.begin("127.0.0.2")
        events.emit(WorkersStart(0, "0-1", (101, 102)))
        written = sorted(p.name for p in mapping.iterdir())
        await observers.end(0)
        return written

    assert asyncio.run(asyncio.wait_for(main(), BOUND)) == ["3", "5"]
    assert list(mapping.iterdir()) == []  # gone with job.end
    assert owned == [(str(mapping / "3"), "run-1\n"), (str(mapping / "5"), "run-1\n"), (str(mapping / "3"),),
                     (str(mapping / "5"),)]
