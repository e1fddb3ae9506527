"""Many gloo ranks on few cores: torch is imported once, by a zygote, and each rank is a fork of it.

``gloo_zygote.py serve SOCKET``: import torch, print ``READY``, then for each connection on the Unix socket SOCKET fork
a child that takes the environment sent (the worker's: RANK, MASTER_ADDR, MASTER_PORT, ...), runs
``init_process_group("gloo", init_method="env://")`` (rank FAIL_RANK then raises, on attempt 0), one barrier and
``destroy_process_group``, with its output on the
connection, and its exit code as the last line (``EXIT n``). A child lives at most CHILD_LIMIT_S (SIGALRM).

``gloo_zygote.py SOCKET`` (what rankrun starts, one per rank): send this process's environment, print what the child
prints, exit with its code. The rank's real torch client and gloo run in the child, with exactly the environment
rankrun gave this process; the cost of 64 ``import torch`` (about 3 s of CPU each) is paid once.
"""

import json
import os
import signal
import socket
import sys

CHILD_LIMIT_S = 60


def rank_main(env: dict[str, str]) -> int:
    from datetime import timedelta  # noqa: PLC0415

    import torch.distributed as dist  # noqa: PLC0415 - imported by the zygote already: free here

    os.environ.clear()
    os.environ.update(env)
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=45))
    rank, world, restart = dist.get_rank(), dist.get_world_size(), env["TORCHELASTIC_RESTART_COUNT"]
    if str(rank) == env.get("FAIL_RANK") and restart == "0":  # after init: the next attempt must start clean
        raise ValueError(f"boom from rank {rank}")
    dist.barrier()
    print(f"rank {rank} of {world} restart {restart} via {env['MASTER_ADDR']}:{env['MASTER_PORT']}", flush=True)
    dist.destroy_process_group()
    return 0


def child(conn: socket.socket) -> None:
    signal.alarm(CHILD_LIMIT_S)
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            os._exit(1)
        data += chunk
    os.dup2(conn.fileno(), 1)
    os.dup2(conn.fileno(), 2)
    code = 1
    try:
        code = rank_main(json.loads(data))
    except BaseException as exc:  # the rank's failure is its output
        print(f"rank failed: {exc!r}", flush=True)
    print(f"EXIT {code}", flush=True)
    os._exit(code)


def serve(path: str) -> None:
    import torch.distributed  # noqa: F401, PLC0415 - the one import every rank shares

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1024)
    print("READY", flush=True)
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            server.close()
            child(conn)
        conn.close()


def rank(path: str) -> int:
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(path)
    conn.sendall(json.dumps(dict(os.environ)).encode() + b"\n")
    out = b""
    while chunk := conn.recv(65536):
        out += chunk
    text = out.decode(errors="replace")
    lines = text.splitlines()
    code = int(lines[-1].split()[1]) if lines and lines[-1].startswith("EXIT ") else 1
    sys.stdout.write("\n".join(lines[:-1]) + "\n" if code == 0 or lines else text)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit(rank(sys.argv[1]))
