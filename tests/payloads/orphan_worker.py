"""A worker that leaves an orphan: its child forks a grandchild and exits, so the grandchild is re-parented to the
launcher (PID 1 of a PID namespace, or the subreaper), and exits 0.3 s later. The worker watches for 10 s whether the
grandchild is reaped while the job still runs, says which, then prints READY and (with ORPHAN_WAIT) waits for a signal:
SIGTERM ends it, or with ORPHAN_WAIT=ignore it ignores SIGTERM.
"""

import os
import signal
import sys
import time

r, w = os.pipe()
pid = os.fork()
if pid == 0:
    gp = os.fork()
    if gp == 0:
        time.sleep(0.3)
        os._exit(0)
    os.write(w, str(gp).encode())
    os._exit(0)
os.waitpid(pid, 0)
gp = int(os.read(r, 32))
deadline = time.monotonic() + 10
while os.path.exists(f"/proc/{gp}") and time.monotonic() < deadline:
    time.sleep(0.02)
if os.path.exists(f"/proc/{gp}"):
    with open(f"/proc/{gp}/stat") as stat:
        print("grandchild still there, state", stat.read().split(")")[1].split()[0], flush=True)
else:
    print("grandchild reaped", flush=True)
print("my pid", os.getpid(), "ppid", os.getppid(), flush=True)
if os.environ.get("ORPHAN_WAIT") == "ignore":  # a worker that does not stop when asked
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif os.environ.get("ORPHAN_WAIT"):
    signal.signal(signal.SIGTERM, lambda *_: (print("worker got SIGTERM", flush=True), sys.exit(0)))
if os.environ.get("ORPHAN_WAIT"):
    print("READY", flush=True)
    signal.pause()
