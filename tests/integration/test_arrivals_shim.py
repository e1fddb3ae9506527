"""The shim's arrivals thread on real processes (``--straggler-window``), without torch: a fake ``torch`` whose Flight
Recorder answers a scripted series of dumps shows what is written and when the thread stops; a worker without torch
gets nothing, and exits as it would have."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from conftest import clean_environ
from rankrun.stacks.channel import arrivals_env, channel_env

EVERY = 0.05  # seconds between the thread's dumps

# A stand-in for torch: torch.distributed says it is initialized once the worker sets INITIALIZED; the recorder
# answers the dumps of DUMPS in turn ("raise": an error, as a torch whose private API changed), counting the calls.
FAKE = {
    "torch/__init__.py": "import json\nfrom torch import _C, distributed\n",
    "torch/distributed/__init__.py": "INITIALIZED = []\n\ndef is_initialized():\n    return bool(INITIALIZED)\n",
    "torch/_C/__init__.py": "from torch._C import _distributed_c10d\n",
    "torch/_C/_distributed_c10d.py": """\
import json, os
DUMPS = json.loads(os.environ["FAKE_DUMPS"])
calls = []

def _dump_fr_trace_json():
    calls.append(1)
    answer = DUMPS[min(len(calls), len(DUMPS)) - 1]
    if answer == "raise":
        raise RuntimeError("the private API changed")
    return json.dumps(answer).encode()
""",
}

# Imports the fake torch, says it is initialized, and waits (bounded) for CALLS dumps; then for 10 periods more, to
# see whether the thread asks again; then prints the count and ends.
WORKER = """\
import os, sys, time
import torch
torch.distributed.INITIALIZED.append(1)
calls, deadline = torch._C._distributed_c10d.calls, time.monotonic() + 30
while len(calls) < int(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(10 * float(sys.argv[2]))
print(len(calls), sorted(k for k in os.environ if k.startswith("RANKRUN_")))
"""


def _entry(record_id: int, seq: int, created: int, group: str = "0", p2p: bool = False) -> dict[str, object]:
    return {"record_id": record_id, "collective_seq_id": seq, "time_created_ns": created, "is_p2p": p2p,
            "process_group": [group, "default_pg"], "profiling_name": "gloo:all_reduce", "state": "completed"}


def _run(tmp_path: Path, script: str, args: list[str], fr_file: Path, dumps: list[object] | None = None,
         with_torch: bool = True) -> subprocess.CompletedProcess[str]:
    if with_torch:
        for name, text in FAKE.items():
            (tmp_path / "fake" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "fake" / name).write_text(text)
    (tmp_path / "worker.py").write_text(script)
    env = clean_environ() | ({"PYTHONPATH": str(tmp_path / "fake"), "FAKE_DUMPS": json.dumps(dumps)} if with_torch else {})
    env = arrivals_env(channel_env(env, str(tmp_path / "stacks.txt")), str(fr_file), EVERY)
    return subprocess.run([sys.executable, str(tmp_path / "worker.py"), *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_each_new_collective_is_one_line_p2p_left_out_and_the_first_error_ends_the_thread(tmp_path):
    dumps: list[object] = [
        {"version": "2.10"},  # nothing recorded yet: no "entries" at all
        {"entries": [_entry(0, 1, 1000), _entry(1, 1, 1500, p2p=True), _entry(2, 1, 2000, group="sub group")]},
        {"entries": [_entry(1, 1, 1500, p2p=True), _entry(2, 1, 2000, group="sub group"), _entry(3, 2, 3000)]},  # rotated
        "raise",
        {"entries": [_entry(4, 3, 4000)]},  # never asked for: the thread has stopped
    ]
    fr_file = tmp_path / "straggler" / "rank_3.fr"  # its folder made by the shim, at the first line
    done = _run(tmp_path, WORKER, ["4", str(EVERY)], fr_file, dumps)
    assert done.returncode == 0 and done.stderr == ""  # nothing of the thread's end reaches the worker (but the file)
    assert done.stdout == "4 []\n"  # four dumps asked, then none; the shim's variables gone from the environment
    assert fr_file.read_text() == ("rankrun-arrivals on\n0 1 1000\nsub group 1 2000\n0 2 3000\n"
                                   "rankrun-arrivals off RuntimeError\n")  # said, for rankrun to sample stacks instead


def test_a_worker_without_torch_runs_and_exits_as_it_would_have_and_nothing_is_written(tmp_path):
    fr_file = tmp_path / "straggler" / "rank_0.fr"
    script = ("import os, sys, time\ntime.sleep(5 * float(sys.argv[1]))\n"
              "print('torch' in sys.modules, sorted(k for k in os.environ if k.startswith('RANKRUN_')))\n")
    done = _run(tmp_path, script, [str(EVERY)], fr_file, with_torch=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, "False []\n", "")
    assert not fr_file.parent.exists()  # neither the file nor its folder


def test_the_sleeping_thread_never_holds_the_worker_at_its_exit(tmp_path):
    fr_file = tmp_path / "rank_0.fr"
    (tmp_path / "worker.py").write_text("print('bye')\n")
    env = arrivals_env(channel_env(clean_environ(), str(tmp_path / "stacks.txt")), str(fr_file), 60.0)
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(tmp_path / "worker.py")], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, "bye\n", "")
    assert time.monotonic() - start < 30  # a minute-long sleep in the thread: not waited for
