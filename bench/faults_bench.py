"""The network-fault rows of ``bench/run.py``: ``faults.py`` (embedded store, torchrun beside it) and the etcd partition
(``rendezvous.py --partition``). Both need root, iproute2 and nftables; without them the rows are left out and said so."""

from __future__ import annotations

import math
import statistics

import faults
import rendezvous
from harness import log
from report import Row, Target

CAP = 60.0
TORCH_REPS = 1  # torchrun waits out gloo and TCP: every run costs the cap


def run(reps: int) -> dict[str, object]:
    why = faults.possible()
    if why is not None:
        log(f"  faults: not run: {why}")
        return {"skipped": why}
    return {"runs": faults.run(reps, TORCH_REPS, CAP, log), "partition": rendezvous.run_partition(faults.PARTITION_REPS)}


def _median(values: list[float | None]) -> float:
    return float("nan") if not values or None in values else statistics.median(v for v in values if v is not None)


def rows(result: dict[str, object]) -> list[Row]:
    if "skipped" in result:
        return []
    runs: faults.Runs = result["runs"]  # type: ignore[assignment]
    out = []
    for fault, what, key, target in faults.FAULTS:
        kind = fault.split(":")[0]
        torch = _median([r[key] for r in runs.get(f"torchrun {kind}", [])])
        torch_note = "" if kind != "cut" else ("; torchrun: > 60 s, capped" if math.isnan(torch) else "")
        out.append(Row(f"network fault, {fault.split(':')[-1].strip()}: until {what} (3 s window{torch_note})", "s",
                       rankrun=_median([r[key] for r in runs[kind]]), torchrun=torch, decimals=2,
                       target=Target(f"rankrun ≤ {target:g} s", lambda row, t=target: row.rankrun <= t)))
    partition: dict[str, dict[str, object]] = result["partition"]  # type: ignore[assignment]
    for ttl in ("3", "15"):
        p = partition.get(ttl)
        if p:
            out.append(Row(f"etcd leader partitioned (3 members, {ttl} s lease): until a keep-alive is accepted again, median of "
                           f"{len(p['keepalive_s'])} (lease kept {p['kept']}/{len(p['keepalive_s'])})", "s",  # type: ignore[arg-type]
                           rankrun=float(p["keepalive_median"]), torchrun=float("nan"), decimals=2, compare=False))  # type: ignore[arg-type]
    return out


def details(result: dict[str, object]) -> list[str]:
    lines = ["### Network faults", ""]
    if "skipped" in result:
        return [*lines, f"Not run: {result['skipped']}.", ""]
    runs: faults.Runs = result["runs"]  # type: ignore[assignment]
    lines += [f"`python bench/faults.py --reps {len(runs['cut'])} --torch-reps {TORCH_REPS} --cap {CAP:g}` (its docstring says "
              "how): three hosts in network namespaces on one bridge, one gloo worker each in an all_reduce loop, "
              "`keep_alive_interval=1,keep_alive_max_attempt=3`, `--shutdown-timeout 2`; the faults are silent (no RST, no FIN). "
              "Target from the issue: window + shutdown timeout + 2 s.", "", *faults.table(runs, CAP), ""]
    partition: dict[str, dict[str, object]] = result["partition"]  # type: ignore[assignment]
    lines += [f"`python bench/rendezvous.py --partition --reps {partition['reps']}`: a 3-member etcd, each member on its own "
              "namespace host, a client on a fourth keeping a lease alive through all three endpoints; the leader's switch "
              "port drops everything; timed from the cut until a keep-alive is accepted again (the client's attempt on the "
              "cut member is bounded by a third of the lease, then it asks the others).", ""]
    for ttl in ("3", "15"):
        p = partition.get(ttl)
        if p:
            samples = ", ".join(f"{v:.2f}" for v in p["keepalive_s"])  # type: ignore[attr-defined]
            lines.append(f"- {ttl} s lease: {samples} s (median {float(p['keepalive_median']):.2f} s), lease kept "  # type: ignore[arg-type]
                         f"{p['kept']} of {len(p['keepalive_s'])}")  # type: ignore[arg-type]
    return [*lines, ""]
