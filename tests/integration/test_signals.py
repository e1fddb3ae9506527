"""``--signals-to-handle`` is the exact set rankrun handles; every other signal keeps its inherited disposition."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import RANKRUN, alive, clean_environ, payload, wait_empty, wait_gone
from rankrun.proc.early import DEFAULT_SIGNALS, EarlyCatcher, requested_signals

pytestmark = pytest.mark.usefixtures("private_tmpdir")


def _masks(pid: int) -> tuple[int, int]:
    """(ignored, caught) signal masks of ``pid``, from /proc."""
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
    return int(fields["SigIgn"], 16), int(fields["SigCgt"], 16)


def _bit(signum: int) -> int:
    return 1 << (signum - 1)


def _start(tmp_path, reaper, *args: str, ignore_hup: bool) -> tuple[subprocess.Popen[bytes], int]:
    env = clean_environ() | {"TEST_PID_DIR": str(reaper.watch_dir(tmp_path / "pids"))}
    nohup = ["nohup"] if ignore_hup else []  # nohup: SIGHUP ignored, then exec (same pid)
    proc = subprocess.Popen([*nohup, *RANKRUN, *args], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    reaper.pids.add(proc.pid)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert "READY rank 0" in line, line
    return proc, int(line.split()[-1])


def test_nohup_ignored_sighup_is_left_alone_when_not_in_the_set(tmp_path, reaper):
    script = tmp_path / "w.py"
    script.write_text("import os, sys\nprint('READY rank 0 pid', os.getpid(), flush=True)\nsys.stdin.read()\nprint('finished')\n")
    env = clean_environ()
    proc = subprocess.Popen(["nohup", *RANKRUN, "--signals-to-handle=SIGTERM,SIGINT", str(script)], env=env, cwd=tmp_path,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    reaper.pids.add(proc.pid)
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline().decode()
    assert "READY rank 0" in line, line
    reaper.pids.add(int(line.split()[-1]))
    ignored, caught = _masks(proc.pid)
    assert ignored & _bit(signal.SIGHUP) and not caught & _bit(signal.SIGHUP)  # the kernel drops it: nohup works
    assert caught & _bit(signal.SIGTERM) and caught & _bit(signal.SIGINT)
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(input=b"", timeout=60)  # EOF on stdin: the worker finishes normally
    assert proc.returncode == 0, err
    assert out == b"finished\n"


def test_sighup_outside_the_set_keeps_its_default_action(tmp_path, reaper, private_tmpdir):
    proc, worker = _start(tmp_path, reaper, "--signals-to-handle=SIGTERM", payload("sigwait.py"), ignore_hup=False)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=30) == -signal.SIGHUP  # killed by it, as any program that does not handle it
    assert wait_gone([worker], 5.0) == []  # and the watchdog took the workers with it
    assert wait_empty(private_tmpdir, 5.0) == []  # and removed the private temp dir
    proc.communicate(timeout=30)


def test_a_signal_in_the_set_is_forwarded_even_if_it_was_ignored(tmp_path, reaper):
    proc, _ = _start(tmp_path, reaper, "--signals-to-handle=SIGHUP,SIGTERM", payload("sigwait.py"), ignore_hup=True)
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert b"GOT SIGHUP rank 0" in out


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, DEFAULT_SIGNALS),
        (["--signals-to-handle=SIGTERM,SIGUSR1", "t.py"], {}, (signal.SIGTERM, signal.SIGUSR1)),
        (["--signals_to_handle", "SIGINT", "t.py"], {}, (signal.SIGINT,)),
        (["--signals-to", "SIGINT"], {}, (signal.SIGINT,)),  # a unique prefix, as argparse accepts
        ([], {"PET_SIGNALS_TO_HANDLE": "SIGUSR2,SIGKILL,NOPE"}, (signal.SIGUSR2,)),
    ],
)
def test_early_reading_of_the_set(argv, env, expected):
    assert requested_signals(argv, env) == expected


def test_adopt_gives_an_ignored_signal_back_and_drops_what_came_early():
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        catcher = EarlyCatcher.install([signal.SIGUSR2])
        os.kill(os.getpid(), signal.SIGUSR2)
        assert catcher.pending == [signal.SIGUSR2]
        catcher.adopt([])
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
        assert catcher.pending == []
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_adopt_redelivers_an_early_signal_under_its_default_action(tmp_path):
    code = textwrap.dedent("""
        import os, signal
        from rankrun.proc.early import EarlyCatcher
        catcher = EarlyCatcher.install([signal.SIGUSR1, signal.SIGTERM])
        os.kill(os.getpid(), signal.SIGUSR1)   # arrives while the CLI is still parsing
        print("still here", flush=True)
        catcher.adopt([signal.SIGTERM])        # the parsed set does not have it: as if never caught
        print("not reached", flush=True)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == -signal.SIGUSR1
    assert res.stdout == "still here\n"


def test_a_signal_after_the_exit_code_is_chosen_changes_nothing():
    """Python's exit resets caught signals to their defaults: a repeated Ctrl-C then killed rankrun by SIGINT."""
    code = textwrap.dedent("""
        import os, signal, sys
        from rankrun.proc.early import EarlyCatcher
        catcher = EarlyCatcher.install([signal.SIGINT, signal.SIGTERM])
        catcher.settle()                       # what the entry point does once main() returned its code
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        sys.exit(130)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 130, res.stderr


def test_second_signal_message_says_killed(tmp_path, reaper):
    env = clean_environ() | {"PAYLOAD_IGNORE_TERM": "say", "TEST_PID_DIR": str(reaper.watch_dir(tmp_path / "pids"))}
    proc = subprocess.Popen([*RANKRUN, "--nproc-per-node", "2", payload("sigwait.py")], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    reaper.pids.add(proc.pid)
    assert proc.stdout is not None
    workers = []
    while len(workers) < 2:
        line = proc.stdout.readline().decode()
        assert "READY" in line, line
        workers.append(int(line.split()[-1]))
    proc.send_signal(signal.SIGTERM)  # forwarded, and ignored by the workers: they are still running
    ignored = [proc.stdout.readline().decode() for _ in workers]
    assert all("IGNORED SIGTERM" in line for line in ignored), ignored
    assert all(alive(w) for w in workers)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "received SIGTERM, then SIGINT: killed 2 worker(s) without waiting" in err.decode()
    assert "stopped them" not in err.decode()


def test_version():
    res = subprocess.run([*RANKRUN, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0
    from rankrun import __version__  # noqa: PLC0415

    assert res.stdout == f"rankrun {__version__}\n"


def test_sigint_outside_the_set_ends_rankrun_silently_with_its_default_action(tmp_path, reaper, private_tmpdir):
    proc, worker = _start(tmp_path, reaper, "--signals-to-handle=SIGTERM", payload("sigwait.py"), ignore_hup=False)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGINT
    assert err == b""  # no KeyboardInterrupt traceback
    assert wait_gone([worker], 5.0) == []
    assert wait_empty(private_tmpdir, 5.0) == []
