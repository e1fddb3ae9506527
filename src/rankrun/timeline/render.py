"""The drawing as one self-contained HTML page: inline SVG, CSS and a small script, nothing fetched from elsewhere.

Each lane ends with its node's goodput account, one bar of six coloured parts (a tooltip each), and the header gives
the job's account in the console's words. The picture is complete without the script; the script only shows the
hovered (or focused) mark's event in the side panel (or the N-th mark's, for ``page.html#mark-N``). Every string that
came from an event is escaped, in text and in attributes, and no event data is ever placed inside the script.
"""

from __future__ import annotations

import json
import time
from html import escape

from rankrun.events.goodput import PARTS
from rankrun.timeline.layout import CHAR_PX, PART_WORDS, Bar, Drawing, Lane, Mark, Part, nice_ticks
from rankrun.timeline.read import Event

PLOT_X = 150  # the lane labels' column
PLOT_W = 700
RIGHT = 24
AXIS_H = 28
ROW_H = 15  # one row of mark labels
ROUND_H = 13
ATTEMPT_H = 22
PHASE_H = 11
COPY_H = 9  # a row of the kept steps' copies (one to the neighbour, one to disk), on a lane that has such copies
GOODPUT_H = 9  # the node's goodput account, the lane's last row (on a lane that has an account)
GAP = 3
LANE_PAD = 8
LANE_MIN_H = 112  # the lane label's three lines above the rows' names

COLORS = {
    "succeeded": "#2e9d5b", "failed": "#d64541", "stopped": "#8d949c", "interrupted": "#8e6bbf",
    "moved_on": "#5b8def", "stalled": "#e08a1e", "open": "#b7bcc2", "unknown": "#b7bcc2",
    "round": "#9dbbe8", "rendezvous": "#9dbbe8", "spawn": "#b99be3", "workers": "#f2c869", "import": "#7cc7bd",
    "neighbour": "#6f8fc9", "disk": "#a0825a", "abandoned": "#d9dcdf",
}
# the goodput account's parts: each its own colour, none an attempt's or a phase's (the bar is told apart from them)
PART_COLORS = {"productive": "#1b7f4a", "waiting": "#c3c8ce", "startup": "#d8a31a", "restart": "#2a5cb8",
               "stall": "#f08c00", "lost": "#a61e4d"}
MARK_COLORS = {"failure": "#d64541", "restart": "#1f5fbf", "stall": "#e08a1e", "straggler": "#9c5a12", "node.lost": "#222222",
               "node.excluded": "#7a1f1f", "preload": "#1f7a70", "warm": "#1f7a70", "job.start": "#555555",
               "job.end": "#555555", "checkpoint.kept": "#1d3f6e", "checkpoint.refused": "#f5b700",
               "checkpoint.restored": "#127a3e"}

CSS = """
body{margin:0;font:13px/1.4 "DejaVu Sans",system-ui,sans-serif;color:#1d2125;background:#fff}
header{padding:10px 16px 6px;border-bottom:1px solid #e3e6ea}
h1{font-size:17px;margin:0 0 2px}
h1 code{font-size:16px;background:#eef1f5;padding:0 5px;border-radius:3px}
header p{margin:2px 0}
.when{color:#5f6670;font-size:12px}
.cause{color:#b3261e;font-weight:bold}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:11px;color:#3c434a;margin-top:6px}
.legend span{display:inline-flex;align-items:center;gap:4px}
.legend i{display:inline-block;width:14px;height:10px;border-radius:2px}
main{display:flex;align-items:flex-start}
#chart{flex:0 0 auto;overflow-x:auto}
aside{flex:1 1 240px;min-width:220px;border-left:1px solid #e3e6ea;padding:8px 12px;position:sticky;top:0}
aside h2{font-size:13px;margin:0 0 4px}
#caption{color:#5f6670;font-size:11px;margin:0 0 4px}
#event{font:11px/1.35 "DejaVu Sans Mono",monospace;white-space:pre-wrap;word-break:break-all;margin:0}
svg text{font-family:"DejaVu Sans",system-ui,sans-serif}
.lanebg{fill:#f6f8fa}
.node{font-size:12px;font-weight:bold}
.sub{font-size:10px;fill:#5f6670}
.tick{font-size:10px;fill:#5f6670}
.grid{stroke:#e3e6ea;stroke-width:1}
.bar{stroke:#fff;stroke-width:1}
.open{stroke:#6b7178;stroke-dasharray:3 2}
.inbar{font-size:11px;fill:#fff;pointer-events:none}
.inlight{font-size:10px;fill:#1d2125;pointer-events:none}
.lbl{font-size:11px;fill:#1d2125;paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
.row{font-size:9px;fill:#8a9099}
.lbl.failure{fill:#b3261e;font-weight:bold}
.lbl.restart{fill:#1f5fbf;font-weight:bold}
.leader{stroke-width:1;stroke-dasharray:2 2}
.part{stroke:#fff;stroke-width:0.5}
#goodput{margin:2px 0}
[data-event]{cursor:pointer}
[data-event]:hover .sym,[data-event].hot .sym,rect[data-event]:hover,rect[data-event].hot{stroke:#000;stroke-width:2}
"""

SCRIPT = r"""
(function(){
  var pre = document.getElementById('event'), cap = document.getElementById('caption'), hot = null;
  function show(el){
    if (hot) hot.classList.remove('hot');
    hot = el; el.classList.add('hot');
    var data = JSON.parse(el.getAttribute('data-event'));
    cap.textContent = el.getAttribute('data-caption');
    pre.textContent = (Array.isArray(data) ? data : [data]).map(function(e){ return JSON.stringify(e, null, 1); }).join('\n\n');
  }
  var marks = document.querySelectorAll('[data-event]');
  marks.forEach(function(el){
    el.addEventListener('mouseenter', function(){ show(el); });
    el.addEventListener('focus', function(){ show(el); });
  });
  // page.html#mark-N opens with the N-th mark or bar (in document order) shown: a link to one event
  function fromHash(){
    var m = /^#mark-(\d+)$/.exec(location.hash);
    if (m && marks[+m[1]]) show(marks[+m[1]]);
  }
  window.addEventListener('hashchange', fromHash);
  fromHash();
})();
"""


def _attr(value: str) -> str:
    return escape(value, quote=True)


def _event_attrs(events: tuple[Event, ...] | Event, caption: str) -> str:
    """The hover data: the event (or the events a bar is drawn from) exactly as read, and a caption."""
    data = events.data if isinstance(events, Event) else [e.data for e in events]
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f' tabindex="0" data-event="{_attr(text)}" data-caption="{_attr(caption)}"'


def _where(e: Event) -> str:
    return f"{e.name} · {e.source}:{e.line}"


def _x(t: float, drawing: Drawing) -> float:
    return PLOT_X + t / drawing.span * PLOT_W


def copy_rows(lane: Lane) -> dict[str, list[Bar]]:
    """The lane's copies by where they went (``neighbour``, ``disk``; the event's ``to``), a row each, in the order
    they first appear: a long copy to disk hides none to the neighbour."""
    rows: dict[str, list[Bar]] = {}
    for bar in lane.copies:
        rows.setdefault(bar.events[0].text("to") or "?", []).append(bar)
    return rows


def _copies_h(lane: Lane) -> int:
    """The copies' rows and the gaps above them; nothing on a lane without copies."""
    return len(copy_rows(lane)) * (GAP + COPY_H)


def _goodput_h(lane: Lane) -> int:
    """The goodput row and the gap above it; nothing on a lane without an account."""
    return GAP + GOODPUT_H if lane.parts else 0


def _lane_height(lane: Lane) -> int:
    bars = ROUND_H + GAP + ATTEMPT_H + GAP + PHASE_H + _copies_h(lane) + _goodput_h(lane)
    return max(LANE_MIN_H, LANE_PAD + lane.label_rows * ROW_H + 4 + bars + LANE_PAD)


def _bar(bar: Bar, y: float, height: int, drawing: Drawing) -> str:
    x0 = _x(bar.start, drawing)
    width = max(_x(bar.end, drawing) - x0, 2.0)
    fill = COLORS.get(bar.style, COLORS["unknown"])
    css = "bar open" if bar.style in ("open", "abandoned") else "bar"
    out = [f'<rect class="{css}" x="{x0:.1f}" y="{y:.1f}" width="{width:.1f}" height="{height}" rx="2" fill="{fill}"'
           f'{_event_attrs(bar.events, bar.label)}><title>{escape(bar.label)}</title></rect>']
    size = 11 if bar.kind == "attempt" else 10 if bar.kind != "copy" else 9
    fits = [t for t in _shorter(bar.label) if len(t) * CHAR_PX * size / 11 + 8 <= width]
    if fits and height >= 11:  # the longest form of the label the bar has room for
        css = "inbar" if bar.kind == "attempt" and bar.style not in ("open", "unknown") else "inlight"
        out.append(f'<text class="{css}" x="{x0 + 4:.1f}" y="{y + height / 2 + size * 0.36:.1f}">{escape(fits[0])}</text>')
    return "".join(out)


def _part(part: Part, y: float, drawing: Drawing) -> str:
    """One part of the node's goodput account: as wide as its seconds on the time axis, its words as its tooltip."""
    x0 = _x(part.start, drawing)
    return (f'<rect class="part" data-part="{part.name}" x="{x0:.1f}" y="{y:.1f}" width="{_x(part.end, drawing) - x0:.2f}"'
            f' height="{GOODPUT_H}" fill="{PART_COLORS[part.name]}"><title>{escape(part.label)}</title></rect>')


def _shorter(label: str) -> list[str]:
    """``attempt 0 · ranks 0-1 · forked · failed``, ``attempt 0 · forked · failed`` (no ranks), ``attempt 0 · failed``,
    ``attempt 0``: what a narrower bar can still say."""
    parts = label.split(" · ")
    if len(parts) <= 2:
        return [label, parts[0]]
    middle = [" · ".join([parts[0], *parts[2:]])] if len(parts) > 3 else []
    return [label, *middle, f"{parts[0]} · {parts[-1]}", parts[0]]


def _symbol(kind: str, x: float, y: float, hollow: bool = False) -> str:  # noqa: PLR0911 - one return per shape
    """Each kind of mark its own shape, drawn (no font needed); ``hollow``: a straggler recovered, a step refused."""
    color = MARK_COLORS.get(kind, "#555555")
    if kind == "checkpoint.kept":  # a tick across the attempt's bar; refused: red and dashed, the step was not kept
        color, dash = (MARK_COLORS["checkpoint.refused"], ' stroke-dasharray="3 2"') if hollow else (color, "")
        return (f'<path class="sym" d="M{x:.1f},{y - ATTEMPT_H / 2 - 2:.1f}v{ATTEMPT_H + 4}" stroke="{color}"'
                f' stroke-width="2"{dash}/>')
    if kind == "checkpoint.restored":  # a circle with an arrow back up: the step the attempt resumed from
        return (f'<circle class="sym" cx="{x:.1f}" cy="{y:.1f}" r="7" fill="{color}" stroke="#fff" stroke-width="1.5"/>'
                f'<path d="M{x:.1f},{y + 3.5:.1f}v-6m-3,3l3,-3l3,3" fill="none" stroke="#fff" stroke-width="1.6"/>')
    if kind == "failure":
        return (f'<circle class="sym" cx="{x:.1f}" cy="{y:.1f}" r="7" fill="{color}" stroke="#fff" stroke-width="1.5"/>'
                f'<path d="M{x - 3:.1f},{y - 3:.1f}l6,6m0,-6l-6,6" stroke="#fff" stroke-width="2"/>')
    if kind == "restart":
        return (f'<circle class="sym" cx="{x:.1f}" cy="{y:.1f}" r="7" fill="{color}" stroke="#fff" stroke-width="1.5"/>'
                f'<path d="M{x + 3.2:.1f},{y - 1:.1f}a3.4,3.4 0 1 1 -1.2,-2.6" fill="none" stroke="#fff" stroke-width="1.6"/>'
                f'<path d="M{x + 0.8:.1f},{y - 4.6:.1f}l2.6,0.8l-0.8,2.6z" fill="#fff"/>')
    if kind == "stall":
        return f'<path class="sym" d="M{x:.1f},{y - 8:.1f}l7.5,13h-15z" fill="{color}" stroke="#fff" stroke-width="1.5"/>'
    if kind == "straggler":  # a diamond: filled when named, an outline when it recovered
        fill, stroke = ("#fff", color) if hollow else (color, "#fff")
        return (f'<path class="sym" d="M{x:.1f},{y - 7:.1f}l7,7l-7,7l-7,-7z" fill="{fill}" stroke="{stroke}"'
                ' stroke-width="1.5"/>')
    if kind in ("node.lost", "node.excluded"):  # a square; excluded, with a cross: a node struck out of the job
        cross = f'<path d="M{x - 3:.1f},{y - 3:.1f}l6,6m0,-6l-6,6" stroke="#fff" stroke-width="2"/>'
        return (f'<rect class="sym" x="{x - 6:.1f}" y="{y - 6:.1f}" width="12" height="12" fill="{color}"'
                ' stroke="#fff" stroke-width="1.5"/>' + (cross if kind == "node.excluded" else ""))
    if kind in ("job.start", "job.end"):
        return f'<path class="sym" d="M{x:.1f},{y + 9:.1f}v-18l8,4l-8,4" fill="{color}" stroke="{color}" stroke-width="1.5"/>'
    return f'<circle class="sym" cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{color}" stroke="#fff" stroke-width="1.5"/>'


def _mark(mark: Mark, label_y: float, sym_y: float, drawing: Drawing) -> str:
    x = _x(mark.t, drawing)
    color = MARK_COLORS.get(mark.kind, "#555555")
    tx, anchor = (x + 6, "start") if mark.right else (x - 6, "end")
    symbol = _symbol(mark.kind, x, sym_y, hollow=_hollow(mark))
    label = (f'<line class="leader" x1="{x:.1f}" y1="{label_y + 3:.1f}" x2="{x:.1f}" y2="{sym_y:.1f}" stroke="{color}"/>'
             f'{symbol}'
             f'<text class="lbl {_attr(mark.kind)}" x="{tx:.1f}" y="{label_y:.1f}" text-anchor="{anchor}">'
             f'{escape(mark.label)}</text>') if mark.row >= 0 else symbol
    return f'<g class="mark"{_event_attrs(mark.event, _where(mark.event))}><title>{escape(mark.label)}</title>{label}</g>'


def _hollow(mark: Mark) -> bool:
    """A straggler that recovered, a step that was not kept: drawn as an outline of the mark's shape."""
    if mark.kind == "straggler":
        return mark.event.text("verdict") == "recovered"
    return mark.kind == "checkpoint.kept" and mark.event.text("state") == "refused"


def _lane(lane: Lane, top: float, index: int, drawing: Drawing) -> str:
    height = _lane_height(lane)
    out = []
    if index % 2 == 0:
        out.append(f'<rect class="lanebg" x="0" y="{top:.1f}" width="{PLOT_X + PLOT_W + RIGHT}" height="{height}"/>')
    out.append(f'<text class="node" x="10" y="{top + 18:.1f}"><title>{escape(lane.node)}</title>'
               f'{escape(_clip_middle(lane.node, 18))}</text>')
    if lane.ranks:
        out.append(f'<text class="sub" x="10" y="{top + 32:.1f}">ranks {escape(lane.ranks)}</text>')
    out.append(f'<text class="sub" x="10" y="{top + 45:.1f}">{escape(_tail(lane.source))}</text>')
    rounds_y = top + height - LANE_PAD - _goodput_h(lane) - _copies_h(lane) - PHASE_H - GAP - ATTEMPT_H - GAP - ROUND_H
    attempts_y = rounds_y + ROUND_H + GAP
    phases_y = attempts_y + ATTEMPT_H + GAP
    out += [_bar(b, rounds_y, ROUND_H, drawing) for b in lane.rounds]
    out += [_bar(b, attempts_y, ATTEMPT_H, drawing) for b in lane.attempts]
    out += [_bar(b, phases_y, PHASE_H, drawing) for b in lane.phases]
    rows = [("round", rounds_y, ROUND_H), ("attempt", attempts_y, ATTEMPT_H), ("start-up", phases_y, PHASE_H)]
    for i, (to, bars) in enumerate(copy_rows(lane).items()):
        y = phases_y + PHASE_H + GAP + i * (COPY_H + GAP)
        out += [_bar(b, y, COPY_H, drawing) for b in bars]
        rows.append((f"to {to}", y, COPY_H))
    if lane.parts:
        y = phases_y + PHASE_H + _copies_h(lane) + GAP
        out += [_part(p, y, drawing) for p in lane.parts if p.seconds > 0]
        rows.append(("goodput", y, GOODPUT_H))
    for name, y, h in rows:
        out.append(f'<text class="row" x="{PLOT_X - 8}" y="{y + h / 2 + 3:.1f}" text-anchor="end">{escape(name)}</text>')
    label_base = rounds_y - 6
    # the kept steps' ticks first, under the marks next to them; the root cause last, on top of the marks next to it
    # (a restart follows it within milliseconds)
    marks = sorted(lane.marks, key=lambda m: 0 if m.kind == "checkpoint.kept" else 2 if m.kind == "failure" else 1)
    out += [_mark(m, label_base - m.row * ROW_H, attempts_y + ATTEMPT_H / 2, drawing) for m in marks]
    return "".join(out)


def _clip_middle(text: str, most: int) -> str:
    """``node00.c…10.0.0.2``: a long name keeps its start and its end (where "name/IP" has the address)."""
    head = (most - 1) // 2
    return text if len(text) <= most else text[:head] + "…" + text[-(most - 1 - head) :]


def _tail(path: str, most: int = 22) -> str:
    name = path.rsplit("/", 1)[-1]
    return name if len(name) <= most else "…" + name[-(most - 1) :]


def _axis(drawing: Drawing, height: float) -> str:
    out = []
    for t in nice_ticks(drawing.span):
        x = _x(t, drawing)
        out.append(f'<line class="grid" x1="{x:.1f}" y1="{AXIS_H - 6}" x2="{x:.1f}" y2="{height:.1f}"/>')
        out.append(f'<text class="tick" x="{x:.1f}" y="{AXIS_H - 10}" text-anchor="middle">{t:g} s</text>')
    return "".join(out)


def svg(drawing: Drawing) -> str:
    heights = [_lane_height(lane) for lane in drawing.lanes]
    total = AXIS_H + sum(heights) + 4
    width = PLOT_X + PLOT_W + RIGHT
    body = [_axis(drawing, total)]
    top = float(AXIS_H)
    for i, (lane, h) in enumerate(zip(drawing.lanes, heights, strict=True)):
        body.append(_lane(lane, top, i, drawing))
        top += h
    return (f'<svg width="{width}" height="{total}" viewBox="0 0 {width} {total}"'
            f' role="img" aria-label="timeline of run {_attr(drawing.run)}">{"".join(body)}</svg>')


LEGEND = [
    ("round (rendezvous)", COLORS["round"], "rect"), ("attempt succeeded", COLORS["succeeded"], "rect"),
    ("failed", COLORS["failed"], "rect"), ("stopped", COLORS["stopped"], "rect"), ("stalled", COLORS["stalled"], "rect"),
    ("start-up: rendezvous", COLORS["rendezvous"], "rect"), ("spawn", COLORS["spawn"], "rect"),
    ("workers up", COLORS["workers"], "rect"), ("preload import", COLORS["import"], "rect"),
    ("failure", MARK_COLORS["failure"], "circle"), ("restart", MARK_COLORS["restart"], "circle"),
    ("stall", MARK_COLORS["stall"], "tri"), ("straggler", MARK_COLORS["straggler"], "diamond"),
    ("node lost", MARK_COLORS["node.lost"], "rect"),
    ("node excluded", MARK_COLORS["node.excluded"], "rect"),
    ("step kept", MARK_COLORS["checkpoint.kept"], "tick"), ("not kept", MARK_COLORS["checkpoint.refused"], "tick"),
    ("copy to neighbour", COLORS["neighbour"], "rect"), ("copy to disk", COLORS["disk"], "rect"),
    ("resumed from a step", MARK_COLORS["checkpoint.restored"], "circle"),
    *((("goodput: " if name == PARTS[0] else "") + PART_WORDS[name], PART_COLORS[name], "rect") for name in PARTS),
]


def _legend() -> str:
    items = []
    for name, color, shape in LEGEND:
        radius = "7px" if shape == "circle" else "2px"
        style = f"background:{color};border-radius:{radius}"
        if shape == "circle":
            style += ";width:11px;height:11px"
        if shape == "diamond":
            style += ";width:8px;height:8px;margin:0 1px;transform:rotate(45deg)"
        if shape == "tick":
            style += ";width:2px;height:12px;margin:0 6px"
        if shape == "tri":
            style = ("width:0;height:0;border-left:6px solid transparent;border-right:6px solid transparent;"
                     f"border-bottom:11px solid {color}")
        items.append(f'<span><i style="{style}"></i>{escape(name)}</span>')
    return f'<div class="legend">{"".join(items)}</div>'


def page(drawing: Drawing) -> str:
    """The whole HTML document."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(drawing.started))
    files = len({lane.source for lane in drawing.lanes})
    first, *causes = drawing.summary
    cause_lines = "".join(f'<p class="cause">{escape(line)}</p>' for line in causes)
    # the panel opens on the root causes, or else on how the job ended
    shown = drawing.root_causes or drawing.endings
    if drawing.root_causes:
        caption = "the root cause" + ("s" if len(shown) > 1 else "")
    else:
        caption = "how the job ended" if shown else "no failure, no job.end"
    goodput = f'<p id="goodput">{escape(drawing.goodput)}</p>' if drawing.goodput else ""
    initial = "\n\n".join(json.dumps(e.data, ensure_ascii=False, indent=1) for e in shown)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>rankrun run {escape(drawing.run)}: timeline</title>
<style>{CSS}</style></head>
<body>
<header>
<h1>rankrun job <code id="run">{escape(drawing.run)}</code></h1>
<p class="when">started {when} · drawn from {files} event file{"s" if files != 1 else ""} · times in seconds since the
 first event, each node's lane placed by the wall clock and drawn on its own monotonic clock</p>
<p id="summary"><b>{escape(first)}</b></p>
{cause_lines}
{goodput}
{_legend()}
</header>
<main>
<div id="chart">{svg(drawing)}</div>
<aside><h2>Event</h2><p id="caption">{escape(caption)} · hover a mark or bar for its event</p>
<pre id="event">{escape(initial)}</pre></aside>
</main>
<script>{SCRIPT}</script>
</body></html>
"""
