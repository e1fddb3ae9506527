"""Where a node's wall time went: the goodput account, a pure fold of one node's event sequence (docs/observing.md).

From ``job.start`` to ``job.end``, on the node's monotonic clock (``mono``), each second is in exactly one part:

- ``waiting``: before the node's first attempt (the rendezvous, the other nodes, a spare's wait), and after this node
  was excluded from the job; but ``--preload``'s one import, which runs then (its ``preload`` event's seconds), is
  start-up;
- ``startup``: each attempt from its workers' start (``workers.start``) to its first sign of training, the first of,
  in this order of trust: the first collective (``training``, from torch's Flight Recorder), the start of the first
  kept ``rankrun.checkpoint.save`` (``checkpoint.kept``, less its blocking seconds), every rank reaching the store in
  ``init_process_group`` (``startup``'s store phase, one node); with none of them, the workers' start itself;
- ``stall``: from a stall's start (its report, less the seconds the workers had been silent) to its end
  (``stall.end``) or the attempt's;
- ``lost``: in an attempt that did not succeed (a failure, a stall that failed it, a lost or new node, a signal), the
  training after the newest step kept in it (``checkpoint.kept``), or all of its training when it kept none. Such an
  attempt that showed no sign of training failed in its start-up where another attempt of the node showed one (all of
  it is start-up); where none ever did (a plain script), it counts from the workers' start, as all lost;
- ``restart``: from such an attempt's end (``workers.end``) to the next attempt's start, or to the job's end;
- ``productive``: the rest: training in attempts that succeeded, and up to the newest kept step in those that did not.

``Ledger`` folds events one at a time (O(1) each, a few microseconds) and gives the account at any moment
(``at``): the open phase runs to that moment, an attempt still running counts as succeeding so far, and its time
before a sign of training counts as start-up. ``account`` is the fold of a whole sequence; ``job`` the job's account
from its nodes' (the longest wall time, the worst node's parts); ``line`` the console's words for it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rankrun.events.records import (
    CheckpointKept,
    Goodput,
    JobEnd,
    JobStart,
    NodeExcluded,
    Preload,
    Record,
    Restart,
    Stall,
    StallEnd,
    Startup,
    Training,
    WorkersEnd,
    WorkersStart,
)

PARTS = ("productive", "waiting", "startup", "restart", "stall", "lost")  # Goodput's fields, less wall_s, in order
# the signs of training an attempt may show, most trusted first (its first sign is the most trusted one it showed)
COLLECTIVE, SAVE, STORE = 0, 1, 2
SIGN_NAMES = ("the first collective", "the first kept save", "the store's first requests")


@dataclass
class _Attempt:
    """The attempt running on this node: where its parts' boundaries are, so far."""

    start: float  # workers.start's mono
    number: int  # its attempt number (workers.start's)
    sign: float | None = None  # its first sign of training
    sign_rank: int = len(SIGN_NAMES)  # how trusted that sign is (lower: more)
    kept: float | None = None  # when its newest step was kept
    stalls: list[list[float]] = field(default_factory=list)  # [start, end]; an open one ends at inf

    def signal(self, at: float, rank: int) -> None:
        if rank < self.sign_rank:
            self.sign, self.sign_rank = at, rank


@dataclass
class Ledger:
    """One node's account, event by event (see the module docstring). ``node``: this node's address, to know its own
    exclusion; ``kept_any``: whether the node kept any step (``rankrun.checkpoint``); ``restarts``: restarts seen."""

    node: str = ""
    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    began: float | None = None  # job.start's mono
    ended: float | None = None  # job.end's mono
    gap: str = "waiting"  # the part the time between attempts goes to now
    gap_since: float | None = None
    attempt: _Attempt | None = None
    restarts: int = 0
    kept_any: bool = False
    signs: list[int] = field(default_factory=list)  # the sign each closed attempt ended on (SIGN_NAMES' index)
    # each attempt that failed before any sign of training: its parts as start-up, and as work (start-up 0), for a node
    # that showed a sign in another attempt (it failed in its start-up) or never did (a job without signs)
    unsigned: list[tuple[dict[str, float], dict[str, float]]] = field(default_factory=list)
    imported: float = 0.0  # --preload's one import (its ready event's seconds): start-up, though before any attempt

    def add(self, event: Record) -> None:  # noqa: PLR0912 - one case per event that moves a boundary
        """Fold one event in (the node's own, in the order it wrote them)."""
        mono = event.mono
        if self.began is None:
            self.began = mono
            self.gap_since = mono
            self.node = self.node or event.node
        if self.ended is not None:
            return
        match event:
            case JobStart():
                pass
            case WorkersStart():
                self._close_gap(mono)
                self.attempt = _Attempt(mono, event.attempt)
            case Training(seconds=seconds) if self.attempt is not None and event.attempt == self.attempt.number:
                self.attempt.signal(self.attempt.start + max(0.0, seconds), COLLECTIVE)
            case CheckpointKept(state="kept", seconds=seconds):
                self.kept_any = True
                if self.attempt is not None:
                    self.attempt.signal(mono - seconds, SAVE)
                    self.attempt.kept = mono
            case Startup(store_max=store, spawn=spawn) if (self.attempt is not None and store is not None
                                                          and event.attempt == self.attempt.number):
                self.attempt.signal(self.attempt.start - spawn + store, STORE)
            case Stall(silent=silent) if self.attempt is not None:
                self.attempt.stalls.append([mono - (silent or 0.0), float("inf")])
            case StallEnd() if self.attempt is not None:
                for stall in self.attempt.stalls:  # a stall reported again in another place is the same stall
                    stall[1] = min(stall[1], mono)
            case WorkersEnd(outcome=outcome) if self.attempt is not None:
                self._close_attempt(mono, succeeded=outcome == "succeeded")
            case Restart():
                self.restarts += 1
            case Preload(state="ready", seconds=seconds) if not self.imported:
                self.imported = max(0.0, seconds or 0.0)  # a file's null read as no import known
            case NodeExcluded(nodes=nodes) if self.attempt is None and _names(nodes, self.node):
                self._close_gap(mono)
                self.gap = "waiting"
            case JobEnd():
                self._end(mono, succeeded=event.outcome == "succeeded")
            case _:
                pass

    def _end(self, mono: float, *, succeeded: bool) -> None:
        if self.attempt is not None:
            self._close_attempt(mono, succeeded=succeeded)
        self._close_gap(mono)
        self.ended = mono

    def at_end(self, now: float, *, succeeded: bool) -> Goodput:
        """The account a ``job.end`` at ``now`` will leave (an attempt still open is closed as the job ended), before
        that event exists: the account it carries. The ledger is left as it is."""
        if self.ended is not None:
            return self.at(now)
        final = copy.deepcopy(self)
        final._end(now, succeeded=succeeded)
        return final.at(now)

    def at(self, now: float) -> Goodput:
        """The account from the job's start to ``now`` (the job's end once it ended, whatever ``now`` says)."""
        end = self.ended if self.ended is not None else now
        began = self.began if self.began is not None else end
        parts = dict(self.parts)
        if self.imported:  # the import ran while the node waited for its first attempt: it was start-up
            moved = min(self.imported, parts["waiting"])
            parts["waiting"] -= moved
            parts["startup"] += moved
        trained = self.trained
        for as_startup, as_work in self.unsigned:
            for name, value in (as_startup if trained else as_work).items():
                parts[name] += value
        if self.ended is None:
            if self.attempt is not None:
                for name, value in _split(self.attempt, end, succeeded=True, now=True).items():
                    parts[name] += value
            elif self.gap_since is not None:
                parts[self.gap] += max(0.0, end - self.gap_since)
        return Goodput(_r(end - began), *(_r(parts[name]) for name in PARTS))

    @property
    def trained(self) -> bool:
        """Whether any attempt of this node showed a sign of training (the running one included)."""
        return any(sign < len(SIGN_NAMES) for sign in self.signs) or (self.attempt is not None
                                                                       and self.attempt.sign is not None)

    @property
    def sign(self) -> str | None:
        """What the last closed attempt's start-up ended on, in words; None before any attempt ended."""
        return SIGN_NAMES[self.signs[-1]] if self.signs and self.signs[-1] < len(SIGN_NAMES) else None

    def _close_gap(self, mono: float) -> None:
        if self.gap_since is not None:
            self.parts[self.gap] += max(0.0, mono - self.gap_since)
        self.gap_since = mono

    def _close_attempt(self, mono: float, *, succeeded: bool) -> None:
        attempt = self.attempt
        assert attempt is not None
        if attempt.sign is None and not succeeded:
            self.unsigned.append((_split(attempt, mono, succeeded=False, now=True), _split(attempt, mono, succeeded=False)))
        else:
            for name, value in _split(attempt, mono, succeeded=succeeded).items():
                self.parts[name] += value
        self.signs.append(attempt.sign_rank)
        self.attempt = None
        self.gap, self.gap_since = ("productive" if succeeded else "restart"), mono


def _split(attempt: _Attempt, end: float, *, succeeded: bool, now: bool = False) -> dict[str, float]:
    """An attempt's seconds from its start to ``end`` by part (pure). ``now``: with no sign of training yet, all of its
    time is start-up (it still runs; or it failed in its start-up); else its start-up ends at its start."""
    start = attempt.start
    end = max(end, start)
    sign = min(max(attempt.sign, start), end) if attempt.sign is not None else end if now else start
    stalls = _merged([(max(a, start), min(b, end)) for a, b in attempt.stalls if min(b, end) > max(a, start)])
    cut = end
    if not succeeded:
        cut = sign if attempt.kept is None else min(max(attempt.kept, sign), end)
    return {"startup": _free(start, sign, stalls), "stall": sum(b - a for a, b in stalls),
           "productive": _free(sign, cut, stalls), "lost": _free(cut, end, stalls)}


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _free(a: float, b: float, stalls: Sequence[tuple[float, float]]) -> float:
    """The seconds of [a, b) outside every stall."""
    if b <= a:
        return 0.0
    return (b - a) - sum(max(0.0, min(b, y) - max(a, x)) for x, y in stalls)


def _names(nodes: Iterable[str], node: str) -> bool:
    """Whether an exclusion's names (``host/addr`` or ``name at addr``) name this node's address."""
    return bool(node) and any(n == node or n.endswith(("/" + node, " at " + node)) for n in nodes)


def _r(value: float) -> float:
    return round(max(0.0, value), 3)


def account(events: Iterable[Record], now: float | None = None) -> Goodput:
    """The account of one node's whole event sequence; a sequence without ``job.end`` runs to ``now`` (or to its last
    event)."""
    ledger, last = Ledger(), 0.0
    for event in events:
        ledger.add(event)
        last = event.mono
    return ledger.at(now if now is not None else last)


def job(accounts: Sequence[Goodput]) -> Goodput:
    """The job's account from its nodes' (pure): the longest wall time, and the parts of the node with the least
    productive share among those that ran workers (a spare's or an excluded node's waiting is not the job's); the time
    it did not see (it started later, or ended sooner) counts as its waiting."""
    if not accounts:
        return Goodput(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    wall = max(a.wall_s for a in accounts)
    worst = accounts[worst_of(accounts)]
    return Goodput(wall, worst.productive_s, _r(worst.waiting_s + wall - worst.wall_s), worst.startup_s,
                   worst.restart_s, worst.stall_s, worst.lost_s)


def worst_of(accounts: Sequence[Goodput]) -> int:
    """The index of the node ``job`` takes its parts from (pure): the least productive share, the longer wall time on a
    tie, among the nodes that did more than wait (a spare's or an excluded node's waiting is not the job's)."""
    ran = [i for i, a in enumerate(accounts) if a.wall_s > a.waiting_s] or list(range(len(accounts)))
    return min(ran, key=lambda i: (share(accounts[i]), -accounts[i].wall_s))


def share(a: Goodput) -> float:
    """Productive seconds over wall seconds (1.0 for no time at all)."""
    return a.productive_s / a.wall_s if a.wall_s > 0 else 1.0


def line(a: Goodput, restarts: int, *, kept: bool = True, nodes: int = 1, worst: str = "") -> str:
    """The console's line (without ``rankrun: ``): ``goodput 87.5 % of 40.1 s — start-up 6.2 %, restarts 5.0 % (1),
    stalls 0 %, lost 1.3 %, waiting 0 %``; ``kept`` False with time lost says nothing was kept; ``nodes`` above one:
    the job's account, naming its worst node (pure)."""
    whose = f" (the job, {nodes} nodes; the worst: {worst})" if nodes > 1 else ""
    text = (f"goodput {_pct(a.productive_s, a.wall_s)} of {_span(a.wall_s)}{whose} — "
            f"start-up {_pct(a.startup_s, a.wall_s)}, restarts {_pct(a.restart_s, a.wall_s)} ({restarts}), "
            f"stalls {_pct(a.stall_s, a.wall_s)}, lost {_pct(a.lost_s, a.wall_s)}, waiting {_pct(a.waiting_s, a.wall_s)}")
    if not kept and a.lost_s > 0:
        text += "; nothing was kept (rankrun.checkpoint): each failed attempt lost all its training"
    return text


def _pct(part: float, whole: float) -> str:
    if whole <= 0 or part <= 0:
        return "0 %"
    return f"{100.0 * part / whole:.1f} %"


def _span(value: float) -> str:
    """``40.1 s``, ``2 h 05 min``: a wall time for the line."""
    if value < 600:
        return f"{value:.1f} s"
    minutes = round(value / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60:02d} min"


def as_value(a: Goodput) -> dict[str, float]:
    """The account as the ``job.end`` event's ``goodput`` object, and the store's value."""
    return {name: getattr(a, name) for name in Goodput.__match_args__}


def from_value(obj: object) -> Goodput | None:
    """``as_value``'s inverse; None for anything else: a key missing, or a value that is not a number of seconds (a
    string, a boolean, below zero, not finite: another node's account would make the job's a NaN, or negative)."""
    if not isinstance(obj, dict):
        return None
    values: list[float] = []
    for name in Goodput.__match_args__:
        value = obj.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < math.inf:
            return None
        values.append(float(value))
    return Goodput(*values)
