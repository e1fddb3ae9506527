"""The timeline page of a ``--preload`` job: each attempt says whether its workers were forked or started cold, the
preloading process's one import is a bar once per node, and what became of it a mark."""

from __future__ import annotations

import json

import pytest

import timeline_events as job
from rankrun.events.records import Preload, Warm, as_json, from_json
from rankrun.timeline.layout import layout, preload_words, warm_words
from rankrun.timeline.read import Event, check, parse_lines
from rankrun.timeline.render import _shorter, page


def events_of(node: str, rows: list[dict[str, object]]) -> list[Event]:
    return parse_lines(f"{node}.jsonl", [json.dumps(r).encode() + b"\n" for r in rows])


def warm_job() -> list[Event]:
    return events_of(job.A, job.warm_events())


def test_the_events_are_read_and_checked_by_the_records_own_decoder():
    rows = job.warm_events()
    for row in rows:
        assert check(row) is None
    read = warm_job()
    assert [type(e.record).__name__ for e in read if e.name in ("preload", "warm")] == [
        "Preload", "Warm", "Warm", "Preload", "Warm"]
    assert all({k: v for k, v in as_json(e.record).items() if k in e.data} == e.data for e in read if e.record is not None)  # what as_json wrote, read back
    preload = next(e for e in read if e.name == "preload")
    assert preload.record == from_json(next(r for r in rows if r["event"] == "preload"))
    assert isinstance(preload.record, Preload) and preload.record.seconds == 2.31
    preload_row, warm_row = (next(r for r in rows if r["event"] == name) for name in ("preload", "warm"))
    assert check({**preload_row, "state": None}) is None  # the page draws what it can of a file with a null
    assert check({k: v for k, v in warm_row.items() if k != "forked"}) == "no 'forked' key in a warm event"
    assert check({**warm_row, "cold": [0, 1]}) == "'cold' is [0, 1], not a string"
    assert isinstance(next(e for e in read if e.name == "warm").record, Warm)


def test_each_attempt_says_whether_its_workers_were_forked_or_started_cold():
    [lane] = layout(warm_job()).lanes
    assert [(bar.style, bar.label) for bar in lane.attempts] == [
        ("failed", "attempt 0 · ranks 0-1 · forked · failed"),
        ("failed", "attempt 1 · ranks 0-1 · forked · failed"),
        ("succeeded", "attempt 2 · ranks 0-1 · cold · succeeded"),
    ]
    # the warm event is shown with the attempt it tells of, on hover
    assert [[e.name for e in bar.events] for bar in lane.attempts] == [["workers.start", "warm", "workers.end"]] * 3
    assert not [m for m in lane.marks if m.kind == "warm"]


def test_an_attempt_without_a_warm_event_is_labelled_as_before():
    rows = [r for r in job.warm_events() if not (r["event"] == "warm" and r["attempt"] == 2)]
    [lane] = layout(events_of(job.A, rows)).lanes
    assert lane.attempts[2].label == "attempt 2 · ranks 0-1 · succeeded"
    assert [e.name for e in lane.attempts[2].events] == ["workers.start", "workers.end"]


def test_the_import_is_a_bar_once_per_node_from_the_jobs_start_as_long_as_it_took():
    """The preloading process starts right after job.start; its ready event is told only with the first attempt."""
    a, b = job.warm_events(job.A), job.warm_events(job.B)
    d = layout(events_of(job.A, a) + events_of(job.B, b))
    for lane in d.lanes:
        imports = [bar for bar in lane.phases if bar.style == "import"]
        assert [bar.label for bar in imports] == ["import torch 2.31 s"]
        [bar] = imports
        start = next(m for m in lane.marks if m.kind == "job.start")
        assert bar.start == pytest.approx(start.t)
        assert bar.end == pytest.approx(start.t + 2.31)  # before the workers, at 2.5 s, with the event
        assert bar.end < lane.attempts[0].start
        assert [e.name for e in bar.events] == ["preload"]
        assert bar.kind == "phase"
    assert d.lanes[1].phases[0].start - d.lanes[0].phases[0].start == pytest.approx(0.02)  # B's clock, 20 ms ahead


def test_the_preloading_process_ended_or_unsafe_is_a_mark_saying_the_workers_start_cold():
    [lane] = layout(warm_job()).lanes
    [mark] = [m for m in lane.marks if m.kind == "preload"]
    assert mark.label == "preload ended, workers cold: killed by SIGKILL"
    assert mark.t == pytest.approx(5.2)  # told with the next attempt's start
    rows = job.warm_events()
    ended = next(i for i, r in enumerate(rows) if r["event"] == "preload" and r["state"] == "ended")
    rows[ended] = {**rows[ended], "state": "unsafe", "why": "a preloaded module left a thread running (Thread-1)"}
    [lane] = layout(events_of(job.A, rows)).lanes
    assert [m.label for m in lane.marks if m.kind == "preload"] == [
        "preload unsafe, workers cold: a preloaded module left a…"]
    rows[ended] = {**rows[ended], "why": ""}
    [lane] = layout(events_of(job.A, rows)).lanes
    assert [m.label for m in lane.marks if m.kind == "preload"] == ["preload unsafe, workers cold"]


@pytest.mark.parametrize(("forked", "cold", "words"), [
    ("0-7", "", "forked"), ("", "0-7", "cold"), ("0-2", "3", "3 forked, 1 cold"), ("0,2-3,8-11", "1,4-7", "7 forked, 5 cold"),
    ("", "", "cold"), ("0-x", "", "cold"),
])
def test_warm_words(forked, cold, words):
    row = job.event(job.A, 1.0, "warm", attempt=0, forked=forked, cold=cold, fork_p50=None, fork_max=None)
    assert warm_words(events_of(job.A, [row])[0]) == words


def test_a_warm_event_whose_attempt_has_no_bar_is_a_mark():
    rows = [*job.warm_events()[:-1],
            job.event(job.A, 10.2, "warm", attempt=3, forked="0", cold="1", fork_p50=0.004, fork_max=0.004),
            job.warm_events()[-1]]
    [lane] = layout(events_of(job.A, rows)).lanes
    assert [m.label for m in lane.marks if m.kind == "warm"] == ["attempt 3 1 forked, 1 cold"]


def test_the_page_carries_every_event_and_a_narrow_attempt_keeps_how_it_started():
    html = page(layout(warm_job()))
    assert "attempt 0 · ranks 0-1 · forked · failed" in html  # the bar's tooltip
    assert "import torch 2.31 s" in html
    assert ">preload import</span>" in html  # in the legend
    assert html.count('data-event="') == html.count("data-caption=")
    for row in job.warm_events():
        assert json.dumps(row, ensure_ascii=False, separators=(",", ":")) in html.replace("&quot;", '"')
    assert _shorter("attempt 1 · ranks 0-1 · forked · failed") == [
        "attempt 1 · ranks 0-1 · forked · failed", "attempt 1 · forked · failed", "attempt 1 · failed", "attempt 1"]
    assert _shorter("attempt 1 · ranks 0-1 · failed") == ["attempt 1 · ranks 0-1 · failed", "attempt 1 · failed", "attempt 1"]
    assert _shorter("round 0 · 1 node") == ["round 0 · 1 node", "round 0"]


@pytest.mark.parametrize(("keys", "words"), [
    ({"modules": "torch,numpy"}, "import torch, numpy 2.31 s"), ({"modules": " torch , numpy,"}, "import torch, numpy 2.31 s"),
    ({"modules": None}, "import ? 2.31 s"), ({"seconds": None}, "import torch ?"), ({"seconds": 12.5}, "import torch 12.5 s"),
    ({"state": "ended", "why": None}, "preload ended, workers cold"), ({"state": "resting"}, "preload resting"),
    ({"state": None}, "preload"),
])
def test_what_a_preload_says(keys, words):
    row = {**next(r for r in job.warm_events() if r["event"] == "preload"), **keys}
    assert preload_words(events_of(job.A, [row])[0]) == words


def with_ready(**keys: object) -> list[dict[str, object]]:
    """The job's events with its ready preload event changed."""
    return [{**r, **keys} if r["event"] == "preload" and r["state"] == "ready" else r for r in job.warm_events()]


@pytest.mark.parametrize("seconds", [None, -1.0])
def test_an_import_of_unknown_or_negative_seconds_is_a_bar_of_none(seconds):
    [lane] = layout(events_of(job.A, with_ready(seconds=seconds))).lanes
    [bar] = [bar for bar in lane.phases if bar.style == "import"]
    assert bar.start == bar.end == 0.0  # at the job's start


def test_without_a_job_start_before_it_the_import_ends_when_it_was_told():
    rows = [r for r in with_ready(seconds=2.0) if r["event"] != "job.start"]
    [lane] = layout(events_of(job.A, rows)).lanes
    [bar] = [bar for bar in lane.phases if bar.style == "import"]
    told = next(e for e in events_of(job.A, rows) if e.name == "preload")
    assert bar.end - bar.start == pytest.approx(2.0)
    assert bar.end == pytest.approx(lane.attempts[0].start)  # told with attempt 0's start
    assert [e.data for e in bar.events] == [told.data]


def test_an_import_told_sooner_than_it_could_have_ended_still_lasts_what_it_took():
    rows = with_ready(seconds=3.0)  # longer than from job.start to the event: it began before the job.start written
    [lane] = layout(events_of(job.A, rows)).lanes
    [bar] = [bar for bar in lane.phases if bar.style == "import"]
    start = next(m for m in lane.marks if m.kind == "job.start")
    assert (bar.start - start.t, bar.end - start.t) == (pytest.approx(-0.5), pytest.approx(2.5))  # ends when told


def test_an_attempt_with_no_end_recorded_carries_its_warm_event_and_says_so():
    rows = [r for r in job.warm_events() if not (r["event"] in ("workers.end", "job.end") and r.get("attempt", 2) == 2)]
    [lane] = layout(events_of(job.A, rows)).lanes
    last = lane.attempts[-1]
    assert (last.style, last.label) == ("open", "attempt 2 · ranks 0-1 · cold · no end recorded")
    assert [e.name for e in last.events] == ["workers.start", "warm"]
