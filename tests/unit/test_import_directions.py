"""The dependency directions docs/design.md draws, checked on the source itself (every import, at any depth)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "rankrun"

PACKAGES = ("agent", "api", "checkpoint", "events", "health", "logs", "numa", "preload", "proc", "rendezvous", "report", "stacks",
            "store", "straggler", "timeline", "workerstore")
ENTRY_POINTS = ("__main__", "cli", "main", "launch", "run_path")
TOP = tuple(sorted(p.stem for p in SRC.glob("*.py") if p.stem != "__init__"))
LEAVES = set(TOP) - set(ENTRY_POINTS)  # errors, spec, listen, procfs, ...: below every package


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
    """Imports of ``forbidden`` in ``folder`` (a package, or one top-level module) but for the ``allowed`` files."""
    found = []
    for path in [SRC / folder] if folder.endswith(".py") else sorted((SRC / folder).rglob("*.py")):
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
    # the rounds see the store's seam only, and ask it what they need to know of the backend (``Store.in_process``,
    # ``Store.pipelines``); the session opens the backends, the listener serves the embedded one
    ("rendezvous", ("store.embedded", "store.etcd", "store.memory"), ("rendezvous/listener.py", "rendezvous/session.py")),
    ("proc", ("rendezvous", "store", "workerstore", "agent", "logs", "report"), ()),  # logs/ reads proc's stream types
    ("logs", ("agent", "rendezvous", "store", "workerstore", "report"), ()),
    ("agent", ("store.etcd",), ()),  # an embedded-store job never loads the etcd client: only the session does, lazily
    ("report", ("agent", "rendezvous", "store", "workerstore"), ()),
    # stack reports: dumps, /proc and the grouping; what they are sent through (proc, the store) is handed in
    ("stacks", ("agent", "rendezvous", "store", "workerstore", "proc", "logs", "report"), ("stacks/exchange.py",)),
    # the whole job's report goes through the store's seam, laid out as the rendezvous's keys say; no backend
    ("stacks", ("agent", "workerstore", "proc", "logs", "report", "store.embedded", "store.etcd", "store.memory",
                "rendezvous.session", "rendezvous.coordinator", "rendezvous.member"), ()),
    # the workers' TCPStore: nothing of rankrun but its keyspace and how sockets are bound
    ("workerstore/tcpstore.py", tuple(p for p in PACKAGES + TOP if p not in ("listen", "workerstore")), ()),
    # the Python API. In the agent (node, values, failures) and in the workers (worker, ship, results): below the agent,
    # through the store's seam and the rendezvous's keys, never a backend. In the caller's process, api/launch.py: above
    # the CLI, whose parser and validation it uses, with nothing of the agent in that process.
    ("api", ("agent", "main", "logs", "workerstore", "stacks", "store.embedded", "store.etcd", "store.memory",
             "rendezvous.session", "rendezvous.coordinator", "rendezvous.election", "rendezvous.listener"), ()),
    ("api", ("cli", "proc", "spec"), ("api/launch.py",)),
    ("agent", ("cli", "main"), ()),
    ("agent", ("api",), ("agent/features.py",)),  # a rankrun.launch job's exchange (api/node.py), loaded lazily
    # --numa-binding's layout and decision: read by cli.py before anything starts, from the leaves only
    ("numa", tuple(p for p in PACKAGES if p != "numa") + ENTRY_POINTS, ()),
    # the job's lifecycle events: the records, their stream and consumers (the --events file, the metrics), below the agent (which emits into
    # them) and beside the other consumers; nothing of the job's machinery, so a reader of the events (the timeline) can
    # load them alone
    ("events", ("agent", "api", "cli", "main", "proc", "rendezvous", "store", "workerstore", "logs", "report", "stacks",
                "numa", *ENTRY_POINTS), ()),
    # a node's health checks and the blame and outlier rules: below the agent and the rendezvous, from the leaves only
    ("health", tuple(p for p in PACKAGES if p != "health") + ENTRY_POINTS, ()),
    # the straggler watch's records and rules (arrivals, clock offsets, the verdict): below the agent and the
    # rendezvous, from the leaves only
    ("straggler", tuple(p for p in PACKAGES if p != "straggler") + ENTRY_POINTS, ()),
    # python -m rankrun.timeline: an entry point that reads event files, never the launcher that writes them
    ("timeline", tuple(p for p in PACKAGES if p not in ("timeline", "events")) + ENTRY_POINTS, ()),
    # the top-level modules: the entry points above everything, the rest below every package
    ("cli.py", ("agent", "rendezvous", "store", "workerstore", "logs", "report", "api"), ()),  # main, lazily, hands it on
    ("main.py", ("cli", "api", "rendezvous", "store", "workerstore", "report"), ()),
    ("run_path.py", tuple(p for p in PACKAGES + TOP if p != "report"), ()),  # a worker's shim: its error file only
    # the preloading process runs under the workers' interpreter, and a forked worker keeps nothing of it: it imports
    # none of the launcher; a forked worker runs the stack shim's per-worker part, as a cold one does
    ("preload", tuple(p for p in PACKAGES + TOP if p not in ("preload", "record", "stacks")), ()),
    ("preload", ("stacks",), ("preload/child.py",)),
    ("proc", ("preload.server", "preload.child", "preload.safety", "preload.__main__"), ()),  # the launcher: wire only
    # kept progress: below the agent, from the leaves only (the store and the rounds reach it through what the agent
    # hands in); its worker half never loads its launcher half, and the launcher never loads its worker half (torch)
    ("checkpoint", tuple(p for p in PACKAGES if p != "checkpoint") + ENTRY_POINTS, ()),
    ("checkpoint", ("checkpoint.keeper", "checkpoint.disk", "checkpoint.peer"),
     ("checkpoint/keeper.py", "checkpoint/disk.py", "checkpoint/peer.py")),
    ("agent", ("checkpoint.client", "checkpoint.serial", "checkpoint.dcp"), ()),
    *[(f"{leaf}.py", PACKAGES + ENTRY_POINTS, ()) for leaf in sorted(LEAVES)],
])
def test_dependencies_point_one_way(folder, forbidden, allowed):
    assert _offenders(folder, forbidden, allowed) == []


def test_every_package_and_module_has_a_rule():
    """A new package or top-level module gets a place in the order on purpose."""
    assert {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(PACKAGES)
    assert {"errors", "spec", "listen", "procfs", "policy", "slurm"} <= LEAVES


def test_the_check_sees_an_offending_import(tmp_path):
    """The checker itself can fail: an import it must catch, in a file it reads the same way."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from rankrun.agent.loop import launch\n    return launch\n")
    assert "rankrun.agent.loop" in _imports(bad)
