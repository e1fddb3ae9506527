"""The rendezvous through relays chosen by the host (``--rdzv-conf relay_group=K``): real agents on loopback.

The host asks the first agents to arrive to relay, and sends the rest to them; a relay's node that is lost takes its
relayed nodes' places with it, and the others re-form. Workers are plain Python (no torch).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import clean_environ, fresh_loopback, payload, under_nofile

SECRET = "relay-secret"
FAST = "last_call_timeout=0.2,keep_alive_interval=0.5,keep_alive_max_attempt=2"
RELAYS = re.compile(r"this node relays other nodes' connections to the host, on (\S+)")
THROUGH = re.compile(r"joined through the relay at (\S+) ")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return clean_environ() | {"TEST_OUT_DIR": str(out), "RANKRUN_RDZV_SECRET": SECRET} | extra


def _node(addr: str, nnodes: str, conf: str, *, host: bool) -> list[str]:
    return ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addr}:29400", "--rdzv-id", "relays",
            "--rdzv-conf", f"{conf},is_host={int(host)}", "--nproc-per-node", "1", payload("node_worker.py")]


def _said(run: object, rx: re.Pattern[str]) -> str | None:
    found = [m.group(1) for line in run.err for m in [rx.search(line)] if m]  # type: ignore[attr-defined]
    return found[0] if found else None


def test_the_first_node_relays_and_the_others_join_through_it(launch, tmp_path):
    addr = fresh_loopback()
    env = _env(tmp_path)
    conf = "relay_group=2"  # 3 nodes besides the host, in groups of 2 + the relay's own: 1 relay
    host = launch(*_node(addr, "4", conf, host=True), env=dict(env))
    others = [launch(*_node(addr, "4", conf, host=False), env=dict(env)) for _ in range(3)]
    assert [run.finish() for run in (host, *others)] == [0] * 4, [run.err for run in (host, *others)]
    relays = [at for run in others if (at := _said(run, RELAYS)) is not None]
    through = [_said(run, THROUGH) for run in others if _said(run, RELAYS) is None]
    assert len(relays) == 1, [run.err for run in others]
    assert through == [relays[0], relays[0]], [run.err for run in others]  # both others were sent to it
    assert _said(host, RELAYS) is None and _said(host, THROUGH) is None  # the host serves, it is not relayed
    starts = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json")]
    assert sorted(int(s["RANK"]) for s in starts) == [0, 1, 2, 3]
    assert {(s["WORLD_SIZE"], s["GROUP_WORLD_SIZE"]) for s in starts} == {("4", "4")}
    assert {(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in starts} == {(addr, "29400")}  # the workers' store: the host's


def test_a_lost_relay_takes_its_nodes_and_the_others_reform_without_them(launch, tmp_path):
    addr = fresh_loopback()
    finish = tmp_path / "finish"
    env = _env(tmp_path, NODE_WAIT_FILE=str(finish))
    conf = f"{FAST},relay_group=1"  # 3 nodes besides the host: 2 relays, the third node sent to one of them
    host = launch(*_node(addr, "2:4", conf, host=True), env=dict(env))
    others = [launch(*_node(addr, "2:4", conf, host=False), env=dict(env)) for _ in range(3)]
    for run in (host, *others):
        run.wait_for(r"READY rank \d world 4 restart 0")
    relays = {run: at for run in others if (at := _said(run, RELAYS)) is not None}
    relayed = next(run for run in others if run not in relays)
    via = _said(relayed, THROUGH)
    assert len(relays) == 2 and via in relays.values(), [run.err for run in others]
    doomed = next(run for run, at in relays.items() if at == via)
    survivor = next(run for run in relays if run is not doomed)
    doomed.proc.kill()  # kill -9: the relay's connections drop with it
    doomed.finish()
    assert relayed.finish() == 3  # it lost its way to the host: an infrastructure error, as losing the host is
    assert f"through the relay at {via}" in relayed.err[-1] and "lost its place in the job" in relayed.err[-1], relayed.err
    for run in (host, survivor):
        run.wait_for(r"READY rank \d world 2 restart 0")  # re-formed without both, without using a restart
    finish.touch()
    assert [host.finish(), survivor.finish()] == [0, 0], (host.err, survivor.err)


def test_a_host_that_cannot_hold_every_node_asks_for_relays_by_itself_and_says_so(launch, tmp_path):
    addr = fresh_loopback()
    env = _env(tmp_path)
    conf = "last_call_timeout=0.2"
    # 2 x 200 nodes' connections do not fit under 256 open files: ceil(sqrt(200)) = 15 nodes per relay: the 199 others in groups of 16, 13 relays
    host = launch(*_node(addr, "2:200", conf, host=True), env=dict(env), cmd=under_nofile(256, 256))
    other = launch(*_node(addr, "2:200", conf, host=False), env=dict(env))
    assert [host.finish(), other.finish()] == [0, 0], (host.err, other.err)
    said = [line for line in host.err if "relay" in line]
    assert len(said) == 1, host.err
    assert ("cannot hold 200 nodes' connections under its open-files limit (RLIMIT_NOFILE 256): 13 of the nodes "
            "relay the others', up to 15 each (--rdzv-conf relay_group=0: never)") in said[0]
    assert _said(other, RELAYS) is not None, other.err  # the first to arrive was asked


def test_a_negative_relay_group_is_one_line_naming_the_flag(launch):
    run = launch("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{fresh_loopback()}:29400",
                 "--rdzv-conf", "relay_group=-1", "--no-python", "true", env=clean_environ())
    assert run.finish() == 2
    assert len(run.err) == 1 and "--rdzv-conf" in run.err[0] and "relay_group=-1" in run.err[0], run.err
