"""A script whose ``__main__`` defines the functions it launches (``python api_driver.py MODE``), as users write them.

MODE ``values``: four ranks return (rank, pid); ``interrupt``: two ranks sleep until the driver gets SIGINT, then the
driver waits for their pids to vanish, says how long it took, and launches again; ``node BACKEND ENDPOINT [LOG_DIR]``:
one of two nodes of a job on that rendezvous backend (c10d, etcd), two ranks each, which return (rank, pid) and, from rank 3, a value larger than the store
carries (``rankrun.api.values.VALUE_LIMIT``); the driver prints what it got, or the error; ``node-fails ENDPOINT``:
the same job, where rank 2 raises and the other ranks wait to be stopped; the driver prints the ``WorkerError``;
``caught``: rank 1 of two raises, the driver catches the ``WorkerError`` and prints its rank 1's type and the first
line of its traceback after the header; ``uncaught``: the same job, the ``WorkerError`` left to Python; ``sleep
PID_DIR``: two ranks sleep (``interrupt``'s), until something stops the driver.
"""

import os
import sys
import time

import rankrun
import rankrun.api.values

OFFSET = 100


def identify(extra):
    print(f"rank {os.environ['RANK']} here", flush=True)
    return int(os.environ["RANK"]) + OFFSET + extra, os.getpid()


def sleeper(pid_dir):
    with open(os.path.join(pid_dir, os.environ["RANK"]), "w") as fh:
        fh.write(str(os.getpid()))
    print("sleeping", flush=True)
    time.sleep(120)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def node_value():
    rank = int(os.environ["RANK"])
    big = bytes(rankrun.api.values.VALUE_LIMIT + 1) if rank == 3 else b""
    return rank + OFFSET, os.getpid(), big


def one_of_two_nodes(backend, endpoint, log_dir):
    try:
        values = rankrun.launch(node_value, nproc_per_node=2, nnodes=2, rdzv_backend=backend, rdzv_endpoint=endpoint,
                                rdzv_id="api-nodes", log_dir=log_dir)
    except rankrun.LauncherError as exc:
        print("error", exc, flush=True)
        return
    print("values", sorted((rank, value) for rank, (value, _, _) in values.items()), flush=True)
    print("pids", " ".join(str(pid) for _, pid, _ in values.values()), flush=True)
    print("big", {rank: len(big) for rank, (_, _, big) in values.items() if big}, flush=True)


def node_fails():
    if os.environ["RANK"] == "2":
        raise ValueError("rank two refuses")
    time.sleep(120)  # stopped when rank 2 fails


def one_of_two_failing_nodes(endpoint):
    try:
        rankrun.launch(node_fails, nproc_per_node=2, nnodes=2, rdzv_backend="c10d", rdzv_endpoint=endpoint,
                       rdzv_id="api-nodes")
    except rankrun.WorkerError as exc:
        for rank, failure in exc.failures.items():
            print("failure", rank, failure.exc_type, failure.message, failure.exit_code, failure.host, flush=True)
            print("traceback", rank, failure.traceback.strip().splitlines()[-1], flush=True)
        print("cause", repr(exc.__cause__), flush=True)
        print("report", str(exc).splitlines()[1], flush=True)


def refuse():
    if os.environ["RANK"] == "1":
        raise ValueError("rank one refuses")
    return 0


def caught():
    try:
        rankrun.launch(refuse, nproc_per_node=2)
    except rankrun.WorkerError as exc:
        print("caught", exc.failures[1].exc_type, flush=True)
        print("first frame", exc.failures[1].traceback.splitlines()[1].strip(), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "caught":
        caught()
    elif sys.argv[1] == "uncaught":
        rankrun.launch(refuse, nproc_per_node=2)
    elif sys.argv[1] == "node-fails":
        one_of_two_failing_nodes(sys.argv[2])
    elif sys.argv[1] == "node":
        one_of_two_nodes(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
    elif sys.argv[1] == "sleep":
        rankrun.launch(sleeper, sys.argv[2], nproc_per_node=2)
    elif sys.argv[1] == "values":
        values = rankrun.launch(identify, 1, nproc_per_node=4)
        print("values", sorted((rank, value) for rank, (value, _) in values.items()), flush=True)
        print("pids", len({pid for _, pid in values.values()} | {os.getpid()}), flush=True)
    else:
        pid_dir = sys.argv[2]
        try:
            rankrun.launch(sleeper, pid_dir, nproc_per_node=2)
        except KeyboardInterrupt:
            interrupted = time.monotonic()
            pids = []
            for name in os.listdir(pid_dir):
                with open(os.path.join(pid_dir, name)) as fh:
                    pids.append(int(fh.read()))
            while any(alive(pid) for pid in pids) and time.monotonic() - interrupted < 10:
                time.sleep(0.01)
            print(f"workers gone after {time.monotonic() - interrupted:.2f} s: {not any(alive(pid) for pid in pids)}",
                  flush=True)
        print("again", rankrun.launch(identify, 0, nproc_per_node=1)[0][0], flush=True)
