"""The goodput account of real gloo jobs (``events.goodput``): 2 ranks sleep 1.5 s before ``init_process_group``, run 20
steps of 0.2 s that each end in an all-reduce, keep their progress every 5 steps, and rank 1 is lost at step 12 of
attempt 0. The account in ``job.end`` and in the job's last line matches what the script itself timed, within the
tolerances below; a clean job on two nodes loses nothing, restarts nothing, and the nodes agree on the job's wall time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import Launcher, clean_environ, fresh_loopback, payload, run_cli

pytestmark = pytest.mark.usefixtures("private_tmpdir")

pytest.importorskip("torch")

PARTS = ("productive_s", "waiting_s", "startup_s", "restart_s", "stall_s", "lost_s")
# how far the account may be from the script's own clock: the launcher sees a sign up to a poll late, but the account
# takes each sign's own time, so only the clocks' reading differs (a few ms), and a process's exit after its last step
TIGHT = 0.15  # seconds: start-up (the first all-reduce's own time against the script's reading just before it)
EXIT = 2.0  # seconds: the launcher's teardown after a kill, which the script cannot time (on a loaded machine)
LINE = re.compile(r"^rankrun: goodput (?P<productive>[\d.]+|0) % of (?P<wall>[\d.]+) s(?P<whose> \(.*\))? — "
                  r"start-up (?P<startup>[\d.]+|0) %, restarts (?P<restart>[\d.]+|0) % \((?P<restarts>\d+)\), "
                  r"stalls (?P<stall>[\d.]+|0) %, lost (?P<lost>[\d.]+|0) %, waiting (?P<waiting>[\d.]+|0) %$")


def _env(out: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_environ() | {"OUT": str(out), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")} | extra


def _read(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _facts(out: Path) -> dict[str, dict[str, object]]:
    return {p.name.removesuffix(".json"): json.loads(p.read_text()) for p in out.glob("*.json")}


def _said(line: re.Match[str], account: dict[str, float]) -> None:
    """The job's line says the account's shares (each to the 0.1 % it prints)."""
    wall = account["wall_s"]
    assert abs(float(line["wall"]) - wall) <= 0.05 + 0.001 * wall
    for part in ("productive", "startup", "restart", "stall", "lost", "waiting"):
        assert abs(float(line[part]) - 100 * account[f"{part}_s"] / wall) <= 0.051, (part, line[0], account)


def test_a_rank_lost_at_step_12_costs_the_steps_since_step_10_and_the_account_matches_the_scripts_clock(tmp_path):
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    out.mkdir()
    # a 6 s straggler window: the shim writes the first collective within a second (the default 60 s: within 10 s,
    # longer than these attempts; the event has the collective's own time either way)
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "1", "--straggler-window", "6", "--events", str(events),
                   payload("goodput_steps.py"), env=_env(out, tmp_path, KILL_RANK="1", KILL_AT="12"), cwd=tmp_path,
                   timeout=180)
    assert done.returncode == 0, done.stderr
    seen = _read(events)
    account = seen[-1]["goodput"]
    assert seen[-1]["event"] == "job.end"
    facts = _facts(out)
    assert sorted(facts) == ["0.1", "1.0", "1.1"]  # rank 0 of attempt 0 was stopped in its all-reduce
    assert (facts["0.1"]["resumed"], facts["1.1"]["resumed"]) == (10, 10)
    starts = {e["attempt"]: e for e in seen if e["event"] == "workers.start"}
    ends = {e["attempt"]: e for e in seen if e["event"] == "workers.end"}
    kept = {e["step"]: e for e in seen if e["event"] == "checkpoint.kept"}
    trained = {e["attempt"]: e for e in seen if e["event"] == "training"}
    assert sorted(trained) == [0, 1]  # the first collective of each attempt, from the Flight Recorder

    # the parts sum to the wall time, which is job.start to job.end
    assert abs(sum(account[p] for p in PARTS) - account["wall_s"]) <= 0.01 * account["wall_s"]
    assert abs(account["wall_s"] - (seen[-1]["mono"] - seen[0]["mono"])) <= 0.002
    # start-up: each attempt from its workers' start to its first all-reduce, the 1.5 s sleep and torch's import in it
    first = {0: facts["1.0"]["first_collective"], 1: min(facts["0.1"]["first_collective"], facts["1.1"]["first_collective"])}
    startup = sum(first[a] - starts[a]["ts"] for a in (0, 1))
    assert abs(account["startup_s"] - startup) <= 2 * TIGHT, (account, startup)
    assert account["startup_s"] >= 2 * 1.5
    # lost: from step 10's keeping to the failure (step 11 and the start of 12: about 0.2 s), and the teardown
    saved = facts["1.0"]["saved"]
    assert sorted(saved) == ["10", "5"]
    lost_least = facts["1.0"]["killed"] - saved["10"]
    assert lost_least - TIGHT <= account["lost_s"] <= ends[0]["ts"] - saved["10"] + TIGHT, (account, lost_least)
    assert account["lost_s"] <= lost_least + EXIT
    # productive: attempt 0 from its first all-reduce to step 10 kept, attempt 1 from its first to its end
    productive = (kept[10]["mono"] - starts[0]["mono"] - (first[0] - starts[0]["ts"])) + \
        (facts["1.1"]["ended"] - first[1])
    exit_ = seen[-1]["ts"] - max(facts["0.1"]["ended"], facts["1.1"]["ended"])  # destroy_process_group, exits, the end
    assert productive - TIGHT <= account["productive_s"] <= productive + exit_ + TIGHT, (account, productive, exit_)
    assert account["productive_s"] >= 2 * 10 * 0.2  # 20 steps of 0.2 s, each run once
    # restart: from attempt 0's end to attempt 1's start; no stall; the launcher's own milliseconds before attempt 0
    assert account["restart_s"] == pytest.approx(starts[1]["mono"] - ends[0]["mono"], abs=0.002)
    assert 0 < account["restart_s"] < 3
    assert account["stall_s"] == 0
    assert account["waiting_s"] == pytest.approx(starts[0]["mono"] - seen[0]["mono"], abs=0.002)
    # the job's last line before its report, with one restart
    [line] = [m for m in map(LINE.match, done.stderr.splitlines()) if m]
    assert line["restarts"] == "1" and line["whose"] is None
    _said(line, account)


def test_a_clean_job_on_two_nodes_loses_nothing_and_the_nodes_agree_on_its_wall_time(launch, tmp_path):
    """The straggler watch off (``--straggler-window 0``: no Flight Recorder's arrivals), so each attempt's start-up
    ends at its first kept save (step 5), the next most trusted sign. The host's line is the job's: the two nodes, the
    worst named."""
    endpoint = fresh_loopback()
    out = tmp_path / "out"
    out.mkdir()
    env = _env(out, tmp_path, RANKRUN_RDZV_SECRET="goodput")

    def node(name: str, addr: str) -> Launcher:
        return launch("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{endpoint}:29400",
                      "--rdzv-id", "goodput", "--rdzv-conf", f"is_host={name == 'a'}", "--local-addr", addr,
                      "--nproc-per-node", "1", "--straggler-window", "0", "--events", str(tmp_path / f"{name}.jsonl"),
                      payload("goodput_steps.py"),
                      env=env)

    a, b = node("a", endpoint), node("b", fresh_loopback())
    assert [a.finish(timeout=180), b.finish(timeout=180)] == [0, 0], (a.err, b.err)
    facts = _facts(out)
    accounts = {}
    for name, rank in (("a", "0"), ("b", "1")):
        seen = _read(tmp_path / f"{name}.jsonl")
        account = accounts[name] = seen[-1]["goodput"]
        assert abs(sum(account[p] for p in PARTS) - account["wall_s"]) <= 0.01 * account["wall_s"]
        assert (account["lost_s"], account["restart_s"], account["stall_s"]) == (0, 0, 0), account
        [start] = [e for e in seen if e["event"] == "workers.start"]
        assert [e["step"] for e in seen if e["event"] == "checkpoint.kept"] == [5, 10, 15, 20]
        assert not [e for e in seen if e["event"] == "training"]  # the watch is off: no first collective
        called, returned = facts[f"{rank}.0"]["saving"]["5"], facts[f"{rank}.0"]["saved"]["5"]  # step 5's save
        assert called - TIGHT <= start["ts"] + account["startup_s"] <= returned + TIGHT, (account, called, returned)
        assert account["startup_s"] >= 1.5 + 4 * 0.2  # the sleep and steps 1-4 at least
        assert account["productive_s"] >= 15 * 0.2 - TIGHT  # steps 6-20 at least
    assert abs(accounts["a"]["wall_s"] - accounts["b"]["wall_s"]) <= 1.0  # the nodes agree on the job's wall time
    [host] = [m for m in map(LINE.match, a.err) if m]
    [own] = [m for m in map(LINE.match, b.err) if m]
    assert host["whose"].startswith(" (the job, 2 nodes; the worst: ") and own["whose"] is None, (host[0], own[0])
    assert host["restarts"] == own["restarts"] == "0"
    _said(own, accounts["b"])
    # the job's goodput: the worst node's productive time over the job's wall time (the other node's account as it
    # wrote it once its workers ended, a moment before its job.end: within 2 points of the final accounts')
    worst = min(accounts.values(), key=lambda a: a["productive_s"] / a["wall_s"])
    job = 100 * worst["productive_s"] / max(a["wall_s"] for a in accounts.values())
    assert abs(float(host["productive"]) - job) <= 2.0, (host[0], accounts)
    assert float(host["productive"]) <= min(100 * a["productive_s"] / a["wall_s"] for a in accounts.values()) + 0.1
