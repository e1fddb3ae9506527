"""The job's lifecycle facts, one frozen record per event of schema version 1 (docs/observing.md, schema.json).

A producer builds a record with the event's own keys only; the job's ``EventStream`` stamps the four keys every
event has (``ts``, ``mono``, ``run``, ``node``: the trailing fields, which a producer leaves at their defaults) and
hands the stamped record to each consumer. ``as_json`` is the schema's object for a record and ``from_json`` its
inverse (for a reader of the events file). Ranks are range strings (``ranges.range_string``), never one event per
rank; a failure's root cause and a straggler are one rank each. The free text that comes from a user's program or
machines (a failure's exception, a stall's title, a straggler's line with its host) is cut to ``TEXT_LIMIT``
characters in the JSON, so that a line stays short enough for a pipe to take whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from rankrun.record import record

VERSION = 1
COMMON = ("ts", "mono", "run", "node")  # every record's last four fields, in this order; the emitter's to fill
TEXT_LIMIT = 500  # characters of ``Failure.exception``, ``Stall.title``, ``StragglerEvent.line`` in the JSON (maxLength)
REASON_LIMIT = 200  # characters of ``Restart.reason`` in the JSON (schema.json's maxLength)

WorkersOutcome = Literal["succeeded", "failed", "stopped", "interrupted", "moved_on", "stalled"]
JobOutcome = Literal["succeeded", "failed", "interrupted", "error"]
StragglerVerdict = Literal["named", "recovered"]


@record
class JobStart:
    """The options that shape the job (``job.start``), first in every file."""

    nproc_per_node: int
    nnodes: str  # "N" or "MIN:MAX"
    max_restarts: int
    rdzv_backend: str
    entry: str  # the script, module (``-m``) or program (``--no-python``)
    ts: float = 0.0
    mono: float = 0.0
    run: str = ""
    node: str = ""


@record
class RdzvRound:
    """A rendezvous round formed (``rdzv.round``): its number, its size, this node's place, how long it took."""

    round: int
    nodes: int
    world_size: int
    group_rank: int
    seconds: float  # from this node's join to the round's forming
    ts: float = 0.0
    mono: float = 0.0
    run: str = ""
    node: str = ""


@record
class WorkersStart:
    """This node's workers started (``workers.start``)."""

    attempt: int
    ranks: str  # this node's global ranks, a range string
    pids: tuple[int, ...]  # in local-rank order
    ts: float = 0.0
    mono: float = 0.0
    run: str = ""
    node: str = ""


@record
class WorkersEnd:
    """This node's workers of an attempt are all gone (``workers.end``), and how the attempt ended here."""

    attempt: int
    outcome: WorkersOutcome
    ts: float = 0.0
    mono: float = 0.0
    run: str = ""
    node: str = ""


@record
class Failure:
    """The job's root cause (``failure``): once per failed attempt, on every node (each knows it)."""

    attempt: int
    rank: int
    host: str
    exit_code: int | None
    signal: str | None  # "SIGKILL"
    exception: str | None  # "Type: message", when the worker's error file said
    ts: float = 0.0
    mono: float = 0.0
    run: str = ""
    node: str = ""


@record
class Restart:
    """The job goes on with another attempt (``restart``)."""

    attempt: int  # the next attempt's number
    reason: str
    restarts_left: int
    ts: float = 0.0
    mono: float = 0.0
    run: str = ""
    node: str = ""


@record
class Stall:
    """Ranks reported stalled (``stall``)."""

    ranks: str  # a range string
    title: str  # the stall report's first line
    ts: float = 0.0
    mono: float = 0.0
    run: str = ""
    node: str = ""


@record
class StragglerEvent:
    """A straggler verdict that changed (``straggler``): a rank the others waited for over a window, newly ``named``,
    or ``recovered`` (named before, no longer). Judged by the host for the whole job and told on every node, once."""

    rank: int
    where: str  # its node as lines name it: "node-3/10.0.0.13"
    verdict: StragglerVerdict
    lag: float | None  # seconds: its median lag on the collectives it was late on; None when judged on stack samples
    share: float  # 0..1: the share of collectives it was late on, or of the others' stack samples found waiting
    collectives: int  # the window's collectives it took part in; 0 when judged on stack samples
    line: str  # the console line that said it
    ts: float = 0.0
    mono: float = 0.0
    run: str = ""
    node: str = ""


@record
class NodeLost:
    """Nodes lost by the job (``node.lost``): their leases ended."""

    nodes: tuple[str, ...]
    reason: str
    ts: float = 0.0
    mono: float = 0.0
    run: str = ""
    node: str = ""


@record
class NodeExcluded:
    """Nodes excluded from the job for good (``node.excluded``): blamed for too many failures, or unhealthy."""

    nodes: tuple[str, ...]
    reason: str
    ts: float = 0.0
    mono: float = 0.0
    run: str = ""
    node: str = ""


@record
class Startup:
    """An attempt's start-up phases in seconds (``startup``); per-rank phases as p50/max with the slowest rank."""

    attempt: int
    total: float
    rendezvous: float
    spawn: float
    script_p50: float | None
    script_max: float | None
    script_slowest: int | None
    store_p50: float | None
    store_max: float | None
    store_slowest: int | None
    ts: float = 0.0
    mono: float = 0.0
    run: str = ""
    node: str = ""


@record
class JobEnd:
    """The job ended (``job.end``): always the last event, also after SIGTERM."""

    exit_code: int
    outcome: JobOutcome
    ts: float = 0.0
    mono: float = 0.0
    run: str = ""
    node: str = ""


Record = (JobStart | RdzvRound | WorkersStart | WorkersEnd | Failure | Restart | Stall | StragglerEvent | NodeLost
          | NodeExcluded | Startup | JobEnd)
R = TypeVar("R", JobStart, RdzvRound, WorkersStart, WorkersEnd, Failure, Restart, Stall, StragglerEvent, NodeLost,
            NodeExcluded, Startup, JobEnd)

EVENTS: dict[type[Record], str] = {
    JobStart: "job.start",
    RdzvRound: "rdzv.round",
    WorkersStart: "workers.start",
    WorkersEnd: "workers.end",
    Failure: "failure",
    Restart: "restart",
    Stall: "stall",
    StragglerEvent: "straggler",
    NodeLost: "node.lost",
    NodeExcluded: "node.excluded",
    Startup: "startup",
    JobEnd: "job.end",
}
_KINDS: dict[str, type[Record]] = {name: kind for kind, name in EVENTS.items()}
# the free text cut in the JSON, and to how many characters: a restart's reason repeats the failure's exception,
# which its ``failure`` event already carries whole (to TEXT_LIMIT), so a node's file stays small; a straggler's line
# holds a host name, which a user's machines choose
_CUT = {(Failure, "exception"): TEXT_LIMIT, (Stall, "title"): TEXT_LIMIT, (StragglerEvent, "line"): TEXT_LIMIT,
        (Restart, "reason"): REASON_LIMIT}


def keys(kind: type[Record]) -> tuple[str, ...]:
    """The event's own keys (its fields but the common four), in the schema's order."""
    return kind.__match_args__[: -len(COMMON)]


def stamp(fact: R, ts: float, mono: float, run: str, node: str) -> R:
    """``fact`` with the common fields filled (whatever it had in them)."""
    own = {name: getattr(fact, name) for name in keys(type(fact))}
    return type(fact)(**own, ts=ts, mono=mono, run=run, node=node)


def as_json(fact: Record) -> dict[str, object]:
    """The schema's object for a stamped record: ``v``, the common keys, ``event``, then the event's keys."""
    kind = type(fact)
    out: dict[str, object] = {"v": VERSION, "ts": fact.ts, "mono": fact.mono, "run": fact.run, "node": fact.node,
                              "event": EVENTS[kind]}
    for name in keys(kind):
        value = getattr(fact, name)
        if isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, str) and len(value) > _CUT.get((kind, name), len(value)):
            value = value[: _CUT[kind, name] - 1] + "…"
        out[name] = value
    return out


def from_json(obj: Mapping[str, object]) -> Record:
    """The record an object of the events file stands for (lists become tuples); ``ValueError`` for anything else."""
    if obj.get("v") != VERSION:
        raise ValueError(f"not an event of schema version {VERSION}: v={obj.get('v')!r}")
    kind = _KINDS.get(str(obj.get("event")))
    if kind is None:
        raise ValueError(f"not an event of schema version {VERSION}: event={obj.get('event')!r}")
    missing = [k for k in COMMON if k not in obj]
    if missing:
        raise ValueError(f"{EVENTS[kind]}: missing {', '.join(missing)}")
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in obj.items() if k not in ("v", "event")}
    try:
        return kind(**values)
    except TypeError as exc:  # a key missing or unknown
        raise ValueError(f"{EVENTS[kind]}: {exc}") from None
