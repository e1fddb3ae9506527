"""Worker that records its pid (and its children's), prints READY, then waits for signals.

Env knobs: PAYLOAD_IGNORE_TERM=1 ignores SIGTERM; PAYLOAD_CHILDREN=1 starts a child in its
process group and one in a new session; PAYLOAD_EXIT_RANK=R makes rank R exit 3 right after
printing READY.
"""

import os
import signal
import subprocess
import sys

rank = int(os.environ["RANK"])
pid_dir = os.environ["TEST_PID_DIR"]
signal.alarm(120)  # safety net: never outlive a broken test


def record(name: str, pid: int) -> None:
    path = os.path.join(pid_dir, name)
    with open(path + ".tmp", "w") as fh:  # atomic: a reader never sees an empty pid file
        fh.write(f"{pid}\n")
    os.replace(path + ".tmp", path)


record(f"worker{rank}-{os.environ['TORCHELASTIC_RESTART_COUNT']}", os.getpid())
if os.environ.get("PAYLOAD_CHILDREN") == "1":
    same = subprocess.Popen(["sleep", "300"])
    other = subprocess.Popen(["sleep", "301"], start_new_session=True)
    record(f"child{rank}", same.pid)
    record(f"setsid{rank}", other.pid)


def on_signal(signum: int, frame: object) -> None:
    print(f"GOT {signal.Signals(signum).name} rank {rank}", flush=True)
    sys.exit(0)


for s in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
    signal.signal(s, on_signal)
if os.environ.get("PAYLOAD_IGNORE_TERM") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, on_signal)
print(f"READY rank {rank} pid {os.getpid()}", flush=True)
if os.environ.get("PAYLOAD_EXIT_RANK") == str(rank):
    sys.exit(3)
while True:
    signal.pause()
