"""Issue 36, item 6: what deciding ``--preload torch`` by default would cost the launcher, and which scripts it picks.

``python bench/preload_default.py``. The rule (not enacted: the proposal is in BENCHMARKS.md's warm section): a script
whose top level imports torch (``import torch``, ``import torch.distributed as dist``, ``from torch import nn``, also
inside a top-level ``if``/``try``/``with``, never inside a function or class) is read with ``ast``, never run. Prints,
for each script of this repository's examples and test payloads and for a generated 5,000-line one, whether the rule
picks it and what reading it costs (median of 20 reads: open, read, parse, walk).
"""

from __future__ import annotations

import ast
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_BLOCKS = (ast.If, ast.Try, ast.With) + ((ast.TryStar,) if sys.version_info >= (3, 11) else ())


def imports_torch_at_top(source: str) -> bool:
    """Whether the module's top level imports torch (pure)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "torch":
            return True
        if isinstance(node, _BLOCKS):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, ()):
                    todo.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])
    return False


def _cost(path: Path, reps: int = 20) -> tuple[bool, float]:
    times, picked = [], False
    for _ in range(reps):
        began = time.perf_counter()
        picked = imports_torch_at_top(path.read_text())
        times.append(time.perf_counter() - began)
    return picked, statistics.median(times) * 1000


def _generated(folder: Path) -> Path:
    lines = ["import os", "import torch", "import torch.distributed as dist", ""]
    for i in range(1250):
        lines += [f"def step_{i}(model, batch):", f"    loss = model(batch).sum() * {i}", "    return loss", ""]
    path = folder / "generated_5000_lines.py"
    path.write_text("\n".join(lines))
    return path


def main() -> None:
    import tempfile  # noqa: PLC0415

    scripts = sorted((REPO / "examples").glob("*.py")) + sorted((REPO / "tests" / "payloads").glob("*.py"))
    with tempfile.TemporaryDirectory() as tmp:
        scripts.append(_generated(Path(tmp)))
        rows = [(path.name, path.stat().st_size, *_cost(path)) for path in scripts]
    print(f"{'script':32} {'bytes':>8} {'picked':>7} {'read ms':>8}")
    for name, size, picked, ms in rows:
        print(f"{name:32} {size:8d} {'yes' if picked else 'no':>7} {ms:8.3f}")
    picked = [r for r in rows if r[2]]
    print(f"picked {len(picked)} of {len(rows)}; read cost median {statistics.median(r[3] for r in rows):.3f} ms, "
          f"max {max(r[3] for r in rows):.3f} ms")


if __name__ == "__main__":
    main()
