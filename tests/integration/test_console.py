"""Console fidelity with real processes, on a real pseudo-terminal and on a pipe.

Progress bars move while they run, pdb and input() work on a terminal, stdout/stderr keep
their order, the failure report is last, bytes pass unchanged. Every wait is bounded and
synchronised on what the console shows (the progress worker does not draw its next state
until the test has seen the current one).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import RANKRUN, Reaper, clean_environ, payload, wait_gone
from ptyterm import PtyLauncher, awaiting_keys, reading

pytestmark = pytest.mark.usefixtures("private_tmpdir")

BAR = "=" * 72


@pytest.fixture
def pty_launch(tmp_path: Path, reaper: Reaper) -> Iterator[object]:
    started: list[PtyLauncher] = []

    def start(*args: str, env: dict[str, str] | None = None, rows: int = 30, cols: int = 100) -> PtyLauncher:
        e = clean_environ() if env is None else env
        e.setdefault("TEST_PID_DIR", str(reaper.watch_dir(tmp_path / "pids")))
        term = PtyLauncher([*RANKRUN, *args], e, tmp_path, rows=rows, cols=cols)
        reaper.pids.add(term.proc.pid)
        started.append(term)
        return term

    yield start
    for term in started:
        term.close()


def _pipe_launch(reaper: Reaper, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """rankrun with stdout and stderr on one pipe (``2>&1 | ...``)."""
    proc = subprocess.Popen([*RANKRUN, *args], env=env or clean_environ(), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    reaper.pids.add(proc.pid)
    return proc


# --------------------------------------------------------------------------- progress bars


def test_progress_bar_moves_on_a_terminal(pty_launch, tmp_path):
    acks = tmp_path / "acks"
    acks.mkdir()
    term = pty_launch("--nproc-per-node", "1", payload("progress.py"), "5", str(acks))
    seen = []
    for i in range(5):  # each state is on the screen while the worker waits: the bar moves as it runs
        term.wait_until(f"state {i}", lambda i=i: term.cursor_line() == f"rank0 step {i}/5")
        seen.append(term.cursor_line())
        (acks / f"0-{i}").touch()
    assert term.finish() == 0
    assert seen == [f"rank0 step {i}/5" for i in range(5)]
    assert [line for line in term.display() if line] == ["rank0 step 4/5"]  # redrawn in place, never scrolled


def test_progress_bar_moves_on_a_pipe(tmp_path, reaper):
    acks = tmp_path / "acks"
    acks.mkdir()
    proc = _pipe_launch(reaper, "--nproc-per-node", "1", payload("progress.py"), "5", str(acks), cwd=tmp_path)
    assert proc.stdout is not None
    got = b""
    for i in range(5):
        want = f"\rrank0 step {i}/5".encode()
        deadline = time.monotonic() + 30
        while not got.endswith(want):  # the partial line arrives while the worker still runs
            assert time.monotonic() < deadline, got
            got += os.read(proc.stdout.fileno(), 4096)
        (acks / f"0-{i}").touch()
    got += proc.stdout.read()
    proc.stdout.close()
    assert proc.wait(timeout=30) == 0
    assert got == b"".join(f"\rrank0 step {i}/5".encode() for i in range(5)) + b"\n"  # the worker's bytes, exactly


def test_progress_bar_keeps_its_prefix_with_several_ranks(pty_launch, tmp_path):
    acks = tmp_path / "acks"
    acks.mkdir()
    env = clean_environ() | {"PAYLOAD_QUIET_OTHERS": "1"}
    term = pty_launch("--nproc-per-node", "2", payload("progress.py"), "4", str(acks), env=env)
    for i in range(4):
        term.wait_until(f"state {i}", lambda i=i: term.cursor_line() == f"[default0]:rank0 step {i}/4")
        (acks / f"0-{i}").touch()
    assert term.finish() == 0
    assert "[default0]:rank0 step 3/4" in term.display()
    assert b"\r[default0]:rank0 step 1/4" in term.raw  # the prefix is repeated after each \r


# --------------------------------------------------------------------------- interactive workers


def test_a_single_worker_gets_a_terminal_with_input_resize_and_pdb(pty_launch):
    env = clean_environ() | {"PAYLOAD_PDB": "1"}
    term = pty_launch("--nproc-per-node", "1", payload("interactive.py"), env=env, rows=30, cols=100)
    term.wait_screen(r"^TTY True True True 100x30$")
    term.wait_screen(r"^name\?$")  # the prompt is shown before anything is typed
    term.send(b"ada\r")
    term.wait_screen(r"^hello ada$")
    (worker,) = _children_named(term.proc.pid, "interactive.py")

    def typed(keys: bytes) -> None:
        """Keys once pdb's readline reads them: typed while pdb still prints, the terminal (not yet in readline's
        mode) would echo an arrow as ^[[A, as a person typing ahead sees it too."""
        term.wait_until("pdb to wait for keys", lambda: awaiting_keys(worker), 30.0)
        term.send(keys)

    term.wait_screen(r"^\(Pdb\)$")
    typed(b"p value + 1\r")
    term.wait_screen(r"^42$")
    typed(b"p value * 2\r")
    term.wait_screen(r"^82$")
    typed(b"\x1b[A\x1b[A\r")  # arrow up twice: history recalls the first command
    term.wait_until("the recalled command's answer", lambda: term.display().count("42") == 2)
    term.send(b"c\r")
    term.wait_screen(r"^after pdb 41$")
    term.wait_screen(r"^wait for resize\?$")
    term.resize(20, 70)  # the window changes: the worker's terminal follows
    term.wait_screen(r"RESIZED 70x20")
    term.send(b"\r")
    assert term.finish() == 0
    assert "bye" in term.display()
    assert b"^[[A" not in term.raw and b"SyntaxError" not in term.raw
    assert term.modes_now() == term.initial_modes  # the user's terminal is as it was


def test_ctrl_c_on_an_interactive_worker_goes_through_the_launcher(pty_launch):
    term = pty_launch("--nproc-per-node", "1", payload("interactive.py"))
    term.wait_screen(r"^name\?$")
    (worker,) = _children_named(term.proc.pid, "interactive.py")
    # the prompt comes before input()'s read: a Ctrl-C in between is lost by Python itself (see ptyterm.reading)
    term.wait_until("the worker to read its terminal", lambda: reading(worker), 10.0)
    term.send(b"\x03")
    assert term.finish() == 128 + signal.SIGINT
    term.wait_screen(r"rankrun: received SIGINT: forwarded to 1 worker\(s\) and stopped them")
    assert term.modes_now() == term.initial_modes


def test_only_the_console_rank_gets_the_terminal_the_others_get_dev_null(pty_launch, tmp_path):
    script = tmp_path / "who.py"
    script.write_text("import os, sys\nprint(os.environ['RANK'], sys.stdin.isatty(), sys.stdout.isatty(), sys.stderr.isatty())\n"
                      "if os.environ['RANK'] != '1':\n    print('stdin', repr(sys.stdin.read()), file=sys.stderr)\n")
    logs = tmp_path / "logs"
    # ranks 0 and 2 are tee'd to files but filtered off the console; rank 1 is the only one on it
    term = pty_launch("--nproc-per-node", "3", "--local-ranks-filter", "1", "-t", "0:3,2:3", "--log-dir", str(logs), str(script))
    assert term.finish() == 0
    assert [line for line in term.display() if line] == ["1 True True True"]
    for rank in (0, 2):
        (rank_dir,) = logs.glob(f"*/attempt_0/{rank}")
        assert (rank_dir / "stdout.log").read_text() == f"{rank} False False False\n"
        assert (rank_dir / "stderr.log").read_text() == "stdin ''\n"  # /dev/null: no stolen keystrokes


def test_tee_on_the_console_rank_means_pipes_as_under_torchrun(pty_launch, tmp_path):
    script = tmp_path / "who.py"
    script.write_text("import sys\nprint(sys.stdin.isatty(), sys.stdout.isatty())\n")
    term = pty_launch("--nproc-per-node", "1", "-t", "3", "--log-dir", str(tmp_path / "logs"), str(script))
    assert term.finish() == 0
    assert "[default0]:True False" in term.display()  # stdin still the terminal, stdout captured for the file


# --------------------------------------------------------------------------- order and the report


def _lines(text: str) -> list[str]:
    """Lines as a terminal shows them (its line discipline turns \\n into \\r\\n, once per terminal on the way)."""
    return re.sub(r"\r+\n", "\n", text).split("\n")


def _check_order(text: str) -> None:
    lines = _lines(text)
    last_out = lines.index("out 19999")
    assert lines[: last_out + 1] == [f"out {i}" for i in range(20000)]
    assert lines[last_out + 1] == "STDERR-LINE"  # stderr after the stdout it followed
    first_bar = lines.index(BAR)
    assert "ValueError: the real error" in lines[last_out + 2 : first_bar]
    report = lines[first_bar:]
    assert report[-2:] == [BAR, ""]  # the report is the very end of the output
    assert not any(line.startswith("out ") for line in report)
    assert "    ValueError: the real error" in report


REPEATS = 10  # a race between the two pipes and the report: each run is a fresh draw (20 took 30 s on a terminal)


def test_report_is_last_and_stderr_follows_its_stdout_on_a_pipe(tmp_path, reaper):
    for _ in range(REPEATS):
        proc = _pipe_launch(reaper, payload("order.py"), cwd=tmp_path)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 1
        _check_order(out.decode())


def test_report_is_last_and_stderr_follows_its_stdout_on_a_terminal(pty_launch):
    for _ in range(REPEATS):
        term = pty_launch(payload("order.py"))
        assert term.finish() == 1
        _check_order(term.text())
        term.close()


@pytest.mark.parametrize("where", ["pipe", "terminal"])
def test_alternating_stdout_and_stderr_keep_their_order(where, tmp_path, reaper, pty_launch):
    if where == "pipe":
        proc = _pipe_launch(reaper, payload("alternate.py"), "3000", cwd=tmp_path)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        text = out.decode()
    else:
        term = pty_launch(payload("alternate.py"), "3000")
        assert term.finish() == 0
        text = term.text()
    lines = [line for line in _lines(text) if line]
    expected = [f"{s} {i}" for i in range(3000) for s in ("o", "e")]
    inversions = sum(1 for a, b in zip(lines, expected, strict=False) if a != b)
    assert inversions == 0
    assert lines == expected


# --------------------------------------------------------------------------- bytes pass unchanged


def _vm_hwm(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]


def test_a_50_mib_line_passes_unchanged_with_bounded_memory(tmp_path, reaper):
    size = 50 << 20
    ack = tmp_path / "ack"
    out_file = tmp_path / "out.bin"
    with out_file.open("wb") as out:
        proc = subprocess.Popen([*RANKRUN, "--nproc-per-node", "1", payload("bigline.py"), str(size), str(ack)],
                                env=clean_environ(), cwd=tmp_path, stdout=out, stderr=subprocess.PIPE, start_new_session=True)
        reaper.pids.add(proc.pid)
        assert proc.stderr is not None
        assert proc.stderr.readline() == b"WROTE\n"
        deadline = time.monotonic() + 60
        while out_file.stat().st_size < size and time.monotonic() < deadline:  # the launcher passed it all on
            time.sleep(0.01)
        peak = _vm_hwm(proc.pid)
        ack.touch()
        assert proc.wait(timeout=60) == 0
        proc.stderr.close()
    data = out_file.read_bytes()
    assert len(data) == size and b"\n" not in data  # no newline inserted, nothing cut or added
    assert data == _bigline(size)
    assert peak < 40 << 20, f"launcher peak RSS {peak >> 20} MiB while passing a 50 MiB line"


def test_a_50_mib_line_reaches_the_log_file_unchanged(tmp_path):
    size = 50 << 20
    ack = tmp_path / "ack"
    ack.touch()
    logs = tmp_path / "logs"
    res = subprocess.run([*RANKRUN, "--nproc-per-node", "1", "-r", "1", "--log-dir", str(logs), payload("bigline.py"), str(size),
                          str(ack)], env=clean_environ(), cwd=tmp_path, capture_output=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout == b""
    (log,) = logs.glob("*/attempt_0/0/stdout.log")
    assert log.read_bytes() == _bigline(size)


def _bigline(size: int) -> bytes:
    piece = (bytes(range(32, 127)) * ((1 << 20) // 95 + 1))[: 1 << 20]
    return (piece * (size // len(piece) + 1))[:size]


def test_one_rank_is_raw_and_several_are_prefixed(tmp_path):
    script = tmp_path / "dump.py"
    script.write_text('import json, os\nprint(json.dumps({"rank": int(os.environ["RANK"])}))\n')
    one = subprocess.run([*RANKRUN, "--nproc-per-node", "1", str(script)], env=clean_environ(), capture_output=True, timeout=60,
                         check=False)
    assert one.stdout == b'{"rank": 0}\n'  # `rankrun dump.py > out.json` gives torchrun's file
    two = subprocess.run([*RANKRUN, "--nproc-per-node", "2", str(script)], env=clean_environ(), capture_output=True, timeout=60,
                         check=False)
    assert sorted(two.stdout.splitlines()) == [b'[default0]:{"rank": 0}', b'[default1]:{"rank": 1}']
    forced = subprocess.run([*RANKRUN, "--nproc-per-node", "1", "--log-line-prefix-template", "<${rank}> ", str(script)],
                            env=clean_environ(), capture_output=True, timeout=60, check=False)
    assert forced.stdout == b'<0> {"rank": 0}\n'


def test_terminal_modes_are_restored_after_a_failure(pty_launch, tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("input('x? ')\nraise SystemExit('fatal: no config')\n")
    term = pty_launch(str(script))
    term.wait_screen(r"^x\?$")
    term.send(b"\r")
    assert term.finish() == 1
    assert term.modes_now() == term.initial_modes
    assert termios.tcgetattr(term.master)[3] & termios.ECHO
    term.wait_screen(r"^    fatal: no config$")  # the sys.exit message is the reported cause


def test_kill_dash_nine_during_an_interactive_run_restores_the_terminal(pty_launch, tmp_path):
    term = pty_launch("--nproc-per-node", "1", payload("interactive.py"))
    term.wait_screen(r"^name\?$")
    assert not termios.tcgetattr(term.master)[3] & termios.ECHO  # the relay holds the terminal in raw input mode
    workers = _children_named(term.proc.pid, "interactive.py")
    term.proc.kill()
    term.proc.wait(timeout=30)
    term.wait_until("the watchdog to restore the terminal", lambda: term.modes_now() == term.initial_modes, 10.0)
    assert wait_gone(workers, 5.0) == []


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2]


def test_ctrl_z_without_a_job_control_shell_does_nothing(pty_launch):
    """Nobody could resume a stopped job here (its process group is orphaned): the kernel would discard SIGTSTP too."""
    term = pty_launch("--nproc-per-node", "1", payload("interactive.py"))
    term.wait_screen(r"^name\?$")
    term.send(b"\x1a")
    term.send(b"zed\r")  # still running, still reading its terminal
    term.wait_screen(r"^hello zed$")
    assert _state(term.proc.pid) != "T"
    term.send(b"\r")
    assert term.finish() == 0


def test_ctrl_z_fg_and_bg_from_a_job_control_shell(tmp_path, reaper):
    env = clean_environ() | {"PS1": "$ ", "TEST_PID_DIR": str(reaper.watch_dir(tmp_path / "pids"))}
    shell = PtyLauncher(["bash", "--norc", "--noprofile", "-i"], env, tmp_path)
    reaper.pids.add(shell.proc.pid)
    try:
        shell.wait_screen(r"^\$$")
        for resume in ("fg", "bg"):
            _suspend_and_resume(shell, resume, tmp_path, reaper)
        shell.send(b"exit\r")
        assert shell.finish() == 0
    finally:
        shell.close()


def _suspend_and_resume(shell: PtyLauncher, resume: str, tmp_path: Path, reaper: Reaper) -> None:
    command = " ".join([*RANKRUN, "--nproc-per-node", "2", "--local-ranks-filter", "0", payload("job.py")])
    shell.send(command.encode() + b"\r")
    shell.wait_screen(r"^name\?$")
    (launcher,) = _children(shell.proc.pid)
    # rank 0 asked, but on a loaded machine rank 1 may still be between its fork and its exec (named as the launcher)
    shell.wait_until("both workers to run job.py", lambda: len(_children_named(launcher, "job.py")) == 2, 10.0)
    workers = _children_named(launcher, "job.py")
    reaper.pids.update([launcher, *workers])
    everyone = [launcher, *workers]
    shell.send(b"\x1a")
    shell.wait_until("the whole job to stop", lambda: {_state(p) for p in everyone} == {"T"}, 10.0)
    shell.wait_screen(r"Stopped")
    shell.send(resume.encode() + b"\r")
    shell.wait_until("the workers to go on", lambda: {_state(p) for p in workers} != {"T"}, 10.0)
    if resume == "bg":
        shell.send(b"echo shell-has-it\r")  # in the background the job leaves the terminal to the shell
        shell.wait_screen(r"^shell-has-it$")
        assert _state(launcher) != "T"  # not stopped by SIGTTIN
        shell.send(b"fg\r")
    shell.wait_until("the job to be in front again", lambda: _state(launcher) != "T", 10.0)
    shell.send(b"zed\r")  # typed into the worker's terminal again: raw mode is back
    shell.wait_screen(r"^hello zed$")
    shell.wait_until("the job to end", lambda: not Path(f"/proc/{launcher}").exists() or _state(launcher) == "Z", 30.0)
    (tmp_path / "pids" / "answered").unlink()
    shell.send(b"clear\r")
    shell.wait_until("a clear screen", lambda: not any("hello" in line for line in shell.display()), 10.0)


def _children_named(pid: int, name: str) -> list[int]:
    """Children running ``name`` (not the watchdog, a fork that shares the launcher's command line)."""
    own = Path(f"/proc/{pid}/cmdline").read_text()
    cmdlines = {p: Path(f"/proc/{p}/cmdline").read_text() for p in _children(pid)}
    return [p for p, cmd in cmdlines.items() if name in cmd and cmd != own]


def test_only_the_worker_terminal_processes_its_output(pty_launch, tmp_path):
    script = tmp_path / "rawout.py"
    script.write_text("import sys, tty\nprint('one', flush=True)\ntty.setraw(1)\nsys.stdout.write('abc\\ndef\\r\\n')\n")
    term = pty_launch(str(script))
    assert term.finish() == 0
    assert b"one\r\n" in term.raw and b"\r\r\n" not in term.raw  # \n became \r\n once, in the worker's terminal
    lines = term.display()
    at = lines.index("abc")
    assert lines[at + 1] == "   def"  # output processing off in the worker's terminal: a bare \n, as on a real one
    assert term.modes_now() == term.initial_modes
