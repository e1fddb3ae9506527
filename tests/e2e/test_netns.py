"""Two "hosts" in network namespaces this test creates (and removes): binding and MASTER_ADDR on non-loopback
addresses, and gloo across hosts whose name resolves to 127.0.0.1 (the GLOO_SOCKET_IFNAME trap)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from conftest import PY, clean_environ, payload

pytestmark = pytest.mark.usefixtures("private_tmpdir")
pytest.importorskip("torch")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str, str]]:
    """(namespace a, namespace b, the /24 prefix): a at .1, b at .2 on one veth pair."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = os.urandom(3).hex()
    a, b, subnet = f"rr_a_{tag}", f"rr_b_{tag}", f"10.{200 + os.urandom(1)[0] % 50}.{os.urandom(1)[0]}"
    try:
        _ip("netns", "add", a)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a network namespace here: {exc.stderr.decode().strip()}")
    try:
        _ip("netns", "add", b)
        _ip("link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}")
        _ip("link", "set", f"va{tag}", "netns", a)
        _ip("link", "set", f"vb{tag}", "netns", b)
        for ns, dev, host in ((a, f"va{tag}", 1), (b, f"vb{tag}", 2)):
            _ip("-n", ns, "addr", "add", f"{subnet}.{host}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield a, b, subnet
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)


def test_two_namespaced_hosts_run_a_gloo_job(launch, tmp_path, two_hosts):
    a, b, subnet = two_hosts
    endpoint = f"{subnet}.1:29400"
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "netns-secret"}
    args = ("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "ns",
            "--nproc-per-node", "2", payload("gloo_job.py"))
    host = launch(*args, env=dict(env), cmd=("ip", "netns", "exec", a, PY, "-m", "rankrun"))
    other = launch(*args, env=dict(env), cmd=("ip", "netns", "exec", b, PY, "-m", "rankrun"))
    assert [host.finish(), other.finish()] == [0, 0], (host.err, other.err)
    assert sum("sum 10" in line for line in [*host.out, *other.out]) == 4  # the all_reduce crossed the hosts
    note = [line for line in other.err if "GLOO_SOCKET_IFNAME" in line]
    assert note == [f"rankrun: this host's name resolves to 127.0.0.1: the workers get "
                    f"GLOO_SOCKET_IFNAME=NCCL_SOCKET_IFNAME=vb{a[-6:]}, the interface of {subnet}.2"]


def test_master_addr_is_the_hosts_real_address(launch, tmp_path, two_hosts):
    a, b, subnet = two_hosts
    out = tmp_path / "out"
    out.mkdir()
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "netns-secret", "TEST_OUT_DIR": str(out)}
    args = ("--nnodes", "2", "--node-rank", "{r}", "--master-addr", f"{subnet}.1", "--master-port", "29500",
            "--nproc-per-node", "1", payload("node_worker.py"))
    runs = [launch(*[x.format(r=r) for x in args], env=dict(env), cmd=("ip", "netns", "exec", ns, PY, "-m", "rankrun"))
            for r, ns in ((1, b), (0, a))]
    assert [r.finish() for r in runs] == [0, 0], [r.err for r in runs]
    import json  # noqa: PLC0415

    starts = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert {(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in starts} == {(f"{subnet}.1", "29500")}
    assert sorted(s["RANK"] for s in starts) == ["0", "1"]
