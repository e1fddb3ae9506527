"""A private temp dir's owner stamp and the sweep of dead launchers' dirs (logs/stale.py, issue 37 part 0): the codec
and the decision as tables, the sweep on real directories against this machine's real /proc."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rankrun import procfs
from rankrun.logs import stale
from rankrun.logs.layout import RunLogs
from rankrun.logs.stale import Owner, Verdict, judge, parse_stamp, stamp_text
from rankrun.spec import LogSpec, Stream

ME = Owner(4242, 123456, "8d513b73-ec43-483c-a1b5-e84c9873e398", "pid:[4026531836]")


def test_a_stamp_reads_back_as_its_owner():
    assert stamp_text(ME) == "4242 123456 8d513b73-ec43-483c-a1b5-e84c9873e398 pid:[4026531836]\n"
    assert parse_stamp(stamp_text(ME)) == ME
    assert parse_stamp("1 0 b n\n") == Owner(1, 0, "b", "n")


@pytest.mark.parametrize("text", [
    "",
    "4242 123456 boot pid:[1]",  # no final newline: read while it was being written
    "4242 123456 boot\n",  # a field short
    "4242 123456 boot pid:[1] extra\n",  # a field too many
    "0 123456 boot pid:[1]\n",  # no process has pid 0
    "-5 123456 boot pid:[1]\n",
    "x 123456 boot pid:[1]\n",
    "4242 12.5 boot pid:[1]\n",
    "4242  123456 boot pid:[1]\n",  # fields are one space apart
    "4242 123456 boot pid:[1]\n\n",
    " 4242 123456 boot pid:[1]\n",
    "4242\t123456 boot pid:[1]\n",
])
def test_anything_but_one_whole_stamp_is_unparsable(text):
    assert parse_stamp(text) is None


@pytest.mark.parametrize(("owner", "starttime_now", "verdict"), [
    (ME, ME.starttime, Verdict.ALIVE),  # the owner still runs
    (ME, None, Verdict.DEAD),  # no process has its pid
    (ME, ME.starttime + 1, Verdict.DEAD),  # its pid is another process's now
    (ME, ME.starttime - 1, Verdict.DEAD),
    (dataclasses.replace(ME, boot_id="other"), ME.starttime, Verdict.OTHER_BOOT),
    (dataclasses.replace(ME, boot_id="other"), None, Verdict.OTHER_BOOT),  # its pid says nothing after a reboot
    (dataclasses.replace(ME, pidns="pid:[1]"), None, Verdict.OTHER_PIDNS),  # a container sharing /tmp
    (dataclasses.replace(ME, pidns="pid:[1]"), ME.starttime, Verdict.OTHER_PIDNS),
    (dataclasses.replace(ME, boot_id="other", pidns="pid:[1]"), None, Verdict.OTHER_BOOT),
    (dataclasses.replace(ME, pid=7), ME.starttime, Verdict.ALIVE),  # another launcher of this boot and namespace
    (dataclasses.replace(ME, pid=7), None, Verdict.DEAD),
    (None, None, Verdict.UNPARSABLE),
    (None, ME.starttime, Verdict.UNPARSABLE),
])
def test_only_a_dead_owner_of_this_boot_and_pid_namespace_is_dead(owner, starttime_now, verdict):
    assert judge(owner, ME, starttime_now) is verdict


def test_here_is_this_process_as_proc_shows_it():
    me = stale.here()
    assert me is not None
    assert me.pid == os.getpid()
    assert me.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert me.pidns == os.readlink("/proc/self/ns/pid")
    assert me.starttime == procfs.starttime(os.getpid())


@pytest.mark.parametrize("reader", ["starttime", "boot_id", "pid_namespace"])
def test_without_any_one_of_the_three_proc_says_nothing_and_a_launch_neither_stamps_nor_sweeps(
        reader, temp_root, monkeypatch):
    leftover = _dir(temp_root, "rankrun_none_dead", stamp_text(_dead_child()))
    monkeypatch.setattr(procfs, reader, lambda *_: None)  # e.g. a /proc mounted for another pid namespace
    assert stale.here() is None
    logs = RunLogs(_logs(), "job")
    assert logs.base is not None and not (logs.base / stale.STAMP).exists()
    assert leftover.exists()
    logs.finish()


_SAY_HERE = "from rankrun.logs import stale; me = stale.here(); print(me and me.pidns)"


def test_a_proc_that_does_not_show_this_pid_namespace_is_not_read_for_stamps():
    """In a new pid namespace with the old /proc (``unshare --pid`` without ``--mount-proc``) the pids /proc shows
    are not the process's own: no stamp, no sweep. With its own /proc mounted, its own namespace stamps."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"], capture_output=True,
                                         timeout=30, check=False).returncode != 0:
        pytest.skip("no pid namespaces for this user here")
    old_proc = subprocess.run([unshare, "--pid", "--fork", sys.executable, "-c", _SAY_HERE], capture_output=True,
                              text=True, timeout=30, check=True)
    own_proc = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", _SAY_HERE],
                              capture_output=True, text=True, timeout=30, check=True)
    assert old_proc.stdout == "None\n"
    assert own_proc.stdout.startswith("pid:[") and own_proc.stdout != f"{os.readlink('/proc/self/ns/pid')}\n"


def test_a_start_time_names_one_process_whatever_it_is_called(tmp_path):
    me = stale.here()
    assert me is not None
    named = tmp_path / "a) 1 2 (b"  # its command name, in parentheses in /proc/<pid>/stat, holds both and spaces
    named.symlink_to(sys.executable)
    child = subprocess.Popen([str(named), "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        started = procfs.starttime(child.pid)
        assert started is not None and started >= me.starttime  # ticks since boot: a later process, a later tick
        assert abs(started / os.sysconf("SC_CLK_TCK") - uptime) < 30  # started about now
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
    assert procfs.starttime(child.pid) is None  # reaped: gone


def _dir(root: Path, name: str, stamp: str | None) -> Path:
    path = root / name
    path.mkdir()
    (path / "attempt_0" / "0").mkdir(parents=True)
    if stamp is not None:
        (path / stale.STAMP).write_text(stamp)
    return path


def _dead_child() -> Owner:
    """A real process that has exited and been reaped, as a stamp named it while it ran."""
    me = stale.here()
    assert me is not None
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    started = procfs.starttime(child.pid)
    assert child.stdin is not None
    child.stdin.close()
    child.wait(timeout=30)
    assert started is not None
    return dataclasses.replace(me, pid=child.pid, starttime=started)


def test_the_sweep_removes_dead_owners_dirs_and_nothing_else(tmp_path):
    me = stale.here()
    assert me is not None
    dead = stamp_text(_dead_child())
    reused = stamp_text(dataclasses.replace(me, starttime=me.starttime + 1))  # our pid, another process's start
    gone = [_dir(tmp_path, "rankrun_none_0001", dead), _dir(tmp_path, "rankrun_job_0002", reused)]
    kept = [
        _dir(tmp_path, "rankrun_none_live", stamp_text(me)),
        _dir(tmp_path, "rankrun_none_pidns", stamp_text(dataclasses.replace(_dead_child(), pidns="pid:[1]"))),
        _dir(tmp_path, "rankrun_none_boot", stamp_text(dataclasses.replace(_dead_child(), boot_id="another-boot"))),
        _dir(tmp_path, "rankrun_none_older", None),  # an older rankrun's, or one kept on purpose
        _dir(tmp_path, "rankrun_none_torn", dead[:-1]),
        _dir(tmp_path, "other_none_0003", dead),  # not ours by name
    ]
    (tmp_path / "rankrun_file").write_text(dead)
    (tmp_path / "rankrun_link").symlink_to(tmp_path / "rankrun_none_target")
    kept.append(_dir(tmp_path, "rankrun_none_target", None))
    assert sorted(stale.sweep(tmp_path, me, os.getuid())) == sorted(gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*(p.name for p in kept), "rankrun_file", "rankrun_link"])
    assert all((p / "attempt_0" / "0").is_dir() for p in kept)


def test_the_sweep_leaves_another_users_dir(tmp_path):
    me = stale.here()
    assert me is not None
    path = _dir(tmp_path, "rankrun_none_theirs", stamp_text(_dead_child()))
    assert stale.sweep(tmp_path, me, os.getuid() + 1) == []
    assert (path / stale.STAMP).exists()


def test_a_stamp_that_is_a_fifo_or_unreadable_is_left_alone(tmp_path):
    me = stale.here()
    assert me is not None
    fifo = _dir(tmp_path, "rankrun_none_fifo", None)
    os.mkfifo(fifo / stale.STAMP)  # read without waiting for a writer
    binary = _dir(tmp_path, "rankrun_none_bytes", None)
    (binary / stale.STAMP).write_bytes(b"\xff\xfe 1 2\n")
    linked = _dir(tmp_path, "rankrun_none_link", None)
    (tmp_path / "elsewhere").write_text(stamp_text(_dead_child()))
    (linked / stale.STAMP).symlink_to(tmp_path / "elsewhere")  # not followed
    assert stale.sweep(tmp_path, me, os.getuid()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "rankrun_none_bytes", "rankrun_none_fifo",
                                                          "rankrun_none_link"]


def test_a_directory_the_sweep_cannot_remove_stays_and_the_sweep_goes_on(tmp_path, monkeypatch):
    me = stale.here()
    assert me is not None
    dead = stamp_text(_dead_child())
    first, second = _dir(tmp_path, "rankrun_none_1", dead), _dir(tmp_path, "rankrun_none_2", dead)
    real = stale.remove_tree

    def refused(path: Path) -> None:  # as a subfolder the user made read-only would refuse it (root is never refused)
        if path == first:
            raise PermissionError(13, "Permission denied", str(path))
        real(path)

    monkeypatch.setattr(stale, "remove_tree", refused)
    assert stale.sweep(tmp_path, me, os.getuid()) == [second]
    assert first.exists() and not second.exists()


def test_a_missing_temp_root_sweeps_nothing(tmp_path):
    me = stale.here()
    assert me is not None
    assert stale.sweep(tmp_path / "missing", me, os.getuid()) == []


def test_a_stamp_that_cannot_be_written_leaves_the_dir_unstamped(tmp_path):
    stale.stamp(tmp_path / "missing", ME)
    stale.unstamp(tmp_path / "missing")
    assert list(tmp_path.iterdir()) == []


def _logs(log_dir: Path | None = None, redirect: Stream = Stream.NONE) -> LogSpec:
    return LogSpec(log_dir, (redirect,), (Stream.NONE,), None, None)


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "TMPDIR"
    root.mkdir()
    monkeypatch.setenv("TMPDIR", str(root))
    return root


def test_a_private_dir_is_stamped_by_its_launcher_after_the_sweep(temp_root):
    leftover = _dir(temp_root, "rankrun_none_dead", stamp_text(_dead_child()))
    logs = RunLogs(_logs(), "job")
    assert logs.base is not None and logs.base.parent == temp_root and logs.base.name.startswith("rankrun_job_")
    assert not leftover.exists()
    assert parse_stamp((logs.base / stale.STAMP).read_text()) == stale.here()
    assert logs.finish() is None
    assert list(temp_root.iterdir()) == []


def test_a_private_dir_kept_on_purpose_carries_no_stamp(temp_root):
    wanted = RunLogs(_logs(redirect=Stream.BOTH), "job")  # -r 3: kept, its path announced
    assert wanted.base is not None and not (wanted.base / stale.STAMP).exists()
    assert wanted.finish() == wanted.base
    dumps = RunLogs(_logs(), "job")  # kept at the end for what it holds (Flight Recorder dumps)
    assert dumps.base is not None and (dumps.base / stale.STAMP).exists()
    assert dumps.finish(keep=True) == dumps.base
    assert not (dumps.base / stale.STAMP).exists()
    assert sorted(temp_root.iterdir()) == sorted([wanted.base, dumps.base])


def test_a_log_dir_of_the_users_is_neither_stamped_nor_a_reason_to_sweep(temp_root, tmp_path):
    leftover = _dir(temp_root, "rankrun_none_dead", stamp_text(_dead_child()))
    logs = RunLogs(_logs(tmp_path / "logs"), "job")
    assert logs.base is not None and logs.base.parent == tmp_path / "logs"
    assert not (logs.base / stale.STAMP).exists()
    assert logs.finish() == logs.base
    assert leftover.exists()
