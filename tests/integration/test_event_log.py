"""``--events PATH`` as the OS sees it: a FIFO nobody reads, one whose reader comes late or goes away, a regular file
two writers append to, the launcher's own stderr, a device that refuses writes — real FIFOs, real processes."""

from __future__ import annotations

import fcntl
import json
import math
import os
import select
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import jsonschema
import pytest

from conftest import PY, clean_environ
from rankrun.errors import UsageError
from rankrun.events import schema_path
from rankrun.events.log import EventLog, encode
from rankrun.events.records import JobEnd, RdzvRound, Record, WorkersStart
from rankrun.events.stream import EventStream

VALIDATOR = jsonschema.Draft202012Validator(json.loads(schema_path().read_text()))
BOUND = 30.0  # seconds any wait here may take on a loaded machine; nothing should come near it


def _event(i: int) -> Record:
    """Event ``i``: no shorter than any before it (the clocks fixed), so one a full pipe has no room for leaves none
    after it room either."""
    stream = EventStream("run-1", "127.0.0.1", wall=lambda: 1_767_225_600.5, monotonic=lambda: 812.25)
    return stream.emit(WorkersStart(attempt=i, ranks="0-7", pids=tuple(range(1000, 1008))))


def _unblocked(fn, *args):
    """Run ``fn`` in a thread: it must finish within BOUND (a write that blocks on a pipe never would)."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(fn(*args)), daemon=True)
    thread.start()
    thread.join(BOUND)
    assert not thread.is_alive(), f"{fn.__name__} blocked"
    return result[0]


def _lines(data: bytes, validate: bool = True) -> list[dict[str, object]]:
    assert data == b"" or data.endswith(b"\n"), "a line was cut"
    objs = [json.loads(line) for line in data.decode().splitlines()]
    for obj in objs if validate else ():
        VALIDATOR.validate(obj)
    return objs


def _child(code: str, **kwargs) -> subprocess.Popen[bytes]:
    return subprocess.Popen([PY, "-c", textwrap.dedent(code)], env=clean_environ(), **kwargs)


# A reader that is there from the moment it prints READY (a non-blocking open needs no writer), reads until the
# writer closes (or until it has argv[2] bytes, when given), and prints what it read.
READER = """
    import os, select, sys
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
    print("READY", flush=True)
    want = int(sys.argv[2]) if len(sys.argv) > 2 else None
    data = b""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while want is None or len(data) < want:
        if not poller.poll(30_000):
            sys.exit("no writer came")
        chunk = os.read(fd, 65536 if want is None else want - len(data))
        if not chunk:  # the writer closed
            break
        data += chunk
    sys.stdout.buffer.write(data)
"""


def _reader(fifo: Path, want: int | None = None) -> subprocess.Popen[bytes]:
    args = [PY, "-c", textwrap.dedent(READER), str(fifo), *([str(want)] if want is not None else [])]
    proc = subprocess.Popen(args, env=clean_environ(), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], BOUND)
    assert ready and proc.stdout.readline() == b"READY\n"
    return proc


def _finish(proc: subprocess.Popen[bytes]) -> bytes:
    with proc:
        out, _ = proc.communicate(timeout=BOUND)
    assert proc.returncode == 0
    return out


def test_a_fifo_nobody_reads_never_blocks_the_job_drops_and_counts_and_says_so_once(tmp_path):
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    said: list[str] = []
    log = EventLog.open(str(fifo), said.append)

    def write_all() -> None:
        for i in range(500):
            log.on_event(_event(i))
    _unblocked(write_all)
    assert (log.written, log.dropped) == (0, 500)
    assert said == []  # said once, at the end, with the count
    log.close()
    log.close()
    assert said == [f"rankrun: --events {fifo}: 500 events dropped (no reader, or it does not keep up)"]


def test_a_fifo_whose_reader_comes_late_gets_the_lines_from_then_on(tmp_path):
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    said: list[str] = []
    log = EventLog.open(str(fifo), said.append)
    for i in range(3):
        log.on_event(_event(i))  # nobody reads yet: dropped
    reader = _reader(fifo)
    for i in range(3, 6):
        log.on_event(_event(i))
    log.close()  # the reader sees the end
    got = _lines(_finish(reader))
    assert [obj["attempt"] for obj in got] == [3, 4, 5]
    assert (log.written, log.dropped) == (3, 3)
    assert said == [f"rankrun: --events {fifo}: 3 events dropped (no reader, or it does not keep up)"]


def test_a_reader_that_goes_away_is_no_signal_and_the_next_reader_gets_the_lines(tmp_path):
    """EPIPE, not SIGPIPE: in a fresh interpreter, as the launcher is, writing on after the reader left."""
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    writer = _child(f"""
        import sys
        from rankrun.events.log import EventLog
        from rankrun.events.records import WorkersEnd
        from rankrun.events.stream import EventStream
        log = EventLog.open({str(fifo)!r}, lambda line: print(line, file=sys.stderr))
        stream = EventStream("run-1", "127.0.0.1", [log])
        for line in sys.stdin:  # one event for each line the test sends
            stream.emit(WorkersEnd(attempt=int(line), outcome="succeeded"))
            print(log.written, log.dropped, flush=True)
        log.close()
    """, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert writer.stdin is not None and writer.stdout is not None

    def emit(i: int) -> str:
        writer.stdin.write(f"{i}\n".encode())
        writer.stdin.flush()
        ready, _, _ = select.select([writer.stdout], [], [], BOUND)
        assert ready, "the writer did not answer"
        return writer.stdout.readline().decode().strip()

    with writer:
        try:
            first = _reader(fifo, want=10)
            assert emit(0) == "1 0"
            assert _finish(first) == b'{"v":1,"ts'  # it read part of a line and went away: the rest is not read
            assert emit(1) == "1 1"  # EPIPE: dropped, and the writer lives on
            assert emit(2) == "1 2"  # no reader: dropped
            second = _reader(fifo)
            assert emit(3) == "2 2"
            writer.stdin.close()
            assert writer.wait(BOUND) == 0
            assert [o["attempt"] for o in _lines(_finish(second))] == [3]  # from a line's start: the pipe is new
            assert writer.stderr is not None
            said = writer.stderr.read().decode()
            assert said == f"rankrun: --events {fifo}: 2 events dropped (no reader, or it does not keep up)\n"
        finally:
            if writer.poll() is None:
                writer.kill()


def test_a_full_pipe_drops_whole_lines_and_never_cuts_one(tmp_path):
    """A reader that opened the FIFO and does not read: the pipe fills, the job goes on, the lines in it are whole."""
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    reader_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        size = fcntl.fcntl(reader_fd, fcntl.F_SETPIPE_SZ, 16384)  # whatever this machine's default is
        log = EventLog.open(str(fifo), lambda _: None)
        count = 3 * size // len(encode(_event(0)))  # three times what the pipe holds

        def write_all() -> None:
            for i in range(count):
                log.on_event(_event(i))
        _unblocked(write_all)
        assert log.dropped > 0
        assert log.written + log.dropped == count
        got = _lines(_drain(reader_fd))
        assert [o["attempt"] for o in got] == list(range(log.written))  # the first ones, whole, in order
        log.on_event(_event(count))  # room again
        assert log.written == len(got) + 1
        log.close()
        assert [o["attempt"] for o in _lines(_drain(reader_fd))] == [count]
    finally:
        os.close(reader_fd)


def _drain(fd: int) -> bytes:
    """All a pipe holds now (``fd``: its non-blocking read end)."""
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


def test_a_line_longer_than_a_pipe_takes_whole_is_dropped_on_a_pipe_and_written_to_a_file(tmp_path):
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    reader = _reader(fifo)
    log = EventLog.open(str(fifo), lambda _: None)
    long = b'{"x":"' + b"y" * select.PIPE_BUF + b'"}\n'
    log.write(long)
    log.write(b'{"x":1}\n')
    log.close()
    assert _finish(reader) == b'{"x":1}\n'
    assert (log.written, log.dropped) == (1, 1)
    file_log = EventLog.open(str(tmp_path / "events.jsonl"), lambda _: None)
    file_log.write(long)
    file_log.close()
    assert (tmp_path / "events.jsonl").read_bytes() == long


WRITER = """
    import sys
    from rankrun.events.log import EventLog
    from rankrun.events.records import WorkersEnd
    from rankrun.events.stream import EventStream
    log = EventLog.open(sys.argv[1], print)
    stream = EventStream("run-1", sys.argv[2], [log])
    events = [WorkersEnd(attempt=i, outcome="succeeded") for i in range(int(sys.argv[3]))]
    print("READY", flush=True)
    sys.stdin.readline()  # both start at once
    for event in events:
        stream.emit(event)
    log.close()
"""


def test_two_writers_append_to_one_file_line_by_line(tmp_path):
    """Two processes at once, each its own EventLog on the same file: every line whole, each writer's in order,
    what was there before kept."""
    path = tmp_path / "events.jsonl"
    path.write_text('{"before":1}\n')
    n = 5000
    writers = [subprocess.Popen([PY, "-c", textwrap.dedent(WRITER), str(path), node, str(n)], env=clean_environ(),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE) for node in ("127.0.0.1", "127.0.0.2")]
    try:
        for w in writers:
            assert w.stdout is not None and w.stdin is not None
            ready, _, _ = select.select([w.stdout], [], [], BOUND)
            assert ready and w.stdout.readline() == b"READY\n"
        for w in writers:
            w.stdin.write(b"go\n")
            w.stdin.flush()
        assert [w.wait(BOUND) for w in writers] == [0, 0]
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
            w.communicate(timeout=BOUND)
    data = path.read_bytes()
    assert data.startswith(b'{"before":1}\n')
    got = _lines(data[len(b'{"before":1}\n'):], validate=False)
    for node in ("127.0.0.1", "127.0.0.2"):
        assert [o["attempt"] for o in got if o["node"] == node] == list(range(n))
    assert len(got) == 2 * n
    VALIDATOR.validate(got[-1])


def test_a_new_file_is_created_and_an_existing_one_appended(tmp_path):
    path = tmp_path / "events.jsonl"
    for i in range(2):
        log = EventLog.open(str(path), lambda _: None)
        log.on_event(_event(i))
        log.close()
    assert [o["attempt"] for o in _lines(path.read_bytes())] == [0, 1]
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


STDERR_WRITER = """
    from rankrun.events.log import EventLog
    from rankrun.events.records import JobEnd, WorkersEnd
    from rankrun.events.stream import EventStream
    from rankrun.logs.console import Console
    console = Console()  # the launcher's, on fds 1 and 2, with its writer threads
    console.say("before")
    log = EventLog.open("/dev/stderr", print, console.write_blocking)
    stream = EventStream("run-1", "127.0.0.1", [log])
    stream.emit(WorkersEnd(attempt=0, outcome="succeeded"))
    console.say("between")
    stream.emit(JobEnd(exit_code=0, outcome="succeeded"))
    log.close()
    console.say("after")
    console.close()
"""


def _split(text: str) -> tuple[list[str], list[dict[str, object]]]:
    lines = text.splitlines()
    return [ln for ln in lines if ln.startswith("rankrun:")], _lines("".join(
        f"{ln}\n" for ln in lines if not ln.startswith("rankrun:")).encode())


def test_dev_stderr_of_a_child_whose_stderr_is_a_pipe():
    run = subprocess.run([PY, "-c", textwrap.dedent(STDERR_WRITER)], env=clean_environ(), capture_output=True,
                         timeout=BOUND, check=False)
    assert run.returncode == 0, run.stderr
    said, events = _split(run.stderr.decode())
    assert said == ["rankrun: before", "rankrun: between", "rankrun: after"]
    assert [o["event"] for o in events] == ["workers.end", "job.end"]
    assert run.stderr.decode().index("workers.end") < run.stderr.decode().index("between")


def test_dev_stderr_of_a_child_whose_stderr_is_a_file_keeps_the_order_and_overwrites_nothing(tmp_path):
    """stderr a file opened without O_APPEND: opening /dev/stderr anew would write from offset 0, over the
    launcher's own lines; the log shares the launcher's stderr instead."""
    out = tmp_path / "stderr.txt"
    with out.open("wb") as fh:
        run = subprocess.run([PY, "-c", textwrap.dedent(STDERR_WRITER)], env=clean_environ(), stderr=fh,
                             timeout=BOUND, check=False)
    text = out.read_text()
    assert run.returncode == 0, text
    lines = text.splitlines()
    assert [json.loads(ln)["event"] if ln.startswith("{") else ln for ln in lines] == [
        "rankrun: before", "workers.end", "rankrun: between", "job.end", "rankrun: after"]
    assert len(_split(text)[1]) == 2


@pytest.mark.parametrize(("path", "fd"), [("/dev/stdout", 1), ("/dev/stderr", 2)])
def test_the_launchers_own_stdout_and_stderr_are_written_by_its_console_alone(path, fd):
    """Each line is handed to the console's writer of that stream, at once and in order; nothing is opened."""
    given: list[tuple[int, bytes]] = []
    log = EventLog.open(path, print, lambda to, line: given.append((to, line)))
    for i in range(3):
        log.on_event(_event(i))
    assert [(to, json.loads(line)["attempt"]) for to, line in given] == [(fd, 0), (fd, 1), (fd, 2)]
    assert all(line.endswith(b"}\n") for _, line in given)
    log.close()
    log.on_event(_event(3))  # after the end: nothing
    assert (len(given), log.written, log.dropped, log._fd) == (3, 3, 0, -1)


def test_a_device_that_refuses_writes_is_counted_and_said_once():
    """/dev/full: every write is ENOSPC. The job goes on; the end says how many and why."""
    said: list[str] = []
    log = EventLog.open("/dev/full", said.append)
    for i in range(4):
        log.on_event(_event(i))
    log.close()
    assert (log.written, log.dropped) == (0, 4)
    assert said == ["rankrun: --events /dev/full: 4 events not written: No space left on device"]


def test_an_event_json_cannot_write_is_counted_and_the_next_is_written(tmp_path):
    said: list[str] = []
    path = tmp_path / "events.jsonl"
    log = EventLog.open(str(path), said.append)
    log.on_event(EventStream("r", "n").emit(RdzvRound(round=0, nodes=1, world_size=2, group_rank=0, seconds=math.nan)))
    log.on_event(_event(1))
    log.close()
    assert [o["attempt"] for o in _lines(path.read_bytes())] == [1]
    assert said == [f"rankrun: --events {path}: 1 event not written: RdzvRound: {_json_error(math.nan)}"]


def test_a_pipe_s_drops_and_an_event_json_cannot_write_are_said_apart(tmp_path):
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    said: list[str] = []
    log = EventLog.open(str(fifo), said.append)
    log.on_event(EventStream("r", "n").emit(RdzvRound(round=0, nodes=1, world_size=2, group_rank=0, seconds=math.inf)))
    log.on_event(_event(1))
    log.on_event(_event(2))
    log.close()
    assert (log.unread, log.failed, log.dropped) == (2, 1, 3)
    assert said == [f"rankrun: --events {fifo}: 2 events dropped (no reader, or it does not keep up); 1 event not "
                    f"written: RdzvRound: {_json_error(math.inf)}"]


def _json_error(value: float) -> str:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError as exc:
        return str(exc)
    raise AssertionError(value)


def test_nothing_is_said_when_every_event_was_written(tmp_path):
    said: list[str] = []
    log = EventLog.open(str(tmp_path / "events.jsonl"), said.append)
    log.on_event(EventStream("r", "n").emit(JobEnd(exit_code=0, outcome="succeeded")))
    log.close()
    log.on_event(_event(1))  # after the end: nothing, and no error
    assert said == []
    assert (log.written, log.dropped) == (1, 0)


@pytest.mark.parametrize(("name", "reason"), [("missing/events.jsonl", "No such file or directory"),
                                              (".", "Is a directory")])
def test_a_path_that_cannot_be_written_is_a_usage_error_naming_it(tmp_path, name, reason):
    path = str(tmp_path / name)
    with pytest.raises(UsageError) as caught:
        EventLog.open(path, print)
    assert str(caught.value) == f"--events {path!r}: {reason}"
    assert caught.value.exit_code == 2


def test_a_terminal_named_by_its_path_is_written_as_the_console_is():
    """Blocking, as the launcher's own console lines are (a terminal's XOFF holds both alike)."""
    controller, terminal = os.openpty()
    try:
        log = EventLog.open(os.ttyname(terminal), print)
        try:
            assert not fcntl.fcntl(log._fd, fcntl.F_GETFL) & os.O_NONBLOCK
            log.on_event(_event(7))
            assert json.loads(os.read(controller, 4096).decode())["attempt"] == 7
        finally:
            log.close()
    finally:
        os.close(terminal)
        os.close(controller)


def test_a_terminal_that_reads_nothing_never_holds_the_caller_and_gets_every_line_by_the_close():
    """A file or a terminal is written by the log's own thread: the job's loop hands a line on and goes on, however
    long the device blocks (here a terminal whose buffer is full, as under XOFF); ``close`` waits for all of it."""
    controller, terminal = os.openpty()
    try:
        log = EventLog.open(os.ttyname(terminal), print)
        count = 3000  # some 300 KB: many times what a terminal buffers
        events = [_event(i) for i in range(count)]

        def emit_all() -> None:
            for event in events:
                log.on_event(event)
        _unblocked(emit_all)
        got = bytearray()
        reader = threading.Thread(target=lambda: got.extend(_read_lines(controller, count)), daemon=True)
        reader.start()
        _unblocked(log.close)
        reader.join(BOUND)
        data = bytes(got).replace(b"\r\n", b"\n")
        assert data == b"".join(map(encode, events))  # every line whole, in order, byte for byte as encoded
        assert [o["attempt"] for o in _lines(data, validate=False)] == list(range(count))
        # the schema's: the lines differ only in their attempt, so the first and the last stand for all (the schema
        # validator takes ~3 ms a line, 8 under load: all 3000 took most of this test's 9 to 25 s)
        _lines(encode(events[0]) + encode(events[-1]))
        assert (log.written, log.dropped) == (count, 0)
    finally:
        os.close(terminal)
        os.close(controller)


def _read_lines(fd: int, count: int) -> bytes:
    """What a terminal's controller reads until ``count`` lines came, or BOUND seconds of silence."""
    data = b""
    while data.count(b"\n") < count and select.select([fd], [], [], BOUND)[0]:
        data += os.read(fd, 65536)
    return data


def test_the_log_is_not_inherited_by_the_workers(tmp_path):
    """A worker holding the FIFO's write end would keep its reader from ever seeing the end."""
    log = EventLog.open(str(tmp_path / "events.jsonl"), print)
    try:
        assert log._fd >= 0 and not os.get_inheritable(log._fd)
    finally:
        log.close()


def test_the_schema_ships_in_the_wheel(tmp_path):
    """schema_path() where rankrun is installed from its wheel (not this checkout): package data, declared."""
    root = Path(__file__).resolve().parents[2]
    src = tmp_path / "src"
    shutil.copytree(root / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    built = subprocess.run([PY, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
                            str(src)], env=clean_environ(), capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("rankrun-*.whl")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "zipfile", "-e", str(wheel), str(target)], check=True, timeout=60)
    env = clean_environ() | {"PYTHONPATH": str(target)}
    found = subprocess.run([PY, "-c", "import rankrun.events as e; print(e.schema_path()); print(e.__file__)"], env=env,
                           capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert found[0].startswith(str(target))
    assert json.loads(Path(found[0]).read_text())["title"] == "rankrun event, schema version 1"
