"""A launcher's part in the DCGM job mapping, alone: the real lifetime watchdog, and the mapping consumer given the
events a job's workers starting would give it. ``dcgm_launcher.py DIR GPUS`` (GPUS: comma-separated ids).

Prints ``READY <watchdog pid>`` once the files are written, then reads commands from stdin, one a line:
``end`` (the workers ended: the files removed), ``exit`` (a clean exit: job.end, the watchdog closed, exit 0).
"""

from __future__ import annotations

import sys

from rankrun.events.dcgm import DcgmMapping
from rankrun.events.records import JobEnd, WorkersEnd, WorkersStart
from rankrun.proc.watchdog import Watchdog


def main() -> int:
    directory, gpus = sys.argv[1], sys.argv[2].split(",")
    watchdog = Watchdog.start()
    mapping = DcgmMapping(directory, gpus, on_file=watchdog.own_file, off_file=watchdog.disown_file)
    common = {"ts": 0.0, "mono": 0.0, "run": "job-dcgm", "node": "127.0.0.1"}
    mapping.on_event(WorkersStart(0, f"0-{len(gpus) - 1}", tuple(range(len(gpus))), **common))
    print(f"READY {watchdog.pid}", flush=True)
    for line in sys.stdin:
        if line.strip() == "end":
            mapping.on_event(WorkersEnd(0, "succeeded", **common))
            print("ENDED", flush=True)
        elif line.strip() == "exit":
            mapping.on_event(JobEnd(0, "succeeded", **common))
            watchdog.close()
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
