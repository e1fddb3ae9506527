"""``rankrun.launch(fn, ...)``: every rank's value back, functions of ``__main__`` and notebook cells shipped by value,
failures as ``WorkerError``, output through the caller's ``sys.stdout``, Ctrl-C, and the CLI's validation."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rankrun
import rankrun.api.values
from conftest import Launcher, clean_environ, fresh_loopback, payload, run_cli, two_api_nodes, wait_empty, wait_gone
from rankrun import procfs

pytestmark = pytest.mark.usefixtures("private_tmpdir")

CELL = '''
import os
factor = 3
double = lambda x: 2 * x
def make(n):
    def add(x):
        return double(x) * factor + n
    return add
'''


def test_a_scripts_main_functions_run_in_four_fresh_workers(tmp_path):
    done = subprocess.run([sys.executable, payload("api_driver.py"), "values"], cwd=tmp_path, env=clean_environ(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "values [(0, 101), (1, 102), (2, 103), (3, 104)]" in lines
    assert "pids 5" in lines  # four workers, none of them the caller
    assert sorted(line for line in lines if line.endswith(" here")) == [f"[default{r}]:rank {r} here" for r in range(4)]


def test_a_notebook_cells_lambda_and_closure_and_the_callers_own_stdout(capsys):
    cell: dict[str, object] = {"__name__": "__main__"}
    exec(compile(CELL, "<ipython-input-1>", "exec"), cell)  # what a kernel does with a cell
    add = cell["make"](1)  # type: ignore[operator]
    assert rankrun.launch(add, 5, nproc_per_node=2) == {0: 31, 1: 31}
    assert rankrun.launch(lambda: print("from", os.environ["RANK"]) or os.environ["LOCAL_RANK"], nproc_per_node=2) == \
        {0: "0", 1: "1"}
    out = capsys.readouterr().out  # sys.stdout replaced, as a notebook's cell output is: not fd 1
    assert sorted(out.splitlines()) == ["[default0]:from 0", "[default1]:from 1"]


def test_preload_forks_the_apis_workers_from_one_import(tmp_path):
    events = tmp_path / "events.jsonl"
    got = rankrun.launch(lambda: (os.getpid(), os.getppid(), "decimal" in sys.modules), nproc_per_node=2,
                         preload="decimal", events=str(events))
    assert {rank: seen[2] for rank, seen in got.items()} == {0: True, 1: True}  # preloaded, never imported by fn
    assert len({seen[1] for seen in got.values()}) == 1 and os.getpid() not in {seen[1] for seen in got.values()}
    told = [json.loads(line) for line in events.read_text().splitlines()]
    assert [(e["forked"], e["cold"]) for e in told if e["event"] == "warm"] == [("0-1", "")]


def _fails_on_rank_2() -> int:
    if os.environ["RANK"] == "2":
        raise ValueError("rank two refuses")
    return 0


def _killed_on_rank_1() -> int:
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return 0


def test_a_failure_is_a_worker_error_with_the_failed_rank_its_record_and_its_exception(capsys):
    with pytest.raises(rankrun.WorkerError) as caught:
        rankrun.launch(_fails_on_rank_2, nproc_per_node=4)
    error = caught.value
    assert list(error.failures) == [2]  # ranks that were only stopped are not failures
    failure = error.failures[2]
    assert (failure.exc_type, failure.message, failure.exit_code, failure.signal) == (
        "ValueError", "rank two refuses", 1, None)
    assert 'raise ValueError("rank two refuses")' in failure.traceback and failure.host
    first_frame = f'  File "{__file__}", line {_fails_on_rank_2.__code__.co_firstlineno + 2}, in _fails_on_rank_2'
    assert failure.traceback.splitlines()[:2] == ["Traceback (most recent call last):", first_frame]  # no rankrun frame
    assert isinstance(error.__cause__, ValueError) and str(error.__cause__) == "rank two refuses"
    report = str(error)  # the CLI's failure report
    assert report.startswith("=" * 72 + "\nrankrun: rankrun.launch(_fails_on_rank_2) FAILED (attempt 0)\n")
    assert "Root cause (first failure" in report
    assert "rank       : 2 (local_rank: 2)" in report
    assert "    Traceback (most recent call last):\n    " + first_frame + "\n" in report
    err = capsys.readouterr().err  # caught: the report is not printed, the worker's own traceback is (its output)
    assert "FAILED" not in err and "Root cause" not in err, err
    assert f"[default2]:Traceback (most recent call last):\n[default2]:{first_frame}\n" in err, err


class Quota:
    class Exceeded(Exception):
        pass


def _exceeds_the_quota() -> int:
    raise Quota.Exceeded("over by 3")


def test_exc_type_is_as_python_prints_it_module_and_qualified_name_for_a_class_of_ones_own(capsys):
    with pytest.raises(rankrun.WorkerError) as caught:
        rankrun.launch(_exceeds_the_quota)
    assert caught.value.failures[0].exc_type == f"{__name__}.Quota.Exceeded"
    assert caught.value.failures[0].traceback.rstrip("\n").endswith(f"\n{__name__}.Quota.Exceeded: over by 3")
    assert isinstance(caught.value.__cause__, Quota.Exceeded)
    capsys.readouterr()


def test_a_caller_that_catches_the_worker_error_prints_no_report_but_the_workers_output(tmp_path):
    driver = payload("api_driver.py")
    done = subprocess.run([sys.executable, driver, "caught"], cwd=tmp_path, env=clean_environ(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    first_frame = f'File "{driver}", line {_line_of(driver, "rank one refuses")}, in refuse'
    assert done.stdout.splitlines()[:2] == ["caught ValueError", f"first frame {first_frame}"], done.stdout
    assert "FAILED" not in done.stderr and "Root cause" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()  # the worker's own stderr still comes through, its traceback from the user's code
    assert lines[lines.index("[default1]:Traceback (most recent call last):") + 1] == f"[default1]:  {first_frame}", lines
    assert "[default1]:ValueError: rank one refuses" in lines


def test_a_worker_error_nobody_catches_shows_the_report_once_and_the_caller_exits_1(tmp_path):
    done = subprocess.run([sys.executable, payload("api_driver.py"), "uncaught"], cwd=tmp_path, env=clean_environ(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    err = done.stderr
    assert err.count("rankrun: rankrun.launch(refuse) FAILED (attempt 0)") == 1, err
    assert "\nrankrun.errors.WorkerError: " + "=" * 72 + "\nrankrun: rankrun.launch(refuse) FAILED" in err, err  # Python's
    assert err.rstrip("\n").endswith("=" * 72), err  # the report is the last thing, as Python printed the exception
    assert "\nValueError: rank one refuses\n\nThe above exception was the direct cause" in err, err


def _line_of(path: str, text: str) -> int:
    with open(path) as fh:
        return next(n for n, line in enumerate(fh, 1) if text in line)


def test_the_launcher_leaves_the_report_to_the_api_caller_and_prints_it_when_it_cannot(tmp_path):
    """``RANKRUN_REPORT_JSON`` (what ``rankrun.launch`` sets) takes the report off the launcher's stderr; when that
    file cannot be written, stderr gets it after all, with the reason."""
    given = tmp_path / "report.json"
    done = run_cli("--nproc-per-node", "1", "--no-python", "false", env={**clean_environ(), "RANKRUN_REPORT_JSON": str(given)})
    assert done.returncode == 1 and "FAILED" not in done.stderr, done.stderr
    assert "rankrun: false FAILED (attempt 0)" in json.loads(given.read_text())["report"]
    missing = tmp_path / "missing" / "report.json"
    done = run_cli("--nproc-per-node", "1", "--no-python", "false", env={**clean_environ(), "RANKRUN_REPORT_JSON": str(missing)})
    assert done.returncode == 1 and f"cannot write RANKRUN_REPORT_JSON {missing}" in done.stderr, done.stderr
    assert done.stderr.count("rankrun: false FAILED (attempt 0)") == 1, done.stderr


def test_a_worker_killed_by_a_signal_is_a_failure_without_an_exception(capsys):
    with pytest.raises(rankrun.WorkerError) as caught:
        rankrun.launch(_killed_on_rank_1, nproc_per_node=2)
    failure = caught.value.failures[1]
    assert (failure.exc_type, failure.exit_code, failure.signal) == ("", None, "SIGKILL")
    assert caught.value.__cause__ is None
    capsys.readouterr()


def _fails_before_a_restart() -> str:
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "0":
        raise RuntimeError("first try")
    return os.environ["TORCHELASTIC_RESTART_COUNT"]


def test_a_failure_a_restart_cured_raises_nothing(capsys):
    assert rankrun.launch(_fails_before_a_restart, nproc_per_node=2, max_restarts=1) == {0: "1", 1: "1"}
    capsys.readouterr()


def _raises_then_killed() -> int:
    if os.environ["RANK"] == "1":
        if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
            raise ValueError("first try")
        os.kill(os.getpid(), signal.SIGKILL)
    return 0


def test_a_restarted_ranks_failure_is_its_own_not_the_earlier_attempts(capsys):
    """Attempt 0's rank 1 raised and left its record; attempt 1's rank 1 was killed: the record is gone with it."""
    with pytest.raises(rankrun.WorkerError) as caught:
        rankrun.launch(_raises_then_killed, nproc_per_node=2, max_restarts=1)
    failure = caught.value.failures[1]
    assert (failure.exc_type, failure.message, failure.exit_code, failure.signal) == ("", "", None, "SIGKILL")
    assert caught.value.__cause__ is None
    capsys.readouterr()


def test_bad_options_are_value_errors_naming_them():
    with pytest.raises(ValueError, match=r"--nproc-per-node 'zero': expected a positive integer"):
        rankrun.launch(print, nproc_per_node="zero")
    with pytest.raises(ValueError, match=r"unknown option 'nprocs'"):
        rankrun.launch(print, nprocs=2)
    with pytest.raises(ValueError, match=r"--max-restarts -1: must be 0 or more"):
        rankrun.launch(print, max_restarts=-1)


def test_ctrl_c_in_the_caller_stops_every_worker_within_a_second_and_launch_works_again(reaper, tmp_path):
    pid_dir = tmp_path / "pids-of-workers"
    pid_dir.mkdir()
    driver = Launcher([sys.executable, payload("api_driver.py"), "interrupt", str(pid_dir)], clean_environ(), tmp_path,
                      reaper)
    driver.wait_for(r"sleeping", count=2, timeout=60)
    driver.proc.send_signal(signal.SIGINT)  # the notebook's interrupt button does the same to the kernel
    (gone,) = driver.wait_for(r"^workers gone after", timeout=60)
    assert gone.endswith(": True") and float(re.search(r"after ([\d.]+) s", gone).group(1)) < 1.0, gone  # type: ignore[union-attr]
    driver.wait_for(r"^again 100$", timeout=60)
    assert driver.finish() == 0
    # whatever the workers printed of their KeyboardInterrupt before the SIGKILL starts at the user's function
    assert not [line for line in driver.err if "runpy" in line or "rankrun/api/worker.py" in line], driver.err


MAKER = """
import pickle, sys, time
from rankrun.api.ship import dumps

def wait_for_ctrl_c():
    print("READY", flush=True)
    time.sleep(120)

with open(sys.argv[1], "wb") as fh:
    fh.write(pickle.dumps((list(sys.path), dumps((wait_for_ctrl_c, ())))))
"""


def _sleeping(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "nanosleep" in Path(f"/proc/{pid}/wchan").read_text():
            return True
        time.sleep(0.01)
    return False


def test_a_workers_ctrl_c_traceback_starts_at_the_users_function_and_it_ends_as_python_does(reaper, tmp_path):
    # one rank of rankrun.launch (python -m rankrun.api.worker) interrupted in the user's function: what it prints is
    # Python's KeyboardInterrupt traceback from that function on (no runpy, no rankrun frames), then it dies by SIGINT
    maker, job, results = tmp_path / "maker.py", tmp_path / "payload", tmp_path / "results"
    maker.write_text(MAKER)
    results.mkdir()
    subprocess.run([sys.executable, str(maker), str(job)], env=clean_environ(), timeout=60, check=True)
    worker = Launcher([sys.executable, "-m", "rankrun.api.worker", str(job), str(results), "wait_for_ctrl_c"],
                      clean_environ() | {"RANK": "0"}, tmp_path, reaper)
    worker.wait_for(r"^READY$", timeout=60)
    # READY comes before the sleep starts: a SIGINT sent in between is raised on the print's line, so wait until the
    # kernel has the worker in its sleep
    assert _sleeping(worker.proc.pid, timeout=60)
    worker.proc.send_signal(signal.SIGINT)
    assert worker.finish(timeout=60) == -signal.SIGINT
    assert worker.err == ["Traceback (most recent call last):", f'  File "{maker}", line 7, in wait_for_ctrl_c',
                          "    time.sleep(120)", "KeyboardInterrupt"]
    assert (results / "0.error").exists()


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = procfs.children(todo.pop())
        found += kids
        todo += kids
    return found


def test_a_caller_stopped_by_sigterm_leaves_nothing_in_its_temp_directory_and_no_process(reaper, tmp_path):
    # SIGTERM ends the caller at once (no Python clean-up runs): its launcher dies with it, and its watchdog takes the
    # workers and the caller's own rankrun-launch-* directory (payload, results) with it
    tmp, pid_dir = tmp_path / "tmp-of-the-caller", tmp_path / "pids-of-workers"
    tmp.mkdir()
    pid_dir.mkdir()
    caller = Launcher([sys.executable, payload("api_driver.py"), "sleep", str(pid_dir)],
                      clean_environ() | {"TMPDIR": str(tmp)}, tmp_path, reaper)
    caller.wait_for(r"sleeping", count=2, timeout=60)
    everyone = _descendants(caller.proc.pid)
    reaper.pids.update(everyone)
    assert len(everyone) >= 4, everyone  # the launcher, its watchdog, two workers
    assert any(p.name.startswith("rankrun-launch-") for p in tmp.iterdir())  # the run's files, while it runs
    caller.proc.send_signal(signal.SIGTERM)
    assert caller.finish(timeout=60) == -signal.SIGTERM
    assert wait_gone(everyone, 10.0) == []
    assert wait_empty(tmp, 10.0) == []


def test_importing_the_legacy_launcher_module_keeps_rankrun_launch_callable(capsys):
    """``python -m rankrun.launch`` is torch.distributed.launch's contract; importing that module sets the package's
    ``launch`` attribute to the module, which forwards a call to the API."""
    import importlib  # noqa: PLC0415

    module = importlib.import_module("rankrun.launch")
    assert rankrun.launch is module and rankrun.launch(abs, -7) == {0: 7}  # type: ignore[operator]
    capsys.readouterr()


def _launch_again() -> object:
    return rankrun.launch(abs, -1)


def test_launches_from_two_threads_are_two_jobs_and_a_launch_inside_a_worker_is_refused(capsys):
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    with ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(rankrun.launch, abs, -n, nproc_per_node=2) for n in (3, 4)]
        assert [job.result(timeout=120) for job in jobs] == [{0: 3, 1: 3}, {0: 4, 1: 4}]
    with pytest.raises(rankrun.WorkerError) as caught:
        rankrun.launch(_launch_again)
    assert caught.value.failures[0].exc_type == "RuntimeError"
    assert "called inside a worker of rankrun.launch" in caught.value.failures[0].message
    capsys.readouterr()


def test_two_callers_form_a_two_node_job_and_both_get_all_four_values(reaper, tmp_path):
    """Two callers on loopback, a c10d rendezvous: every rank's value on both nodes (rank 3's, over the store's
    limit, spilled into the log directory both share)."""
    outs = two_api_nodes(tmp_path, reaper, "node", "c10d", f"{fresh_loopback()}:29400", str(tmp_path / "logs"))
    for out in outs:
        assert "values [(0, 100), (1, 101), (2, 102), (3, 103)]" in out, out
        assert f"big {{3: {rankrun.api.values.VALUE_LIMIT + 1}}}" in out, out
    pids = [set(next(line for line in out if line.startswith("pids ")).split()[1:]) for out in outs]
    assert pids[0] == pids[1] and len(pids[0]) == 4  # the same four workers, seen from both nodes
    assert list((tmp_path / "logs").glob("api-nodes_*/values/3.value"))  # the spilled copy, where the other node read it


def test_a_value_over_the_limit_without_a_shared_log_dir_is_a_clear_error_on_the_other_node(reaper, tmp_path):
    outs = two_api_nodes(tmp_path, reaper, "node", "c10d", f"{fresh_loopback()}:29400")
    got = sorted(next(line for line in out if line.startswith(("values ", "error "))) for out in outs)
    assert got[1] == "values [(0, 100), (1, 101), (2, 102), (3, 103)]"  # rank 3's node has its value on disk
    assert re.match(r"error rankrun.launch: rank 3's value \(1,048,6\d\d bytes, on \S+\) is larger than the 1,048,576 "
                    "bytes a value may take through the rendezvous store", got[0]), got
    assert "had no log_dir to spill it to: give log_dir= a directory every node shares" in got[0]


def test_on_two_nodes_both_callers_get_the_failed_rank_and_its_exception_wherever_it_ran(reaper, tmp_path):
    """Rank 2 raises on one node; the other node's ranks were only stopped. Both callers get rank 2 in
    ``failures`` (with its node's host), its ``ValueError`` as ``__cause__``, and the report."""
    outs = two_api_nodes(tmp_path, reaper, "node-fails", f"{fresh_loopback()}:29400")
    hosts = set()
    for out in outs:
        failures = [line.split(" ", 5) for line in out if line.startswith("failure ")]
        assert [f[1:5] for f in failures] == [["2", "ValueError", "rank", "two"]], out
        assert failures[0][5].startswith("refuses 1 "), out  # the message, then exit code 1, then the host
        hosts.add(failures[0][5].split()[-1])
        assert "traceback 2 ValueError: rank two refuses" in out, out
        assert "cause ValueError('rank two refuses')" in out, out
        assert "report rankrun: rankrun.launch(node_fails) FAILED (attempt 0)" in out, out
    assert len(hosts) == 1 and hosts.pop()  # the same host, named alike on both nodes
