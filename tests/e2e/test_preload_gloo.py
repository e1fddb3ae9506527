"""``--preload torch`` with real torch and gloo: forked workers draw their own random numbers (a fork copies torch's
and numpy's generators: every rank would draw the same), a gloo job and a restart after ``init_process_group`` pass
with both attempts forked, ``@record``'s error file from a forked worker is the one a cold worker writes, and a forked
worker's shim writes the straggler watch's arrivals from torch's Flight Recorder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import clean_environ, payload, run_cli

pytestmark = pytest.mark.usefixtures("private_tmpdir")

pytest.importorskip("torch")
pytest.importorskip("numpy")


def _job(tmp_path: Path, name: str, *args: str, **env: str) -> tuple[int, str, str, dict[str, dict[str, object]]]:
    out = tmp_path / name
    out.mkdir()
    done = run_cli("--nproc-per-node", "2", *args, payload("preload_gloo.py"),
                   env=clean_environ() | {"PROBE_OUT": str(out)} | env, cwd=tmp_path, timeout=180)
    drawn = {p.name.removesuffix(".json"): json.loads(p.read_text()) for p in out.glob("*.json")}
    return done.returncode, done.stdout, done.stderr, drawn


def _events(path: Path, kind: str) -> list[dict[str, object]]:
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == kind]


def _all_different(draws: list[dict[str, object]]) -> None:
    for generator in ("torch", "numpy", "random"):
        values = [json.dumps(d[generator]) for d in draws]
        assert len(set(values)) == len(values), f"{generator}: {values}"


def _normal(report: str) -> str:
    """What differs between any two launches: pids, times, the run's folder, the rendezvous port."""
    report = re.sub(r"(pid\s+: |PID |pid )\d+", r"\1N", report)
    report = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?", "TIME", report)
    return re.sub(r"rankrun_[0-9a-f-]+_[0-9a-z_]+", "rankrun_RUN", report)


def test_forked_workers_draw_their_own_numbers_and_a_restart_passes_init_again(tmp_path):
    """Rank 1 fails after init_process_group on attempt 0; attempt 1 is forked from the same import and joins a new
    process group. numpy.random is preloaded too (torch imports numpy, not numpy.random), so its copied state is
    what each worker must not keep; a second job draws again."""
    events = tmp_path / "events.jsonl"
    rc, out, err, first = _job(tmp_path, "first", "--preload", "torch,numpy.random", "--max-restarts", "1",
                               "--events", str(events), FAIL_RANK="1")
    assert rc == 0, err
    assert sorted(out.splitlines()) == ["[default0]:rank 0 attempt 1 sum 3", "[default1]:rank 1 attempt 1 sum 3"]
    assert "rankrun: attempt 0 failed: rank 1" in err
    warm = _events(events, "warm")
    assert [(w["attempt"], w["forked"], w["cold"]) for w in warm] == [(0, "0-1", ""), (1, "0-1", "")]
    assert sorted(first) == ["0.0", "0.1", "1.0", "1.1"]
    rc, out, err, second = _job(tmp_path, "second", "--preload", "torch")
    assert rc == 0, err
    assert sorted(out.splitlines()) == ["[default0]:rank 0 attempt 0 sum 3", "[default1]:rank 1 attempt 0 sum 3"]
    _all_different([*first.values(), *second.values()])


def test_records_error_file_from_a_forked_worker_is_a_cold_ones(tmp_path):
    runs = [_job(tmp_path, name, *preload, FAIL_RANK="1") for name, preload in
            (("cold", ()), ("warm", ("--preload", "torch")))]
    for rc, _, err, _ in runs:
        assert rc == 1
        assert "  exception  : (from error file)" in err, err
        assert "ValueError: boom from rank 1" in err
    (_, _, cold, _), (_, _, warm, _) = runs
    report = warm[warm.index("=" * 72):]  # the failure report (the start-up line before it has times, the fork)
    assert _normal(report) == _normal(cold[cold.index("=" * 72):])
    assert "rankrun/preload" not in warm
    assert re.search(r'File "[^"]*/preload_gloo\.py", line \d+, in main\n', report), report


def test_a_forked_workers_shim_writes_its_arrivals_for_the_straggler_watch(tmp_path):
    """The stack shim's per-worker part, attached in a forked worker, starts the Flight Recorder reader: each rank's
    arrivals file holds every collective, as a cold worker's does (``test_straggler_arrivals_gloo``)."""
    from rankrun.straggler.frfile import read_new  # noqa: PLC0415 - only here

    steps = 5
    logs = tmp_path / "logs"
    env = clean_environ() | {"SLOW_RANK": "1", "SLOW_S": "0.05", "STEPS": str(steps), "ARRIVALS_WAIT": "20"}
    done = run_cli("--nproc-per-node", "2", "--preload", "torch", "--straggler-window", "6", "--log-dir", str(logs),
                   "--events", str(tmp_path / "events.jsonl"), payload("gloo_straggler.py"), env=env, cwd=tmp_path,
                   timeout=180)
    assert done.returncode == 0, done.stderr
    assert [(w["forked"], w["cold"]) for w in _events(tmp_path / "events.jsonl", "warm")] == [("0-1", "")]
    (attempt,) = logs.glob("*/attempt_0")
    for rank in (0, 1):
        arrivals, _ = read_new(attempt / "straggler" / f"rank_{rank}.fr", 0)
        assert set(range(1, steps + 1)) <= {a.seq for a in arrivals}, arrivals
