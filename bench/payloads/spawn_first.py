"""An experiment, not a launcher: the most that starting the workers *before* the heavy imports could gain.

Usage: ``python spawn_first.py --nproc-per-node N SCRIPT``. It parses the arguments with rankrun's own parser, starts
the N workers at once (``vfork`` via ``setpriv``, pipes for their stdout, as rankrun does), and only then imports the
rest of the launcher (asyncio, the agent) and runs an empty event loop, before it waits for the workers. No console,
watchdog, store or supervision: a lower bound for a launcher built that way.
"""

import os
import subprocess
import sys

sys.modules.setdefault("ssl", None)
from rankrun.cli import spec_from_args  # noqa: E402
from rankrun.proc.spawn import pdeathsig_exec  # noqa: E402

spec = spec_from_args(sys.argv[1:], os.environ)
procs, pipes = [], []
for rank in range(spec.worker.nproc):
    read, write = os.pipe2(os.O_CLOEXEC)
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(spec.worker.nproc))
    argv = [*pdeathsig_exec(), spec.worker.entry.python, "-u", spec.worker.entry.script]
    procs.append(subprocess.Popen(argv, env=env, stdout=write, start_new_session=True))
    os.close(write)
    pipes.append(read)

import asyncio  # noqa: E402

import rankrun.main  # noqa: E402, F401


async def _nothing() -> None:
    await asyncio.sleep(0)


asyncio.run(_nothing())
codes = [p.wait() for p in procs]
for fd in pipes:
    os.close(fd)
sys.exit(0 if not any(codes) else 1)
