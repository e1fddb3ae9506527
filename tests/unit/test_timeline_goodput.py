"""The goodput account on the timeline page: each node's account as one bar of six parts under its lane, folded from
the lane's own events (old files without the account's newer keys too), and the job's account in the header."""

from __future__ import annotations

import json
import re
from html import unescape
from html.parser import HTMLParser

import pytest

import timeline_events as job
from rankrun.events.goodput import PARTS
from rankrun.events.records import Goodput
from rankrun.timeline.__main__ import main
from rankrun.timeline.layout import Drawing, Lane, layout, part_bars, part_words
from rankrun.timeline.read import Event, parse_lines
from rankrun.timeline.render import PART_COLORS, page

pytestmark = pytest.mark.unit

NEW_KEYS = {"training", "stall.end"}  # the events the account brought into schema 1 (and stall's silent, job.end's goodput)


def events_of(node: str, rows: list[dict[str, object]]) -> list[Event]:
    return parse_lines(f"{node}.jsonl", [json.dumps(r).encode() + b"\n" for r in rows])


def lane(d: Drawing, node: str) -> Lane:
    return next(ln for ln in d.lanes if ln.node == node)


def seconds(ln: Lane) -> dict[str, float]:
    return {p.name: round(p.seconds, 6) for p in ln.parts}


def new_events(node: str = job.A, written: dict[str, float] | None = None) -> list[dict[str, object]]:
    """A node's file with every key the account reads: the first collective of each attempt (``training``), a stall
    that began 1.5 s before its report and ended (``stall.end``), a kept step, a failure, and ``job.end``'s own
    account (``written``)."""
    e = job.event
    return [
        e(node, 0.0, "job.start", nproc_per_node=2, nnodes="1", max_restarts=1, rdzv_backend="c10d", entry="train.py"),
        e(node, 1.0, "workers.start", attempt=0, ranks="0-1", pids=[4101, 4102]),
        e(node, 3.5, "training", attempt=0, seconds=2.0),  # the first collective 2 s after the workers' start
        e(node, 8.0, "stall", ranks="1", title="rank 1 made no progress for 1.5 s", silent=1.5),
        e(node, 9.0, "stall.end", ranks="1", seconds=2.5),
        e(node, 10.0, "checkpoint.kept", step=7, ranks="0-1", bytes=1000, seconds=0.5, state="kept", why=None),
        e(node, 11.0, "failure", **job.ROOT_CAUSE),
        e(node, 11.2, "workers.end", attempt=0, outcome="failed"),
        e(node, 11.3, "restart", attempt=1, reason="worker failed", restarts_left=0),
        e(node, 12.0, "workers.start", attempt=1, ranks="0-1", pids=[4111, 4112]),
        e(node, 13.5, "training", attempt=1, seconds=1.0),
        e(node, 20.0, "workers.end", attempt=1, outcome="succeeded"),
        e(node, 20.1, "job.end", exit_code=0, outcome="succeeded",
          **({} if written is None else {"goodput": written})),
    ]


# -- each node's bar


def test_an_old_file_without_the_accounts_keys_gets_its_bar_folded_from_its_events():
    rows = {node: job.node_events(node) for node in (job.A, job.B)}
    assert not [r for node in rows for r in rows[node] if r["event"] in NEW_KEYS or "silent" in r or "goodput" in r]
    d = layout(events_of(job.A, rows[job.A]) + events_of(job.B, rows[job.B]))
    a, b = lane(d, job.A), lane(d, job.B)
    assert [p.name for p in a.parts] == list(PARTS)
    # waiting to the first attempt; each attempt's start-up to the store's first requests (no first collective known:
    # spawn 0.1 s, store 0.5 s); the failed attempt's training all lost (nothing kept); restart to the next start
    assert seconds(a) == {"productive": 9.1, "waiting": 0.95, "startup": 0.8, "restart": 3.3, "stall": 0.0, "lost": 4.9}
    # 127.0.0.3's stall has no silent seconds (an old file) and no stall.end: from its report to the attempt's end
    assert seconds(b) == {"productive": 5.11, "waiting": 0.9, "startup": 0.8, "restart": 3.3, "stall": 4.0, "lost": 4.9}
    assert a.account == Goodput(19.05, 9.1, 0.95, 0.8, 3.3, 0.0, 4.9)
    assert b.account is not None and b.account.wall_s == pytest.approx(19.01)


def test_the_bar_runs_from_the_nodes_first_event_its_parts_side_by_side_as_long_as_their_seconds():
    d = layout(events_of(job.A, job.node_events(job.A)) + events_of(job.B, job.node_events(job.B)))
    for ln, first in ((lane(d, job.A), 0.0), (lane(d, job.B), 0.07)):  # B starts 50 ms in, its wall clock 20 ms ahead
        assert ln.parts[0].start == pytest.approx(first)
        assert [p.start for p in ln.parts[1:]] == pytest.approx([p.end for p in ln.parts[:-1]])
        assert [p.end - p.start for p in ln.parts] == pytest.approx([p.seconds for p in ln.parts])
        assert ln.account is not None
        assert ln.parts[-1].end == pytest.approx(first + ln.account.wall_s)  # as long as the node's wall time
    # the job.end's mark and the bar's end agree: the account runs from the node's first event to its job.end
    end = next(m for m in lane(d, job.B).marks if m.kind == "job.end")
    assert lane(d, job.B).parts[-1].end == pytest.approx(end.t)


def test_each_part_says_its_seconds_and_share_of_the_nodes_wall_time():
    b = lane(layout(events_of(job.B, job.node_events(job.B))), job.B)
    assert [p.label for p in b.parts] == [
        "productive 5.11 s · 26.9 % of 19.0 s", "waiting 0.90 s · 4.7 % of 19.0 s", "start-up 0.80 s · 4.2 % of 19.0 s",
        "restart 3.30 s · 17.4 % of 19.0 s", "stall 4.00 s · 21.0 % of 19.0 s", "lost 4.90 s · 25.8 % of 19.0 s"]
    assert part_words("stall", 0.0, 19.0) == "stall 0.00 s · 0 % of 19.0 s"
    assert part_words("lost", 0.0, 0.0) == "lost 0.00 s · 0 % of 0.00 s"  # a node with no time: no share to give


def test_part_bars_is_pure_and_starts_where_it_is_told():
    acc = Goodput(10.0, 4.0, 1.0, 2.0, 0.5, 0.0, 2.5)
    bars = part_bars(acc, 3.0)
    assert [(p.name, p.start, p.end) for p in bars] == [
        ("productive", 3.0, 7.0), ("waiting", 7.0, 8.0), ("startup", 8.0, 10.0), ("restart", 10.0, 10.5),
        ("stall", 10.5, 10.5), ("lost", 10.5, 13.0)]
    assert part_bars(acc, 3.0) == bars


def test_a_file_with_a_restart_and_kept_steps_loses_only_the_training_after_its_newest_kept_step():
    [ln] = layout(events_of(job.A, job.kept_events())).lanes
    # attempt 0: start-up to its first kept save's start (kept at 2.0 after 0.61 s of blocking), training to the newest
    # kept step (step 4 at 5.0; step 5 was refused), lost from there to the failed attempt's end (6.52)
    assert seconds(ln) == {"productive": 5.27, "waiting": 0.6, "startup": 2.08, "restart": 0.58, "stall": 0.0, "lost": 1.52}
    assert sum(seconds(ln).values()) == pytest.approx(10.05)


def test_a_new_file_is_folded_from_its_events_not_taken_from_its_job_end():
    folded = {"productive": 11.6, "waiting": 1.0, "startup": 3.0, "restart": 0.8, "stall": 2.5, "lost": 1.2}
    written = {"wall_s": 20.1, "productive_s": 20.1, "waiting_s": 0.0, "startup_s": 0.0, "restart_s": 0.0,
               "stall_s": 0.0, "lost_s": 0.0}  # what no fold of these events gives: the page must not draw it
    for keys in (None, written):
        d = layout(events_of(job.A, new_events(written=keys)))
        assert seconds(d.lanes[0]) == folded  # the first collective ends start-up; the stall began 1.5 s before its report
        assert d.goodput.startswith("goodput 57.7 % of 20.1 s — start-up 14.9 %, restarts 4.0 % (1), stalls 12.4 %,")


def test_a_lane_without_a_known_event_has_no_bar_and_the_header_no_account():
    rows = [{**row, "event": "something.new"} for row in job.node_events(job.A)[:2]]
    d = layout(events_of(job.A, rows))
    assert (d.lanes[0].account, d.lanes[0].parts, d.goodput) == (None, (), "")
    html = page(d)
    assert 'id="goodput"' not in html
    assert 'class="part"' not in html
    assert ">goodput</text>" not in html  # no row named for it


def test_a_running_job_without_job_end_is_accounted_to_its_last_event():
    rows = job.node_events(job.A)[:-2]  # attempt 1 still running at the startup event, 12.7 s in
    [ln] = layout(events_of(job.A, rows)).lanes
    assert ln.account is not None and ln.account.wall_s == pytest.approx(12.7)
    assert seconds(ln)["productive"] == pytest.approx(12.7 - 9.95)  # a running attempt counts as succeeding so far


# -- the header: the job's account


def test_the_header_gives_the_jobs_account_with_its_worst_node_whatever_the_order_of_the_files():
    a, b = events_of(job.A, job.node_events(job.A)), events_of(job.B, job.node_events(job.B))
    words = ("goodput 26.8 % of 19.1 s (the job, 2 nodes; the worst: 127.0.0.3) — start-up 4.2 %, restarts 17.3 % (1),"
             " stalls 21.0 %, lost 25.7 %, waiting 4.9 %; nothing was kept (rankrun.checkpoint): each failed attempt lost"
             " all its training")
    assert layout(a + b).goodput == words  # the job's wall time (A's, 19.05 s), B's parts: its stall made it the worst
    assert layout(b + a).goodput == words
    assert layout(a).goodput == ("goodput 47.8 % of 19.1 s — start-up 4.2 %, restarts 17.3 % (1), stalls 0 %,"
                                 " lost 25.7 %, waiting 5.0 %; nothing was kept (rankrun.checkpoint): each failed"
                                 " attempt lost all its training")


def test_a_node_the_job_excluded_is_not_the_jobs_worst_node():
    # 127.0.0.5 was excluded 0.1 s in (exit 4) and waited all its life: the job ran on without it, on the other two
    a, b = events_of(job.A, job.node_events(job.A)), events_of(job.B, job.node_events(job.B))
    x = events_of(job.EXCLUDED, job.excluded_events())
    d = layout(x + a + b)
    assert seconds(lane(d, job.EXCLUDED))["waiting"] == pytest.approx(0.1)  # its own bar is drawn still
    assert lane(d, job.EXCLUDED).parts[1].label == "waiting 0.10 s · 100.0 % of 0.10 s"
    assert d.goodput == layout(a + b).goodput + "; not counted, excluded: 127.0.0.5"
    alone = layout(x)  # when every node was excluded, that is the job's own ending, and its account
    assert alone.goodput.startswith("goodput 0 % of 0.1 s — ")


def test_the_header_of_a_job_that_kept_its_progress_does_not_say_nothing_was_kept():
    assert layout(events_of(job.A, job.kept_events())).goodput == (
        "goodput 52.4 % of 10.1 s — start-up 20.7 %, restarts 5.8 % (1), stalls 0 %, lost 15.1 %, waiting 6.0 %")


def test_a_step_refused_is_not_a_step_kept_in_the_header():
    refused = job.event(job.A, 5.0, "checkpoint.kept", step=3, ranks="0-1", bytes=0, seconds=0.0, state="refused",
                        why="rank 1's step 3 (2.1 GB) is not kept: this node has 1.1 GB of room")
    rows = job.node_events(job.A)
    d = layout(events_of(job.A, [*rows[:4], refused, *rows[4:]]))
    assert d.goodput.endswith("; nothing was kept (rankrun.checkpoint): each failed attempt lost all its training")


def test_the_worst_node_is_the_one_whose_parts_the_job_takes_even_when_it_ran_shorter():
    # a node that joined 5 s late, with a longer stall: the job's wall time is the other's, its waiting includes the 5 s
    late = [{**row, "ts": float(row["ts"]) + 5.0} for row in job.node_events(job.B)
            if row["event"] not in ("job.start", "rdzv.round")]
    d = layout(events_of(job.A, job.node_events(job.A)) + events_of(job.B, late))
    b = lane(d, job.B)
    assert b.account is not None
    assert d.goodput.startswith(f"goodput {100 * b.account.productive_s / 19.05:.1f} % of 19.1 s (the job, 2 nodes;"
                                " the worst: 127.0.0.3)")


# -- the page


class _Parts(HTMLParser):
    """Each goodput part's rect (its attributes) and its title."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[dict[str, str | None]] = []
        self.titles: list[str] = []
        self._in: bool = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "rect" and dict(attrs).get("class") == "part":
            self.parts.append(dict(attrs))
            self._in = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "rect":
            self._in = False

    def handle_data(self, data: str) -> None:
        if self._in:
            self.titles.append(data)


def test_the_page_draws_each_nodes_bar_in_its_colours_with_a_tooltip_a_legend_and_the_header():
    d = layout(events_of(job.A, job.node_events(job.A)) + events_of(job.B, job.node_events(job.B)))
    html = page(d)
    p = _Parts()
    p.feed(html)
    drawn = [a["data-part"] for a in p.parts]
    assert drawn == [n for n in PARTS if n != "stall"] + list(PARTS)  # an empty part is not drawn: A had no stall
    assert p.titles == [part.label for ln in d.lanes for part in ln.parts if part.seconds > 0]
    assert [a["fill"] for a in p.parts] == [PART_COLORS[n] for n in drawn]
    assert len(set(PART_COLORS.values())) == len(PARTS)
    # widths proportional to the seconds: the plot's pixels per second, the same for every part
    widths = [float(a["width"] or 0) / part.seconds for a, part in
              zip(p.parts, [x for ln in d.lanes for x in ln.parts if x.seconds > 0], strict=True)]
    assert max(widths) == pytest.approx(min(widths), rel=0.01)
    assert len({a["y"] for a in p.parts[:5]}) == 1  # one row per node
    for name in ("goodput: productive", "waiting", "start-up", "restart", "stall", "lost"):
        assert f"{name}</span>" in html
    assert ">goodput</text>" in html  # the row's name
    header = re.search(r'<p id="goodput">([^<]*)</p>', html)
    assert header is not None and unescape(header.group(1)) == d.goodput


def test_a_hostile_node_name_in_the_header_is_escaped():
    rows = [{**row, "node": "<b>x</b>"} for row in job.node_events(job.B)]
    d = layout(events_of(job.A, job.node_events(job.A)) + events_of(job.B, rows))
    assert "the worst: <b>x</b>" in d.goodput
    assert "the worst: &lt;b&gt;x&lt;/b&gt;" in page(d)


def test_the_command_draws_the_account_of_the_run_it_draws(tmp_path, capsys):
    # a file appended to by two runs: --run chooses one, and the account is that run's alone
    other = [{**row, "run": "job-2", "mono": float(row["mono"]) + 100.0, "ts": float(row["ts"]) + 100.0}
             for row in job.kept_events()]
    path = job.write(tmp_path / "node.jsonl", job.node_events(job.A) + other)
    for run, words in ((job.RUN, "goodput 47.8 % of 19.1 s"), ("job-2", "goodput 52.4 % of 10.1 s")):
        out = tmp_path / f"{run}.html"
        assert main([str(path), "--run", run, "-o", str(out)]) == 0
        header = re.search(r'<p id="goodput">([^<]*)</p>', out.read_text())
        assert header is not None and header.group(1).startswith(words + " — ")
    capsys.readouterr()
