"""``rankrun.checkpoint`` with real torch and gloo: a rank killed at step 7 of 12 costs no step (the job ends with the
very parameters of an uninterrupted run, cold, and forked from ``--preload torch`` on two nodes that lose one), and a rank killed halfway through a 200 MB
save resumes from the previous step, every byte of it intact."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import Launcher, clean_environ, fresh_loopback, payload, run_cli
from rankrun.checkpoint.manifest import newest_complete

pytestmark = pytest.mark.usefixtures("private_tmpdir")

pytest.importorskip("torch")


def _train(tmp_path: Path, name: str, *args: str, **env: str) -> dict[str, dict[str, object]]:
    """``keep_steps.py`` on 2 ranks; what each rank wrote at its end, by ``<rank>.<attempt>``; a restart says which
    step it resumed from."""
    out = tmp_path / name
    out.mkdir()
    env = {"OUT": str(out), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")} | env  # torch.optim's, not TMPDIR
    done = run_cli("--nproc-per-node", "2", *args, payload("keep_steps.py"), env=clean_environ() | env, cwd=tmp_path,
                   timeout=180)
    assert done.returncode == 0, done.stderr
    if "KILL_AT" in env:
        assert re.search(r"^rankrun: attempt 1 resumes from step 6 kept in memory: ranks 0-1, [\d.]+ kB in [\d.]+ s$",
                         done.stderr, re.M), done.stderr
    return _results(out)


def _results(out: Path) -> dict[str, dict[str, object]]:
    return {p.name.removesuffix(".json"): json.loads(p.read_text()) for p in out.glob("*.json")}


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """The reference: ``keep_steps.py`` on 2 ranks, uninterrupted (one import of torch, not two)."""
    return _train(tmp_path_factory.mktemp("whole"), "whole", "--preload", "torch")


def test_a_rank_killed_at_step_7_costs_no_step(tmp_path, whole):
    assert sorted(whole) == ["0.0", "1.0"]
    assert whole["0.0"]["ran"] == list(range(1, 13))
    # cold here; forked from --preload torch, and on two nodes (the step agreed through the store), in the tests below
    events = tmp_path / "events.jsonl"
    runs = {"cold": _train(tmp_path, "cold", "--max-restarts", "1", "--events", str(events), KILL_RANK="1", KILL_AT="7")}
    for name, killed in runs.items():
        assert sorted(killed) == ["0.1", "1.1"], name  # attempt 0 never got to its end
        for rank in ("0", "1"):
            resumed = killed[f"{rank}.1"]
            assert (resumed["resumed"], resumed["ran"]) == (6, [7, 8, 9, 10, 11, 12]), name
            assert resumed["params"] == whole[f"{rank}.0"]["params"], name  # exactly: not one step lost or repeated
    seen = [json.loads(line) for line in events.read_text().splitlines()]
    kept = [(e["step"], e["ranks"], e["state"]) for e in seen if e["event"] == "checkpoint.kept"]
    assert kept == [(s, "0-1", "kept") for s in range(1, 7)] + [(s, "0-1", "kept") for s in range(7, 13)]
    (restored,) = [e for e in seen if e["event"] == "checkpoint.restored"]
    assert {k: restored[k] for k in ("attempt", "step", "source", "ranks")} == {"attempt": 1, "step": 6,
                                                                              "source": "memory", "ranks": "0-1"}


def test_a_rank_killed_halfway_through_a_save_resumes_from_the_previous_step_intact(tmp_path):
    done = run_cli("--nproc-per-node", "1", "--max-restarts", "1", payload("keep_torn.py"),
                   env=clean_environ() | {"OUT": str(tmp_path)}, cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "was killed by signal 9 (SIGKILL)" in done.stderr
    assert json.loads((tmp_path / "loaded.json").read_text()) == {"step": 2, "intact": True}


def test_a_preempted_job_leaves_its_newest_step_on_disk_and_a_fresh_job_resumes_there(launch, tmp_path, whole):
    """SIGTERM to the launcher (a scheduler's preemption) while both ranks wait after step 5: step 5 is the newest
    complete step in ``--checkpoint-dir`` (step 4 too unless step 5 overtook it), nothing half-written; a fresh job
    with the same directory resumes both ranks at step 5, from the disk (the first job's memory is gone with it), and
    leaves its own last step there at its end. These two jobs train with ``torch.optim.SGD`` itself (``OPTIM=torch``):
    its own state goes through the disk, and they end with the very parameters of the uninterrupted run (``whole``,
    with keep_steps.py's SGD written out, as the other tests here)."""
    kept = tmp_path / "kept"
    env = clean_environ() | {"OUT": str(tmp_path), "HOLD_AT": "5", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind"),
                             "OPTIM": "torch"}
    first = launch("--nproc-per-node", "2", "--preload", "torch", "--checkpoint-dir", str(kept), payload("keep_steps.py"),
                   env=env)
    first.wait_for(r"HELD 5", count=2, timeout=120)
    first.proc.send_signal(signal.SIGTERM)
    assert first.finish() == 143, first.err
    assert not [p for p in kept.rglob("*") if ".tmp" in p.name]  # nothing half-written left
    newest = newest_complete(kept)  # a standalone job's steps go to the directory itself
    assert newest is not None and (newest.step, newest.world, sorted(newest.files)) == (5, 2, [0, 1])
    events = tmp_path / "events.jsonl"
    second = run_cli("--nproc-per-node", "2", "--preload", "torch", "--checkpoint-dir", str(kept), "--events", str(events),
                     payload("keep_steps.py"), env=env | {"HOLD_AT": "-1"}, cwd=tmp_path, timeout=180)
    assert second.returncode == 0, second.stderr
    for rank in (0, 1):
        resumed = json.loads((tmp_path / f"{rank}.0.json").read_text())
        assert (resumed["resumed"], resumed["ran"]) == (5, [6, 7, 8, 9, 10, 11, 12])
        assert resumed["params"] == whole[f"{rank}.0"]["params"]  # not one step lost or repeated, torch's SGD or ours
    seen = [json.loads(line) for line in events.read_text().splitlines()]
    (restored,) = [e for e in seen if e["event"] == "checkpoint.restored"]
    assert (restored["step"], restored["source"]) == (5, "disk")
    assert "attempt 0 resumes from step 5 from --checkpoint-dir" in second.stderr
    written = [(e["step"], e["to"], e["state"]) for e in seen if e["event"] == "checkpoint.written"]
    assert written[-1] == (12, "disk", "complete"), written  # the newest wins (a step a save overtook is abandoned)
    assert json.loads(next((kept / "step_000000012").glob("node_*.json")).read_text())["ranks"] == "0-1"


@pytest.mark.parametrize("spare", [True, False], ids=["a-spare-takes-its-place", "the-world-shrinks"])
def test_a_lost_nodes_ranks_resume_from_the_neighbours_copy(launch, tmp_path, whole, spare):
    """Two nodes of one rank each hold after step 5 (each has put its steps to the other, the ring's next node);
    node B's launcher is SIGKILLed (its rank dies with it). With a spare, C takes B's place and its rank 1 loads B's
    step from A's copy over the network: no directory, and the job ends as an uninterrupted run does. Without one
    (``--nnodes 1:2``), A goes on alone: its rank's ``load()`` refuses the changed world, and ``load(rank=0)`` and
    ``load(rank=1)`` give both old ranks' step 5 (rank 1's from the copy A holds)."""
    endpoint = fresh_loopback()
    # B's loss noticed within 3 s, and no node lost for a late keep-alive on a busy machine; with --nnodes 1:2, A's
    # first round waits 3 s for B once A has joined (a loaded machine starts B's launcher late): both in round 1
    conf = (f"last_call_timeout={0.2 if spare else 3},keep_alive_interval=0.5,keep_alive_max_attempt=6")
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "kept", "OUT": str(tmp_path), "HOLD_AT": "5",
                             "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}

    def node(name: str, addr: str) -> Launcher:  # A hosts the job's store, whoever binds first: it is never killed
        return launch("--nnodes", "2:2" if spare else "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                      f"{endpoint}:29400", "--rdzv-id", "lost", "--rdzv-conf", f"{conf},is_host={name == 'a'}",
                      "--local-addr", addr, "--nproc-per-node", "1", "--preload", "torch", "--events",
                      str(tmp_path / f"{name}.jsonl"), payload("keep_steps.py"), env=env)

    a = node("a", endpoint)
    b = node("b", fresh_loopback())
    for launcher in (a, b):
        launcher.wait_for(r"HELD 5", timeout=120)
    _until(lambda: ("b", 5) in _copies(tmp_path), 60, lambda: {"a": a.err, "b": b.err})  # B's step 5 complete at A
    if not spare:
        b.proc.kill()
        b.finish()
        assert a.finish(timeout=180) == 0, a.err
        (alone,) = [v for k, v in _results(tmp_path).items() if k.startswith("0.")]
        assert (alone["resumed"], alone["ran"], alone["world"]) == (5, [6, 7, 8, 9, 10, 11, 12], 1)
        assert alone["resharded"] == {"steps": [5, 5], "same": True}
        return
    c = node("c", fresh_loopback())
    c.wait_for(r"this node waits as a spare", timeout=60)
    b.proc.kill()
    b.finish()
    assert [a.finish(timeout=180), c.finish(timeout=180)] == [0, 0], (a.err, c.err)
    for rank in ("0", "1"):
        (done,) = [v for k, v in _results(tmp_path).items() if k.startswith(f"{rank}.")]
        assert done["resumed"] == 5 and done["ran"] == [6, 7, 8, 9, 10, 11, 12], done
        assert done["params"] == whole[f"{rank}.0"]["params"]
    (restored,) = [e for e in _read(tmp_path / "c.jsonl") if e["event"] == "checkpoint.restored"]
    assert (restored["step"], restored["source"], restored["ranks"]) == (5, "neighbour", "1")
    assert any("resumes from step 5 from the neighbour's copy: ranks 1," in line for line in c.err), c.err


def _read(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _copies(tmp_path: Path) -> set[tuple[str, int]]:
    """(node, step) of each neighbour's copy a node's events say is complete."""
    return {(name, int(e["step"])) for name in ("a", "b", "c") for e in _read(tmp_path / f"{name}.jsonl")
            if e["event"] == "checkpoint.written" and e["to"] == "neighbour" and e["state"] == "complete"}


def _until(condition: Callable[[], bool], timeout: float, said: Callable[[], object] = lambda: "") -> None:
    """Until ``condition``, at most ``timeout`` s; ``said``: what the launchers said, for a failure's message."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out; the launchers said: {said()}"
        time.sleep(0.1)
