"""Real processes, real signals: supervision, signal forwarding, lifetime, cleanup. No torch."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import RANKRUN, alive, clean_environ, fresh_loopback, payload, run_cli, wait_empty, wait_gone
from rankrun import procfs
from rankrun.logs import stale
from rankrun.timeline.layout import failure_words
from rankrun.timeline.read import read_file

pytestmark = pytest.mark.usefixtures("private_tmpdir")


def _pids(pid_dir: Path, prefix: str) -> dict[str, int]:
    return {f.name: int(f.read_text()) for f in pid_dir.glob(f"{prefix}*") if not f.name.endswith(".tmp")}


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"])
def test_signal_is_forwarded_to_every_worker_and_sets_exit_code(launch, tmp_path, signame):
    run = launch("--nproc-per-node", "3", payload("sigwait.py"))
    run.wait_for(r"READY rank", count=3)
    sig = signal.Signals[signame]
    run.proc.send_signal(sig)
    rc = run.finish()
    assert rc == 128 + sig
    got = sorted(line for line in run.out if "GOT" in line)
    assert got == [f"[default{r}]:GOT {signame} rank {r}" for r in range(3)]
    assert any(f"received {signame}" in line for line in run.err)
    assert not wait_gone(list(_pids(tmp_path / "pids", "worker").values()), 5)


def test_worker_ignoring_sigterm_is_killed_after_shutdown_timeout(launch, tmp_path):
    env = clean_environ() | {"PAYLOAD_IGNORE_TERM": "1"}
    run = launch("--nproc-per-node", "2", "--shutdown-timeout", "2", payload("sigwait.py"), env=env)
    run.wait_for(r"READY rank", count=2)
    started = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    rc = run.finish()
    elapsed = time.monotonic() - started
    assert rc == 128 + signal.SIGTERM
    # the grace period was honoured (SIGKILL came after ~2 s, not at once and not after torchrun's 30 s)
    assert 1.5 <= elapsed < 20, elapsed
    assert not wait_gone(list(_pids(tmp_path / "pids", "worker").values()), 5)


def test_failure_teardown_uses_shutdown_timeout(launch, tmp_path):
    env = clean_environ() | {"PAYLOAD_IGNORE_TERM": "1", "PAYLOAD_EXIT_RANK": "1"}
    started = time.monotonic()
    run = launch("--nproc-per-node", "2", "--shutdown-timeout", "1", payload("sigwait.py"), env=env)
    rc = run.finish()
    assert rc == 1
    assert time.monotonic() - started < 20  # torchrun would wait its fixed 30 s here
    report = "\n".join(run.err)
    assert "rank 0 (local_rank 0" in report and "stopped by rankrun (signal 9 (SIGKILL))" in report


def test_kill_dash_nine_of_launcher_leaves_no_worker_or_group_descendant(launch, tmp_path, private_tmpdir):
    env = clean_environ() | {"PAYLOAD_CHILDREN": "1"}
    run = launch("--nproc-per-node", "3", payload("sigwait.py"), env=env)
    run.wait_for(r"READY rank", count=3)
    pid_dir = tmp_path / "pids"
    workers = _pids(pid_dir, "worker")
    children = _pids(pid_dir, "child")
    assert len(workers) == 3 and len(children) == 3
    assert all(alive(p) for p in [*workers.values(), *children.values()])
    run.proc.kill()
    run.finish()
    survivors = wait_gone([*workers.values(), *children.values()], timeout=2.0)
    assert survivors == [], f"outlived the launcher by 2 s: {survivors}"
    # A grandchild that left the worker's process group (setsid) is outside the guarantee after
    # kill -9 (docs/design.md); the reaper fixture kills it, so discard it from the leak check.
    assert wait_empty(private_tmpdir, 5.0) == []  # the watchdog removed the private temp dir too
    escaped = list(_pids(pid_dir, "setsid").values())
    for pid in escaped:
        os.kill(pid, signal.SIGKILL)
    assert wait_gone(escaped, timeout=5.0) == []


def test_background_children_are_cleaned_up_when_job_ends(launch, tmp_path):
    env = clean_environ() | {"PAYLOAD_CHILDREN": "1"}
    run = launch("--nproc-per-node", "2", payload("sigwait.py"), env=env)
    run.wait_for(r"READY rank", count=2)
    pid_dir = tmp_path / "pids"
    descendants = [*_pids(pid_dir, "child").values(), *_pids(pid_dir, "setsid").values()]
    assert len(descendants) == 4
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM
    # both the child in the worker's group and the one that escaped into its own session
    assert wait_gone(descendants, timeout=5.0) == []


def test_grandchildren_of_successful_workers_are_cleaned_up(tmp_path, reaper):
    script = tmp_path / "bg.py"
    script.write_text(
        "import os, subprocess\n"
        "p = subprocess.Popen(['sleep', '300'], start_new_session=os.environ['RANK'] == '1')\n"
        "open(os.path.join(os.environ['TEST_PID_DIR'], 'bg' + os.environ['RANK']), 'w').write(str(p.pid))\n"
    )
    pid_dir = reaper.watch_dir(tmp_path / "pids")
    res = run_cli("--nproc-per-node", "2", str(script), env=clean_environ() | {"TEST_PID_DIR": str(pid_dir)})
    assert res.returncode == 0, res.stderr
    assert wait_gone(list(_pids(pid_dir, "bg").values()), timeout=5.0) == []


def test_failure_stops_siblings_and_restarts_with_incremented_count(launch, tmp_path):
    env = clean_environ() | {"FAIL_RANK": "1", "FAIL_CODE": "7"}
    run = launch("--nproc-per-node", "3", "--max-restarts", "2", payload("exitcode.py"), env=env)
    rc = run.finish()
    assert rc == 1, run.err
    restarts = sorted({line.rsplit(" ", 1)[1] for line in run.out if "READY" in line})
    assert restarts == ["0", "1", "2"], (run.out, run.err)
    assert sum("restarting workers" in line for line in run.err) == 2
    assert "exit code 7" in "\n".join(run.err)
    assert not wait_gone(list(_pids(tmp_path / "pids", "w").values()), 5)


def test_worker_killed_by_signal_is_named_in_report(launch):
    env = clean_environ() | {"FAIL_RANK": "0", "FAIL_SIGNAL": str(int(signal.SIGSEGV))}
    run = launch("--nproc-per-node", "2", payload("exitcode.py"), env=env)
    assert run.finish() == 1
    report = "\n".join(run.err)
    assert "exit       : signal 11 (SIGSEGV)" in report
    assert "Signal 11 (SIGSEGV) received by PID" in report


def test_a_traceback_then_a_death_by_signal_names_both(tmp_path):
    # torch's worker that raises after init_process_group often dies by SIGABRT in its teardown: its traceback is the
    # failure, the signal how it ended; a traceback it handled long before (ConnectionError) is never blamed
    events = tmp_path / "events.jsonl"
    res = run_cli("--nproc-per-node", "1", "--max-restarts", "2", "--events", str(events), payload("abort_after_raise.py"))
    assert res.returncode == 1, res.stderr
    restarts = [line for line in res.stderr.splitlines() if "restarting workers" in line]
    assert len(restarts) == 2, res.stderr
    assert re.search(r"attempt 0 failed: rank 0 \(pid \d+\) was killed by signal 6 \(SIGABRT\): ValueError: bad lr in "
                     r"attempt 0; restarting", restarts[0])
    assert re.search(r"attempt 1 failed: rank 0 \(pid \d+\) was killed by signal 6 \(SIGABRT\); restarting", restarts[1])
    failures = [json.loads(line) for line in events.read_text().splitlines() if '"failure"' in line]
    assert [(f["attempt"], f["signal"], f["exit_code"], f["exception"]) for f in failures] == [
        (0, "SIGABRT", None, "ValueError: bad lr in attempt 0"), (1, "SIGABRT", None, None),
        (2, "SIGABRT", None, "ValueError: bad lr in attempt 2")]
    report = res.stderr[res.stderr.index("=" * 72):]
    assert "exit       : signal 6 (SIGABRT)" in report
    assert re.search(r"Signal 6 \(SIGABRT\) received by PID \d+ after ValueError: bad lr in attempt 2; its last stderr "
                     r"lines:\n +Traceback \(most recent call last\):\n", report)
    assert report.index("ValueError: bad lr in attempt 2\n") < report.index("terminate called without an active exception")
    assert "ConnectionError" not in report
    words = [failure_words(e) for e in read_file(str(events)) if e.name == "failure"]
    assert words == ["rank 0 killed by SIGABRT: ValueError: bad lr in attempt 0", "rank 0 killed by SIGABRT",
                     "rank 0 killed by SIGABRT: ValueError: bad lr in attempt 2"]


def test_success_requires_every_worker_to_exit_zero(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("import os, sys\nsys.exit(0 if os.environ['RANK'] != '2' else 4)\n")
    res = run_cli("--nproc-per-node", "3", str(script))
    assert res.returncode == 1
    assert "exit code 4" in res.stderr
    ok = run_cli("--nproc-per-node", "2", str(script))
    assert ok.returncode == 0, ok.stderr


def test_no_temporary_directory_leaks(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "ok.py"
    script.write_text("print('hi')\n")
    res = run_cli("--nproc-per-node", "2", str(script), env=clean_environ() | {"TMPDIR": str(tmp)})
    assert res.returncode == 0, res.stderr
    assert list(tmp.iterdir()) == []


def test_launcher_error_file_gets_root_cause(tmp_path):
    err_file = tmp_path / "launcher_error.json"
    script = tmp_path / "bad.py"
    script.write_text("import os\nif os.environ['RANK'] == '1':\n    raise KeyError('missing-thing')\n")
    res = run_cli("--nproc-per-node", "2", str(script), env=clean_environ() | {"TORCHELASTIC_ERROR_FILE": str(err_file)})
    assert res.returncode == 1
    data = json.loads(err_file.read_text())
    assert data["message"]["errorCode"] == 1
    assert "KeyError: 'missing-thing'" in data["message"]["extraInfo"]["py_callstack"]


def test_a_run_path_failure_is_the_scripts_as_in_a_plain_run(tmp_path):
    # --run-path runs the script inside rankrun's shim (runpy): the report, the error file and the console still show
    # the script's failure as `python script.py` does, from the script's own frame, with the script's name
    script = tmp_path / "bad.py"
    script.write_text("import os\n\n\ndef helper():\n    raise KeyError('missing-thing')\n\n\n"
                      "if os.environ['RANK'] == '1':\n    helper()\n")
    logs = tmp_path / "logs"
    shimmed = run_cli("--run-path", "--nproc-per-node", "2", "--log-dir", str(logs), str(script), cwd=tmp_path)
    plain = run_cli("--nproc-per-node", "2", str(script), cwd=tmp_path)
    assert (shimmed.returncode, plain.returncode) == (1, 1), shimmed.stderr
    assert f"rankrun: {script} FAILED (attempt 0)" in shimmed.stderr
    assert "runpy" not in shimmed.stderr and "run_path.py" not in shimmed.stderr, shimmed.stderr

    def quoted(stderr: str, source: str) -> str:  # the report's exception, as quoted
        return stderr.split(f"exception  : (from {source})\n")[1].split("\n---", maxsplit=1)[0]

    def console(stderr: str) -> list[str]:  # rank 1's lines on the console
        return [line for line in stderr.splitlines() if line.startswith("[default1]:")]

    assert quoted(shimmed.stderr, "error file") == quoted(plain.stderr, "stderr")
    assert quoted(plain.stderr, "stderr").startswith(f'    Traceback (most recent call last):\n      File "{script}", line 9')
    assert console(shimmed.stderr) == console(plain.stderr) != []
    recorded = json.loads(next(logs.glob("*/attempt_0/1/error.json")).read_text())["message"]
    assert recorded["message"] == "KeyError: 'missing-thing'"
    assert recorded["extraInfo"]["py_callstack"] == "\n".join(line[4:] for line in quoted(plain.stderr, "stderr").split("\n")) + "\n"


def test_single_node_c10d_holds_endpoint_and_uses_rdzv_id(tmp_path):
    import socket  # noqa: PLC0415

    script = tmp_path / "id.py"
    script.write_text("import os\nprint(os.environ['TORCHELASTIC_RUN_ID'], os.environ['MASTER_PORT'])\n")
    res = run_cli("--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-id", "job42", "--nproc-per-node", "2",
                  "--log-line-prefix-template", "", str(script))
    assert res.returncode == 0, res.stderr
    ids = {line.split()[0] for line in res.stdout.splitlines()}
    assert ids == {"job42"}
    with socket.socket() as held:  # a second job on a taken endpoint fails loudly instead of joining it
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        res = run_cli("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "j", str(script))
    assert res.returncode == 3
    assert f"cannot listen on 127.0.0.1:{port}" in res.stderr


def test_one_node_c10d_workers_store_is_on_an_os_chosen_port_not_the_endpoints(tmp_path):
    # docs/multinode.md: on one node the endpoint is only held; on several the host serves the store on its port
    # (test_multinode.py::test_dynamic_two_nodes_with_heterogeneous_slots)
    script = tmp_path / "p.py"
    script.write_text("import os\nprint(os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'])\n")
    addr = fresh_loopback()
    res = run_cli("--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addr}:29400", "--rdzv-id", "j", str(script))
    assert res.returncode == 0, res.stderr
    _, port = res.stdout.split()
    assert 0 < int(port) < 65536
    assert port != "29400"


def test_static_mode_binds_master_port_once_and_workers_get_the_bound_port(tmp_path):
    # --master-port 0: static mode (run id "none"), the OS picks the port once, workers are told it
    script = tmp_path / "p.py"
    script.write_text("import os\nprint(os.environ['MASTER_PORT'], os.environ['TORCHELASTIC_RUN_ID'])\n")
    res = run_cli("--master-port", "0", "--nproc-per-node", "2", "--log-line-prefix-template", "", str(script))
    assert res.returncode == 0, res.stderr
    (line,) = set(res.stdout.splitlines())
    port, run_id = line.split()
    assert run_id == "none"
    assert 0 < int(port) < 65536


def test_deep_orphans_holding_the_pipes_are_reaped_generation_by_generation(tmp_path, reaper):
    """A worker leaves a setsid'd shell (which keeps the worker's pipes) with its own child, and exits 0."""
    script = tmp_path / "deep.py"
    script.write_text(
        "import os, subprocess\n"
        "p = subprocess.Popen(['sh', '-c', \"setsid sh -c 'sleep 300 & echo $$ $!; wait' &\"], stdout=subprocess.PIPE)\n"
        "pids = p.stdout.readline().decode().split()\n"
        "open(os.path.join(os.environ['TEST_PID_DIR'], 'deep' + os.environ['RANK']), 'w').write(' '.join(pids))\n"
    )
    pid_dir = reaper.watch_dir(tmp_path / "pids")
    started = time.monotonic()
    res = run_cli("--nproc-per-node", "2", str(script), env=clean_environ() | {"TEST_PID_DIR": str(pid_dir)})
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # no drain stall warnings, no transport tracebacks
    assert time.monotonic() - started < 8  # not stuck waiting for the held pipes
    pids = [int(p) for f in pid_dir.glob("deep*") for p in f.read_text().split()]
    assert len(pids) == 4
    assert wait_gone(pids, timeout=5.0) == []


def test_kill_dash_nine_with_stderr_closed_still_kills_the_group(tmp_path, reaper, private_tmpdir):
    env = clean_environ() | {"PAYLOAD_CHILDREN": "1", "TEST_PID_DIR": str(reaper.watch_dir(tmp_path / "pids"))}
    cmd = f"exec {' '.join(RANKRUN)} --nproc-per-node 1 {payload('sigwait.py')} 2>&-"
    proc = subprocess.Popen(["sh", "-c", cmd], env=env, stdout=subprocess.PIPE, start_new_session=True)
    reaper.pids.add(proc.pid)
    try:
        assert proc.stdout is not None
        assert b"READY rank 0" in proc.stdout.readline()
        group = [*_pids(tmp_path / "pids", "worker").values(), *_pids(tmp_path / "pids", "child").values()]
        proc.kill()
        proc.wait(timeout=30)
        assert wait_gone(group, timeout=2.0) == []
        assert wait_empty(private_tmpdir, 5.0) == []
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
        escaped = list(_pids(tmp_path / "pids", "setsid").values())  # outside the kill -9 guarantee
        for pid in escaped:
            os.kill(pid, signal.SIGKILL)
        assert wait_gone(escaped, timeout=5.0) == []


def test_children_the_launcher_had_before_are_not_reaped(tmp_path, reaper):
    """`sidecar & exec rankrun ...` (a container entrypoint): the sidecar is not ours to kill."""
    script = tmp_path / "ok.py"
    script.write_text("print('ok')\n")
    cmd = f"sleep 300 >/dev/null 2>&1 & echo $! > {tmp_path}/sidecar; exec {' '.join(RANKRUN)} --nproc-per-node 2 {script}"
    res = subprocess.run(["sh", "-c", cmd], env=clean_environ(), capture_output=True, text=True, timeout=60, check=False)
    sidecar = int((tmp_path / "sidecar").read_text())
    reaper.pids.add(sidecar)
    assert res.returncode == 0, res.stderr
    assert alive(sidecar)
    os.kill(sidecar, signal.SIGKILL)
    assert wait_gone([sidecar], 5.0) == []


def test_interrupt_while_the_console_does_not_read(tmp_path, reaper):
    """stdout is a pipe nobody reads; stderr still flows (its own writer), and SIGINT ends the launcher."""
    script = tmp_path / "flood.py"
    script.write_text("import sys\nfor i in range(3000):\n    print('y' * 100)\nprint('DONE', file=sys.stderr, flush=True)\n")
    proc = subprocess.Popen([*RANKRUN, str(script)], env=clean_environ(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    reaper.pids.add(proc.pid)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline() == b"DONE\n"  # one rank: unprefixed; stderr is not held back by the stalled stdout
        assert _interrupt_until_it_exits(proc) == 128 + signal.SIGINT
    finally:
        _close(proc)


def test_interrupt_after_the_workers_exited_0_is_not_success(tmp_path, reaper):
    """Issue #11 6b, the interleaving the test above met under load: the worker has already exited 0 when SIGINT
    comes, and its output is still draining into a console that does not read. The drain took the signal and the
    attempt was then judged a success: exit 0. Whatever phase the signal lands in, an interrupted job is not a success.
    """
    script = tmp_path / "trickle.py"
    script.write_text(  # separate writes, so the launcher reads many chunks: more than its console queue holds
        "import os, sys, time\n"
        "for i in range(400):\n"
        "    os.write(1, b'y' * 999 + b'\\n')\n"
        "    time.sleep(0.0005)\n"
        "print('DONE', os.getpid(), file=sys.stderr, flush=True)\n"
    )
    proc = subprocess.Popen([*RANKRUN, str(script)], env=clean_environ(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    reaper.pids.add(proc.pid)
    try:
        assert proc.stderr is not None
        done, pid = proc.stderr.readline().split()
        assert done == b"DONE"
        assert wait_gone([int(pid)], 30.0) == []  # exited 0 before the signal: the order that used to lose it
        assert _interrupt_until_it_exits(proc) == 128 + signal.SIGINT
    finally:
        _close(proc)


def _interrupt_until_it_exits(proc: subprocess.Popen[bytes]) -> int | None:
    """SIGINT, again every half second (bounded): one that lands before the final flush does not abandon a console
    that does not read, so the launcher may need another. Returns its exit code, None if it never exited."""
    for _ in range(20):
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            continue
    return None


def _close(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(timeout=30)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _children(pid: int) -> set[int]:
    return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


@pytest.mark.parametrize("setpriv", [True, False], ids=["setpriv", "pre-exec-hook"])
def test_pdeathsig_alone_kills_the_workers_when_the_watchdog_is_gone_too(launch, tmp_path, private_tmpdir, setpriv):
    """Each lifetime layer on its own: with the watchdog killed first, PR_SET_PDEATHSIG must still end the workers,
    whether ``setpriv`` set it (found on PATH) or the pre-exec hook did (a PATH without it)."""
    env = clean_environ()
    if not setpriv:
        (tmp_path / "no-setpriv").mkdir()
        env["PATH"] = str(tmp_path / "no-setpriv")
    run = launch("--nproc-per-node", "2", payload("sigwait.py"), env=env)
    run.wait_for(r"READY rank", count=2)
    workers = set(_pids(tmp_path / "pids", "worker").values())
    (watchdog,) = _children(run.proc.pid) - workers
    os.kill(watchdog, signal.SIGKILL)
    assert wait_gone([watchdog], 5.0) == []
    assert all(alive(p) for p in workers)  # killing the watchdog alone ends nothing
    run.proc.kill()
    run.finish()
    assert wait_gone(sorted(workers), timeout=2.0) == [], "workers outlived the launcher without the watchdog"
    for leftover in private_tmpdir.iterdir():  # removing the private dir after kill -9 was the watchdog's job
        shutil.rmtree(leftover)


def test_a_launcher_killed_with_its_watchdog_leaves_a_dir_the_next_launch_removes(launch, tmp_path, private_tmpdir):
    """Issue 37, part 0: a SIGKILL to every process of the job's cgroup (scancel past KillWait, docker kill) takes the
    watchdog with the launcher, and nobody removes the private temp dir; the next launch's sweep does."""
    run = launch("--nproc-per-node", "1", payload("sigwait.py"))
    run.wait_for(r"READY rank", count=1)
    workers = set(_pids(tmp_path / "pids", "worker").values())
    (watchdog,) = _children(run.proc.pid) - workers
    # both, as a cgroup-wide kill does; the watchdog first, or it may see the launcher's end and clean up before its own
    for pid in (watchdog, run.proc.pid):
        os.kill(pid, signal.SIGKILL)
    run.finish()
    assert wait_gone([watchdog, *workers], timeout=5.0) == []
    (left,) = private_tmpdir.iterdir()
    assert left.name.startswith("rankrun_") and (left / stale.STAMP).exists()
    res = run_cli("--no-python", "true")
    assert res.returncode == 0, res.stderr
    assert list(private_tmpdir.iterdir()) == []


def _reaped_child() -> stale.Owner:
    """A real process that has exited and been reaped, as a stamp named it while it ran."""
    me = stale.here()
    assert me is not None
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    started = procfs.starttime(child.pid)
    assert child.stdin is not None
    child.stdin.close()
    child.wait(timeout=30)
    assert started is not None
    return stale.Owner(child.pid, started, me.boot_id, me.pidns)


def test_the_sweep_leaves_a_live_owners_another_namespaces_another_users_and_an_older_rankruns_dir(private_tmpdir):
    me = stale.here()
    assert me is not None
    dead = _reaped_child()
    stamps = {
        "rankrun_none_dead": stale.stamp_text(dead),  # the one the sweep removes
        "rankrun_none_live": stale.stamp_text(me),  # this test process still runs
        "rankrun_none_pidns": stale.stamp_text(stale.Owner(dead.pid, dead.starttime, me.boot_id, "pid:[1]")),
        "rankrun_none_theirs": stale.stamp_text(dead),  # another user's
        "rankrun_none_older": None,  # no stamp: an older rankrun's, or one kept on purpose
    }
    for name, text in stamps.items():
        (private_tmpdir / name / "attempt_0" / "0").mkdir(parents=True)
        if text is not None:
            (private_tmpdir / name / stale.STAMP).write_text(text)
    if os.getuid() == 0:  # only root can give a directory away; as another user, ours is "another user's" already
        os.chown(private_tmpdir / "rankrun_none_theirs", 12345, 12345)
    try:
        res = run_cli("--no-python", "true")
        assert res.returncode == 0, res.stderr
        left = sorted(p.name for p in private_tmpdir.iterdir())
        expected = ["rankrun_none_live", "rankrun_none_older", "rankrun_none_pidns"]
        assert left == sorted([*expected, *(["rankrun_none_theirs"] if os.getuid() == 0 else [])])
    finally:
        for leftover in private_tmpdir.iterdir():
            shutil.rmtree(leftover)
