"""Room for kept memory (``rankrun.memroom``): the rule (``fits``, its margin) and what it reads, from fake
``/proc`` and ``/sys/fs/cgroup`` trees laid out as the kernel writes them (cgroup v2, v1 on a hybrid system)."""

from __future__ import annotations

import pytest

from rankrun.memroom import (
    MARGIN_FLOOR,
    ROOT_ENV,
    Cgroup,
    Room,
    fits,
    format_size,
    margin,
    meminfo,
    memory_cgroup,
    read_here,
    read_room,
    room,
)
from sysfs import FakeLevel, FakeMemory

GiB = 1 << 30


def _read(tmp_path, memory: FakeMemory) -> Room:
    memory.write(tmp_path)
    return read_room(tmp_path / "proc", tmp_path / "sys/fs/cgroup")


def test_a_v2_cgroups_limit_and_usage_less_its_inactive_file_cache(tmp_path):
    memory = FakeMemory(128 * GiB, 100 * GiB, 2, "/slurm/uid_1000/job_7/step_0",
                        {"slurm/uid_1000/job_7/step_0": FakeLevel(64 * GiB, 60 * GiB, inactive_file=2 * GiB)})
    assert _read(tmp_path, memory) == Room(128 * GiB, 100 * GiB, Cgroup("memory.max", 64 * GiB, 58 * GiB))


def test_a_v1_cgroup_on_a_hybrid_system_counts_the_hierarchys_inactive_file(tmp_path):
    memory = FakeMemory(128 * GiB, 100 * GiB, 1, "/docker/abc",
                        {"docker/abc": FakeLevel(64 * GiB, 60 * GiB, inactive_file=GiB), "docker": FakeLevel(None, 0)})
    assert _read(tmp_path, memory) == Room(128 * GiB, 100 * GiB, Cgroup("memory.limit_in_bytes", 64 * GiB, 59 * GiB))


@pytest.mark.parametrize("version", [1, 2])
def test_a_cgroup_without_a_limit_limits_nothing(tmp_path, version):
    memory = FakeMemory(16 * GiB, 8 * GiB, version, "/user.slice/session-1.scope",
                        {"user.slice/session-1.scope": FakeLevel(None, 3 * GiB), "user.slice": FakeLevel(None, 3 * GiB)})
    assert _read(tmp_path, memory) == Room(16 * GiB, 8 * GiB, None)


@pytest.mark.parametrize("version", [1, 2])
def test_the_tightest_level_up_to_the_root_is_the_limit(tmp_path, version):
    name = "memory.limit_in_bytes" if version == 1 else "memory.max"
    levels = {"job/step": FakeLevel(None, 10 * GiB), "job": FakeLevel(32 * GiB, 30 * GiB),
              "": FakeLevel(100 * GiB, 40 * GiB)}  # the step has no limit; its job's 2 GiB of room is the least
    memory = FakeMemory(128 * GiB, 100 * GiB, version, "/job/step", levels)
    assert _read(tmp_path, memory).cgroup == Cgroup(name, 32 * GiB, 30 * GiB)
    roomier = {**levels, "job/step": FakeLevel(16 * GiB, 2 * GiB)}  # a smaller limit, more room: its job is tighter
    assert _read(tmp_path, FakeMemory(128 * GiB, 100 * GiB, version, "/job/step", roomier)).cgroup == Cgroup(
        name, 32 * GiB, 30 * GiB)
    tighter = {**levels, "job/step": FakeLevel(31 * GiB, 30 * GiB - GiB // 2)}  # 1.5 GiB of room, more used
    assert _read(tmp_path, FakeMemory(128 * GiB, 100 * GiB, version, "/job/step", tighter)).cgroup == Cgroup(
        name, 31 * GiB, 30 * GiB - GiB // 2)


def test_a_cgroup_not_under_the_mount_is_read_at_the_mounts_root(tmp_path):
    """A container without a cgroup namespace: /proc/self/cgroup names the host's path, the mount is its own."""
    memory = FakeMemory(128 * GiB, 100 * GiB, 2, "/system.slice/docker-abc.scope", {"": FakeLevel(8 * GiB, 5 * GiB)})
    assert _read(tmp_path, memory).cgroup == Cgroup("memory.max", 8 * GiB, 5 * GiB)


def test_no_memory_cgroup_or_none_mounted_limits_nothing(tmp_path):
    assert _read(tmp_path / "a", FakeMemory(16 * GiB, 8 * GiB, None)).cgroup is None
    unmounted = FakeMemory(16 * GiB, 8 * GiB, 2, "/job")  # no files under sys/fs/cgroup
    assert _read(tmp_path / "b", unmounted) == Room(16 * GiB, 8 * GiB, None)
    (tmp_path / "b/proc/self/cgroup").unlink()
    assert read_room(tmp_path / "b/proc", tmp_path / "b/sys/fs/cgroup") == Room(16 * GiB, 8 * GiB, None)


def test_usage_below_its_inactive_cache_is_none_used(tmp_path):
    memory = FakeMemory(16 * GiB, 8 * GiB, 2, "/j", {"j": FakeLevel(4 * GiB, GiB, inactive_file=2 * GiB)})
    assert _read(tmp_path, memory).cgroup == Cgroup("memory.max", 4 * GiB, 0)


def test_without_an_inactive_file_count_the_usage_is_all_used(tmp_path):
    memory = FakeMemory(16 * GiB, 8 * GiB, 2, "/j", {"j": FakeLevel(4 * GiB, GiB, inactive_file=GiB // 2)})
    stat = memory.write(tmp_path) / "sys/fs/cgroup/j/memory.stat"
    stat.write_text("anon 4096\nactive_file 0\n")
    assert read_room(tmp_path / "proc", tmp_path / "sys/fs/cgroup").cgroup == Cgroup("memory.max", 4 * GiB, GiB)
    stat.unlink()
    assert read_room(tmp_path / "proc", tmp_path / "sys/fs/cgroup").cgroup == Cgroup("memory.max", 4 * GiB, GiB)


def test_a_level_whose_files_are_garbage_is_passed_over(tmp_path):
    memory = FakeMemory(16 * GiB, 8 * GiB, 2, "/j/k", {"j/k": FakeLevel(4 * GiB, GiB), "j": FakeLevel(6 * GiB, GiB)})
    memory.write(tmp_path)
    (tmp_path / "sys/fs/cgroup/j/k/memory.current").write_text("lots\n")
    assert read_room(tmp_path / "proc", tmp_path / "sys/fs/cgroup").cgroup == Cgroup("memory.max", 6 * GiB, GiB)
    (tmp_path / "sys/fs/cgroup/j/memory.max").write_text("six\n")
    assert read_room(tmp_path / "proc", tmp_path / "sys/fs/cgroup").cgroup is None


def test_an_unreadable_meminfo_is_an_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_room(tmp_path / "proc", tmp_path / "sys/fs/cgroup")


def test_meminfo_in_kilobytes_and_free_memory_where_the_kernel_has_no_available():
    assert meminfo("MemTotal:  2048 kB\nMemFree:  512 kB\nMemAvailable: 1024 kB\nHugePages_Total:   0\n") == (
        2 << 20, 1 << 20)
    assert meminfo("MemTotal:  2048 kB\nMemFree:  512 kB\n\nCached: 1 kB\n") == (2 << 20, 512 << 10)
    assert meminfo("MemTotal: 100\nMemAvailable: 7\n") == (100, 7)  # no unit: bytes
    with pytest.raises(ValueError, match="/proc/meminfo says no MemTotal"):
        meminfo("MemFree: 1 kB\n")
    with pytest.raises(ValueError, match="says no MemAvailable"):
        meminfo("MemTotal: 1 kB\n")


@pytest.mark.parametrize(("text", "found"), [
    ("0::/user.slice/user-1000.slice\n", (2, "/user.slice/user-1000.slice")),
    ("0::/pod:a/b:c\n", (2, "/pod:a/b:c")),  # a cgroup's name may hold a colon
    ("12:pids:/\n4:memory:/docker/abc\n0::/\n", (1, "/docker/abc")),
    ("0::/\n5:cpu,memory,cpuacct:/job\n", (1, "/job")),  # a v1 memory line wins wherever it is
    ("4:cpu:/a\n1:name=systemd:/b\n", None),
    ("3:memoryless:/x\n0:cpu:/y\n", None),
    ("", None),
])
def test_the_memory_controllers_hierarchy_and_path(text, found):
    assert memory_cgroup(text) == found


def _cgroup_room(limit, used, available=1000 * GiB, total=1000 * GiB):
    return Room(total, available, Cgroup("memory.max", limit, used))


def test_the_margin_is_a_tenth_of_what_the_job_may_use_and_at_least_1_gib():
    assert margin(Room(64 * GiB, 60 * GiB, None)) == int(6.4 * GiB)
    assert margin(Room(8 * GiB, 6 * GiB, None)) == MARGIN_FLOOR == GiB
    assert margin(_cgroup_room(20 * GiB, 0)) == 2 * GiB  # the cgroup's limit, not the machine's 1000 GiB
    assert margin(_cgroup_room(2000 * GiB, 0)) == 100 * GiB  # a limit above the machine: the machine
    assert margin(Room(11 * GiB, 0, None)) == int(1.1 * GiB)


def test_the_room_is_the_smaller_of_memavailable_and_the_cgroups():
    assert room(Room(64 * GiB, 10 * GiB, None)) == 10 * GiB
    assert room(_cgroup_room(64 * GiB, 60 * GiB)) == 4 * GiB
    assert room(_cgroup_room(64 * GiB, 10 * GiB, available=3 * GiB)) == 3 * GiB


def test_what_fits_is_the_room_less_the_margin_to_the_byte():
    facts = _cgroup_room(20 * GiB, 10 * GiB)  # 10 GiB of room, 2 GiB kept free
    assert fits(facts, 8 * GiB) is None
    assert fits(facts, 8 * GiB + 1) == ("this node has 10.0 GiB of room (cgroup memory.max 20.0 GiB, 10.0 GiB used; "
                                        "2.0 GiB stays free for the workers' own growth)")


def test_memavailable_is_named_when_it_is_the_smaller():
    facts = _cgroup_room(64 * GiB, 10 * GiB, available=3 * GiB, total=32 * GiB)
    assert fits(facts, 3 * GiB) == ("this node has 3.0 GiB of room (MemAvailable, MemTotal 32.0 GiB; 3.2 GiB stays "
                                    "free for the workers' own growth)")
    assert fits(Room(16 * GiB, 2 * GiB, None), GiB + 1) == (
        "this node has 2.0 GiB of room (MemAvailable, MemTotal 16.0 GiB; 1.6 GiB stays free for the workers' own "
        "growth)")
    assert fits(Room(16 * GiB, 2 * GiB, None), 2 * GiB - int(1.6 * GiB)) is None
    assert fits(_cgroup_room(64 * GiB, 10 * GiB, available=54 * GiB), 60 * GiB) is not None
    assert "MemAvailable" in fits(_cgroup_room(64 * GiB, 10 * GiB, available=54 * GiB), 60 * GiB)


def test_growing_by_nothing_always_fits_and_a_full_cgroup_shows_no_room():
    full = _cgroup_room(8 * GiB, 9 * GiB)  # over its limit for a moment: the kernel is reclaiming
    assert fits(full, 0) is None
    assert fits(full, -GiB) is None
    assert fits(full, 1) == ("this node has 0 B of room (cgroup memory.max 8.0 GiB, 9.0 GiB used; 1.0 GiB stays free "
                             "for the workers' own growth)")


@pytest.mark.parametrize(("size", "shown"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (3 << 19, "1.5 MiB"), (3 * 2**29, "1.5 GiB"),
    (20 * 2**30, "20.0 GiB"), (2**40 - 1, "1024.0 GiB"), (2**40, "1.0 TiB"),
])
def test_sizes_are_shown_in_binary_units(size, shown):
    assert format_size(size) == shown


def test_the_environments_root_stands_for_the_node(tmp_path, monkeypatch):
    FakeMemory(16 * GiB, 8 * GiB, 2, "/j", {"j": FakeLevel(4 * GiB, GiB)}).write(tmp_path)
    fake = Room(16 * GiB, 8 * GiB, Cgroup("memory.max", 4 * GiB, GiB))
    assert read_here({ROOT_ENV: str(tmp_path)}) == fake
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    assert read_here() == fake  # this process's environment, when none is given
    for unset in ({}, {ROOT_ENV: ""}):  # this machine
        here = read_here(unset)
        assert here.total == read_room().total and 0 < here.available <= here.total
