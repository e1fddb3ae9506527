"""The dependency directions docs/design.md draws, checked on the source itself (every import, at any depth)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "rankrun"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n.startswith("rankrun.")}


def _offenders(folder: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    found = []
    for path in sorted((SRC / folder).rglob("*.py")):
        if path.relative_to(SRC).as_posix() in allowed:
            continue
        for name in sorted(_imports(path)):
            if any(name == f"rankrun.{f}" or name.startswith(f"rankrun.{f}.") for f in forbidden):
                found.append(f"{path.relative_to(SRC)} imports {name}")
    return found


@pytest.mark.parametrize(("folder", "forbidden", "allowed"), [
    ("store", ("workerstore", "rendezvous", "agent", "proc", "logs", "report"), ()),
    ("workerstore", ("store", "rendezvous", "agent", "proc", "logs", "report"), ()),
    ("rendezvous", ("agent", "proc", "logs", "report"), ()),
    ("rendezvous", ("workerstore",), ("rendezvous/listener.py", "rendezvous/session.py")),  # the two that know both stores
    ("proc", ("rendezvous", "store", "workerstore", "agent", "logs", "report"), ()),  # logs/ reads proc's stream types
    ("logs", ("agent", "rendezvous", "store", "workerstore", "report"), ()),
    ("agent", ("store.etcd",), ()),  # an embedded-store job never loads the etcd client: only the session does, lazily
    ("report", ("agent", "rendezvous", "store", "workerstore"), ()),
    # stack reports: dumps, /proc and the grouping; what they are sent through (proc, the store) is handed in
    ("stacks", ("agent", "rendezvous", "store", "workerstore", "proc", "logs", "report"), ("stacks/exchange.py",)),
    # the whole job's report goes through the store's seam, laid out as the rendezvous's keys say; no backend
    ("stacks", ("agent", "workerstore", "proc", "logs", "report", "store.embedded", "store.etcd", "store.memory",
                "rendezvous.session", "rendezvous.coordinator", "rendezvous.member"), ()),
])
def test_dependencies_point_one_way(folder, forbidden, allowed):
    assert _offenders(folder, forbidden, allowed) == []


def test_the_check_sees_an_offending_import(tmp_path):
    """The checker itself can fail: an import it must catch, in a file it reads the same way."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from rankrun.agent.loop import launch\n    return launch\n")
    assert "rankrun.agent.loop" in _imports(bad)
