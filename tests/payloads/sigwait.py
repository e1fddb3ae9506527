"""Worker that installs its signal handlers, records its pid (and its children's), prints READY, then waits.

Env knobs: PAYLOAD_IGNORE_TERM=1 ignores SIGTERM (=say: and prints that it did); PAYLOAD_CHILDREN=1 starts a child in its
process group and one in a new session; PAYLOAD_EXIT_RANK=R makes rank R exit 3 once every
rank of this attempt has recorded its pid (i.e. has its handlers in place).
"""

import os
import signal
import subprocess
import sys
import time

rank = int(os.environ["RANK"])
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
pid_dir = os.environ["TEST_PID_DIR"]
signal.alarm(120)  # safety net: never outlive a broken test


def record(name: str, pid: int) -> None:
    path = os.path.join(pid_dir, name)
    with open(path + ".tmp", "w") as fh:  # atomic: a reader never sees an empty pid file
        fh.write(f"{pid}\n")
    os.replace(path + ".tmp", path)


def on_signal(signum: int, frame: object) -> None:
    print(f"GOT {signal.Signals(signum).name} rank {rank}", flush=True)
    sys.exit(0)


for s in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
    signal.signal(s, on_signal)
def on_term_ignored(signum: int, frame: object) -> None:
    print(f"IGNORED SIGTERM rank {rank}", flush=True)


ignore_term = os.environ.get("PAYLOAD_IGNORE_TERM")
signal.signal(signal.SIGTERM, {"1": signal.SIG_IGN, "say": on_term_ignored}.get(ignore_term or "", on_signal))

if os.environ.get("PAYLOAD_CHILDREN") == "1":
    same = subprocess.Popen(["sleep", "300"])
    other = subprocess.Popen(["sleep", "301"], start_new_session=True)
    record(f"child{rank}", same.pid)
    record(f"setsid{rank}", other.pid)
record(f"worker{rank}-{restart}", os.getpid())
print(f"READY rank {rank} pid {os.getpid()}", flush=True)

if os.environ.get("PAYLOAD_EXIT_RANK") == str(rank):
    peers = [os.path.join(pid_dir, f"worker{r}-{restart}") for r in range(int(os.environ["WORLD_SIZE"]))]
    while not all(os.path.exists(p) for p in peers):  # the event: every peer's handlers are installed
        time.sleep(0.005)
    sys.exit(3)
while True:
    signal.pause()
