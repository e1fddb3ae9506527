"""``--numa-binding`` on real processes: each worker's own ``Cpus_allowed_list`` is its GPU's node's CPUs (a fake
layout made of this machine's CPUs, through the ``RANKRUN_SYSFS_ROOT`` seam), and without a GPU one line, exit 2."""

from __future__ import annotations

import pytest

from conftest import clean_environ, run_cli
from rankrun import devices
from rankrun.numa.binding import parse_ranges
from sysfs import FakeGpu, FakeMachine, this_machine_split

pytestmark = pytest.mark.usefixtures("private_tmpdir")

# The shell rankrun started execs grep in place: /proc/self is then the pid rankrun started, and its status the
# kernel's word on the CPUs that process may run on. (No $$: rankrun, as torchrun, substitutes ${...} in arguments.)
_REPORT = 'exec grep Cpus_allowed_list /proc/self/status > "$0/$LOCAL_RANK"'


def test_each_worker_runs_on_the_cpus_of_its_gpus_node(tmp_path):
    machine = this_machine_split()
    root = machine.write(tmp_path / "machine")
    out = tmp_path / "out"
    out.mkdir()
    env = clean_environ() | {"RANKRUN_SYSFS_ROOT": str(root)}
    res = run_cli("--numa-binding=node", "--nproc-per-node=2", "--no-python", "sh", "-c", _REPORT, str(out),
                  env=env, cwd=tmp_path, timeout=60)
    assert res.returncode == 0, res.stderr
    for rank in (0, 1):
        label, _, cpus = (out / str(rank)).read_text().partition(":")
        assert label == "Cpus_allowed_list"
        assert parse_ranges(cpus) == parse_ranges(machine.nodes[rank])


def test_a_worker_started_after_a_restart_is_bound_too(tmp_path):
    """The binding is the worker's, not the first attempt's: rank 1 fails once, and its second run is bound the same."""
    machine = this_machine_split()
    root = machine.write(tmp_path / "machine")
    out = tmp_path / "out"
    out.mkdir()
    script = ('grep Cpus_allowed_list /proc/self/status > "$0/$LOCAL_RANK.$TORCHELASTIC_RESTART_COUNT"; '
              '[ "$LOCAL_RANK$TORCHELASTIC_RESTART_COUNT" != 10 ]')  # grep, the shell's child, has the shell's CPUs
    env = clean_environ() | {"RANKRUN_SYSFS_ROOT": str(root)}
    res = run_cli("--numa-binding=node", "--nproc-per-node=2", "--max-restarts=1", "--no-python", "sh", "-c", script,
                  str(out), env=env, cwd=tmp_path, timeout=60)
    assert res.returncode == 0, res.stderr
    for name, node in (("1.0", 1), ("0.1", 0), ("1.1", 1)):  # rank 0's first run may be stopped before it looks
        assert parse_ranges((out / name).read_text().partition(":")[2]) == parse_ranges(machine.nodes[node]), name


def _refused(tmp_path, env):
    marker = tmp_path / "started"
    res = run_cli("--numa-binding=node", "--nproc-per-node=2", "--no-python", "touch", str(marker), env=env,
                  cwd=tmp_path, timeout=60)
    assert not marker.exists()  # nothing started
    return res


def test_without_a_gpu_one_line_and_exit_2(tmp_path):
    empty = FakeMachine({0: "0"}, []).write(tmp_path / "machine")  # CPUs, but no NVIDIA driver and no GPU
    res = _refused(tmp_path, clean_environ() | {"RANKRUN_SYSFS_ROOT": str(empty)})
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == ("rankrun: error: --numa-binding 'node': no NVIDIA GPU found (CUDA_VISIBLE_DEVICES, "
                          "/proc/driver/nvidia, nvidia-smi): binding puts each local rank near its GPU\n")


@pytest.mark.skipif(bool(devices.driver_gpus()), reason="this machine has an NVIDIA GPU")
def test_without_a_gpu_on_this_machine_itself(tmp_path):
    """No seam: the real /proc and /sys of a machine without a GPU (torchrun: AssertionError's traceback)."""
    res = _refused(tmp_path, clean_environ())
    assert res.returncode == 2
    assert res.stderr.startswith("rankrun: error: --numa-binding 'node': no NVIDIA GPU found")
    assert res.stderr.count("\n") == 1


def test_more_ranks_than_gpus_one_line_and_exit_2(tmp_path):
    machine = FakeMachine({0: "0"}, [FakeGpu("0000:1b:00.0", 0)])
    res = _refused(tmp_path, clean_environ() | {"RANKRUN_SYSFS_ROOT": str(machine.write(tmp_path / "machine"))})
    assert res.returncode == 2
    assert res.stderr == ("rankrun: error: --numa-binding 'node': local rank 1 has no GPU: 2 processes per node, "
                          "1 GPU(s) visible (each local rank is bound near the GPU of its number)\n")
