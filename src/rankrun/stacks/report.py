"""Every rank's stacks → one short report: identical stacks grouped, the smallest group first (pure, golden-tested).

A hung job of N ranks is usually N-1 ranks waiting in the same collective and one somewhere else; the one
is what the reader needs, so groups are printed smallest first, each headed by its ranks as ranges
(``ranks 0-6,8``), its hosts, the process states and the CPU used since the previous sample. Frames are
``file:line in function``, outermost first; the outer frames every group shares are printed once, above
the groups. Other threads, where a dump has them (one of every thread: ``rankrun.stacks.dump``; rankrun's own
samples read the main thread alone), are grouped the same way across all ranks, one line a group. Past ``MAX_LINES``
the largest groups are folded to one line each, so the size depends on how many distinct stacks there are,
not on how many ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rankrun.ranges import range_string as ranges
from rankrun.record import record
from rankrun.stacks.dump import Dump, Frame

MAX_LINES = 95  # under 100 with <= 4 distinct stacks, at any world size
MAX_THREAD_LINES = 6
MAX_FRAMES = 12  # a group's own frames beyond the common ones; the innermost are kept


@record
class ProcState:
    """A worker process as /proc saw it at the sample."""

    state: str  # one letter of /proc/<pid>/stat: R running, S sleeping, D uninterruptible, T stopped, Z zombie
    cpu: float | None  # CPU seconds used since the previous sample; None at the first
    wchan: str = ""  # where the kernel has it waiting (/proc/<pid>/wchan), for a worker without a Python stack


@record
class Child:
    pid: int
    name: str
    state: str


@record
class RankSample:
    rank: int
    host: str
    dump: Dump | None  # None: no Python stack (not Python, or no answer in time)
    proc: ProcState | None  # None: the process is gone
    answered: bool = True  # False: it has the dump handler but nothing came back in time
    children: tuple[Child, ...] = ()


def who(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranges(ranks)}"


def _key(sample: RankSample) -> tuple[object, ...]:
    """What makes two ranks' main threads the same: their frames, or for no stack why there is none."""
    if sample.proc is None:
        return ("gone",)
    if not sample.answered:
        return ("no answer",)
    main = sample.dump.main if sample.dump is not None else None
    if main is None:
        return ("no python", sample.proc.wchan)
    return tuple(main.frames)


def signature(samples: Sequence[RankSample]) -> tuple[object, ...]:
    """What two samples must share for the ranks to count as stuck: every rank's main-thread stack (or why none)."""
    return tuple((s.rank, _key(s)) for s in sorted(samples, key=lambda s: s.rank))


@record
class _Group:
    key: tuple[object, ...]
    members: tuple[RankSample, ...]

    @property
    def ranks(self) -> list[int]:
        return [s.rank for s in self.members]

    @property
    def frames(self) -> tuple[Frame, ...]:
        return tuple(k for k in self.key if isinstance(k, Frame))


def group(samples: Sequence[RankSample]) -> list[_Group]:
    """Ranks with the same main-thread stack together; smallest group first, then by lowest rank."""
    by_key: dict[tuple[object, ...], list[RankSample]] = {}
    for s in sorted(samples, key=lambda s: s.rank):
        by_key.setdefault(_key(s), []).append(s)
    groups = [_Group(k, tuple(v)) for k, v in by_key.items()]
    return sorted(groups, key=lambda g: (len(g.members), g.members[0].rank))


def _common_prefix(stacks: Sequence[tuple[Frame, ...]]) -> tuple[Frame, ...]:
    if not stacks:
        return ()
    first = stacks[0]
    n = 0
    while n < len(first) and all(len(s) > n and s[n] == first[n] for s in stacks):
        n += 1
    return first[:n]


def _hosts(members: Sequence[RankSample]) -> str:
    hosts = sorted({s.host for s in members})
    return ", ".join(hosts) if len(hosts) <= 3 else f"{len(hosts)} hosts"


def _states(members: Sequence[RankSample]) -> str:
    counts: dict[str, int] = {}
    for s in members:
        letter = s.proc.state if s.proc is not None else "gone"
        counts[letter] = counts.get(letter, 0) + 1
    if len(counts) == 1:
        return f"state {next(iter(counts))}"
    return "states " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def _cpu(members: Sequence[RankSample]) -> str:
    used = [s.proc.cpu for s in members if s.proc is not None and s.proc.cpu is not None]
    if not used:
        return ""
    low, high = min(used), max(used)
    return f", {high:.2f} s CPU since the last sample" if low == high else f", {low:.2f}-{high:.2f} s CPU since the last sample"


def _heading(g: _Group) -> str:
    n = len(g.members)
    count = f"{n} rank{'s' if n > 1 else ''}"
    return f"  {who(g.ranks)} on {_hosts(g.members)} ({count}; {_states(g.members)}{_cpu(g.members)}):"


def _body(g: _Group, common: int) -> list[str]:
    kind = g.key[0] if g.key and not isinstance(g.key[0], Frame) else None
    if kind == "gone":
        return ["    (the process is gone)"]
    if kind == "no answer":
        return ["    (no stack came back in time: stopped, or in the kernel with signals blocked)"]
    if kind == "no python":
        wchan = g.key[1] or "-"
        return [f"    (no Python stack: not a Python worker with rankrun's dump handler; kernel wait: {wchan})"]
    own = g.frames[common:]
    lines = []
    if len(own) > MAX_FRAMES:
        lines.append(f"    ... {len(own) - MAX_FRAMES} frames ...")
        own = own[-MAX_FRAMES:]
    if not own:
        lines.append("    (the common frames above are the whole stack)")
    lines += [f"    {f}" for f in own]
    return lines


def _folded(g: _Group) -> str:
    frames = g.frames
    where = str(frames[-1]) if frames else (str(g.key[0]) if g.key else "?")
    return f"  {who(g.ranks)} on {_hosts(g.members)} ({len(g.members)} ranks; {_states(g.members)}): ... {where}"


def _threads(samples: Sequence[RankSample]) -> list[str]:
    by_stack: dict[tuple[Frame, ...], list[int]] = {}
    for s in samples:
        if s.dump is None:
            continue
        for t in s.dump.others:
            by_stack.setdefault(t.frames, []).append(s.rank)
    if not by_stack:
        return []
    total = sum(len(r) for r in by_stack.values())
    lines = [f"  other threads: {total} in {len(by_stack)} distinct stack{'s' if len(by_stack) > 1 else ''}:"]
    ordered = sorted(by_stack.items(), key=lambda kv: (len(kv[1]), min(kv[1])))
    for frames, ranks in ordered[:MAX_THREAD_LINES]:
        where = str(frames[-1]) if frames else "(no Python frame)"
        n = len(ranks)
        lines.append(f"    {who(sorted(set(ranks)))} ({n} thread{'s' if n > 1 else ''}): {where}")
    if len(ordered) > MAX_THREAD_LINES:
        lines.append(f"    ... {len(ordered) - MAX_THREAD_LINES} more thread stacks")
    return lines


def _children(samples: Sequence[RankSample]) -> list[str]:
    lines = []
    for s in sorted(samples, key=lambda s: s.rank):
        if s.children:
            shown = ", ".join(f"{c.pid} {c.name} {c.state}" for c in s.children[:4])
            more = f" and {len(s.children) - 4} more" if len(s.children) > 4 else ""
            lines.append(f"    rank {s.rank}: {shown}{more}")
    if not lines:
        return []
    if len(lines) > MAX_THREAD_LINES:
        lines = [*lines[:MAX_THREAD_LINES], f"    ... {len(lines) - MAX_THREAD_LINES} more ranks with children"]
    return ["  children of the workers (pid, name, state):", *lines]


def _across(samples: Sequence[RankSample], nodes: int) -> str:
    n = len(group(samples))
    text = f"{n} distinct stack{'s' if n != 1 else ''} across {len(samples)} rank{'s' if len(samples) != 1 else ''}"
    return text + (f" on {nodes} nodes" if nodes > 1 else "")


def stall_title(run_id: str, silent: str, samples: Sequence[RankSample], *, nodes: int = 1) -> tuple[str, list[RankSample]]:
    """The report's first line (the word "stalled" on it), and the ranks the report is about: those still running.
    Ranks that already exited (0: a failure would have ended the attempt) are named on the line instead."""
    exited = [s.rank for s in samples if s.proc is None]
    running = [s for s in samples if s.proc is not None]
    if exited and running:
        stuck = who([s.rank for s in running])
        return (f"rankrun: job {run_id} stalled: {who(exited)} exited 0, {stuck} did not: no output for {silent} s; "
                f"{_across(running, nodes)}"), running
    return f"rankrun: job {run_id} stalled: no output for {silent} s; {_across(samples, nodes)}", list(samples)


def request_title(run_id: str, samples: Sequence[RankSample], *, nodes: int = 1) -> str:
    """The first line of a ``rankrun --stacks`` report."""
    return f"rankrun: job {run_id} stacks on request: {_across(samples, nodes)}"


def stall_cause(silent: str, samples: Sequence[RankSample]) -> str:
    """One line for the failure report: how long, and where the smallest group (the outliers) sits."""
    running = [s for s in samples if s.proc is not None]
    outliers = group(running)[0] if running else None
    if outliers is None:
        return f"no output for {silent} s"
    where = _user_frame(outliers.frames)
    at = f" at {where}" if where is not None else ""
    on = f" on {_hosts(outliers.members)}" if len({s.host for s in running}) > 1 else ""
    return f"no output for {silent} s; {who(outliers.ranks)}{on} (the smallest group of stacks){at}"


def stall_outlier(samples: Sequence[RankSample], owners: Mapping[int, str]) -> str | None:
    """The node to blame for a stall (pure): the one (``owners``: rank → node id) holding every rank of the smallest
    group of stacks, the outliers, among the ranks still running. None where no one node stands out: one group (every
    rank waits in the same place: the job's own hang, not a node's), a tie for the smallest (no outlier), outliers on
    several nodes, or a rank whose node is not known (``owners`` is empty when some node's stacks are missing: the
    smallest group of what was seen need not be the job's)."""
    groups = group([s for s in samples if s.proc is not None])
    if len(groups) < 2 or len(groups[0].members) == len(groups[1].members):
        return None
    nodes = {owners.get(s.rank) for s in groups[0].members}
    node = nodes.pop() if len(nodes) == 1 else None
    return node or None


def _user_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame of the user's code: not the standard library's, nor an installed package's."""
    for frame in reversed(frames):
        if not frame.file.startswith("<") and "/lib/python" not in frame.file and "site-packages" not in frame.file:
            return frame
    return frames[-1] if frames else None


def render(title: str, samples: Sequence[RankSample], notes: Sequence[str] = ()) -> list[str]:
    """The report: ``title`` (already saying stalled / on request), then the groups. ``notes``: a line each at
    the end, e.g. for a node whose agent did not answer."""
    groups = group(samples)
    stacks = [g.frames for g in groups if g.frames and g.key and isinstance(g.key[0], Frame)]
    common = _common_prefix(stacks) if len(stacks) == len(groups) else ()
    head = [title]
    if common and len(groups) > 1:
        head.append("  frames every rank shares (outermost first):")
        head += [f"    {f}" for f in common]
    blocks = [[_heading(g), *_body(g, len(common) if len(groups) > 1 else 0)] for g in groups]
    tail = [*_threads(samples), *_children(samples)]
    tail += [f"  {note}" for note in notes]
    # Fold the largest groups (printed last) until the report fits; past that, sum up the largest in one line.
    folded = len(blocks)
    while sum(len(b) for b in blocks) + len(head) + len(tail) > MAX_LINES and folded > 1:
        folded -= 1
        blocks[folded] = [_folded(groups[folded])]
    room = MAX_LINES - len(head) - len(tail) - 1
    kept = 0
    while kept < len(blocks) and sum(len(b) for b in blocks[:kept + 1]) <= room:
        kept += 1
    kept = max(kept, 1)
    if kept < len(blocks):
        rest = [r for g in groups[kept:] for r in g.ranks]
        blocks = [*blocks[:kept], [f"  ... {len(blocks) - kept} more stacks, the largest groups ({who(rest)})"]]
    return [*head, *(line for b in blocks for line in b), *tail]
