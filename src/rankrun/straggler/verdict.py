"""Which ranks the others waited for over one window, and what to say when that changes (pure: no I/O, no clocks).

In a synchronous job a collective is a barrier: every rank's step takes as long as the slowest's, so per-rank step
times name nobody. Only *who arrives last* does. Two signals, from what the launcher already owns:

- **Arrivals** (torch's Flight Recorder, where the workers' torch records): the wall time each rank entered each
  collective, on one clock (``clock`` aligns other hosts'). A rank is **late** on a collective when it arrived at
  least ``LAG_FLOOR`` after the median of the earlier half of the ranks (the earlier half: a slow node's several
  ranks must not drag the reference up to themselves; with two ranks it is the first one). Its **lag** there is by
  how much. A rank is a straggler when it was late on at least ``SHARE`` of the window's collectives it took part
  in (most of them, not once), on at least ``MIN_COLLECTIVES``, and its lags add up to at least ``COST`` of the
  window: the others spent that much of the window waiting for it. NCCL's asynchronous collectives still record
  when each rank enqueued them, which is what arrival order needs (not verified here: no GPU).
- **Stack samples** (where a rank's recorder cannot be read: a private API gone or changed): the share of a
  rank's samples that found its main thread waiting in a collective. A straggler is almost never found waiting
  (at most ``ITS_WAITING``) while the others mostly are (the median of theirs at least ``OTHERS_WAITING``). Not
  always (over ``PROGRESS``): a job where every rank waits in every sample is not progressing at all, which is a
  stall, and the stall report owns it.

A balanced job has no rank late in most collectives; a job that is idle or between steps, or loading data on every
rank, has no collectives to be late on and no rank whose peers wait in theirs. ``/proc`` CPU use and state are
shown beside a verdict (a rank throttled to a CPU quota runs slow the same way), never judged on alone.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LAG_FLOOR = 0.005  # seconds: below it, arrival order is jitter (a scheduler's tick, a cache miss)
SHARE = 0.5  # late on at least this share of the window's collectives
MIN_COLLECTIVES = 8  # and on at least this many: a rank late once is no straggler
COST = 0.02  # its lags add up to at least this share of the window
MIN_SAMPLES = 10  # stack samples a rank needs before its share counts
ITS_WAITING = 0.25  # a straggler is found waiting in a collective in at most this share of its samples
OTHERS_WAITING = 0.5  # while the median of the other ranks' shares is at least this
PROGRESS = 0.98  # and at most this: every rank waiting in every sample is a stall, not a straggler

STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O", "T": "stopped", "t": "stopped",
          "Z": "exited"}


@dataclass(frozen=True)
class RankWindow:
    """What one rank's agent saw of it over a window: its stack samples, and /proc."""

    rank: int
    where: str  # its node as lines name it: "node-3/10.0.0.13"
    samples: int = 0  # stack samples taken
    waiting: int = 0  # of them, those that found its main thread waiting in a collective
    cpu: float | None = None  # CPU time over the window's wall time (1.0: one core busy); None: unknown
    state: str = ""  # the /proc state letter seen most often


# (process group, sequence number) → rank → when it entered that collective (seconds, one clock for all)
Arrivals = Mapping[tuple[str, int], Mapping[int, float]]


@dataclass(frozen=True)
class Straggler:
    """A rank the others waited for over a window, with the figures its line gives."""

    rank: int
    where: str
    cost: float  # the share of the window the others spent waiting for it
    late: int = 0  # arrivals: collectives it was late on
    total: int = 0  # of the window's collectives it took part in
    lag: float | None = None  # arrivals: its median lag on those (seconds); None: judged on stack samples
    its_waiting: float | None = None  # stack samples: the share that found it waiting in a collective
    others_waiting: float | None = None  # and the median of the other ranks' shares
    cpu: float | None = None
    state: str = ""


def lags(arrivals: Arrivals) -> dict[int, tuple[int, list[float]]]:
    """Each rank's collectives taken part in (of those at least two ranks recorded), and its lag on each it was late
    on (pure)."""
    taken: Counter[int] = Counter()
    late: defaultdict[int, list[float]] = defaultdict(list)
    for when in arrivals.values():
        if len(when) < 2:
            continue  # one rank's record: nobody to compare it with (the others have not reached it yet)
        times = sorted(when.values())
        reference = _median(times[: len(times) // 2])
        for rank, at in when.items():
            taken[rank] += 1
            if at - reference >= LAG_FLOOR:
                late[rank].append(at - reference)
    return {rank: (count, late[rank]) for rank, count in taken.items()}


def judge(ranks: Sequence[RankWindow], arrivals: Arrivals, window: float, *, scale: float = 1.0) -> list[Straggler] | None:
    """The window's stragglers, the costliest first (pure): by arrivals where the window has enough collectives,
    else by stack samples. ``window``: its length in seconds; ``scale``: how many of the window's collectives each
    one in ``arrivals`` stands for (a sample of them: ``summary``). None when the window tells nothing either way:
    too few collectives and samples, or every rank waiting in a collective in (almost) every sample, a stall; the
    verdict then stays as it was."""
    by_rank = {r.rank: r for r in ranks}
    found = _by_arrivals(by_rank, arrivals, window, scale)
    if found is None:
        found = _by_samples(by_rank)
    return None if found is None else sorted(found, key=lambda s: (-s.cost, s.rank))


def _by_arrivals(ranks: Mapping[int, RankWindow], arrivals: Arrivals, window: float,
                 scale: float) -> list[Straggler] | None:
    """None when no rank took part in ``MIN_COLLECTIVES`` collectives (no arrivals to judge on)."""
    per_rank = lags(arrivals)
    if not any(count >= MIN_COLLECTIVES for count, _ in per_rank.values()):
        return None
    found = []
    for rank, (count, its) in per_rank.items():
        cost = scale * sum(its) / window if window > 0 else 0.0
        if count >= MIN_COLLECTIVES and len(its) >= SHARE * count and cost >= COST:
            seen = ranks.get(rank, RankWindow(rank, ""))
            found.append(Straggler(rank, seen.where, min(cost, 1.0), round(len(its) * scale), round(count * scale),
                                   _median(its), cpu=seen.cpu, state=seen.state))
    return found


def _by_samples(ranks: Mapping[int, RankWindow]) -> list[Straggler] | None:
    """None when fewer than two ranks have ``MIN_SAMPLES``, or the job as a whole waited in over ``PROGRESS`` of
    them (no progress: a stall)."""
    shares = {r.rank: r.waiting / r.samples for r in ranks.values() if r.samples >= MIN_SAMPLES}
    if len(shares) < 2 or _median(list(shares.values())) > PROGRESS:
        return None
    found = []
    for rank, its in shares.items():
        others = [share for other, share in shares.items() if other != rank]
        if not others:
            continue
        typical = _median(others)
        if its <= ITS_WAITING and OTHERS_WAITING <= typical <= PROGRESS:
            seen = ranks[rank]
            found.append(Straggler(rank, seen.where, typical, its_waiting=its, others_waiting=typical, cpu=seen.cpu,
                                   state=seen.state))
    return found


# --- what to say


def line(s: Straggler) -> str:
    """The straggler's line, as every node prints it."""
    if s.lag is not None:
        why = (f"the other ranks waited for it in {_percent(s.late / s.total)} of {s.total} collectives "
               f"(median lag +{_ms(s.lag)})")
    else:
        why = (f"the other ranks were found waiting in a collective in {_percent(s.others_waiting or 0.0)} of their "
               f"stack samples, it in {_percent(s.its_waiting or 0.0)} (no Flight Recorder arrivals)")
    return f"rankrun: straggler: rank {s.rank} on {s.where} — {why}{_proc(s)}"


def figures(s: Straggler) -> str:
    """The straggler's figures in a few words (for a blame's reason)."""
    if s.lag is not None:
        return f"late on {_percent(s.late / s.total)} of {s.total} collectives, median lag +{_ms(s.lag)}"
    return f"found waiting in {_percent(s.its_waiting or 0.0)} of its samples, the others in " \
           f"{_percent(s.others_waiting or 0.0)}"


def recovered_line(rank: int, where: str) -> str:
    return f"rankrun: straggler: rank {rank} on {where} keeps up again: the others no longer wait for it"


@dataclass(frozen=True)
class Change:
    """One change of the verdict, with its line: a rank newly ``named`` (its figures), or recovered (the figures it
    was last named with)."""

    straggler: Straggler
    named: bool
    line: str


def changes(before: Mapping[int, Straggler], now: Sequence[Straggler]) -> list[Change]:
    """What changed from one verdict to the next (pure): each rank newly named, then each named before and no longer;
    a rank named in both says nothing again."""
    named = {s.rank for s in now}
    out = [Change(s, True, line(s)) for s in now if s.rank not in before]
    out += [Change(before[rank], False, recovered_line(rank, before[rank].where))
            for rank in sorted(before) if rank not in named]
    return out


def streaks(before: Mapping[int, int], now: Sequence[Straggler]) -> dict[int, int]:
    """How many windows in a row each rank named now has been named (pure): ``--straggler-action exclude`` acts on a
    rank named in enough consecutive windows."""
    return {s.rank: before.get(s.rank, 0) + 1 for s in now}


def blamed(before: Mapping[int, int], now: Sequence[Straggler], streak: int) -> tuple[dict[int, int], list[Straggler]]:
    """Each rank's streak after verdict ``now``, and the stragglers it blames (pure): those named ``streak`` windows in
    a row. A blamed rank counts again from nothing, so one that stays slow is blamed every ``streak`` windows, not
    every window after its first blame (``--max-node-failures`` counts the blames)."""
    counts = streaks(before, now)
    due = [s for s in now if counts[s.rank] >= streak]
    for s in due:
        counts[s.rank] = 0
    return counts, due


COLLECTIVE_FILE = "/torch/distributed/"  # where torch's collectives, barriers and waits on their work live
NOT_COLLECTIVES = frozenset({"init_process_group", "rendezvous", "_create_c10d_store", "_env_rendezvous_handler",
                             "destroy_process_group"})  # waiting to join or to leave is no straggler's doing


def in_collective(frames: Sequence[tuple[str, str]]) -> bool:
    """Whether a main thread's stack (``(file, function)`` from the outermost) waits in a collective (pure): one of its
    frames in ``torch/distributed/``, none of them joining or leaving the group."""
    inside = False
    for file, function in frames:
        if function in NOT_COLLECTIVES:
            return False
        inside = inside or COLLECTIVE_FILE in file
    return inside


def _median(values: Sequence[float]) -> float:
    """The median (``statistics`` costs every launch ~3 ms of imports: random, decimal, fractions)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _proc(s: Straggler) -> str:
    parts = []
    if s.cpu is not None:
        parts.append(f"CPU {_percent(s.cpu)}")
    if s.state:
        parts.append(STATES.get(s.state, s.state))
    return "; " + ", ".join(parts) if parts else ""


def _percent(share: float) -> str:
    return f"{round(100 * share)} %"


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"
