"""The ``observe`` metric of bench/run.py: what ``--events PATH --metrics-port 0`` cost, and how big a node's file is.

``python bench/observe_bench.py [--reps 31] [--fail-reps 5]``. Four parts:

- **launch**: ``rankrun --nproc-per-node 8 --no-python true``, plain, with both options (a fresh events file
  each run) and with each alone, interleaved in rotating order in the same repetitions; wall from exec to exit and
  CPU of the launcher and its workers; medians, and the median of the per-repetition differences (drift hits both
  alike). torchrun's ``--no-python true`` beside it, in the first few repetitions only (2 s a run), for reference.
  And the import time (``-X importtime``) of the modules only a job with the options imports.
- **failure of 512 ranks**: one node, ``--nproc-per-node 512 --no-python sh -c ...``: every worker sleeps but the last
  one started (local rank 511), which exits 1 at once; from exec of the launcher to its exit (non-zero), which
  includes the node's round, spawning 512 workers, the failure, stopping the 511 others. Plain and with both options,
  interleaved; the events file is checked (one ``failure``, ranks ``"0-511"``).
- **a round's share**: the real ``EventStream`` emitting ``rdzv.round`` records to the real ``EventLog`` (a file) and
  ``Metrics`` (the series); microseconds an event, against a stream with no consumer. A node emits one round a
  rendezvous, so this is what ``--events`` adds to a round, whatever its size.
- **file size**: what one node of a 256-node x 8-rank job writes when a rank of node 17 fails on attempt 0 and the
  job restarts once (``failure`` and ``restart`` on every node, as the round's word tells them), written through the
  real ``EventStream`` + ``EventLog`` into a file and measured, for node 0, the failing node and node 255.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))

from harness import (  # noqa: E402
    RANKRUN,
    TORCHRUN,
    BenchError,
    Samples,
    bench_env,
    cpu_mark,
    foreign_load,
    log,
    run_timed,
    scratch,
)
from rankrun.events.log import EventLog  # noqa: E402
from rankrun.events.metrics import Metrics  # noqa: E402
from rankrun.events.records import (  # noqa: E402
    Failure,
    JobEnd,
    JobStart,
    RdzvRound,
    Record,
    Restart,
    Startup,
    WorkersEnd,
    WorkersStart,
)
from rankrun.events.stream import EventStream  # noqa: E402
from rankrun.ranges import range_string  # noqa: E402
from report import Row, Target, fmt_samples  # noqa: E402

NPROC = 8
FAIL_NPROC = 512
TORCH_REPS = 5
LAUNCH_TARGET_MS = 2.0
SIZE_TARGET = 4096
NODES, RANKS = 256, 8
FAIL_NODE, FAIL_LOCAL = 17, 3
EMITS, EMIT_ROUNDS = 5_000, 9
FAIL_SCRIPT = f'[ "$LOCAL_RANK" = {FAIL_NPROC - 1} ] && exit 1; exec sleep 300'
KINDS = ("plain", "observe")
LAUNCH_KINDS = ("plain", "observe", "events", "metrics")  # the last two: each option alone, to tell their shares
OPTIONS = {"plain": (), "observe": ("--events", "{events}", "--metrics-port", "0"), "events": ("--events", "{events}"),
           "metrics": ("--metrics-port", "0"), "torchrun": ()}
# What only a job with the options imports (agent/observers.py imports them lazily), against what every job does
BASE_IMPORTS = "import rankrun.__main__, rankrun.agent.observers"
OPTION_IMPORTS = "rankrun.events.log, rankrun.events.metrics"


@dataclass
class Result:
    reps: int
    fail_reps: int
    wall: Samples = field(default_factory=lambda: Samples("ms"))
    cpu: Samples = field(default_factory=lambda: Samples("ms"))
    fail: Samples = field(default_factory=lambda: Samples("ms"))
    fail_cpu: Samples = field(default_factory=lambda: Samples("ms"))
    emit_us: dict[str, float] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    worst_exception: int = 0  # node 255's bytes with a 500-character exception
    import_us: list[int] = field(default_factory=list)  # self time of the modules only the options import
    load: dict[str, tuple[float, float]] = field(default_factory=dict)  # part -> (others' CPU share, steal share)


def _argv(kind: str, nproc: int, events: Path, program: Sequence[str]) -> list[str]:
    observe = [o.format(events=events) for o in OPTIONS[kind]]
    launcher = TORCHRUN if kind == "torchrun" else RANKRUN
    return [*launcher.argv, "--nproc-per-node", str(nproc), *observe, "--no-python", *program]


def _launch(kind: str, tmp: Path) -> tuple[float, float]:
    events = tmp / "events.jsonl"
    events.unlink(missing_ok=True)
    argv = _argv(kind, NPROC, events, ["true"])
    timed = run_timed(argv, timeout=180)
    if timed.rc != 0:
        raise BenchError(f"{' '.join(argv)} exited {timed.rc}; stderr tail:\n{timed.stderr_tail}")
    if kind in ("observe", "events") and events.read_text().count('"event":"job.end"') != 1:
        raise BenchError(f"{events}: no job.end line")
    return timed.wall * 1000, timed.cpu * 1000


def _fail(kind: str, tmp: Path) -> tuple[float, float]:
    events = tmp / "events.jsonl"
    events.unlink(missing_ok=True)
    argv = _argv(kind, FAIL_NPROC, events, ["sh", "-c", FAIL_SCRIPT])
    timed = run_timed(argv, timeout=300)
    if timed.rc == 0:
        raise BenchError(f"{kind}: 512 ranks, one failing: the launcher exited 0; stderr tail:\n{timed.stderr_tail}")
    if kind == "observe":
        text = events.read_text()
        if text.count('"event":"failure"') != 1 or '"ranks":"0-511"' not in text:
            raise BenchError(f"{events}: expected one failure and ranks 0-511:\n{text[-2000:]}")
    return timed.wall * 1000, timed.cpu * 1000


def measure_launch(result: Result) -> None:
    with scratch("observe") as tmp:
        for kind in (*LAUNCH_KINDS, "torchrun"):  # unrecorded: the page cache, the bytecode cache
            _launch(kind, tmp)
        mark = cpu_mark()
        for rep in range(result.reps):
            kinds = [*LAUNCH_KINDS, *(["torchrun"] if rep < TORCH_REPS else [])]
            k = rep % len(kinds)
            for kind in kinds[k:] + kinds[:k]:
                wall, cpu = _launch(kind, tmp)
                result.wall.add(kind, wall)
                result.cpu.add(kind, cpu)
            if rep % 10 == 9 or rep == result.reps - 1:
                log(f"  observe launch rep {rep + 1}/{result.reps}: plain {result.wall.median('plain'):.0f} ms, "
                    f"observe {result.wall.median('observe'):.0f} ms (medians so far)")
        result.load["launch"] = foreign_load(mark, cpu_mark())


def _import_us() -> int:
    """Microseconds (``-X importtime``, self) of the modules a job with the options imports and one without does not."""
    def times(extra: str) -> dict[str, int]:
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", BASE_IMPORTS + extra], env=bench_env(),
                              capture_output=True, text=True, timeout=60, check=True)
        out = {}
        for line in done.stderr.splitlines():
            head, _, name = line.rpartition("|")
            if line.startswith("import time:") and head.split(":")[1].split("|")[0].strip().isdigit():
                out[name.strip()] = int(head.split(":")[1].split("|")[0])
        return out
    base, more = times(""), times(", " + OPTION_IMPORTS)
    return sum(v for k, v in more.items() if k not in base)


def measure_failure(result: Result) -> None:
    with scratch("observe-fail") as tmp:
        mark = cpu_mark()
        for rep in range(result.fail_reps):
            for kind in KINDS[rep % 2:] + KINDS[:rep % 2]:
                wall, cpu = _fail(kind, tmp)
                result.fail.add(kind, wall)
                result.fail_cpu.add(kind, cpu)
            log(f"  observe failure, {FAIL_NPROC} ranks, rep {rep + 1}/{result.fail_reps}: "
                f"plain {result.fail.by_launcher['plain'][-1]:.0f} ms, observe {result.fail.by_launcher['observe'][-1]:.0f} ms")
        result.load["failure"] = foreign_load(mark, cpu_mark())


def _per_emit_us(stream: EventStream) -> float:
    best = float("inf")
    for _ in range(EMIT_ROUNDS):
        t0 = time.perf_counter()
        for n in range(EMITS):
            stream.emit(RdzvRound(n + 1, NODES, NODES * RANKS, 137, 0.318774))
        best = min(best, (time.perf_counter() - t0) / EMITS * 1e6)
    return best


def measure_emit(result: Result) -> None:
    run = str(uuid.uuid4())
    with tempfile.TemporaryDirectory(prefix="rankrun-bench-emit-") as tmp:
        result.emit_us["none"] = _per_emit_us(EventStream(run, "10.1.2.3"))
        path = Path(tmp) / "events.jsonl"
        log_ = EventLog.open(str(path), lambda _line: None)
        result.emit_us["events"] = _per_emit_us(EventStream(run, "10.1.2.3", [log_]))
        log_.close()
        path.unlink()
        log_ = EventLog.open(str(path), lambda _line: None)
        both = EventStream(run, "10.1.2.3", [log_, Metrics(run)])
        result.emit_us["both"] = _per_emit_us(both)
        log_.close()


def host(node: int) -> str:
    """A long, realistic node address (the rendezvous knows a node by its hostname or address)."""
    return f"gpu-node-{node:04d}.a100-pool-7.cluster.example.com"


EXCEPTION = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
             "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")


def node_facts(node: int, exception: str) -> list[Record]:
    """What one node of the job writes, in order (``agent/multinode.py``, ``agent/watch.py``, ``agent/observers.py``):
    its round, its workers, how they ended (``failed`` on the failing node, ``moved_on`` elsewhere: the round's word
    stopped them), the root cause and the restart the next round's word tells every node, the second round,
    the second attempt's workers, the end. A ``startup`` per attempt is counted too (item 5 of the issue)."""
    ranks = range_string(range(node * RANKS, (node + 1) * RANKS))
    failed_rank = FAIL_NODE * RANKS + FAIL_LOCAL
    facts: list[Record] = [JobStart(RANKS, f"{NODES}", 1, "c10d", "/shared/home/alice/llm/train_llama.py")]
    for attempt in (0, 1):
        facts += [
            RdzvRound(attempt + 1, NODES, NODES * RANKS, node, 0.318774 if attempt == 0 else 0.104512),
            WorkersStart(attempt, ranks, tuple(3_000_000 + attempt * 100 + i for i in range(RANKS))),
            Startup(attempt, 48.172635, 0.318774, 0.094418, 21.503826, 44.918237, node * RANKS + 5, 0.284113,
                    1.837465, node * RANKS + 2),
        ]
        if attempt == 0:
            facts += [
                WorkersEnd(0, "failed" if node == FAIL_NODE else "moved_on"),
                Failure(0, failed_rank, host(FAIL_NODE), 1, None, exception),
                Restart(1, f"rank {failed_rank} on {host(FAIL_NODE)} exited 1: {exception}", 0),  # agent.facts.failure_line
            ]
        else:
            facts.append(WorkersEnd(1, "succeeded"))
    return [*facts, JobEnd(0, "succeeded")]


def write_node(node: int, path: Path, exception: str) -> tuple[int, int]:
    """Bytes and lines of ``node``'s events file, written by the real stream and log."""
    run = str(int(uuid.UUID(int=0x3F2C1A9B_77E0_4D55_9C1B_0A6E24F5D3C8).hex, 16))  # the c10d default run id's form
    path.unlink(missing_ok=True)
    log_ = EventLog.open(str(path), lambda _line: None)
    stream = EventStream(run, host(node), [log_])
    for fact in node_facts(node, exception):
        stream.emit(fact)
    log_.close()
    if log_.dropped:
        raise BenchError(f"{path}: {log_.dropped} events not written")
    data = path.read_bytes()
    return len(data), data.count(b"\n")


def measure_size(result: Result) -> None:
    with tempfile.TemporaryDirectory(prefix="rankrun-bench-size-") as tmp:
        for label, node in (("node 0", 0), (f"node {FAIL_NODE} (the failing one)", FAIL_NODE), (f"node {NODES - 1}", NODES - 1)):
            result.sizes[label], result.lines[label] = write_node(node, Path(tmp) / f"{node}.jsonl", EXCEPTION)
        result.worst_exception, _ = write_node(NODES - 1, Path(tmp) / "worst.jsonl", "E" * 600)


def run(reps: int, fail_reps: int) -> Result:
    result = Result(reps, fail_reps)
    measure_size(result)
    log(f"  observe events file, {NODES} nodes x {RANKS} ranks, one restart: "
        + ", ".join(f"{k} {v} B" for k, v in result.sizes.items()))
    measure_emit(result)
    log("  observe emit: " + ", ".join(f"{k} {v:.1f} us" for k, v in result.emit_us.items()))
    measure_launch(result)
    result.import_us = sorted(_import_us() for _ in range(5))
    log(f"  observe: the options' imports {statistics.median(result.import_us) / 1000:.1f} ms (self, median of 5)")
    measure_failure(result)
    return result


def _paired(samples: Samples, kind: str = "observe") -> list[float]:
    return [o - p for p, o in zip(samples.by_launcher["plain"], samples.by_launcher[kind], strict=True)]


def rows(result: Result) -> list[Row]:
    wall_d, cpu_d = statistics.median(_paired(result.wall)), statistics.median(_paired(result.cpu))
    launch_target = Target(f"≤ +{LAUNCH_TARGET_MS:g} ms (median of paired differences: {wall_d:+.1f} ms)",
                           lambda _r: wall_d <= LAUNCH_TARGET_MS)
    cpu_target = Target(f"≤ +{LAUNCH_TARGET_MS:g} ms (median of paired differences: {cpu_d:+.1f} ms)",
                        lambda _r: cpu_d <= LAUNCH_TARGET_MS)
    size_target = Target("≤ 4 KB a node", lambda r: r.rankrun <= SIZE_TARGET)
    return [
        Row(f"observing, --events FILE --metrics-port 0: launch of {NPROC} --no-python true workers (wall, exec→exit; "
            "torchrun column: torchrun --no-python true)", "ms", rankrun=result.wall.median("observe"),
            torchrun=result.wall.median("torchrun"), baseline=result.wall.median("plain"), baseline_label="without",
            target=launch_target, decimals=1),
        Row(f"observing, --events FILE --metrics-port 0: launch of {NPROC} --no-python true workers (CPU of the launcher "
            "and its workers; torchrun column: torchrun --no-python true)", "ms", rankrun=result.cpu.median("observe"),
            torchrun=result.cpu.median("torchrun"), baseline=result.cpu.median("plain"), baseline_label="without",
            target=cpu_target, decimals=1),
        Row(f"observing, --events FILE --metrics-port 0: {FAIL_NPROC} ranks on one node, the last one fails (exec→exit)",
            "ms", rankrun=result.fail.median("observe"), torchrun=float("nan"), baseline=result.fail.median("plain"),
            baseline_label="without", compare=False),
        Row(f"observing, --events FILE --metrics-port 0: {FAIL_NPROC} ranks on one node, the last one fails (CPU of the "
            "launcher and its workers)", "ms", rankrun=result.fail_cpu.median("observe"), torchrun=float("nan"),
            baseline=result.fail_cpu.median("plain"), baseline_label="without", compare=False),
        Row(f"observing: --events file of one node, {NODES} nodes x {RANKS} ranks, one failure and one restart "
            "(largest node file)",
            "bytes", rankrun=float(max(result.sizes.values())), torchrun=float("nan"), target=size_target, compare=False),
    ]


def details(result: Result) -> list[str]:
    wall, cpu, fail = result.wall, result.cpu, result.fail
    lines = [
        "### Observing a job: the cost of `--events` and `--metrics-port`",
        "",
        f"`python bench/observe_bench.py --reps {result.reps} --fail-reps {result.fail_reps}` (its docstring says how). "
        "*without* is `rankrun` with neither option, *with* adds `--events FILE --metrics-port 0` (a fresh file each "
        "run, bound on 127.0.0.1); the two run interleaved, in rotating order, in the same repetitions. The difference "
        "is given two ways: of the medians, and the median of each repetition's own difference (with - without), "
        "which drift on the shared machine hits alike. Other processes used "
        + ", ".join(f"{o:.0%} of the machine's CPU during the {k} part (steal {st:.0%})" for k, (o, st) in result.load.items())
        + (": **the machine was shared and loaded during this run; absolute times are inflated and noisy, read the "
           "differences against the spread of the samples.**" if any(o > 0.10 for o, _ in result.load.values()) else "."),
        "",
        f"| {NPROC} `--no-python true` workers | without | with | with - without (medians) | median of paired "
        "differences | ratio | samples without | samples with |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in (("wall, exec→exit (ms)", wall), ("CPU, launcher + workers (ms)", cpu)):
        p, o = s.median("plain"), s.median("observe")
        lines.append(f"| {name} | {p:.1f} | {o:.1f} | {o - p:+.1f} | {statistics.median(_paired(s)):+.1f} | {o / p:.3f}x | "
                     f"{fmt_samples(s.by_launcher['plain'])} | {fmt_samples(s.by_launcher['observe'])} |")
    lines += ["", "Each option alone, in the same repetitions (median of the paired differences against *without*): "
              + "; ".join(f"`{' '.join(OPTIONS[k]).format(events='FILE')}` wall {statistics.median(_paired(wall, k)):+.1f} ms, "
                          f"CPU {statistics.median(_paired(cpu, k)):+.1f} ms" for k in ("events", "metrics"))
              + f". What the options import that a job without them does not (`{OPTION_IMPORTS}`, and `json` with "
              f"them; `-X importtime`, self times, median of {len(result.import_us)}): "
              f"{statistics.median(result.import_us) / 1000:.1f} ms ({fmt_samples([v / 1000 for v in result.import_us], 1)})."]
    lines += ["", f"torchrun `--nproc-per-node {NPROC} --no-python true`, for reference ({len(wall.by_launcher['torchrun'])} "
              f"runs among the first repetitions): wall median {wall.median('torchrun'):,.0f} ms "
              f"({fmt_samples(wall.by_launcher['torchrun'])}), CPU median {cpu.median('torchrun'):,.0f} ms.", ""]
    lines += [
        f"**A {FAIL_NPROC}-rank job's round and failure**, one node (the simulated-node rendezvous of *Rendezvous* above "
        "drives the store directly, not an agent, so it has no events to cost): `rankrun --nproc-per-node "
        f"{FAIL_NPROC} [--events FILE --metrics-port 0] --no-python sh -c '{FAIL_SCRIPT}'`. Exec → exit (exit code 1): "
        "the round, 512 spawns, the last one's failure, stopping the 511 others. The events file is checked "
        "(one `failure`, `\"ranks\":\"0-511\"`).",
        "",
        "| 512 ranks, one fails | without | with | with - without (medians) | median of paired differences | ratio | "
        "samples without | samples with |",
        "|---|---|---|---|---|---|---|---|",
        *(f"| {name} | {s.median('plain'):,.0f} | {s.median('observe'):,.0f} | {s.median('observe') - s.median('plain'):+.0f} | "
          f"{statistics.median(_paired(s)):+.0f} | {s.median('observe') / s.median('plain'):.3f}x | "
          f"{fmt_samples(s.by_launcher['plain'])} | {fmt_samples(s.by_launcher['observe'])} |"
          for name, s in (("exec → exit (ms)", fail), ("CPU, launcher + workers (ms)", result.fail_cpu))),
        "",
        f"**An event's cost, a round's share**: the real `EventStream` emitting {EMITS:,} `rdzv.round` records "
        f"(best of {EMIT_ROUNDS} rounds): "
        f"no consumer {result.emit_us['none']:.1f} µs an event; to the `--events` log (a file) "
        f"{result.emit_us['events']:.1f} µs; to the log and the metrics {result.emit_us['both']:.1f} µs. A node emits one "
        "`rdzv.round` per round, so `--events` and `--metrics-port` add about "
        f"{result.emit_us['both'] - result.emit_us['none']:.0f} µs to a round of any size (a failure adds 3 events, "
        "`workers.end`, `failure`, `restart`; the job 2 more).",
        "",
        f"**The events file's size**, {NODES} nodes x {RANKS} ranks, rank {FAIL_NODE * RANKS + FAIL_LOCAL} (node "
        f"{FAIL_NODE}) fails on attempt 0 with an NCCL error ({len(EXCEPTION)} characters), one restart, attempt 1 "
        "succeeds. Each node's file is written by the real `EventStream` and `EventLog` (`rankrun.events.stream`, "
        "`rankrun.events.log`) from the records a node of that job emits, in its order (`agent/multinode.py`, "
        "`agent/watch.py`, `agent/observers.py`): `job.start`; per attempt `rdzv.round`, `workers.start` (ranks as "
        "a range, 8 pids), `startup`; after attempt 0 `workers.end` (`failed` on node 17, `moved_on` on the others), "
        "`failure` and `restart` (the round's word tells every node); `workers.end` of attempt 1; `job.end`. No "
        "`node.lost` (no node is lost: a failure restarts the round with every node). Long values throughout: a "
        "c10d-style run id (39 digits), node addresses like "
        f"`{host(255)}`, the script `/shared/home/alice/llm/train_llama.py`, 7-digit pids.",
        "",
        "| node | lines | bytes |",
        "|---|---|---|",
        *(f"| {k} | {result.lines[k]} | {v:,} |" for k, v in result.sizes.items()),
        "",
        f"With the longest exception the file keeps (500 characters; longer ones are cut), node {NODES - 1}'s file is "
        f"{result.worst_exception:,} bytes. Target ≤ 4 KB (4,096 bytes) a node. The size does not grow with ranks "
        "(ranges) or nodes (each node writes its own file; only the digits of ranks and addresses grow).",
        "",
    ]
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=31)
    parser.add_argument("--fail-reps", type=int, default=7)
    args = parser.parse_args(argv)
    result = run(args.reps, args.fail_reps)
    print("\n".join(details(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
