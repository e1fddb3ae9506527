"""A worker forked by ``--preload`` is indistinguishable from a cold start (issue 36, item 2).

One probe (``payloads/preload_probe.py``) writes, as JSON, everything a worker can observe of how it was started; each
test runs the same job cold and with ``--preload json,decimal`` (stdlib modules: no torch, fast) and compares the two.
The only differences allowed are the declared ones: pid and parent pid values (the parent is the launcher's pid in
both), the preloaded modules in ``sys.modules`` (warm ⊇ cold), ``/proc/self/cmdline`` and timing (neither observed),
and what changes from any launch to the next (the run id, the rendezvous port, the run's temp folder in paths).

Observed, equal warm and cold: ``__name__``, the names in ``__main__``, ``__file__``, ``__cached__``, ``__package__``,
``__spec__``, ``__loader__``'s type, ``sys.argv``, ``sys.orig_argv``, ``sys.executable``, ``sys.path`` (whole),
``os.getcwd()``, ``os.environ`` (whole: every torchrun variable of that rank and attempt, ``RANKRUN_STACKS_*`` and
``RANKRUN_FR_*`` gone), ``sys.flags``, ``-X`` and ``-W`` options, the warning filters, the hooks, each stdio's kind and
settings (seekable included), the session, process group and death signal, every descriptor and its flags (no
socket), every signal's disposition, the blocked, ignored and caught masks, the CPUs, umask, nice, scheduler, rlimits,
threads, the terminal; how a worker ends (exit codes, ``os._exit``, an uncaught exception's traceback, death by SIGINT
after ``KeyboardInterrupt``, atexit handlers, non-daemon threads joined, the failure report, ``--run-path``'s error
file); the console's per-rank prefixes; ``rankrun --stacks`` and the shim's header; stdin on a pipe; one rank on a
pseudo-terminal (``input()``, ``breakpoint()``); ``--numa-binding``; a restart's second attempt; ``kill -9`` of the
launcher; what a preloaded module changed in the environment at import. Entries: a script (by a relative path, and
through a symbolic link), ``-m``, ``--run-path``, under ``PYTHONSAFEPATH``, and the Python API's worker (``-m
rankrun.api.worker`` started by the CLI with a payload made as ``rankrun.launch`` makes it: ``rankrun.launch`` has no
``preload`` argument yet).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import rankrun.api.worker
from conftest import PY, RANKRUN, Reaper, clean_environ, payload, run_cli, wait_gone
from ptyterm import PtyLauncher, awaiting_keys, reading
from rankrun.numa.binding import parse_ranges
from sysfs import this_machine_split

pytestmark = pytest.mark.usefixtures("private_tmpdir")

PRELOAD = ("--preload", "json,decimal")
ENTRIES = {  # how the worker is started: its arguments, and the environment's part that matters
    "script": (("preload_probe.py",), {}),
    "module": (("-m", "preload_probe"), {}),
    "run_path": (("--run-path", "preload_probe.py"), {}),
    "linked_script": (("linked/preload_probe.py",), {}),  # sys.path[0]: the link's target's folder
    "safe_path_script": (("preload_probe.py",), {"PYTHONSAFEPATH": "1"}),  # no sys.path[0] at all
    "safe_path_module": (("-m", "preload_probe"), {"PYTHONSAFEPATH": "1", "PYTHONPATH": "mods"}),
}
PER_LAUNCH = ("TORCHELASTIC_RUN_ID", "MASTER_PORT", "RANKRUN_CHECKPOINT")  # each launch's own, cold or warm
RUN_DIR = re.compile(r"rankrun_[0-9a-f-]+_[0-9a-z_]+")  # the run's temp folder, in the error file's and stacks' paths
SHIM_VARIABLES = ("RANKRUN_STACKS_", "RANKRUN_FR_", "RANKRUN_USER_PYTHONPATH")


@dataclass
class Run:
    rc: int
    out: list[str]
    err: list[str]
    seen: dict[str, dict[str, object]]  # "<rank>.<attempt>": the probe's JSON
    marks: dict[str, list[str]]  # rank: what its atexit handler and late thread wrote
    launcher: int


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    """The probe beside the job (a script by a relative path, a module found from the working directory)."""
    shutil.copy(payload("preload_probe.py"), tmp_path / "preload_probe.py")
    (tmp_path / "mods").mkdir()  # a module found on PYTHONPATH only
    shutil.copy(payload("preload_probe.py"), tmp_path / "mods" / "preload_probe.py")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "preload_probe.py").symlink_to(tmp_path / "preload_probe.py")
    out = tmp_path / "out"
    out.mkdir()
    return out


def _start_env(out: Path, **extra: str) -> dict[str, str]:
    env = clean_environ()
    if "PYTHONPATH" in extra and env.get("PYTHONPATH"):  # before the test's own (the rankrun under test)
        extra["PYTHONPATH"] += os.pathsep + env["PYTHONPATH"]
    return env | {"PROBE_OUT": str(out)} | extra


def _collect(out: Path, reaper: Reaper) -> tuple[dict[str, dict[str, object]], dict[str, list[str]]]:
    """The probe's files, moved out of the way for the next launch."""
    seen = {p.name.removesuffix(".json"): json.loads(p.read_text()) for p in out.glob("*.json")}
    marks = {p.name.removesuffix(".marks"): p.read_text().splitlines() for p in out.glob("*.marks")}
    reaper.pids.update(int(s["pid"]) for s in seen.values())  # type: ignore[call-overload]
    for p in list(out.iterdir()):
        p.unlink()
    return seen, marks


def _job(launch, reaper: Reaper, out: Path, *args: str, warm: bool, nproc: int = 2, stdin: int | None = None,
         **env: str) -> Run:
    run = launch("--nproc-per-node", str(nproc), *(PRELOAD if warm else ()), *args, env=_start_env(out, **env),
                 stdin=stdin)
    rc = run.finish()
    seen, marks = _collect(out, reaper)
    return Run(rc, run.out, run.err, seen, marks, run.proc.pid)


def _comparable(seen: dict[str, object]) -> dict[str, object]:
    """What must be equal warm and cold: all of it, less the declared differences and what each launch makes anew."""
    same = copy.deepcopy(seen)
    for key in ("pid", "ppid", "random", "modules"):
        same.pop(key)
    environ = same["environ"]
    assert isinstance(environ, dict)
    for key in PER_LAUNCH:
        environ[key] = "<each launch's>" if key in environ else None
    return json.loads(RUN_DIR.sub("rankrun_RUN", json.dumps(same)))


@functools.cache
def _brought_in(modules: str) -> frozenset[str]:
    """The modules importing ``modules`` loads into a fresh interpreter."""
    code = f"import sys; before = set(sys.modules); import {modules}; print(*sorted(set(sys.modules) - before))"
    return frozenset(subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True,
                                    timeout=60).stdout.split())


def _assert_modules(cold: dict[str, object], warm: dict[str, object]) -> None:
    cold_modules, warm_modules = set(cold["modules"]), set(warm["modules"])  # type: ignore[call-overload]
    assert cold_modules <= warm_modules, f"a forked worker lacks {sorted(cold_modules - warm_modules)}"
    assert {"json", "decimal"} <= warm_modules
    extra = warm_modules - cold_modules - _brought_in("json, decimal")
    assert not extra, f"a forked worker has modules a cold one has not: {sorted(extra)}"


def _assert_started_right(run: Run, seen: dict[str, object], rank: int, attempt: int) -> None:
    """What holds of every worker, cold or warm: its place in the job, its lifetime guarantees, nothing leaked."""
    env = seen["environ"]
    assert isinstance(env, dict)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["TORCHELASTIC_RESTART_COUNT"]) == (
        str(rank), str(rank), env["LOCAL_WORLD_SIZE"], str(attempt))
    assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_{attempt}/{rank}/error.json")
    assert not [k for k in env if k.startswith(SHIM_VARIABLES)], "the stack shim's variables are the worker's"
    assert seen["ppid"] == run.launcher  # the launcher's child: it waits for it, its subreaper
    assert seen["own_session"] and seen["own_group"] and seen["pdeathsig"] == signal.SIGKILL
    kinds = [kind for kind, *_ in seen["fds"].values()]  # type: ignore[union-attr]
    assert "socket" not in kinds
    assert any(str(kind).endswith("/stacks.txt") for kind in kinds)  # the shim's channel, open for the stacks
    assert seen["main_thread"] and seen["name"] == "__main__" and seen["main_is_this"]


def _assert_same(cold: Run, warm: Run) -> None:
    assert (warm.rc, sorted(warm.out), _normal_report(warm.err)) == (cold.rc, sorted(cold.out), _normal_report(cold.err))
    assert sorted(warm.seen) == sorted(cold.seen)
    for name in cold.seen:
        rank, attempt = map(int, name.split("."))
        for run in (cold, warm):
            _assert_started_right(run, run.seen[name], rank, attempt)
        assert _comparable(warm.seen[name]) == _comparable(cold.seen[name]), name
        _assert_modules(cold.seen[name], warm.seen[name])
    assert warm.marks == cold.marks


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_forked_worker_sees_what_a_cold_one_sees(launch, reaper, probe, entry):
    args, env = ENTRIES[entry]
    cold = _job(launch, reaper, probe, *args, warm=False, **env)
    warm = _job(launch, reaper, probe, *args, warm=True, **env)
    assert cold.rc == 0, cold.err
    assert sorted(cold.seen) == ["0.0", "1.0"]
    assert sorted(cold.out) == ["[default0]:probe 0", "[default1]:probe 1"]
    assert cold.marks == {"0": ["thread joined", "atexit ran"], "1": ["thread joined", "atexit ran"]}
    _assert_same(cold, warm)
    assert warm.seen["0.0"]["random"] != warm.seen["1.0"]["random"]  # each rank its own random state
    path = cold.seen["0.0"]["path"]
    assert isinstance(path, list)
    if entry == "safe_path_script":
        assert str(probe.parent) not in path
    elif entry in ("script", "module", "linked_script"):  # rankrun.run_path's -m puts the working directory there, as torchrun's does
        assert path[0] == str(probe.parent)


SHIP = """\
import pickle, sys
sys.path.insert(0, ".")
import preload_probe
from rankrun.api.ship import dumps
with open("payload", "wb") as fh:
    pickle.dump(([], dumps((preload_probe.observe, ()))), fh)
"""


def test_the_python_apis_worker_sees_what_a_cold_one_sees(launch, reaper, probe):
    """``rankrun.launch``'s workers run ``python -m rankrun.api.worker PAYLOAD RESULTS NAME``: here with the probe's
    ``observe`` as the function, its value (what the probe writes) returned through the results folder."""
    subprocess.run([PY, "-c", SHIP], cwd=probe.parent, env=clean_environ(), check=True, timeout=60)
    results = probe.parent / "results"
    results.mkdir()
    runs = []
    for warm in (False, True):
        run = _job(launch, reaper, probe, "-m", "rankrun.api.worker", "payload", str(results), "observe", warm=warm)
        assert run.rc == 0, run.err
        run.seen = {p.stem: pickle.loads(p.read_bytes()) for p in results.glob("*.value")}
        reaper.pids.update(int(s["pid"]) for s in run.seen.values())  # type: ignore[call-overload]
        runs.append(run)
    cold, warm = runs
    assert sorted(cold.seen) == ["0", "1"]
    for rank in cold.seen:
        assert _comparable(warm.seen[rank]) == _comparable(cold.seen[rank])
        _assert_modules(cold.seen[rank], warm.seen[rank])
        assert warm.seen[rank]["ppid"] == warm.launcher and warm.seen[rank]["pdeathsig"] == signal.SIGKILL
    assert cold.seen["0"]["argv"][:1] == [rankrun.api.worker.__file__]  # type: ignore[index]


def test_a_restarted_attempt_is_forked_with_that_attempts_environment(launch, reaper, probe):
    """Rank 1 fails its first attempt: the second attempt's workers (and the failed one) see what cold ones see.
    Rank 0's first attempt may be stopped before it writes: not compared."""
    def job(warm: bool) -> Run:
        run = _job(launch, reaper, probe, "--max-restarts", "1", "preload_probe.py", warm=warm, PROBE_END_1_0="exit3")
        run.seen.pop("0.0", None)
        run.out = [line for line in run.out if line != "[default0]:probe 0"]
        run.marks = {}  # rank 0's first attempt, stopped or not, adds its marks or not
        return run

    cold, warm = job(False), job(True)
    assert cold.rc == 0, cold.err
    assert sorted(cold.seen) == ["0.1", "1.0", "1.1"]
    _assert_same(cold, warm)


def _normal_report(lines: list[str]) -> list[str]:
    """The launcher's stderr with what differs between any two launches made alike: pids, times, the run's folder."""
    text = "\n".join(lines)
    text = re.sub(r"(pid\s+: |PID |pid )\d+", r"\1N", text)
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?", "TIME", text)
    return RUN_DIR.sub("rankrun_RUN", text).splitlines()


ENDINGS = {  # PROBE_END: the launcher's exit code, a line of its report, the marks the worker leaves on its way out
    "exit3": (1, "  exit       : exit code 3", ["thread joined", "atexit ran"]),
    "exit5": (1, "  exit       : exit code 5", []),
    "raise": (1, "ValueError: a probe's failure", ["thread joined", "atexit ran"]),
    "kbint": (1, "  exit       : signal 2 (SIGINT)", ["thread joined", "atexit ran"]),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_forked_worker_ends_as_a_cold_one(launch, reaper, probe, ending):
    """Its exit status, its exit handlers and threads, its traceback (from the user's frame on), the report."""
    runs = [_job(launch, reaper, probe, "preload_probe.py", warm=warm, nproc=1, PROBE_END=ending)
            for warm in (False, True)]
    code, line, marks = ENDINGS[ending]
    for run in runs:
        assert run.rc == code, run.err
        assert line in run.err
        assert run.marks == ({"0": marks} if marks else {})
    cold, warm = runs
    assert warm.out == cold.out
    assert _normal_report(warm.err) == _normal_report(cold.err)
    assert not [line for line in warm.err if "rankrun" in line and "File " in line]  # no frame of rankrun's
    if ending in ("raise", "kbint"):
        assert warm.err[0] == "Traceback (most recent call last):"
        assert warm.err[1].startswith(f'  File "{probe.parent / "preload_probe.py"}", line ')


def test_run_paths_error_file_is_written_by_a_forked_worker(launch, reaper, probe):
    runs = [_job(launch, reaper, probe, "--run-path", "preload_probe.py", warm=warm, nproc=1, PROBE_END="raise")
            for warm in (False, True)]
    cold, warm = runs
    assert cold.rc == 1 and "  exception  : (from error file)" in cold.err, cold.err  # the traceback, as recorded
    assert _normal_report(warm.err) == _normal_report(cold.err)


def _stacks_header(seen: dict[str, object]) -> str:
    env = seen["environ"]
    assert isinstance(env, dict)
    return (Path(env["TORCHELASTIC_ERROR_FILE"]).parent / "stacks.txt").read_text().splitlines()[0]


def _asked_stacks(launch, reaper: Reaper, probe: Path, warm: bool) -> tuple[list[str], list[str]]:
    """The shim's header of each rank, and ``rankrun --stacks``'s report, of a job whose ranks wait."""
    run = launch("--nproc-per-node", "2", *(PRELOAD if warm else ()), "preload_probe.py",
                 env=_start_env(probe, PROBE_END="wait"))
    run.wait_for(r"WAITING \d", count=2)
    seen = {p.name: json.loads(p.read_text()) for p in probe.glob("*.json")}
    reaper.pids.update(s["pid"] for s in seen.values())
    headers = []
    for name in sorted(seen):
        header = _stacks_header(seen[name])
        assert re.fullmatch(rf"rankrun-stacks main=0x[0-9a-f]{{16}} pid={seen[name]['pid']} up=\d+\.\d{{6}}", header)
        headers.append(re.sub(r"=\S+", "=X", header))
    asked = run_cli("--stacks", str(run.proc.pid))
    assert asked.returncode == 0, asked.stderr
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM
    _collect(probe, reaper)
    lines = [re.sub(r"^rankrun: job \S+ ", "rankrun: job ID ", line) for line in asked.stdout.splitlines()]
    report = [re.sub(r"\d+(\.\d+)?", "N", line) for line in lines]  # counts, CPU times, line numbers
    return headers, report


PRELOAD_FRAMES = re.compile(r"^    (<frozen runpy>|\S*/rankrun/preload/\S+\.py):N in ")  # the preloading process's


def test_the_stack_shim_is_attached_to_a_forked_worker(launch, reaper, probe):
    cold_headers, cold_report = _asked_stacks(launch, reaper, probe, warm=False)
    warm_headers, warm_report = _asked_stacks(launch, reaper, probe, warm=True)
    assert warm_headers == cold_headers
    assert [line for line in warm_report if not PRELOAD_FRAMES.match(line)] == cold_report
    assert warm_report[0] == "rankrun: job ID stacks on request: N distinct stack across N ranks"
    assert any("preload_probe.py" in line and "_end" in line for line in warm_report), warm_report


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_kill_9_of_the_launcher_ends_its_workers(launch, reaper, probe, warm):
    """PR_SET_PDEATHSIG, set in a forked worker after its re-parenting, fires as a cold worker's does; the preloading
    process goes too."""
    run = launch("--nproc-per-node", "2", *(PRELOAD if warm else ()), "preload_probe.py",
                 env=_start_env(probe, PROBE_END="wait"))
    run.wait_for(r"WAITING \d", count=2)
    children = [int(c) for c in Path(f"/proc/{run.proc.pid}/task/{run.proc.pid}/children").read_text().split()]
    workers = [int(json.loads(p.read_text())["pid"]) for p in probe.glob("*.json")]
    reaper.pids.update(children + workers)
    assert set(workers) <= set(children)  # and the watchdog, and the preloading process
    run.proc.kill()
    run.proc.wait(timeout=30)
    assert wait_gone(children, 10.0) == []
    _collect(probe, reaper)


def test_stdin_on_a_pipe_is_a_single_ranks_as_cold(launch, reaper, probe):
    def job(warm: bool) -> Run:
        r, w = os.pipe()
        os.write(w, b"from the launcher's stdin\n")
        os.close(w)
        try:
            return _job(launch, reaper, probe, "preload_probe.py", warm=warm, nproc=1, stdin=r, PROBE_END="stdin")
        finally:
            os.close(r)

    cold, warm = job(False), job(True)
    assert cold.seen["0.0"]["read"] == "from the launcher's stdin\n"
    assert cold.seen["0.0"]["stdin"]["seekable"] is False  # type: ignore[index]
    _assert_same(cold, warm)


def test_numa_binding_binds_a_forked_worker_as_a_cold_one(launch, reaper, probe, tmp_path):
    machine = this_machine_split()
    root = str(machine.write(tmp_path / "machine"))
    cold, warm = (_job(launch, reaper, probe, "--numa-binding=node", "preload_probe.py", warm=warm,
                       RANKRUN_SYSFS_ROOT=root) for warm in (False, True))
    assert cold.rc == 0, cold.err
    for rank in (0, 1):
        assert set(cold.seen[f"{rank}.0"]["affinity"]) == parse_ranges(machine.nodes[rank])  # type: ignore[arg-type]
    _assert_same(cold, warm)


# --------------------------------------------------------------------------- a single rank on a terminal


@pytest.fixture
def pty_launch(tmp_path: Path, reaper: Reaper) -> Iterator[object]:
    started: list[PtyLauncher] = []

    def start(*args: str, env: dict[str, str], rows: int = 30, cols: int = 100) -> PtyLauncher:
        term = PtyLauncher([*RANKRUN, *args], env, tmp_path, rows=rows, cols=cols)
        reaper.pids.add(term.proc.pid)
        started.append(term)
        return term

    yield start
    for term in started:
        term.close()


def test_a_single_forked_rank_keeps_the_terminal(pty_launch, reaper, probe):
    runs = []
    for warm in (False, True):
        term = pty_launch("--nproc-per-node", "1", *(PRELOAD if warm else ()), "preload_probe.py",
                          env=_start_env(probe, PROBE_END="input"))
        term.wait_screen(r"^name\? *$")
        term.send(b"ada\r")
        rc = term.finish()
        seen, marks = _collect(probe, reaper)
        runs.append(Run(rc, [], [], seen, marks, term.proc.pid))
    cold, warm = runs
    assert cold.rc == 0
    assert cold.seen["0.0"]["answer"] == "ada"
    assert cold.seen["0.0"]["terminal"] == [True, True, True]  # its controlling terminal, its group in front
    assert all(cold.seen["0.0"][s]["isatty"] for s in ("stdin", "stdout", "stderr"))  # type: ignore[index]
    _assert_same(cold, warm)


def _worker_of(launcher: int) -> int:
    """The launcher's one child on a terminal: the worker (the preloading process's stdin is /dev/null, and a forked
    worker's command line is the preloading process's)."""
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    workers = [int(c) for c in children if os.readlink(f"/proc/{c}/fd/0").startswith("/dev/pts/")]
    assert len(workers) == 1, [(c, Path(f"/proc/{c}/cmdline").read_bytes()) for c in children]
    return workers[0]


def test_breakpoint_works_in_a_forked_rank_on_a_terminal(pty_launch, reaper, tmp_path):
    """``payloads/interactive.py``, as ``test_console`` drives it cold: input(), pdb, a resize."""
    env = clean_environ() | {"PAYLOAD_PDB": "1", "TEST_PID_DIR": str(reaper.watch_dir(tmp_path / "pids"))}
    term = pty_launch("--nproc-per-node", "1", *PRELOAD, payload("interactive.py"), env=env, rows=30, cols=100)
    term.wait_screen(r"^TTY True True True 100x30$")
    term.wait_screen(r"^name\?$")
    term.send(b"ada\r")
    term.wait_screen(r"^hello ada$")
    worker = _worker_of(term.proc.pid)
    reaper.pids.add(worker)
    term.wait_screen(r"^\(Pdb\)$")
    term.wait_until("pdb to wait for keys", lambda: awaiting_keys(worker), 30.0)
    term.send(b"p value + 1\r")
    term.wait_screen(r"^42$")
    term.wait_until("pdb to wait for keys", lambda: awaiting_keys(worker), 30.0)
    term.send(b"c\r")
    term.wait_screen(r"^after pdb 41$")
    term.wait_screen(r"^wait for resize\?$")
    term.resize(20, 70)
    term.wait_screen(r"RESIZED 70x20")
    term.send(b"\r")
    assert term.finish() == 0
    assert "bye" in term.display()
    assert term.modes_now() == term.initial_modes


def test_only_the_preloaded_modules_are_extra(launch, reaper, probe):
    """A forked worker's ``sys.modules`` holds the preloaded modules and what they imported, nothing else."""
    cold = _job(launch, reaper, probe, "preload_probe.py", warm=False, nproc=1)
    warm = _job(launch, reaper, probe, "preload_probe.py", warm=True, nproc=1)
    extra = set(warm.seen["0.0"]["modules"]) - set(cold.seen["0.0"]["modules"])  # type: ignore[call-overload]
    assert not extra - _brought_in("json, decimal"), sorted(extra - _brought_in("json, decimal"))


def test_the_stacks_of_a_forked_worker_hold_no_frame_of_rankruns(launch, reaper, probe):
    _, report = _asked_stacks(launch, reaper, probe, warm=True)
    assert not [line for line in report if PRELOAD_FRAMES.match(line)]


SETS_ENV = """\
import os, sys
os.environ["SET_AT_IMPORT"] = "yes"
os.environ["OVERRIDDEN_AT_IMPORT"] = "by the module"
os.environ.pop("DROPPED_AT_IMPORT", None)
sys.path.insert(0, "/nonexistent/put-first-at-import")
"""
READS_ENV = """\
import os, sys
import sets_env
print(*(os.environ.get(k) for k in ("SET_AT_IMPORT", "OVERRIDDEN_AT_IMPORT", "DROPPED_AT_IMPORT", "RANK")))
print(*sys.path[:2])
"""


@pytest.mark.parametrize("entry", [("reads_env.py",), ("-m", "reads_env")], ids=["script", "module"])
def test_what_a_preloaded_module_changed_at_import_the_worker_sees(launch, tmp_path, entry):
    """A cold worker's import changes its environment and ``sys.path``; a forked worker's import ran once in the
    preloading process, whose changes it keeps (over its own environment; before its script's folder)."""
    (tmp_path / "sets_env.py").write_text(SETS_ENV)
    (tmp_path / "reads_env.py").write_text(READS_ENV)
    env = clean_environ() | {"OVERRIDDEN_AT_IMPORT": "by the user", "DROPPED_AT_IMPORT": "by the user"}
    outs = []
    for preload in ((), ("--preload", "sets_env")):
        run = launch("--nproc-per-node", "2", *preload, *entry, env=dict(env))
        assert run.finish() == 0, run.err
        outs.append(sorted(run.out))
    assert outs[0] == sorted([f"[default{r}]:{line}" for r in (0, 1) for line in (
        f"yes by the module None {r}", f"/nonexistent/put-first-at-import {tmp_path}")])
    assert outs[1] == outs[0]


POOLS = """\
import multiprocessing


def square(x):
    return x * x


if __name__ == "__main__":
    for method in ("spawn", "forkserver", "fork"):  # spawn and forkserver import __main__ again, by file or module
        with multiprocessing.get_context(method).Pool(1) as pool:
            print(method, *pool.map(square, [3]), flush=True)
"""


@pytest.mark.parametrize("entry", [("pools.py",), ("-m", "pools")], ids=["script", "module"])
def test_multiprocessing_pools_work_in_a_forked_worker(launch, tmp_path, entry):
    """A pool's spawned and forkserver processes find the worker's ``__main__`` (its file, or its module's spec) and
    the function defined there, as from a cold worker."""
    (tmp_path / "pools.py").write_text(POOLS)
    outs = []
    for preload in ((), PRELOAD):
        run = launch("--nproc-per-node", "1", *preload, *entry)
        assert run.finish() == 0, run.err
        outs.append(run.out)
    assert outs[0] == ["spawn 9", "forkserver 9", "fork 9"]
    assert outs[1] == outs[0]


AT_EXIT = """\
import atexit, os
atexit.register(lambda: open(os.path.join(os.path.dirname(__file__), "exits"), "a").write(f"{os.getpid()}\\n"))
"""


def test_a_preloaded_modules_exit_handler_runs_once_per_worker(launch, tmp_path):
    """Not once more in the preloading process, at the job's end."""
    (tmp_path / "at_exit.py").write_text(AT_EXIT)
    (tmp_path / "job.py").write_text("import at_exit\n")
    counts = []
    for preload in ((), ("--preload", "at_exit")):
        run = launch("--nproc-per-node", "2", *preload, "job.py")
        assert run.finish() == 0, run.err
        counts.append(len((tmp_path / "exits").read_text().split()))
        (tmp_path / "exits").unlink()
    assert counts == [2, 2]


def test_ctrl_c_on_a_forked_interactive_worker_goes_through_the_launcher(pty_launch, reaper, tmp_path):
    """As ``test_console``'s cold one: the worker waits in input() on its terminal; Ctrl-C stops it, exit 130."""
    env = clean_environ() | {"TEST_PID_DIR": str(reaper.watch_dir(tmp_path / "pids"))}
    term = pty_launch("--nproc-per-node", "1", *PRELOAD, payload("interactive.py"), env=env)
    term.wait_screen(r"^name\?$")
    worker = _worker_of(term.proc.pid)
    reaper.pids.add(worker)
    term.wait_until("the worker to read its terminal", lambda: reading(worker), 10.0)
    term.send(b"\x03")
    assert term.finish() == 128 + signal.SIGINT
    term.wait_screen(r"rankrun: received SIGINT: forwarded to 1 worker\(s\) and stopped them")
    assert term.modes_now() == term.initial_modes
