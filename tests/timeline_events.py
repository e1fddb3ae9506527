"""Two nodes' event files (schema 1) written by hand, for the timeline page's tests (the launcher does not write them yet).

The job: ``--nnodes 2:3 --nproc-per-node 2``. Round 0 forms with three nodes (127.0.0.2, .3, .4; world 6); in attempt 0
rank 1 (on 127.0.0.2) raises ``ValueError: bad lr``; the nodes restart; 127.0.0.4 never rejoins and is excluded; round 1
forms with two nodes (world 4); in attempt 1 rank 3 stalls for a while, then the job succeeds. Only the two surviving
nodes' files exist. Each node's monotonic clock has its own origin, and 127.0.0.3's wall clock runs 20 ms ahead.
``excluded_events`` is a third node's file (127.0.0.5): its health check failed, so the job excluded it and it exited 4
at once while the others ran on.

``warm_events`` is a node's file of another job, run with ``--preload torch``: the import takes 2.31 s, attempt 0's
workers are forked and rank 1 fails, attempt 1's are forked too and rank 1 fails again, the preloading process is
killed meanwhile, and attempt 2's workers start cold and succeed.

``kept_events`` is a node's file of a third job, whose script saves its state with ``rankrun.checkpoint`` every
step: two nodes (this one ranks 0-1, its neighbour 127.0.0.3), steps 1-4 kept, step 5 refused (no room), each kept
step copied to the neighbour and steps 2 and 4 to ``--checkpoint-dir`` (the copy of step 3 abandoned for step 4's),
rank 1 fails, and attempt 1 resumes from step 4 kept in memory.
"""

from __future__ import annotations

import json
from pathlib import Path

RUN = "job-7f3a"
WALL0 = 1796218200.0  # 2026-12-02 13:30:00 UTC
A, B, LOST, EXCLUDED = "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"
MONO = {A: 1000.0, B: 52000.0, EXCLUDED: 700.0}
WALL_SKEW = {A: 0.0, B: 0.02, EXCLUDED: -0.01}
EXCEPTION = "ValueError: bad lr"

ROOT_CAUSE = {"attempt": 0, "rank": 1, "host": A, "exit_code": 1, "signal": None, "exception": EXCEPTION}


def event(node: str, t: float, name: str, **keys: object) -> dict[str, object]:
    """One event that ``node`` writes ``t`` seconds into the job."""
    return {"v": 1, "ts": WALL0 + t + WALL_SKEW[node], "mono": MONO[node] + t, "run": RUN, "node": node, "event": name, **keys}


def _startup(node: str, t: float, attempt: int, slowest: int) -> dict[str, object]:
    return event(node, t, "startup", attempt=attempt, total=3.1, rendezvous=0.8, spawn=0.1, script_p50=1.9, script_max=2.4,
                 script_slowest=slowest, store_p50=0.2, store_max=0.5, store_slowest=slowest - 1)


def node_events(node: str, exception: str = EXCEPTION) -> list[dict[str, object]]:
    """What ``node`` writes during the job above (the root cause, the restart and the exclusion on both nodes)."""
    first = node == A
    ranks0, ranks1 = ("0-1", "0-1") if first else ("2-3", "2-3")
    pids = [4101, 4102] if first else [5201, 5202]
    out = [
        event(node, 0.0 if first else 0.05, "job.start", nproc_per_node=2, nnodes="2:3", max_restarts=3,
              rdzv_backend="c10d", entry="train.py"),
        event(node, 0.85, "rdzv.round", round=0, nodes=3, world_size=6, group_rank=0 if first else 1,
              seconds=0.8 if first else 0.75),
        event(node, 0.95, "workers.start", attempt=0, ranks=ranks0, pids=pids),
        _startup(node, 4.1, 0, 1 if first else 3),
        event(node, 6.2 if first else 6.21, "failure", **{**ROOT_CAUSE, "exception": exception}),
        event(node, 6.25, "workers.end", attempt=0, outcome="failed" if first else "stopped"),
        event(node, 6.3, "restart", attempt=1, reason="worker failed", restarts_left=2),
        event(node, 9.4, "node.lost", nodes=[LOST], reason="did not rejoin within 3 s"),
        event(node, 9.45, "rdzv.round", round=1, nodes=2, world_size=4, group_rank=0 if first else 1, seconds=3.15),
        event(node, 9.55, "workers.start", attempt=1, ranks=ranks1, pids=[p + 10 for p in pids]),
        _startup(node, 12.7, 1, 1 if first else 3),
    ]
    if not first:
        out.append(event(node, 15.0, "stall", ranks="3", title="rank 3 made no progress for 3.0 s (in all_reduce)"))
    out += [
        event(node, 19.0, "workers.end", attempt=1, outcome="succeeded"),
        event(node, 19.05 if first else 19.06, "job.end", exit_code=0, outcome="succeeded"),
    ]
    return out


def excluded_events() -> list[dict[str, object]]:
    """What 127.0.0.5 writes: it starts, its health check fails, it is excluded and exits 4 (an "error") 0.1 s in."""
    return [
        event(EXCLUDED, 0.02, "job.start", nproc_per_node=2, nnodes="2:3", max_restarts=3, rdzv_backend="c10d",
              entry="train.py"),
        event(EXCLUDED, 0.12, "job.end", exit_code=4, outcome="error"),
    ]


def write(path: Path, events: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def write_job(folder: Path, exception: str = EXCEPTION) -> list[Path]:
    """Both nodes' files in ``folder``: ``node-a.jsonl``, ``node-b.jsonl``."""
    return [write(folder / "node-a.jsonl", node_events(A, exception)), write(folder / "node-b.jsonl", node_events(B, exception))]


def warm_events(node: str = A) -> list[dict[str, object]]:
    """What ``node`` writes in the ``--preload torch`` job above (one node, two ranks), in the launcher's order: the
    preloading process starts right after ``job.start`` and imports for 2.31 s; its ``preload`` events are told with
    the next attempt's start, between its ``workers.start`` and its ``warm``."""
    def attempt(t: float, n: int, forked: str, cold: str, outcome: str, took: float,
                told: tuple[dict[str, object], ...] = ()) -> list[dict[str, object]]:
        p50, most = (0.004, 0.006) if forked else (None, None)
        return [
            event(node, t - 0.01, "rdzv.round", round=n, nodes=1, world_size=2, group_rank=0, seconds=0.0002),
            event(node, t, "workers.start", attempt=n, ranks="0-1", pids=[4101 + 10 * n, 4102 + 10 * n]),
            *told,
            event(node, t, "warm", attempt=n, forked=forked, cold=cold, fork_p50=p50, fork_max=most),
            event(node, t + took, "workers.end", attempt=n, outcome=outcome),
        ]

    return [
        event(node, 0.0, "job.start", nproc_per_node=2, nnodes="1", max_restarts=3, rdzv_backend="c10d", entry="train.py"),
        *attempt(2.5, 0, "0-1", "", "failed", 1.5,
                 (event(node, 2.5, "preload", modules="torch", seconds=2.31, state="ready", why=""),)),
        event(node, 4.01, "failure", **ROOT_CAUSE),
        event(node, 4.02, "restart", attempt=1, reason="worker failed", restarts_left=2),
        *attempt(4.1, 1, "0-1", "", "failed", 1.0),
        event(node, 5.11, "failure", **{**ROOT_CAUSE, "attempt": 1}),
        event(node, 5.12, "restart", attempt=2, reason="worker failed", restarts_left=1),
        *attempt(5.2, 2, "", "0-1", "succeeded", 5.0,
                 (event(node, 5.2, "preload", modules="torch", seconds=0.0, state="ended", why="killed by SIGKILL"),)),
        event(node, 10.25, "job.end", exit_code=0, outcome="succeeded"),
    ]


def kept_events(node: str = A) -> list[dict[str, object]]:
    """What ``node`` writes in the job that keeps its progress (above), in the launcher's order."""
    def kept(t: float, step: int, state: str = "kept") -> dict[str, object]:
        why = None if state == "kept" else "rank 1's step 5 (2.1 GB) is not kept: this node has 1.1 GB of room"
        size = 4_200_000_000 if state == "kept" else 0
        return event(node, t, "checkpoint.kept", step=step, ranks="0-1", bytes=size, seconds=0.61, state=state, why=why)

    def written(t: float, step: int, to: str, took: float, state: str = "complete") -> dict[str, object]:
        where = "127.0.0.3" if to == "neighbour" else f"/ckpt/{RUN}/step-{step}"
        return event(node, t, "checkpoint.written", step=step, to=to, where=where, bytes=4_200_000_000, seconds=took,
                     state=state)

    return [
        event(node, 0.0, "job.start", nproc_per_node=2, nnodes="2", max_restarts=1, rdzv_backend="c10d", entry="train.py"),
        event(node, 0.5, "rdzv.round", round=0, nodes=2, world_size=4, group_rank=0, seconds=0.4),
        event(node, 0.6, "workers.start", attempt=0, ranks="0-1", pids=[4101, 4102]),
        kept(2.0, 1), written(2.8, 1, "neighbour", 0.8),
        kept(3.0, 2), written(3.7, 2, "neighbour", 0.7),
        kept(4.0, 3), written(4.5, 2, "disk", 2.5), written(4.75, 3, "neighbour", 0.75),
        kept(5.0, 4), written(5.1, 3, "disk", 0.6, "abandoned"), written(5.8, 4, "neighbour", 0.8),
        kept(6.0, 5, "refused"),
        event(node, 6.5, "failure", **ROOT_CAUSE),
        event(node, 6.52, "workers.end", attempt=0, outcome="failed"),
        event(node, 6.55, "restart", attempt=1, reason="worker failed", restarts_left=0),
        event(node, 7.0, "rdzv.round", round=1, nodes=2, world_size=4, group_rank=0, seconds=0.4),
        event(node, 7.1, "workers.start", attempt=1, ranks="0-1", pids=[4111, 4112]),
        written(7.6, 4, "disk", 2.6),
        event(node, 7.9, "checkpoint.restored", attempt=1, step=4, source="memory", ranks="0-1", bytes=4_200_000_000,
              seconds=0.58),
        kept(9.0, 5),
        event(node, 10.0, "workers.end", attempt=1, outcome="succeeded"),
        event(node, 10.05, "job.end", exit_code=0, outcome="succeeded"),
    ]
