"""The timeline page's parts: reading event files (schema 1), the layout (pure), the HTML (escaped), the command's bad input."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

import timeline_events as job
from rankrun.events import schema_path
from rankrun.events.records import COMMON, EVENTS, Failure, from_json, keys
from rankrun.timeline.__main__ import default_output, main
from rankrun.timeline.layout import CHAR_PX, LABEL_PAD_PX, JobEnd, layout, nice_ticks, outcome_words, same_host, stack_labels
from rankrun.timeline.read import KEYS, REQUIRED, BadInput, Event, check, key_table, one_run, parse_lines, read_file
from rankrun.timeline.render import page


def events_of(node: str, rows: list[dict[str, object]] | None = None) -> list[Event]:
    rows = job.node_events(node) if rows is None else rows
    return parse_lines(f"{node}.jsonl", [json.dumps(r).encode() + b"\n" for r in rows])


def both() -> list[Event]:
    return events_of(job.A) + events_of(job.B)


def lane(drawing, node):
    return next(ln for ln in drawing.lanes if ln.node == node)


# -- layout


def test_a_lane_per_node_with_its_attempts_as_bars_in_outcome():
    d = layout(both())
    assert [ln.node for ln in d.lanes] == [job.A, job.B]
    a, b = lane(d, job.A), lane(d, job.B)
    assert [(bar.style, bar.label) for bar in a.attempts] == [
        ("failed", "attempt 0 · ranks 0-1 · failed"), ("succeeded", "attempt 1 · ranks 0-1 · succeeded")]
    assert [bar.style for bar in b.attempts] == ["stopped", "succeeded"]
    assert (a.ranks, b.ranks) == ("0-1", "2-3")
    assert d.run == job.RUN


def test_nodes_are_aligned_on_the_wall_clock_and_drawn_on_their_own_monotonic_clock():
    d = layout(both())
    a, b = lane(d, job.A), lane(d, job.B)
    # A's job.start is t = 0; B's events are 20 ms later by the wall clock than by A's (its clock runs ahead)
    assert d.started == pytest.approx(job.WALL0)
    assert a.attempts[0].start == pytest.approx(0.95)
    assert b.attempts[0].start == pytest.approx(0.97)
    # durations are the monotonic differences, exactly
    assert a.attempts[1].end - a.attempts[1].start == pytest.approx(19.0 - 9.55)
    assert d.span == pytest.approx(19.06 + 0.02)  # B's job.end, the last thing drawn


def test_a_wall_clock_step_in_the_middle_of_a_node_moves_nothing():
    rows = job.node_events(job.A)
    for row in rows[5:]:
        row["ts"] = float(row["ts"]) + 3600.0  # NTP stepped the clock an hour forward after attempt 0's end
    stepped = layout(events_of(job.A, rows) + events_of(job.B))
    steady = layout(both())
    def times(d):
        a = lane(d, job.A)
        return [(b.start, b.end) for b in a.attempts + a.rounds + a.phases] + [m.t for m in a.marks]

    assert times(stepped) == times(steady)
    assert stepped.span == pytest.approx(steady.span)


def test_rounds_end_where_they_formed_after_the_seconds_they_took():
    a = lane(layout(both()), job.A)
    r0, r1 = a.rounds
    assert (r0.label, r1.label) == ("round 0 · 3 nodes · world 6", "round 1 · 2 nodes · world 4")
    assert r1.end - r1.start == pytest.approx(3.15)
    assert r1.end == pytest.approx(a.attempts[1].start - 0.1)  # formed 0.1 s before the workers started


def test_start_up_phases_end_their_spawn_where_the_workers_started():
    a = lane(layout(both()), job.A)
    rdzv, spawn, up = a.phases[:3]
    assert (rdzv.style, spawn.style, up.style) == ("rendezvous", "spawn", "workers")
    assert spawn.end == pytest.approx(a.attempts[0].start)
    assert spawn.end - spawn.start == pytest.approx(0.1)
    assert rdzv.end - rdzv.start == pytest.approx(0.8)
    assert up.end - rdzv.start == pytest.approx(3.1)  # the whole start-up, from the rendezvous's beginning
    assert up.label == "workers up: script max 2.40 s (rank 1), store max 0.50 s"
    assert len(a.phases) == 6  # both attempts


def test_start_up_of_an_attempt_without_workers_start_ends_at_its_event():
    rows = [r for r in job.node_events(job.A) if not (r["event"] == "workers.start" and r["attempt"] == 1)]
    a = lane(layout(events_of(job.A, rows)), job.A)
    startup = next(e for e in events_of(job.A, rows) if e.name == "startup" and e.integer("attempt") == 1)
    assert a.phases[-1].end - a.phases[-1].events[0].mono == pytest.approx(a.phases[0].end - (startup.mono - 12.7 + 0.85))


def test_the_failure_restart_exclusion_and_stall_are_marks_with_their_words():
    d = layout(both())
    labels = {(ln.node, m.kind): m.label for ln in d.lanes for m in ln.marks}
    assert labels[job.A, "failure"] == "rank 1 failed: ValueError: bad lr"
    assert labels[job.B, "failure"] == "rank 1 failed: ValueError: bad lr"  # the root cause is on every node
    assert labels[job.A, "restart"] == "restart → attempt 1 (2 left)"
    assert labels[job.A, "node.lost"] == "lost: 127.0.0.4"
    assert labels[job.B, "stall"] == "stall: ranks 3"
    assert (job.A, "stall") not in labels
    assert labels[job.A, "job.end"] == "job end: succeeded (exit 0)"
    assert not any(m.kind in ("workers.start", "workers.end", "rdzv.round", "startup") for ln in d.lanes for m in ln.marks)
    stall = next(m for m in lane(d, job.B).marks if m.kind == "stall")
    assert stall.t == pytest.approx(15.02)


@pytest.mark.parametrize(("keys", "words"), [
    ({"exception": None, "signal": "SIGKILL", "exit_code": -9}, "rank 1 killed by SIGKILL"),
    ({"exception": "ValueError: bad lr", "signal": "SIGABRT", "exit_code": None}, "rank 1 killed by SIGABRT: ValueError: bad lr"),
    ({"exception": None, "signal": None, "exit_code": 3}, "rank 1 exited with 3"),
    ({"exception": None, "signal": None, "exit_code": None, "rank": None}, "a worker failed"),
    ({"exception": "RuntimeError: " + "x" * 80}, "rank 1 failed: RuntimeError: " + "x" * 26 + "…"),
])
def test_a_failure_says_what_is_known(keys, words):
    rows = job.node_events(job.A)
    rows[4].update(keys)
    mark = next(m for m in layout(events_of(job.A, rows)).lanes[0].marks if m.kind == "failure")
    assert mark.label == words
    assert len(mark.label) <= 56


def test_one_root_cause_per_failed_attempt_however_many_nodes_report_it():
    d = layout(both())
    assert [e.integer("attempt") for e in d.root_causes] == [0]
    assert d.summary == (
        "2 nodes · world size 4 · 2 attempts · 1 restart · 1 stall report · lost: 127.0.0.4 · succeeded (exit 0) after 19.1 s",
        "attempt 0: rank 1 failed: ValueError: bad lr on 127.0.0.2 → restart as attempt 1 (worker failed)",
    )


def test_the_header_tells_the_jobs_ending_not_the_last_files_whatever_their_order():
    # an excluded node exits 4 at 0.1 s while the job goes on and succeeds: it is named apart, not the job's outcome
    excluded = events_of(job.EXCLUDED, job.excluded_events())
    first, last = layout(excluded + both()), layout(both() + excluded)
    assert first.summary == last.summary
    assert first.summary[0].endswith(" · lost: 127.0.0.4 · succeeded (exit 0) after 19.1 s; excluded, exit 4: 127.0.0.5")
    assert [e.node for e in first.endings] == [e.node for e in last.endings] == [job.A, job.EXCLUDED]


def test_the_jobs_span_runs_from_the_earliest_start_to_the_latest_end_of_any_node():
    a = job.node_events(job.A)
    b = [*job.node_events(job.B)[:-1], job.event(job.B, 25.0, "job.end", exit_code=0, outcome="succeeded")]
    d = layout(events_of(job.A, a) + events_of(job.B, b))
    assert d.summary[0].endswith(" · succeeded (exit 0) after 25.0 s")  # 0.0 on A to 25.0 (and B's 20 ms) on B


def test_nodes_that_ended_differently_are_each_named_by_their_ending():
    interrupted = [*job.node_events(job.B)[:-1], job.event(job.B, 19.06, "job.end", exit_code=130, outcome="interrupted")]
    killed = job.node_events(job.A)[:-1]  # its launcher was killed: no job.end
    d = layout(events_of(job.B, interrupted) + events_of(job.A))
    assert d.summary[0].endswith(" · nodes ended differently after 19.1 s: succeeded (exit 0) on 127.0.0.2;"
                                 " interrupted (exit 130) on 127.0.0.3")
    assert layout(events_of(job.A, killed) + events_of(job.B)).summary[0].endswith(
        " · succeeded (exit 0) after 19.1 s; no job.end recorded on 127.0.0.2")


def job_end_of(node: str, code: int, outcome: str) -> Event:
    return Event(f"{node}.jsonl", 9, {"v": 1, "ts": 0.0, "mono": 0.0, "run": job.RUN, "node": node, "event": "job.end",
                                      "exit_code": code, "outcome": outcome})


@pytest.mark.parametrize(("finals", "words"), [
    ([("n1", 4, "error"), ("n2", 4, "error")], "error (exit 4) after 2.50 s"),  # all excluded: that is how the job ended
    ([("n4", 1, "failed"), ("n3", 130, "interrupted"), ("n2", 1, "failed"), ("n8", 0, "succeeded"), ("n5", 4, "error"),
      ("n6", None, ""), ("n0", 4, "error"), ("n7", None, "")],
     "nodes ended differently after 2.50 s: succeeded (exit 0) on n8; failed (exit 1) on n2, n4;"
     " interrupted (exit 130) on n3; excluded, exit 4: n0, n5; no job.end recorded on n6, n7"),
])
def test_the_outcome_groups_nodes_by_their_ending_in_order_of_exit_code_then_name(finals, words):
    ends = sorted((node, None if code is None else job_end_of(node, code, outcome)) for node, code, outcome in finals)
    assert outcome_words(JobEnd(tuple(ends), 2.5)) == words


def test_an_attempt_without_an_end_runs_to_the_last_event_and_says_so():
    rows = job.node_events(job.A)[:-2]  # the launcher was killed: no workers.end of attempt 1, no job.end
    d = layout(events_of(job.A, rows))
    last = d.lanes[0].attempts[-1]
    assert (last.style, last.label) == ("open", "attempt 1 · ranks 0-1 · no end recorded")
    assert last.end == pytest.approx(d.span)  # the startup event, the lane's last
    assert d.summary[0].endswith("no job.end recorded (still running, or its launcher was killed)")


def test_an_attempt_whose_end_is_missing_stops_where_the_next_one_starts():
    rows = [r for r in job.node_events(job.A) if not (r["event"] == "workers.end" and r["attempt"] == 0)]
    first, second = layout(events_of(job.A, rows)).lanes[0].attempts
    assert (first.style, first.end) == ("open", pytest.approx(second.start))
    assert (second.style, second.end - second.start) == ("succeeded", pytest.approx(19.0 - 9.55))


def test_an_event_this_reader_does_not_know_is_a_plain_mark():
    rows = job.node_events(job.A)
    rows.insert(3, {**rows[2], "event": "health.check", "ok": True})
    marks = layout(events_of(job.A, rows)).lanes[0].marks
    assert [m.label for m in marks if m.kind == "health.check"] == ["health.check"]


def test_facts_of_the_whole_job_are_labelled_once_and_the_root_cause_on_its_node_too():
    d = layout(both())
    shown = {(ln.node, m.kind): m.row >= 0 for ln in d.lanes for m in ln.marks}
    assert shown == {
        (job.A, "job.start"): True, (job.A, "failure"): True, (job.A, "restart"): True, (job.A, "node.lost"): True,
        (job.A, "job.end"): True,
        (job.B, "job.start"): True, (job.B, "failure"): False, (job.B, "restart"): False, (job.B, "node.lost"): False,
        (job.B, "stall"): True, (job.B, "job.end"): True,
    }
    assert lane(d, job.B).marks[1].label == "rank 1 failed: ValueError: bad lr"  # still its words, for its tooltip
    # the failing rank on the second lane's node: the root cause is labelled there as well
    rows = {node: [{**r, "host": job.B} if r["event"] == "failure" else r for r in job.node_events(node)] for node in (job.A, job.B)}
    d = layout(events_of(job.A, rows[job.A]) + events_of(job.B, rows[job.B]))
    assert [m.row >= 0 for ln in d.lanes for m in ln.marks if m.kind == "failure"] == [True, True]
    # a restart that says something else on the second node is labelled there too
    rows = {node: job.node_events(node) for node in (job.A, job.B)}
    rows[job.B][6]["restarts_left"] = 1
    d = layout(events_of(job.A, rows[job.A]) + events_of(job.B, rows[job.B]))
    assert [m.row >= 0 for ln in d.lanes for m in ln.marks if m.kind == "restart"] == [True, True]


@pytest.mark.parametrize(("node", "host", "same"), [
    ("127.0.0.2", "127.0.0.2", True), ("127.0.0.2", "127.0.0.3", False), ("gpu7/10.0.0.7", "10.0.0.7", True),
    ("gpu7/10.0.0.7", "gpu7", True), ("gpu7/10.0.0.7", "gpu", False), ("127.0.0.2", None, False),
])
def test_a_failures_host_is_matched_to_its_lane(node, host, same):
    assert same_host(node, host) is same


def test_labels_that_would_overlap_go_to_further_rows_and_turn_left_at_the_edge():
    w = 10 * CHAR_PX + LABEL_PAD_PX  # a 10-character label's width
    assert stack_labels([(0, 10), (w, 10)], 1000) == [(0, True), (0, True)]  # touching, not overlapping
    assert stack_labels([(0, 10), (w - 1, 10), (2 * w - 2, 10)], 1000) == [(0, True), (1, True), (0, True)]
    assert stack_labels([(1000 - w, 10)], 1000) == [(0, True)]
    assert stack_labels([(1000 - w + 1, 10)], 1000) == [(0, False)]  # would cross the edge: runs left of its mark
    assert stack_labels([(100, 10), (1000 - w + 1, 10), (900, 3)], 1000) == [(0, True), (0, False), (1, True)]


def test_marks_of_the_sample_job_are_stacked_apart():
    a = lane(layout(both(), width_px=700), job.A)
    by_kind = {m.kind: m for m in a.marks}
    assert by_kind["failure"].row != by_kind["restart"].row  # 0.1 s apart: one above the other
    assert min(m.row for m in a.marks) == 0
    assert a.label_rows == 1 + max(m.row for m in a.marks)


@pytest.mark.parametrize(("span", "ticks"), [
    (19.0, [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]), (10.0, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), (0.35, [0, 0.05 * 1, 0.1, 0.15,
    0.2, 0.25, 0.3, 0.35]), (3600.0, [0, 500, 1000, 1500, 2000, 2500, 3000, 3500])])
def test_ticks_are_round_numbers(span, ticks):
    assert nice_ticks(span) == pytest.approx(ticks)


# -- reading


@pytest.mark.parametrize(("line", "problem"), [
    (b"{nope", "not JSON (Expecting property name enclosed in double quotes)"),
    (b"[1, 2]", "not a schema-1 event: not a JSON object"),
    (b'{"v": 2}', "not a schema-1 event: not schema version 1 (v: 2)"),
    (b'{"v": true}', "not a schema-1 event: not schema version 1 (v: true)"),
    (b"\xff\xfe{}", "not UTF-8 text"),
])
def test_a_line_that_is_no_event_is_named_by_file_and_line(line, problem):
    good = json.dumps(job.node_events(job.A)[0]).encode()
    with pytest.raises(BadInput) as err:
        parse_lines("a.jsonl", [good, b"\n", line])
    assert str(err.value) == f"a.jsonl:3: {problem}"


@pytest.mark.parametrize(("change", "problem"), [
    ({"ts": None}, "'ts' is null, not a finite number"),
    ({"mono": float("nan")}, "'mono' is NaN, not a finite number"),
    ({"run": 7}, "'run' is 7, not a string"),
    ({"attempt": True}, "'attempt' is true, not an integer"),
    ({"attempt": None}, "'attempt' is null, not an integer"),
    ({"rank": "1"}, "'rank' is \"1\", not an integer"),
    ({"exception": ["ValueError"]}, "'exception' is [\"ValueError\"], not a string"),
])
def test_keys_of_the_wrong_type_are_named(change, problem):
    failure = {**job.node_events(job.A)[4], **change}
    assert check(failure) == problem


def test_missing_keys_are_named_and_null_is_allowed_where_the_schema_says_unknown():
    failure = job.node_events(job.A)[4]
    assert check({k: v for k, v in failure.items() if k != "node"}) == "no 'node' key"
    assert check({k: v for k, v in failure.items() if k != "exception"}) == "no 'exception' key in a failure event"
    assert check({**failure, "rank": None, "host": None, "exception": None}) is None
    lost = job.node_events(job.A)[7]
    assert check({**lost, "nodes": ["a", 1]}) == "'nodes' is [\"a\", 1], not a list of strings"
    assert all(check(row) is None for node in (job.A, job.B) for row in job.node_events(node))


def test_the_keys_checked_are_the_schemas_and_the_records():
    """The reader's table is read from the shipped schema: a key the schema gains is checked too, and the table holds
    every record's own keys in order, null allowed but where lanes are built on them."""
    assert set(KEYS) == set(EVENTS.values())
    for kind, name in EVENTS.items():
        assert list(KEYS[name]) == list(keys(kind))
        assert [k for k, kind_ in KEYS[name].items() if not kind_.endswith("?")] == [k for k in keys(kind) if k in REQUIRED]
    schema = json.loads(schema_path().read_text())
    common, _ = key_table(schema)
    assert list(common) == ["v", *COMMON, "event"]
    schema["$defs"]["ev_stall"]["properties"]["pids"] = {"type": "array", "items": {"type": "integer"}}
    schema["$defs"]["ev_stall"]["properties"]["attempt"] = {"type": ["integer", "null"]}
    assert key_table(schema)[1]["stall"] == {"ranks": "str?", "title": "str?", "silent": "num?", "pids": "ints?", "attempt": "int"}


def test_each_line_is_read_by_the_records_own_decoder():
    """A known event's record is what records.from_json reads from its line (a key a newer producer added stays in the
    object shown, not in the record); an event this schema does not list keeps its object only."""
    rows = job.node_events(job.A)
    failure = {**rows[4], "added_later": 1}
    [known, unknown] = events_of(job.A, [failure, {**rows[0], "event": "something.new"}])
    assert known.record == from_json(rows[4])
    assert isinstance(known.record, Failure) and known.record.rank == rows[4]["rank"]
    assert known.data == failure
    assert (known.ts, known.mono, known.run, known.node) == (rows[4]["ts"], rows[4]["mono"], rows[4]["run"], job.A)
    assert unknown.record is None
    assert (unknown.name, unknown.node) == ("something.new", job.A)


def test_files_empty_missing_or_of_two_runs_are_bad_input(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(BadInput, match=r"^.*empty.jsonl: no events in the file$"):
        read_file(str(tmp_path / "empty.jsonl"))
    with pytest.raises(BadInput, match=r"^.*gone.jsonl: cannot read: No such file or directory$"):
        read_file(str(tmp_path / "gone.jsonl"))
    other = events_of(job.B, [{**row, "run": "job-2"} for row in job.node_events(job.B)])
    with pytest.raises(BadInput) as err:
        one_run(events_of(job.A) + other, None)
    assert str(err.value) == ("127.0.0.3.jsonl:1: run 'job-2', but 127.0.0.2.jsonl:1 is run 'job-7f3a'; choose one with --run")
    assert one_run(events_of(job.A) + other, "job-2") == other
    with pytest.raises(BadInput, match=r"^--run job-3: no events of that run \(runs there: job-2, job-7f3a\)$"):
        one_run(events_of(job.A) + other, "job-3")


# -- the page


class _Elements(HTMLParser):
    """Every start tag with its attributes, and the text inside <script> elements."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, _tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)


def parsed(html: str) -> _Elements:
    p = _Elements()
    p.feed(html)
    return p


HOSTILE = '</script><script>alert("x")</script><img src=x onerror=alert(1)> & "quotes" \'too\''


def test_every_string_from_the_events_is_escaped_in_text_and_attributes(tmp_path):
    rows = {node: job.node_events(node, exception=f"ValueError: {HOSTILE}") for node in (job.A, job.B)}
    for row in rows[job.A] + rows[job.B]:
        row["run"] = "<i>job</i>"
        if "ranks" in row:
            row["ranks"] = "<u>0-1</u>"
        if row["event"] == "node.lost":
            row["nodes"] = ["<em>lost</em>"]
    for row in rows[job.B]:
        row["node"] = '127.0.0.3"><b>'
    html = page(layout(events_of(job.A, rows[job.A]) + events_of(job.B, rows[job.B])))
    p = parsed(html)
    plain = parsed(page(layout(both())))
    assert [t for t, _ in p.tags] == [t for t, _ in plain.tags]  # no element more: none came from the events
    assert [t for t, _ in p.tags].count("script") == 1  # the page's own
    assert "alert" not in "".join(p.scripts)
    assert "&lt;/script&gt;&lt;script&gt;alert(&quot;x&quot;)" in html  # shown as text, where it is shown
    assert "&lt;i&gt;job&lt;/i&gt;" in html
    assert "attempt 0 · ranks &lt;u&gt;0-1&lt;/u&gt; · failed" in html
    assert "lost: &lt;em&gt;lost&lt;/em&gt;" in html
    # the hover data is each event exactly as read: the attribute decodes to the original object
    carried = [json.loads(a["data-event"]) for _, a in p.tags if "data-event" in a]
    failures = [e for c in carried for e in (c if isinstance(c, list) else [c]) if e["event"] == "failure"]
    assert {f["exception"] for f in failures} == {f"ValueError: {HOSTILE}"}
    assert {f["node"] for f in failures} == {job.A, '127.0.0.3"><b>'}


def test_every_mark_and_bar_carries_its_events_and_the_page_fetches_nothing():
    html = page(layout(both()))
    p = parsed(html)
    carried = [json.loads(a["data-event"]) for _, a in p.tags if "data-event" in a]
    flat = [e for c in carried for e in (c if isinstance(c, list) else [c])]
    sent = [r for node in (job.A, job.B) for r in job.node_events(node)]
    assert all(row in flat for row in sent)  # every event is on the page, on something it can hover
    assert not [a for _, a in p.tags if {"src", "href"} & set(a)]
    assert "url(" not in html
    assert "@import" not in html
    titles = [t for t, _ in p.tags if t == "title"]
    parts = [a for t, a in p.tags if t == "rect" and a.get("class") == "part"]
    assert len(parts) == 5 + 6  # the nodes' goodput parts that are not empty: 127.0.0.2 had no stall
    # the page's, a native tooltip per mark and bar, per node's name, and per goodput part
    assert len(titles) == 1 + len(carried) + 2 + len(parts)


def test_the_panel_opens_on_the_root_cause():
    html = page(layout(both()))
    panel = html.split('<pre id="event">', 1)[1].split("</pre>", 1)[0]
    assert json.loads(panel.replace("&quot;", '"')) == job.node_events(job.A)[4]


def test_the_panel_of_a_job_without_failures_opens_on_its_ending_whatever_the_files_order():
    ok = [r for r in job.node_events(job.A) if r["event"] not in ("failure", "restart")]
    for events in (events_of(job.A, ok) + events_of(job.EXCLUDED, job.excluded_events()),
                   events_of(job.EXCLUDED, job.excluded_events()) + events_of(job.A, ok)):
        html = page(layout(events))
        panel = html.split('<pre id="event">', 1)[1].split("</pre>", 1)[0]
        assert [json.loads(p.replace("&quot;", '"')) for p in panel.split("\n\n")] == [ok[-1], job.excluded_events()[-1]]


# -- the command


def test_the_command_writes_the_page_next_to_the_first_file_by_default(tmp_path, capsys):
    paths = job.write_job(tmp_path)
    assert main([str(p) for p in paths]) == 0
    out = tmp_path / "node-a.html"
    assert capsys.readouterr().out == f"rankrun.timeline: wrote {out} (27 events, 2 lanes)\n"
    assert job.RUN in out.read_text()
    assert default_output("x/job.html") == default_output("x/job.html.html").with_name("job.html.html")


@pytest.mark.parametrize(("args", "message"), [
    ([], "the following arguments are required: EVENTS (usage: python -m rankrun.timeline EVENTS... [-o OUT.html] [--run RUN])"),
    (["{a}", "--bogus"], "unrecognized arguments: --bogus (usage: python -m rankrun.timeline EVENTS... [-o OUT.html] [--run RUN])"),
    (["{a}", "{tmp}/nowhere.jsonl"], "{tmp}/nowhere.jsonl: cannot read: No such file or directory"),
    (["{a}", "{bad}"], "{bad}:2: not a schema-1 event: no 'outcome' key in a job.end event"),
    (["{a}", "-o", "{tmp}/no/such/dir/out.html"], "-o {tmp}/no/such/dir/out.html: cannot write: No such file or directory"),
])
def test_bad_input_is_one_line_naming_it_and_exit_2(tmp_path, capsys, args, message):
    a, _ = job.write_job(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(job.node_events(job.A)[0]) + "\n" + json.dumps({**job.node_events(job.A)[-1], "outcome": 1})[:-1]
                   .replace('"outcome": 1', '"outcom": 1') + "}\n")
    fill = {"a": a, "bad": bad, "tmp": tmp_path}
    assert main([arg.format(**fill) for arg in args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"rankrun.timeline: {message.format(**fill)}\n"
    assert not (tmp_path / "node-a.html").exists()


def test_an_exclusion_is_a_job_wide_mark_and_in_the_summary():
    excluded = "h-7-1a2b3c at 127.0.0.5"
    rows = [*job.node_events(job.A)]
    rows.insert(8, job.event(job.A, 9.41, "node.excluded", nodes=[excluded], reason="blamed for 2 failures of the job"))
    d = layout(events_of(job.A, rows))
    (mark,) = [m for m in lane(d, job.A).marks if m.kind == "node.excluded"]
    assert mark.label == f"excluded: {excluded}"
    assert f"excluded: {excluded}" in d.summary[0]
    assert "node excluded" in page(d)


def straggler(node: str, t: float, rank: int, verdict: str = "named", lag: float | None = 0.041) -> dict[str, object]:
    """A straggler verdict as every node writes it: rank ``rank`` on 127.0.0.3 (the second node)."""
    where = job.B
    line = (f"rankrun: straggler: rank {rank} on {where} keeps up again: the others no longer wait for it"
            if verdict == "recovered" else f"rankrun: straggler: rank {rank} on {where} — the other ranks waited for it ...")
    return job.event(node, t, "straggler", rank=rank, where=where, verdict=verdict, lag=lag, share=0.92,
                     collectives=0 if lag is None else 640, line=line)


def with_stragglers(node: str) -> list[dict[str, object]]:
    """The sample job with, in attempt 1, rank 3 named (+41 ms), then recovered, then rank 2 named on stack samples."""
    rows = [*job.node_events(node), straggler(node, 13.0, 3), straggler(node, 14.0, 3, "recovered"),
            straggler(node, 16.0, 2, lag=None)]
    return sorted(rows, key=lambda r: float(r["mono"]))


def test_a_straggler_named_and_recovered_is_a_job_wide_mark_and_counted_in_the_summary():
    d = layout(events_of(job.A, with_stragglers(job.A)) + events_of(job.B, with_stragglers(job.B)))
    a, b = lane(d, job.A), lane(d, job.B)
    assert [(m.label, m.row >= 0) for m in a.marks if m.kind == "straggler"] == [
        ("straggler: rank 3 on 127.0.0.3 (+41 ms)", True), ("straggler recovered: rank 3", True),
        ("straggler: rank 2 on 127.0.0.3", True)]  # judged on stack samples: no lag to give
    # every node writes each verdict: labelled on the first lane, the mark alone on the others
    assert [(m.label, m.row >= 0) for m in b.marks if m.kind == "straggler"] == [
        ("straggler: rank 3 on 127.0.0.3 (+41 ms)", False), ("straggler recovered: rank 3", False),
        ("straggler: rank 2 on 127.0.0.3", False)]
    assert next(m for m in a.marks if m.kind == "straggler").t == pytest.approx(13.0)
    assert d.summary[0] == ("2 nodes · world size 4 · 2 attempts · 1 restart · 1 stall report · straggler named 2 times:"
                            " ranks 2, 3 · lost: 127.0.0.4 · succeeded (exit 0) after 19.1 s")
    one = layout(events_of(job.A, [r for r in with_stragglers(job.A) if r.get("rank") != 2 or r["event"] != "straggler"]))
    assert "· straggler named once: rank 3 ·" in one.summary[0]
    assert "straggler" not in layout(both()).summary[0]


@pytest.mark.parametrize(("keys", "words"), [
    ({"lag": 0.0042}, "straggler: rank 3 on 127.0.0.3 (+4.2 ms)"),
    ({"lag": 1.2}, "straggler: rank 3 on 127.0.0.3 (+1.20 s)"),
    ({"rank": None, "where": None}, "straggler (+41 ms)"),
    ({"verdict": "recovered", "rank": None}, "straggler recovered"),
    ({"where": "node-with-a-very-long-name-0001.cluster.example/10.0.0.13"},
     "straggler: rank 3 on node-with-a-…ple/10.0.0.13 (+41 ms)"),
])
def test_a_straggler_mark_says_what_is_known(keys, words):
    rows = [*job.node_events(job.A)]
    rows.insert(11, {**straggler(job.A, 13.0, 3), **keys})
    (mark,) = [m for m in layout(events_of(job.A, rows)).lanes[0].marks if m.kind == "straggler"]
    assert mark.label == words
    assert len(mark.label) <= 56


def test_straggler_events_are_read_and_checked_and_drawn_as_diamonds():
    named, recovered = straggler(job.A, 13.0, 3), straggler(job.A, 14.0, 3, "recovered")
    assert check(named) is None
    assert check({**named, "lag": None, "collectives": 0}) is None
    assert check({**named, "lag": "41 ms"}) == "'lag' is \"41 ms\", not a finite number"
    assert check({k: v for k, v in named.items() if k != "share"}) == "no 'share' key in a straggler event"
    rows = sorted([*job.node_events(job.A), named, recovered], key=lambda r: float(r["mono"]))
    html = page(layout(events_of(job.A, rows)))
    diamonds = [a for t, a in parsed(html).tags if t == "path" and a.get("class") == "sym" and "l7,7l-7,7l-7,-7z" in a["d"]]
    assert [(a["fill"], a["stroke"]) for a in diamonds] == [("#9c5a12", "#fff"), ("#fff", "#9c5a12")]  # named, recovered
    assert "straggler recovered: rank 3" in html
    assert ">straggler</span>" in html  # in the legend
