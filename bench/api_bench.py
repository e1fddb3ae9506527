"""The ``api`` metric of bench/run.py: from ``launch(fn)`` to its return, for a no-op ``fn``, beside torch's own ways.

``python bench/api_bench.py [--reps 5]``. Each measurement is its own fresh process (``--one KIND --nproc N``) that
imports what it needs first and then times only the call: ``rankrun.launch(noop, nproc_per_node=N)``,
``torch.multiprocessing.spawn(noop, nprocs=N)`` and torch's ``elastic_launch(LaunchConfig(...), noop)()``
(standalone-like: c10d on localhost:0, start method spawn). The three kinds and N = 1, 8 run interleaved, in
rotating order; medians in milliseconds, and rankrun ÷ each of torch's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))

from harness import bench_env  # noqa: E402
from report import Row  # noqa: E402

KINDS = ("rankrun", "spawn", "elastic")
LABELS = {"rankrun": "rankrun.launch", "spawn": "torch.multiprocessing.spawn", "elastic": "torch elastic_launch"}
NPROCS = (1, 8)


def noop(*_args: object) -> None:
    return None


def _one(kind: str, nproc: int) -> float:
    """Seconds from the call to its return, in this fresh process (imports done before)."""
    if kind == "rankrun":
        import rankrun  # noqa: PLC0415

        start = time.perf_counter()
        rankrun.launch(noop, nproc_per_node=nproc)
        return time.perf_counter() - start
    import torch.multiprocessing as mp  # noqa: PLC0415
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch  # noqa: PLC0415

    start = time.perf_counter()
    if kind == "spawn":
        mp.spawn(noop, nprocs=nproc)  # type: ignore[attr-defined,no-untyped-call]
    else:
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, rdzv_backend="c10d",
                              rdzv_endpoint="localhost:0", run_id="bench", max_restarts=0, start_method="spawn")
        elastic_launch(config, noop)()
    return time.perf_counter() - start


def run(reps: int) -> dict[str, dict[int, list[float]]]:
    """Milliseconds per kind and N, every repetition running each once, in rotating order."""
    out: dict[str, dict[int, list[float]]] = {k: {n: [] for n in NPROCS} for k in KINDS}
    for rep in range(reps):
        for nproc in NPROCS:
            order = KINDS[rep % len(KINDS):] + KINDS[:rep % len(KINDS)]
            for kind in order:
                done = subprocess.run([sys.executable, __file__, "--one", kind, "--nproc", str(nproc)], env=bench_env(),
                                      capture_output=True, text=True, timeout=300, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"{kind} N={nproc} failed: {done.stderr[-2000:]}")
                out[kind][nproc].append(json.loads(done.stdout.strip().splitlines()[-1])["seconds"] * 1000)
    return out


def rows(result: dict[str, dict[int, list[float]]]) -> list[Row]:
    return [Row(f"rankrun.launch(noop), {n} worker{'s' if n > 1 else ''}: call → return (baseline: "
                "torch.multiprocessing.spawn; torchrun column: elastic_launch)", "ms",
                rankrun=statistics.median(result["rankrun"][n]), torchrun=statistics.median(result["elastic"][n]),
                baseline=statistics.median(result["spawn"][n]), baseline_label="mp.spawn")
            for n in NPROCS]


def details(result: dict[str, dict[int, list[float]]], reps: int) -> list[str]:
    lines = ["### From Python: `launch(fn)`", "",
             f"`python bench/api_bench.py --reps {reps}` (its docstring says how): a no-op `fn`, each call in a fresh "
             "process with its imports done first; medians of the call alone. torch's two start every worker through "
             "an entry point inside torch, so each worker imports torch (about a second of CPU each on this machine); "
             "rankrun's worker imports only `rankrun.api`. A real `fn` that uses torch pays that import in every "
             "worker under all three.", "",
             "| workers | " + " | ".join(f"{LABELS[k]} (ms)" for k in KINDS) + " | rankrun ÷ spawn | rankrun ÷ elastic_launch |",
             "|---|---|---|---|---|---|"]
    for n in NPROCS:
        med = {k: statistics.median(result[k][n]) for k in KINDS}
        lines.append(f"| {n} | " + " | ".join(f"{med[k]:,.0f} ({', '.join(f'{v:.0f}' for v in result[k][n])})" for k in KINDS)
                     + f" | {med['rankrun'] / med['spawn']:.2f}x | {med['rankrun'] / med['elastic']:.2f}x |")
    return [*lines, ""]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", choices=KINDS)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps({"seconds": _one(args.one, args.nproc)}))
        return 0
    result = run(args.reps)
    print("\n".join(details(result, args.reps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
