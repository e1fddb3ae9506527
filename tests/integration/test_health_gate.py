"""``--health-check CMD``: run before each attempt on real launchers; an unhealthy node runs no worker and exits 4.

Plain ``sh`` checks and ``--no-python`` workers: the launcher's behaviour is the point. Each check writes what it
saw to a file of the test's own, so the tests count the checks and read their environment instead of guessing.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import alive, clean_environ, run_cli, wait_gone

pytestmark = pytest.mark.usefixtures("private_tmpdir")

# FAIL_ONCE: rank 1 of attempt 0 exits 5; FAIL_ONCE=after-0: only once rank 0 has said it ran (at most 10 s later),
# since the launcher stops rank 0 at rank 1's failure, maybe before rank 0's shell reached its echo.
WORKER = ["--no-python", "sh", "-c", 'echo "ran $RANK" >> "$OUT/workers"; echo "$TORCHELASTIC_RUN_ID" > "$OUT/run"; '
          '[ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ -n "$FAIL_ONCE" ] && { i=0; '
          'while [ "$FAIL_ONCE" = after-0 ] && ! grep -q "ran 0" "$OUT/workers" && [ $i -lt 200 ]; '
          'do sleep 0.05; i=$((i + 1)); done; exit 5; }; exit 0']


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_environ() | {"OUT": str(tmp_path)} | extra


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_an_unhealthy_node_runs_no_worker_and_exits_4_naming_the_checks_last_line(tmp_path):
    check = 'echo "checking GPUs"; echo "GPU 3: uncorrectable ECC error" >&2; echo; exit 1'
    done = run_cli("--nproc-per-node", "2", "--health-check", check, *WORKER, env=_env(tmp_path))
    assert done.returncode == 4, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("rankrun")]
    assert len(said) == 1 and "unhealthy: health check: GPU 3: uncorrectable ECC error" in said[0], done.stderr
    assert "drain it" in said[0]
    assert _lines(tmp_path / "workers") == []  # no worker ever started


def test_the_check_runs_before_every_attempt_with_the_nodes_environment(tmp_path):
    check = 'echo "$LOCAL_WORLD_SIZE $TORCHELASTIC_RUN_ID $KEPT" >> "$OUT/checks"'
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "1", "--health-check", check,
                   *WORKER, env=_env(tmp_path, FAIL_ONCE="after-0", KEPT="from-the-launcher"))
    assert done.returncode == 0, done.stderr
    run = (tmp_path / "run").read_text().strip()  # the run id the workers saw
    assert run and _lines(tmp_path / "checks") == [f"2 {run} from-the-launcher"] * 2  # attempt 0, and before the restart
    assert sorted(_lines(tmp_path / "workers")) == ["ran 0", "ran 0", "ran 1", "ran 1"]


def test_a_check_that_fails_before_the_restart_ends_the_job_there(tmp_path):
    check = '[ -e "$OUT/checked" ] && { echo "NIC down" >&2; exit 1; }; touch "$OUT/checked"'
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "3", "--health-check", check, *WORKER,
                   env=_env(tmp_path, FAIL_ONCE="after-0"))
    assert done.returncode == 4, done.stderr
    assert "health check: NIC down" in done.stderr
    assert sorted(_lines(tmp_path / "workers")) == ["ran 0", "ran 1"]  # attempt 0 only


def test_a_hanging_check_is_killed_at_its_timeout_with_its_whole_process_group(tmp_path):
    check = 'sleep 300 & echo $! > "$OUT/child"; echo $$ > "$OUT/shell"; wait'
    started = time.monotonic()
    done = run_cli("--nproc-per-node", "1", "--health-check-timeout", "0.5", "--health-check", check, *WORKER,
                   env=_env(tmp_path))
    took = time.monotonic() - started
    assert done.returncode == 4, done.stderr
    assert "health check: timed out after 0.5 s" in done.stderr
    pids = [int((tmp_path / name).read_text()) for name in ("child", "shell")]
    assert wait_gone(pids, 5.0) == [], "the check's group outlived it"
    assert took < 60, took  # not the default timeout
    assert _lines(tmp_path / "workers") == []


def test_sigterm_during_the_check_stops_it_and_the_launcher(launch, tmp_path):
    check = 'echo $$ > "$OUT/shell.tmp"; mv "$OUT/shell.tmp" "$OUT/shell"; echo CHECKING; sleep 300'
    run = launch("--nproc-per-node", "1", "--health-check", check, *WORKER, env=_env(tmp_path))
    _wait_file(tmp_path / "shell")  # the check runs (its output is not the console's)
    shell = int((tmp_path / "shell").read_text())
    assert alive(shell)
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(timeout=30) == 128 + signal.SIGTERM
    assert wait_gone([shell], 5.0) == []
    assert _lines(tmp_path / "workers") == []


def _wait_file(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


@pytest.mark.parametrize(("args", "named"), [
    (("--health-check-timeout", "0"), "--health-check-timeout '0': must be more than 0"),
    (("--health-check-timeout", "soon"), "--health-check-timeout 'soon': expected seconds"),
    (("--health-check", ""), "--health-check '': expected a command"),
])
def test_bad_values_are_one_line_and_exit_2(tmp_path, args, named):
    done = run_cli("--nproc-per-node", "1", *args, *WORKER, env=_env(tmp_path))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and named in done.stderr, done.stderr


def test_pet_health_check_sets_it(tmp_path):
    done = run_cli("--nproc-per-node", "1", *WORKER, env=_env(tmp_path, PET_HEALTH_CHECK="echo sick; exit 3"))
    assert done.returncode == 4 and "health check: sick" in done.stderr, done.stderr
    assert os.path.exists(tmp_path) and _lines(tmp_path / "workers") == []


def test_kill_dash_nine_of_the_launcher_takes_the_check_along(launch, tmp_path):
    check = 'sleep 300 & echo $! > "$OUT/child"; echo $$ > "$OUT/shell.tmp"; mv "$OUT/shell.tmp" "$OUT/shell"; wait'
    run = launch("--nproc-per-node", "1", "--health-check", check, *WORKER, env=_env(tmp_path))
    _wait_file(tmp_path / "shell")
    pids = [int((tmp_path / name).read_text()) for name in ("shell", "child")]
    run.proc.kill()
    run.finish(timeout=30)
    assert wait_gone(pids, 10.0) == [], "the launcher's watchdog left the check running"


def _three(launch, tmp_path: Path, checks: list[str], **env: str) -> list[object]:
    """Three launchers on loopback, each its own --local-addr and OUT folder, the first hosting the store; ``checks``:
    each node's --health-check."""
    b, c = os.urandom(2)
    addrs = [f"127.{1 + b % 254}.{c}.{n}" for n in (1, 2, 3)]
    common = ["--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addrs[0]}:29400", "--rdzv-id", "gate",
              "--nproc-per-node", "1", "--max-restarts", "1"]
    runs = []
    for n, addr in enumerate(addrs):
        out = tmp_path / f"node{n}"
        out.mkdir()
        node_env = clean_environ() | {"RANKRUN_RDZV_SECRET": "gate-secret", "OUT": str(out), **env}
        conf = f"is_host={int(n == 0)},last_call_timeout=1"  # every address is this machine's: say who hosts
        runs.append(launch(*common, "--rdzv-conf", conf, "--local-addr", addr, "--health-check", checks[n], *WORKER,
                           env=node_env))
    return runs


def test_on_several_nodes_an_unhealthy_node_is_excluded_and_the_others_run_the_job(launch, tmp_path):
    runs = _three(launch, tmp_path, ["true", "true", "echo 'no InfiniBand port is up'; exit 1"])
    codes = [r.finish(timeout=60) for r in runs]
    assert codes == [0, 0, 4], [r.err for r in runs]
    assert any("excluded from job gate" in line and "health check: no InfiniBand port is up" in line
               for line in runs[2].err), runs[2].err
    assert _lines(tmp_path / "node2" / "workers") == []  # it never ran a worker
    assert all(_lines(tmp_path / f"node{n}" / "workers") for n in (0, 1))
    assert any("is excluded from the job" in line and "no InfiniBand" in line for line in runs[0].err), runs[0].err


def test_the_store_hosts_own_check_fails_and_the_job_runs_on_the_others(launch, tmp_path):
    runs = _three(launch, tmp_path, ["echo 'disk /scratch full' >&2; exit 1", "true", "true"])
    codes = [r.finish(timeout=60) for r in runs]
    assert codes == [0, 0, 0], [r.err for r in runs]
    assert _lines(tmp_path / "node0" / "workers") == []  # it served the store, without workers
    assert sorted(_lines(tmp_path / "node1" / "workers") + _lines(tmp_path / "node2" / "workers")) == ["ran 0", "ran 1"]
    assert any("served it without workers" in line and "disk /scratch full" in line for line in runs[0].err), runs[0].err


def test_checks_run_before_every_round_and_one_failure_excludes_nobody(launch, tmp_path):
    count = 'echo checked >> "$OUT/checks"'
    runs = _three(launch, tmp_path, [count] * 3, FAIL_ONCE="1")
    assert [r.finish(timeout=60) for r in runs] == [0, 0, 0], [r.err for r in runs]
    for n in range(3):  # before joining, and before the round after rank 1's failure
        assert len(_lines(tmp_path / f"node{n}" / "checks")) == 2, n
    assert not any("excluded" in line for r in runs for line in r.err)



def test_the_check_rankrun_ships_names_the_nodes_fault_through_the_launcher(tmp_path):
    missing = tmp_path / "scratch-not-mounted"
    check = f"{sys.executable} -m rankrun.health --paths {tmp_path},{missing} --min-free 1K --timeout 5"
    done = run_cli("--nproc-per-node", "2", "--health-check", check, *WORKER, env=_env(tmp_path))
    assert done.returncode == 4, done.stderr
    assert f"health check: rankrun.health: path {missing}:" in done.stderr, done.stderr
    assert _lines(tmp_path / "workers") == []
    fine = run_cli("--nproc-per-node", "2", "--health-check", check.replace(f",{missing}", ""), *WORKER,
                   env=_env(tmp_path))
    assert fine.returncode == 0, fine.stderr  # LOCAL_WORLD_SIZE 2: 128 open files needed, and a node has them
    assert sorted(_lines(tmp_path / "workers")) == ["ran 0", "ran 1"]


def test_three_clean_runs_exclude_nobody(launch, tmp_path):
    for run in range(3):
        where = tmp_path / f"run{run}"
        where.mkdir()
        runs = _three(launch, where, ["true"] * 3)
        assert [r.finish(timeout=60) for r in runs] == [0, 0, 0], [r.err for r in runs]
        assert not any("excluded" in line for r in runs for line in r.err), [r.err for r in runs]
        assert sorted(line for n in range(3) for line in _lines(where / f"node{n}" / "workers")) == \
            ["ran 0", "ran 1", "ran 2"]


def test_a_static_job_that_cannot_go_on_without_an_excluded_node_ends_at_once_naming_it(launch, tmp_path):
    b, c = os.urandom(2)
    addrs = [f"127.{1 + b % 254}.{c}.{n}" for n in (1, 2)]
    runs = []
    for rank, addr in enumerate(addrs):
        out = tmp_path / f"node{rank}"
        out.mkdir()
        env = clean_environ() | {"RANKRUN_RDZV_SECRET": "static-secret", "OUT": str(out),
                                 "BLACKHOLE": "1" if rank == 1 else "0"}
        runs.append(launch("--nnodes", "2", "--node-rank", str(rank), "--master-addr", addrs[0], "--master-port", "29500",
                           "--local-addr", addr, "--nproc-per-node", "1", "--max-restarts", "3",
                           "--no-python", "sh", "-c", '[ "$BLACKHOLE" = 1 ] && exit 1; exec sleep 300', env=env))
    started = time.monotonic()
    assert [r.finish(timeout=60) for r in runs] == [3, 4], [r.err for r in runs]
    assert time.monotonic() - started < 30  # at once, not after join_timeout
    said = " ".join(runs[0].err)
    assert addrs[1] in said and "excluded" in said and "static" in said, runs[0].err


def test_a_node_whose_check_fails_is_never_counted_in_a_round_even_when_it_completes_max(launch, tmp_path):
    """Issue 34: the sick node, started first, joins as the host comes up, completing MAX (1:2): told only after it had
    joined, the host's first round counted it, its workers seeing WORLD_SIZE 4 until the round moved on. Its join says
    it now: excluded at once, never a member; the workers see 2 only. They wait for the test's word, so that the job
    is still on when the sick node joins, whenever that is."""
    b, c = os.urandom(2)
    addrs = [f"127.{1 + b % 254}.{c}.{n}" for n in (1, 2)]
    worker = ["--no-python", "sh", "-c", 'echo "WORLD_SIZE=$WORLD_SIZE" >> "$OUT/workers"; '
              'until [ -e "$OUT/go" ]; do sleep 0.02; done']  # bounded by the test's wait for the launchers
    runs = {}
    for n, name in ((1, "sick"), (0, "host")):  # the sick node first: it is in the store when the host's first decision comes
        out = tmp_path / name
        out.mkdir()
        check = "true" if n == 0 else "echo 'GPU 3: uncorrectable ECC error'; exit 1"
        runs[name] = launch("--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addrs[0]}:29400",
                            "--rdzv-id", "sickfirst", "--rdzv-conf", f"is_host={int(n == 0)},last_call_timeout=1",
                            "--local-addr", addrs[n], "--nproc-per-node", "2", "--health-check", check, *worker,
                            env=clean_environ() | {"RANKRUN_RDZV_SECRET": "gate-secret", "OUT": str(out)})
    assert runs["sick"].finish(timeout=60) == 4, runs["sick"].err
    (tmp_path / "host" / "go").touch()
    assert runs["host"].finish(timeout=60) == 0, runs["host"].err
    assert _lines(tmp_path / "host" / "workers") == ["WORLD_SIZE=2"] * 2  # one round, without the sick node
    assert _lines(tmp_path / "sick" / "workers") == []
    said = [line for line in runs["sick"].err if "excluded from job sickfirst" in line]
    assert said and "unhealthy: health check: GPU 3: uncorrectable ECC error" in said[0], runs["sick"].err
    assert not any("moved on" in line or "stopped" in line for line in runs["host"].err), runs["host"].err
