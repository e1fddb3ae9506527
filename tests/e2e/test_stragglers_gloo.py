"""``--straggler-window`` on real gloo jobs: a synchronous loop (every rank "computes" 50 ms a step, one rank 300 ms,
then they all_reduce, ``payloads/gloo_steps.py``). The slow rank is named within the run, once, with a lag within a
quarter of the 250 ms it adds, and with its address: one job of two nodes of two ranks on loopback (``two_nodes``),
the slow rank on the other node, on both nodes; a balanced job, or one loading data on every rank, names nobody; a
rank slowed by a CPU quota on its process (a cgroup), not by its code, is named just the same, by its node alone."""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import RANKRUN, Launcher, Reaper, clean_environ, fresh_loopback, payload

pytestmark = pytest.mark.usefixtures("private_tmpdir")

pytest.importorskip("torch")
if not pytest.importorskip("torch.distributed").is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

WINDOW = "3"
NAMED = r"rankrun: straggler: rank (\d+) on (\S+) — the other ranks waited for it in (\d+) % of (\d+) collectives \(median lag \+(\d+) ms\); CPU \d+ %, \w+"
ANY = "rankrun: straggler:"


def _env(**extra: str) -> dict[str, str]:
    return clean_environ() | {"RANKRUN_RDZV_SECRET": "stragglers"} | extra


def _tail(*runs: object) -> str:
    """What the launchers said last, whole (an assertion's repr would cut it short)."""
    return "\n\n".join("\n".join(run.err[-40:]) for run in runs)  # type: ignore[attr-defined]


def _events(path: Path) -> list[dict[str, object]]:
    return [e for e in (json.loads(line) for line in path.read_text().splitlines()) if e["event"] == "straggler"]


def test_a_balanced_job_loading_data_on_every_rank_names_nobody(launch, tmp_path):
    """Balanced, with every rank loading data at once every 8 steps (a second each: 4 windows of 3 s, each with a
    load); the stall test below is balanced with nothing else for its first 3 windows."""
    run = launch("--standalone", "--nproc-per-node", "4", "--straggler-window", WINDOW, payload("gloo_steps.py"),
                 env=_env(RUN_S="12", LOAD_EVERY="8", LOAD_S="1.0"))
    assert run.finish(timeout=180) == 0, _tail(run)
    assert not [line for line in run.err if ANY in line], run.err
    assert any(line.endswith(tuple(f"DONE {n}" for n in range(10, 1000))) for line in run.out), run.out


@contextlib.contextmanager
def _cpu_quota(share: float) -> Iterator[Path]:
    """A cgroup of its own with a CPU quota (cgroup v2's cpu.max, or v1's cfs quota), removed at the end."""
    name = f"rankrun-test-{uuid.uuid4().hex[:12]}"
    v2, v1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu")
    if (v2 / "cgroup.controllers").exists() and "cpu" in (v2 / "cgroup.subtree_control").read_text():
        group = v2 / name
        group.mkdir()
        (group / "cpu.max").write_text(f"{int(share * 100_000)} 100000")
    elif (v1 / "cpu.cfs_quota_us").exists():
        group = v1 / name
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(share * 100_000)))
    else:
        pytest.skip("no cgroup CPU controller to write here")
    try:
        yield group
    finally:
        deadline = time.monotonic() + 30
        while True:  # the worker is gone with its launcher; the group goes once empty
            try:
                group.rmdir()
                break
            except OSError:
                assert time.monotonic() < deadline, f"{group} still holds processes"
                time.sleep(0.05)


def test_a_rank_slowed_by_a_cpu_quota_on_its_process_is_named_just_the_same(launch, tmp_path):
    try:
        quota = _cpu_quota(0.15)
        group = quota.__enter__()
    except PermissionError:
        pytest.skip("cgroups are not writable here")
    try:
        # each of two ranks (one a core: spinners sharing a core would be late by turns) spins 50 ms of CPU a step;
        # rank 1's process may use 15 % of a CPU: ~330 ms a step
        events = tmp_path / "events.jsonl"
        run = launch("--standalone", "--nproc-per-node", "2", "--straggler-window", WINDOW, "--events", str(events),
                     payload("gloo_steps.py"), env=_env(SPIN="1", RUN_S="14", SLOW_S="0.05"))
        (ready,) = run.wait_for(r"READY rank 1 pid \d+", timeout=90)
        pid = ready.split()[-1]
        (group / "cgroup.procs").write_text(pid)
        run.wait_for(r"DONE \d+$", count=2, timeout=180)
        with contextlib.suppress(ProcessLookupError):  # its steps done: torch's exit at 15 % of a CPU took 3 s
            (group.parent / "cgroup.procs").write_text(pid)
        assert run.finish(timeout=180) == 0, _tail(run)
        named = [re.fullmatch(NAMED, line) for line in run.err if ANY in line]
        assert [m.group(1) if m else None for m in named] == ["1"], run.err
        assert [(e["rank"], e["verdict"]) for e in _events(events)] == [(1, "named")]
    finally:
        quota.__exit__(None, None, None)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Launcher], Path, str]]:
    """One job, two tests' (one launch of 4 gloo ranks, not two): two nodes of two ranks on loopback, rank 3 (the
    other node's second) slow; the launchers once ended (their exit codes asserted by the tests), the folder of
    their ``host.jsonl`` and ``other.jsonl`` events, and the other node's address. Like ``launch`` and
    ``private_tmpdir``, for a module: every process it learnt of gone, and no temporary file left behind."""
    tmp = tmp_path_factory.mktemp("two-nodes")
    reaper, private = Reaper(), tmp / "TMPDIR"
    private.mkdir()
    host, other = fresh_loopback(), fresh_loopback()
    args = ("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{host}:29433", "--rdzv-id", "stragglers",
            "--nproc-per-node", "2", "--straggler-window", WINDOW)
    env = _env(SLOW_RANK="3", RUN_S="14", TMPDIR=str(private), TEST_PID_DIR=str(reaper.watch_dir(tmp / "pids")))
    runs = [Launcher([*RANKRUN, *args, "--rdzv-conf", "is_host=1", "--local-addr", host, "--events",
                      str(tmp / "host.jsonl"), payload("gloo_steps.py")], dict(env), tmp, reaper),
            Launcher([*RANKRUN, *args, "--rdzv-conf", "is_host=0", "--local-addr", other, "--events",
                      str(tmp / "other.jsonl"), payload("gloo_steps.py")], dict(env), tmp, reaper)]
    try:  # every 127.x is this machine's: only one may host
        for run in runs:
            with contextlib.suppress(AssertionError):
                run.finish(timeout=180)  # the tests say what an exit code other than 0 means
        yield runs, tmp, other
    finally:
        for run in runs:
            if run.proc.poll() is None:
                run.kill()
        leaked = reaper.cleanup()
        assert not leaked, f"processes left behind: {leaked}"
        assert list(private.iterdir()) == [], "a launcher left temporary files behind"


def test_the_slow_rank_of_four_is_named_once_with_its_lag_and_an_event(two_nodes):
    """On every node, once over the run's windows, with its figures (late on most of at least 8 collectives, by the
    250 ms it adds, within a quarter), and one ``straggler`` event with them. (The job of ``two_nodes``: the watch
    of one node alone names its ranks in the CPU quota's test below, and names nobody in the balanced ones.)"""
    runs, events, _ = two_nodes
    assert [r.proc.returncode for r in runs] == [0, 0], _tail(*runs)
    for run in runs:
        named = [line for line in run.err if ANY in line]
        assert len(named) == 1, run.err
        m = re.fullmatch(NAMED, named[0])
        assert m is not None and m.group(1) == "3", named
        assert int(m.group(3)) >= 90 and int(m.group(4)) >= 8 and 188 <= int(m.group(5)) <= 312, named  # 250 ms ± 25 %
    for name in ("host", "other"):
        (event,) = _events(events / f"{name}.jsonl")
        assert event["rank"] == 3 and event["verdict"] == "named" and 0.188 <= event["lag"] <= 0.312  # type: ignore[operator]


def test_two_nodes_name_the_slow_rank_on_the_other_node_with_its_address_on_both(two_nodes):
    runs, events, other = two_nodes
    assert [r.proc.returncode for r in runs] == [0, 0], _tail(*runs)
    for run in runs:
        named = [re.fullmatch(NAMED, line) for line in run.err if ANY in line]
        assert [(m.group(1), m.group(2).endswith(f"/{other}")) for m in named if m] == [("3", True)], run.err
    for name in ("host", "other"):
        assert [e["rank"] for e in _events(events / f"{name}.jsonl")] == [3]


def test_with_straggler_action_exclude_a_node_named_window_after_window_is_excluded_and_the_job_goes_on(launch, tmp_path):
    """Three nodes of one rank (``--nnodes 2:3``), the third slow on every step: named three windows in a row, it is
    blamed once, which with ``--max-node-failures 1`` excludes it (exit 4); the other two re-form and finish."""
    host, b, slow = fresh_loopback(), fresh_loopback(), fresh_loopback()
    args = ("--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{host}:29434", "--rdzv-id", "exclude",
            "--nproc-per-node", "1", "--straggler-window", "2", "--straggler-action", "exclude", "--max-node-failures", "1",
            "--max-restarts", "1")
    # ~20 collectives a 2 s window; the two re-formed without the slow node (no restart spent) run 2 s
    env = _env(RUN_S="14", RESTARTED_RUN_S="2", FIRST_WORLD="3", COMPUTE_S="0.02", SLOW_S="0.1")
    runs = [launch(*args, "--rdzv-conf", "is_host=1,last_call_timeout=5", "--local-addr", host, payload("gloo_steps.py"),
                   env=dict(env)),
            launch(*args, "--rdzv-conf", "is_host=0", "--local-addr", b, payload("gloo_steps.py"), env=dict(env)),
            launch(*args, "--rdzv-conf", "is_host=0", "--local-addr", slow, payload("gloo_steps.py"),
                   env=env | {"SLOW_NODE": "1"})]  # every 127.x is this machine's: only the first may host
    assert runs[2].finish(timeout=180) == 4, _tail(*runs)
    assert re.search(rf"is excluded from job exclude: unhealthy: blamed for 1 stragglers \(--max-node-failures 1\); the "
                     rf"last: rank \d on \S+/{re.escape(slow)} held the others back for 3 windows in a row", runs[2].err[-1]), \
        runs[2].err
    assert [r.finish(timeout=180) for r in runs[:2]] == [0, 0], _tail(*runs)
    assert all(any(re.fullmatch(r".*DONE \d+", line) for line in r.out) for r in runs[:2])


def test_a_stall_is_the_stall_reports_and_names_no_straggler(launch, tmp_path):
    """Balanced for 6 s, then rank 1 stops for good before a collective: the stall report (``--hang-action fail``)
    ends the job; no window named anybody, before or during the stall."""
    run = launch("--standalone", "--nproc-per-node", "3", "--straggler-window", "2", "--hang-timeout", "3",
                 "--hang-action", "fail", payload("gloo_steps.py"), env=_env(SLOW_RANK="1", SLOW_S="0.05", STALL_AFTER="6",
                                                                             RUN_S="60"))
    assert run.finish(timeout=180) == 1, _tail(run)
    assert any("stalled" in line for line in run.err), run.err
    assert not [line for line in run.err if ANY in line], run.err
