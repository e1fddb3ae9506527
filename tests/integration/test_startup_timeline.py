"""The start-up timeline on real launchers: each attempt's ``startup`` event (schema-valid, via ``--events``) and its
console line, checked against what the workers themselves saw of their start (``rankrun.agent.startup``)."""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from conftest import RANKRUN, clean_environ, run_cli
from rankrun.agent.startup import line
from rankrun.events import schema_path
from rankrun.events.records import Startup

pytestmark = pytest.mark.usefixtures("private_tmpdir")

VALIDATOR = jsonschema.Draft202012Validator(json.loads(schema_path().read_text()))
LINE = re.compile(r"^rankrun: attempt 0 started in [0-9.]+ s: rendezvous [0-9.]+ s, spawn [0-9.]+ s, "
                  r"script p50 [0-9.]+ s / max [0-9.]+ s \(rank [01]\), store p50 [0-9.]+ s / max [0-9.]+ s$")
SLACK = 0.002  # seconds: the launcher reads the clock a few statements before or after the fact it times

# A worker that tells when its script began and when it talked to the store (before connecting, after the reply), then
# makes one TCPStore request as torch's client does (VALIDATE, then a PING), and waits for the test's word to end
# (its pid in argv[2], for the reaper).
STORE_WORKER = """\
import time
began = time.monotonic()  # first: what comes before it, after the shim, is the interpreter's own
import os, socket, struct, sys
with open(os.path.join(sys.argv[2], os.environ["RANK"]), "w") as fh:
    fh.write(str(os.getpid()))
before = time.monotonic()
s = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=30)
s.sendall(b"\\x00" + struct.pack("<I", 0x3C85F7CE) + b"\\x0dPING")
got = b""
while len(got) < 4:
    got += s.recv(4 - len(got))
after = time.monotonic()
out = os.path.join(sys.argv[1], os.environ["RANK"])
with open(out + ".tmp", "w") as fh:
    fh.write(f"{began} {before} {after}")
os.rename(out + ".tmp", out)
go = os.path.join(sys.argv[1], "go")
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.01)
"""


def read_events(path: Path) -> list[dict[str, Any]]:
    events = [json.loads(text) for text in path.read_text().splitlines()]
    for event in events:
        VALIDATOR.validate(event)
    return events


def _first_line_with(proc: subprocess.Popen[bytes], prefix: str, timeout: float) -> tuple[str, bytes]:
    """The launcher's first stderr line that starts with ``prefix`` within ``timeout``, and the bytes read so far."""
    assert proc.stderr is not None
    fd, got = proc.stderr.fileno(), b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sel.select(deadline - time.monotonic()):
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                got += chunk
                for text in got.decode(errors="replace").splitlines(keepends=True):
                    if text.startswith(prefix) and text.endswith("\n"):
                        return text.rstrip("\n"), got
    raise AssertionError(f"no line starting with {prefix!r} within {timeout} s; saw {got!r}")


def test_a_job_whose_workers_reach_the_store_says_its_start_up_once_in_a_line_and_an_event(tmp_path, reaper):
    worker = tmp_path / "worker.py"
    worker.write_text(STORE_WORKER)
    seen = tmp_path / "seen"
    seen.mkdir()
    pids = reaper.watch_dir(tmp_path / "pids")
    events = tmp_path / "events.jsonl"
    proc = subprocess.Popen([*RANKRUN, "--nproc-per-node", "2", "--events", str(events), str(worker), str(seen), str(pids)],
                            env=clean_environ(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        said, before = _first_line_with(proc, "rankrun: attempt 0 started", timeout=60)
        (seen / "go").write_text("")  # the line came while the workers ran: before the attempt ended
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err = (before + rest).decode()
    assert proc.returncode == 0, err
    assert LINE.match(said), said
    assert err.count("started in") == 1
    found = read_events(events)
    assert [e["event"] for e in found] == ["job.start", "rdzv.round", "workers.start", "startup", "workers.end", "job.end"]
    _, rdzv, started, startup, _, _ = found
    fact = Startup(**{k: v for k, v in startup.items() if k not in ("v", "event")})
    assert said == f"rankrun: {line(fact)}"  # the line says what the event says
    assert fact.attempt == 0 and fact.rendezvous == rdzv["seconds"]
    assert fact.script_slowest in (0, 1) and fact.store_slowest is None  # torch's clients do not say their rank
    assert fact.store_p50 is not None and fact.store_max is not None and fact.script_p50 is not None
    assert fact.script_max is not None
    assert 0 <= fact.script_p50 <= fact.script_max <= fact.store_max and fact.script_p50 <= fact.store_p50 <= fact.store_max
    assert fact.total == pytest.approx(fact.rendezvous + max(fact.spawn, fact.store_max), abs=2e-6)

    # the phases against what the workers saw, on the machine's one monotonic clock
    mine = {rank: [float(t) for t in (seen / str(rank)).read_text().split()] for rank in (0, 1)}
    began = started["mono"] - fact.spawn  # the spawn's start: workers.start is emitted as the last worker started
    slowest_up = began + fact.script_max
    assert began - SLACK <= slowest_up <= mine[fact.script_slowest][0] + SLACK  # up before its script's first line
    assert all(began - SLACK <= began + fact.script_p50 <= t[0] + SLACK for t in mine.values())
    assert min(t[1] for t in mine.values()) - SLACK <= began + fact.store_p50  # the store saw it after a worker asked,
    assert began + fact.store_max <= max(t[2] for t in mine.values()) + SLACK  # and before the last one had its reply


def test_a_no_python_job_has_no_script_phase_and_tells_its_start_up_as_an_event_at_its_end(tmp_path):
    events = tmp_path / "events.jsonl"
    done = run_cli("--nproc-per-node", "2", "--no-python", "--events", str(events), "true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "started in" not in done.stderr  # nothing reached the store: no line after the fact
    found = read_events(events)
    (startup,) = [e for e in found if e["event"] == "startup"]
    assert [e["event"] for e in found].index("startup") == [e["event"] for e in found].index("workers.end") - 1
    assert (startup["script_p50"], startup["script_max"], startup["script_slowest"]) == (None, None, None)
    assert (startup["store_p50"], startup["store_max"], startup["store_slowest"]) == (None, None, None)
    assert startup["total"] == pytest.approx(startup["rendezvous"] + startup["spawn"], abs=2e-6)
    assert 0 < startup["spawn"] < 30


def test_a_python_job_that_never_uses_the_store_still_has_each_ranks_script_phase(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("")
    events = tmp_path / "events.jsonl"
    done = run_cli("--nproc-per-node", "3", "--max-restarts", "1", "--events", str(events), str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "started in" not in done.stderr
    (startup,) = [e for e in read_events(events) if e["event"] == "startup"]
    assert startup["script_slowest"] in (0, 1, 2)
    assert 0 <= startup["script_p50"] <= startup["script_max"] < 30
    assert startup["store_p50"] is None and startup["store_max"] is None
    assert startup["total"] == pytest.approx(startup["rendezvous"] + max(startup["spawn"], startup["script_max"]), abs=2e-6)
