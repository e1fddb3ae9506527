"""The drawing model of a job, from its events (pure): a lane per node, bars and marks at seconds since the job's start.

Nodes' monotonic clocks differ, so each lane is placed once by the wall clock (``ts``) of its first event and everything
else in it by ``mono``: durations within a node are exact, and a wall-clock step during the job moves nothing.

Kept progress (``rankrun.checkpoint``): each ``checkpoint.kept`` is a tick on its node's lane, without a label (a job
may save every step: hundreds of labels would bury the rest); each ``checkpoint.written`` a bar on the lane's copies
row, as long as the copy took; each ``checkpoint.restored`` a labelled mark with its step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rankrun.errors import excluded
from rankrun.events import goodput
from rankrun.events.fields import ranks_in, restored_from, size_words
from rankrun.events.records import CheckpointKept, Goodput
from rankrun.timeline.read import Event

# what a label costs on the page, to stack marks' labels in rows that do not overlap (the renderer draws 11 px text)
CHAR_PX = 6.4
LABEL_PAD_PX = 16.0
MAX_LABEL = 56


@dataclass(frozen=True)
class Bar:
    """A span: a rendezvous round, an attempt's workers, or one start-up phase; ``events`` are what it is drawn from."""

    kind: str  # "round", "attempt", "phase", "copy"
    start: float
    end: float
    label: str
    style: str  # the attempt's outcome ("succeeded", ..., "open" with no end seen), the phase's name ("import": the
    # --preload process's one import), "round", a copy's place ("neighbour", "disk") or "abandoned"
    events: tuple[Event, ...]


@dataclass(frozen=True)
class Mark:
    """A moment: a failure, a restart, a stall, a straggler named or recovered, a lost node, a preloading process
    turned unsafe or ended, a step kept (or refused) and one restored, the job's start and end, or an event this reader
    does not know."""

    kind: str  # the event's name
    t: float
    label: str
    row: int  # the label's row above the lane's bars (labels that would overlap go to further rows); -1: no label
    right: bool  # the label runs right of the mark (left of it near the page's right edge)
    event: Event


@dataclass(frozen=True)
class Lane:
    node: str
    source: str
    ranks: str  # this node's ranks in its last attempt (the range string), "" when it started none
    rounds: tuple[Bar, ...]
    attempts: tuple[Bar, ...]
    phases: tuple[Bar, ...]
    marks: tuple[Mark, ...]
    label_rows: int
    copies: tuple[Bar, ...] = ()  # the kept steps' copies to the neighbour and to disk (``checkpoint.written``)
    account: Goodput | None = None  # the node's goodput account, from this lane's events; None: it has no known event
    parts: tuple[Part, ...] = ()  # the account's bar: its six parts, in goodput.PARTS order (zero-length ones too)


@dataclass(frozen=True)
class Part:
    """One part of a node's goodput account, a segment of the lane's goodput bar (``start``, ``end``: on the page's
    time axis, as long as the part's seconds)."""

    name: str  # one of goodput.PARTS
    start: float
    end: float
    seconds: float
    label: str  # ``stall 4.00 s · 21.0 % of 19.0 s``: the segment's tooltip


@dataclass(frozen=True)
class Drawing:
    run: str
    started: float  # wall-clock seconds since the epoch of t = 0
    span: float  # seconds from t = 0 to the last thing drawn
    lanes: tuple[Lane, ...]
    summary: tuple[str, ...]  # what happened, in a few lines a person reads first
    root_causes: tuple[Event, ...]  # one failure event per failed attempt
    endings: tuple[Event, ...]  # how the job ended: a node's job.end per distinct ending (JobEnd.events)
    goodput: str = ""  # the job's goodput account in words (goodput.line), "" when no lane has one


def _clip(text: str) -> str:
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def failure_words(e: Event) -> str:
    """``rank 1 failed: ValueError: bad lr`` (or its exit code, or its signal: ``rank 1 killed by SIGABRT`` and, when it
    raised before, ``rank 1 killed by SIGABRT: ValueError: bad lr``)."""
    rank = e.integer("rank")
    who = f"rank {rank}" if rank is not None else "a worker"
    exc, sig = e.text("exception"), e.text("signal")
    if sig is not None:
        return f"{who} killed by {sig}: {exc}" if exc is not None else f"{who} killed by {sig}"
    if exc is not None:
        return f"{who} failed: {exc}"
    if (code := e.integer("exit_code")) is not None:
        return f"{who} exited with {code}"
    return f"{who} failed"


def straggler_words(e: Event) -> str:
    """``straggler: rank 5 on node-3/10.0.0.13 (+41 ms)`` (no lag when judged on stack samples), or
    ``straggler recovered: rank 5``."""
    rank = e.integer("rank")
    if e.text("verdict") == "recovered":
        return f"straggler recovered: rank {rank}" if rank is not None else "straggler recovered"
    text = f"straggler: rank {rank}" if rank is not None else "straggler"
    lag = e.number("lag")
    tail = f" (+{_lag(lag)})" if lag is not None else ""
    if (where := e.text("where")) is not None:
        # a long node name gives way in its middle: its address at the end, and the lag, stay in the label
        room = max(MAX_LABEL - len(text) - len(" on ") - len(tail), 9)
        head = (room - 1) // 2
        text += " on " + (where if len(where) <= room else where[:head] + "…" + where[-(room - 1 - head) :])
    return text + tail


def _lag(seconds: float) -> str:
    """41 ms, 4.2 ms, 1.20 s: as the console's straggler line gives a lag."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    ms = seconds * 1000
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def warm_words(e: Event) -> str:
    """How an attempt's workers started, from its ``warm`` event: ``forked`` (every one from the preloading process),
    ``cold`` (none), or ``3 forked, 1 cold``."""
    forked, cold = ranks_in(e.text("forked") or ""), ranks_in(e.text("cold") or "")
    if forked == 0:
        return "cold"
    return "forked" if cold == 0 else f"{forked} forked, {cold} cold"


def preload_words(e: Event) -> str:
    """``import torch, numpy 2.31 s`` (a ready preloading process's one import), or what became of it: ``preload
    unsafe, workers cold: a module left a thread``, ``preload ended, workers cold: ...``."""
    modules = ", ".join(m.strip() for m in (e.text("modules") or "").split(",") if m.strip()) or "?"
    state = e.text("state")
    if state == "ready":
        return f"import {modules} {_secs(e.number('seconds'))}"
    text = f"preload {state}, workers cold" if state in ("unsafe", "ended") else "preload" + (f" {state}" if state else "")
    return text + (f": {why}" if (why := e.text("why")) else "")


def _bytes(e: Event) -> str:
    size = e.integer("bytes")
    return size_words(size) if size is not None and size >= 0 else "? B"


def kept_words(e: Event) -> str:
    """``kept step 120: 4.2 GB in 0.61 s`` (the longest save's blocking time), or for a refused step its why (which
    names the step), ``step 121 not kept`` without one."""
    step = e.integer("step")
    if e.text("state") == "refused":
        return e.text("why") or f"step {step} not kept"
    return f"kept step {step}: {_bytes(e)} in {_secs(e.number('seconds'))}"


def written_words(e: Event) -> str:
    """``step 120 → neighbour 10.0.0.14 · 4.2 GB in 3.90 s``, ``step 120 → disk · abandoned after 11.5 s``."""
    to = e.text("to") or "?"
    head = f"step {e.integer('step')} → {to}" + (f" {where}" if to == "neighbour" and (where := e.text("where")) else "")
    if e.text("state") == "abandoned":
        return f"{head} · abandoned after {_secs(e.number('seconds'))}"
    return f"{head} · {_bytes(e)} in {_secs(e.number('seconds'))}"


def restored_words(e: Event) -> str:
    """``attempt 1 resumes from step 120 kept in memory``."""
    source = e.text("source")
    where = restored_from(source) if source else ""
    return f"attempt {e.integer('attempt')} resumes from step {e.integer('step')}" + (f" {where}" if where else "")


def mark_label(e: Event) -> str:  # noqa: PLR0912 - one branch per kind of mark
    """What a mark says next to it (the whole event is shown on hover)."""
    name = e.name
    if name == "failure":
        text = failure_words(e)
    elif name == "restart":
        left = e.integer("restarts_left")
        text = f"restart → attempt {e.integer('attempt')}" + (f" ({left} left)" if left is not None else "")
    elif name == "stall":
        text = f"stall: ranks {e.text('ranks')}" if e.text("ranks") else "stall"
    elif name == "straggler":
        text = straggler_words(e)
    elif name == "node.lost":
        nodes = e.data.get("nodes")
        text = "lost: " + ", ".join(nodes) if isinstance(nodes, list) and nodes else "node lost"
    elif name == "node.excluded":
        nodes = e.data.get("nodes")
        text = "excluded: " + ", ".join(nodes) if isinstance(nodes, list) and nodes else "node excluded"
    elif name == "preload":
        text = preload_words(e)
    elif name == "warm":  # one whose attempt has no bar on the lane to carry it
        text = f"attempt {e.integer('attempt')} {warm_words(e)}"
    elif name == "checkpoint.kept":
        text = kept_words(e)
    elif name == "checkpoint.restored":
        text = restored_words(e)
    elif name == "job.start":
        text = "job start"
    elif name == "job.end":
        text = f"job end: {e.text('outcome')} (exit {e.integer('exit_code')})"
    else:
        text = name
    return _clip(text)


# facts of the whole job that every node writes: labelled once (on the first lane that has them), a mark only on the
# others, so that a job of many nodes does not repeat them lane after lane; the root cause is labelled on its node too
JOB_WIDE = ("failure", "restart", "node.lost", "node.excluded", "straggler")
DRAWN_AS_BARS = ("rdzv.round", "workers.start", "workers.end", "startup", "checkpoint.written")
UNLABELLED = ("checkpoint.kept",)  # a tick each, its words on hover only: a job may keep a step every second


def drawn_on_a_bar(e: Event, attempts: set[int]) -> bool:
    """Whether ``e`` is drawn as, or carried by, a bar rather than a mark: a round, an attempt's start and end, its
    start-up, a ready preloading process (its import's bar), a ``warm`` event (on the bar of its attempt, one of
    ``attempts``, when the lane has it), a kept step's copy."""
    if e.name == "preload":
        return e.text("state") == "ready"
    if e.name == "warm":
        return e.integer("attempt") in attempts
    return e.name in DRAWN_AS_BARS


def stack_labels(items: Sequence[tuple[float, int]], width_px: float) -> list[tuple[int, bool]]:
    """Row and side for labels at pixel ``x`` of ``chars`` characters, in order of x: each goes to the first row where it
    overlaps nothing, running right of its mark unless that would cross ``width_px``."""
    row_ends: list[float] = []  # per row, the rightmost pixel used so far
    placed = []
    for x, chars in items:
        width = chars * CHAR_PX + LABEL_PAD_PX
        right = x + width <= width_px
        left_edge = x if right else x - width
        right_edge = x + width if right else x
        row = next((i for i, end in enumerate(row_ends) if end <= left_edge), len(row_ends))
        if row == len(row_ends):
            row_ends.append(right_edge)
        else:
            row_ends[row] = right_edge
        placed.append((row, right))
    return placed


def same_host(node: str, host: str | None) -> bool:
    """Whether a failure's ``host`` is this lane's node (its address may be written "name/IP")."""
    return host is not None and (node == host or host in node.split("/"))


def labelled(e: Event, label: str, node: str, said: set[tuple[str, str]]) -> bool:
    """Whether the mark of ``e`` on ``node``'s lane gets its label (it always gets its symbol and its hover)."""
    if e.name in UNLABELLED:
        return False
    if e.name not in JOB_WIDE or (e.name, label) not in said:
        return True
    return e.name == "failure" and same_host(node, e.text("host"))


def _lane_clock(events: Sequence[Event]) -> tuple[float, float]:
    """(wall, mono) of the lane's first event: t_wall(e) = wall + (e.mono - mono)."""
    return events[0].ts, events[0].mono


def _attempt_bars(events: Sequence[Event], at: dict[Event, float]) -> list[Bar]:
    """workers.start to the workers.end of the same attempt; one with no end ("open") runs to the next attempt's start,
    or to the lane's last event."""
    bars = []
    last = max(at.values())
    for i, start in enumerate(events):
        if start.name != "workers.start":
            continue
        attempt = start.integer("attempt")
        end = next((e for e in events[i + 1 :] if e.name == "workers.end" and e.integer("attempt") == attempt), None)
        if end is None:
            nxt = next((e for e in events[i + 1 :] if e.name == "workers.start"), None)
            stop = at[nxt] if nxt is not None else last
            outcome, tail = "open", "no end recorded"
        else:
            stop, outcome = at[end], end.text("outcome") or "unknown"
            tail = outcome
        ranks = start.text("ranks")
        # under --preload, its warm event: how its workers started, said in its label and shown with it on hover
        warm = next((e for e in events if e.name == "warm" and e.integer("attempt") == attempt), None)
        how = f" · {warm_words(warm)}" if warm is not None else ""
        label = f"attempt {attempt}" + (f" · ranks {ranks}" if ranks else "") + how + f" · {tail}"
        carried = (start, *(() if warm is None else (warm,)), *(() if end is None else (end,)))
        bars.append(Bar("attempt", at[start], stop, label, outcome, carried))
    return bars


def _import_bar(e: Event, t: float, job_start: float | None) -> Bar:
    """A ready preloading process's one import, as long as it took. The launcher starts that process first thing,
    right after its ``job.start`` (``job_start``, when the lane has one before ``e``), and tells the event only with
    the first attempt's start: the bar begins with the job, and ends by the time it was told."""
    took = max(e.number("seconds") or 0.0, 0.0)
    begin = t - took if job_start is None else min(job_start, t - took)
    return Bar("phase", begin, begin + took, preload_words(e), "import", (e,))


def _import_bars(events: Sequence[Event], at: dict[Event, float]) -> list[Bar]:
    """Each ready ``preload`` event's import bar (one a node: a preloading process is ready once)."""
    bars, job_start = [], None
    for e in events:
        if e.name == "job.start":
            job_start = at[e]
        elif e.name == "preload" and e.text("state") == "ready":
            bars.append(_import_bar(e, at[e], job_start))
    return bars


def _copy_bar(e: Event, t: float) -> Bar:
    """A kept step's copy, ending when it was complete (or abandoned), as long as it took."""
    took = max(e.number("seconds") or 0.0, 0.0)
    style = "abandoned" if e.text("state") == "abandoned" else e.text("to") or "unknown"
    return Bar("copy", t - took, t, written_words(e), style, (e,))


def _round_bar(e: Event, t: float) -> Bar:
    took = max(e.number("seconds") or 0.0, 0.0)
    label = f"round {e.integer('round')}"
    if (nodes := e.integer("nodes")) is not None:
        label += f" · {nodes} node{'s' if nodes != 1 else ''}"
    if (world := e.integer("world_size")) is not None:
        label += f" · world {world}"
    return Bar("round", t - took, t, label, "round", (e,))


def _phase_bars(e: Event, t: float, started: dict[int, float]) -> list[Bar]:
    """The start-up of one attempt: rendezvous, spawn, then the workers reaching their script and the store, ending
    ``total`` after the rendezvous began. Placed so spawn ends where this node's workers started (its workers.start),
    else so the whole ends at the startup event."""
    rdzv = max(e.number("rendezvous") or 0.0, 0.0)
    spawn = max(e.number("spawn") or 0.0, 0.0)
    total = max(e.number("total") or 0.0, rdzv + spawn)
    attempt = e.integer("attempt")
    begin = started[attempt] - spawn - rdzv if attempt is not None and attempt in started else t - total
    up = f"workers up: script max {_secs(e.number('script_max'))}"
    if (slow := e.integer("script_slowest")) is not None:
        up += f" (rank {slow})"
    if e.number("store_max") is not None:
        up += f", store max {_secs(e.number('store_max'))}"
    return [
        Bar("phase", begin, begin + rdzv, f"rendezvous {_secs(rdzv)}", "rendezvous", (e,)),
        Bar("phase", begin + rdzv, begin + rdzv + spawn, f"spawn {_secs(spawn)}", "spawn", (e,)),
        Bar("phase", begin + rdzv + spawn, begin + total, up, "workers", (e,)),
    ]


def _secs(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def layout(events: Sequence[Event], width_px: float = 860.0) -> Drawing:
    """The drawing of one run's events (from any number of files), for a plot ``width_px`` wide (labels are stacked for it)."""
    if not events:
        raise ValueError("no events")
    groups: dict[tuple[str, str], list[Event]] = {}
    for e in events:
        groups.setdefault((e.source, e.node), []).append(e)

    # absolute wall-clock time of every event, each lane on its own monotonic clock
    wall: dict[Event, float] = {}
    for lane_events in groups.values():
        w0, m0 = _lane_clock(lane_events)
        for e in lane_events:
            wall[e] = w0 + (e.mono - m0)

    raw_lanes, accounts = [], []
    for (source, node), lane_events in groups.items():
        started = {a: wall[e] for e in lane_events if e.name == "workers.start" and (a := e.integer("attempt")) is not None}
        rounds = [_round_bar(e, wall[e]) for e in lane_events if e.name == "rdzv.round"]
        phases = [*_import_bars(lane_events, wall),
                  *(b for e in lane_events if e.name == "startup" for b in _phase_bars(e, wall[e], started))]
        attempts = _attempt_bars(lane_events, wall)
        copies = [_copy_bar(e, wall[e]) for e in lane_events if e.name == "checkpoint.written"]
        marked = [e for e in lane_events if not drawn_on_a_bar(e, set(started))]
        ranks = next((e.text("ranks") or "" for e in reversed(lane_events) if e.name == "workers.start"), "")
        raw_lanes.append((source, node, ranks, rounds, attempts, phases, copies, marked))
        accounts.append(node_account(lane_events, wall))

    origin = min([*wall.values(), *(b.start for lane in raw_lanes for bars in lane[3:7] for b in bars)])
    end = max([*wall.values(), *(b.end for lane in raw_lanes for bars in lane[3:7] for b in bars)])
    span = max(end - origin, 1e-3)
    px_per_s = width_px / span

    def shift(bars: list[Bar]) -> tuple[Bar, ...]:
        return tuple(Bar(b.kind, b.start - origin, b.end - origin, b.label, b.style, b.events) for b in bars)

    lanes = []
    said: set[tuple[str, str]] = set()  # the job-wide facts already labelled on an earlier lane
    for (source, node, ranks, rounds, attempts, phases, copies, in_file_order), accounted in zip(
            raw_lanes, accounts, strict=True):
        marked = sorted(in_file_order, key=lambda e: wall[e])
        labels = [mark_label(e) for e in marked]
        shown = [labelled(e, label, node, said) for e, label in zip(marked, labels, strict=True)]
        said.update((e.name, label) for e, label in zip(marked, labels, strict=True) if e.name in JOB_WIDE)
        times = [wall[e] - origin for e in marked]
        rows = iter(stack_labels([(t * px_per_s, len(label)) for t, label, on in zip(times, labels, shown, strict=True) if on],
                                 width_px))
        marks = tuple(Mark(e.name, t, label, *(next(rows) if on else (-1, True)), e)
                      for e, t, label, on in zip(marked, times, labels, shown, strict=True))
        account, parts = (None, ()) if accounted is None else (accounted[0], part_bars(accounted[0], accounted[1] - origin))
        lanes.append(Lane(node, source, ranks, shift(rounds), shift(attempts), shift(phases), marks,
                          max((m.row + 1 for m in marks), default=0), shift(copies), account, parts))
    ending = job_end(groups, wall)
    return Drawing(events[0].run, origin, span, tuple(lanes), summarize(events, ending), root_causes(events), ending.events,
                   job_goodput(lanes, events, ending))


# the goodput account's parts as the page names them (the console's words)
PART_WORDS = {"productive": "productive", "waiting": "waiting", "startup": "start-up", "restart": "restart",
              "stall": "stall", "lost": "lost"}


def node_account(events: Sequence[Event], wall: dict[Event, float]) -> tuple[Goodput, float] | None:
    """One lane's goodput account, folded from the records of its events that this schema knows (in the order the node
    wrote them: ``goodput.account``, the launcher's own fold), and the aligned time its account begins at (its first
    such event's); None when it has none. Computed the same way whether or not the file's ``job.end`` carries
    the account: files written before it did are drawn alike."""
    known = [e for e in events if e.record is not None]
    if not known:
        return None
    return goodput.account(e.record for e in known if e.record is not None), wall[known[0]]


def part_bars(account: Goodput, start: float) -> tuple[Part, ...]:
    """The account's bar from ``start``: its six parts one after the other in ``goodput.PARTS`` order, each as long as
    its seconds (pure)."""
    parts, at = [], start
    for name in goodput.PARTS:
        seconds = float(getattr(account, f"{name}_s"))
        parts.append(Part(name, at, at + seconds, seconds, part_words(name, seconds, account.wall_s)))
        at += seconds
    return tuple(parts)


def part_words(name: str, seconds: float, wall: float) -> str:
    """``stall 4.00 s · 21.0 % of 19.0 s``: a part's seconds and its share of the node's wall time."""
    share = f"{100.0 * seconds / wall:.1f} %" if wall > 0 and seconds > 0 else "0 %"  # as goodput.line says it
    return f"{PART_WORDS[name]} {_secs(seconds)} · {share} of {_secs(wall)}"


def job_goodput(lanes: Sequence[Lane], events: Sequence[Event], end: JobEnd) -> str:
    """The job's account for the header, as the console's line says it (``goodput.line`` of ``goodput.job`` over the
    lanes' accounts, naming the worst node when there are several); "" when no lane has an account. A node the job
    excluded (its job.end's exit 4, ``end``) is left out, as the header's outcome names it apart: it waited from its
    exclusion on, and would be the job's worst node though the job ran on without it; unless every node was."""
    accounted = [(lane.node, lane.account) for lane in lanes if lane.account is not None]
    if not accounted:
        return ""
    apart = {node for node, e in end.finals if e is not None and _excluded(e)}
    counted = [(node, a) for node, a in accounted if node not in apart] or accounted
    whole = goodput.job([a for _, a in counted])
    # the worst node: the one whose parts goodput.job took (all but waiting, which it extends to the job's wall time)
    worst = next(node for node, a in counted if _beyond_waiting(a) == _beyond_waiting(whole))
    restarts = len({e.integer("attempt") for e in events if e.name == "restart"})
    kept = any(isinstance(e.record, CheckpointKept) and e.record.state == "kept" for e in events)
    text = goodput.line(whole, restarts, kept=kept, nodes=len(counted), worst=worst)
    left = sorted({node for node, _ in accounted} - {node for node, _ in counted})
    return text + (f"; not counted, excluded: {', '.join(left)}" if left else "")


def _beyond_waiting(a: Goodput) -> tuple[float, ...]:
    return a.productive_s, a.startup_s, a.restart_s, a.stall_s, a.lost_s


@dataclass(frozen=True)
class JobEnd:
    """How the job ended across its nodes: each node's last ``job.end`` (None: it has none), and the job's span from
    the earliest event of any node to the latest ``job.end`` (on the lanes' aligned clock; None with no job.end)."""

    finals: tuple[tuple[str, Event | None], ...]  # (node, its last job.end), in the order of the nodes' names
    took: float | None

    @property
    def events(self) -> tuple[Event, ...]:
        """One job.end per distinct ending (the first node's by name), the job's own before an excluded node's."""
        firsts: dict[str, Event] = {}
        for _, e in self.finals:
            if e is not None:
                firsts.setdefault(ending_words(e), e)
        return tuple(sorted(firsts.values(), key=lambda e: (_excluded(e), e.integer("exit_code") or 0)))


def job_end(groups: dict[tuple[str, str], list[Event]], wall: dict[Event, float]) -> JobEnd:
    """The job's end from every lane's events (``wall``: each event's time on the aligned clock): whatever the order of
    the files, the same."""
    finals = sorted(((node, _last_end(lane)) for (_, node), lane in groups.items()), key=lambda final: final[0])
    ended = [wall[e] for _, e in finals if e is not None]
    took = max(ended) - min(wall.values()) if ended else None
    return JobEnd(tuple(finals), took)


def _last_end(lane: Sequence[Event]) -> Event | None:
    """The lane's last job.end (a node writes one per run; its file is in the order it wrote)."""
    return next((e for e in reversed(lane) if e.name == "job.end"), None)


def ending_words(e: Event) -> str:
    """``succeeded (exit 0)``: a job.end's outcome and exit code."""
    return f"{e.text('outcome')} (exit {e.integer('exit_code')})"


def _excluded(e: Event) -> bool:
    """Whether this job.end is a node's that the job excluded (exit 4): its own end, not the job's."""
    return excluded(e.integer("exit_code"))


def outcome_words(end: JobEnd) -> str:
    """The job's outcome for the header. Every node ends with the job's outcome, except a node the job excluded (exit
    4, its own end) and one whose launcher died (no job.end): those are named apart. Nodes that ended differently are
    each named, grouped by their ending; nothing here depends on the order of the files."""
    ended = [(node, e) for node, e in end.finals if e is not None]
    if not ended:
        return "no job.end recorded (still running, or its launcher was killed)"
    apart = [(node, e) for node, e in ended if _excluded(e)]
    job = [(node, e) for node, e in ended if not _excluded(e)]
    if not job:  # every node was excluded (or the job's own error was exit 4 everywhere): that is the job's ending
        job, apart = ended, []
    groups: dict[str, list[str]] = {}
    for node, e in sorted(job, key=lambda ne: (ne[1].integer("exit_code") or 0, ne[0])):
        groups.setdefault(ending_words(e), []).append(node)
    if len(groups) == 1:
        text = f"{next(iter(groups))} after {_secs(end.took)}"
    else:
        text = (f"nodes ended differently after {_secs(end.took)}: "
                + "; ".join(f"{words} on {', '.join(nodes)}" for words, nodes in groups.items()))
    if apart:
        text += f"; excluded, exit {apart[0][1].integer('exit_code')}: {', '.join(node for node, _ in apart)}"
    if missing := [node for node, e in end.finals if e is None]:
        text += f"; no job.end recorded on {', '.join(missing)}"
    return text


def root_causes(events: Sequence[Event]) -> tuple[Event, ...]:
    """One failure per failed attempt (every node's file has the same root cause: the first seen is kept)."""
    seen: dict[int | None, Event] = {}
    for e in events:
        if e.name == "failure":
            seen.setdefault(e.integer("attempt"), e)
    return tuple(seen[k] for k in sorted(seen, key=lambda a: -1 if a is None else a))


def summarize(events: Sequence[Event], end: JobEnd) -> tuple[str, ...]:
    """The job in a few lines: its shape and outcome, then each attempt's root cause and what followed."""
    nodes = sorted({e.node for e in events})
    attempts = sorted({a for e in events if e.name == "workers.start" and (a := e.integer("attempt")) is not None})
    restarts = {e.integer("attempt"): e for e in events if e.name == "restart"}
    worlds = [w for e in events if e.name == "rdzv.round" and (w := e.integer("world_size")) is not None]
    stalls = sum(1 for e in events if e.name == "stall")
    named = straggler_namings(events)
    lost = sorted({n for e in events if e.name == "node.lost" for n in e.data.get("nodes") or [] if isinstance(n, str)})  # type: ignore[attr-defined]
    excluded = sorted({n for e in events if e.name == "node.excluded"
                       for n in e.data.get("nodes") or [] if isinstance(n, str)})  # type: ignore[attr-defined]

    shape = [f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"]
    if worlds:
        shape.append(f"world size {worlds[-1]}")
    shape.append(f"{len(attempts)} attempt{'s' if len(attempts) != 1 else ''}")
    shape.append(f"{len(restarts)} restart{'s' if len(restarts) != 1 else ''}")
    if stalls:
        shape.append(f"{stalls} stall report{'s' if stalls != 1 else ''}")
    if named:
        ranks = sorted({r for e in events if e.name == "straggler" and e.text("verdict") == "named"
                        and (r := e.integer("rank")) is not None})
        shape.append(f"straggler named {'once' if named == 1 else f'{named} times'}"
                     + (f": rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}" if ranks else ""))
    if lost:
        shape.append("lost: " + ", ".join(lost))
    if excluded:
        shape.append("excluded: " + ", ".join(excluded))
    if kept := kept_summary(events):
        shape.append(kept)
    shape.append(outcome_words(end))
    lines = [" · ".join(shape)]
    for cause in root_causes(events):
        attempt = cause.integer("attempt")
        host = cause.text("host")
        line = f"attempt {attempt}: {failure_words(cause)}" + (f" on {host}" if host else "")
        if attempt is not None and (nxt := restarts.get(attempt + 1)) is not None:
            line += f" → restart as attempt {attempt + 1}"
            if (reason := nxt.text("reason")) is not None:
                line += f" ({reason})"
        lines.append(line)
    return tuple(lines)


def kept_summary(events: Sequence[Event]) -> str:
    """``steps kept up to 120`` (the newest step any node kept), ``, 2 not kept`` (steps a node refused, each once
    whatever the nodes that refused it); "" when no step was saved."""
    kept = [e for e in events if e.name == "checkpoint.kept"]
    newest = max((s for e in kept if e.text("state") == "kept" and (s := e.integer("step")) is not None), default=None)
    refused = len({e.integer("step") for e in kept if e.text("state") == "refused"})
    if newest is None and not refused:
        return ""
    text = f"steps kept up to {newest}" if newest is not None else "no step kept"
    return text + (f", {refused} not kept" if refused else "")


def straggler_namings(events: Sequence[Event]) -> int:
    """How many times a rank was named a straggler: every node writes each verdict, so the most any one node's file
    holds (a node that joined later holds fewer)."""
    per_file: dict[tuple[str, str], int] = {}
    for e in events:
        if e.name == "straggler" and e.text("verdict") == "named":
            per_file[e.source, e.node] = per_file.get((e.source, e.node), 0) + 1
    return max(per_file.values(), default=0)


def nice_ticks(span: float, most: int = 10) -> list[float]:
    """Tick positions from 0 to ``span`` at a step of 1, 2 or 5 times a power of ten, at most ``most`` + 1 of them."""
    raw = span / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(span / step + 1e-9) + 1)]
