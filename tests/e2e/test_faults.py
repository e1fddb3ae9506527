"""Silent network faults between hosts in network namespaces: a node cut off from the job, a host that goes dark.

No RST and no FIN reach anyone (a switch port dropping frames, an interface taken down inside a
host), so TCP alone would hold the connections for ~15 minutes. What must happen instead, with a
keep-alive window of 3 s (``keep_alive_interval=1,keep_alive_max_attempt=3``):

- the cut-off member stops its workers (blocked in an all_reduce) and exits 3 naming the host that
  stopped answering, while the others re-form without it;
- when the host of the rendezvous goes dark, its members exit 3 naming it, and the host — left alone,
  below MIN — stops its workers and exits 3 after ``last_call_timeout``.

The bounds asserted here are loose (the precise figures are in ``bench/faults.py``): what they pin is
seconds, not TCP's quarter of an hour.
"""

from __future__ import annotations

import time

import pytest

import netns
from conftest import PY, alive, clean_environ, payload, wait_gone

pytestmark = pytest.mark.usefixtures("private_tmpdir")
pytest.importorskip("torch")

WINDOW = 3.0  # keep_alive_interval x keep_alive_max_attempt
SHUTDOWN = 2
CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
BOUND = WINDOW + SHUTDOWN + 2.0 + 8.0  # the bound, plus slack for a loaded 2-core machine


def _job(sw: netns.Switch, launch, tmp_path, hosts: int, min_nodes: int = 1):
    """One agent per host, host 0 hosting the rendezvous; returns them once every worker is in the all_reduce loop."""
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "faults", "FINISH_FILE": str(tmp_path / "finish")}
    args = ("--nnodes", f"{min_nodes}:{hosts}", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{sw.addr(0)}:29400", "--rdzv-id", "cut",
            "--rdzv-conf", CONF, "--shutdown-timeout", str(SHUTDOWN), "--nproc-per-node", "1", payload("gloo_loop.py"))
    agents = [launch(*args, env=dict(env), cmd=(*sw.exec(0), PY, "-m", "rankrun"))]
    agents += [launch(*args, env=dict(env), cmd=(*sw.exec(i), PY, "-m", "rankrun")) for i in range(1, hosts)]
    for agent in agents:
        agent.wait_for(rf"READY rank \d world {hosts}", timeout=90)
    return agents


def _workers(tmp_path) -> list[int]:
    return [int(p.read_text()) for p in (tmp_path / "pids").glob("g*")]


def test_a_member_cut_off_mid_all_reduce_stops_its_workers_and_exits_while_the_others_reform(launch, tmp_path):
    with netns.switch(3, nft=True) as sw:
        host, member, doomed = _job(sw, launch, tmp_path, 3)
        workers = _workers(tmp_path)
        cut = time.monotonic()
        sw.cut(2)  # the switch drops everything to and from host 2: no RST, no FIN
        assert doomed.finish(timeout=60) == 3
        took = time.monotonic() - cut
        assert took < BOUND, doomed.err
        assert f"the host at {sw.addr(0)}:29400 stopped answering (no reply for" in doomed.err[-1], doomed.err
        assert "the network or the host is down" in doomed.err[-1]
        for survivor in (host, member):
            survivor.wait_for(r"READY rank \d world 2", timeout=60)  # re-formed without it
        assert any(f"at {sw.addr(2)} was lost: its lease expired after 3 s of silence" in line for line in host.err), host.err
        (tmp_path / "finish").touch()
        assert [host.finish(), member.finish()] == [0, 0], (host.err, member.err)
        sw.heal()
    assert wait_gone(workers, 10.0) == []


def test_a_host_that_goes_dark_ends_its_members_and_itself_in_one_line_each(launch, tmp_path):
    with netns.switch(3) as sw:
        host, *members = _job(sw, launch, tmp_path, 3, min_nodes=2)
        workers = _workers(tmp_path)
        dark = time.monotonic()
        sw.link_down(0)  # the host's own interface goes down: it can reach nobody, nobody reaches it
        for member in members:
            assert member.finish(timeout=60) == 3
            assert time.monotonic() - dark < BOUND, member.err
            assert f"the host at {sw.addr(0)}:29400 stopped answering" in member.err[-1], member.err
        # the host sees every member's lease expire, stops its workers, waits last_call_timeout (1 s) alone, ends
        assert host.finish(timeout=60) == 3
        assert time.monotonic() - dark < BOUND + 1.0, host.err
        assert "every other node was lost and none came back within last_call_timeout (1 s)" in host.err[-1], host.err
        sw.heal()
    assert not [p for p in workers if alive(p)]
    assert wait_gone(workers, 10.0) == []
