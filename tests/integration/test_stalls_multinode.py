"""Several nodes: one stack report of the whole job, through the rendezvous store, printed by every agent.

Two loopback "nodes" of two plain-Python workers each (the embedded store; tests/e2e/test_etcd.py has the
same on etcd): ranks 0-2 wait, rank 3 (on the second node) sits in ``stuck_loading_data``.
"""

from __future__ import annotations

import re
import signal

import pytest

from conftest import clean_environ, fresh_loopback, payload, run_cli

pytestmark = pytest.mark.usefixtures("private_tmpdir")

STALLED = r"rankrun: job \S+ stalled: "


def _nodes(launch, *extra: str) -> tuple[object, object, str]:
    """The host node (group rank 0: ranks 0-1) and the other (``--local-addr``, ranks 2-3), both running."""
    endpoint, other = fresh_loopback(), fresh_loopback()
    args = ("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{endpoint}:29400", "--rdzv-id", "hang",
            "--nproc-per-node", "2", *extra)
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "stall-secret"}
    host = launch(*args, "--rdzv-conf", "is_host=1", payload("stall.py"), env=dict(env))
    node = launch(*args, "--rdzv-conf", "is_host=0", "--local-addr", other, payload("stall.py"), env=dict(env))
    host.wait_for(r"READY rank [01]", count=2, timeout=60)
    node.wait_for(r"READY rank [23]", count=2, timeout=60)
    return host, node, other


def _report(run, line: str) -> str:
    lines = run.err[run.err.index(line):]
    end = next((i for i, text in enumerate(lines[1:], 1) if not text.startswith("  ")), len(lines))
    return "\n".join(lines[:end])


def _stop(*runs) -> None:
    for run in runs:
        run.proc.send_signal(signal.SIGTERM)
    for run in runs:
        run.finish()


def test_every_agent_prints_one_report_of_both_nodes_naming_the_stuck_rank(launch):
    host, node, other = _nodes(launch, "--hang-timeout", "2")
    for run in (host, node):
        (line,) = run.wait_for(STALLED, timeout=60)
        run.wait_for(r"in wait_for_peers$")  # the report's last line (the largest group's): all of it has been read
        assert line.endswith("; 2 distinct stacks across 4 ranks on 2 nodes")
        text = _report(run, line)
        stuck = re.search(rf"^  rank 3 on \S+/{re.escape(other)} \(1 rank; state S.*\n(    .*\n)*?.*stall\.py:\d+ in "
                          r"stuck_loading_data$", text, re.M)
        assert stuck, text
        assert re.search(r"^  ranks 0-2 on \S+, \S+ \(3 ranks;", text, re.M) and text.index("  rank 3 on ") < text.index("  ranks 0-2")
    assert host.proc.poll() is None and node.proc.poll() is None  # report only: the job goes on
    _stop(host, node)
    for run in (host, node):
        assert sum(1 for line in run.err if re.search(STALLED, line)) == 1  # one report per agent, not one per node


def test_stacks_from_one_node_is_the_whole_job_and_names_a_node_whose_agent_is_stuck(launch):
    host, node, other = _nodes(launch)
    asked = run_cli("--stacks", str(node.proc.pid))  # from the node that does not host the store
    assert asked.returncode == 0, asked.stderr
    assert re.match(r"rankrun: job hang stacks on request: 2 distinct stacks across 4 ranks on 2 nodes$", asked.stdout.splitlines()[0])
    assert re.search(rf"^  rank 3 on \S+/{re.escape(other)} ", asked.stdout, re.M)
    node.proc.send_signal(signal.SIGSTOP)  # its agent stuck: its workers run on, but nobody answers for them
    try:
        stuck = run_cli("--stacks", str(host.proc.pid))
    finally:
        node.proc.send_signal(signal.SIGCONT)
    assert stuck.returncode == 0, stuck.stderr
    lines = stuck.stdout.splitlines()
    assert lines[0].endswith("1 distinct stack across 2 ranks"), stuck.stdout  # only the host's own ranks answered
    assert lines[-1] == f"  node 1 ({other}; ranks 2-3): no answer — its agent is stuck or gone"
    _stop(host, node)
