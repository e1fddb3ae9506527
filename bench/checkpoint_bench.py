"""The ``checkpoint`` metric of bench/run.py (issue 37): ``rankrun.checkpoint`` beside what scripts do today.

``python bench/checkpoint_bench.py [--quick]``. Two parts, in one run:

- **save and load**, one job per state size (10 MB, 100 MB, 1 GB of float32 tensors: a model's two weights and their
  two optimizer moments, six tensors), each ONE rank started by ``rankrun --nproc-per-node 1 --standalone
  --max-restarts 1`` (``payloads/ckpt_save.py``): its attempt 0 times each call of ``rankrun.checkpoint.save``,
  ``torch.save`` to a local file in a temp dir (torch's defaults, no fsync: it returns with the bytes in the page cache)
  and ``torch.distributed.checkpoint.save`` to a local dir (``no_dist``, one process), interleaved in rotating order,
  then exits 1; its attempt 1 times one load of each (into a model's tensors). The first two saves of a process pay
  the page faults of memory never touched before (rankrun's two slots, the file's page cache): they are reported
  apart from the steady ones (the median of the third on).
- **failure → every rank resumed**: 2 gloo ranks (``payloads/ckpt_restart.py``) hold 100 MB each and run steps; rank 1
  SIGKILLs itself in step ``KILL_AT`` of attempt 0 (it writes ``time.time()`` just before). Measured: the time from
  that kill to every rank of attempt 1 with its state loaded (each writes its time past ``init_process_group`` and past
  the load and the copy into its tensors), and the step it resumed from. Four ways, interleaved in rotating order:
  rankrun with ``rankrun.checkpoint.save`` every step, cold and ``--preload torch``; and the same restart without
  it, where the script ``torch.save``s every ``DISK_EVERY`` steps to a local file and ``torch.load``s it at its start,
  under rankrun (cold) and under torchrun (with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, as ``warm_bench.py``).
- **the neighbour's copy**: two nodes on loopback (c10d, each its own fresh ``--local-addr``, ``RANKRUN_RDZV_SECRET``
  set), one rank each (``payloads/ckpt_neighbour.py``), per size (10 MB, 100 MB) one job saving every step for
  ``NEIGHBOUR_STEPS`` steps with a pause after each (``NEIGHBOUR_PAUSE``: 1 s, 2 s); each node's ``--events`` file gives, per
  step, the time from its ``checkpoint.kept`` event to its ``checkpoint.written`` event with ``to: "neighbour"``,
  ``state: "complete"`` (the events' ``mono``, one clock on one machine), and the copy's throughput (its bytes ÷ those
  seconds). The machine's load average and the other processes' share of its CPU during the jobs are reported with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness import (
    PAYLOADS,
    RANKRUN,
    TORCHRUN,
    BenchError,
    Launcher,
    cpu_mark,
    finish,
    foreign_load,
    log,
    pycache,
    run_timed,
    scratch,
    start,
    tail,
)
from report import Row, Target, fmt_samples, text_table

SAVE_PAYLOAD = PAYLOADS / "ckpt_save.py"
RESTART_PAYLOAD = PAYLOADS / "ckpt_restart.py"
SIZES = (10_000_000, 100_000_000, 1_000_000_000)
RESTART_BYTES = 100_000_000  # per rank
KILL_AT = 8  # rank 1 dies in this step of attempt 0, after every rank finished step KILL_AT - 1 (its save included)
DISK_EVERY = 5  # the disk variant's torch.save interval, in steps: it resumes from step 5, 2 completed steps lost
TARGET_GBPS = 1.0  # the issue's: a save's blocking time is a memory copy, at least 1 GB/s here (steady saves)
FIRST = 2  # saves of a process that pay first-touch page faults (rankrun's two slots; torch.save's file, dcp's files)
SAVE_WAYS = (("rankrun", "rankrun.checkpoint.save"), ("torch_save", "torch.save, local file"),
             ("dcp", "dcp.save, local dir"))
LOAD_WAYS = (("rankrun", "rankrun.checkpoint.load() (tensors mapped)"),
             ("rankrun_copy", "rankrun.checkpoint.load() + copy into the model"),
             ("torch_load", "torch.load(file)"), ("torch_load_copy", "torch.load(file) + copy into the model"),
             ("dcp", "dcp.load into the model (copies in place)"))
ONE_RANK = Launcher("rankrun", "rankrun", RANKRUN.argv, ("--standalone", "--max-restarts", "1"))
NEIGHBOUR_PAYLOAD = PAYLOADS / "ckpt_neighbour.py"
NEIGHBOUR_SIZES = (10_000_000, 100_000_000)  # per rank (one rank per node)
NEIGHBOUR_STEPS = 6
# seconds after each save, by size: a step's time, long enough for a copy to complete before the next save (a copy
# still under way when the next step is kept makes it wait, the newest waiting wins: 100 MB with 1 s here had 5 of 12
# copies overtaken and the rest 3.2 s from their save, a queue's time, not a copy's)
NEIGHBOUR_PAUSE = {10_000_000: 1.0, 100_000_000: 2.0}


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    launcher: Launcher
    mode: str  # the payload's MODE: keep (rankrun.checkpoint) or disk (torch.save / torch.load)
    env: tuple[tuple[str, str], ...] = ()


RESTART_OPTIONS = ("--standalone", "--max-restarts", "1")
KEEP_COLD = Variant("keep_cold", "rankrun cold + checkpoint", Launcher("rr", "rankrun", RANKRUN.argv, RESTART_OPTIONS),
                    "keep")
KEEP_WARM = Variant("keep_warm", "rankrun --preload torch + checkpoint",
                    Launcher("rrw", "rankrun", RANKRUN.argv, (*RESTART_OPTIONS, "--preload", "torch")), "keep")
DISK_COLD = Variant("disk_cold", "rankrun cold + torch.load of the last disk save",
                    Launcher("rr", "rankrun", RANKRUN.argv, RESTART_OPTIONS), "disk")
DISK_TORCHRUN = Variant("disk_torchrun", "torchrun + torch.load of the last disk save",
                        Launcher("tr", "torchrun", TORCHRUN.argv, RESTART_OPTIONS), "disk",
                        (("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),))
VARIANTS = (KEEP_COLD, KEEP_WARM, DISK_COLD, DISK_TORCHRUN)


# --------------------------------------------------------------------------- pure helpers


def first_and_steady(values: Sequence[float]) -> tuple[float, float]:
    """The mean of the first ``FIRST`` saves (first-touch page faults) and the median of the rest (NaN when none)."""
    first = statistics.fmean(values[:FIRST]) if values else math.nan
    rest = values[FIRST:]
    return first, statistics.median(rest) if rest else math.nan


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / 1e9 / seconds if seconds and not math.isnan(seconds) else math.nan


def size_label(nbytes: int) -> str:
    return f"{nbytes / 1e9:g} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:g} MB"


@dataclass
class Restart:
    """What one failure job measured, from the kill (seconds)."""

    loaded: float  # → every rank of attempt 1 past its load and copy
    init: float  # → every rank of attempt 1 past init_process_group
    started: float  # → every rank of attempt 1 at its script's first line
    load: float  # the slowest rank's load + copy (past init → loaded)
    fetch: float  # the slowest rank's load() or torch.load alone (past init → the state there, before the copy)
    resumed: int  # the step attempt 1 resumed from (both ranks agree, or the job is void)
    saves: list[list[float]]  # attempt 0's saves' blocking seconds, by rank


def restart_from(records: dict[tuple[int, int], dict[str, object]], fail_ts: float) -> Restart:
    """A ``Restart`` from every rank's record ((attempt, rank) → the payload's JSON) and the kill's time."""
    again = [records[(1, r)] for r in (0, 1)]
    resumed = {int(r["resumed"]) for r in again}  # type: ignore[call-overload]
    if len(resumed) != 1:
        raise BenchError(f"the ranks of attempt 1 resumed from different steps: {sorted(resumed)}")

    def latest(key: str) -> float:
        return max(float(r[key]) for r in again) - fail_ts  # type: ignore[arg-type]

    saves = [[float(s) for s in records[(0, r)]["saves"]] for r in (0, 1)]  # type: ignore[attr-defined]
    return Restart(latest("loaded"), latest("init"), latest("started"),
                   max(float(r["loaded"]) - float(r["init"]) for r in again),  # type: ignore[arg-type]
                   max(float(r["fetched"]) - float(r["init"]) for r in again),  # type: ignore[arg-type]
                   resumed.pop(), saves)


@dataclass(frozen=True)
class Copy:
    """One step's copy to the neighbour node, from one node's events."""

    node: int
    step: int
    after: float  # seconds from the node's ``checkpoint.kept`` of the step to its neighbour copy's completion
    seconds: float  # the ``checkpoint.written`` event's own (from the step's being kept, as the sender saw it)
    nbytes: int


def copies_from(events: Sequence[dict[str, object]], node: int) -> tuple[list[Copy], list[int]]:
    """The neighbour copies one node's events say are complete, by step, and the kept steps with none (abandoned:
    overtaken by a later save, or never sent)."""
    kept: dict[int, float] = {}
    done: dict[int, dict[str, object]] = {}
    for e in events:
        if e.get("event") == "checkpoint.kept" and e.get("state") == "kept":
            kept[int(e["step"])] = float(e["mono"])  # type: ignore[call-overload, arg-type]
        elif e.get("event") == "checkpoint.written" and e.get("to") == "neighbour" and e.get("state") == "complete":
            done[int(e["step"])] = e  # type: ignore[call-overload]
    copies = [Copy(node, step, float(done[step]["mono"]) - mono, float(done[step]["seconds"]),  # type: ignore[arg-type]
                   int(done[step]["bytes"]))  # type: ignore[call-overload]
              for step, mono in sorted(kept.items()) if step in done]
    return copies, sorted(set(kept) - set(done))


@dataclass
class Neighbour:
    """One two-node job's neighbour copies."""

    copies: list[Copy]
    missing: list[tuple[int, int]]  # (node, step) kept with no complete copy
    loadavg: float  # the 1-minute load average at the job's start
    foreign: float  # the share of the machine's CPU other processes used during the job

    def after(self) -> list[float]:
        return [c.after for c in self.copies]

    def gbps(self) -> list[float]:
        return [gbps(c.nbytes, c.after) for c in self.copies]


def _fresh_address() -> str:
    """A loopback address outside 127.0.0.x, random (as against.py): the rendezvous's fixed port cannot collide."""
    a, b, c = os.urandom(3)
    return f"127.{1 + a % 254}.{b}.{1 + c % 254}"


# --------------------------------------------------------------------------- the jobs


def measure_save(nbytes: int, saves: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """One rank: seconds of each save by way, and of one load by way (``LOAD_WAYS``)."""
    with scratch("ckpt-save") as tmp:
        argv = ONE_RANK.command(1, SAVE_PAYLOAD, [str(tmp), str(nbytes), str(saves)])
        timed = run_timed(argv, timeout=120 + nbytes / 1e9 * 180)
        if timed.rc != 0:
            raise BenchError(f"{size_label(nbytes)} save job exited {timed.rc}; stderr tail:\n{timed.stderr_tail}")
        try:
            saved = json.loads((tmp / "save.json").read_text())
            loaded = json.loads((tmp / "load.json").read_text())
        except (OSError, ValueError) as exc:
            raise BenchError(f"{size_label(nbytes)} save job wrote no result ({exc}):\n{timed.stderr_tail}") from None
    if loaded.get("rankrun_step") != saves:
        raise BenchError(f"{size_label(nbytes)}: load() gave step {loaded.get('rankrun_step')}, not the last ({saves})")
    return {k: v for k, v in saved.items() if k != "bytes"}, loaded


def measure_restart(variant: Variant) -> Restart:
    with scratch("ckpt-restart") as tmp:
        argv = variant.launcher.command(2, RESTART_PAYLOAD,
                                        [str(tmp), variant.mode, str(RESTART_BYTES), str(KILL_AT), str(DISK_EVERY)])
        timed = run_timed(argv, timeout=240, extra_env=dict(variant.env))
        if timed.rc != 0:
            raise BenchError(f"{variant.label} exited {timed.rc} (expected 0 after the restart); stderr tail:\n"
                             f"{timed.stderr_tail}")
        try:
            records = {(a, r): json.loads((tmp / f"a{a}_r{r}.json").read_text()) for a in (0, 1) for r in (0, 1)}
            fail_ts = float((tmp / "fail_ts").read_text())
        except (OSError, ValueError) as exc:
            raise BenchError(f"{variant.label}: a rank wrote no record ({exc}); stderr tail:\n{timed.stderr_tail}") from None
    return restart_from(records, fail_ts)


def measure_neighbour(nbytes: int, steps: int = NEIGHBOUR_STEPS) -> Neighbour:
    """Two nodes of one rank each saving ``nbytes`` every step; each node's neighbour copies, from its events."""
    pause = NEIGHBOUR_PAUSE.get(nbytes, 1.0)
    host, other = _fresh_address(), _fresh_address()
    loadavg, mark = os.getloadavg()[0], cpu_mark()
    with scratch("ckpt-neighbour") as tmp:
        procs = []
        for i, addr in enumerate((host, other)):
            argv = RANKRUN.command(1, NEIGHBOUR_PAYLOAD, [str(nbytes), str(steps), str(pause)],
                                   ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{host}:29400",
                                    "--rdzv-id", f"neighbour-{nbytes}", "--local-addr", addr, "--max-restarts", "0",
                                    "--events", str(tmp / f"node{i}.jsonl")])
            with (tmp / f"node{i}.err").open("wb") as err:
                procs.append(start(argv, stderr=err.fileno(), extra_env={"RANKRUN_RDZV_SECRET": "bench"}))
        rcs = [finish(proc, 120 + steps * pause).rc for proc in procs]
        if rcs != [0, 0]:
            raise BenchError(f"neighbour {size_label(nbytes)}: the nodes exited {rcs}; stderr tails:\n"
                             + "\n".join(tail(tmp / f"node{i}.err") for i in (0, 1)))
        copies: list[Copy] = []
        missing: list[tuple[int, int]] = []
        for i in (0, 1):
            events = [json.loads(line) for line in (tmp / f"node{i}.jsonl").read_text().splitlines() if line]
            got, lost = copies_from(events, i)
            copies += got
            missing += [(i, step) for step in lost]
    if not copies:
        raise BenchError(f"neighbour {size_label(nbytes)}: no neighbour copy completed (missing {missing})")
    return Neighbour(copies, missing, loadavg, foreign_load(mark, cpu_mark())[0])


def warm_up() -> None:
    """torchrun's own modules into the run's bytecode cache (the save jobs, first, do torch's, dcp's and rankrun's)."""
    timed = run_timed([*TORCHRUN.argv, "--help"], timeout=120, stdout=subprocess.DEVNULL)
    if timed.rc != 0:
        raise BenchError(f"torchrun --help exited {timed.rc}:\n{timed.stderr_tail}")


# --------------------------------------------------------------------------- the runs


@dataclass
class Result:
    sizes: tuple[int, ...]
    saves: dict[int, int]  # size → saves per way
    reps: int
    save: dict[int, dict[str, list[float]]] = field(default_factory=dict)  # size → way → seconds
    load: dict[int, dict[str, float]] = field(default_factory=dict)  # size → way → seconds
    restarts: dict[str, list[Restart]] = field(default_factory=dict)  # variant key → jobs
    neighbour: dict[int, Neighbour] = field(default_factory=dict)  # size → its two-node job

    def restart_values(self, key: str, attr: str) -> list[float]:
        return [float(getattr(r, attr)) for r in self.restarts.get(key, [])]

    def restart_median(self, key: str, attr: str) -> float:
        values = self.restart_values(key, attr)
        return statistics.median(values) if values else math.nan


def run(sizes: Sequence[int], saves: Sequence[int], reps: int,
        neighbour_sizes: Sequence[int] = NEIGHBOUR_SIZES) -> Result:
    result = Result(tuple(sizes), dict(zip(sizes, saves, strict=True)), reps)
    for nbytes, count in result.saves.items():
        result.save[nbytes], result.load[nbytes] = measure_save(nbytes, count)
        steady = {k: first_and_steady(v)[1] for k, v in result.save[nbytes].items()}
        log(f"  checkpoint {size_label(nbytes)}: steady save " + ", ".join(
            f"{label} {steady[k] * 1000:.0f} ms" for k, label in SAVE_WAYS))
    warm_up()
    for rep in range(reps):
        k = rep % len(VARIANTS)  # as harness.rotated: each rotation starts with another variant
        for variant in (*VARIANTS[k:], *VARIANTS[:k]):
            result.restarts.setdefault(variant.key, []).append(measure_restart(variant))
        log(f"  checkpoint restart rep {rep + 1}/{reps}: " + ", ".join(
            f"{v.label} {result.restart_values(v.key, 'loaded')[-1] * 1000:.0f} ms" for v in VARIANTS))
    for nbytes in neighbour_sizes:
        job = result.neighbour[nbytes] = measure_neighbour(nbytes)
        log(f"  checkpoint neighbour {size_label(nbytes)}: copy complete after the save, median "
            f"{statistics.median(job.after()) * 1000:.0f} ms, max {max(job.after()) * 1000:.0f} ms "
            f"({len(job.copies)} copies, {len(job.missing)} missing; load average {job.loadavg:.1f})")
    return result


# --------------------------------------------------------------------------- report


def rows(result: Result) -> list[Row]:
    out = []
    for nbytes in result.sizes:
        label = size_label(nbytes)
        times = {k: first_and_steady(v) for k, v in result.save[nbytes].items()}
        for index, which in ((0, f"first {FIRST} saves (mean)"), (1, "steady")):
            out.append(Row(f"checkpoint: save {label}, {which}: rankrun.checkpoint.save (torchrun column: dcp.save to a "
                           "local dir)", "ms", rankrun=times["rankrun"][index] * 1000,
                           torchrun=times["dcp"][index] * 1000, baseline=times["torch_save"][index] * 1000,
                           baseline_label="torch.save, local file, no fsync", target=None if index == 0 else _target(nbytes)))
        loads = result.load[nbytes]
        out.append(Row(f"checkpoint: load {label} into a model: rankrun.checkpoint.load + copy (torchrun column: "
                       "dcp.load)", "ms", rankrun=loads["rankrun_copy"] * 1000, torchrun=loads["dcp"] * 1000,
                       baseline=loads["torch_load_copy"] * 1000, baseline_label="torch.load + copy"))
    mb = RESTART_BYTES / 1e6
    for variant in (KEEP_COLD, KEEP_WARM):
        out.append(Row(f"checkpoint: failure → every rank resumed, state loaded (2 gloo ranks, {mb:g} MB each): "
                       f"{variant.label} (torchrun column: torchrun + torch.load of the last disk save)", "ms",
                       rankrun=result.restart_median(variant.key, "loaded") * 1000,
                       torchrun=result.restart_median(DISK_TORCHRUN.key, "loaded") * 1000,
                       baseline=result.restart_median(DISK_COLD.key, "loaded") * 1000,
                       baseline_label="rankrun cold + torch.load of the last disk save"))
    out.append(Row(f"checkpoint: completed steps lost by that failure (rank 1 killed in step {KILL_AT}; disk save every "
                   f"{DISK_EVERY} steps)", "steps", rankrun=KILL_AT - 1 - result.restart_median(KEEP_COLD.key, "resumed"),
                   torchrun=KILL_AT - 1 - result.restart_median(DISK_TORCHRUN.key, "resumed"), compare=False))
    for nbytes, job in result.neighbour.items():
        label, after = size_label(nbytes), job.after()
        for which, value in (("median", statistics.median(after)), ("max", max(after))):
            out.append(Row(f"checkpoint: the neighbour's copy complete after a save of {label}, {which} (2 nodes on "
                           "loopback, 1 rank each)", "ms", rankrun=value * 1000, torchrun=math.nan, compare=False))
        out.append(Row(f"checkpoint: the neighbour's copy of {label}, throughput (median: bytes ÷ save → complete)",
                       "GB/s", rankrun=statistics.median(job.gbps()), torchrun=math.nan,
                       decimals=2, compare=False))
    return out


def _target(nbytes: int) -> Target:
    """A steady save of ``nbytes`` blocks no longer than a copy at ``TARGET_GBPS``."""
    limit_ms = nbytes / (TARGET_GBPS * 1e9) * 1000
    return Target(f"≥ {TARGET_GBPS:g} GB/s: ≤ {limit_ms:,.0f} ms", lambda r: r.rankrun <= limit_ms)


_RESTART_LABELS = {
    "loaded": "kill → every rank of attempt 1 with its state loaded (ms)",
    "started": "  kill → every rank of attempt 1 at its script's first line (ms)",
    "init": "  kill → every rank of attempt 1 past init_process_group (ms)",
    "load": "  the slowest rank's load + copy into its tensors (ms)",
    "fetch": "    of which load() / torch.load(file) alone, before the copy (ms)",
    "resumed": "step resumed from",
}


def _ms(values: Sequence[float]) -> str:
    return fmt_samples([v * 1000 for v in values])


def _ratio(a: float, b: float) -> str:
    return "—" if math.isnan(a) or math.isnan(b) or not b else f"{a / b:.2f}"


def _save_table(result: Result) -> list[str]:
    lines = ["| state | save | " + " | ".join(label for _, label in SAVE_WAYS) + " | torch.save ÷ rankrun | dcp ÷ rankrun |",
             "|---|---|" + "---|" * (len(SAVE_WAYS) + 2)]
    for nbytes in result.sizes:
        times = {k: first_and_steady(v) for k, v in result.save[nbytes].items()}
        for index, which in ((0, f"first {FIRST} (mean)"), (1, "steady (median)")):
            cells = [f"{times[k][index] * 1000:,.1f} ms, {gbps(nbytes, times[k][index]):.2f} GB/s" for k, _ in SAVE_WAYS]
            lines.append(f"| {size_label(nbytes)} | {which} | " + " | ".join(cells)
                         + f" | {_ratio(times['torch_save'][index], times['rankrun'][index])}"
                         f" | {_ratio(times['dcp'][index], times['rankrun'][index])} |")
        lines.append(f"| {size_label(nbytes)} | every save (ms) | "
                     + " | ".join(_ms(result.save[nbytes][k]) for k, _ in SAVE_WAYS) + " | | |")
    return lines


def _load_table(result: Result) -> list[str]:
    lines = ["| state | " + " | ".join(label for _, label in LOAD_WAYS) + " |", "|---|" + "---|" * len(LOAD_WAYS)]
    for nbytes in result.sizes:
        cells = [f"{result.load[nbytes][k] * 1000:,.1f} ms ({gbps(nbytes, result.load[nbytes][k]):.2f} GB/s)"
                 for k, _ in LOAD_WAYS]
        lines.append(f"| {size_label(nbytes)} | " + " | ".join(cells) + " |")
    return lines


def _restart_table(result: Result) -> list[str]:
    lines = ["| | " + " | ".join(v.label for v in VARIANTS) + " |", "|---|" + "---|" * len(VARIANTS)]
    for attr, label in _RESTART_LABELS.items():
        cells = []
        for variant in VARIANTS:
            values = result.restart_values(variant.key, attr)
            med = result.restart_median(variant.key, attr)
            cells.append(f"{med:.0f} ({fmt_samples(values)})" if attr == "resumed"
                         else f"{med * 1000:,.0f} ({_ms(values)})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for index, which in ((0, f"the first {FIRST} of each rank, mean"), (1, "the later ones, median")):
        cells = []
        for variant in VARIANTS:
            values = [v for job in result.restarts.get(variant.key, []) for rank in job.saves
                      for v in (rank[:FIRST] if index == 0 else rank[FIRST:])]
            cells.append("—" if not values else
                         f"{(statistics.fmean(values) if index == 0 else statistics.median(values)) * 1000:,.0f}")
        lines.append(f"| a save's blocking time in attempt 0, {which} (ms; checkpoint: every step, disk: every "
                     f"{DISK_EVERY} steps) | " + " | ".join(cells) + " |")
    return lines


def _neighbour_table(result: Result) -> list[str]:
    lines = ["| state (per rank) | copies complete / kept | save → complete, median (ms) | max (ms) | every copy (ms, "
             "node 0's steps then node 1's) | throughput, median (GB/s) | the events' own seconds, median (ms) | "
             "load average at start | other processes' CPU share |", "|---|---|---|---|---|---|---|---|---|"]
    for nbytes, job in result.neighbour.items():
        after = job.after()
        lines.append(f"| {size_label(nbytes)} | {len(job.copies)} / {len(job.copies) + len(job.missing)} | "
                     f"{statistics.median(after) * 1000:,.0f} | {max(after) * 1000:,.0f} | {_ms(after)} | "
                     f"{statistics.median(job.gbps()):.2f} | "
                     f"{statistics.median(c.seconds for c in job.copies) * 1000:,.0f} | {job.loadavg:.1f} | "
                     f"{job.foreign:.0%} |")
    return lines


def details(result: Result) -> list[str]:
    return [
        "### Kept progress (`rankrun.checkpoint`)",
        "",
        "Produced by `bench/checkpoint_bench.py` (its docstring says how). **Save**: one rank under `rankrun "
        "--nproc-per-node 1 --standalone --max-restarts 1` per size, the three ways interleaved in rotating order in "
        "that rank, each call timed alone; saves per way: " + ", ".join(
            f"{size_label(n)} {c}" for n, c in result.saves.items()) + ". `torch.save` to a file in a temp dir on the "
        "local disk, torch's defaults (CRC-32 on), **no fsync** (it returns with the bytes in the page cache); "
        "`dcp.save(state, checkpoint_id=DIR, no_dist=True)` to a local dir, no fsync either; "
        f"`rankrun.checkpoint.save` returns once the copy is in the keeper's memory. The first {FIRST} saves of a "
        "process touch memory never touched before (rankrun's two slots, reserved and mapped then; the file's page "
        "cache): *first* is their mean, *steady* the median of the rest. GB/s = state bytes ÷ 10⁹ ÷ seconds.",
        "",
        *_save_table(result),
        "",
        "**Load**, in attempt 1 of the same job (a fresh process; torch.load's and dcp's first-call costs paid before "
        "on a small state), one of each, into a model's preallocated tensors:",
        "",
        *_load_table(result),
        "",
        f"**Failure → every rank resumed**: 2 gloo ranks of `bench/payloads/ckpt_restart.py`, "
        f"{RESTART_BYTES / 1e6:g} MB each, rank 1 SIGKILLs itself in step {KILL_AT} of attempt 0 (every rank past "
        f"step {KILL_AT - 1}'s save); `--standalone --max-restarts 1`; the checkpoint variants save every step, the "
        f"disk ones `torch.save` every {DISK_EVERY} steps (a temp name then a rename, no fsync; the file is still in "
        "the page cache when it is read back: the best case for disk). A rank's state is loaded after "
        f"`init_process_group` and copied into its tensors. Rotations: {result.reps}; medians, samples in brackets.",
        "",
        *_restart_table(result),
        "",
        *([] if not result.neighbour else [
            "**The neighbour's copy**: two nodes on loopback (`--nnodes 2`, c10d, each its own `--local-addr`, "
            "`RANKRUN_RDZV_SECRET` set), one rank each (`bench/payloads/ckpt_neighbour.py`), saving every step for "
            f"{NEIGHBOUR_STEPS} steps with a pause after each (" + ", ".join(
                f"{size_label(n)} {NEIGHBOUR_PAUSE.get(n, 1.0):g} s" for n in result.neighbour) + ": a copy still "
            "under way when the next step is kept makes that step wait); each node puts each step it kept "
            "to the other in the background. Per copy: from the node's `checkpoint.kept` event of the step to its "
            "`checkpoint.written` event (`to: neighbour`, `state: complete`) of the same step (the events' `mono`); "
            "throughput = the copy's bytes ÷ 10⁹ ÷ those seconds. Both nodes, their ranks and the copies share this "
            f"machine's {os.cpu_count()} CPUs: the copy competes with training for the CPU.",
            "",
            *_neighbour_table(result),
            "",
        ]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="10 and 100 MB, one rotation of the failure jobs")
    args = parser.parse_args()
    sizes, saves, reps = (SIZES[:2], (4, 4), 1) if args.quick else (SIZES, (8, 6, 4), 2)
    with pycache():  # as bench/run.py: a private bytecode cache
        result = run(sizes, saves, reps)
    print(text_table(rows(result)))
    print("\n".join(details(result)))


if __name__ == "__main__":
    main()
