"""The event records against the shipped JSON Schema (version 1), their stream, and the rank range strings."""

from __future__ import annotations

import ast
import itertools
import json
import re
import select
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankrun.events import records, schema_path
from rankrun.events.log import _json, encode
from rankrun.events.records import (
    COMMON,
    EVENTS,
    REASON_LIMIT,
    TEXT_LIMIT,
    CheckpointKept,
    CheckpointRestored,
    CheckpointWritten,
    Failure,
    Goodput,
    JobEnd,
    JobStart,
    NodeExcluded,
    NodeLost,
    Preload,
    RdzvRound,
    Record,
    Restart,
    Stall,
    StallEnd,
    Stamp,
    Startup,
    StragglerEvent,
    Training,
    Warm,
    WorkersEnd,
    WorkersStart,
    as_json,
    from_json,
    keys,
)
from rankrun.events.stream import EventStream
from rankrun.ranges import parse_ranges, range_string, runs

pytestmark = pytest.mark.unit

SCHEMA = json.loads(schema_path().read_text())
DOC = Path(__file__).resolve().parents[2] / "docs" / "observing.md"
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

FACTS: list[Record] = [  # one of each event, as a producer builds it (no common fields)
    JobStart(nproc_per_node=8, nnodes="1:2", max_restarts=3, rdzv_backend="c10d", entry="train.py"),
    RdzvRound(round=2, nodes=2, world_size=16, group_rank=1, seconds=0.93),
    WorkersStart(attempt=1, ranks="8-15", pids=(4100, 4101, 4102, 4103, 4104, 4105, 4106, 4107)),
    WorkersEnd(attempt=1, outcome="failed"),
    Failure(attempt=1, rank=9, host="node-b", exit_code=1, signal=None, exception="ValueError: bad batch"),
    Failure(attempt=0, rank=0, host="127.0.0.1", exit_code=None, signal="SIGKILL", exception=None),
    Restart(attempt=2, reason="worker failed", restarts_left=1),
    Stall(ranks="0,2,4", title="rankrun: ranks 0,2,4 made no progress for 300 s", silent=301.5),
    Stall(ranks="0-3", title="rankrun: ranks 0-3 made no progress for 300 s"),
    StallEnd(ranks="0,2,4", seconds=340.25),
    Training(attempt=1, seconds=12.5),
    StragglerEvent(rank=5, where="node-3/10.0.0.13", verdict="named", lag=0.041, share=0.92, collectives=640,
                   line="rankrun: straggler: rank 5 on node-3/10.0.0.13 — the other ranks waited for it in 92 % of 640 "
                        "collectives (median lag +41 ms); CPU 100 %, running"),
    StragglerEvent(rank=5, where="node-3/10.0.0.13", verdict="recovered", lag=None, share=0.81, collectives=0,
                   line="rankrun: straggler: rank 5 on node-3/10.0.0.13 keeps up again: the others no longer wait for it"),
    NodeLost(nodes=("127.0.0.2", "127.0.0.3"), reason="missed its heartbeats"),
    NodeExcluded(nodes=("node-c-77-1a2b3c at 10.0.0.3",), reason="blamed for 2 failures of the job (--max-node-failures 2)"),
    Startup(attempt=0, total=4.2, rendezvous=0.9, spawn=0.1, script_p50=2.1, script_max=3.8, script_slowest=5,
            store_p50=0.2, store_max=0.4, store_slowest=3),
    Startup(attempt=1, total=1.0, rendezvous=0.5, spawn=0.1, script_p50=None, script_max=None, script_slowest=None,
            store_p50=None, store_max=None, store_slowest=None),
    Preload(modules="torch,numpy", seconds=2.31, state="ready"),
    Preload(modules="torch", seconds=2.31, state="unsafe",
            why="a preloaded module left a thread running (Thread-1): this node's workers start cold from now on"),
    Preload(modules="torch", seconds=0.0, state="ended", why="the preloading process was killed by SIGKILL"),
    Warm(attempt=1, forked="8-15", cold="", fork_p50=0.004, fork_max=0.009),
    Warm(attempt=2, forked="8-10", cold="11-15", fork_p50=0.004, fork_max=0.005),
    Warm(attempt=3, forked="", cold="8-15", fork_p50=None, fork_max=None),
    CheckpointKept(step=120, ranks="8-15", bytes=4_200_000_000, seconds=0.61, state="kept", why=None),
    CheckpointKept(step=121, ranks="8-15", bytes=0, seconds=0.0, state="refused",
                   why="rank 11's step 121 (4.2 GB) is not kept: this node has 1.1 GB of room"),
    CheckpointWritten(step=120, to="neighbour", where="10.0.0.14", bytes=4_200_000_000, seconds=3.9, state="complete"),
    CheckpointWritten(step=120, to="disk", where="/ckpt/job-7/step-120", bytes=4_200_000_000, seconds=11.5,
                      state="abandoned"),
    CheckpointRestored(attempt=1, step=120, source="memory", ranks="8-15", bytes=4_200_000_000, seconds=0.61),
    CheckpointRestored(attempt=2, step=120, source="disk", ranks="8-15", bytes=4_200_000_000, seconds=7.25),
    JobEnd(exit_code=0, outcome="succeeded"),
    JobEnd(exit_code=1, outcome="failed", goodput=Goodput(wall_s=40.1, productive_s=35.1, waiting_s=0.0, startup_s=2.5,
                                                          restart_s=2.0, stall_s=0.0, lost_s=0.5)),
]


def _stream() -> EventStream:
    return EventStream("job-7", "127.0.0.1", wall=lambda: 1_767_225_600.25, monotonic=lambda: 812.5)


def _errors(obj: dict[str, object]) -> list[str]:
    return [e.message for e in VALIDATOR.iter_errors(obj)]


def test_the_schema_is_a_valid_draft_2020_12_schema():
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_every_event_of_the_schema_has_a_record_and_a_sample():
    assert {type(f) for f in FACTS} == set(EVENTS)
    assert set(SCHEMA["properties"]["event"]["enum"]) == set(EVENTS.values())
    assert len(SCHEMA["oneOf"]) == len(EVENTS)


def test_the_four_stamp_fields_are_declared_once_and_end_every_record():
    """``Stamp`` says them; each record adds them after its own keys, keyword or position alike."""
    assert COMMON == ("ts", "mono", "run", "node")
    for kind in EVENTS:
        assert issubclass(kind, Stamp)
        assert kind.__match_args__ == (*keys(kind), *COMMON)
    tree = ast.parse(Path(records.__file__).read_text())
    declared = [node.target.id for node in ast.walk(tree) if isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name) and node.target.id in COMMON]
    assert declared == list(COMMON)
    stamped = JobEnd(0, "succeeded", ts=1.5, mono=2.5, run="r", node="n")
    assert (stamped.ts, stamped.mono, stamped.run, stamped.node) == (1.5, 2.5, "r", "n")
    assert JobEnd(0, "succeeded") == JobEnd(0, "succeeded", ts=0.0, mono=0.0, run="", node="")


@pytest.mark.parametrize("kind", list(EVENTS), ids=list(EVENTS.values()))
def test_each_event_requires_exactly_its_record_fields(kind):
    """The records and the schema cannot drift: an event's keys are its record's fields, all required, no others."""
    branch = SCHEMA["$defs"]["ev_" + EVENTS[kind].replace(".", "_")]
    expected = ["v", *COMMON, "event", *keys(kind)]
    assert branch["required"] == expected
    assert list(branch["properties"]) == expected
    assert branch["additionalProperties"] is False
    assert branch["properties"]["event"] == {"const": EVENTS[kind]}


@pytest.mark.parametrize("fact", FACTS, ids=lambda f: type(f).__name__)
def test_every_record_serialises_to_a_valid_event(fact):
    obj = as_json(_stream().emit(fact))
    assert _errors(obj) == []
    assert list(obj)[:6] == ["v", "ts", "mono", "run", "node", "event"]
    assert (obj["v"], obj["ts"], obj["mono"], obj["run"], obj["node"]) == (1, 1_767_225_600.25, 812.5, "job-7", "127.0.0.1")
    assert obj["event"] == EVENTS[type(fact)]
    assert json.loads(encode(_stream().emit(fact))) == obj


@pytest.mark.parametrize("fact", FACTS, ids=lambda f: type(f).__name__)
def test_a_wrong_event_fails_validation(fact):
    """The schema is not vacuous: an extra key, a missing key, a wrong type, version or name each fail."""
    good = as_json(_stream().emit(fact))
    own = keys(type(fact))
    extra = {**good, "bogus": 1}
    missing = {k: v for k, v in good.items() if k != own[-1]}
    no_common = {k: v for k, v in good.items() if k != "mono"}
    wrong_type = {**good, own[0]: 3 if isinstance(good[own[0]], str) else "three"}
    for bad in (extra, missing, no_common, wrong_type, {**good, "v": 2}, {**good, "event": "job.begin"},
                {**good, "run": None}, {**good, "ts": "now"}):
        assert _errors(bad), bad
    other = "job.end" if type(fact) is not JobEnd else "job.start"
    assert _errors({**good, "event": other})  # another event's name: its keys are not that event's


@pytest.mark.parametrize(("key", "value"), [("ranks", "0-7,"), ("ranks", "3-"), ("ranks", "0 1"), ("pids", [1, "2"])])
def test_ranges_and_pids_are_checked(key, value):
    good = as_json(_stream().emit(FACTS[2]))
    assert _errors({**good, key: value})


@pytest.mark.parametrize(("event", "key", "value"), [
    ("workers.end", "outcome", "crashed"), ("job.end", "outcome", "stopped"), ("failure", "signal", "KILL"),
    ("job.start", "nnodes", "1-2"), ("job.start", "nproc_per_node", 0), ("failure", "exception", "x" * (TEXT_LIMIT + 1)),
    ("straggler", "verdict", "slow"), ("straggler", "share", 1.5), ("straggler", "lag", -0.1), ("straggler", "collectives", -1),
    ("straggler", "line", "x" * (TEXT_LIMIT + 1)), ("straggler", "rank", None),
    ("preload", "state", "cold"), ("preload", "seconds", -0.5), ("preload", "seconds", None), ("preload", "why", None),
    ("preload", "why", "x" * (TEXT_LIMIT + 1)), ("preload", "modules", ["torch"]),
    ("warm", "forked", "0-3,"), ("warm", "cold", [0, 1]), ("warm", "fork_p50", -0.001), ("warm", "fork_max", "4 ms"),
    ("warm", "attempt", -1),
    ("checkpoint.kept", "state", "dropped"), ("checkpoint.kept", "step", -1), ("checkpoint.kept", "bytes", 1.5),
    ("checkpoint.kept", "ranks", "0-3,"), ("checkpoint.kept", "seconds", -0.1), ("checkpoint.kept", "why", 3),
    ("checkpoint.kept", "why", "x" * (TEXT_LIMIT + 1)),
    ("checkpoint.written", "to", "peer"), ("checkpoint.written", "state", "kept"), ("checkpoint.written", "where", None),
    ("checkpoint.written", "where", "/" * (TEXT_LIMIT + 1)), ("checkpoint.written", "bytes", -1),
    ("checkpoint.restored", "source", "tmpfs"), ("checkpoint.restored", "attempt", -1), ("checkpoint.restored", "step", None),
    ("checkpoint.restored", "ranks", [0, 1]), ("checkpoint.restored", "seconds", "0.6 s"),
    ("stall", "silent", -1.0), ("stall", "silent", "5 s"), ("stall.end", "seconds", -0.5), ("stall.end", "ranks", "0-"),
    ("training", "attempt", -1), ("training", "seconds", None),
    ("job.end", "goodput", {"wall_s": 1.0}), ("job.end", "goodput", {"wall_s": 1.0, "productive_s": -1.0, "waiting_s": 0.0,
                                                                       "startup_s": 0.0, "restart_s": 0.0, "stall_s": 0.0,
                                                                       "lost_s": 0.0}),
    ("job.end", "goodput", 0.87),
])
def test_values_outside_an_events_domain_fail(event, key, value):
    good = next(as_json(_stream().emit(f)) for f in FACTS if EVENTS[type(f)] == event)
    assert _errors({**good, key: value})


def test_the_stream_stamps_every_fact_and_hands_it_to_each_consumer_in_order():
    seen: list[tuple[str, Record]] = []

    class Tap:
        def __init__(self, name: str) -> None:
            self.name = name

        def on_event(self, event: Record) -> None:
            seen.append((self.name, event))

    ticks = iter(range(100))
    stream = EventStream("r", "n", [Tap("a")], wall=lambda: 1000.0 + next(ticks), monotonic=lambda: 5.0)
    stream.add(Tap("b"))
    given_fact = JobEnd(exit_code=1, outcome="failed", ts=1.0, mono=2.0, run="not mine", node="elsewhere")
    out = stream.emit(given_fact)
    assert out == JobEnd(exit_code=1, outcome="failed", ts=1000.0, mono=5.0, run="r", node="n")
    assert seen == [("a", out), ("b", out)]
    assert stream.emit(WorkersEnd(attempt=0, outcome="succeeded")).ts == 1001.0
    assert EventStream("r", "n").wanted is False
    assert stream.wanted is True
    other = EventStream("r2", "n")  # instance-scoped: a second job's stream feeds none of the first's consumers
    other.emit(JobEnd(exit_code=0, outcome="succeeded"))
    assert len(seen) == 4


@pytest.mark.parametrize("fact", FACTS, ids=lambda f: type(f).__name__)
def test_from_json_reads_back_what_as_json_wrote(fact):
    event = _stream().emit(fact)
    assert from_json(json.loads(encode(event))) == event


@pytest.mark.parametrize("change", [
    {"v": 2}, {"event": "job.begin"}, {"bogus": 1}, {"exit_code": None, "outcome": None, "extra": 1},
])
def test_from_json_refuses_what_is_not_an_event(change):
    obj = {**as_json(_stream().emit(JobEnd(exit_code=0, outcome="succeeded"))), **change}
    with pytest.raises(ValueError, match=r"event|v=|job\.end"):
        from_json(obj)


@pytest.mark.parametrize("dropped", ["exit_code", "mono"])
def test_from_json_refuses_an_event_with_a_key_missing(dropped):
    obj = as_json(_stream().emit(JobEnd(exit_code=0, outcome="succeeded")))
    del obj[dropped]
    with pytest.raises(ValueError, match=dropped):
        from_json(obj)


def test_a_users_long_text_is_cut_so_a_line_fits_a_pipe_whole():
    """The exception and the stall title come from the user's program, a straggler's line names a host: cut to
    TEXT_LIMIT characters, the line stays within PIPE_BUF even for the widest characters JSON writes (a control
    character is six bytes, \\u0000)."""
    for text in ("x" * 10_000, "\x00" * 10_000, "\U0001f525" * 10_000):
        for fact, key in ((Failure(attempt=0, rank=16383, host="h" * 64, exit_code=1, signal=None, exception=text),
                           "exception"),
                          (Stall(ranks="0-16383", title=text), "title"),
                          (StragglerEvent(rank=16383, where="h" * 253, verdict="named", lag=None, share=1.0,
                                          collectives=0, line=text), "line"),
                          (Preload(modules="m" * 64, seconds=0.0, state="ended", why=text), "why"),
                          (CheckpointKept(step=2**62, ranks="0-16383", bytes=2**62, seconds=1e9, state="refused",
                                          why=text), "why"),
                          (CheckpointWritten(step=2**62, to="disk", where=text, bytes=2**62, seconds=1e9,
                                             state="abandoned"), "where")):
            obj = as_json(_stream().emit(fact))
            cut = obj[key]
            assert len(cut) == TEXT_LIMIT
            assert cut == text[: TEXT_LIMIT - 1] + "…"
            assert _errors(obj) == []
            assert len(encode(_stream().emit(fact))) <= select.PIPE_BUF
    exact = "y" * TEXT_LIMIT
    assert as_json(Stall(ranks="0", title=exact))["title"] == exact


def test_a_restarts_reason_repeats_the_exception_and_is_cut_shorter():
    for text in ("x" * 10_000, "\x00" * 10_000, "\U0001f525" * 10_000):
        obj = as_json(_stream().emit(Restart(attempt=1, reason=text, restarts_left=0)))
        assert obj["reason"] == text[: REASON_LIMIT - 1] + "…"
        assert _errors(obj) == []
    exact = "r" * REASON_LIMIT
    assert as_json(Restart(attempt=1, reason=exact, restarts_left=0))["reason"] == exact
    longer = as_json(Restart(attempt=1, reason=exact, restarts_left=0)) | {"reason": exact + "r"}
    assert _errors(longer)  # the schema says so too


def test_a_line_is_one_line_of_compact_utf8():
    event = _stream().emit(Failure(attempt=0, rank=1, host="h", exit_code=1, signal=None,
                                   exception="RuntimeError: first\nsecond é"))
    line = encode(event)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert b": " not in line.replace(b"RuntimeError: ", b"")  # no pretty-printing
    assert "é".encode() in line


def test_the_documented_events_are_the_schemas():
    """docs/observing.md: its example lines are valid events, and its table gives each event with all its keys."""
    text = DOC.read_text()
    example = [json.loads(line) for line in text.splitlines() if line.startswith('{"v":1,')]
    assert len(example) >= 8
    for obj in example:
        assert _errors(obj) == []
    assert [from_json(obj) for obj in example]  # and a reader reads them back
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z.]+)` \|.*$", text, re.MULTILINE)}
    for kind, name in EVENTS.items():
        assert name in rows, name
        for key in keys(kind):
            assert f"`{key}`" in rows[name], (name, key)


# ---- range strings


@pytest.mark.parametrize(("ranks", "text"), [
    ([], ""), ([0], "0"), ([0, 1], "0-1"), (range(8), "0-7"), ([0, 2, 4], "0,2,4"), ([11, 8, 9, 10, 0, 1, 2, 3], "0-3,8-11"),
    ([5, 5, 5], "5"), ([0, 1, 3, 4, 6], "0-1,3-4,6"), (range(16384), "0-16383"), ([7, 9, 10], "7,9-10"),
])
def test_range_strings(ranks, text):
    assert range_string(ranks) == text
    assert parse_ranges(text) == sorted(set(ranks))


def test_a_16384_rank_job_is_one_short_run():
    assert range_string(reversed(range(16384))) == "0-16383"
    assert len(parse_ranges("0-16383")) == 16384


@given(st.lists(st.integers(min_value=0, max_value=20_000), max_size=300))
def test_range_strings_round_trip(ranks):
    text = range_string(ranks)
    assert parse_ranges(text) == sorted(set(ranks))
    assert range_string(parse_ranges(text)) == text
    assert re.fullmatch(SCHEMA["$defs"]["ranges"]["pattern"], text)
    runs = [[int(x) for x in item.split("-")] for item in text.split(",")] if text else []
    for before, after in itertools.pairwise(runs):
        assert after[0] > before[-1] + 1  # sorted, and no two runs that touch: each as long as it can be
    assert all(len(run) == 1 or run[0] < run[1] for run in runs)


@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 40)), max_size=30))
def test_parse_ranges_accepts_any_order_and_overlap(spans):
    text = ",".join(f"{a}-{a + n}" if n else str(a) for a, n in spans)
    assert parse_ranges(text) == sorted({r for a, n in spans for r in range(a, a + n + 1)})


@pytest.mark.parametrize("text", ["1-", "-1", "3-1", "3-2", "a", "1,,2", ",", " 1", "1 ", "1-2-3", "\u0661", "+1", "0x1", "1,"])
def test_parse_ranges_refuses_what_is_not_a_range_string(text):
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        parse_ranges(text)


def test_a_negative_rank_has_no_range_string():
    with pytest.raises(ValueError, match="-1"):
        range_string([0, -1])


def test_runs_are_the_runs_as_written_and_refuse_what_parse_ranges_refuses():
    assert runs("") == []
    assert runs("0-7") == [(0, 7)]
    assert runs("0,2-3,9") == [(0, 0), (2, 3), (9, 9)]
    assert runs("0-16383") == [(0, 16383)]  # one run, whatever its size
    for bad in ("3-1", "1-", " 1", "-1", "1,,2"):
        with pytest.raises(ValueError, match="rank"):
            runs(bad)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(), lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=4), max_leaves=12))
def test_the_encoder_writes_what_json_dumps_writes(value):
    """The events file is written without importing json (start-up): the same text as json.dumps, every time."""
    assert _json(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), [1.0, float("nan")], object()])
def test_the_encoder_refuses_what_json_cannot_say(value):
    with pytest.raises(ValueError, match="JSON"):
        _json(value)


def test_the_encoder_names_the_type_it_cannot_say():
    with pytest.raises(ValueError, match=r"^not JSON: bytes$"):
        _json({"k": b"x"})
