"""Malformed invocations: one line on stderr naming flag and value, exit 2, no traceback, nothing left running."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PY, RANKRUN, clean_environ

pytestmark = pytest.mark.usefixtures("private_tmpdir")

CASES: list[tuple[list[str], str]] = [
    (["missing.py"], "training script 'missing.py': no such file"),
    ([], "missing training script (usage: rankrun [options] SCRIPT [ARGS...])"),
    (["--nproc-per-node", "0", "ok.py"], "--nproc-per-node '0': must be at least 1"),
    (["--nproc-per-node", "-1", "ok.py"], "--nproc-per-node '-1': must be at least 1"),
    (["--nproc-per-node", "abc", "ok.py"], "--nproc-per-node 'abc': expected a positive integer, 'cpu', 'gpu' or 'auto'"),
    (["--hang-timeout", "-1", "ok.py"], "--hang-timeout '-1': must be 0 (off) or more"),
    (["--hang-timeout", "soon", "ok.py"], "--hang-timeout 'soon': expected seconds (a number; 0: off)"),
    (["--hang-action", "kill", "ok.py"], "--hang-action 'kill': expected report or fail"),
    (["--straggler-window", "-1", "ok.py"], "--straggler-window '-1': must be 0 (off) or more"),
    (["--straggler-action", "kill", "ok.py"], "--straggler-action 'kill': expected report or exclude"),
    (["--nnodes", "3:1", "ok.py"], "--nnodes '3:1': need 0 < MIN <= MAX"),
    (["--nnodes", "a:b", "ok.py"], "--nnodes 'a:b': expected N or \"MIN:MAX\" with integers"),
    (["--nnodes", "1:2:3", "ok.py"], "--nnodes '1:2:3': expected N or \"MIN:MAX\""),
    (["-r", "7", "ok.py"], "--redirects '7': expected 0-3 or a map like 0:3,1:1"),
    (["-t", "0:9", "ok.py"], "--tee '0:9': expected 0-3 or a map like 0:3,1:1"),
    (["-r", "5:1", "ok.py"], "--redirects '5:1': local rank 5 does not exist with 1 process(es) per node"),
    (["-m", "--no-python", "ok"], "-m/--module 'ok': cannot be combined with --no-python"),
    (["--rdzv-backend", "zookeeper", "ok.py"], "--rdzv-backend 'zookeeper': unknown rendezvous backend (known: static, c10d, etcd, etcd-v2)"),
    (["--max-restarts", "-1", "ok.py"], "--max-restarts -1: must be 0 or more"),
    (["--max-restarts", "x", "ok.py"], "argument --max-restarts/--max_restarts: invalid int value: 'x'"),
    (["--max-node-failures", "-1", "ok.py"], "--max-node-failures '-1': must be 0 or more"),
    (["--max-node-failures", "x", "ok.py"], "--max-node-failures 'x': expected a whole number (0: never exclude a node)"),
    (["--monitor-interval", "0", "ok.py"], "--monitor-interval 0.0: must be greater than 0"),
    (["--rdzv-conf", "timeout", "ok.py"], "--rdzv-conf 'timeout': 'timeout' is not key=value"),
    (["--logs-specs", "my_plugin", "ok.py"],
     "--logs-specs 'my_plugin': LogsSpecs plugins other than torchrun's default are not supported; use --log-dir/-r/-t"),
    (["--log-dir", "file.txt", "ok.py"], "--log-dir 'file.txt': exists and is not a directory"),
    (["--master-port", "70000", "ok.py"], "--master-port 70000: must be from 0 to 65535"),
    (["--shutdown-timeout", "-3", "ok.py"], "--shutdown-timeout -3: must be 0 or more"),
    (["--local-ranks-filter", "a", "ok.py"], "--local-ranks-filter 'a': expected a comma-separated list of integers"),
    (["--local-ranks-filter", "0,-1", "ok.py"], "--local-ranks-filter '0,-1': local ranks are 0 or more"),
    (["--signals-to-handle", "SIGFOO", "ok.py"], "--signals-to-handle 'SIGFOO': unknown signal 'SIGFOO'"),
    (["--start-method", "x", "ok.py"],
     "argument --start-method/--start_method: invalid choice: 'x' (choose from 'spawn', 'fork', 'forkserver')"),
    (["--no-python", "no-such-binary-here"], "--no-python program 'no-such-binary-here': not found on PATH or not executable"),
    (["--rdzv-backend", "c10d", "--rdzv-endpoint", ":5", "ok.py"], "--rdzv-endpoint ':5': missing host"),
    (["--rdzv-endpoint", "h", "ok.py"], "--rdzv-endpoint 'h': the static backend needs HOST:PORT"),
    (["--rdzv-backend", "c10d", "--rdzv-endpoint", "h:99999", "ok.py"],
     "--rdzv-endpoint 'h:99999': port must be a number from 0 to 65535"),
    (["--rdzv-conf", "secret=hunter2", "ok.py"],
     "--rdzv-conf 'secret=<hidden>': never put a secret on the command line: use secret_file=PATH or RANKRUN_RDZV_SECRET"),
    (["--rdzv-conf", "join_timeout=soon", "ok.py"], "--rdzv-conf 'join_timeout=soon': expected a number"),
    (["--rdzv-conf", "is_host=maybe", "ok.py"], "--rdzv-conf 'is_host=maybe': expected 1/0, true/false, yes/no"),
    (["--node-rank", "2", "ok.py"], "--node-rank 2: must be from 0 to 0 with --nnodes 1:1"),
    (["--nnodes", "1:2", "ok.py"], "--nnodes '1:2': the static backend needs a fixed number of nodes (use --rdzv-backend c10d)"),
    (["--standalone", "--nnodes", "2", "ok.py"], "--nnodes '2': --standalone runs one node; use --rdzv-backend c10d for several"),
    (["--rdzv-conf", "secret_file=/nonexistent/secret", "ok.py"],
     "--rdzv-conf secret_file '/nonexistent/secret': cannot read it: No such file or directory"),
    (["--rdzv-backend", "etcd", "--rdzv-endpoint", "ftp://h:1", "ok.py"],
     "--rdzv-endpoint 'ftp://h:1': the scheme must be http:// or https://"),
    (["--rdzv-backend", "etcd", "--rdzv-endpoint", "a:2379,b:99999", "ok.py"],
     "--rdzv-endpoint 'b:99999': port must be a number from 1 to 65535"),
    (["--rdzv-backend", "etcd", "--rdzv-conf", "ca_cert=/nonexistent/ca.pem", "ok.py"],
     "--rdzv-conf ca_cert '/nonexistent/ca.pem': cannot read it"),
    (["--rdzv-backend", "etcd", "--rdzv-conf", "password_file=/etc/hostname", "ok.py"],
     "--rdzv-conf password_file '/etc/hostname': needs user= too"),
    (["--nproc-per-node", "gpu", "ok.py"],
     "--nproc-per-node 'gpu': no NVIDIA GPU found (CUDA_VISIBLE_DEVICES, /proc/driver/nvidia, nvidia-smi)"),
    # a mistyped option: named, with the closest real one (the "2" after it was taken for the script)
    (["--nprocs-per-node", "2", "ok.py"], "unknown option --nprocs-per-node (did you mean --nproc-per-node?)"),
    (["--nprocs_per_node=2", "ok.py"], "unknown option --nprocs_per_node (did you mean --nproc_per_node?)"),
    (["--hlep"], "unknown option --hlep (did you mean --help?)"),  # no script either: the typo is the news
    (["--bogus", "ok.py"], "unknown option --bogus (--help lists the options)"),
    (["--preload", "x", "--no-python", "true"],
     "--preload 'x': needs a Python worker: --no-python runs a program, which cannot be forked from a Python process"),
    (["--preload", "a..b", "ok.py"], "--preload 'a..b': 'a..b' is not a module name"),
    (["--preload", ",", "ok.py"], "--preload ',': an empty module name"),
    (["--checkpoint-dir", "file.txt", "ok.py"], "--checkpoint-dir 'file.txt': exists and is not a directory"),
    (["--checkpoint-dir", "file.txt/sub", "ok.py"], "--checkpoint-dir 'file.txt/sub': cannot create it: Not a directory"),
    # root too: os.access says yes to root, the probe file it then cannot create says no
    (["--checkpoint-dir", "/sys", "ok.py"], "--checkpoint-dir '/sys': not writable: Permission denied"),
]


def _session_members(sid: int) -> list[int]:
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_bytes()
            except OSError:
                continue
            if int(stat[stat.rfind(b")") + 2 :].split()[3]) == sid:
                members.append(int(entry.name))
    return members


LEGACY = (PY, "-m", "rankrun.launch")


def _legacy(args: list[str], message: str) -> tuple[list[str], str]:
    """A case as ``python -m rankrun.launch`` gets it: ``--use-env`` where a program needs it, its own usage line."""
    args = ["--use-env", *args] if "--no-python" in args else args
    return args, message.replace("usage: rankrun [options]", "usage: python -m rankrun.launch [options]")


# python -m rankrun.launch's own: every case above, and these (its deprecation note comes only once a worker starts)
LEGACY_CASES: list[tuple[list[str], str]] = [
    *(_legacy(args, message) for args, message in CASES),
    (["--use-env=maybe", "ok.py"], "--use-env 'maybe': expected 1/0, true/false or yes/no (or the flag alone)"),
    (["--use_env=", "ok.py"], "--use_env '': expected 1/0, true/false or yes/no (or the flag alone)"),
    (["--no-python", "true"], "--no-python 'true': needs --use-env with python -m rankrun.launch: a program gets "
                              "LOCAL_RANK in its environment, not --local-rank=N"),
    (["--use-env"], "missing training script (usage: python -m rankrun.launch [options] SCRIPT [ARGS...])"),
    (["--nproc-per-node"], "argument --nproc-per-node/--nproc_per_node: expected one argument"),
    (["--use-env", "--max-restart=1", "--rdzv-endpont", "h:1", "ok.py"],
     "unknown option --rdzv-endpont (did you mean --rdzv-endpoint?)"),
    (["--stacks", "1", "ok.py"], "--stacks '1': comes alone, first: rankrun --stacks [PID]"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(a) or "<none>" for a, _ in CASES])
def test_bad_input_gets_one_clear_line(tmp_path, args, message):
    _one_line_exit_2(tmp_path, RANKRUN, args, message)


@pytest.mark.parametrize(("args", "message"), LEGACY_CASES, ids=[" ".join(a) or "<none>" for a, _ in LEGACY_CASES])
def test_bad_input_to_python_m_rankrun_launch_gets_one_clear_line_too(tmp_path, args, message):
    _one_line_exit_2(tmp_path, LEGACY, args, message)


def _one_line_exit_2(tmp_path: Path, command: tuple[str, ...], args: list[str], message: str,
                     environ: dict[str, str] | None = None) -> None:
    (tmp_path / "ok.py").write_text("print('should not run')\n")
    (tmp_path / "file.txt").write_text("")
    env = clean_environ() | {"CUDA_VISIBLE_DEVICES": ""} if "gpu" in args else clean_environ()
    env |= environ or {}
    started = time.monotonic()
    proc = subprocess.Popen([*command, *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    out, err = proc.communicate(timeout=30)
    elapsed = time.monotonic() - started
    assert proc.returncode == 2
    assert out == ""
    assert err == f"rankrun: error: {message}\n"
    assert "Traceback" not in err
    assert _session_members(proc.pid) == []  # nothing it started is still running
    # The budget is 1 s and a typical run takes ~0.1 s; this bound only catches hangs, so that a
    # loaded CI machine cannot make it flaky (speed is measured in bench/, not asserted here).
    assert elapsed < 10.0, f"took {elapsed:.2f}s"


@pytest.mark.parametrize("command", [RANKRUN, LEGACY], ids=["rankrun", "rankrun.launch"])
def test_pet_environment_values_are_validated_like_flags(tmp_path, command):
    (tmp_path / "ok.py").write_text("")
    env = clean_environ() | {"PET_NPROC_PER_NODE": "zero"}
    res = subprocess.run([*command, "ok.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 2
    assert res.stderr == "rankrun: error: --nproc-per-node 'zero': expected a positive integer, 'cpu', 'gpu' or 'auto'\n"
    env = clean_environ() | {"PET_STANDALONE": "true"}
    res = subprocess.run([*command, "ok.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 2
    assert res.stderr == "rankrun: error: PET_STANDALONE 'true': expected 0 or 1\n"


# values that come from the environment (PET_*) as torchrun reads them: said as the flag's, as a flag's would be
ENV_CASES: list[tuple[dict[str, str], list[str], str]] = [
    ({"PET_PRELOAD": "a..b"}, ["ok.py"], "--preload 'a..b': 'a..b' is not a module name"),
    ({"PET_PRELOAD": "torch"}, ["--no-python", "true"],
     "--preload 'torch': needs a Python worker: --no-python runs a program, which cannot be forked from a Python process"),
    ({"PET_CHECKPOINT_DIR": "/sys"}, ["ok.py"], "--checkpoint-dir '/sys': not writable: Permission denied"),
]


@pytest.mark.parametrize(("environ", "args", "message"), ENV_CASES,
                         ids=[" ".join([*(f"{k}={v}" for k, v in e.items()), *a]) for e, a, _ in ENV_CASES])
@pytest.mark.parametrize("command", [RANKRUN, LEGACY], ids=["rankrun", "rankrun.launch"])
def test_bad_input_from_the_environment_gets_one_clear_line(tmp_path, command, environ, args, message):
    if command is LEGACY:
        args, message = _legacy(args, message)
    _one_line_exit_2(tmp_path, command, args, message, environ)


@pytest.mark.parametrize("command", [RANKRUN, LEGACY], ids=["rankrun", "rankrun.launch"])
def test_store_port_in_use_is_a_launcher_error(tmp_path, command):
    import socket  # noqa: PLC0415

    (tmp_path / "ok.py").write_text("print('should not run')\n")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        res = subprocess.run([*command, "--master-port", str(port), "ok.py"], cwd=tmp_path, env=clean_environ(),
                             capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 3
    assert res.stderr.startswith(f"rankrun: error: cannot listen on 127.0.0.1:{port}:")
    assert res.stderr.count("\n") == 1
    assert "should not run" not in res.stdout
