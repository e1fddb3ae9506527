"""``--rdzv-backend etcd`` against real etcd servers (each test starts its own, on fresh loopback addresses).

Real agents, real gloo workers where the collective is the point (the worker store moving to a
new group rank 0), plain workers elsewhere. Leaders and agents are SIGKILLed by PID.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import clean_environ, fresh_loopback, payload, two_api_nodes
from etcdserver import Cluster, etcd_cluster, fresh_address
from rankrun.api.values import VALUE_LIMIT

pytestmark = [pytest.mark.usefixtures("private_tmpdir"),
              pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd is not installed (apt-get install etcd-server)")]

FAST = "last_call_timeout=0.3,keep_alive_interval=0.5,keep_alive_max_attempt=2"  # leases of 1 s: losses show fast


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Cluster]:
    with etcd_cluster(tmp_path, 1) as cluster:
        yield cluster


def _env(**extra: str) -> dict[str, str]:
    return clean_environ() | {"RANKRUN_RDZV_SECRET": "etcd-e2e"} | extra


def _args(cluster_endpoints: str, run_id: str, nnodes: str, conf: str = FAST) -> tuple[str, ...]:
    return ("--nnodes", nnodes, "--rdzv-backend", "etcd", "--rdzv-endpoint", cluster_endpoints, "--rdzv-id", run_id,
            "--rdzv-conf", conf)


def _until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Bounded wait for a state only the store shows (no line announces it)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.02)


def _nodes(cluster: Cluster, run_id: str) -> int:
    try:
        return sum(k["key"].startswith(f"/rankrun/{run_id}/nodes/") for k in cluster.keys(f"/rankrun/{run_id}/"))  # type: ignore[union-attr]
    except OSError:
        return -1


@pytest.mark.parametrize("nodes", [2, 3])
def test_agents_all_reduce_over_one_etcd_and_leave_only_the_closed_marker(launch, etcd, nodes):
    pytest.importorskip("torch")
    args = _args(etcd.endpoints, f"gloo{nodes}", str(nodes))
    runs = [launch(*args, "--nproc-per-node", "1", payload("gloo_job.py"), env=_env()) for _ in range(nodes)]
    assert [r.finish() for r in runs] == [0] * nodes, [r.err for r in runs]
    total = nodes * (nodes + 1) // 2
    sums = sorted(re.sub(r"^\[default\d\]:", "", line) for r in runs for line in r.out if "sum" in line)
    assert sums == [f"rank {r} restart 0 sum {total}" for r in range(nodes)]
    left = etcd.keys(f"/rankrun/gloo{nodes}/")
    assert [k["key"] for k in left] == [f"/rankrun/gloo{nodes}/closed"]  # the rest was removed at the end
    assert left[0]["lease"] != 0  # and the marker expires with the job lease


def test_keys_live_under_etcd_prefix_and_a_late_joiner_is_refused(launch, etcd):
    args = (*_args(etcd.endpoints, "pfx", "1", f"{FAST},etcd_prefix=/teams/a/"), "--no-python", "true")
    assert launch(*args, env=_env()).finish() == 0
    assert [k["key"] for k in etcd.keys("/teams/a/")] == ["/teams/a/pfx/closed"]
    late = launch(*args, env=_env())
    assert late.finish() == 3
    assert any("already finished" in line for line in late.err), late.err


def test_agents_all_sigkilled_leave_only_keys_that_expire(launch, etcd, tmp_path):
    args = (*_args(etcd.endpoints, "doomed", "2"), "--nproc-per-node", "1", payload("node_worker.py"))
    env = _env(TEST_OUT_DIR=str(tmp_path), NODE_WAIT_FILE=str(tmp_path / "never"))
    runs = [launch(*args, env=env) for _ in range(2)]
    for run in runs:
        run.wait_for(r"READY rank \d world 2")
    for run in runs:
        run.proc.kill()
        run.finish()
    keys = etcd.keys("/rankrun/doomed/")
    assert keys and all(k["lease"] != 0 for k in keys), keys  # nothing without a lease: nothing stays forever
    _until(lambda: etcd.keys("/rankrun/doomed/") == [], "the leases expired and took every key", timeout=20)


def test_an_agent_killed_its_lease_expires_and_the_survivors_reform(launch, etcd, tmp_path):
    pytest.importorskip("torch")
    finish = tmp_path / "finish"
    # a peer's worker may see the dead gloo connection before etcd expires the lease: that counts as a failure
    args = (*_args(etcd.endpoints, "lose1", "2:3"), "--max-restarts", "3", "--nproc-per-node", "1", payload("gloo_loop.py"))
    runs = [launch(*args, env=_env(FINISH_FILE=str(finish))) for _ in range(3)]
    ready = {run: run.wait_for(r"READY rank \d world 3")[0] for run in runs}
    doomed = next(run for run, line in ready.items() if "rank 0 " not in line)  # not the worker store's node
    doomed.proc.kill()
    doomed.finish()
    survivors = [run for run in runs if run is not doomed]
    for run in survivors:
        run.wait_for(r"READY rank \d world 2 restart \d")  # re-formed without it
    finish.touch()
    assert [run.finish() for run in survivors] == [0, 0], [run.err for run in survivors]


def test_the_group_rank_0_agent_killed_the_survivors_get_a_new_worker_store_and_finish(launch, etcd, tmp_path):
    pytest.importorskip("torch")
    finish = tmp_path / "finish"
    args = (*_args(etcd.endpoints, "lose0", "2:3"), "--max-restarts", "3", "--nproc-per-node", "1", payload("gloo_loop.py"))
    runs = [launch(*args, env=_env(FINISH_FILE=str(finish))) for _ in range(3)]
    ready = {run: run.wait_for(r"READY rank \d world 3")[0] for run in runs}
    rank0 = next(run for run, line in ready.items() if "rank 0 " in line)  # it hosts the worker store and coordinates
    rank0.proc.kill()
    rank0.finish()
    survivors = [run for run in runs if run is not rank0]
    lines = [run.wait_for(r"READY rank \d world 2 restart \d")[0] for run in survivors]
    assert sorted(re.sub(r"^\[default\d\]:", "", line)[:12] for line in lines) == ["READY rank 0", "READY rank 1"]
    finish.touch()
    assert [run.finish() for run in survivors] == [0, 0], [run.err for run in survivors]


def test_a_three_member_cluster_loses_its_leader_during_the_rendezvous_and_while_workers_run(launch, tmp_path):
    pytest.importorskip("torch")
    finish = tmp_path / "finish"
    with etcd_cluster(tmp_path, 3) as cluster:
        args = (*_args(cluster.endpoints, "ha", "2", "keep_alive_interval=0.5,keep_alive_max_attempt=6"),
                "--nproc-per-node", "1", payload("gloo_loop.py"))
        first = launch(*args, env=_env(FINISH_FILE=str(finish)))
        _until(lambda: _nodes(cluster, "ha") == 1, "the first agent joined")
        leader = cluster.leader()
        cluster.kill(leader)  # during the rendezvous: one node waits, the other is not there yet
        second = launch(*args, env=_env(FINISH_FILE=str(finish)))
        for run in (first, second):
            run.wait_for(r"READY rank \d world 2 restart 0")
        cluster.start(leader, state="existing")  # back to three, so that losing one more keeps a quorum
        cluster.wait_healthy([leader])
        cluster.kill(cluster.leader())  # while the workers run
        finish.touch()  # the job ends through the new leader: the round key says so
        assert [first.finish(), second.finish()] == [0, 0], (first.err, second.err)
        assert not any("READY" in line and "restart 1" in line for run in (first, second) for line in run.out)
        assert [k["key"] for k in cluster.keys("/rankrun/ha/")] == ["/rankrun/ha/closed"]


def test_an_unreachable_etcd_is_one_line_and_exit_3(launch):
    nowhere = f"{fresh_address()}:2379,{fresh_address()}:2379"
    run = launch(*_args(nowhere, "none", "2"), "--no-python", "true", env=_env())
    assert run.finish() == 3
    assert len(run.err) == 1 and run.err[0].startswith("rankrun: error: rendezvous: cannot use etcd"), run.err
    assert nowhere.split(",", maxsplit=1)[0].split(":", maxsplit=1)[0] in run.err[0] and "refused" in run.err[0]


def test_etcd_v2_is_an_alias_with_a_note(launch, etcd):
    run = launch("--rdzv-backend", "etcd-v2", "--rdzv-endpoint", etcd.endpoints, "--rdzv-id", "v2", "--rdzv-conf", FAST,
                 "--no-python", "true", env=_env())
    assert run.finish() == 0, run.err
    assert any("v3 API" in line for line in run.err), run.err
    assert any("etcd without a user or client certificate" in line for line in run.err), run.err  # told once


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_certs(where: Path, address: str) -> tuple[Path, Path, Path, Path, Path]:
    """A throw-away CA, a server certificate for ``address`` and a client certificate, all signed by it."""
    (where / "san.cnf").write_text(f"subjectAltName=IP:{address}\n")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=rankrun-test-ca", cwd=where)
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=where)
        extra = ["-extfile", "san.cnf"] if name == "server" else []
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "1", *extra, cwd=where)
    return (where / "ca.pem", where / "server.pem", where / "server.key", where / "client.pem", where / "client.key")


def test_tls_with_a_self_signed_ca_and_client_certificates(launch, tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl binary is needed to make a CA")
    certs = tmp_path / "certs"
    certs.mkdir()
    address = fresh_address()
    ca, cert, key, client_cert, client_key = _make_certs(certs, address)
    extra = ("--client-cert-auth", "--trusted-ca-file", str(ca))
    with etcd_cluster(tmp_path, 1, tls=(ca, cert, key), extra=extra, addresses=[address]) as cluster:
        conf = f"{FAST},ca_cert={ca},ssl_cert={client_cert},ssl_cert_key={client_key}"
        bare = cluster.members[0].endpoint  # host:port, with protocol=https instead of the scheme
        runs = [launch(*_args(cluster.endpoints, "tls", "2", conf), "--no-python", "true", env=_env()),
                launch(*_args(bare, "tls", "2", f"{conf},protocol=https"), "--no-python", "true", env=_env())]
        assert [r.finish() for r in runs] == [0, 0], [r.err for r in runs]
        assert not any("without a user" in line for r in runs for line in r.err)  # a client certificate guards it
        # without the client certificate etcd refuses the handshake: one line, exit 3
        anonymous = launch(*_args(cluster.endpoints, "tls2", "2", f"{FAST},ca_cert={ca}"), "--no-python", "true", env=_env())
        assert anonymous.finish() == 3
        assert len(anonymous.err) == 1 and "cannot use etcd" in anonymous.err[0], anonymous.err


def test_etcd_user_and_password(launch, etcd, tmp_path):
    ctl = shutil.which("etcdctl")
    if ctl is None:
        pytest.skip("etcdctl (Debian's etcd-client) is needed to enable authentication")
    member = etcd.members[0].endpoint

    def etcdctl(*args: str) -> None:
        subprocess.run([ctl, "--endpoints", member, *args], check=True, capture_output=True, timeout=30,
                       env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"})

    etcdctl("user", "add", "root:rootpw")
    etcdctl("role", "add", "rankrun")
    etcdctl("role", "grant-permission", "--prefix=true", "rankrun", "readwrite", "/rankrun/")
    etcdctl("user", "add", "job:jobpw")
    etcdctl("user", "grant-role", "job", "rankrun")
    etcdctl("auth", "enable")
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("jobpw\n")
    bad.write_text("nope\n")
    runs = [launch(*_args(etcd.endpoints, "auth", "2", f"{FAST},user=job,password_file={good}"), "--no-python", "true",
                   env=_env()) for _ in range(2)]
    assert [r.finish() for r in runs] == [0, 0], [r.err for r in runs]
    wrong = launch(*_args(etcd.endpoints, "auth2", "2", f"{FAST},user=job,password_file={bad}"), "--no-python", "true",
                   env=_env())
    assert wrong.finish() == 3
    assert len(wrong.err) == 1 and "authentication failed" in wrong.err[0], wrong.err
    anonymous = launch(*_args(etcd.endpoints, "auth3", "2"), "--no-python", "true", env=_env())
    assert anonymous.finish() == 3
    assert len(anonymous.err) == 1 and "user" in anonymous.err[0], anonymous.err


def test_an_etcd_outage_is_waited_out_and_said(launch, etcd, tmp_path):
    """The only member is SIGKILLed while workers run and started again on its data: the agents wait, say so, go on."""
    finish = tmp_path / "finish"
    args = (*_args(etcd.endpoints, "outage", "2", "keep_alive_interval=0.3,keep_alive_max_attempt=10"),
            "--nproc-per-node", "1", payload("node_worker.py"))
    env = _env(TEST_OUT_DIR=str(tmp_path), NODE_WAIT_FILE=str(finish))
    runs = [launch(*args, env=env) for _ in range(2)]
    for run in runs:
        run.wait_for(r"READY rank \d world 2")
    member = etcd.members[0]
    etcd.kill(member)
    for run in runs:  # a keep-alive finds no member: after a second each agent says why it waits
        run.wait_for(r"etcd unavailable for \d+ s \(http://.*refused\)", timeout=30)
    etcd.start(member)
    etcd.wait_healthy()
    finish.touch()
    assert [run.finish() for run in runs] == [0, 0], [run.err for run in runs]
    assert not any("restart 1" in line for run in runs for line in run.out)  # the workers never stopped


@pytest.mark.parametrize("freeze", ["coordinator", "other"])
def test_a_frozen_agent_loses_its_lease_the_other_reforms_and_it_exits_clearly(launch, etcd, tmp_path, freeze):
    """SIGSTOP keeps sockets open: only the lease tells. A frozen coordinator is deposed: the other takes over."""
    finish = tmp_path / "finish"
    args = (*_args(etcd.endpoints, "frozen", "1:2", "last_call_timeout=0.2,keep_alive_interval=0.5,keep_alive_max_attempt=2"),
            "--nproc-per-node", "1", payload("node_worker.py"))
    env = _env(TEST_OUT_DIR=str(tmp_path), NODE_WAIT_FILE=str(finish))
    first = launch(*args, env=env)
    first.wait_for(r"READY rank 0 world 1")  # alone: it won the election
    second = launch(*args, env=env)
    second.wait_for(r"READY rank 1 world 2")
    first.wait_for(r"READY rank 0 world 2")
    frozen, survivor = (first, second) if freeze == "coordinator" else (second, first)
    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        survivor.wait_for(r"READY rank 0 world 1 restart 0")  # its lease expired in etcd: re-formed without it
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    assert frozen.finish() == 3
    assert "its etcd lease expired" in frozen.err[-1], frozen.err
    finish.touch()
    assert survivor.finish() == 0, survivor.err


def test_master_addr_is_this_nodes_side_of_its_etcd_connection_not_etcds(launch, etcd, tmp_path):
    """Group rank 0 serves the worker store on its own address (its side of the etcd connection): the etcd member's
    address is another host's, where no worker store listens."""
    args = (*_args(etcd.endpoints, "addr", "1"), "--nproc-per-node", "1", payload("node_worker.py"))
    run = launch(*args, env=_env(TEST_OUT_DIR=str(tmp_path)))
    assert run.finish() == 0, run.err
    (start,) = [json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")]
    etcd_host = etcd.endpoints.split(",")[0].split("//")[-1].split(":")[0]
    assert etcd_host != "127.0.0.1"  # a fresh loopback address: the kernel connects to it from 127.0.0.1
    assert start["MASTER_ADDR"] == "127.0.0.1"


def test_a_stall_is_reported_by_every_agent_with_the_ranks_of_both_nodes(launch, etcd):
    """The whole job's stack report goes through etcd as it goes through the embedded store."""
    args = (*_args(etcd.endpoints, "stall", "2", "last_call_timeout=0.3"), "--nproc-per-node", "2", "--hang-timeout", "2")
    addrs = [fresh_address(), fresh_address()]
    runs = [launch(*args, "--local-addr", addr, payload("stall.py"), env=_env()) for addr in addrs]
    for run in runs:
        run.wait_for(r"READY rank", count=2)
    stuck = next(i for i, run in enumerate(runs) if any("READY rank 3" in line for line in run.out))  # rank 3's node
    for run in runs:
        (line,) = run.wait_for(r"rankrun: job stall stalled: ", timeout=60)
        run.wait_for(r"in wait_for_peers$")  # the report's last line: all of it has been read
        assert line.endswith("; 2 distinct stacks across 4 ranks on 2 nodes"), run.err
        report = "\n".join(run.err[run.err.index(line):])
        assert re.search(rf"^  rank 3 on \S+/{re.escape(addrs[stuck])} \(1 rank;", report, re.M), report
        assert re.search(r"stall\.py:\d+ in stuck_loading_data", report)
    for run in runs:
        run.proc.send_signal(signal.SIGTERM)
    for run in runs:
        run.finish()


def test_two_python_callers_on_etcd_both_get_every_value_and_the_values_go_with_the_job(etcd, reaper, tmp_path):
    """``rankrun.launch`` on the etcd backend: the values travel on the job's lease (rank 3's, over the limit,
    spilled into the shared log_dir), and nothing of them stays in etcd once the job is over."""
    outs = two_api_nodes(tmp_path, reaper, "node", "etcd", etcd.endpoints, str(tmp_path / "logs"))
    for out in outs:
        assert "values [(0, 100), (1, 101), (2, 102), (3, 103)]" in out, out
        assert f"big {{3: {VALUE_LIMIT + 1}}}" in out, out
    assert [k["key"] for k in etcd.keys("/rankrun/api-nodes/")] == ["/rankrun/api-nodes/closed"]


def test_the_network_check_runs_over_etcd_and_its_keys_go_with_the_job(launch, etcd):
    """``--network-check`` on etcd (its keys are the rendezvous's): a round of 3 is checked, nobody is excluded, and
    no ``netcheck/`` key outlives the job."""
    addrs = [fresh_loopback() for _ in range(3)]
    runs = [launch(*_args(etcd.endpoints, "netcheck", "3"), "--local-addr", addr, "--network-check",
                   "--nproc-per-node", "1", "--no-python", "sh", "-c", 'echo "ran $RANK of $WORLD_SIZE"', env=_env())
            for addr in addrs]
    assert [r.finish() for r in runs] == [0, 0, 0], [r.err for r in runs]
    checked = [line for r in runs for line in r.err if "network check of" in line]
    assert len(checked) == 1 and re.fullmatch(r"rankrun: rendezvous round 1: network check of 3 nodes in [\d.]+ s: "
                                              r"nobody unhealthy", checked[0]), [r.err for r in runs]
    assert sorted(line for r in runs for line in r.out) == [f"ran {rank} of 3" for rank in range(3)]
    assert [k["key"] for k in etcd.keys("/rankrun/netcheck/")] == ["/rankrun/netcheck/closed"]


def test_a_node_whose_check_fails_does_not_stand_for_election_and_exits_4(launch, etcd, tmp_path):
    """Issue 34: the sick node, started first, had joined and won the election before saying it was unhealthy: it
    coordinated the job and held the workers' store, without workers, and exited 0 with it, so that a scheduler never
    learned to drain it. Its join says it is unhealthy now, and it does not campaign: a healthy node coordinates,
    excludes it, and it exits 4; the job runs on the other two."""
    args = (*_args(etcd.endpoints, "sickvote", "2:3"), "--nproc-per-node", "1")
    worker = ("--no-python", "sh", "-c", 'echo "ran $RANK of $WORLD_SIZE"')
    sick = launch(*args, "--local-addr", fresh_loopback(), "--health-check", "echo 'NIC down' >&2; exit 1", *worker,
                  env=_env())
    _until(lambda: _nodes(etcd, "sickvote") == 1, "the sick node joined")
    runs = [launch(*args, "--local-addr", fresh_loopback(), "--health-check", "true", *worker, env=_env()) for _ in range(2)]
    assert sick.finish(timeout=60) == 4, sick.err
    assert [r.finish(timeout=60) for r in runs] == [0, 0], [r.err for r in runs]
    assert sick.out == [] and sorted(line for r in runs for line in r.out) == ["ran 0 of 2", "ran 1 of 2"]
    said = [line for line in sick.err if "excluded from job sickvote" in line]
    assert said and "unhealthy: health check: NIC down" in said[0], sick.err
    assert not any("served it without workers" in line for line in sick.err), sick.err
