"""The timeline page of a job that keeps its progress (``rankrun.checkpoint``): a tick per kept step (a refused one
drawn apart), a bar per copy to the neighbour or to disk, a labelled mark where an attempt resumed."""

from __future__ import annotations

import json
import re

import pytest

import timeline_events as job
from rankrun.events.records import CheckpointKept, CheckpointRestored, CheckpointWritten, as_json
from rankrun.timeline.layout import kept_summary, kept_words, layout, mark_label, restored_words, written_words
from rankrun.timeline.read import Event, check, parse_lines
from rankrun.timeline.render import ATTEMPT_H, AXIS_H, COPY_H, GAP, GOODPUT_H, LANE_PAD, PHASE_H, copy_rows, page, svg

pytestmark = pytest.mark.unit


def events_of(node: str, rows: list[dict[str, object]]) -> list[Event]:
    return parse_lines(f"{node}.jsonl", [json.dumps(r).encode() + b"\n" for r in rows])


def kept_job() -> list[Event]:
    return events_of(job.A, job.kept_events())


def named(events: list[Event], name: str) -> list[Event]:
    return [e for e in events if e.name == name]


def test_the_events_are_checked_and_read_by_the_records_own_decoder():
    rows = job.kept_events()
    assert all(check(row) is None for row in rows)
    read = kept_job()
    kinds = {e.name: type(e.record) for e in read if e.name.startswith("checkpoint.")}
    assert kinds == {"checkpoint.kept": CheckpointKept, "checkpoint.written": CheckpointWritten,
                     "checkpoint.restored": CheckpointRestored}
    assert all({k: v for k, v in as_json(e.record).items() if k in e.data} == e.data for e in read if e.record is not None)
    kept = next(r for r in rows if r["event"] == "checkpoint.kept")
    assert check({**kept, "why": 5}) == "'why' is 5, not a string"
    assert check({k: v for k, v in kept.items() if k != "step"}) == "no 'step' key in a checkpoint.kept event"


def test_each_kept_step_is_a_tick_without_a_label_and_a_refused_one_is_told_apart():
    [lane] = layout(kept_job()).lanes
    ticks = [m for m in lane.marks if m.kind == "checkpoint.kept"]
    assert [(m.event.integer("step"), m.event.text("state")) for m in ticks] == [
        (1, "kept"), (2, "kept"), (3, "kept"), (4, "kept"), (5, "refused"), (5, "kept")]
    assert [m.t for m in ticks] == pytest.approx([2.0, 3.0, 4.0, 5.0, 6.0, 9.0])
    assert all(m.row == -1 for m in ticks)  # the words on hover only: a job may save every step
    assert [m.label for m in ticks][3:5] == [
        "kept step 4: 4.2 GB in 0.61 s", "rank 1's step 5 (2.1 GB) is not kept: this node has 1.1…"]
    labelled = [m.kind for m in lane.marks if m.row >= 0]
    assert labelled == ["job.start", "failure", "restart", "checkpoint.restored", "job.end"]
    drawn = svg(layout(kept_job()))
    # a tick across the attempt's bar: kept in the kept colour, refused in red and dashed
    assert len(re.findall(r'<path class="sym" d="M[0-9.]+,[0-9.]+v26" stroke="#1d3f6e" stroke-width="2"/>', drawn)) == 5
    assert len(re.findall(r'stroke="#f5b700" stroke-width="2" stroke-dasharray="3 2"/>', drawn)) == 1


def test_each_copy_is_a_bar_on_the_copies_row_as_long_as_it_took():
    [lane] = layout(kept_job()).lanes
    assert [(b.style, b.label) for b in lane.copies] == [
        ("neighbour", "step 1 → neighbour 127.0.0.3 · 4.2 GB in 0.80 s"),
        ("neighbour", "step 2 → neighbour 127.0.0.3 · 4.2 GB in 0.70 s"),
        ("disk", "step 2 → disk · 4.2 GB in 2.50 s"),
        ("neighbour", "step 3 → neighbour 127.0.0.3 · 4.2 GB in 0.75 s"),
        ("abandoned", "step 3 → disk · abandoned after 0.60 s"),
        ("neighbour", "step 4 → neighbour 127.0.0.3 · 4.2 GB in 0.80 s"),
        ("disk", "step 4 → disk · 4.2 GB in 2.60 s"),
    ]
    disk = lane.copies[2]
    assert (disk.start, disk.end) == pytest.approx((2.0, 4.5))  # from the step's being kept to its copy's being complete
    assert all(b.kind == "copy" and [e.name for e in b.events] == ["checkpoint.written"] for b in lane.copies)
    assert not [m for m in lane.marks if m.kind == "checkpoint.written"]
    assert {to: [b.label.split(" · ")[0] for b in bars] for to, bars in copy_rows(lane).items()} == {
        "neighbour": ["step 1 → neighbour 127.0.0.3", "step 2 → neighbour 127.0.0.3", "step 3 → neighbour 127.0.0.3",
                      "step 4 → neighbour 127.0.0.3"],
        "disk": ["step 2 → disk", "step 3 → disk", "step 4 → disk"]}  # a row each: a long disk copy hides no other
    drawn = svg(layout(kept_job()))
    rows = {m[1]: float(m[0]) for m in re.findall(r'<text class="row" x="\d+" y="([0-9.]+)" text-anchor="end">([a-z -]+)</text>',
                                                  drawn)}
    assert rows["start-up"] < rows["to neighbour"] < rows["to disk"]
    neighbour_y = {float(y) for y in re.findall(r'<rect class="bar" x="[0-9.]+" y="([0-9.]+)"[^>]*fill="#6f8fc9"', drawn)}
    disk_y = {float(y) for y in re.findall(r'<rect class="bar(?: open)?" x="[0-9.]+" y="([0-9.]+)"[^>]*fill="#(?:a0825a|d9dcdf)"',
                                           drawn)}
    assert len(neighbour_y) == len(disk_y) == 1 and neighbour_y != disk_y
    assert drawn.count('fill="#a0825a"') == 2 and drawn.count('fill="#6f8fc9"') == 4
    assert drawn.count('class="bar open"') == 1  # the abandoned copy, dashed


def test_a_lane_without_copies_has_no_copies_row():
    rows = [r for r in job.kept_events() if r["event"] != "checkpoint.written"]
    with_copies, without = svg(layout(kept_job())), svg(layout(events_of(job.A, rows)))
    assert ">to neighbour</text>" not in without and ">to disk</text>" not in without
    height = re.compile(r'<svg width="\d+" height="(\d+)"')
    assert int(height.findall(with_copies)[0]) > int(height.findall(without)[0])


def test_the_step_an_attempt_resumed_from_is_a_labelled_mark():
    [lane] = layout(kept_job()).lanes
    [mark] = [m for m in lane.marks if m.kind == "checkpoint.restored"]
    assert mark.label == "attempt 1 resumes from step 4 kept in memory"
    assert mark.t == pytest.approx(7.9)
    assert mark.row >= 0
    assert 'fill="#127a3e"' in svg(layout(kept_job()))


@pytest.mark.parametrize(("source", "words"), [
    ("memory", "attempt 1 resumes from step 4 kept in memory"),
    ("neighbour", "attempt 1 resumes from step 4 from the neighbour's copy"),
    ("disk", "attempt 1 resumes from step 4 from --checkpoint-dir"),
    (None, "attempt 1 resumes from step 4"),
])
def test_where_a_restored_step_came_from_is_said_as_the_console_says_it(source, words):
    row = {**next(r for r in job.kept_events() if r["event"] == "checkpoint.restored"), "source": source}
    [e] = events_of(job.A, [row])
    assert restored_words(e) == words == mark_label(e)


def test_words_of_a_file_with_nulls_where_values_were_unknown():
    rows = job.kept_events()
    kept = {**next(r for r in rows if r["event"] == "checkpoint.kept"), "bytes": None, "seconds": None}
    refused = {**kept, "state": "refused", "why": None}
    written = {**next(r for r in rows if r["event"] == "checkpoint.written"), "to": None, "bytes": -1}
    [k, r, w] = events_of(job.A, [kept, refused, written])
    assert kept_words(k) == "kept step 1: ? B in ?"
    assert kept_words(r) == "step 1 not kept"
    assert written_words(w) == "step 1 → ? · ? B in 0.80 s"
    assert written_words(events_of(job.A, [{**written, "to": "disk", "state": "abandoned", "seconds": 12.5}])[0]) == \
        "step 1 → disk · abandoned after 12.5 s"


def test_the_header_says_the_newest_step_kept_and_the_steps_not_kept():
    d = layout(kept_job())
    assert d.summary[0].startswith("1 node · world size 4 · 2 attempts · 1 restart · steps kept up to 5, 1 not kept · ")
    assert kept_summary(kept_job()) == "steps kept up to 5, 1 not kept"
    both = kept_job() + events_of(job.B, job.kept_events(job.B))  # each node refused step 5: one step not kept
    assert kept_summary(both) == "steps kept up to 5, 1 not kept"
    only_refused = [e for e in kept_job() if not (e.name == "checkpoint.kept" and e.text("state") == "kept")]
    assert kept_summary(only_refused) == "no step kept, 1 not kept"
    no_refusal = [e for e in kept_job() if not (e.name == "checkpoint.kept" and e.text("state") == "refused")]
    assert kept_summary(no_refusal) == "steps kept up to 5"
    none = [e for e in kept_job() if not e.name.startswith("checkpoint.")]
    assert kept_summary(none) == ""
    assert "kept" not in layout(none).summary[0]


def test_the_page_shows_each_checkpoint_event_on_hover_and_has_the_legend():
    html = page(layout(kept_job()))
    for name in ("checkpoint.kept", "checkpoint.written", "checkpoint.restored"):
        assert f"&quot;event&quot;:&quot;{name}&quot;" in html
    for words in ("step kept", "not kept", "copy to neighbour", "copy to disk", "resumed from a step"):
        assert f"</i>{words}</span>" in html
    # the ticks go under the other marks: drawn first, the root cause last
    kinds = re.findall(r'data-caption="([a-z.]+) · ', html)
    assert kinds[: kinds.index("failure")].count("checkpoint.kept") == 6
    assert kinds[-1] == "failure"
    assert len(named(kept_job(), "checkpoint.kept")) == 6


def test_a_copy_with_nulls_is_drawn_still_where_it_ended_in_a_row_of_its_own():
    rows = job.kept_events()
    first = next(r for r in rows if r["event"] == "checkpoint.written")
    odd = [{**first, "to": None, "seconds": None}, {**first, "to": "tape", "seconds": -3.0, "state": None}]
    kept = {**next(r for r in rows if r["event"] == "checkpoint.kept"), "bytes": 0}
    [lane] = layout(events_of(job.A, [rows[0], *odd, kept])).lanes
    [unknown, tape] = lane.copies
    assert (unknown.style, tape.style) == ("unknown", "tape")
    assert unknown.end - unknown.start == 0.0 == tape.end - tape.start  # no time known, or none that can be: a moment
    assert list(copy_rows(lane)) == ["?", "tape"]
    assert ">to ?</text>" in svg(layout(events_of(job.A, [rows[0], *odd])))
    [tick] = [m for m in lane.marks if m.kind == "checkpoint.kept"]
    assert tick.label == "kept step 1: 0 B in 0.61 s"


def test_the_copies_rows_sit_under_the_start_up_row_and_the_ticks_across_the_attempts_bar():
    drawn = svg(layout(kept_job()))
    attempt_y = float(re.findall(r'<rect class="bar" x="[0-9.]+" y="([0-9.]+)" [^>]*height="22"', drawn)[0])
    neighbour_y = float(re.findall(r'<rect class="bar" x="[0-9.]+" y="([0-9.]+)"[^>]*fill="#6f8fc9"', drawn)[0])
    disk_y = float(re.findall(r'<rect class="bar" x="[0-9.]+" y="([0-9.]+)"[^>]*fill="#a0825a"', drawn)[0])
    assert neighbour_y == pytest.approx(attempt_y + ATTEMPT_H + GAP + PHASE_H + GAP, abs=0.11)
    assert disk_y == pytest.approx(neighbour_y + COPY_H + GAP, abs=0.11)
    lane_h = float(re.findall(r'<rect class="lanebg" x="0" y="[0-9.]+" width="\d+" height="(\d+)"', drawn)[0])
    goodput_y = float(re.findall(r'<rect class="part" data-part="productive" x="[0-9.]+" y="([0-9.]+)"', drawn)[0])
    assert goodput_y == pytest.approx(disk_y + COPY_H + GAP, abs=0.11)  # the node's account under its copies
    assert goodput_y + GOODPUT_H + LANE_PAD == pytest.approx(AXIS_H + lane_h, abs=0.11)  # the last row ends the lane
    tick_tops = [float(y) for y in re.findall(r'<path class="sym" d="M[0-9.]+,([0-9.]+)v26"', drawn)]
    assert tick_tops == pytest.approx([attempt_y - 2] * 6, abs=0.11)  # from 2 px over the bar to 2 px under it
    assert "v-6m-3,3l3,-3l3,3" in drawn  # the restored mark's arrow


def test_the_ticks_are_drawn_first_under_the_other_marks():
    kinds = re.findall(r'data-caption="([a-z.]+) · ', page(layout(kept_job())))
    assert kinds[:6] == ["checkpoint.kept"] * 6
    assert "checkpoint.kept" not in kinds[6:]
