"""``rankrun --stacks [PID]``: the grouped report of a running job on request, without disturbing it."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import RANKRUN, clean_environ, fresh_loopback, payload, run_cli
from rankrun.stacks.control import answerer, name


def test_a_healthy_job_lists_every_rank_and_its_output_is_untouched(launch):
    run = launch("--nproc-per-node", "3", payload("stall.py"), env=clean_environ() | {"PAYLOAD_STALL": "tick"})
    run.wait_for(r"tick \d 3", count=3)
    asked = run_cli("--stacks", str(run.proc.pid))
    assert asked.returncode == 0, asked.stderr
    lines = asked.stdout.splitlines()
    assert re.match(r"rankrun: job \S+ stacks on request: \d+ distinct stacks? across 3 ranks$", lines[0])
    listed: set[int] = set()
    for spans in re.findall(r"^  ranks? ([\d,-]+) on ", asked.stdout, re.M):
        for span in spans.split(","):
            first, _, last = span.partition("-")
            listed.update(range(int(first), int(last or first) + 1))
    assert listed == {0, 1, 2}
    assert any("stall.py" in line for line in lines)
    assert re.search(r"s CPU since the last sample\):$", lines[1]), lines[1]  # CPU over a window, even at the first ask
    again = run_cli("--stacks", str(run.proc.pid))  # other launchers of this user may run here: name ours
    assert again.returncode == 0 and again.stdout.startswith("rankrun: job ")
    run.wait_for(r"tick \d 20", count=3)  # still ticking after two requests
    run.proc.send_signal(signal.SIGTERM)
    run.finish()
    worker_lines = [line for line in run.out if line.startswith("[default")]
    assert worker_lines and all(re.fullmatch(r"\[default\d\]:(READY rank \d|tick \d \d+)", line) for line in worker_lines)
    assert not any("most recent call first" in line or "rankrun-stacks" in line for line in run.out + run.err)


def _in_own_network_namespace() -> tuple[str, ...]:
    """A command prefix that runs it in a network namespace of its own (its abstract sockets are its own), with
    loopback up; skips where user namespaces cannot be made."""
    ip = shutil.which("ip")
    if shutil.which("unshare") is None or shutil.which("nsenter") is None or ip is None:
        pytest.skip("needs unshare, nsenter and iproute2")
    made = subprocess.run(["unshare", "-rn", ip, "link", "set", "lo", "up"], capture_output=True, timeout=30, check=False)
    if made.returncode != 0:
        pytest.skip("user and network namespaces cannot be made here")
    return ("unshare", "-rn", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh")


def test_without_a_pid_the_only_launcher_answers(launch):
    """No PID: this user's one launcher is asked. Alone means alone in its network namespace (where abstract
    socket names live), so other jobs on the machine cannot make it ambiguous."""
    run = launch("--nproc-per-node", "2", payload("stall.py"), env=clean_environ() | {"PAYLOAD_STALL": "tick"},
                 cmd=(*_in_own_network_namespace(), *RANKRUN))
    run.wait_for(r"tick \d 1", count=2)
    asked = subprocess.run(["nsenter", "--target", str(run.proc.pid), "--user", "--net", *RANKRUN, "--stacks"],
                           env=clean_environ(), capture_output=True, text=True, timeout=60, check=False)
    assert asked.returncode == 0, asked.stderr
    assert re.match(r"rankrun: job \S+ stacks on request: \d+ distinct stacks? across 2 ranks\n", asked.stdout)
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM


def test_without_a_pid_several_launchers_are_named_on_one_line_and_exit_2(launch):
    runs = [launch("--nproc-per-node", "1", payload("stall.py"), env=clean_environ() | {"PAYLOAD_STALL": "tick"})
            for _ in range(2)]
    for run in runs:
        run.wait_for(r"tick 0 1")
    asked = run_cli("--stacks")
    assert asked.returncode == 2 and asked.stdout == ""
    assert asked.stderr.startswith("rankrun: error: --stacks: which launcher? ") and asked.stderr.count("\n") == 1
    named = {int(p) for p in re.findall(r"\d+", asked.stderr.split(": ")[-1])}
    assert {run.proc.pid for run in runs} <= named  # ours among them, whatever else runs on this machine
    for run in runs:
        run.proc.send_signal(signal.SIGTERM)
        assert run.finish() == 128 + signal.SIGTERM


_SILENT_LAUNCHER = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(chr(0) + sys.argv[1] + str(os.getpid()))
s.listen(1)
print("READY", flush=True)
conn, _ = s.accept()
conn.recv(100)
if sys.argv[2] == "exit":
    os._exit(0)  # the job ended as it was asked: the connection closes with the process
conn.close()  # the job is ending: the answer is never written
sys.stdin.read()
"""


@pytest.mark.parametrize("how", ["exit", "close"])
def test_a_launcher_that_closes_without_answering_is_one_line_and_exit_2(how, reaper):
    """Once, ``rankrun --stacks`` printed nothing and exited 0: the launcher had taken the connection as its job
    ended. A report is never empty, so no answer at all says why instead."""
    prefix = name(0)[: -len("0")]  # @rankrun-<uid>- without the pid
    fake = subprocess.Popen([sys.executable, "-c", _SILENT_LAUNCHER, prefix, how], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    reaper.pids.add(fake.pid)
    try:
        assert fake.stdout is not None and fake.stdout.readline() == "READY\n"
        asked = run_cli("--stacks", str(fake.pid))
        assert asked.returncode == 2 and asked.stdout == ""
        why = "exited before it answered" if how == "exit" else "closed the connection without an answer"
        assert asked.stderr == f"rankrun: error: --stacks '{fake.pid}': the launcher {why} " \
                               f"({'its job ended' if how == 'exit' else 'its job is ending'})\n"
    finally:
        fake.kill()
        fake.communicate(timeout=30)


def test_a_launcher_waiting_for_its_rendezvous_says_so_with_its_job_id(launch):
    run = launch("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{fresh_loopback()}:29400", "--rdzv-id",
                 "lonely", "--nproc-per-node", "1", payload("stall.py"), env=clean_environ() | {"RANKRUN_RDZV_SECRET": "s"})
    said = "rankrun: job lonely: no workers are running right now: "
    deadline = time.monotonic() + 60
    while (asked := run_cli("--stacks", str(run.proc.pid))).stdout != said + "waiting for the rendezvous\n":
        # before it waits: its control socket not up yet, or joining the store
        assert asked.stdout in ("", said + "starting\n"), asked
        assert time.monotonic() < deadline, asked
    assert asked.returncode == 0
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM


def test_workers_exiting_while_asked_do_not_break_the_launcher(launch):
    run = launch("--nproc-per-node", "4", payload("stall.py"), env=clean_environ() | {"PAYLOAD_STALL": "exit"})
    run.wait_for("READY rank")  # the control socket is up before the first worker starts
    for _ in range(5):  # ranks 0-2 exit 0 at once, as the requests come
        assert run_cli("--stacks", str(run.proc.pid)).returncode == 0
    final = run_cli("--stacks", str(run.proc.pid))
    assert "in stuck_loading_data" in final.stdout
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM


def test_a_pid_that_is_not_a_launcher_is_one_line_and_exit_2():
    asked = run_cli("--stacks", str(os.getpid()))
    assert asked.returncode == 2
    assert asked.stderr == f"rankrun: error: --stacks '{os.getpid()}': not a rankrun launcher of this user on this machine\n"
    for args in (["--stacks", "abc"], ["--stacks", "1", "2"], ["--nproc-per-node", "2", "--stacks", "5", "x.py"]):
        bad = run_cli(*args)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--stacks" in bad.stderr


def test_a_socket_posing_as_another_pids_launcher_is_refused():
    """Whoever binds @rankrun-<uid>-<pid> first gets the name: the client checks the socket's owner is that pid."""
    victim = subprocess.Popen(["sleep", "60"])
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        impostor.bind("\0" + name(victim.pid))
        impostor.listen(1)
        asked = run_cli("--stacks", str(victim.pid))
        assert asked.returncode == 2
        assert "that socket does not belong to the launcher with this PID" in asked.stderr and asked.stdout == ""
    finally:
        impostor.close()
        victim.kill()
        victim.wait(timeout=30)


@pytest.mark.parametrize("launcher_uid", ["same", "other"])
def test_only_a_caller_of_the_launchers_uid_is_answered(launcher_uid):
    """The uid check on a real Unix socket pair (``SO_PEERCRED``), as any user: the caller is this process, and the
    launcher's side is told either this uid or another one; another uid's caller is sent away unanswered."""
    uid = os.getuid() if launcher_uid == "same" else os.getuid() + 1

    async def report() -> list[str]:
        return ["rankrun: job j stacks on request: ..."]

    async def main() -> bytes:
        launcher_side, caller_side = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        reader, writer = await asyncio.open_unix_connection(sock=launcher_side)
        serving = asyncio.create_task(answerer(report, uid)(reader, writer))
        caller_reader, caller_writer = await asyncio.open_unix_connection(sock=caller_side)
        try:
            async with asyncio.timeout(30):
                caller_writer.write(b"stacks\n")
                await caller_writer.drain()
                got = await caller_reader.read()
                await serving
        except (ConnectionResetError, BrokenPipeError):  # sent away before or after the request
            got = b""
        finally:
            caller_writer.close()
        return got

    got = asyncio.run(main())
    assert got == (b"rankrun: job j stacks on request: ...\n" if launcher_uid == "same" else b"")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to become another user")
def test_a_caller_of_another_uid_gets_nothing_from_the_launcher(launch):
    """The abstract namespace has no permissions: anyone can connect, so the launcher checks the caller's uid."""
    run = launch("--nproc-per-node", "1", payload("stall.py"), env=clean_environ() | {"PAYLOAD_STALL": "tick"})
    run.wait_for(r"tick 0 1")
    probe = ("import socket, sys\n"
             "s = socket.socket(socket.AF_UNIX); s.settimeout(30); s.connect(chr(0) + sys.argv[1])\n"
             "try:\n    s.sendall(b'stacks\\n'); print(s.recv(65536).decode() or 'closed')\n"
             "except (ConnectionResetError, BrokenPipeError):\n    print('closed')\n")  # closed before or after the request
    address = name(run.proc.pid)  # the abstract name, without its leading NUL (not allowed in argv)
    as_nobody = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable, "-c",
                                probe, address], capture_output=True, text=True, timeout=60, check=False)
    assert as_nobody.stdout == "closed\n", as_nobody  # it connected, and was sent away unanswered
    as_me = subprocess.run([sys.executable, "-c", probe, address], capture_output=True, text=True, timeout=60, check=False)
    assert "stacks on request" in as_me.stdout  # the same request from the launcher's own uid is answered
    run.proc.send_signal(signal.SIGTERM)
    run.finish()


def test_stacks_txt_is_left_in_a_ranks_log_folder_only_when_its_stacks_were_taken(launch, tmp_path):
    """The documented layout has no stacks.txt: one appears only where a dump was taken, holding it whole."""
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    quiet = run_cli("--nproc-per-node", "2", "--log-dir", str(tmp_path / "quiet"), str(script))
    assert quiet.returncode == 0, quiet.stderr
    assert len(list((tmp_path / "quiet").glob("*/attempt_0/[01]"))) == 2
    assert list((tmp_path / "quiet").rglob("stacks.txt")) == []
    run = launch("--nproc-per-node", "2", "--log-dir", str(tmp_path / "asked"), payload("stall.py"),
                 env=clean_environ() | {"PAYLOAD_STALL": "tick"})
    run.wait_for(r"tick \d 1", count=2)
    assert run_cli("--stacks", str(run.proc.pid)).returncode == 0
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM
    dumps = sorted((tmp_path / "asked").glob("*/attempt_0/*/stacks.txt"))
    assert [d.parent.name for d in dumps] == ["0", "1"]
    assert all("most recent call first" in d.read_text() for d in dumps)
