"""What module docstrings say only certain modules do, checked on the source: each process-wide power is used only
where its list below allows. A new user of one must be added here, on purpose, and its docstring kept true."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "rankrun"

ALLOWED = {
    # the environment and the command line: read for the launch spec (cli), and by the few entry points that must
    # act before it exists (the early signal catcher, the TLS preload check, the run-path shim) or outside it (TMPDIR)
    # The Python API is an entry point too: api/launch.py hands the caller's environment to the launcher it starts,
    # api/worker.py is a worker's main (its arguments, its RANK), as run_path.py is.
    "os.environ": {"cli.py", "__main__.py", "proc/early.py", "fsutil.py", "run_path.py", "api/launch.py", "api/worker.py",
                   "stacks/shim/sitecustomize.py"},  # the worker-side shim: takes its own variables out again
    "sys.argv": {"cli.py", "__main__.py", "proc/early.py", "run_path.py", "api/worker.py"},
    # signalling and reaping processes: only rankrun.proc
    "os.killpg": {"proc/spawn.py", "proc/terminal.py", "proc/watchdog.py"},
    "os.kill": {"proc/spawn.py", "proc/terminal.py", "proc/watchdog.py", "proc/early.py"},
    "os.waitpid": {"proc/watchdog.py"},
    "os.fork": {"proc/watchdog.py"},
    # signal dispositions: the early catcher (and the watchdog's own child, which ignores them)
    "signal.signal": {"proc/early.py", "proc/watchdog.py"},
    # loop signal handlers: the handled set (signals), the terminal relay's SIGWINCH/SIGCONT, SIGCHLD's orphan reaping
    "add_signal_handler": {"proc/signals.py", "proc/terminal.py", "proc/watchdog.py"},
    # worker processes: started only by the spawner
    "subprocess_exec": {"proc/spawn.py"},
    # listening sockets: opened one way (address, SO_REUSEADDR, backlog, the error), by rankrun.listen
    "create_server": {"listen.py"},
    "start_server": set(),
    "start_unix_server": {"stacks/control.py"},  # the one local socket: rankrun --stacks
}


def _uses(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and f"{node.value.id}.{node.attr}" in ALLOWED:
                found.add(f"{node.value.id}.{node.attr}")
            elif node.attr in ALLOWED:
                found.add(node.attr)
    return found


def _users() -> dict[str, set[str]]:
    users: dict[str, set[str]] = {name: set() for name in ALLOWED}
    for path in SRC.rglob("*.py"):
        for name in _uses(path):
            users[name].add(path.relative_to(SRC).as_posix())
    return users


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_only_the_listed_modules_use_it(name):
    assert _users()[name] <= ALLOWED[name], f"{name} used outside {sorted(ALLOWED[name])}"


def test_the_check_sees_a_use(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\ndef f():\n    return os.environ.get('X'), os.killpg(1, 9)\n")
    assert _uses(bad) == {"os.environ", "os.killpg"}


def test_the_exception_tree_in_errors_is_the_whole_tree():
    import rankrun.errors  # noqa: PLC0415

    drawn = ast.get_docstring(ast.parse((SRC / "errors.py").read_text())) or ""
    missing = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name not in drawn and _derives_from_the_tree(node):
                missing.append(f"{path.relative_to(SRC)}: {node.name}")
    assert missing == [], "exceptions missing from the tree in errors.py"
    assert issubclass(rankrun.errors.RendezvousClosed, rankrun.errors.LauncherError)


_TREE = {"RankrunError", "UsageError", "ArgumentError", "NotSupportedYetError", "LauncherError", "StoreError", "SpawnError",
         "StoreUnavailable", "AuthenticationFailed", "LeaseLost", "Compacted", "NotCoordinator", "RendezvousClosed", "EtcdError"}


def _derives_from_the_tree(node: ast.ClassDef) -> bool:
    """A class whose base is one of the tree's (by name: the tree's names are unique in rankrun)."""
    return any(isinstance(b, ast.Name) and b.id in _TREE for b in node.bases)


def test_exit_codes_are_chosen_in_one_place():
    """The job's codes by ``Outcome``'s constructors (agent/attempt.py), a launcher error's and a signal's by errors.py,
    the fallback of the process by main.py: "where are exit codes chosen" has one answer per kind."""
    allowed = {"errors.py", "agent/attempt.py", "main.py"}
    users = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and node.id.startswith("EXIT_"):
                users.add(path.relative_to(SRC).as_posix())
    assert users <= allowed, sorted(users - allowed)


def test_proc_stat_and_children_are_read_only_by_procfs():
    """procfs.py's docstring: /proc/<pid>/stat and the task children lists are read there and nowhere else."""
    readers = {path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py")
               if re.search(r'/stat"|/children"', path.read_text())}
    assert readers == {"procfs.py"}
