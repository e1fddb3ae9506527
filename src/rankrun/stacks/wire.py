"""The stacks exchange's records as they travel through the rendezvous store: compact, grouped, never pickle (pure).

A node's answer holds its ranks' samples with every distinct thread stack once, whatever the number of
ranks that share it, and every file name once: eight ranks waiting in one collective cost one stack, not
eight. The JSON is deflated (``zlib``): frames repeat the same few paths and function names. Layout of an
answer, before deflating::

    {"ask": 7, "round": 2, "node": 1, "host": "h2", "id": "node id",
     "files": ["/usr/lib/python3.11/threading.py", ...],
     "stacks": [[[file index, line, function], ...outermost first], ...],     each distinct thread stack once
     "ranks": [[rank, state, cpu, wchan, answered, main stack index, [other threads' stack indexes],
                [[child pid, name, state], ...]], ...]}

``state`` is ``null`` for a process that is gone, ``main`` is ``-1`` for no Python stack; ``id`` is the node as the
rendezvous knows it (a stall's blame names it), absent from an older version's answer. A value that does not decode
(another version, a damaged write) is read as no answer: that node is named as silent.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from rankrun.record import record
from rankrun.stacks.dump import Dump, Frame, ThreadStack
from rankrun.stacks.report import Child, ProcState, RankSample


def _pack(obj: dict[str, Any]) -> bytes:
    return zlib.compress(json.dumps(obj, separators=(",", ":")).encode(), 6)


def _unpack(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(zlib.decompress(data))
    except (zlib.error, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


@record
class Ask:
    """The ``stacks/ask`` key: somebody wants every node's stacks for round ``round``.
    Its ``mod_revision`` in the store is the ask's number, which every answer repeats."""

    round: int
    by: str  # the asking node's id
    why: str  # "stall" (a report every node prints) or "request" (rankrun --stacks: only the asker prints)

    def value(self) -> bytes:
        return _pack({"round": self.round, "by": self.by, "why": self.why})

    @classmethod
    def parse(cls, data: bytes) -> Ask | None:
        d = _unpack(data)
        try:
            return cls(int(d["round"]), str(d["by"]), str(d["why"]))
        except (KeyError, TypeError, ValueError):
            return None


@record
class Answer:
    """A node's ``stacks/answer/<node>`` key: its workers' samples for ask ``ask``."""

    ask: int
    round: int
    node: int  # group rank
    host: str
    samples: tuple[RankSample, ...]
    id: str = ""  # the node's id in the rendezvous ("": an older version's answer, whose node no stall can blame)

    def value(self) -> bytes:
        files: dict[str, int] = {}
        stacks: dict[tuple[Frame, ...], int] = {}

        def stack(frames: tuple[Frame, ...]) -> int:
            for f in frames:
                files.setdefault(f.file, len(files))
            return stacks.setdefault(frames, len(stacks))

        ranks = []
        for s in self.samples:
            main = s.dump.main if s.dump is not None else None
            others = s.dump.others if s.dump is not None else ()
            proc = s.proc
            ranks.append([s.rank, proc.state if proc else None, proc.cpu if proc else None, proc.wchan if proc else "",
                          s.answered, stack(main.frames) if main is not None else -1, [stack(t.frames) for t in others],
                          [[c.pid, c.name, c.state] for c in s.children]])
        return _pack({"ask": self.ask, "round": self.round, "node": self.node, "host": self.host, "id": self.id,
                      "files": list(files),
                      "stacks": [[[files[f.file], f.line, f.function] for f in frames] for frames in stacks],
                      "ranks": ranks})

    @classmethod
    def parse(cls, data: bytes) -> Answer | None:
        d = _unpack(data)
        try:
            files = [str(f) for f in d["files"]]
            stacks = [tuple(Frame(files[int(i)], int(line), str(fn)) for i, line, fn in s) for s in d["stacks"]]
            host = str(d["host"])
            samples = []
            for rank, state, cpu, wchan, answered, main, others, children in d["ranks"]:
                threads = [ThreadStack(0, True, stacks[main])] if main >= 0 else []
                threads += [ThreadStack(n + 1, False, stacks[i]) for n, i in enumerate(others)]
                proc = ProcState(str(state), None if cpu is None else float(cpu), str(wchan)) if state is not None else None
                samples.append(RankSample(int(rank), host, Dump(tuple(threads)) if threads else None, proc, bool(answered),
                                          tuple(Child(int(p), str(n), str(st)) for p, n, st in children)))
            return cls(int(d["ask"]), int(d["round"]), int(d["node"]), host, tuple(samples), str(d.get("id", "")))
        except (KeyError, TypeError, ValueError, IndexError):
            return None


@record
class JobReport:
    """The ``stacks/report`` key: the asker's report of the whole job for ask ``ask``, which every node prints
    (a stall) once per distinct ``signature``; ``cause`` is the failure report's line for ``--hang-action fail``, and
    ``blame`` the node holding the stall's outliers (``report.stall_outlier``; "": nobody specific, or an older
    version's report)."""

    ask: int
    round: int
    why: str
    signature: str
    lines: tuple[str, ...]
    cause: str
    blame: str = ""

    def value(self) -> bytes:
        return _pack({"ask": self.ask, "round": self.round, "why": self.why, "signature": self.signature,
                      "lines": list(self.lines), "cause": self.cause} | ({"blame": self.blame} if self.blame else {}))

    @classmethod
    def parse(cls, data: bytes) -> JobReport | None:
        d = _unpack(data)
        try:
            return cls(int(d["ask"]), int(d["round"]), str(d["why"]), str(d["signature"]),
                       tuple(str(line) for line in d["lines"]), str(d["cause"]), str(d.get("blame", "")))
        except (KeyError, TypeError, ValueError):
            return None
