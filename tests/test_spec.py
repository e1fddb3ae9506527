"""Pure parsers and backend resolution (no processes)."""

from __future__ import annotations

import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankrun.cli import spec_from_args
from rankrun.errors import NotSupportedYetError, UsageError
from rankrun.spec import (
    EntryKind,
    Stream,
    parse_endpoint,
    parse_filters,
    parse_nnodes,
    parse_nproc,
    parse_rdzv_conf,
    parse_signals,
    parse_std_map,
    uuid4_from,
)


@pytest.mark.parametrize(("text", "expected"), [("1", (1, 1)), ("2:4", (2, 4)), ("3:3", (3, 3))])
def test_nnodes(text, expected):
    assert parse_nnodes(text) == expected


@given(st.integers(1, 1000), st.integers(0, 1000))
def test_nnodes_accepts_every_valid_range(lo, extra):
    assert parse_nnodes(f"{lo}:{lo + extra}") == (lo, lo + extra)


@pytest.mark.parametrize("text", ["0", "3:1", "a:b", "1:2:3", "", "-1:2"])
def test_nnodes_rejects(text):
    with pytest.raises(UsageError):
        parse_nnodes(text)


@pytest.mark.parametrize(
    ("text", "gpus", "expected"),
    [("4", None, 4), ("cpu", None, 7), ("auto", 0, 7), ("auto", 2, 2), ("gpu", 3, 3)],
)
def test_nproc(text, gpus, expected):
    assert parse_nproc(text, cpu_count=7, gpu_count=gpus) == expected


@pytest.mark.parametrize(("text", "gpus"), [("0", None), ("-2", None), ("xpu", None), ("cuda", 1), ("gpu", 0), ("gpu", None)])
def test_nproc_rejects(text, gpus):
    with pytest.raises(UsageError):
        parse_nproc(text, cpu_count=2, gpu_count=gpus)


def test_std_map():
    assert parse_std_map("-r", "3", 2) == (Stream.BOTH, Stream.BOTH)
    assert parse_std_map("-t", "0:3,2:1", 3) == (Stream.BOTH, Stream.NONE, Stream.STDOUT)
    for bad in ("4", "0:4", "0:1,", "x"):
        with pytest.raises(UsageError):
            parse_std_map("-t", bad, 2)


@given(st.binary(min_size=16, max_size=16))
def test_uuid4_from_matches_the_uuid_module(raw):
    import uuid  # noqa: PLC0415

    assert uuid4_from(raw) == str(uuid.UUID(bytes=raw, version=4))


def test_rdzv_conf_and_endpoint_and_filters():
    assert parse_rdzv_conf(" a = 1 , b=x ") == (("a", "1"), ("b", "x"))
    assert parse_endpoint("node1", 29400) == ("node1", 29400)
    assert parse_endpoint("node1:0", 29400) == ("node1", 0)
    assert parse_endpoint("[::1]:5", 29400) == ("::1", 5)
    assert parse_filters("a,,b,c") == ("a,b", "c")
    assert parse_signals("SIGTERM, SIGUSR1,SIGTERM") == (signal.SIGTERM, signal.SIGUSR1)
    with pytest.raises(UsageError):
        parse_signals("SIGKILL")


def _spec(tmp_path, *argv, env=None):
    (tmp_path / "t.py").write_text("")
    return spec_from_args([*argv, str(tmp_path / "t.py"), "--nproc-per-node", "9"], env or {})


def test_script_args_are_passed_verbatim(tmp_path):
    spec = _spec(tmp_path, "--nproc_per_node", "2")
    assert spec.worker.nproc == 2
    assert spec.worker.entry.args == ("--nproc-per-node", "9")
    assert spec.worker.entry.kind is EntryKind.SCRIPT


def test_implicit_standalone_static_and_c10d(tmp_path):
    implicit = _spec(tmp_path)
    assert implicit.rendezvous.standalone and implicit.store.port == 0 and implicit.rendezvous.run_id != "none"
    static = _spec(tmp_path, "--master-port", "29601")
    assert not static.rendezvous.standalone and static.rendezvous.run_id == "none"
    assert (static.store.host, static.store.port) == ("127.0.0.1", 29601)
    c10d = _spec(tmp_path, "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", "job1")
    assert (c10d.rendezvous.endpoint_host, c10d.rendezvous.run_id, c10d.store.port) == ("localhost", "job1", 0)
    empty_id = _spec(tmp_path, "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", "")
    assert empty_id.rendezvous.run_id.isdigit()


def test_pet_environment_defaults_and_cli_wins(tmp_path):
    env = {"PET_NPROC_PER_NODE": "3", "PET_MAX_RESTARTS": "2", "PET_STANDALONE": "1", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7"}
    spec = _spec(tmp_path, env=env)
    assert (spec.worker.nproc, spec.restart.max_restarts, spec.restart.shutdown_timeout) == (3, 2, 7.0)
    assert spec.rendezvous.standalone
    assert _spec(tmp_path, "--nproc-per-node", "1", env=env).worker.nproc == 1


def test_unique_prefixes_like_torchrun(tmp_path):
    assert _spec(tmp_path, "--max-r", "2").restart.max_restarts == 2
    with pytest.raises(UsageError, match="ambiguous"):
        _spec(tmp_path, "--nproc", "2")


def test_not_supported_yet(tmp_path):
    with pytest.raises(NotSupportedYetError):
        _spec(tmp_path, "--nnodes", "1:2")
    with pytest.raises(NotSupportedYetError):
        _spec(tmp_path, "--numa-binding", "node")
