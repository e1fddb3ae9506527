"""The ``goodput`` metric of bench/run.py: the launcher's CPU for keeping the goodput account, per event and per scrape.

``python bench/goodput_bench.py [--reps 5] [--jobs 4]``. In this process, on records built before any timing:
``JOBS`` long jobs of one node (seeded, each different), each ``ATTEMPTS`` attempts of ``SAVES`` kept steps (each
with its neighbour's copy), stragglers named and recovered, stalls that end and stalls that end their attempt, every
attempt but the last failing and restarting, then ``job.end``: some 7,000 events a job, as the node's ``--events``
file would hold them. Timed with ``time.process_time`` (this process's CPU, the collector's included), each
repetition: every job folded into a fresh ``goodput.Ledger`` (``add``, event by event), then the same with
``Ledger.at`` after every event (a scrape of ``--metrics-port`` after each, far more often than Prometheus asks: the
account so far, its open attempt split at that moment). The medians over the repetitions, in µs per event, against
the issue's budget of 1 ms CPU per event on the launcher. The account reads only the launcher's own events: the
workers run nothing for it. torchrun keeps no such account.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))

from rankrun.events.goodput import Ledger  # noqa: E402
from rankrun.events.records import Record, from_json  # noqa: E402
from report import Row, Target  # noqa: E402

BUDGET_US = 1000.0  # the issue's: at most 1 ms of the launcher's CPU per event
JOBS = 4  # event sequences, each its own seed
ATTEMPTS = 8  # per job: the first 7 fail (one by a stall), the last succeeds
SAVES = 400  # kept steps per attempt, one every 30 to 90 s (a day-long job's cadence)
RANKS = 8  # this node's ranks


@dataclass
class Result:
    events: int = 0  # per repetition, all jobs together
    jobs: int = 0
    add_us: list[float] = field(default_factory=list)  # per repetition: µs of CPU per Ledger.add
    scrape_us: list[float] = field(default_factory=list)  # per repetition: µs of CPU per Ledger.at, one after each event
    kinds: dict[str, int] = field(default_factory=dict)  # the events of one repetition, by name


class _Job:
    """One node's events, on its monotonic clock from 1,000 s."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.mono = 1000.0
        self.events: list[Record] = []

    def add(self, name: str, after: float = 0.0, **keys: Any) -> None:
        self.mono += after
        self.events.append(from_json({"v": 1, "ts": 1.7e9 + self.mono, "mono": self.mono, "run": "bench",
                                      "node": "10.0.0.1", "event": name, **keys}))

    def attempt(self, number: int, last: bool) -> None:
        rng, ranks = self.rng, f"0-{RANKS - 1}"
        self.add("rdzv.round", rng.uniform(1, 30), round=number, nodes=4, world_size=4 * RANKS, group_rank=0,
                 seconds=rng.uniform(1, 30))
        self.add("workers.start", 0.1, attempt=number, ranks=ranks, pids=list(range(100, 100 + RANKS)))
        spawn = rng.uniform(0.05, 0.2)
        self.add("startup", rng.uniform(5, 40), attempt=number, total=30.0, rendezvous=2.0, spawn=spawn, script_p50=3.0,
                 script_max=4.0, script_slowest=3, store_p50=8.0, store_max=9.0, store_slowest=5)
        self.add("training", rng.uniform(0.5, 5), attempt=number, seconds=rng.uniform(10, 45))
        stalled = number == 3  # this attempt ends in a stall the watch reports and the launcher ends
        for step in range(1, SAVES + 1):
            self.add("checkpoint.kept", rng.uniform(30, 90), step=step, ranks=ranks, bytes=8 << 30,
                     seconds=rng.uniform(0.3, 0.8), state="kept", why=None)
            self.add("checkpoint.written", rng.uniform(1, 4), step=step, to="neighbour", where="10.0.0.2",
                     bytes=8 << 30, seconds=rng.uniform(1, 4), state="complete")
            if rng.random() < 0.05:
                rank = rng.randrange(4 * RANKS)
                self.straggler(rank, "named")
                self.straggler(rank, "recovered")
            if rng.random() < 0.02:
                silent = rng.uniform(60, 300)
                self.add("stall", rng.uniform(1, 10), ranks=ranks, title="rankrun: ranks stalled", silent=silent)
                self.add("stall.end", rng.uniform(1, 60), ranks=ranks, seconds=silent + 30)
        if last:
            self.add("workers.end", rng.uniform(1, 60), attempt=number, outcome="succeeded")
        elif stalled:
            self.add("stall", rng.uniform(300, 600), ranks=ranks, title="rankrun: ranks stalled", silent=300.0)
            self.add("workers.end", 1.0, attempt=number, outcome="stalled")
            self.add("restart", 0.5, attempt=number + 1, reason="a stall", restarts_left=ATTEMPTS - number)
        else:
            rank = rng.randrange(RANKS)
            self.add("failure", rng.uniform(1, 60), attempt=number, rank=rank, host="10.0.0.1", exit_code=1, signal=None,
                     exception="RuntimeError: NCCL error")
            self.add("workers.end", 0.2, attempt=number, outcome="failed")
            self.add("restart", 0.5, attempt=number + 1, reason=f"rank {rank} failed", restarts_left=ATTEMPTS - number)

    def straggler(self, rank: int, verdict: str) -> None:
        self.add("straggler", self.rng.uniform(30, 300), rank=rank, where="node-1/10.0.0.2", verdict=verdict,
                 lag=0.04, share=0.9, collectives=640, line=f"rankrun: straggler: rank {rank}")


def job_events(seed: int) -> list[Record]:
    """One long job's events (pure in ``seed``)."""
    job = _Job(seed)
    job.add("job.start", nproc_per_node=RANKS, nnodes="4", max_restarts=ATTEMPTS, rdzv_backend="c10d", entry="train.py")
    for number in range(ATTEMPTS):
        job.attempt(number, last=number == ATTEMPTS - 1)
    job.add("job.end", 2.0, exit_code=0, outcome="succeeded")
    return job.events


def _fold(jobs: list[list[Record]], *, scrape: bool) -> float:
    """CPU seconds to fold every job into a fresh ledger; with ``scrape``, the account taken after each event too."""
    start = time.process_time()
    for events in jobs:
        ledger = Ledger()
        add, at = ledger.add, ledger.at
        if scrape:
            for event in events:
                add(event)
                at(event.mono)
        else:
            for event in events:
                add(event)
    return time.process_time() - start


def run(reps: int, jobs: int = JOBS) -> Result:
    sequences = [job_events(seed) for seed in range(jobs)]
    result = Result(events=sum(map(len, sequences)), jobs=jobs)
    for events in sequences:
        for event in events:
            name = type(event).__name__
            result.kinds[name] = result.kinds.get(name, 0) + 1
    _fold(sequences[:1], scrape=True)  # unrecorded: every path run once
    for _ in range(reps):
        adds = _fold(sequences, scrape=False)
        both = _fold(sequences, scrape=True)
        result.add_us.append(adds / result.events * 1e6)
        result.scrape_us.append(max(both - adds, 0.0) / result.events * 1e6)
    return result


def _budget(what: str) -> Target:
    return Target(f"≤ 1 ms CPU {what}", lambda r: r.rankrun <= BUDGET_US)


def rows(result: Result) -> list[Row]:
    per_job = result.events // max(result.jobs, 1)
    return [
        Row(f"goodput account: Ledger.add, the launcher's CPU per event ({result.jobs} long jobs of ~{per_job:,} events, "
            f"{ATTEMPTS} attempts each; torchrun: none)", "µs", rankrun=statistics.median(result.add_us),
            torchrun=float("nan"), decimals=2, compare=False, target=_budget("per event")),
        Row("goodput account: Ledger.at, a scrape's account so far, CPU per call (one after every event; torchrun: none)",
            "µs", rankrun=statistics.median(result.scrape_us), torchrun=float("nan"), decimals=2, compare=False,
            target=_budget("per scrape")),
        Row("goodput account: both per event (add, and a scrape after it), share of the 1 ms budget (torchrun: none)",
            "%", rankrun=statistics.median(a + b for a, b in zip(result.add_us, result.scrape_us, strict=True))
            / BUDGET_US * 100, torchrun=float("nan"), decimals=2, compare=False,
            target=Target("≤ 100 %", lambda r: r.rankrun <= 100)),
    ]


def details(result: Result) -> list[str]:
    kinds = ", ".join(f"{name} {count:,}" for name, count in sorted(result.kinds.items(), key=lambda kv: -kv[1]))
    return [
        "### The goodput account: the launcher's CPU per event", "",
        f"`bench/goodput_bench.py` (its docstring says how), in-process, `time.process_time`: {result.jobs} seeded long "
        f"jobs of one node, {result.events:,} events in all ({kinds}); each of {ATTEMPTS} attempts keeps {SAVES} steps "
        "(each with its neighbour's copy), with stragglers and stalls; all but the last fail (one by a stall) and "
        "restart. Each repetition folds every job into a fresh `goodput.Ledger`, then again with `Ledger.at` after "
        "every event (a scrape's account; the second fold's extra CPU, per call). The workers run nothing for the "
        "account: it reads the launcher's own events. torchrun has no such account (its column is empty).", "",
        f"- Ledger.add, µs of CPU per event, each repetition: {', '.join(f'{v:.2f}' for v in result.add_us)}",
        f"- Ledger.at, µs of CPU per call, each repetition: {', '.join(f'{v:.2f}' for v in result.scrape_us)}",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=JOBS)
    args = parser.parse_args()
    result = run(args.reps, args.jobs)
    for row in rows(result):
        print(f"{row.metric}: {row.rankrun:.{row.decimals}f} {row.unit}")
    print("\n".join(details(result)))


if __name__ == "__main__":
    main()
