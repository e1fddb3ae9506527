"""``rankrun.events.metrics.Metrics``: the series folded from a job's events, read back with ``prometheus_client``'s
own parser (what a scraper sees), and their number, which must not grow with the ranks."""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rankrun.events.metrics import CONTENT_TYPE, STRAGGLER_SERIES, Metrics, announcement, answer, top_lags, url
from rankrun.events.records import Record, from_json

RUN = "job-42"
Sample = tuple[str, frozenset[tuple[str, str]]]


def event(name: str, **keys: Any) -> Record:
    """A stamped record, as the stream hands it over, written in its JSON-object form (schema version 1)."""
    return from_json({"v": 1, "ts": 1.7e9, "mono": 12.5, "run": RUN, "node": "127.0.0.1", "event": name, **keys})


def ranges(first: int, count: int) -> str:
    return f"{first}-{first + count - 1}" if count > 1 else str(first)


def job(nproc: int, nnodes: int = 1, group_rank: int = 0, failed_rank: int = 5) -> list[Record]:
    """A node's events for a job whose ``failed_rank`` fails attempt 0; the restart's attempt 1 then runs."""
    world = nproc * nnodes
    mine = ranges(group_rank * nproc, nproc)
    pids = list(range(1000, 1000 + nproc))
    return [
        event("job.start", nproc_per_node=nproc, nnodes=str(nnodes), max_restarts=3, rdzv_backend="c10d", entry="train.py"),
        event("rdzv.round", round=0, nodes=nnodes, world_size=world, group_rank=group_rank, seconds=0.25),
        event("workers.start", attempt=0, ranks=mine, pids=pids),
        event("startup", attempt=0, total=4.2, rendezvous=0.9, spawn=0.1, script_p50=2.1, script_max=3.8, script_slowest=5,
              store_p50=None, store_max=None, store_slowest=None),
        event("failure", attempt=0, rank=failed_rank, host="127.0.0.1", exit_code=1, signal=None, exception="ValueError: boom"),
        event("workers.end", attempt=0, outcome="failed"),
        event("restart", attempt=1, reason="a worker failed", restarts_left=2),
        event("rdzv.round", round=1, nodes=nnodes, world_size=world, group_rank=group_rank, seconds=0.5),
        event("workers.start", attempt=1, ranks=mine, pids=[p + nproc for p in pids]),
    ]


def fold(events: list[Record], metrics: Metrics | None = None) -> Metrics:
    """``events`` folded into ``metrics``, or into new ones whose clock stands still: a scrape of the same events
    renders the same text (the job's seconds are taken at the scrape)."""
    metrics = Metrics(monotonic=lambda: 60.0) if metrics is None else metrics
    for e in events:
        metrics.on_event(e)
    return metrics


def samples(metrics: Metrics) -> dict[Sample, float]:
    """Every sample of the exposition, parsed as Prometheus's own client library parses it."""
    found: dict[Sample, float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in found, f"sample {key} twice"
            found[key] = s.value
    return found


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, frozenset({"run": RUN, **labels}.items())))


def workers(metrics: Metrics) -> dict[str, float | None]:
    return {state: value(metrics, "rankrun_workers", state=state) for state in ("running", "succeeded", "failed", "stopped")}


def test_a_failure_then_a_restart_of_8_workers() -> None:
    events = job(8)
    m = fold(events[:3])  # attempt 0 runs
    assert value(m, "rankrun_up") == 1
    assert workers(m) == {"running": 8, "succeeded": 0, "failed": 0, "stopped": 0}
    assert value(m, "rankrun_restarts_left") == 3  # --max-restarts, before any restart
    assert value(m, "rankrun_world_size") == 8
    assert value(m, "rankrun_nodes", state="member") == 1
    assert value(m, "rankrun_rendezvous_round") == 0
    assert value(m, "rankrun_rendezvous_seconds") == 0.25
    assert value(m, "rankrun_attempt") == 0

    fold(events[3:6], m)  # rank 5 failed; the launcher stopped the other seven
    assert workers(m) == {"running": 0, "succeeded": 0, "failed": 1, "stopped": 7}
    assert value(m, "rankrun_failures_total") == 1
    assert value(m, "rankrun_restarts_total") == 0

    fold(events[6:], m)  # the restart: attempt 1's eight workers run
    assert workers(m) == {"running": 8, "succeeded": 0, "failed": 0, "stopped": 0}
    assert value(m, "rankrun_restarts_total") == 1
    assert value(m, "rankrun_restarts_left") == 2
    assert value(m, "rankrun_attempt") == 1
    assert value(m, "rankrun_rendezvous_round") == 1
    assert value(m, "rankrun_rendezvous_seconds") == 0.5
    assert value(m, "rankrun_failures_total") == 1
    assert value(m, "rankrun_up") == 1

    m.on_event(event("workers.end", attempt=1, outcome="succeeded"))
    assert workers(m) == {"running": 0, "succeeded": 8, "failed": 0, "stopped": 0}
    m.on_event(event("job.end", exit_code=0, outcome="succeeded"))
    assert value(m, "rankrun_up") == 0
    assert workers(m) == {"running": 0, "succeeded": 8, "failed": 0, "stopped": 0}


def test_the_root_cause_counts_as_failed_before_its_attempt_ends_too() -> None:
    m = fold(job(8)[:3])
    m.on_event(event("failure", attempt=0, rank=7, host="127.0.0.1", exit_code=None, signal="SIGKILL", exception=None))
    assert workers(m) == {"running": 7, "succeeded": 0, "failed": 1, "stopped": 0}
    m.on_event(event("workers.end", attempt=0, outcome="failed"))
    assert workers(m) == {"running": 0, "succeeded": 0, "failed": 1, "stopped": 7}


@pytest.mark.parametrize(("failed_rank", "failed"), [(3, 0), (8, 1), (15, 1), (16, 0)])
def test_a_root_cause_counts_as_failed_only_on_its_own_node(failed_rank: int, failed: int) -> None:
    m = fold(job(8, nnodes=3, group_rank=1, failed_rank=failed_rank)[:6])  # this node holds ranks 8-15
    assert workers(m) == {"running": 0, "succeeded": 0, "failed": failed, "stopped": 8 - failed}
    assert value(m, "rankrun_world_size") == 24
    assert value(m, "rankrun_nodes", state="member") == 3
    assert value(m, "rankrun_node_rank") == 1


def test_a_failure_of_an_earlier_attempt_does_not_touch_the_running_one() -> None:
    m = fold(job(8))
    m.on_event(event("failure", attempt=0, rank=2, host="127.0.0.1", exit_code=1, signal=None, exception=None))
    assert workers(m) == {"running": 8, "succeeded": 0, "failed": 0, "stopped": 0}
    m.on_event(event("workers.end", attempt=0, outcome="failed"))
    assert workers(m) == {"running": 8, "succeeded": 0, "failed": 0, "stopped": 0}


@pytest.mark.parametrize("outcome", ["stopped", "interrupted", "moved_on", "stalled"])
def test_an_attempt_ended_by_the_launcher_has_its_workers_stopped(outcome: str) -> None:
    m = fold([*job(4)[:3], event("workers.end", attempt=0, outcome=outcome)])
    assert workers(m) == {"running": 0, "succeeded": 0, "failed": 0, "stopped": 4}


def test_the_job_ending_with_workers_running_leaves_them_stopped() -> None:
    m = fold([*job(4)[:3], event("job.end", exit_code=143, outcome="interrupted")])
    assert workers(m) == {"running": 0, "succeeded": 0, "failed": 0, "stopped": 4}
    assert value(m, "rankrun_up") == 0


def test_scattered_ranks_are_counted_from_their_range_string() -> None:
    m = fold([event("workers.start", attempt=0, ranks="0,2,4-6,9", pids=[1, 2, 3, 4, 5, 6])])
    assert value(m, "rankrun_workers", state="running") == 6
    m.on_event(event("failure", attempt=0, rank=5, host="h", exit_code=1, signal=None, exception=None))
    assert value(m, "rankrun_workers", state="failed") == 1
    m.on_event(event("failure", attempt=0, rank=3, host="h", exit_code=1, signal=None, exception=None))
    assert value(m, "rankrun_workers", state="failed") == 0  # rank 3 is not among this node's
    m = fold([event("workers.start", attempt=0, ranks="", pids=[])])
    assert value(m, "rankrun_workers", state="running") == 0


def test_stalls_lost_nodes_and_the_start_up_phases() -> None:
    m = fold([*job(8)[:4], event("stall", ranks="0-7", title="rankrun: ranks 0-7 stalled for 300 s"),
              event("stall", ranks="3", title="rankrun: rank 3 stalled"),
              event("node.lost", nodes=["127.0.0.2", "127.0.0.3"], reason="heartbeat")])
    assert value(m, "rankrun_stalls_total") == 2
    assert value(m, "rankrun_nodes_lost_total") == 2
    assert value(m, "rankrun_nodes", state="excluded") == 0


def test_excluded_nodes_are_counted_in_their_own_state_and_with_the_lost() -> None:
    m = fold([*job(8)[:4], event("node.excluded", nodes=["n-7 at 127.0.0.3"], reason="blamed for 2 failures"),
              event("node.excluded", nodes=["n-9 at 127.0.0.4"], reason="unhealthy: disk"),
              event("node.lost", nodes=["n-2 at 127.0.0.2"], reason="its lease ended")])
    assert value(m, "rankrun_nodes", state="excluded") == 2
    assert value(m, "rankrun_nodes", state="member") == 1
    assert value(m, "rankrun_nodes_lost_total") == 3
    assert value(m, "rankrun_startup_seconds", phase="total") == 4.2
    assert value(m, "rankrun_startup_seconds", phase="script_max") == 3.8
    assert value(m, "rankrun_startup_seconds", phase="store_p50") is None  # unknown: no sample, not a made-up 0


def test_before_any_event_the_counters_are_zero_and_the_unknown_gauges_absent() -> None:
    m = Metrics(run=RUN)
    assert value(m, "rankrun_up") == 0
    assert value(m, "rankrun_restarts_total") == 0
    assert value(m, "rankrun_stalls_total") == 0
    assert workers(m) == {"running": 0, "succeeded": 0, "failed": 0, "stopped": 0}
    for name in ("rankrun_world_size", "rankrun_rendezvous_round", "rankrun_restarts_left"):
        assert value(m, name) is None, name
    assert value(m, "rankrun_nodes", state="member") is None
    assert value(m, "rankrun_nodes", state="excluded") == 0
    assert starts(m) == {"forked": 0, "exec": 0}  # every job has both series, from its start
    assert value(m, "rankrun_preload_import_seconds") is None


def test_events_it_does_not_show_or_cannot_read_leave_the_series_alone() -> None:
    m = fold(job(8))
    m.on_event(event("workers.start", attempt=2, ranks="0-x", pids=[]))  # a range string it cannot read: no worker
    assert workers(m) == {"running": 0, "succeeded": 0, "failed": 0, "stopped": 0}


def straggler(rank: int, verdict: str = "named", lag: float | None = 0.041) -> Record:
    return event("straggler", rank=rank, where="node-3/10.0.0.13", verdict=verdict, lag=lag, share=0.92,
                 collectives=0 if lag is None else 640, line=f"rankrun: straggler: rank {rank} on node-3/10.0.0.13 — ...")


def lags(metrics: Metrics) -> dict[str, float]:
    """``rankrun_straggler_lag_seconds`` by its rank label, as a scraper reads it."""
    return {dict(labels)["rank"]: v for (name, labels), v in samples(metrics).items()
            if name == "rankrun_straggler_lag_seconds"}


def test_a_named_straggler_is_a_series_by_rank_until_it_recovers() -> None:
    m = fold(job(8)[:3])
    assert lags(m) == {}
    m.on_event(straggler(5))
    m.on_event(straggler(13, lag=None))  # judged on stack samples: named, with no lag to give
    assert lags(m) == {"5": 0.041, "13": 0.0}
    assert 'rankrun_straggler_lag_seconds{run="job-42",rank="5"} 0.041\n' in m.render().decode()
    m.on_event(straggler(5, lag=0.3))  # named again (a producer's repeat): the latest lag
    m.on_event(straggler(13, "recovered", lag=None))
    assert lags(m) == {"5": 0.3}
    m.on_event(straggler(7, "recovered"))  # never named here: nothing to remove
    m.on_event(straggler(5, "recovered"))
    assert lags(m) == {}
    text = m.render().decode()
    assert "# TYPE rankrun_straggler_lag_seconds gauge" in text  # the family is there with no sample, as the others
    assert f"At most {STRAGGLER_SERIES} series" in text


def test_the_straggler_series_are_bounded_to_the_largest_lags() -> None:
    m = fold(job(8)[:3])
    for rank in range(40):  # a slow node of 40 ranks, each a little later than the one before
        m.on_event(straggler(rank, lag=0.01 + rank / 1000))
    assert len(lags(m)) == STRAGGLER_SERIES == 8
    assert set(lags(m)) == {str(r) for r in range(32, 40)}
    m.on_event(straggler(39, "recovered"))  # one shown recovers: the next largest is shown in its place
    assert set(lags(m)) == {str(r) for r in range(31, 39)}
    assert top_lags({3: 0.5, 1: 0.5, 2: 0.1}, 2) == [(1, 0.5), (3, 0.5)]  # a tie: the lower rank kept; in rank order
    assert top_lags({}, 8) == []


@pytest.mark.parametrize("end", [
    event("workers.end", attempt=1, outcome="failed"), event("job.end", exit_code=0, outcome="succeeded"),
    event("workers.start", attempt=2, ranks="0-7", pids=list(range(8))),
])
def test_the_stragglers_go_with_their_attempt(end: Record) -> None:
    m = fold([*job(8), straggler(5), straggler(6, lag=None)])
    assert len(lags(m)) == 2
    m.on_event(end)
    assert lags(m) == {}


def test_a_straggler_event_it_cannot_read_leaves_the_series_alone() -> None:
    m = fold([*job(8), straggler(5)])
    before = m.render()
    m.on_event(straggler(-1))
    assert m.render() == before
    m.on_event(straggler(6, lag=math.nan))  # a lag it cannot read: named all the same, as one with no lag
    assert lags(m) == {"5": 0.041, "6": 0.0}


def series(nproc: int, upto: int | None = None) -> dict[Sample, float]:
    """The series of the third of four nodes of ``nproc`` workers each, whose rank ``2 * nproc + 1`` fails attempt 0,
    after its first ``upto`` events (all, with a stall, a lost node and every rank of the job named a straggler, the
    lower ranks the later, when None)."""
    events = job(nproc, nnodes=4, group_rank=2, failed_rank=2 * nproc + 1)
    if upto is None:
        events += [event("stall", ranks=ranges(2 * nproc, nproc), title="stalled"), event("node.lost", nodes=["n9"], reason="x")]
        events += [straggler(rank, lag=1 / (rank + 1)) for rank in range(4 * nproc)]
        mine = ranges(2 * nproc, nproc)
        events += [kept(5, ranks=mine), kept(6, ranks=mine, state="refused"), written(5, "neighbour"), written(5, "disk"),
                   event("checkpoint.restored", attempt=1, step=5, source="memory", ranks=mine, bytes=10, seconds=0.1)]
    return samples(fold(events[:upto]))


def test_the_number_of_series_does_not_grow_with_the_ranks() -> None:
    failed = 6  # the events up to attempt 0's end: one worker failed, the others stopped
    for upto in (failed, None):
        few, many = series(8, upto), series(512, upto)
        assert set(few) == set(many)  # the same series, whatever the ranks: no pid or host in a label, 8 ranks at most
        assert len(few) <= 60
        later = {"rank", "where"} if upto is None else set()  # the stragglers' ranks, the kept bytes' places
        assert {name for _, labels in few for name, _ in labels} == {"run", "state", "phase", "how", "category", *later}
    print(f"series: {len(few)} for 8 workers a node, {len(many)} for 512")
    many = series(512, failed)
    assert many[("rankrun_workers", frozenset({"run": RUN, "state": "stopped"}.items()))] == 511
    assert many[("rankrun_workers", frozenset({"run": RUN, "state": "failed"}.items()))] == 1
    assert many[("rankrun_world_size", frozenset({"run": RUN}.items()))] == 2048


def test_one_help_and_one_type_per_family_counters_end_in_total() -> None:
    text = fold(job(8)).render().decode()
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")]
    types = {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert len(helps) == len(set(helps)) == len(types)
    assert set(helps) == set(types)
    assert all(name.endswith("_total") == (kind == "counter") for name, kind in types.items())
    assert {f.name: f.type for f in text_string_to_metric_families(text)}["rankrun_restarts"] == "counter"
    assert text.endswith("\n")


def test_a_run_id_with_quotes_backslashes_and_a_newline_survives_the_escaping() -> None:
    run = 'a"b\\c\nd'
    m = Metrics(run="unused")
    m.on_event(event("job.start", nproc_per_node=1, nnodes="1", max_restarts=0, rdzv_backend="c10d", entry="x", run=run))
    [up] = [s for f in text_string_to_metric_families(m.render().decode()) for s in f.samples if s.name == "rankrun_up"]
    assert up.labels == {"run": run}
    assert up.value == 1


def test_the_run_label_is_the_constructors_until_an_event_names_it() -> None:
    m = Metrics(run="given")
    assert samples(m)[("rankrun_up", frozenset({"run": "given"}.items()))] == 0


def test_requests_get_the_series_or_a_status_saying_why_not() -> None:
    m = fold(job(8))
    ok = answer(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*", m)
    head, body = ok.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert f"Content-Type: {CONTENT_TYPE}".encode() in head.split(b"\r\n")
    assert f"Content-Length: {len(body)}".encode() in head.split(b"\r\n")
    assert b"Connection: close" in head.split(b"\r\n")
    assert body == m.render()
    assert answer(b"GET /metrics?x=1 HTTP/1.0", m).startswith(b"HTTP/1.1 200 ")
    head_only = answer(b"HEAD /metrics HTTP/1.1\r\nHost: x", m)
    assert head_only == ok[: len(ok) - len(body)]
    assert answer(b"GET / HTTP/1.1", m).startswith(b"HTTP/1.1 404 ")
    assert answer(b"GET /metricsx HTTP/1.1", m).startswith(b"HTTP/1.1 404 ")
    not_allowed = answer(b"POST /metrics HTTP/1.1\r\nContent-Length: 0", m)
    assert not_allowed.startswith(b"HTTP/1.1 405 ")
    assert b"\r\nAllow: GET, HEAD\r\n" in not_allowed
    for bad in (b"GET /metrics", b"GET /metrics SPDY/3", b"", b"GET  /metrics HTTP/1.1"):
        assert answer(bad, m).startswith(b"HTTP/1.1 400 "), bad


def test_the_url_and_its_line() -> None:
    assert announcement("10.0.0.1", 9400) == "rankrun: metrics at http://10.0.0.1:9400/metrics"
    assert url("fe80::1", 80) == "http://[fe80::1]:80/metrics"


def test_every_failure_and_restart_counts_rank_0_can_straggle_and_an_unread_range_keeps_its_attempt() -> None:
    m = fold(job(8))  # one failure and one restart
    m.on_event(event("failure", attempt=1, rank=9, host="h", exit_code=1, signal=None, exception=None))
    m.on_event(event("restart", attempt=2, reason="again", restarts_left=1))
    assert (value(m, "rankrun_failures_total"), value(m, "rankrun_restarts_total")) == (2, 2)
    m.on_event(straggler(0))
    assert lags(m) == {"0": 0.041}
    m.on_event(event("workers.start", attempt=2, ranks="0-x", pids=[]))
    assert value(m, "rankrun_attempt") == 2


# ---- --preload: the import, and how the workers started


def starts(metrics: Metrics) -> dict[str, float | None]:
    return {how: value(metrics, "rankrun_worker_starts_total", how=how) for how in ("forked", "exec")}


def preload(state: str = "ready", seconds: float = 2.31, why: str = "") -> Record:
    return event("preload", modules="torch", seconds=seconds, state=state, why=why)


def warm(attempt: int, forked: str, cold: str = "") -> Record:
    p50, most = (0.004, 0.009) if forked else (None, None)
    return event("warm", attempt=attempt, forked=forked, cold=cold, fork_p50=p50, fork_max=most)


def test_without_preload_every_worker_started_is_an_exec_and_there_is_no_import() -> None:
    m = fold(job(8)[:3])
    assert starts(m) == {"forked": 0, "exec": 8}
    fold(job(8)[3:], m)  # the restart's eight more
    assert starts(m) == {"forked": 0, "exec": 16}
    assert value(m, "rankrun_preload_import_seconds") is None
    scattered = fold([event("workers.start", attempt=0, ranks="0,2,4-6,9", pids=[1, 2, 3, 4, 5, 6])])
    assert starts(scattered) == {"forked": 0, "exec": 6}
    text = m.render().decode()
    assert "# TYPE rankrun_worker_starts_total counter" in text
    assert "# TYPE rankrun_preload_import_seconds gauge" in text


def test_with_preload_the_warm_events_tell_forked_from_exec_and_the_import_is_a_gauge() -> None:
    events = job(8)
    m = fold([events[0], events[1], events[2], preload()])  # as the launcher emits them: the preload with attempt 0
    assert value(m, "rankrun_preload_import_seconds") == 2.31
    fold([warm(0, "0-7"), *events[3:]], m)  # the restart's workers.start: 8 more, until its warm event
    assert starts(m) == {"forked": 8, "exec": 8}
    m.on_event(warm(1, "0-2,5", "3-4,6-7"))  # four of them forked, four cold
    assert starts(m) == {"forked": 12, "exec": 4}
    m.on_event(event("workers.start", attempt=2, ranks="0-7", pids=list(range(8))))
    m.on_event(preload("unsafe", why="a preloaded module left a thread running"))
    m.on_event(warm(2, "", "0-7"))  # cold from now on
    assert starts(m) == {"forked": 12, "exec": 12}
    assert value(m, "rankrun_preload_import_seconds") == 2.31  # the import took what it took


@pytest.mark.parametrize("preload_first", [True, False])
def test_the_starts_are_the_same_whether_the_preload_event_comes_before_the_workers_or_after(preload_first: bool) -> None:
    started = event("workers.start", attempt=0, ranks="0-3,8-11", pids=list(range(8)))
    m = fold([preload(), started] if preload_first else [started, preload()])
    m.on_event(warm(0, "0-2,8-11", "3"))
    assert starts(m) == {"forked": 7, "exec": 1}


def test_a_preloading_process_that_never_got_ready_has_no_import_time() -> None:
    m = fold([*job(8)[:2], preload("ended", seconds=0.0, why="killed by SIGKILL"), job(8)[2], warm(0, "", "0-7")])
    assert value(m, "rankrun_preload_import_seconds") is None
    assert starts(m) == {"forked": 0, "exec": 8}


def test_a_warm_event_moves_only_what_its_own_workers_start_counted_and_once() -> None:
    m = fold([event("workers.start", attempt=0, ranks="0-7", pids=list(range(8))), warm(1, "0-7")])
    assert starts(m) == {"forked": 0, "exec": 8}  # another attempt's: not these workers
    m.on_event(warm(0, "0-x"))  # ranks it cannot read: none known forked
    assert starts(m) == {"forked": 0, "exec": 8}
    m.on_event(warm(0, "0-7"))  # a second warm event of the attempt moves nothing more
    assert starts(m) == {"forked": 0, "exec": 8}
    m.on_event(event("workers.start", attempt=1, ranks="0-1", pids=[1, 2]))
    m.on_event(warm(1, "0-7"))  # more than its workers.start counted: never a negative exec
    assert starts(m) == {"forked": 2, "exec": 8}
    m = fold([warm(0, "0-7")])  # no workers.start: nothing started here
    assert starts(m) == {"forked": 0, "exec": 0}


def kept(step: int, state: str = "kept", mono: float = 100.0, ranks: str = "0-7", size: int = 4_200_000_000,
         seconds: float = 0.61) -> Record:
    why = None if state == "kept" else "rank 3's step is not kept: this node has 1.1 GB of room"
    return event("checkpoint.kept", step=step, ranks=ranks, bytes=size, seconds=seconds, state=state, why=why, mono=mono)


def written(step: int, to: str, state: str = "complete", size: int = 4_200_000_000) -> Record:
    return event("checkpoint.written", step=step, to=to, where="10.0.0.14" if to == "neighbour" else "/ckpt/s",
                 bytes=size, seconds=2.5, state=state)


def kept_bytes(metrics: Metrics) -> dict[str, float | None]:
    return {where: value(metrics, "rankrun_checkpoint_bytes", where=where) for where in ("memory", "neighbour", "disk")}


def saves(metrics: Metrics) -> dict[str, float | None]:
    return {state: value(metrics, "rankrun_checkpoint_saves_total", state=state) for state in ("kept", "refused")}


def test_without_checkpoints_the_saves_are_zero_and_the_kept_gauges_absent() -> None:
    m = fold(job(8))
    assert saves(m) == {"kept": 0, "refused": 0}
    for name in ("rankrun_checkpoint_step", "rankrun_checkpoint_age_seconds", "rankrun_checkpoint_save_seconds"):
        assert value(m, name) is None, name
    assert kept_bytes(m) == {"memory": None, "neighbour": None, "disk": None}
    text = m.render().decode()
    for name, kind in (("rankrun_checkpoint_step", "gauge"), ("rankrun_checkpoint_age_seconds", "gauge"),
                       ("rankrun_checkpoint_bytes", "gauge"), ("rankrun_checkpoint_saves_total", "counter"),
                       ("rankrun_checkpoint_save_seconds", "gauge")):
        assert f"# TYPE {name} {kind}\n" in text
        assert f"# HELP {name} " in text


def test_a_kept_step_is_the_newest_and_its_age_is_read_at_the_scrape() -> None:
    now = [100.0]
    m = fold(job(8), Metrics(monotonic=lambda: now[0]))
    m.on_event(kept(5, mono=100.0, seconds=0.61))
    assert value(m, "rankrun_checkpoint_step") == 5
    assert value(m, "rankrun_checkpoint_age_seconds") == 0.0
    now[0] = 112.5  # no event since: the age grows with the clock, at each scrape
    assert value(m, "rankrun_checkpoint_age_seconds") == 12.5
    assert value(m, "rankrun_checkpoint_save_seconds") == 0.61
    assert kept_bytes(m) == {"memory": 4_200_000_000, "neighbour": None, "disk": None}
    m.on_event(kept(10, mono=110.0, size=4_300_000_000, seconds=0.58))
    assert value(m, "rankrun_checkpoint_step") == 10
    assert value(m, "rankrun_checkpoint_age_seconds") == 2.5
    assert value(m, "rankrun_checkpoint_save_seconds") == 0.58
    assert kept_bytes(m)["memory"] == 4_300_000_000
    m.on_event(kept(3, mono=111.0))  # resumed from an older step and saving again from there: the latest told
    assert value(m, "rankrun_checkpoint_step") == 3
    assert saves(m) == {"kept": 3, "refused": 0}
    now[0] = 50.0  # a clock behind the event (a fake's, never the system's): no negative age
    assert value(m, "rankrun_checkpoint_age_seconds") == 0.0


def test_a_refused_step_counts_and_leaves_the_kept_one_shown() -> None:
    m = fold([*job(8), kept(5, mono=100.0, seconds=0.61)], Metrics(monotonic=lambda: 130.0))
    m.on_event(kept(6, state="refused", mono=120.0, size=0, seconds=0.0))
    assert saves(m) == {"kept": 1, "refused": 1}
    assert value(m, "rankrun_checkpoint_step") == 5  # the previous step stays kept
    assert value(m, "rankrun_checkpoint_age_seconds") == 30.0
    assert value(m, "rankrun_checkpoint_save_seconds") == 0.61
    assert kept_bytes(m)["memory"] == 4_200_000_000
    m.on_event(event("checkpoint.kept", step=7, ranks="0-7", bytes=1, seconds=1.0, state="lost", why=None))
    assert saves(m) == {"kept": 1, "refused": 1}  # a state it does not know: nothing counted, nothing changed
    assert value(m, "rankrun_checkpoint_step") == 5


def test_the_copies_give_their_bytes_by_where_once_complete() -> None:
    m = fold([*job(8), kept(5)], Metrics(monotonic=lambda: 200.0))
    m.on_event(written(5, "neighbour", size=4_200_000_001))
    assert kept_bytes(m) == {"memory": 4_200_000_000, "neighbour": 4_200_000_001, "disk": None}
    m.on_event(written(5, "disk", state="abandoned", size=7))  # never complete: nothing of it shown
    assert kept_bytes(m)["disk"] is None
    m.on_event(written(5, "disk", size=4_200_000_002))
    m.on_event(written(10, "neighbour", size=9))  # the latest copy's
    assert kept_bytes(m) == {"memory": 4_200_000_000, "neighbour": 9, "disk": 4_200_000_002}
    before = m.render()
    m.on_event(event("checkpoint.written", step=11, to="tape", where="x", bytes=5, seconds=1.0, state="complete"))
    m.on_event(event("checkpoint.restored", attempt=1, step=5, source="disk", ranks="0-7", bytes=5, seconds=1.0))
    assert m.render() == before  # a place it does not know, and a restore: no series changes
    assert 'rankrun_checkpoint_bytes{run="job-42",where="neighbour"} 9\n' in before.decode()


CATEGORIES = ("productive", "waiting", "startup", "restart", "stall", "lost")


def job_seconds(metrics: Metrics) -> dict[str, float | None]:
    """``rankrun_job_seconds_total`` by its category label, as a scraper reads it (one scrape)."""
    found = samples(metrics)
    return {c: found.get(("rankrun_job_seconds_total", frozenset({"run": RUN, "category": c}.items())))
            for c in CATEGORIES}


def seconds(**parts: float) -> dict[str, float]:
    return {c: parts.get(c, 0.0) for c in CATEGORIES}


def restarted_job() -> list[Record]:
    """Attempt 0 (start-up 13-14 s by its first collective, told at 16 s) keeps a step at 19 s and fails at 21 s; the
    restart's attempt 1 starts at 23 s and is stopped by a signal at 25 s, before any sign of training."""
    return [
        event("job.start", nproc_per_node=2, nnodes="1", max_restarts=1, rdzv_backend="c10d", entry="t.py", mono=10.0),
        event("rdzv.round", round=0, nodes=1, world_size=2, group_rank=0, seconds=2.0, mono=12.0),
        event("workers.start", attempt=0, ranks="0-1", pids=[1, 2], mono=13.0),
        event("training", attempt=0, seconds=1.0, mono=16.0),
        kept(5, mono=19.0, ranks="0-1", seconds=0.5),
        event("failure", attempt=0, rank=1, host="h", exit_code=1, signal=None, exception=None, mono=21.0),
        event("workers.end", attempt=0, outcome="failed", mono=21.0),
        event("restart", attempt=1, reason="a worker failed", restarts_left=0, mono=22.0),
        event("workers.start", attempt=1, ranks="0-1", pids=[3, 4], mono=23.0),
        event("job.end", exit_code=143, outcome="interrupted", mono=25.0),
    ]


def test_the_job_seconds_are_six_counters_from_before_the_first_event() -> None:
    m = Metrics(run=RUN, monotonic=lambda: 5.0)
    assert job_seconds(m) == seconds()
    text = m.render().decode()
    assert "# TYPE rankrun_job_seconds_total counter\n" in text
    assert "never less" in text  # the HELP says why a category may hold more than the account now
    assert {f.name: f.type for f in text_string_to_metric_families(text)}["rankrun_job_seconds"] == "counter"


def test_the_job_seconds_are_the_account_at_each_scrape_and_never_go_down() -> None:
    now = [15.0]
    events = restarted_job()
    m = fold(events[:3], Metrics(monotonic=lambda: now[0]))
    assert job_seconds(m) == seconds(waiting=3.0, startup=2.0)  # no sign of training yet: all start-up so far
    now[0] = 18.0
    m.on_event(events[3])  # the first collective, told 2 s after it: 14-18 s was training, not start-up
    assert job_seconds(m) == seconds(waiting=3.0, startup=2.0, productive=4.0)  # start-up shown 2 s: never less
    fold(events[4:7], m)
    now[0] = 22.0  # attempt 0 failed at 21 s, its step kept at 19 s: 19-21 s lost, restarting since
    assert job_seconds(m) == seconds(waiting=3.0, startup=2.0, productive=5.0, lost=2.0, restart=1.0)
    fold(events[7:9], m)
    now[0] = 24.5  # attempt 1 started at 23 s: all start-up so far, 1 + 1.5 s, above the 2 s shown
    assert job_seconds(m) == seconds(waiting=3.0, startup=2.5, productive=5.0, lost=2.0, restart=2.0)
    m.on_event(events[9])  # stopped with no sign of training, in a job that trained: its 2 s start-up, nothing lost
    after = job_seconds(m)
    assert after == seconds(waiting=3.0, startup=3.0, productive=5.0, lost=2.0, restart=2.0)
    now[0] = 100.0  # the job ended: the final account, whatever the clock says
    assert job_seconds(m) == after


def test_after_the_job_ends_an_unscraped_account_is_the_final_one_summing_to_the_wall_time() -> None:
    m = fold(restarted_job(), Metrics(monotonic=lambda: 1000.0))
    shown = job_seconds(m)
    assert shown == seconds(waiting=3.0, startup=3.0, productive=5.0, lost=2.0, restart=2.0)
    assert sum(v for v in shown.values() if v is not None) == 15.0  # job.start at 10 s to job.end at 25 s


def test_a_stall_and_the_time_after_a_success_in_the_job_seconds() -> None:
    m = fold([
        event("job.start", nproc_per_node=1, nnodes="1", max_restarts=0, rdzv_backend="c10d", entry="t.py", mono=0.0),
        event("workers.start", attempt=0, ranks="0", pids=[1], mono=1.0),
        event("training", attempt=0, seconds=0.5, mono=2.0),
        event("stall", ranks="0", title="rankrun: rank 0 stalled", silent=2.0, mono=6.0),  # silent since 4 s
        event("stall.end", ranks="0", seconds=3.0, mono=7.0),
        event("workers.end", attempt=0, outcome="succeeded", mono=9.0),
        event("job.end", exit_code=0, outcome="succeeded", mono=9.5),
    ], Metrics(monotonic=lambda: 50.0))
    assert job_seconds(m) == seconds(waiting=1.0, startup=0.5, productive=5.0, stall=3.0)
