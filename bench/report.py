"""Summary rows and their rendering: a plain-text table for the terminal, Markdown for BENCHMARKS.md."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum


class Better(Enum):
    LOWER = "lower"  # times, memory: ratio vs baseline = value ÷ baseline
    HIGHER_THROUGHPUT = "throughput"  # walls of equal work: ratio = throughput ÷ baseline throughput = baseline ÷ value


@dataclass(frozen=True)
class Target:
    text: str
    met: Callable[[Row], bool]


@dataclass(frozen=True)
class Row:
    metric: str
    unit: str
    rankrun: float
    torchrun: float
    baseline: float | None = None
    baseline_label: str = ""
    better: Better = Better.LOWER
    target: Target | None = None
    decimals: int = 0
    compare: bool = True  # show rankrun ÷ torchrun

    def vs_baseline(self, value: float) -> float | None:
        if self.baseline is None or not self.baseline or math.isnan(value):
            return None
        return value / self.baseline if self.better is Better.LOWER else self.baseline / value

    @property
    def rankrun_vs_torchrun(self) -> float:
        return self.rankrun / self.torchrun if self.compare and self.torchrun else float("nan")

    def verdict(self) -> str:
        if self.target is None:
            return ""
        return "yes" if self.target.met(self) else "**NO**"


HEADERS = ("metric", "unit", "baseline", "rankrun", "torchrun", "rankrun vs base", "torchrun vs base",
           "rankrun ÷ torchrun", "target", "met")


def _num(value: float | None, decimals: int) -> str:
    if value is None or math.isnan(value):
        return "—"
    return f"{value:,.{decimals}f}"


def _ratio(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.2f}x"


def cells(row: Row) -> list[str]:
    base = "—" if row.baseline is None else f"{_num(row.baseline, row.decimals)} ({row.baseline_label})"
    return [
        row.metric,
        row.unit,
        base,
        _num(row.rankrun, row.decimals),
        _num(row.torchrun, row.decimals),
        _ratio(row.vs_baseline(row.rankrun)),
        _ratio(row.vs_baseline(row.torchrun)),
        _ratio(row.rankrun_vs_torchrun),
        row.target.text if row.target else "",
        row.verdict(),
    ]


def text_table(rows: Sequence[Row]) -> str:
    body = [list(HEADERS), *(cells(r) for r in rows)]
    widths = [max(len(line[i].replace("*", "")) for line in body) for i in range(len(HEADERS))]
    out = []
    for n, line in enumerate(body):
        out.append("  ".join(c.replace("*", "").ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def markdown_table(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def fmt_samples(values: Sequence[float], decimals: int = 0) -> str:
    return ", ".join(f"{v:.{decimals}f}" for v in values)
