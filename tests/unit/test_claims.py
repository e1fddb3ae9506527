"""What module docstrings say only certain modules do, checked on the source: each process-wide power is used only
where its list below allows. A new user of one must be added here, on purpose, and its docstring kept true.

The detector reads the syntax tree, so a power is found however it is spelled: ``os.environ`` or ``os.getenv`` or
``from os import environ``, a module imported under another name, ``print(..., file=sys.stderr)`` or
``sys.stderr.write``. Its self-tests below show it finding each form in a snippet."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "rankrun"


@functools.cache
def _syntax(source: str, filename: str = "<unknown>") -> ast.Module:
    """``source``'s syntax tree, parsed once a run: the checks below read the same files again and again (parsing them
    was most of this file's time). Read only: never change a tree got from here."""
    return ast.parse(source, filename)


@functools.cache
def _all(tree: ast.AST) -> tuple[ast.AST, ...]:
    """``ast.walk(tree)``, once a run for each tree (by identity: those of ``_syntax`` live as long)."""
    return tuple(ast.walk(tree))


def _parse(path: Path) -> ast.Module:
    return _syntax(path.read_text(), str(path))


def _nodes(path: Path) -> tuple[ast.AST, ...]:
    return _all(_parse(path))

ALLOWED = {
    # the environment and the command line: read for the launch spec (cli), and by the few entry points that must
    # act before it exists (the early signal catcher, the TLS preload check, the run-path shim) or outside it (TMPDIR)
    # The Python API is an entry point too: api/launch.py hands the caller's environment to the launcher it starts,
    # api/worker.py is a worker's main (its arguments, its RANK), as run_path.py is.
    "os.environ": {"cli.py", "__main__.py", "proc/early.py", "fsutil.py", "run_path.py", "api/launch.py", "api/worker.py",
                   "stacks/shim/sitecustomize.py",  # the worker-side shim: takes its own variables out again
                   "health/__main__.py",  # python -m rankrun.health: LOCAL_WORLD_SIZE, PATH (nvidia-smi), its /proc seam
                   # RANKRUN_MEMROOM_ROOT, the fake node a test hands a launcher or a health check: read in one place
                   # so the keeper and the check judge the same room
                   "memroom.py",
                   "preload/child.py",  # a forked worker takes on its own environment, as exec would have given it
                   # rankrun.checkpoint in a rank: the keeper's socket (RANKRUN_CHECKPOINT) and the rank's RANK
                   "checkpoint/__init__.py", "checkpoint/client.py"},
    # the preloading process's arguments (preload/__main__.py) and a forked worker's command line (preload/child.py)
    "sys.argv": {"cli.py", "__main__.py", "proc/early.py", "run_path.py", "api/worker.py", "preload/__main__.py",
                 "preload/child.py"},
    # signalling and reaping processes: only rankrun.proc; the --health-check runner, which kills its check's group;
    # python -m rankrun.health's probes (health/isolate.py), each forked in a process group of its own, killed with it
    # at its timeout, reaped
    # The preloading process (--preload) forks each worker twice and reaps the intermediate; the launcher reaps and
    # signals a forked worker (proc/preload.py); a forked worker ending by KeyboardInterrupt dies by SIGINT, as Python does
    "os.killpg": {"proc/spawn.py", "proc/terminal.py", "proc/watchdog.py", "health/check.py", "health/isolate.py",
                  "proc/preload.py"},
    "os.kill": {"proc/spawn.py", "proc/terminal.py", "proc/watchdog.py", "proc/early.py", "proc/preload.py",
                "preload/child.py"},
    "os.waitpid": {"proc/watchdog.py", "health/isolate.py", "proc/preload.py", "preload/server.py"},
    "os.fork": {"proc/watchdog.py", "health/isolate.py", "preload/server.py"},
    # signal dispositions: the early catcher (and the watchdog's own child, which ignores them); the health command's
    # stop signals (its probes' groups killed) and its probes' backstop timer
    # (a forked worker's KeyboardInterrupt: SIGINT's default again, to die by it as Python does); in a worker, the
    # stack shim's Python handler for a running worker's stack (RUNNING_SIGNAL)
    "signal.signal": {"proc/early.py", "proc/watchdog.py", "health/isolate.py", "preload/child.py",
                      "stacks/shim/sitecustomize.py"},
    # loop signal handlers: the handled set (signals), the terminal relay's SIGWINCH/SIGCONT, SIGCHLD's orphan reaping
    "add_signal_handler": {"proc/signals.py", "proc/terminal.py", "proc/watchdog.py"},
    # worker processes: started only by the spawner (asyncio's subprocess_exec, create_subprocess_exec/_shell); the
    # --health-check command by its runner (rankrun.health is below the agent and cannot use the spawner)
    "subprocess_exec": {"proc/spawn.py", "health/check.py"},
    # any other process (subprocess.Popen/run/call/check_*, os.system/popen/posix_spawn): the caller's launcher, started
    # from the Python API in the caller's process, nvidia-smi -L when the driver has no /proc entry, and the health
    # command's nvidia-smi -L and -q (posix_spawnp, in a probe's process group)
    "subprocess": {"api/launch.py", "devices.py", "health/isolate.py"},
    # a process object signalled by its method (.send_signal, .kill, .terminate): the Python API's launcher; rankrun.proc
    # signals with os.kill/os.killpg above
    ".send_signal": {"api/launch.py"},
    # the launcher's stdout and stderr: logs/console.py writes them with os.write once the job runs; before it only the
    # CLI prints (usage errors, notes, rankrun --stacks's answer). __main__.py flushes Python's own streams at exit, and
    # the Python API relays the launcher's output to its caller's streams. (The CLI also asks stdout's terminal width.)
    # python -m rankrun.timeline, no launcher, prints its one line: the page it wrote, or its bad input. python -m
    # rankrun.health prints its failures (stdout) or its bad input (stderr).
    "print": {"cli.py", "timeline/__main__.py", "health/__main__.py"},
    # A forked worker (--preload) is a worker, not the launcher: it says what Python says of a script it cannot open,
    # and flushes its own streams before it dies by SIGINT, as Python does.
    # The preloading process (preload/__main__.py) flushes its streams before it leaves by os._exit.
    "sys.stderr": {"cli.py", "__main__.py", "api/launch.py", "timeline/__main__.py", "health/__main__.py",
                   "preload/child.py", "preload/__main__.py"},
    "sys.stdout": {"cli.py", "__main__.py", "api/launch.py", "preload/child.py", "preload/__main__.py"},
    # an exit code given as a number: none of the launcher's; its exit codes are named (errors.py). The watchdog's
    # forked child exits 0, as a health probe's forked child does, and an API worker whose fn raised exits 1, as Python
    # does for an uncaught exception. The preloading process's intermediate and throwaway children exit 0 (1: a fork
    # failed); a forked worker exits 1 without the launcher's go, 2 for a script it cannot open, 1 for an uncaught
    # exception, as Python does; the preloading process itself leaves with 0 once the launcher is done with it.
    "exit(<int>)": {"proc/watchdog.py", "api/worker.py", "health/isolate.py", "preload/server.py", "preload/child.py",
                    "preload/__main__.py"},
    # listening sockets: opened one way (address, SO_REUSEADDR, backlog, the error), by rankrun.listen
    "create_server": {"listen.py"},
    "start_server": set(),
    "start_unix_server": {"stacks/control.py"},  # the one local socket: rankrun --stacks
}


# other spellings of the same power: the name each counts as
SAME = {
    "os.getenv": "os.environ", "os.environb": "os.environ", "os.putenv": "os.environ", "os.unsetenv": "os.environ",
    "create_subprocess_exec": "subprocess_exec", "create_subprocess_shell": "subprocess_exec",
    "subprocess_shell": "subprocess_exec",
    **{f"subprocess.{f}": "subprocess" for f in ("Popen", "run", "call", "check_call", "check_output", "getoutput",
                                                 "getstatusoutput")},
    **{f"os.{f}": "subprocess" for f in ("system", "popen", "posix_spawn", "posix_spawnp", "spawnv", "spawnve",
                                         "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe")},
    "signal.pidfd_send_signal": "os.kill", "os.pidfd_send_signal": "os.kill", "_signal.signal": "signal.signal",
    "sys.__stderr__": "sys.stderr", "sys.__stdout__": "sys.stdout",
}
# methods that are the power on whatever object they are called (an event loop's, a server's)
_BARE = {"add_signal_handler", "subprocess_exec", "subprocess_shell", "create_subprocess_exec", "create_subprocess_shell",
         "create_server", "start_server", "start_unix_server"}
_METHODS = {"send_signal", "kill", "terminate"}  # on a process object: anything but the os module itself
_EXITS = {"sys.exit", "os._exit", "SystemExit", "exit", "quit"}


def _uses(path: Path) -> set[str]:
    """The powers of ``ALLOWED`` that the module at ``path`` uses, each under its name there."""
    tree = _parse(path)
    names = _imported_names(tree)  # a local name → the dotted name it stands for

    def dotted(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return names.get(node.id, node.id)
        if isinstance(node, ast.Attribute) and (base := dotted(node.value)) is not None:
            return f"{base}.{node.attr}"
        return None

    found: set[str] = set()

    def note(name: str | None) -> None:
        name = SAME.get(name, name) if name is not None else None
        if name in ALLOWED:
            found.add(name)

    for node in _all(tree):
        if isinstance(node, ast.Attribute):
            note(dotted(node))
            if node.attr in _BARE:
                note(node.attr)
        elif isinstance(node, ast.Name) and node.id in names:  # from os import environ; environ["X"]
            note(names[node.id])
        if not isinstance(node, ast.Call):
            continue
        func = dotted(node.func)
        if isinstance(node.func, ast.Attribute) and node.func.attr in _METHODS and dotted(node.func.value) != "os":
            found.add(".send_signal")
        if func == "print":
            found.add("print")
        if func in _EXITS and any(isinstance(a, ast.Constant) and type(a.value) is int for a in node.args):
            found.add("exit(<int>)")
    return found


def _imported_names(tree: ast.Module) -> dict[str, str]:
    names: dict[str, str] = {}
    for node in _all(tree):
        if isinstance(node, ast.Import):
            names.update((alias.asname, alias.name) for alias in node.names if alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update((alias.asname or alias.name, f"{node.module}.{alias.name}") for alias in node.names)
    return names


def _users() -> dict[str, set[str]]:
    return {name: set(modules) for name, modules in _source_users().items()}


@functools.cache
def _source_users() -> dict[str, frozenset[str]]:
    """Each power's users in the source, read once a run: every parametrized case asks the same of the same files."""
    users: dict[str, set[str]] = {name: set() for name in ALLOWED}
    for path in SRC.rglob("*.py"):
        for name in _uses(path):
            users[name].add(path.relative_to(SRC).as_posix())
    return {name: frozenset(modules) for name, modules in users.items()}


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_only_the_listed_modules_use_it(name):
    assert _users()[name] <= ALLOWED[name], f"{name} used outside {sorted(ALLOWED[name])}"


def test_the_check_sees_a_use(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\ndef f():\n    return os.environ.get('X'), os.killpg(1, 9)\n")
    assert _uses(bad) == {"os.environ", "os.killpg"}


@pytest.mark.parametrize(("source", "power"), [
    ("import os\nos.getenv('X')", "os.environ"),
    ("from os import environ\nenviron['X']", "os.environ"),
    ("from os import getenv as g\ng('X')", "os.environ"),
    ("from sys import argv\nargv[1:]", "sys.argv"),
    ("import os as o\no.kill(1, 9)", "os.kill"),
    ("from os import killpg\nkillpg(1, 9)", "os.killpg"),
    ("import subprocess\nsubprocess.Popen(['true'])", "subprocess"),
    ("import subprocess\nsubprocess.run(['true'])", "subprocess"),
    ("from subprocess import check_output\ncheck_output(['true'])", "subprocess"),
    ("import subprocess as sp\nsp.call(['true'])", "subprocess"),
    ("import os\nos.system('true')", "subprocess"),
    ("import asyncio\nasyncio.create_subprocess_exec('true')", "subprocess_exec"),
    ("async def f(loop):\n    await loop.subprocess_exec(object, 'true')", "subprocess_exec"),
    ("def f(proc):\n    proc.send_signal(2)", ".send_signal"),
    ("def f(proc):\n    proc.kill()", ".send_signal"),
    ("def f(p):\n    p.terminate()", ".send_signal"),
    ("print('hello')", "print"),
    ("import sys\nprint('x', file=sys.stderr)", "sys.stderr"),
    ("import sys\nsys.stderr.write('x')", "sys.stderr"),
    ("from sys import stderr\nstderr.write('x')", "sys.stderr"),
    ("import sys\nsys.stdout.write('x')", "sys.stdout"),
    ("import sys\nsys.exit(3)", "exit(<int>)"),
    ("import os\nos._exit(0)", "exit(<int>)"),
    ("raise SystemExit(2)", "exit(<int>)"),
])
def test_the_check_sees_each_form(tmp_path, source, power):
    path = tmp_path / "snippet.py"
    path.write_text(source + "\n")
    assert power in _uses(path)


@pytest.mark.parametrize("source", [
    "import os\nos.kill(1, 9)",  # os.kill is its own power, not a process object's method
    "import sys\nsys.exit(EXIT_USAGE)",  # a named code
    "import sys\nsys.exit('message')",
    "def f(x):\n    return x.environ, x.run()",  # not os's, not subprocess's
    "import asyncio\nasyncio.subprocess.PIPE",
])
def test_the_check_does_not_see_what_is_not_there(tmp_path, source):
    path = tmp_path / "snippet.py"
    path.write_text(source + "\n")
    assert _uses(path) <= {"os.kill"}


def test_the_exception_tree_in_errors_is_the_whole_tree():
    """errors.py's drawing is the tree: every exception class of rankrun's tree, found by walking the classes' bases
    from errors.py's own (so a subclass of ``WorkerError`` or ``NodeExcluded`` anywhere is in it), is drawn under its
    base, with its exit code, and nothing else is drawn."""
    import rankrun.errors  # noqa: PLC0415

    tree = _exception_tree([(path, _module_of(path)) for path in sorted(SRC.rglob("*.py"))])
    short = {name.rpartition(".")[2]: name for name in tree}
    assert len(short) == len(tree), "two classes of the tree share a name: the drawing cannot tell them apart"
    drawn = _drawn_tree(ast.get_docstring(_parse(SRC / "errors.py")) or "")
    found = {name.rpartition(".")[2]: (base.rpartition(".")[2], _exit_code(name)) for name, base in tree.items()}
    assert drawn == found, "errors.py's tree (name: base, exit code) differs from the classes'"
    assert issubclass(rankrun.errors.RendezvousClosed, rankrun.errors.LauncherError)


def _module_of(path: Path, root: Path = SRC) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exception_tree(modules: list[tuple[Path, str]]) -> dict[str, str]:
    """Every class whose bases reach rankrun.errors' exceptions, by its dotted name, with the base that does (dotted;
    ``Exception`` for the tree's root): each base resolved through its module's imports, whatever it is called there."""
    bases: dict[str, list[str]] = {}
    reexported: dict[str, str] = {}  # a name a module imported, as another module reaches it: store.api.StoreUnavailable
    for path, module in modules:
        syntax = _parse(path)
        names = _imported_names(syntax)
        reexported |= {f"{module}.{local}": full for local, full in names.items()}
        local = {n.name for n in _all(syntax) if isinstance(n, ast.ClassDef)}

        def resolve(node: ast.expr, names: dict[str, str] = names, local: set[str] = local, module: str = module) -> str:
            if isinstance(node, ast.Name):
                return names.get(node.id) or (f"{module}.{node.id}" if node.id in local else node.id)
            if isinstance(node, ast.Attribute):
                return f"{resolve(node.value)}.{node.attr}"
            return ""

        for node in _all(syntax):
            if isinstance(node, ast.ClassDef):
                bases[f"{module}.{node.name}"] = [resolve(b) for b in node.bases]
    for of in bases.values():
        of[:] = [_origin(base, reexported, bases) for base in of]
    tree: dict[str, str] = {}
    grew = True
    while grew:  # errors.py's classes down from Exception, then whatever derives from one of the tree's, at any depth
        before = len(tree)
        for name, of in bases.items():
            base = next((b for b in of if b in tree or (b == "Exception" and name.startswith("rankrun.errors."))), None)
            if base is not None and name not in tree:
                tree[name] = base
        grew = len(tree) > before
    return tree


def _origin(name: str, reexported: dict[str, str], classes: dict[str, list[str]]) -> str:
    """Where a name a module imported comes from, through every module that imported it in turn."""
    while name in reexported and name not in classes:
        name = reexported[name]
    return name


_TREE_LINE = re.compile(r"^[\s│]*(?:[├└]── )?(?P<name>\w+)\s+(?P<code>\d+)\s")


def _drawn_tree(docstring: str) -> dict[str, tuple[str, int | None]]:
    """errors.py's drawing read back: each class's base (the nearest line above drawn further left) and exit code."""
    drawn: dict[str, tuple[str, int | None]] = {}
    lines = docstring.splitlines()
    root = next(i for i, line in enumerate(lines) if line.split()[:1] == ["RankrunError"])
    above = [(lines[root].index("RankrunError"), "RankrunError")]  # (column, name) of the lines drawn above
    drawn["RankrunError"] = ("Exception", None)
    for line in lines[root + 1:]:
        if not line.strip():
            break
        if (match := _TREE_LINE.match(line)) is None:
            continue  # a description's second line
        column = match.start("name")
        while above[-1][0] >= column:
            above.pop()
        drawn[match["name"]] = (above[-1][1], int(match["code"]))
        above.append((column, match["name"]))
    return drawn


def _exit_code(name: str) -> int | None:
    import importlib  # noqa: PLC0415

    module, _, cls = name.rpartition(".")
    return None if cls == "RankrunError" else getattr(importlib.import_module(module), cls).exit_code


def test_the_exception_tree_is_found_by_walking_it(tmp_path):
    """A subclass of any class of the tree, anywhere, under any name, is found; an exception outside it is not."""
    (tmp_path / "rankrun").mkdir()
    mine, again = tmp_path / "rankrun" / "mine.py", tmp_path / "rankrun" / "again.py"
    mine.write_text("from rankrun.errors import WorkerError\nfrom rankrun import errors as e\n"
                    "class Mine(WorkerError): ...\nclass Deeper(Mine): ...\nclass Excluded(e.NodeExcluded): ...\n"
                    "class NotOurs(ValueError): ...\nclass Mixed(KeyError, Deeper): ...\n")
    again.write_text("from rankrun.mine import Mine as Base\nclass Again(Base): ...\n")  # a base imported from its module
    tree = _exception_tree([(SRC / "errors.py", "rankrun.errors"), (mine, _module_of(mine, tmp_path / "rankrun")),
                            (again, _module_of(again, tmp_path / "rankrun"))])
    assert {n: b for n, b in tree.items() if not n.startswith("rankrun.errors.")} == {
        "rankrun.mine.Mine": "rankrun.errors.WorkerError", "rankrun.mine.Deeper": "rankrun.mine.Mine",
        "rankrun.mine.Excluded": "rankrun.errors.NodeExcluded", "rankrun.mine.Mixed": "rankrun.mine.Deeper",
        "rankrun.again.Again": "rankrun.mine.Mine"}
    assert tree["rankrun.errors.LeaseLost"] == "rankrun.errors.StoreUnavailable"
    assert tree["rankrun.errors.RankrunError"] == "Exception"


def test_a_base_re_exported_by_another_module_is_followed(tmp_path):
    """store/etcd/gateway.py's EtcdError derives from StoreUnavailable as store/api.py re-exports it."""
    (tmp_path / "rankrun").mkdir()
    api, gateway = tmp_path / "rankrun" / "api.py", tmp_path / "rankrun" / "gateway.py"
    api.write_text("from rankrun.errors import StoreUnavailable\n")
    gateway.write_text("from rankrun.api import StoreUnavailable\nclass EtcdError(StoreUnavailable): ...\n")
    tree = _exception_tree([(SRC / "errors.py", "rankrun.errors"), (api, "rankrun.api"), (gateway, "rankrun.gateway")])
    assert tree["rankrun.gateway.EtcdError"] == "rankrun.errors.StoreUnavailable"


def test_the_drawing_is_read_back_as_drawn():
    drawing = """Tree::

    RankrunError                      exit_code
    ├── UsageError                    2   bad flag
    │   └── ArgumentError             2   argparse's
    │                                     own message, a second line
    └── LauncherError                 3   the launcher's
        └── Mine                      7   a subclass
"""
    assert _drawn_tree(drawing) == {"RankrunError": ("Exception", None), "UsageError": ("RankrunError", 2),
                                    "ArgumentError": ("UsageError", 2), "LauncherError": ("RankrunError", 3),
                                    "Mine": ("LauncherError", 7)}


def test_exit_codes_are_chosen_in_one_place():
    """The job's codes by ``Outcome``'s constructors (agent/attempt.py), a launcher error's and a signal's by errors.py,
    the fallback of the process by main.py, ``rankrun --stacks``'s success by cli.py, ``python -m rankrun.timeline``'s
    and ``python -m rankrun.health``'s by their mains: "where are exit codes chosen" has one answer per kind. No exit code is a bare number (``exit(<int>)`` above; and here the returns of the functions
    whose value is the process's exit code)."""
    allowed = {"errors.py", "agent/attempt.py", "main.py", "cli.py", "timeline/__main__.py", "health/__main__.py"}
    users = set()
    for path in SRC.rglob("*.py"):
        for node in _nodes(path):
            if isinstance(node, ast.Name) and node.id.startswith("EXIT_"):
                users.add(path.relative_to(SRC).as_posix())
    assert users <= allowed, sorted(users - allowed)
    cli = {n.id for n in _nodes(SRC / "cli.py") if isinstance(n, ast.Name)}
    assert {n for n in cli if n.startswith("EXIT_")} == {"EXIT_SUCCESS"}
    literal = [f"{module}:{function}" for module, function in EXIT_CODE_FUNCTIONS
               if _returns_a_number(SRC / module, function)]
    assert literal == []


EXIT_CODE_FUNCTIONS = [("cli.py", "main"), ("cli.py", "_stacks"), ("main.py", "launch"), ("timeline/__main__.py", "main"),
                       ("health/__main__.py", "main")]


def _returns_a_number(path: Path, function: str) -> bool:
    tree = _parse(path)
    found = [n for n in _all(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    assert found, f"{path.name} has no function {function}: update EXIT_CODE_FUNCTIONS"
    return any(isinstance(n, ast.Return) and isinstance(n.value, ast.Constant) and type(n.value.value) is int
               for n in ast.walk(found[0]))


def test_the_exit_code_check_sees_a_number(tmp_path):
    path = tmp_path / "cli.py"
    path.write_text("def main():\n    if x:\n        return 0\n    return EXIT_USAGE\n")
    assert _returns_a_number(path, "main")
    path.write_text("def main():\n    return EXIT_SUCCESS\n")
    assert not _returns_a_number(path, "main")


_PROC_READS = re.compile(r"""/stat"|/children"|(scandir|listdir|iterdir|glob)\(\s*["']/proc["']|"""
                         r"""Path\(\s*["']/proc["']\)\s*\.\s*(iterdir|glob|rglob)\(""")  # a walk; memroom's root is not


def test_proc_stat_and_children_are_read_only_by_procfs():
    """procfs.py's docstring: /proc/<pid>/stat and the task children lists are read there and nowhere else, and
    nothing else walks /proc (a second way to find a process's children)."""
    readers = {path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py") if _PROC_READS.search(path.read_text())}
    assert readers == {"procfs.py"}


@pytest.mark.parametrize("source", ['Path(f"/proc/{pid}/stat")', 'os.scandir("/proc")', "os.listdir('/proc')",
                                    'Path("/proc").iterdir()', 'open(f"/proc/{pid}/task/{t}/children")'])
def test_the_proc_check_sees_a_read(source):
    assert _PROC_READS.search(source)


def test_the_proc_check_lets_a_root_for_other_files_be():
    assert not _PROC_READS.search('def read_room(proc_root: Path = Path("/proc")): (proc_root / "meminfo").read_text()')


def test_the_rdzv_conf_keys_said_unused_are_unused():
    """spec.RendezvousConf's docstring: three of torchrun's keys are accepted and used for nothing."""
    unused = {"heartbeat_timeout", "store_type", "timeout"}
    readers = {path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py") if path.name != "spec.py"
               for node in _nodes(path)
               if isinstance(node, ast.Attribute) and node.attr in unused and "conf" in ast.unparse(node.value)}
    assert readers == set()


def _modules_where(found: Callable[[ast.AST], bool]) -> set[str]:
    return {path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py")
            if any(found(node) for node in _nodes(path))}


def _imports_module(module: str) -> Callable[[ast.AST], bool]:
    parent, _, name = module.rpartition(".")

    def found(node: ast.AST) -> bool:
        if isinstance(node, ast.Import):
            return any(alias.name == module for alias in node.names)
        if isinstance(node, ast.ImportFrom):
            return node.module == module or (node.module == parent and any(a.name == name for a in node.names))
        return False
    return found


def _calls(name: str) -> Callable[[ast.AST], bool]:
    return lambda node: isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


@pytest.mark.parametrize(("claim", "found", "within", "allowed"), [
    # spec.py: rankrun.cli is the only caller that turns user input into a LaunchSpec
    ("a LaunchSpec is built", _calls("LaunchSpec"), "", {"cli.py"}),
    # devices.py: the only caller is rankrun.cli (numa/topology.py takes the Gpu record)
    ("rankrun.devices is imported", _imports_module("rankrun.devices"), "", {"cli.py", "numa/topology.py"}),
    # rendezvous/keys.py: each rendezvous record is written and read there, and only there (as compact JSON)
    ("JSON is read or written", _imports_module("json"), "rendezvous/", {"rendezvous/keys.py"}),
])
def test_the_only_ones_named_in_docstrings(claim, found, within, allowed):
    users = {u for u in _modules_where(found) if u.startswith(within)}
    assert users == allowed, f"{claim} in {sorted(users)}"


@pytest.mark.parametrize(("source", "found"), [
    ("from rankrun import devices", _imports_module("rankrun.devices")),
    ("import rankrun.devices", _imports_module("rankrun.devices")),
    ("from rankrun.devices import gpu_count", _imports_module("rankrun.devices")),
    ("def f():\n    import json", _imports_module("json")),
    ("x = LaunchSpec(worker=w)", _calls("LaunchSpec")),
])
def test_the_only_ones_check_sees_each_form(source, found):
    assert any(found(node) for node in ast.walk(ast.parse(source)))


# logs/console.py's docstring: the only writers of the launcher's stdout and stderr once the job runs. Besides print and
# sys.stdout/sys.stderr (above), a module could write fd 1 or 2 itself: os.write (or writev, pwrite, sendfile) to 1 or
# 2, to a dup of either, to /dev/stdout or /dev/stderr opened, or a file object opened on any of them.
STD_WRITERS = {
    "logs/console.py",  # its destinations' writer threads: fd 1 and fd 2 by default (Console(stdout_fd=1, stderr_fd=2))
}

_STD_PATHS = {"/dev/stdout", "/dev/stderr", "/dev/fd/1", "/dev/fd/2", "/proc/self/fd/1", "/proc/self/fd/2"}
_STD_STREAMS = {"sys.stdout", "sys.stderr", "sys.__stdout__", "sys.__stderr__"}
_FD_WRITES = {"os.write", "os.writev", "os.pwrite", "os.pwritev", "os.sendfile"}  # the fd is the first argument
# what makes a file or another fd of its first argument: a dup of fd 1/2, or /dev/stdout opened, is written later
_FD_OPENS = {"os.dup", "os.dup2", "os.fdopen", "os.open", "open", "io.open", "io.FileIO"}


def _writes_std(path: Path) -> bool:
    """Whether the module writes fd 1 or 2 by its number: a write, a dup or an open of 1, 2 or /dev/stdout|stderr, as a
    literal or through a name given one (a local in its function, an attribute, a module's table); or a parameter
    ``*fd`` that is 1 or 2 unless told otherwise, in a module that writes with ``os.write``."""
    tree = _parse(path)
    names = _imported_names(tree)

    def dotted(node: ast.expr) -> str:
        if isinstance(node, ast.Name):
            return names.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            return f"{dotted(node.value)}.{node.attr}"
        return ""

    # names given fd 1/2 or a std path: a local as (its function, name), a module's name as (tree, name), an attribute
    # or a subscript as (tree, its text: "self._fd")
    std: set[tuple[ast.AST, str]] = set()

    def key(node: ast.expr, scope: ast.AST) -> tuple[ast.AST, str]:
        return (scope, node.id) if isinstance(node, ast.Name) else (tree, ast.unparse(node))

    def stdish(node: ast.expr | None, scope: ast.AST) -> bool:  # noqa: PLR0911 - one return per kind of expression
        if node is None:
            return False
        if isinstance(node, ast.Constant):
            return (type(node.value) is int and node.value in (1, 2)) or node.value in _STD_PATHS
        if isinstance(node, ast.Name | ast.Attribute):
            return key(node, scope) in std or key(node, tree) in std
        if isinstance(node, ast.Call):
            func = dotted(node.func)
            if func.endswith(".fileno"):
                return func.removesuffix(".fileno") in _STD_STREAMS
            return func in _FD_OPENS and bool(node.args) and stdish(node.args[0], scope)  # a dup of fd 1/2 is fd 1/2
        if isinstance(node, ast.Subscript | ast.Starred):
            return stdish(node.value, scope)
        if isinstance(node, ast.IfExp):
            return stdish(node.body, scope) or stdish(node.orelse, scope)
        if isinstance(node, ast.Dict):
            return any(stdish(n, scope) for n in [*node.keys, *node.values])
        return isinstance(node, ast.Tuple | ast.List | ast.Set) and any(stdish(n, scope) for n in node.elts)

    assigned: list[tuple[ast.expr, ast.expr, ast.AST]] = []  # (target, value, the function or module it is in)
    calls: list[tuple[ast.Call, ast.AST]] = []
    for node, scope in _scoped(tree):
        if isinstance(node, ast.Assign):
            assigned += [(target, node.value, scope) for target in node.targets]
        elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr) and node.value is not None:
            assigned.append((node.target, node.value, scope))
        elif isinstance(node, ast.For | ast.comprehension):
            assigned.append((node.target, node.iter, scope))
        elif isinstance(node, ast.Call):
            calls.append((node, scope))
    grew = True
    while grew:  # a name given a name given fd 1/2 is fd 1/2 too
        before = len(std)
        std.update(key(target, scope) for target, value, scope in assigned if stdish(value, scope))
        grew = len(std) > before

    if any(dotted(c.func) in _FD_WRITES | _FD_OPENS and c.args and stdish(c.args[0], scope) for c, scope in calls):
        return True
    defaults = [(arg.arg, default) for f in _all(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                for arg, default in [*zip(f.args.args[::-1], f.args.defaults[::-1], strict=False),
                                     *zip(f.args.kwonlyargs, f.args.kw_defaults, strict=True)]]
    return (any(name.endswith("fd") and stdish(default, tree) for name, default in defaults)
            and any(dotted(c.func) in _FD_WRITES for c, _ in calls))


def _scoped(tree: ast.Module) -> list[tuple[ast.AST, ast.AST]]:
    """Every node with the function (or the module) whose locals its names are."""
    found: list[tuple[ast.AST, ast.AST]] = []
    todo: list[tuple[ast.AST, ast.AST]] = [(tree, tree)]
    while todo:
        node, scope = todo.pop()
        found.append((node, scope))
        inner = node if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) else scope
        todo += [(child, inner) for child in ast.iter_child_nodes(node)]
    return found


def test_only_the_console_writes_stdout_and_stderr_by_their_fds():
    writers = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py") if _writes_std(p)}
    assert writers == STD_WRITERS, "fd 1/2 written outside the console (or an allowed writer no longer writes)"


@pytest.mark.parametrize("source", [
    "import os\nos.write(2, b'x')",
    "from os import write\nwrite(1, b'x')",
    "import os\nfd = 2\nos.write(fd, b'x')",
    "import os\nos.dup(1)",
    "import os, sys\nos.write(sys.stderr.fileno(), b'x')",
    "import os, sys\nos.dup(sys.__stdout__.fileno())",
    "import os\n_STD = {'/dev/stdout': 1, '/dev/stderr': 2}\ndef f(p):\n    return os.dup(_STD[p])",
    "import os\nclass L:\n    def __init__(self):\n        self._fd = os.dup(2)\n    def w(self):\n        os.write(self._fd, b'x')",
    "import os\nfd = os.open('/dev/stderr', os.O_WRONLY)",
    "open('/dev/stdout', 'w').write('x')",
    "import os\nos.fdopen(2, 'w')",
    "import os\nfor fd in (1, 2):\n    os.write(fd, b'x')",
    "import os\nclass C:\n    def __init__(self, out_fd: int = 1):\n        self.fd = out_fd\n    def w(self):\n        os.write(self.fd, b'x')",
])
def test_the_std_write_check_sees_each_form(tmp_path, source):
    path = tmp_path / "snippet.py"
    path.write_text(source + "\n")
    assert _writes_std(path)


@pytest.mark.parametrize("source", [
    "import os\ndef f(fd, line):\n    os.write(fd, line)",  # an fd handed in: its caller is the one checked
    "import os\nfor fd in (0, 1, 2):\n    os.dup2(os.open(os.devnull, os.O_RDWR), fd)",  # /dev/null parked on 0-2
    "import os, sys\nos.get_terminal_size(sys.__stdout__.fileno())",  # asking, not writing
    "import os\nos.dup(0)",
    "import os\n_STD = {'/dev/stdout': 1}\ndef f(p, console):\n    fd = _STD[p]\n    os.fstat(fd)\n    console(fd, b'x')",
    "def source(fd: int = 1):\n    return fd",  # a default fd without a write of its own
    "import os\nos.write(3, b'x')",
    # a local 2 in one function is not another function's: the watchdog parks /dev/null on 0-2 in its child
    "import os\nclass W:\n    def __init__(self, fd):\n        self._fd = fd\n    def send(self):\n        os.write(self._fd, b'x')"
    "\ndef child():\n    for fd in (0, 1, 2):\n        os.dup2(os.open(os.devnull, os.O_RDWR), fd)",
])
def test_the_std_write_check_does_not_see_what_is_not_there(tmp_path, source):
    path = tmp_path / "snippet.py"
    path.write_text(source + "\n")
    assert not _writes_std(path)


def _emits(node: ast.AST) -> bool:
    """An event emitted, or the means to: ``<stream>.emit`` called or handed on (``deps.events.emit``,
    ``self._events.emit``, ``emit = stream.emit``), or asked for by name (``getattr(stream, "emit")``)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "emit"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and any(isinstance(a, ast.Constant) and a.value == "emit" for a in node.args))


def test_only_the_agent_emits_events():
    """events/stream.py: the stream is handed to the agent, which emits each fact where it decides it; the rendezvous,
    the report and every other package are handed what they judge and never see the stream."""
    outside = {m for m in _modules_where(_emits) | _modules_where(_imports_module("rankrun.events.stream"))
               if not m.startswith("agent/")}
    assert outside == set(), f"the event stream emitted (or imported) outside agent/: {sorted(outside)}"
    assert "agent/watch.py" in _modules_where(_emits)  # the check sees the agent's own


@pytest.mark.parametrize("source", [
    "def f(deps):\n    deps.events.emit(record)",
    "class W:\n    def f(self):\n        self._events.emit(record)",
    "def f(stream):\n    say = stream.emit\n    say(record)",
    "def f(stream):\n    getattr(stream, 'emit')(record)",
])
def test_the_emit_check_sees_each_form(source):
    assert any(_emits(node) for node in ast.walk(ast.parse(source)))


@pytest.mark.parametrize("source", [
    "class H:\n    def emit(self, record):\n        pass",  # a logging handler's own method, defined not called
    "def f(self):\n    self._emit('SUCCEEDED')",  # torchelastic's lines: a function of their own
])
def test_the_emit_check_does_not_see_what_is_not_there(source):
    assert not any(_emits(node) for node in ast.walk(ast.parse(source)))


# errors.py: who raises StoreError, each named in its docstring. A listening socket that cannot be bound
# (rankrun.listen: the workers' TCPStore, the rendezvous endpoint, the probe and metrics endpoints, a store relay's port);
# a store relay that cannot reach the host's store, is refused by it, or runs out of connection ids (workerstore.relay)
STORE_ERROR_RAISERS = {"listen.py": "rankrun.listen", "workerstore/relay.py": "workerstore.relay"}


def _makes_store_error(path: Path) -> bool:
    """Whether the module raises a ``StoreError``: one made (``StoreError(...)``, ``errors.StoreError(...)``, under
    another name it was imported as), or the class raised bare."""
    tree = _parse(path)
    names = _imported_names(tree)
    aliases = {"StoreError", "rankrun.errors.StoreError"} | {local for local, full in names.items()
                                                              if full == "rankrun.errors.StoreError"}

    def is_it(node: ast.expr | None) -> bool:
        if isinstance(node, ast.Name):
            return node.id in aliases or names.get(node.id) in aliases
        return isinstance(node, ast.Attribute) and node.attr == "StoreError"

    return any((isinstance(n, ast.Call) and is_it(n.func)) or (isinstance(n, ast.Raise) and is_it(n.exc))
               for n in _all(tree))


def test_store_error_is_raised_where_errors_says():
    raisers = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py") if p.name != "errors.py" and _makes_store_error(p)}
    assert raisers == set(STORE_ERROR_RAISERS), "StoreError raised elsewhere than errors.py says (or no longer there)"
    errors = _parse(SRC / "errors.py")
    said = next(ast.get_docstring(n) or "" for n in _all(errors) if isinstance(n, ast.ClassDef) and n.name == "StoreError")
    assert [m for m in STORE_ERROR_RAISERS.values() if f"``{m}``" not in said] == [], "StoreError's docstring names them"


@pytest.mark.parametrize("source", [
    "from rankrun.errors import StoreError\nraise StoreError('cannot listen')",
    "from rankrun.errors import StoreError as Bad\ndef f():\n    raise Bad('x') from None",
    "from rankrun import errors\nraise errors.StoreError('x')",
    "import rankrun.errors\nexc = rankrun.errors.StoreError('x')",
    "from rankrun.errors import StoreError\nraise StoreError",
])
def test_the_store_error_check_sees_each_form(tmp_path, source):
    path = tmp_path / "snippet.py"
    path.write_text(source + "\n")
    assert _makes_store_error(path)


@pytest.mark.parametrize("source", [
    "from rankrun.errors import StoreError\ntry:\n    f()\nexcept StoreError as exc:\n    print(exc)",  # caught, not raised
    "from rankrun.errors import StoreUnavailable\nraise StoreUnavailable('x')",
])
def test_the_store_error_check_does_not_see_what_is_not_there(tmp_path, source):
    path = tmp_path / "snippet.py"
    path.write_text(source + "\n")
    assert not _makes_store_error(path)


_PROCESS_POWERS = ("os.killpg", "os.kill", "os.waitpid", "os.fork", "subprocess_exec", "subprocess", ".send_signal")


def _unnamed_users(docstring: str, users: set[str]) -> list[str]:
    """The modules of ``users`` (paths below rankrun) that ``docstring`` does not name, as ``a.b`` or ``rankrun.a.b``."""
    named = set(re.findall(r"``(?:rankrun\.)?([\w.]+)``", docstring))
    return sorted(u for u in users if u.removesuffix(".py").removesuffix("/__init__").replace("/", ".") not in named)


@pytest.mark.parametrize(("holder", "users"), [
    # listen.py's list of its users: every module that imports it
    ("listen.py", lambda: _modules_where(_imports_module("rankrun.listen"))),
    # proc/__init__.py's modules outside it that run a process of their own: every user of a process power but proc/
    ("proc/__init__.py", lambda: {m for p in _PROCESS_POWERS for m in _users()[p] if not m.startswith("proc/")}),
])
def test_the_users_a_docstring_lists_are_all_there(holder, users):
    found = users()
    assert found, "the check finds no user at all"
    docstring = ast.get_docstring(_parse(SRC / holder)) or ""
    assert _unnamed_users(docstring, found) == [], f"{holder}'s docstring does not name them"


def test_the_users_check_sees_one_unnamed():
    said = "Used by the TCPStore (``workerstore.tcpstore``) and ``rankrun.health.probe``; relay.py too."
    assert _unnamed_users(said, {"workerstore/tcpstore.py", "health/probe.py", "workerstore/relay.py"}) == [
        "workerstore/relay.py"]
    assert _unnamed_users("``rankrun.proc``", {"proc/__init__.py"}) == []
