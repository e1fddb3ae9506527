"""``python -m rankrun.health`` run for real: real directories, real limits, real timeouts and kills.

There is no GPU here: a stand-in ``nvidia-smi`` (a shell script first on PATH, printing what a driver prints) and a
stand-in driver directory (``RANKRUN_HEALTH_PROC_ROOT``) are the seams, as a node's memory and cgroup files
(``RANKRUN_MEMROOM_ROOT``) are for ``--checkpoint-room``; the counting, parsing, timeouts, process
groups and exit codes are the command's own. A hung probe is made by a stand-in that never answers: it records its
PID and its child's, which must be gone after the command (killed with its process group).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PY, Reaper, alive, clean_environ, wait_gone
from sysfs import FakeLevel, FakeMemory

HEALTH = (PY, "-m", "rankrun.health")
PROC_ROOT_ENV = "RANKRUN_HEALTH_PROC_ROOT"
MEMROOM_ENV = "RANKRUN_MEMROOM_ROOT"
GiB = 1 << 30

EIGHT_GPUS = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-5d3e1c2a-0000-0000-0000-00000000000{i})\n" for i in range(8))
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.\n")


def _query(*actions: str) -> str:
    return f"Attached GPUs : {len(actions)}\n" + "".join(
        f"GPU 00000000:{18 + i:02X}:00.0\n    GPU Reset Status\n        Reset Required                    : No\n"
        f"    GPU Recovery Action                   : {action}\n" for i, action in enumerate(actions))


def _stand_in(bin_dir: Path, listing: str = EIGHT_GPUS, query: str | None = None, code: int = 0) -> Path:
    """An ``nvidia-smi`` printing ``listing`` for -L and ``query`` (8 healthy GPUs) for -q, exiting ``code``."""
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "L.txt").write_text(listing)
    (bin_dir / "q.txt").write_text(_query(*["None"] * 8) if query is None else query)
    script = bin_dir / "nvidia-smi"
    script.write_text(f'#!/bin/sh\ncase "$1" in -L) /bin/cat {bin_dir}/L.txt ;; -q) /bin/cat {bin_dir}/q.txt ;; esac\n'
                      f"exit {code}\n")
    script.chmod(0o755)
    return bin_dir


def _hanging_stand_in(bin_dir: Path, pid_dir: Path) -> tuple[Path, Path]:
    """An ``nvidia-smi`` that never answers: it starts a child, records both PIDs and its start, and waits."""
    bin_dir.mkdir(exist_ok=True)
    pids, starts = pid_dir / "nvidia-smi.pids", bin_dir / "starts"
    script = bin_dir / "nvidia-smi"
    script.write_text(f'#!/bin/sh\n/bin/sleep 600 &\necho "$! $$" >> {pids}\n'
                      f"read up _ < /proc/uptime\necho $up >> {starts}\nwait\n")
    script.chmod(0o755)
    return pids, starts


def _env(path: Path | None = None, **extra: str) -> dict[str, str]:
    env = clean_environ()
    env.pop("LOCAL_WORLD_SIZE", None)
    env["PATH"] = str(path) if path is not None else "/nonexistent"  # no real nvidia-smi, whatever the machine has
    env.update(extra)
    return env


def _run(*args: str, env: dict[str, str], limit: tuple[int, int] | None = None,
         timeout: float = 30) -> subprocess.CompletedProcess[str]:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, limit)  # type: ignore[arg-type]
    return subprocess.run([*HEALTH, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False,
                          preexec_fn=lower if limit else None)


def _lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return proc.stdout.splitlines()


def _read_pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _wait_pids(path: Path, count: int, timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(pids := _read_pids(path)) < count:
        assert time.monotonic() < deadline, f"the stand-in recorded {pids}, not {count} PIDs"
        time.sleep(0.01)
    return pids


def test_a_healthy_node_prints_nothing_and_exits_0(tmp_path):
    (tmp_path / "data").mkdir()
    proc = _run("--gpus", "8", "--paths", f"{tmp_path},{tmp_path / 'data'}", "--min-free", "1", "--log-dir",
                str(tmp_path), "--nofile", "64", env=_env(_stand_in(tmp_path / "bin"), LOCAL_WORLD_SIZE="8"))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_a_path_that_cannot_be_listed_is_named_with_its_error(tmp_path):
    missing, plain = tmp_path / "missing", tmp_path / "file"
    plain.write_text("")
    proc = _run("--paths", f"{missing},{tmp_path},{plain}", env=_env())
    assert proc.returncode == 1, proc
    assert _lines(proc) == [f"rankrun.health: path {missing}: No such file or directory",
                            f"rankrun.health: path {plain}: Not a directory"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root lists any directory")
def test_a_directory_without_read_permission_is_named(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o300)
    try:
        proc = _run("--paths", str(locked), env=_env())
    finally:
        locked.chmod(0o700)
    assert (proc.returncode, _lines(proc)) == (1, [f"rankrun.health: path {locked}: Permission denied"])


def _free(path: Path) -> tuple[int, int]:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize


def test_free_space_larger_than_the_disk_fails_and_one_byte_passes(tmp_path):
    _, total = _free(tmp_path)
    too_much = str(total + 1)
    proc = _run("--min-free", too_much, "--min-shm", "1", "--log-dir", str(tmp_path), env=_env())
    assert proc.returncode == 1, proc
    [line] = _lines(proc)
    assert line.startswith(f"rankrun.health: free-space: {tmp_path}: ") and line.endswith(" asked"), line
    assert _run("--min-free", "1", "--log-dir", str(tmp_path), env=_env()).returncode == 0


def test_free_space_is_checked_in_tmpdir_by_default(tmp_path):
    log_dir = tmp_path / "tmp"
    log_dir.mkdir()
    proc = _run("--min-free", str(_free(log_dir)[1] + 1), "--min-shm", "0", env=_env(TMPDIR=str(log_dir)))
    assert [line.split(": ")[2] for line in _lines(proc)] == [str(log_dir)]
    proc = _run("--min-free", "1", "--log-dir", str(tmp_path / "missing"), env=_env())
    assert _lines(proc) == [f"rankrun.health: free-space: {tmp_path / 'missing'}: does not exist"]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")
def test_free_space_in_dev_shm_is_checked_too(tmp_path):
    huge = str(_free(Path("/dev/shm"))[1] + 1)
    proc = _run("--min-free", "1", "--min-shm", huge, "--log-dir", str(tmp_path), env=_env())
    assert proc.returncode == 1, proc
    assert [line.split(": ")[2] for line in _lines(proc)] == ["/dev/shm"]
    proc = _run("--min-free", huge, "--log-dir", "/dev/shm", env=_env())  # --min-shm defaults to --min-free
    assert len(_lines(proc)) == 2, proc


@pytest.mark.parametrize(("soft", "local_world_size", "args", "needed"), [
    (320, "8", (), None),  # 64 + 32 x 8 = 320: exactly enough
    (319, "8", (), "320 (64 + 32 x LOCAL_WORLD_SIZE 8)"),
    (96, None, (), None),  # LOCAL_WORLD_SIZE unset counts as 1
    (95, None, (), "96 (64 + 32 x LOCAL_WORLD_SIZE, unset: 1)"),
    (99, "8", ("--nofile", "100"), "100 (--nofile)"),  # --nofile wins over the rule
    (99, "8", ("--nofile", "0"), None),  # 0: no check
])
def test_the_open_files_limit_against_what_the_node_needs(soft, local_world_size, args, needed):
    extra = {"LOCAL_WORLD_SIZE": local_world_size} if local_world_size else {}
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    proc = _run(*args, env=_env(**extra), limit=(soft, hard))
    if needed is None:
        assert (proc.returncode, proc.stdout) == (0, ""), proc
    else:
        shown = "unlimited" if hard == resource.RLIM_INFINITY else hard
        assert (proc.returncode, _lines(proc)) == (1, [
            f"rankrun.health: nofile: open-files limit {soft} (ulimit -n; hard limit {shown}), this node needs {needed}"])


def test_gpus_are_counted_by_nvidia_smi(tmp_path):
    env = _env(_stand_in(tmp_path / "bin"))
    assert _run("--gpus", "8", "--nofile", "0", env=env).returncode == 0
    proc = _run("--gpus", "9", "--nofile", "0", env=env)
    assert (proc.returncode, _lines(proc)) == (1, ["rankrun.health: gpus: 8 GPUs visible (nvidia-smi -L), 9 asked"])


def test_nvidia_smi_that_cannot_reach_the_driver_is_quoted(tmp_path):
    proc = _run("--gpus", "8", "--nofile", "0", env=_env(_stand_in(tmp_path / "bin", NO_DRIVER, NO_DRIVER, code=9)))
    reason = NO_DRIVER.strip()
    assert (proc.returncode, _lines(proc)) == (1, [
        f"rankrun.health: gpus: 0 GPUs visible (nvidia-smi -L exited 9: {reason}), 8 asked",
        f"rankrun.health: gpu-recovery: nvidia-smi -q exited 9: {reason}"])


def test_a_gpu_waiting_for_a_reset_fails_the_node(tmp_path):
    query = _query("None", "Reset", *["None"] * 6)
    proc = _run("--gpus", "8", "--nofile", "0", env=_env(_stand_in(tmp_path / "bin", query=query)))
    assert (proc.returncode, _lines(proc)) == (1, [
        "rankrun.health: gpu-recovery: GPU 00000000:13:00.0: recovery action Reset (nvidia-smi -q)"])


def test_without_nvidia_smi_gpus_are_the_drivers_entries(tmp_path):
    gpus = tmp_path / "proc" / "driver" / "nvidia" / "gpus"
    for bus in ("0000:18:00.0", "0000:2a:00.0"):
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text("Model: NVIDIA H100 80GB HBM3\n")
    env = _env(tmp_path / "empty", **{PROC_ROOT_ENV: str(tmp_path / "proc")})
    assert _run("--gpus", "2", "--nofile", "0", env=env).returncode == 0
    proc = _run("--gpus", "3", "--nofile", "0", env=env)
    assert (proc.returncode, _lines(proc)) == (1, [f"rankrun.health: gpus: 2 GPUs visible ({gpus}), 3 asked"])
    no_driver = _env(tmp_path / "empty", **{PROC_ROOT_ENV: str(tmp_path)})
    proc = _run("--gpus", "1", "--nofile", "0", env=no_driver)
    assert (proc.returncode, _lines(proc)) == (1, [
        "rankrun.health: gpus: no NVIDIA driver: nvidia-smi is not on PATH and "
        f"{tmp_path}/driver/nvidia/gpus does not exist (1 GPUs asked)"])
    assert _run("--gpus", "0", "--nofile", "0", env=no_driver).returncode == 0  # --gpus 0: a node without GPUs


def _node(root: Path, limit: int, used: int) -> str:
    """A node of 128 GiB whose job's memory cgroup (v2) has ``limit`` and ``used``: the memroom root."""
    return str(FakeMemory(128 * GiB, 100 * GiB, 2, "/job/step", {"job": FakeLevel(limit, used),
                                                                 "job/step": FakeLevel(None, used)}).write(root))


def test_the_checkpoint_room_is_judged_on_the_nodes_memory_cgroup(tmp_path):
    roomy = _env(**{MEMROOM_ENV: _node(tmp_path / "roomy", 64 * GiB, 10 * GiB)})
    assert _run("--checkpoint-room", "8G", "--nofile", "0", env=roomy).stdout == ""
    full = _env(**{MEMROOM_ENV: _node(tmp_path / "full", 64 * GiB, 60 * GiB)})
    proc = _run("--checkpoint-room", "8G", "--nofile", "0", env=full)
    assert (proc.returncode, _lines(proc)) == (1, [
        "rankrun.health: checkpoint-room: this node has 4.0 GiB of room (cgroup memory.max 64.0 GiB, 60.0 GiB used; "
        "6.4 GiB stays free for the workers' own growth), 8.0 GiB asked"])


def test_the_checkpoint_room_is_the_keepers_rule_to_the_byte(tmp_path):
    env = _env(**{MEMROOM_ENV: _node(tmp_path, 20 * GiB, 10 * GiB)})  # 10 GiB of room, 2 GiB of it stays free
    assert _run("--checkpoint-room", str(8 * GiB), "--nofile", "0", env=env).returncode == 0
    proc = _run("--checkpoint-room", str(8 * GiB + 1), "--nofile", "0", env=env)
    assert proc.returncode == 1, proc
    assert _lines(proc)[0].endswith("; 2.0 GiB stays free for the workers' own growth), 8.0 GiB asked")


def test_a_node_whose_memory_cannot_be_read_fails_the_room_check(tmp_path):
    proc = _run("--checkpoint-room", "1M", "--nofile", "0", env=_env(**{MEMROOM_ENV: str(tmp_path)}))
    assert (proc.returncode, _lines(proc)) == (1, [
        f"rankrun.health: checkpoint-room: {tmp_path}/proc/meminfo: No such file or directory"])


def test_every_failure_is_a_line_the_hardware_last(tmp_path):
    """A launcher quotes the last line as the node's reason: a GPU short says more than a setting."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    env = _env(_stand_in(tmp_path / "bin"), **{MEMROOM_ENV: _node(tmp_path / "node", 8 * GiB, 8 * GiB)})
    proc = _run("--gpus", "9", "--paths", str(tmp_path / "missing"), "--min-free", str(_free(tmp_path)[1] + 1),
                "--min-shm", "0", "--log-dir", str(tmp_path), "--nofile", "100", "--checkpoint-room", "1G", env=env,
                limit=(99, hard))
    assert proc.returncode == 1, proc
    assert [line.split(": ")[1] for line in _lines(proc)] == [
        "nofile", "free-space", "checkpoint-room", f"path {tmp_path / 'missing'}", "gpus"]


def test_a_hung_probe_is_killed_with_its_process_group_at_its_timeout(tmp_path, reaper: Reaper):
    pids, starts = _hanging_stand_in(tmp_path / "bin", reaper.watch_dir(tmp_path / "pids"))
    began = time.monotonic()
    proc = _run("--gpus", "8", "--paths", str(tmp_path / "missing"), "--timeout", "2.5", "--nofile", "0",
                env=_env(tmp_path / "bin"))
    took = time.monotonic() - began
    assert (proc.returncode, _lines(proc)) == (1, [
        f"rankrun.health: path {tmp_path / 'missing'}: No such file or directory",
        "rankrun.health: gpus: timed out after 2.5 s", "rankrun.health: gpu-recovery: timed out after 2.5 s"])
    recorded = _read_pids(pids)
    assert len(recorded) == 4, recorded  # nvidia-smi -L and -q, each with its child
    assert wait_gone(recorded, 0.5) == []  # killed at the timeout, not by their own backstop (at 5 s)
    # both hung at once: the probes ran concurrently, so the whole check took one timeout, not two
    first, second = sorted(float(t) for t in starts.read_text().split())
    assert second - first < 1.0, (first, second)
    assert took < 15, took


def test_a_probe_killed_before_it_answers_says_by_what(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nkill -9 $PPID\n")  # its probe's process dies, as by the OOM killer
    (bin_dir / "nvidia-smi").chmod(0o755)
    proc = _run("--gpus", "8", "--nofile", "0", env=_env(bin_dir))
    assert (proc.returncode, _lines(proc)) == (1, ["rankrun.health: gpus: ended by signal 9 before it answered",
                                                   "rankrun.health: gpu-recovery: ended by signal 9 before it answered"])


def _start_hung(tmp_path: Path, reaper: Reaper, timeout: str) -> tuple[subprocess.Popen[str], list[int]]:
    pids, _ = _hanging_stand_in(tmp_path / "bin", reaper.watch_dir(tmp_path / "pids"))
    proc = subprocess.Popen([*HEALTH, "--gpus", "8", "--timeout", timeout, "--nofile", "0"], env=_env(tmp_path / "bin"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    reaper.pids.add(proc.pid)
    return proc, _wait_pids(pids, 4)


def test_a_stop_signal_kills_every_probes_group_before_the_command_exits(tmp_path, reaper: Reaper):
    proc, pids = _start_hung(tmp_path, reaper, "20")
    assert [p for p in pids if alive(p)] == pids
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert (proc.returncode, out) == (128 + signal.SIGTERM, "rankrun.health: stopped by SIGTERM\n")
    assert wait_gone(pids, 5.0) == []  # long before the probes' own backstop (21 s)


def test_probes_orphaned_by_a_kill_end_their_own_groups(tmp_path, reaper: Reaper):
    proc, pids = _start_hung(tmp_path, reaper, "2")
    os.kill(proc.pid, signal.SIGKILL)  # as a launcher's --health-check-timeout kills the check's group
    proc.communicate(timeout=10)
    assert [p for p in pids if alive(p)] == pids  # nobody killed them: the command is gone
    assert wait_gone(pids, 10.0) == []  # their own timer did, at twice the timeout


@pytest.mark.parametrize(("args", "env", "named"), [
    (("--gpus", "-1"), {}, "--gpus '-1'"),
    (("--gpus", "eight"), {}, "--gpus 'eight'"),
    (("--min-free", "20X"), {}, "--min-free '20X'"),
    (("--min-free=-1G",), {}, "--min-free '-1G'"),
    (("--min-shm", "lots"), {}, "--min-shm 'lots'"),
    (("--timeout", "0"), {}, "--timeout '0'"),
    (("--timeout", "soon"), {}, "--timeout 'soon'"),
    (("--nofile", "-3"), {}, "--nofile '-3'"),
    (("--paths", ","), {}, "--paths ','"),
    (("--checkpoint-room", "8X"), {}, "--checkpoint-room '8X'"),
    (("--checkpoint-room=-1G",), {}, "--checkpoint-room '-1G'"),
    (("--bogus",), {}, "--bogus"),
    ((), {"LOCAL_WORLD_SIZE": "eight"}, "LOCAL_WORLD_SIZE 'eight'"),
])
def test_bad_input_is_one_line_naming_the_flag_and_value_and_exit_2(args, env, named):
    proc = _run(*args, env=_env(**env))
    assert (proc.returncode, proc.stdout) == (2, ""), proc
    [line] = proc.stderr.splitlines()
    assert line.startswith("rankrun.health: ") and named in line, line


def test_it_starts_without_json_asyncio_or_subprocess(tmp_path):
    env = _env(_stand_in(tmp_path / "bin"), **{MEMROOM_ENV: _node(tmp_path / "node", 64 * GiB, 0)})
    proc = subprocess.run([PY, "-X", "importtime", "-m", "rankrun.health", "--gpus", "8", "--paths", str(tmp_path),
                           "--min-free", "1", "--checkpoint-room", "1G"], env=env, capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 0, proc
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert {"rankrun.health.probes", "rankrun.memroom"} <= imported
    assert imported.isdisjoint({"json", "asyncio", "subprocess", "threading", "dataclasses"}), sorted(imported)
