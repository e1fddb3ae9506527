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

``python bench/goodput_bench.py --restart [--quick]`` (``--only goodput_restart`` in bench/run.py): **what warm starts
and kept progress are worth**, the account of checkpoint_bench.py's restart scenario made long enough for its shares
to mean something. 2 gloo ranks of ``payloads/ckpt_restart.py`` hold 100 MB each and have ``RESTART_STEPS`` steps of
work, each ``STEP_S`` s of sleep (the step's compute: a sleep, so that the machine's load moves the compute less) then
an all-reduce and a save; rank 1 SIGKILLs itself in step ``KILL_AT`` of attempt 0 and attempt 1 resumes and finishes
the work. Four rankrun variants, 2x2, interleaved in rotating order, each ``--standalone --max-restarts 1 --events
FILE``: cold or ``--preload torch``, by ``rankrun.checkpoint.save`` every step (resumes from the kept step) or the
script's own ``torch.save`` to a local file every ``DISK_EVERY`` steps and ``torch.load`` at its start (no
``rankrun.checkpoint``: the account sees no kept step, so it counts all of attempt 0's training lost, while the script
redoes only the steps since its last file). Per job: ``job.end``'s ``goodput``, checked against ``goodput.account`` of
the file's records; the step resumed from, and the kill's distance from the killed rank's newest save (the work the
script itself lost). The machine's load average and the other processes' share of its CPU during each job are
reported with it. torchrun keeps no account: it has no column.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))

import checkpoint_bench as ckpt  # noqa: E402
from harness import BenchError, cpu_mark, foreign_load, log, pycache, run_timed, scratch  # noqa: E402
from rankrun.events.goodput import Ledger, account, as_value  # noqa: E402
from rankrun.events.records import Record, from_json  # noqa: E402
from report import Row, Target, text_table  # noqa: E402

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


# --------------------------------------------------------------------------- what warm starts and kept progress are worth

RESTART_STEPS = 40  # the job's work, in steps; attempt 0 is killed in step ckpt.KILL_AT, attempt 1 finishes the rest
STEP_S = 0.5  # each step's compute (a sleep), before its all-reduce and its save
GOODPUT_PARTS = ("productive_s", "waiting_s", "startup_s", "restart_s", "stall_s", "lost_s")
PART_LABELS = {"productive_s": "productive", "waiting_s": "waiting", "startup_s": "start-up", "restart_s": "restart",
               "stall_s": "stall", "lost_s": "lost"}
DISK_WARM = ckpt.Variant("disk_warm", "rankrun --preload torch + torch.load of the last disk save",
                         ckpt.KEEP_WARM.launcher, "disk")
# 2x2: cold / --preload torch, by rankrun.checkpoint every step / the script's own torch.save every DISK_EVERY steps
RESTART_VARIANTS = (ckpt.KEEP_COLD, ckpt.KEEP_WARM, ckpt.DISK_COLD, DISK_WARM)
SHORT = {ckpt.KEEP_COLD.key: "cold + checkpoint", ckpt.KEEP_WARM.key: "--preload torch + checkpoint",
         ckpt.DISK_COLD.key: "cold + disk", DISK_WARM.key: "--preload torch + disk"}


@dataclass
class Account:
    """One restart job's account and what the script itself saw."""

    goodput: dict[str, float]  # job.end's goodput: wall_s and the six parts, seconds
    drift: float  # the largest |job.end's part - goodput.account(the file's records)'s|, seconds
    resumed: int  # the step attempt 1 resumed from (both ranks agree)
    script_lost: float  # the kill's distance from the killed rank's newest save returning, seconds
    elapsed: float  # the launcher's wall time as this process timed it, seconds
    loadavg: float  # the 1-minute load average at the job's start
    foreign: float  # the share of the machine's CPU other processes used during the job

    def share(self, part: str) -> float:
        wall = self.goodput["wall_s"]
        return self.goodput[part] / wall * 100 if wall > 0 else math.nan


def account_of(lines: list[str]) -> tuple[dict[str, float], float]:
    """job.end's goodput from an events file's lines, and its largest distance from ``account`` of the file's records
    (pure); ``BenchError`` when the file does not end in a ``job.end`` with an account."""
    objs = [json.loads(line) for line in lines if line.strip()]
    if not objs or objs[-1].get("event") != "job.end" or not isinstance(objs[-1].get("goodput"), dict):
        raise BenchError(f"the events file does not end in a job.end with its goodput (last: {objs[-1:]})")
    said = {k: float(v) for k, v in objs[-1]["goodput"].items()}
    folded = as_value(account(from_json(obj) for obj in objs))
    return said, max(abs(said[k] - folded[k]) for k in folded)


def measure_account(variant: ckpt.Variant, steps: int = RESTART_STEPS, step_s: float = STEP_S) -> Account:
    loadavg, mark = os.getloadavg()[0], cpu_mark()
    with scratch("goodput-restart") as tmp:
        events = tmp / "events.jsonl"
        args = [str(tmp), variant.mode, str(ckpt.RESTART_BYTES), str(ckpt.KILL_AT), str(ckpt.DISK_EVERY), str(steps),
                str(step_s)]
        argv = variant.launcher.command(2, ckpt.RESTART_PAYLOAD, args, ["--events", str(events)])
        timed = run_timed(argv, timeout=240 + steps * step_s * 4, extra_env=dict(variant.env))
        if timed.rc != 0:
            raise BenchError(f"{variant.label} exited {timed.rc} (expected 0 after the restart); stderr tail:\n"
                             f"{timed.stderr_tail}")
        try:
            goodput, drift = account_of(events.read_text().splitlines())
            records = {(a, r): json.loads((tmp / f"a{a}_r{r}.json").read_text()) for a in (0, 1) for r in (0, 1)}
            fail_ts = float((tmp / "fail_ts").read_text())
        except (OSError, ValueError) as exc:
            raise BenchError(f"{variant.label}: no events or no record ({exc}); stderr tail:\n{timed.stderr_tail}") from None
    resumed = {int(records[(1, r)]["resumed"]) for r in (0, 1)}
    if len(resumed) != 1:
        raise BenchError(f"{variant.label}: the ranks of attempt 1 resumed from different steps: {sorted(resumed)}")
    killed = records[(0, 1)]
    script_lost = fail_ts - float(killed.get("last_save", killed["loaded"]))
    return Account(goodput, drift, resumed.pop(), script_lost, timed.wall, loadavg, foreign_load(mark, cpu_mark())[0])


@dataclass
class RestartResult:
    reps: int
    steps: int = RESTART_STEPS
    step_s: float = STEP_S
    jobs: dict[str, list[Account]] = field(default_factory=dict)  # variant key → its jobs

    def values(self, key: str, get: Callable[[Account], float]) -> list[float]:
        return [get(job) for job in self.jobs.get(key, [])]

    def median(self, key: str, get: Callable[[Account], float]) -> float:
        values = self.values(key, get)
        return statistics.median(values) if values else math.nan

    def part(self, key: str, part: str) -> float:
        return self.median(key, lambda a: a.goodput[part])

    def share(self, key: str, part: str) -> float:
        return self.median(key, lambda a: a.share(part))

    def before_training(self, key: str) -> float:
        """Start-up and restart seconds together (``--preload``'s one import is start-up), the median over the jobs."""
        return self.median(key, lambda a: a.goodput["startup_s"] + a.goodput["restart_s"])


def restart_warm_up() -> None:
    """torch, torch.distributed, rankrun.checkpoint and the preload into the run's bytecode cache: the short scenario
    once with --preload torch and the checkpoint, once cold from disk (unrecorded)."""
    ckpt.measure_restart(ckpt.KEEP_WARM)
    ckpt.measure_restart(ckpt.DISK_COLD)


def run_restart(reps: int, steps: int = RESTART_STEPS, step_s: float = STEP_S) -> RestartResult:
    result = RestartResult(reps, steps, step_s)
    restart_warm_up()
    for rep in range(reps):
        k = rep % len(RESTART_VARIANTS)  # as harness.rotated: each rotation starts with another variant
        for variant in (*RESTART_VARIANTS[k:], *RESTART_VARIANTS[:k]):
            job = measure_account(variant, steps, step_s)
            result.jobs.setdefault(variant.key, []).append(job)
            log(f"  goodput restart rep {rep + 1}/{reps}, {variant.label}: goodput {job.share('productive_s'):.1f} % of "
                f"{job.goodput['wall_s']:.1f} s, start-up {job.goodput['startup_s']:.1f} s, restart "
                f"{job.goodput['restart_s']:.1f} s, lost {job.goodput['lost_s']:.1f} s (load average {job.loadavg:.1f}, "
                f"other processes {job.foreign:.0%})")
    return result


def _ratio_of(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def restart_rows(result: RestartResult) -> list[Row]:
    kc, kw, dc, dw = (v.key for v in RESTART_VARIANTS)
    what = (f"the restart scenario ({result.steps} steps of {result.step_s:g} s, 2 gloo ranks of "
            f"{ckpt.RESTART_BYTES / 1e6:g} MB, rank 1 killed in step {ckpt.KILL_AT}; torchrun: no account)")
    out = [Row(f"goodput of {what}: {variant.label}", "%", rankrun=result.share(variant.key, "productive_s"),
               torchrun=math.nan, decimals=1, compare=False) for variant in RESTART_VARIANTS]
    for warm, cold, how in ((kw, kc, "rankrun.checkpoint"), (dw, dc, "torch.save to disk")):
        out.append(Row(f"goodput account of {what}: start-up + restart seconds (the preload's import in it), "
                       f"--preload torch, with {how}", "s",
                       rankrun=result.before_training(warm), torchrun=math.nan,
                       baseline=result.before_training(cold), baseline_label=f"cold, with {how}",
                       decimals=1, compare=False))
    for kept, disk, how in ((kc, dc, "cold"), (kw, dw, "--preload torch")):
        out.append(Row(f"goodput account of {what}: lost seconds, {how}, rankrun.checkpoint every step", "s",
                       rankrun=result.part(kept, "lost_s"), torchrun=math.nan, baseline=result.part(disk, "lost_s"),
                       baseline_label=f"{how}, torch.save every {ckpt.DISK_EVERY} steps: none kept for the account",
                       decimals=1, compare=False))
    return out


def _cell(result: RestartResult, key: str, part: str) -> str:
    if part == "wall_s":
        return f"{result.part(key, part):.1f}"
    return f"{result.part(key, part):.1f} ({result.share(key, part):.1f} %)"


def restart_table(result: RestartResult) -> list[str]:
    keys = [v.key for v in RESTART_VARIANTS]
    lines = ["| | " + " | ".join(f"rankrun {SHORT[k]}" for k in keys) + " | torchrun |",
             "|---|" + "---|" * (len(keys) + 1)]

    def add(label: str, cells: list[str], torchrun: str = "no account") -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {torchrun} |")

    add("wall (s: job.start → job.end)", [_cell(result, k, "wall_s") for k in keys])
    for part in GOODPUT_PARTS:
        add(f"{PART_LABELS[part]} (s, % of wall)", [_cell(result, k, part) for k in keys])
    add("**goodput** (productive % of wall)", [f"**{result.share(k, 'productive_s'):.1f} %**" for k in keys])
    add("goodput, each job (%)", [fmt_list(result.values(k, lambda a: a.share("productive_s")), 1) for k in keys])
    add("wall, each job (s)", [fmt_list(result.values(k, lambda a: a.goodput["wall_s"]), 1) for k in keys])
    add("start-up + restart, each job (s)",
        [fmt_list(result.values(k, lambda a: a.goodput["startup_s"] + a.goodput["restart_s"]), 1) for k in keys])
    add("lost, each job (s)", [fmt_list(result.values(k, lambda a: a.goodput["lost_s"]), 1) for k in keys])
    add("step resumed from", [fmt_list(result.values(k, lambda a: a.resumed), 0) for k in keys], "—")
    add("the script's own loss: the kill - the killed rank's newest save (s)",
        [fmt_list(result.values(k, lambda a: a.script_lost), 1) for k in keys], "—")
    add("job.end's account - goodput.account(the file), largest part (ms)",
        [fmt_list(result.values(k, lambda a: a.drift * 1000), 0) for k in keys], "—")
    add("load average at the job's start", [fmt_list(result.values(k, lambda a: a.loadavg), 1) for k in keys], "—")
    add("other processes' CPU share during the job (%)",
        [fmt_list(result.values(k, lambda a: a.foreign * 100), 0) for k in keys], "—")
    return lines


def fmt_list(values: list[float], decimals: int) -> str:
    return ", ".join(f"{v:.{decimals}f}" for v in values) or "—"


def worth(result: RestartResult) -> list[str]:
    """The ratios that say what warm starts and kept progress are worth, as lines."""
    kc, kw, dc, dw = (v.key for v in RESTART_VARIANTS)
    before = {k: result.before_training(k) for k in (kc, kw, dc, dw)}
    lost = {k: result.part(k, "lost_s") for k in (kc, kw, dc, dw)}
    good = {k: result.share(k, "productive_s") for k in (kc, kw, dc, dw)}
    wall = {k: result.part(k, "wall_s") for k in (kc, kw, dc, dw)}
    return [
        f"- **warm starts** (`--preload torch`): start-up + restart {before[kc]:.1f} s cold against {before[kw]:.1f} s "
        f"warm with the checkpoint (cold ÷ warm {_ratio_of(before[kc], before[kw]):.2f}), {before[dc]:.1f} s against "
        f"{before[dw]:.1f} s with disk saves ({_ratio_of(before[dc], before[dw]):.2f}); the warm start-up holds the "
        "preload's one `import torch` at launch, before the first attempt;",
        f"- **kept progress** (`rankrun.checkpoint` every step): lost {lost[kc]:.1f} s against {lost[dc]:.1f} s with "
        f"the script's own disk saves, cold (disk ÷ kept {_ratio_of(lost[dc], lost[kc]):.2f}), {lost[kw]:.1f} s "
        f"against {lost[dw]:.1f} s warm ({_ratio_of(lost[dw], lost[kw]):.2f});",
        f"- **both**: goodput {good[dc]:.1f} % (cold + disk) against {good[kw]:.1f} % (`--preload torch` + checkpoint), "
        f"{good[kw] - good[dc]:+.1f} points; wall {wall[dc]:.1f} s against {wall[kw]:.1f} s (cold + disk ÷ warm + "
        f"checkpoint {_ratio_of(wall[dc], wall[kw]):.2f}).",
    ]


def restart_details(result: RestartResult) -> list[str]:
    return [
        "### The goodput account of the restart scenario: what warm starts and kept progress are worth", "",
        f"`bench/goodput_bench.py --restart` (its docstring says how): 2 gloo ranks of "
        f"`bench/payloads/ckpt_restart.py`, {ckpt.RESTART_BYTES / 1e6:g} MB each, {result.steps} steps of work, each "
        f"{result.step_s:g} s of sleep (its compute) then an all-reduce and a save; rank 1 SIGKILLs itself in step "
        f"{ckpt.KILL_AT} of attempt 0, attempt 1 resumes and finishes the {result.steps} steps. Each job `rankrun "
        "--standalone --max-restarts 1 --events FILE`, cold or `--preload torch`; with `rankrun.checkpoint.save` "
        f"every step, or the script's own `torch.save` to a local file every {ckpt.DISK_EVERY} steps and `torch.load` "
        "at its start (no `rankrun.checkpoint`: the account sees no kept step and counts all of attempt 0's "
        "training lost; the script itself redoes only the steps since its last file, the row *the script's own "
        "loss* says how much). The four interleaved in rotating order; rotations: "
        f"{result.reps}. Seconds are `job.end`'s `goodput`, each checked against `goodput.account` of the file's "
        "records; per part the median over the jobs, the % of wall the median of each job's share (so the parts' "
        "medians need not sum to the wall's). torchrun keeps no account: its column is empty.", "",
        *restart_table(result), "",
        *worth(result), "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=JOBS)
    parser.add_argument("--restart", action="store_true",
                        help="the restart scenario's account instead (2x2 rankrun variants, real jobs)")
    parser.add_argument("--quick", action="store_true", help="with --restart: one rotation (default 3)")
    args = parser.parse_args()
    if args.restart:
        with pycache():  # as bench/run.py: a private bytecode cache
            restart = run_restart(1 if args.quick else 3)
        print(text_table(restart_rows(restart)))
        print("\n".join(restart_details(restart)))
        return
    result = run(args.reps, args.jobs)
    for row in rows(result):
        print(f"{row.metric}: {row.rankrun:.{row.decimals}f} {row.unit}")
    print("\n".join(details(result)))


if __name__ == "__main__":
    main()
