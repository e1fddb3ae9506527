"""``--events`` and ``--metrics-port`` on real launchers: what a job's events file says (in order, once, schema-valid),
on one node and on two on loopback, after a signal and after a lost node; a FIFO nobody reads; the endpoint's series
while a restart happens; and the bad values of both options."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import clean_environ, fresh_loopback, payload, run_cli
from rankrun.events import schema_path
from rankrun.events.goodput import account, as_value
from rankrun.events.records import from_json

pytestmark = pytest.mark.usefixtures("private_tmpdir")

WORKER = payload("events_worker.py")
VALIDATOR = jsonschema.Draft202012Validator(json.loads(schema_path().read_text()))
COMMON = ("v", "ts", "mono", "run", "node", "event")


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every line of an events file, each checked against the shipped schema."""
    events = [json.loads(line) for line in path.read_text().splitlines()]
    for event in events:
        VALIDATOR.validate(event)
    return events


def names(events: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in events]


def own(event: dict[str, Any]) -> dict[str, Any]:
    """An event's own keys (what every node's copy of a fact shares), but job.end's goodput account (this node's own:
    ``accounted`` checks it)."""
    return {k: v for k, v in event.items() if k not in COMMON and k != "goodput"}


def accounted(found: list[dict[str, Any]]) -> None:
    """The job.end that ends ``found`` carries the goodput account of the events before it, to the millisecond."""
    end = found[-1]
    assert end["event"] == "job.end"
    expected = account([from_json(e) for e in found[:-1]], now=end["mono"])
    assert end["goodput"] == as_value(expected)
    assert abs(sum(v for k, v in end["goodput"].items() if k != "wall_s") - end["goodput"]["wall_s"]) <= 0.01


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_environ() | extra


def test_a_restart_is_told_in_order_once_with_ranks_as_ranges(tmp_path):
    events = tmp_path / "events.jsonl"
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "1", "--events", str(events), WORKER,
                   env=env_for(tmp_path, FAIL_RANK="1"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = read_events(events)
    assert names(found) == ["job.start", "rdzv.round", "workers.start", "startup", "workers.end", "failure", "restart",
                            "rdzv.round", "workers.start", "startup", "workers.end", "job.end"]
    start, round0, first, _, end0, fail, restart, round1, second, _, end1, job_end = found
    assert [(r["round"], r["nodes"], r["world_size"], r["group_rank"]) for r in (round0, round1)] == [(1, 1, 2, 0), (2, 1, 2, 0)]
    assert own(start) == {"nproc_per_node": 2, "nnodes": "1", "max_restarts": 1, "rdzv_backend": "standalone",
                          "entry": WORKER}
    assert (first["attempt"], first["ranks"], len(first["pids"])) == (0, "0-1", 2)
    assert (second["attempt"], second["ranks"]) == (1, "0-1")
    assert set(first["pids"]).isdisjoint(second["pids"])
    assert (end0["outcome"], end1["outcome"]) == ("failed", "succeeded")
    assert [e for e in found if e["event"] == "failure"] == [fail]
    assert (fail["attempt"], fail["rank"], fail["exit_code"], fail["signal"]) == (0, 1, 1, None)
    assert fail["exception"] == "ValueError: bad batch on rank 1"
    assert (restart["attempt"], restart["restarts_left"]) == (1, 0)
    assert "ValueError: bad batch on rank 1" in restart["reason"]
    assert own(job_end) == {"exit_code": 0, "outcome": "succeeded"}
    accounted(found)
    assert job_end["goodput"]["lost_s"] > 0 and job_end["goodput"]["restart_s"] > 0  # attempt 0's work, its teardown
    assert len({(e["run"], e["node"]) for e in found}) == 1 and found[0]["node"] == "127.0.0.1"
    monos = [e["mono"] for e in found]
    assert monos == sorted(monos)


def test_the_job_end_is_the_last_line_after_sigterm(launch, tmp_path):
    events = tmp_path / "events.jsonl"
    run = launch("--nproc-per-node", "2", "--events", str(events), WORKER,
                 env=env_for(tmp_path, WAIT_FILE=str(tmp_path / "never")))
    run.wait_for(r"READY rank \d attempt 0", count=2)
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM
    found = read_events(events)
    assert names(found) == ["job.start", "rdzv.round", "workers.start", "startup", "workers.end", "job.end"]
    assert found[4]["outcome"] == "interrupted"
    assert own(found[-1]) == {"exit_code": 128 + signal.SIGTERM, "outcome": "interrupted"}
    accounted(found)


def test_pet_events_names_the_file_and_the_agent_adds_nothing_without_it(tmp_path):
    events = tmp_path / "from-env.jsonl"
    done = run_cli("--nproc-per-node", "1", WORKER, env=env_for(tmp_path, PET_EVENTS=str(events)), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert names(read_events(events)) == ["job.start", "rdzv.round", "workers.start", "startup", "workers.end", "job.end"]
    plain = run_cli("--nproc-per-node", "1", WORKER, env=env_for(tmp_path), cwd=tmp_path)
    assert plain.returncode == 0 and "metrics" not in plain.stderr


def test_two_nodes_agree_on_the_round_and_the_root_cause(launch, tmp_path):
    addr = fresh_loopback()
    out = tmp_path / "out"
    out.mkdir()
    env = clean_environ() | {"TEST_OUT_DIR": str(out), "RANKRUN_RDZV_SECRET": "events-secret", "NODE_FAIL_RANK": "3",
                             "NODE_FAIL_RESTART": "0"}
    files = [tmp_path / f"node{rank}.jsonl" for rank in (0, 1)]
    runs = [launch("--nnodes", "2", "--node-rank", str(rank), "--master-addr", addr, "--master-port", "29500",
                   "--nproc-per-node", "2", "--max-restarts", "1", "--events", str(files[rank]),
                   payload("node_worker.py"), env=dict(env)) for rank in (0, 1)]
    assert [r.finish() for r in runs] == [0, 0], [r.err for r in runs]
    found = [read_events(f) for f in files]
    rounds = [[(e["round"], e["nodes"], e["world_size"]) for e in f if e["event"] == "rdzv.round"] for f in found]
    assert rounds[0] == rounds[1] and len(rounds[0]) == 2 and all(r[1:] == (2, 4) for r in rounds[0])
    assert [{e["group_rank"] for e in f if e["event"] == "rdzv.round"} for f in found] == [{0}, {1}]
    failures = [[own(e) for e in f if e["event"] == "failure"] for f in found]
    assert failures[0] == failures[1] and len(failures[0]) == 1
    assert (failures[0][0]["rank"], failures[0][0]["exit_code"], failures[0][0]["attempt"]) == (3, 7, 0)
    assert failures[0][0]["host"] == found[1][0]["node"]  # node rank 1 holds rank 3
    for f in found:
        assert names(f)[0] == "job.start" and names(f)[-1] == "job.end" and f[-1]["outcome"] == "succeeded"
        told = names(f)
        assert told.index("failure") < told.index("restart") < len(told) - told[::-1].index("rdzv.round") - 1
        restart = next(e for e in f if e["event"] == "restart")
        assert (restart["attempt"], restart["restarts_left"]) == (1, 0)
    host = found[1][0]["node"]
    for run in runs:  # every node says the restart in one line, the root cause its reason (the console: a consumer)
        said = [line for line in run.err if "restarting workers" in line]
        assert said == [f"rankrun: attempt 0 failed: rank 3 on {host} exited 7; restarting workers (1/1 restarts used)"]
    for node_rank, f in enumerate(found):  # each attempt's start-up, this node's ranks' (the store: one node only)
        startups = [e for e in f if e["event"] == "startup"]
        assert [e["attempt"] for e in startups] == [0, 1]
        assert [e["rendezvous"] for e in startups] == [e["seconds"] for e in f if e["event"] == "rdzv.round"]
        mine = (2 * node_rank, 2 * node_rank + 1)
        assert startups[0]["script_slowest"] in (None, *mine)  # a worker may be stopped before it came up
        assert startups[1]["script_slowest"] in mine  # every worker ran to its end
        assert all(e["store_p50"] is None and e["store_max"] is None for e in startups)


def test_the_survivors_file_says_a_killed_node_was_lost(launch, tmp_path):
    addr = fresh_loopback()
    finish = tmp_path / "finish"
    out = tmp_path / "out"
    out.mkdir()
    env = clean_environ() | {"TEST_OUT_DIR": str(out), "RANKRUN_RDZV_SECRET": "events-secret", "NODE_WAIT_FILE": str(finish)}
    events = tmp_path / "host.jsonl"
    common = ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addr}:29400", "--rdzv-id", "lost",
              "--rdzv-conf", "last_call_timeout=0.2,keep_alive_interval=0.5,keep_alive_max_attempt=2",
              "--nproc-per-node", "1"]
    host = launch(*common, "--events", str(events), payload("node_worker.py"), env=dict(env))
    host.wait_for(r"READY rank 0 world 1")
    doomed = launch(*common, payload("node_worker.py"), env=dict(env))
    doomed.wait_for(r"READY rank 1 world 2")
    host.wait_for(r"READY rank 0 world 2")
    doomed.proc.kill()
    doomed.finish()
    host.wait_for(r"READY rank 0 world 1 restart 0")
    finish.touch()
    assert host.finish() == 0, host.err
    found = read_events(events)
    (lost,) = [e for e in found if e["event"] == "node.lost"]
    assert len(lost["nodes"]) == 1 and "was lost" in lost["reason"]
    assert "restart" not in names(found) and "failure" not in names(found)  # a regroup: no restart used
    told = names(found)
    assert told.index("node.lost") < len(told) - told[::-1].index("rdzv.round") - 1  # told before the next round
    assert [e["nodes"] for e in found if e["event"] == "rdzv.round"][-1] == 1


def test_a_fifo_nobody_reads_never_holds_the_job_and_the_drops_are_said_once(tmp_path):
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    done = run_cli("--nproc-per-node", "2", "--events", str(fifo), WORKER, env=env_for(tmp_path), cwd=tmp_path,
                   timeout=60)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "dropped" in line]
    assert said == [f"rankrun: --events {fifo}: 6 events dropped (no reader, or it does not keep up)"]


def _scrape(address: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(address, timeout=10) as response:
        text = response.read().decode()
    series: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return series


def _during_restart(launch: Any, tmp_path: Path, nproc: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The series of a job of ``nproc`` workers, scraped while attempt 1 runs (after rank 1 failed attempt 0)."""
    go = tmp_path / f"go{nproc}"
    run = launch("--nproc-per-node", str(nproc), "--max-restarts", "1", "--metrics-port", "0", WORKER,
                 env=env_for(tmp_path, FAIL_RANK="1", WAIT_FILE=str(go)))
    (line,) = run.wait_for(r"rankrun: metrics at http://127\.0\.0\.1:\d+/metrics$")
    run.wait_for(r"READY rank \d+ attempt 1", count=nproc)
    series = _scrape(line.split(" at ")[1])
    go.touch()
    assert run.finish() == 0, run.err
    assert [e for e in run.err if "metrics at" in e] == [line]  # said once
    return series


def test_metrics_of_8_workers_during_a_restart_and_the_same_series_for_2(launch, tmp_path):
    eight = _during_restart(launch, tmp_path, 8)
    run = next(iter(eight["rankrun_up"]))  # the one label every series has
    assert run[0][0] == "run"

    def value(name: str, **labels: str) -> float:
        return eight[name][tuple(sorted({**dict(run), **labels}.items()))]

    assert value("rankrun_up") == 1
    assert value("rankrun_restarts_total") == 1
    assert value("rankrun_restarts_left") == 0
    assert value("rankrun_failures_total") == 1
    assert value("rankrun_attempt") == 1
    assert value("rankrun_workers", state="running") == 8
    assert sum(value("rankrun_workers", state=s) for s in ("succeeded", "failed", "stopped")) == 0
    count = sum(len(samples) for samples in eight.values())
    assert count <= 60
    two = _during_restart(launch, tmp_path, 2)
    assert sum(len(samples) for samples in two.values()) == count
    assert {name: len(samples) for name, samples in two.items()} == {name: len(samples) for name, samples in eight.items()}


def test_an_events_path_that_cannot_be_written_is_one_line_and_nothing_starts(tmp_path):
    marker = tmp_path / "pids"
    marker.mkdir()
    bad = tmp_path / "missing" / "events.jsonl"
    done = run_cli("--nproc-per-node", "1", "--events", str(bad), WORKER,
                   env=env_for(tmp_path, TEST_PID_DIR=str(marker)), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"rankrun: error: --events '{bad}': No such file or directory"]
    assert list(marker.iterdir()) == []  # no worker started


def test_a_taken_metrics_port_is_one_line_and_nothing_starts(tmp_path):
    marker = tmp_path / "pids"
    marker.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("--nproc-per-node", "1", "--metrics-port", str(port), "--events", str(tmp_path / "e.jsonl"),
                       WORKER, env=env_for(tmp_path, TEST_PID_DIR=str(marker)), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"rankrun: error: --metrics-port {port}: cannot listen on 127.0.0.1: "
                                        "Address already in use"]
    assert list(marker.iterdir()) == []
    found = read_events(tmp_path / "e.jsonl")  # the launcher's error ends the job: still told, last
    assert names(found) == ["job.start", "job.end"] and own(found[1]) == {"exit_code": 2, "outcome": "error"}


@pytest.mark.parametrize(("value", "reason"), [("http", "expected a port number (0: the OS picks)"),
                                               ("70000", "must be from 0 to 65535")])
def test_a_bad_metrics_port_is_one_line(tmp_path, value, reason):
    done = run_cli("--metrics-port", value, WORKER, env=env_for(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    shown = repr(value) if not value.isdigit() else value
    assert re.fullmatch(rf"rankrun: error: --metrics-port {re.escape(shown)}: {re.escape(reason)}\n", done.stderr)


def test_a_stall_report_is_one_stall_event_with_its_first_line(launch, tmp_path):
    events = tmp_path / "events.jsonl"
    run = launch("--nproc-per-node", "2", "--hang-timeout", "1", "--events", str(events), payload("stall.py"),
                 env=env_for(tmp_path))
    (line,) = run.wait_for(r"rankrun: job \S+ stalled: ", timeout=30)
    run.wait_for(r"in wait_for_peers$")  # the whole report has been printed
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM
    found = read_events(events)
    (stall,) = [e for e in found if e["event"] == "stall"]
    assert own(stall) | {"silent": None} == {"ranks": "0-1", "title": line, "silent": None}
    assert stall["silent"] >= 1  # --hang-timeout 1: the stall began at least that long before its report
    accounted(found)
    assert names(found)[-1] == "job.end"


def test_the_python_api_takes_events_as_a_keyword(tmp_path):
    events = tmp_path / "api.jsonl"
    driver = tmp_path / "driver.py"
    driver.write_text("import os, sys\nimport rankrun\n\n\ndef rank():\n    return int(os.environ['RANK'])\n\n\n"
                      "if __name__ == '__main__':\n    print(rankrun.launch(rank, nproc_per_node=2, events=sys.argv[1]))\n")
    done = subprocess.run([sys.executable, str(driver), str(events)], cwd=tmp_path, env=clean_environ(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stdout) == (0, "{0: 0, 1: 1}\n"), done.stderr
    found = read_events(events)
    assert names(found) == ["job.start", "rdzv.round", "workers.start", "startup", "workers.end", "job.end"]
    assert found[0]["entry"] == "rankrun.launch(rank)"


def test_a_rendezvous_that_times_out_ends_the_file_with_an_error(tmp_path):
    events = tmp_path / "events.jsonl"
    addr = fresh_loopback()
    done = run_cli("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addr}:29400", "--rdzv-id", "alone",
                   "--rdzv-conf", "join_timeout=1", "--events", str(events), WORKER,
                   env=env_for(tmp_path, RANKRUN_RDZV_SECRET="events-secret"), cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    found = read_events(events)
    assert names(found) == ["job.start", "job.end"]
    assert found[0]["node"] == addr and own(found[0])["nnodes"] == "2"
    assert own(found[1]) == {"exit_code": 3, "outcome": "error"}
