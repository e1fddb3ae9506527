"""The pure rules of ``python -m rankrun.health``: sizes, the free space a user may write, the open-files rule, what
nvidia-smi's text says, and the room for kept progress on a fake node (sizes are shown as ``rankrun.memroom`` words
them: ``tests/unit/test_memroom.py``).

The ``nvidia-smi -q`` excerpts are laid out as real drivers print them (a ``GPU <bus id>`` line opens each GPU's
section; recent drivers print ``GPU Recovery Action`` and mark the older ``GPU Reset Status`` fields deprecated).
"""

from __future__ import annotations

import os

import pytest

from rankrun.health.probes import (
    checkpoint_room_probe,
    free_space_probe,
    listed_gpus,
    nofile_needed,
    parse_size,
    pending_recovery,
    user_free,
)
from rankrun.memroom import ROOT_ENV, format_size
from sysfs import FakeLevel, FakeMemory

GiB = 1 << 30


@pytest.mark.parametrize(("text", "size"), [
    ("0", 0), ("1", 1), ("512", 512), ("1K", 1024), ("20G", 20 * 2**30), ("20g", 20 * 2**30), ("20GB", 20 * 2**30),
    ("20GiB", 20 * 2**30), ("1.5M", 3 * 2**19), ("2T", 2 * 2**40), (" 3M ", 3 * 2**20), ("7B", 7),
])
def test_sizes_are_binary_with_an_optional_suffix(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "-1", "-1G", "20X", "1e3", "20 G", "1.G", "20GG", "inf", "nan"])
def test_a_size_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_the_open_files_rule_is_64_plus_32_per_local_worker():
    assert [nofile_needed(n) for n in (0, 1, 8, 32)] == [64, 96, 320, 1088]


LISTING = """\
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d3e1c2a-0000-0000-0000-000000000000)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-5d3e1c2a-0000-0000-0000-000000000001)
  MIG 3g.40gb     Device  0: (UUID: MIG-11111111-0000-0000-0000-000000000000)
  MIG 3g.40gb     Device  1: (UUID: MIG-11111111-0000-0000-0000-000000000001)
GPU 10: NVIDIA H100 80GB HBM3 (UUID: GPU-5d3e1c2a-0000-0000-0000-00000000000a)
"""


def test_gpus_are_the_listings_gpu_lines_not_its_mig_devices():
    assert listed_gpus(LISTING) == 3


def test_a_listing_without_gpus_counts_none():
    assert listed_gpus("No devices were found\n") == 0
    assert listed_gpus("Unable to determine the device handle for GPU0000:18:00.0: Unknown Error\n") == 0


def _section(bus: str, action: str, reset_required: str = "Requested functionality has been deprecated",
             drain: str = "Requested functionality has been deprecated") -> str:
    return (f"GPU {bus}\n"
            "    Product Name                          : NVIDIA H200\n"
            "    GPU Reset Status\n"
            f"        Reset Required                    : {reset_required}\n"
            f"        Drain and Reset Recommended       : {drain}\n"
            f"    GPU Recovery Action                   : {action}\n"
            "    GSP Firmware Version                  : 570.86.15\n"
            "    PCI\n"
            f"        Bus Id                            : {bus}\n")


HEADER = "==============NVSMI LOG==============\n\nTimestamp                                 : Wed Dec  2 17:00:00 2026\nAttached GPUs                             : 2\n"


def test_a_healthy_node_has_nothing_pending():
    assert pending_recovery(HEADER + _section("00000000:18:00.0", "None") + _section("00000000:2A:00.0", "None")) == []


@pytest.mark.parametrize("action", ["Reset", "Reboot", "Drain P2P", "Drain and Reset", "GPU_RESET", "Unknown Error"])
def test_a_recovery_action_other_than_none_names_its_gpu(action):
    text = HEADER + _section("00000000:18:00.0", "None") + _section("00000000:2A:00.0", action)
    assert pending_recovery(text) == [f"GPU 00000000:2A:00.0: recovery action {action} (nvidia-smi -q)"]


@pytest.mark.parametrize("action", ["N/A", "[N/A]", "Not Supported", "GPU_RECOVERY_ACTION_NONE", ""])
def test_a_driver_that_cannot_tell_asks_for_nothing(action):
    assert pending_recovery(HEADER + _section("00000000:18:00.0", action)) == []


def test_an_older_drivers_reset_status_fields_count_when_yes():
    text = (HEADER + _section("00000000:18:00.0", "N/A", reset_required="No", drain="No")
            + _section("00000000:2A:00.0", "N/A", reset_required="Yes", drain="Yes"))
    assert pending_recovery(text) == ["GPU 00000000:2A:00.0: reset required (nvidia-smi -q)",
                                      "GPU 00000000:2A:00.0: drain and reset recommended (nvidia-smi -q)"]


def test_every_gpu_pending_is_named():
    text = HEADER + _section("00000000:18:00.0", "Reboot") + _section("00000000:2A:00.0", "Reboot")
    assert pending_recovery(text) == ["GPU 00000000:18:00.0: recovery action Reboot (nvidia-smi -q)",
                                      "GPU 00000000:2A:00.0: recovery action Reboot (nvidia-smi -q)"]


def _statvfs(bfree: int, bavail: int, frsize: int = 4096) -> os.statvfs_result:
    # (f_bsize, f_frsize, f_blocks, f_bfree, f_bavail, f_files, f_ffree, f_favail, f_flag, f_namemax)
    return os.statvfs_result((frsize, frsize, 1 << 20, bfree, bavail, 1000, 500, 500, 0, 255))


def test_free_space_is_what_the_jobs_user_may_write_not_roots_reserve():
    """A disk full for the job's user still has root's reserved blocks free: --min-free must see it full."""
    assert user_free(_statvfs(bfree=50_000, bavail=0)) == 0
    assert user_free(_statvfs(bfree=50_000, bavail=20_000, frsize=1024)) == 20_000 * 1024


def test_the_free_space_probe_reads_the_filesystem_of_the_path(tmp_path):
    stats = os.statvfs(tmp_path)
    free, reserved = user_free(stats), (stats.f_bfree - stats.f_bavail) * stats.f_frsize
    assert free_space_probe(str(tmp_path), 1) == []
    if reserved > 2**31:  # an ext4 with root's reserve (not a tmpfs): asking for half of it more than the user has fails
        assert free_space_probe(str(tmp_path), free + reserved // 2) != []
    [message] = free_space_probe(str(tmp_path), free + 2**40)
    assert message.startswith(f"{tmp_path}: ") and message.endswith(f"free, {format_size(free + 2**40)} asked")
    assert free_space_probe(str(tmp_path / "missing"), 1) == [f"{tmp_path / 'missing'}: does not exist"]
    assert free_space_probe(str(tmp_path / "missing"), 1, optional=True) == []


def _node(tmp_path, limit, used):
    FakeMemory(128 * GiB, 100 * GiB, 2, "/job", {"job": FakeLevel(limit, used)}).write(tmp_path)
    return {ROOT_ENV: str(tmp_path)}


def test_the_checkpoint_room_is_the_keepers_rule_to_the_byte(tmp_path):
    env = _node(tmp_path, 20 * GiB, 10 * GiB)  # 10 GiB of room, 2 GiB of it stays free
    assert checkpoint_room_probe(8 * GiB, env) == []
    assert checkpoint_room_probe(8 * GiB + 1, env) == [
        "this node has 10.0 GiB of room (cgroup memory.max 20.0 GiB, 10.0 GiB used; 2.0 GiB stays free for the "
        "workers' own growth), 8.0 GiB asked"]


def test_a_node_whose_memory_cannot_be_read_says_which_file(tmp_path):
    assert checkpoint_room_probe(GiB, {ROOT_ENV: str(tmp_path)}) == [
        f"{tmp_path}/proc/meminfo: No such file or directory"]
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemFree: 1 kB\n")
    assert checkpoint_room_probe(GiB, {ROOT_ENV: str(tmp_path)}) == ["/proc/meminfo says no MemTotal"]
