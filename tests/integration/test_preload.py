"""``--preload``: workers forked from one import per node, restarts included; a module that cannot be imported."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import alive, clean_environ, run_cli, wait_gone

pytestmark = pytest.mark.usefixtures("private_tmpdir")

MARKED = """\
import os
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "imports"), "a") as f:
    f.write(f"{os.getpid()}\\n")
"""

SCRIPT = """\
import os, sys
import marked
with open(os.path.join(os.environ["TEST_PID_DIR"], f"w{os.getpid()}"), "w") as f:
    f.write(str(os.getpid()))
print("rank", os.environ["RANK"], "attempt", os.environ["TORCHELASTIC_RESTART_COUNT"], "pid", os.getpid(), flush=True)
open(os.path.join(os.environ["TEST_PID_DIR"], f"r{os.environ['RANK']}a{os.environ['TORCHELASTIC_RESTART_COUNT']}"),
     "w").close()
if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    import time
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(os.environ["TEST_PID_DIR"], "r0a0")) and time.monotonic() < deadline:
        time.sleep(0.01)  # rank 0 has imported and said its pid before this one fails (bounded)
    sys.exit(3)
"""


def _job(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "marked.py").write_text(MARKED)
    (tmp_path / "job.py").write_text(SCRIPT)
    env = clean_environ()
    env["TEST_PID_DIR"] = str(tmp_path)
    return env


def _events(path: Path, kind: str) -> list[dict[str, object]]:
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == kind]


def test_a_restart_forks_from_the_one_import(tmp_path, reaper):
    reaper.watch_dir(tmp_path)
    env = _job(tmp_path)
    events = tmp_path / "events.jsonl"
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "1", "--preload", "marked", "--events", str(events),
                   "job.py", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    importers = (tmp_path / "imports").read_text().split()
    workers = {int(p.name[1:]) for p in tmp_path.glob("w*")}
    assert len(importers) == 1, importers  # the preloading process's one import, no worker's
    assert int(importers[0]) not in workers and len(workers) == 4
    warm = _events(events, "warm")
    assert [(w["attempt"], w["forked"], w["cold"]) for w in warm] == [(0, "0-1", ""), (1, "0-1", "")]
    preload = _events(events, "preload")
    assert [(p["modules"], p["state"]) for p in preload] == [("marked", "ready")]


def test_without_preload_every_worker_imports(tmp_path, reaper):
    reaper.watch_dir(tmp_path)
    env = _job(tmp_path)
    events = tmp_path / "events.jsonl"
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "1", "--events", str(events), "job.py", env=env,
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len((tmp_path / "imports").read_text().split()) == 4
    assert _events(events, "warm") == [] and _events(events, "preload") == []


@pytest.mark.parametrize(("module", "source", "line"), [
    ("nosuchmodule_rr", None, "--preload 'nosuchmodule_rr': cannot be imported: ModuleNotFoundError: No module named "
                              "'nosuchmodule_rr'"),
    ("boom", "raise ValueError('boom at import')\n", "--preload 'boom': cannot be imported: ValueError: boom at import"),
])
def test_a_module_that_cannot_be_imported_is_one_line_and_exit_2(tmp_path, reaper, module, source, line):
    reaper.watch_dir(tmp_path)
    env = _job(tmp_path)
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    done = run_cli("--nproc-per-node", "2", "--preload", module, "job.py", env=env, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"rankrun: error: {line}"], done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("w*"))  # no worker started


# --- a preloaded module that leaves the process unsafe to fork: one line, every worker cold, the job as without ---

MARK = """\
import os
with open(os.path.join(os.environ["MARKS"], "imports"), "a") as f:
    f.write(f"{os.getpid()}\\n")
"""
# each one only in the preloading process (no RANK there): the cold workers import it too, and must end
UNSAFE = {
    "daemon thread": ("mod", "import threading, time\n"
                      "if 'RANK' not in os.environ:\n"
                      "    threading.Thread(target=time.sleep, args=(3600,), name='sleeper', daemon=True).start()\n",
                      "it has 2 threads ('sleeper'): a module started a thread at import"),
    # would keep the interpreter alive past its main's end (joined at exit), and the launcher's close() would wait
    # CLOSE_TIMEOUT for it: the process must leave without joining it. The thread says if it saw the main one end.
    "non-daemon thread": ("mod", "import threading, time\n"
                          "def keep():\n"
                          "    while threading.main_thread().is_alive():\n"
                          "        time.sleep(0.01)\n"
                          "    open(os.path.join(os.environ['MARKS'], 'lingered'), 'w').close()\n"
                          "    time.sleep(3600)\n"
                          "if 'RANK' not in os.environ:\n"
                          "    threading.Thread(target=keep, name='keeper').start()\n",
                          "it has 2 threads ('keeper'): a module started a thread at import"),
    "_thread": ("mod", "import _thread, time\n"
                "if 'RANK' not in os.environ:\n"
                "    _thread.start_new_thread(time.sleep, (3600,))\n",
                "it has 2 threads: a module started a thread at import"),
    "listening socket": ("mod", "import socket\nserver = socket.create_server(('127.0.0.1', 0))\n",
                         "it holds 1 socket: a module opened one at import"),
    # a fake torch on PYTHONPATH whose CUDA is initialised (in every process: cold workers don't ask)
    "torch with CUDA": ("torch", "from torch import cuda\n",
                        "torch has initialised CUDA (a CUDA context cannot be forked)"),
}

PROBE = """\
import os, sys, time
import {module}
with open(os.path.join(os.environ["TEST_PID_DIR"], f"w{{os.getpid()}}"), "w") as f:
    f.write(str(os.getpid()))
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
print("rank", rank, "attempt", attempt, flush=True)
open(os.path.join(os.environ["MARKS"], f"said{{rank}}-{{attempt}}"), "w").close()
if rank == "1" and attempt == "0":
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(os.environ["MARKS"], "said0-0")) and time.monotonic() < deadline:
        time.sleep(0.01)  # the event: rank 0 has said what it saw, before this failure stops it
    sys.exit(3)
"""


def _said(stdout: str) -> set[tuple[int, int]]:
    """Each worker's (rank, attempt) that printed its line."""
    return {(int(r), int(a)) for r, a in re.findall(r"^\[default\d\]:rank (\d) attempt (\d)$", stdout, re.MULTILINE)}


def _unsafe_job(tmp_path: Path, module: str, source: str) -> dict[str, str]:
    env = clean_environ() | {"TEST_PID_DIR": str(tmp_path / "pids"), "MARKS": str(tmp_path)}
    if module == "torch":
        site = tmp_path / "site"
        (site / "torch").mkdir(parents=True)
        (site / "torch" / "__init__.py").write_text(MARK + source)
        (site / "torch" / "cuda.py").write_text("def is_initialized():\n    return True\n")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    else:
        (tmp_path / f"{module}.py").write_text(MARK + source)
    (tmp_path / "job.py").write_text(PROBE.format(module=module))
    return env


@pytest.mark.parametrize("case", UNSAFE)
def test_a_module_that_leaves_the_process_unsafe_sends_the_node_cold(tmp_path, reaper, case):
    module, source, why = UNSAFE[case]
    reaper.watch_dir(tmp_path / "pids")
    env = _unsafe_job(tmp_path, module, source)
    events = tmp_path / "events.jsonl"
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "1", "--preload", module, "--events", str(events),
                   "job.py", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "--preload" in line]
    assert said == [f"rankrun: --preload {module}: {why}; starting this node's workers cold"], done.stderr
    assert "Traceback" not in done.stderr
    preload = _events(events, "preload")
    assert [(p["modules"], p["state"], p["why"]) for p in preload] == [(module, "unsafe", why)]
    warm = _events(events, "warm")
    assert [(w["attempt"], w["forked"], w["cold"]) for w in warm] == [(0, "", "0-1"), (1, "", "0-1")]
    importers = (tmp_path / "imports").read_text().split()
    assert len(importers) == 1 + 2 * 2  # the preloading process once, then each cold worker of each attempt
    # ended as soon as it was found unsafe (no worker saw it), not left to hold its thread or port for the job
    assert _said(done.stdout) == {(r, a) for a in (0, 1) for r in (0, 1)}, done.stdout
    assert not (tmp_path / "lingered").exists()  # it left at once, without joining a thread (nor waiting for a kill)


LATE = """\
import os, threading, time
home, forks = os.getpid(), 0


def _after():  # a library's at-fork handler that starts a thread on the second fork (the throwaway fork is the first)
    global forks
    forks += 1
    if os.getpid() == home and forks == 2:
        threading.Thread(target=time.sleep, args=(3600,), name="late").start()


if "RANK" not in os.environ:
    os.register_at_fork(after_in_parent=_after)
"""


def test_a_process_found_unsafe_at_a_fork_sends_the_rest_cold(tmp_path, reaper):
    """Safe after the import, unsafe after the first worker's fork: that worker stays forked, the next is refused and
    starts cold, and so does every later one."""
    why = "it has 2 threads ('late'): a module started a thread at import"
    reaper.watch_dir(tmp_path / "pids")
    env = _unsafe_job(tmp_path, "late", LATE)
    events = tmp_path / "events.jsonl"
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "1", "--preload", "late", "--events", str(events),
                   "job.py", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "--preload" in line]
    assert said == [f"rankrun: --preload late: {why}; starting this node's workers cold"], done.stderr
    assert "Traceback" not in done.stderr
    preload = _events(events, "preload")
    assert [(p["state"], p.get("why")) for p in preload] == [("ready", ""), ("unsafe", why)]
    warm = _events(events, "warm")
    assert [(w["attempt"], w["forked"], w["cold"]) for w in warm] == [(0, "0", "1"), (1, "", "0-1")]
    assert len((tmp_path / "imports").read_text().split()) == 1 + 1 + 2, done.stdout  # the process, rank 1 cold, attempt 1's two
    assert _said(done.stdout) == {(0, 0), (1, 0), (0, 1), (1, 1)}, done.stdout


# --- the preloading process dies between attempts: said once, the next attempt cold, the job as without ---

BETWEEN = """\
import os, sys, time
import marked
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(os.environ["TEST_PID_DIR"], f"w{os.getpid()}"), "w") as f:
    f.write(str(os.getpid()))
print("READY rank", rank, "attempt", attempt, flush=True)
if attempt == "0":
    go = os.path.join(os.environ["MARKS"], "go")
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:  # the test's event: the process is dead
        time.sleep(0.01)
    sys.exit(3 if rank == "1" else 0)
"""


def _preloaders(launcher: int) -> list[int]:
    """The launcher's children whose command line is the preloading process's."""
    found = []
    for pid in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split():
        try:
            if b"rankrun/preload/__main__.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def test_the_preloading_process_dies_between_attempts(launch, tmp_path):
    (tmp_path / "marked.py").write_text(MARK)
    (tmp_path / "job.py").write_text(BETWEEN)
    env = clean_environ() | {"MARKS": str(tmp_path)}
    events = tmp_path / "events.jsonl"
    run = launch("--nproc-per-node", "2", "--max-restarts", "1", "--preload", "marked", "--events", str(events),
                 "job.py", env=env)
    run.wait_for(r"READY rank \d attempt 0", count=2)
    workers = {int(f.name[1:]) for f in (tmp_path / "pids").glob("w*")}
    (preloader,) = set(_preloaders(run.proc.pid)) - workers  # a forked worker has its command line too
    (tmp_path / "pids" / "preloader").write_text(str(preloader))  # the reaper's, should it outlive the test
    os.kill(preloader, signal.SIGKILL)
    assert wait_gone([preloader], 10.0) == []
    (tmp_path / "go").write_text("")
    assert run.finish() == 0, run.err
    line = "rankrun: --preload marked: the preloading process ended (signal SIGKILL); starting this node's workers cold"
    assert [e for e in run.err if "--preload" in e] == [line], run.err
    assert not [e for e in run.err if "Traceback" in e]
    preload = _events(events, "preload")
    assert [(p["state"], p.get("why")) for p in preload] == [
        ("ready", ""), ("ended", "the preloading process ended (signal SIGKILL)")]
    warm = _events(events, "warm")
    assert [(w["attempt"], w["forked"], w["cold"]) for w in warm] == [(0, "0-1", ""), (1, "", "0-1")]
    assert len((tmp_path / "imports").read_text().split()) == 1 + 2  # once, then attempt 1's cold workers
    assert not alive(preloader)


# rankrun with 4.5 MB more environment (past wire.LIMIT), under an unlimited stack, which lets it through exec (ARG_MAX
# is a quarter of the stack's limit)
_UNDER_BIG_ENV = ("import os, resource, sys; "
                  "resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)); "
                  "os.environ.update({f'BIG{i}': '0' * 100_000 for i in range(45)}); "
                  "os.execv(sys.executable, [sys.executable, '-m', 'rankrun', *sys.argv[1:]])")


def test_a_request_too_large_for_one_message_starts_that_worker_cold(tmp_path, reaper):
    """The fork request carries the worker's environment: past ``wire.LIMIT`` (what the process reads at once) the
    worker starts cold, and nothing is said: the preloading process is fine, and forks what fits."""
    if resource.getrlimit(resource.RLIMIT_STACK)[1] != resource.RLIM_INFINITY:
        pytest.skip("the stack's hard limit is not unlimited: no environment past 4 MB can be exec'd")
    reaper.watch_dir(tmp_path)
    env = _job(tmp_path)
    events = tmp_path / "events.jsonl"
    done = subprocess.run([sys.executable, "-c", _UNDER_BIG_ENV, "--nproc-per-node", "2", "--max-restarts", "1",
                           "--preload", "marked", "--events", str(events), "job.py"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert not [line for line in done.stderr.splitlines() if "--preload" in line or "Traceback" in line], done.stderr
    assert [(p["state"], p["why"]) for p in _events(events, "preload")] == [("ready", "")]
    warm = _events(events, "warm")
    assert [(w["attempt"], w["forked"], w["cold"]) for w in warm] == [(0, "", "0-1"), (1, "", "0-1")]
    assert len((tmp_path / "imports").read_text().split()) == 1 + 2 * 2
