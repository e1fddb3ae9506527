"""Pure parsers and backend resolution (no processes)."""

from __future__ import annotations

import os
import re
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankrun.cli import parse_args, spec_from_args
from rankrun.errors import NotSupportedYetError, UsageError
from rankrun.proc.early import requested_signals
from rankrun.spec import (
    API_DIR,
    CheckpointSpec,
    DynamicRendezvous,
    Endpoint,
    EntryKind,
    RendezvousConf,
    Standalone,
    StaticRendezvous,
    StragglerSpec,
    Stream,
    api_dir,
    parse_endpoint,
    parse_etcd_endpoints,
    parse_filters,
    parse_nnodes,
    parse_nproc,
    parse_rdzv_conf,
    parse_signals,
    parse_std_map,
    rendezvous_name,
    resolve_backend,
    unused_id_note,
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
    conf, unknown = parse_rdzv_conf(" join_timeout = 5 , is_host=no,keep_alive_max_attempt=4,cacert=/ca.pem ")
    assert (conf.join_timeout, conf.is_host, conf.keep_alive_max_attempt, str(conf.ca_cert)) == (5.0, False, 4, "/ca.pem")
    assert unknown == ()
    assert parse_rdzv_conf("") == (RendezvousConf(), ())  # torchrun's defaults
    # a caller without a shell keeps the quotes: one matching pair around the whole, or around a value, is dropped
    quoted, unknown = parse_rdzv_conf("'join_timeout=5,last_call_timeout=\"1\",jion=3'")
    assert (quoted.join_timeout, quoted.last_call_timeout, unknown) == (5.0, 1.0, ("jion",))  # unknown keys: ignored
    assert parse_rdzv_conf("\"join_timeout=7'") == (RendezvousConf(), ('"join_timeout',))  # quotes that do not match stay
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


@pytest.mark.parametrize("switch", ["--standalone", "--no-python", "--run-path", "--virtual-local-rank", "-m"])
def test_legacy_use_env_with_a_value_after_a_switch_leaves_the_script_in_place(tmp_path, switch):
    """``python -m rankrun.launch --standalone --use-env=True train.py``: a switch takes no value, so the scan for
    ``--use-env=VALUE`` must not swallow the next argument (which would make ``--use-env=True`` the script)."""
    script = str(tmp_path / "t.py")
    (tmp_path / "t.py").write_text("")
    ns = parse_args([switch, "--use-env=True", "--nproc-per-node", "2", script, "--use-env=0"], {}, legacy=True)
    assert (ns.use_env, ns.nproc_per_node, ns.training_script, ns.training_script_args) == (True, "2", script, ["--use-env=0"])
    off = parse_args([switch, "--use_env=false", script], {}, legacy=True)
    assert (off.use_env, off.training_script) == (False, script)


def test_implicit_standalone_static_and_c10d(tmp_path):
    implicit = _spec(tmp_path)
    assert isinstance(implicit.rendezvous, Standalone) and implicit.store.port == 0 and implicit.rendezvous.run_id != "none"
    static = _spec(tmp_path, "--master-port", "29601")
    assert isinstance(static.rendezvous, StaticRendezvous) and static.rendezvous.run_id == "none"
    assert (static.store.host, static.store.port) == ("127.0.0.1", 29601)
    c10d = _spec(tmp_path, "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", "job1")
    assert isinstance(c10d.rendezvous, DynamicRendezvous)
    assert (c10d.rendezvous.endpoint_host, c10d.rendezvous.run_id, c10d.store.port) == ("localhost", "job1", 0)
    empty_id = _spec(tmp_path, "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", "")
    assert empty_id.rendezvous.run_id.isdigit()


@pytest.mark.parametrize(("argv", "env", "note"), [
    (["--rdzv-id", "dcgmjob"], {}, "one node without --rdzv-endpoint or --master-port runs standalone, which gives"),
    (["--standalone", "--rdzv_id=dcgmjob"], {}, "--standalone gives"),
    ([], {"PET_RDZV_ID": "dcgmjob"}, "one node without"),
    (["--rdzv-id", ""], {}, None),  # empty: a fresh id asked for
    (["--rdzv-id", "none"], {}, None),  # torchrun's default spelled out
    (["--rdzv-id", "dcgmjob", "--master-port", "0"], {}, None),  # static: the id is the run's
    (["--rdzv-id", "dcgmjob", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"], {}, None),
])
def test_a_standalone_run_says_the_rdzv_id_it_does_not_use(tmp_path, capsys, argv, env, note):
    """torchrun drops --rdzv-id on a standalone run (a fresh uuid, silently); rankrun's workers get torchrun's id
    and one line names the id the user gave, the one the run has, and how to keep theirs."""
    spec = _spec(tmp_path, *argv, env=env)
    err = capsys.readouterr().err
    if note is None:
        assert err == ""
        return
    assert isinstance(spec.rendezvous, Standalone)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", spec.rendezvous.run_id)
    assert err.startswith(f"rankrun: note: --rdzv-id dcgmjob is not used: {note}")
    assert f" name {spec.rendezvous.run_id}; to run as dcgmjob, " in err and err.count("\n") == 1


def test_unused_id_note_and_rendezvous_name():
    assert unused_id_note("none", "u", explicit=False) is None
    assert unused_id_note("", "u", explicit=True) is None
    assert unused_id_note("j", "u", explicit=True) == (
        "rankrun: note: --rdzv-id j is not used: --standalone gives each run a fresh id, as torchrun does; the workers' "
        "TORCHELASTIC_RUN_ID, the events, the metrics and the DCGM files name u; to run as j, drop --standalone and "
        "add --rdzv-backend c10d --rdzv-endpoint localhost:0")
    assert unused_id_note("j", "u", explicit=False) == (
        "rankrun: note: --rdzv-id j is not used: one node without --rdzv-endpoint or --master-port runs standalone, "
        "which gives each run a fresh id, as torchrun does; the workers' TORCHELASTIC_RUN_ID, the events, the metrics "
        "and the DCGM files name u; to run as j, add --rdzv-backend c10d --rdzv-endpoint localhost:0")
    assert rendezvous_name("none") == "rendezvous"  # torchrun's default id reads as "no rendezvous"
    assert rendezvous_name("job42") == "rendezvous job42"


def test_pet_environment_defaults_and_cli_wins(tmp_path):
    env = {"PET_NPROC_PER_NODE": "3", "PET_MAX_RESTARTS": "2", "PET_STANDALONE": "1", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7"}
    spec = _spec(tmp_path, env=env)
    assert (spec.worker.nproc, spec.restart.max_restarts, spec.restart.shutdown_timeout) == (3, 2, 7.0)
    assert isinstance(spec.rendezvous, Standalone)
    assert _spec(tmp_path, "--nproc-per-node", "1", env=env).worker.nproc == 1


def test_an_empty_pet_variable_is_an_unset_one(tmp_path):
    """Kubeflow's PyTorchJob writes PET_STANDALONE="" for elastic jobs (torchrun: ValueError from int(''))."""
    empty = {f"PET_{name}": "" for name in ("STANDALONE", "NNODES", "NPROC_PER_NODE", "RDZV_BACKEND", "RDZV_ENDPOINT",
                                            "MAX_RESTARTS", "NO_PYTHON", "MODULE", "SIGNALS_TO_HANDLE", "RDZV_CONF")}
    spec, plain = _spec(tmp_path, env=empty), _spec(tmp_path)
    assert (spec.worker, spec.restart, spec.signals, type(spec.rendezvous)) == (
        plain.worker, plain.restart, plain.signals, type(plain.rendezvous))
    assert requested_signals([], {"PET_SIGNALS_TO_HANDLE": " "}) == requested_signals([], {})


def test_max_node_failures_defaults_to_2_and_takes_a_whole_number(tmp_path):
    assert _spec(tmp_path).restart.max_node_failures == 2
    assert _spec(tmp_path, "--max-node-failures", "5").restart.max_node_failures == 5
    assert _spec(tmp_path, "--max_node_failures", "0").restart.max_node_failures == 0
    with pytest.raises(UsageError, match=r"^--max-node-failures '-1': must be 0 or more$"):
        _spec(tmp_path, "--max-node-failures", "-1")
    assert _spec(tmp_path, env={"PET_MAX_NODE_FAILURES": "0"}).restart.max_node_failures == 0
    with pytest.raises(UsageError, match=r"^--max-node-failures 'two': expected a whole number \(0: never exclude a node\)$"):
        _spec(tmp_path, env={"PET_MAX_NODE_FAILURES": "two"})


def test_unique_prefixes_like_torchrun(tmp_path):
    assert _spec(tmp_path, "--max-r", "2").restart.max_restarts == 2
    with pytest.raises(UsageError, match="ambiguous"):
        _spec(tmp_path, "--nproc", "2")


def test_not_supported_yet(tmp_path):
    with pytest.raises(NotSupportedYetError):
        _spec(tmp_path, "--logs-specs", "my_plugin")


def _as_store(spec):
    return (spec.store.host, spec.store.port)


# One row per PET_* variable torchrun reads (23 options + 5 flags): each must change its own setting.
PET_TABLE = [
    ("PET_NNODES", "2", [], lambda s: isinstance(s.rendezvous, StaticRendezvous) and s.rendezvous.max_nodes == 2),
    ("PET_NPROC_PER_NODE", "3", [], lambda s: s.worker.nproc == 3),
    ("PET_RDZV_BACKEND", "c10d", ["--rdzv-id", "j"], lambda s: isinstance(s.rendezvous, DynamicRendezvous)
     and (s.rendezvous.backend, s.rendezvous.endpoint_port) == ("c10d", 29400)),
    ("PET_RDZV_ENDPOINT", "127.0.0.2:29777", [], lambda s: _as_store(s) == ("127.0.0.2", 29777)),
    ("PET_RDZV_ID", "job9", ["--master-port", "0"], lambda s: s.rendezvous.run_id == "job9"),
    ("PET_RDZV_CONF", "join_timeout=5", [], lambda s: s.rendezvous.conf.join_timeout == 5.0),
    ("PET_MAX_RESTARTS", "2", [], lambda s: s.restart.max_restarts == 2),
    ("PET_MONITOR_INTERVAL", "0", [], UsageError),
    ("PET_START_METHOD", "telepathy", [], UsageError),
    ("PET_EVENT_LOG_HANDLER", "telepathy", [], UsageError),
    ("PET_ROLE", "trainer", [], lambda s: s.worker.role == "trainer"),
    ("PET_LOG_DIR", "/dev/null", [], lambda s: s.logs.discard_files),
    ("PET_REDIRECTS", "3", [], lambda s: s.logs.redirects == (Stream.BOTH,)),
    ("PET_TEE", "1", [], lambda s: s.logs.tee == (Stream.STDOUT,)),
    ("PET_LOCAL_RANKS_FILTER", "0", [], lambda s: s.logs.local_ranks_filter == frozenset({0})),
    ("PET_DUPLICATE_STDOUT_FILTERS", "loss", [], lambda s: s.logs.stdout_filters == ("loss",)),
    ("PET_DUPLICATE_STDERR_FILTERS", "warn", [], lambda s: s.logs.stderr_filters == ("warn",)),
    ("PET_NODE_RANK", "1", [], UsageError),  # a node rank beyond --nnodes 1
    ("PET_MASTER_ADDR", "127.0.0.3", ["--master-port", "29601"], lambda s: _as_store(s) == ("127.0.0.3", 29601)),
    ("PET_MASTER_PORT", "29602", [], lambda s: _as_store(s) == ("127.0.0.1", 29602) and isinstance(s.rendezvous, StaticRendezvous)),
    ("PET_LOCAL_ADDR", "127.0.0.4", [], lambda s: _as_store(s) == ("127.0.0.4", 0)),
    ("PET_SIGNALS_TO_HANDLE", "SIGUSR1", [], lambda s: s.signals == (signal.SIGUSR1,)),
    ("PET_SHUTDOWN_TIMEOUT", "5", [], lambda s: s.restart.shutdown_timeout == 5.0),
    ("PET_STANDALONE", "1", ["--master-port", "29601"], lambda s: isinstance(s.rendezvous, Standalone) and s.store.port == 0),
    ("PET_MODULE", "1", [], lambda s: s.worker.entry.kind is EntryKind.MODULE),
    ("PET_NO_PYTHON", "1", [], lambda s: s.worker.entry.kind is EntryKind.BINARY),
    ("PET_RUN_PATH", "1", [], lambda s: s.worker.entry.kind is EntryKind.RUN_PATH),
    ("PET_VIRTUAL_LOCAL_RANK", "1", [], lambda s: s.worker.virtual_local_rank),
]


def test_pet_table_covers_every_variable_torchrun_reads():
    names = {row[0] for row in PET_TABLE}
    assert len(names) == len(PET_TABLE) == 28


@pytest.mark.parametrize(("name", "value", "flags", "check"), PET_TABLE, ids=[row[0] for row in PET_TABLE])
def test_each_pet_variable_changes_its_setting(tmp_path, name, value, flags, check):
    script = tmp_path / "t.py"
    script.write_text("")
    script.chmod(0o755)  # --no-python needs a program
    baseline = spec_from_args([*flags, str(script)], {})
    if isinstance(check, type):
        with pytest.raises(check):
            spec_from_args([*flags, str(script)], {name: value})
        return
    assert not check(baseline), f"{name}: the row's check already holds without the variable"
    assert check(spec_from_args([*flags, str(script)], {name: value}))


def test_etcd_endpoints_are_a_list_with_schemes_and_a_default_port():
    assert parse_etcd_endpoints("a:1, https://b:2,c,[::1]:3") == (
        Endpoint("http", "a", 1), Endpoint("https", "b", 2), Endpoint("http", "c", 2379), Endpoint("http", "::1", 3))
    assert parse_etcd_endpoints("a:1,a:1", "https") == (Endpoint("https", "a", 1),)  # duplicates dropped
    assert str(Endpoint("https", "::1", 3)) == "https://[::1]:3"
    assert resolve_backend("etcd-v2") == resolve_backend("etcd") == "etcd"
    with pytest.raises(UsageError, match="at least one"):
        parse_etcd_endpoints(" , ")


def test_etcd_spec_keeps_every_endpoint_and_the_prefix(tmp_path):
    spec = _spec(tmp_path, "--nnodes", "1:4", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1,127.0.0.2:2",
                 "--rdzv-conf", "etcd_prefix=/team/")
    rdzv = spec.rendezvous
    assert [str(e) for e in rdzv.etcd_endpoints] == ["http://127.0.0.1:1", "http://127.0.0.2:2"]
    assert rdzv.prefix == "/team" and spec.multi_node
    assert _spec(tmp_path, "--nnodes", "1", "--rdzv-backend", "etcd").multi_node  # etcd even for one node


def test_network_check_is_a_flag_and_a_pet_variable(tmp_path):
    assert _spec(tmp_path).health.network is False
    assert _spec(tmp_path, "--network-check").health.network is True
    assert _spec(tmp_path, env={"PET_NETWORK_CHECK": "1"}).health.network is True
    assert _spec(tmp_path, env={"PET_NETWORK_CHECK": "0"}).health.network is False
    with pytest.raises(UsageError, match="PET_NETWORK_CHECK"):
        _spec(tmp_path, env={"PET_NETWORK_CHECK": "yes"})


def test_straggler_window_and_action_take_both_spellings_and_pet_variables(tmp_path):
    assert _spec(tmp_path).straggler == StragglerSpec(60.0, "report")
    assert _spec(tmp_path, "--straggler-window", "12.5").straggler.window == 12.5
    assert _spec(tmp_path, "--straggler_window", "0").straggler.window == 0.0  # off
    assert _spec(tmp_path, "--straggler_action", "exclude").straggler.action == "exclude"
    assert _spec(tmp_path, env={"PET_STRAGGLER_WINDOW": "30", "PET_STRAGGLER_ACTION": "exclude"}).straggler == \
        StragglerSpec(30.0, "exclude")
    assert _spec(tmp_path, "--straggler-window", "5", env={"PET_STRAGGLER_WINDOW": "30"}).straggler.window == 5.0


@pytest.mark.parametrize(("argv", "env", "line"), [
    (["--straggler-window", "-1"], {}, r"^--straggler-window '-1': must be 0 \(off\) or more$"),
    (["--straggler-window", "inf"], {}, r"^--straggler-window 'inf': must be 0 \(off\) or more$"),
    (["--straggler-window", "nan"], {}, r"^--straggler-window 'nan': must be 0 \(off\) or more$"),
    (["--straggler-window", "soon"], {}, r"^--straggler-window 'soon': expected seconds \(a number; 0: off\)$"),
    ([], {"PET_STRAGGLER_WINDOW": "x"}, r"^--straggler-window 'x': expected seconds"),
    (["--straggler-action", "kill"], {}, r"^--straggler-action 'kill': expected report or exclude$"),
    ([], {"PET_STRAGGLER_ACTION": "fail"}, r"^--straggler-action 'fail': expected report or exclude$"),
])
def test_bad_straggler_options_are_one_line_naming_the_flag(tmp_path, argv, env, line):
    with pytest.raises(UsageError, match=line) as caught:
        _spec(tmp_path, *argv, env=env)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(("value", "found"), [
    ("/tmp/rankrun-launch-k2x9", "/tmp/rankrun-launch-k2x9"),
    (None, None),
    ("", None),
    ("/home/me", None),  # never a directory the API did not make: the watchdog would remove it
    ("/tmp/rankrun-launch-k2x9/..", None),
    ("rankrun-launch-k2x9", None),  # relative: where the launcher runs is not where the caller made it
])
def test_the_launchers_watchdog_is_given_only_a_directory_the_api_made(value, found):
    assert api_dir({} if value is None else {API_DIR: value}) == found


def test_checkpoint_dir_is_made_absolute_created_and_probed_and_takes_both_spellings_and_its_pet_variable(
        tmp_path, monkeypatch):
    assert _spec(tmp_path).checkpoint == CheckpointSpec(None)  # off unless asked
    monkeypatch.chdir(tmp_path)
    made = _spec(tmp_path, "--checkpoint-dir", "ckpt/nested").checkpoint.dir
    assert made == tmp_path / "ckpt" / "nested"
    assert made.is_absolute()
    assert made.is_dir()
    assert list(made.iterdir()) == []  # the probe file is gone
    assert _spec(tmp_path, "--checkpoint_dir", "ckpt/nested").checkpoint.dir == made  # there already: fine
    assert _spec(tmp_path, env={"PET_CHECKPOINT_DIR": str(tmp_path / "env")}).checkpoint.dir == tmp_path / "env"
    assert _spec(tmp_path, "--checkpoint-dir", "flag", env={"PET_CHECKPOINT_DIR": "env"}).checkpoint.dir == \
        tmp_path / "flag"  # the flag wins over the variable
    assert _spec(tmp_path, env={"PET_CHECKPOINT_DIR": ""}).checkpoint.dir is None  # empty: unset


@pytest.mark.parametrize(("value", "line"), [
    ("file.txt", r"^--checkpoint-dir 'file.txt': exists and is not a directory$"),
    ("file.txt/sub", r"^--checkpoint-dir 'file.txt/sub': cannot create it: Not a directory$"),
    ("/sys", r"^--checkpoint-dir '/sys': not writable: Permission denied$"),  # root too: access says yes, the probe no
    (" ", r"^--checkpoint-dir ' ': expected a directory$"),
])
def test_a_checkpoint_dir_that_cannot_be_written_is_one_line_naming_the_flag(tmp_path, monkeypatch, value, line):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file.txt").write_text("")
    with pytest.raises(UsageError, match=line) as caught:
        _spec(tmp_path, "--checkpoint-dir", value)
    assert caught.value.exit_code == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a directory of mode 0o500")
def test_a_checkpoint_dir_without_write_permission_is_not_writable(tmp_path):
    (locked := tmp_path / "locked").mkdir(mode=0o500)
    with pytest.raises(UsageError, match=r"^--checkpoint-dir '.*locked': not writable: Permission denied$"):
        _spec(tmp_path, "--checkpoint-dir", str(locked))
