"""The job's lifecycle facts, one frozen record per event of schema version 1 (docs/observing.md, schema.json).

A producer builds a record with the event's own keys only; the job's ``EventStream`` stamps the four keys every event
has (``ts``, ``mono``, ``run``, ``node``: ``Stamp``'s fields, declared there once, the trailing fields of every
record, which a producer leaves at their defaults) and hands the stamped record to each consumer. ``as_json`` is the
schema's object for a record and ``from_json`` its inverse (for a reader of the events file). Ranks are range strings
(``ranges.range_string``), never one event per rank; a failure's root cause and a straggler are one rank each. The
free text that comes from a user's program or machines (a failure's exception, a stall's title, a straggler's line
with its host, why a preloading process turned unsafe or ended, why a step was not kept, where a copy went) is cut to
``TEXT_LIMIT`` characters in the JSON, so that a line stays short enough for a pipe to take whole.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import field
from typing import Any, Literal, TypeVar, dataclass_transform

from rankrun.record import record

VERSION = 1
TEXT_LIMIT = 500  # characters of ``Failure.exception``, ``Stall.title``, ``StragglerEvent.line``, ``Preload.why``,
# ``CheckpointKept.why`` and ``CheckpointWritten.where`` in the JSON (schema.json's maxLength)
REASON_LIMIT = 200  # characters of ``Restart.reason`` in the JSON (schema.json's maxLength)

WorkersOutcome = Literal["succeeded", "failed", "stopped", "interrupted", "moved_on", "stalled"]
JobOutcome = Literal["succeeded", "failed", "interrupted", "error"]
StragglerVerdict = Literal["named", "recovered"]
PreloadState = Literal["ready", "unsafe", "ended"]
KeptState = Literal["kept", "refused"]
CopyTarget = Literal["neighbour", "disk"]
CopyState = Literal["complete", "abandoned"]
RestoreSource = Literal["memory", "neighbour", "disk"]
_T = TypeVar("_T", bound=type)


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def _event(cls: _T) -> _T:
    """``cls`` as a record of its own keys followed by the stamp's four (``Stamp``'s fields, said there once).

    ``@record`` takes no fields from a base, so the stamp's are added to each event's own here; the type checker reads
    them from the base, keyword-only, which is how producers and readers pass them. ``Stamp`` itself is left as it is.
    """
    common = next((base.__dict__["_fields"] for base in cls.__mro__[1:] if "_fields" in base.__dict__), None)
    if common is None:  # the stamp: its fields, with their defaults, for the events that follow
        declared = inspect.get_annotations(cls)
        cls._fields = {name: (declared[name], cls.__dict__[name].default) for name in declared}  # type: ignore[attr-defined]
        for name, (_, default) in cls._fields.items():  # type: ignore[attr-defined]
            setattr(cls, name, default)
        return cls
    cls.__annotations__ = {**inspect.get_annotations(cls), **{name: kind for name, (kind, _) in common.items()}}
    for name, (_, default) in common.items():
        setattr(cls, name, default)
    return record(cls)


@_event
class Stamp:
    """The four keys every event has, the last four fields of every record: the emitter's to fill (``stamp``), so a
    producer leaves them at their defaults."""

    ts: float = field(default=0.0, kw_only=True)  # wall clock, seconds since the epoch
    mono: float = field(default=0.0, kw_only=True)  # this node's monotonic clock
    run: str = field(default="", kw_only=True)  # the job's run id
    node: str = field(default="", kw_only=True)  # this node's address


COMMON = tuple(inspect.get_annotations(Stamp))  # ("ts", "mono", "run", "node"), in this order


@_event
class JobStart(Stamp):
    """The options that shape the job (``job.start``), first in every file."""

    nproc_per_node: int
    nnodes: str  # "N" or "MIN:MAX"
    max_restarts: int
    rdzv_backend: str
    entry: str  # the script, module (``-m``) or program (``--no-python``)


@_event
class RdzvRound(Stamp):
    """A rendezvous round formed (``rdzv.round``): its number, its size, this node's place, how long it took."""

    round: int
    nodes: int
    world_size: int
    group_rank: int
    seconds: float  # from this node's join to the round's forming


@_event
class WorkersStart(Stamp):
    """This node's workers started (``workers.start``)."""

    attempt: int
    ranks: str  # this node's global ranks, a range string
    pids: tuple[int, ...]  # in local-rank order


@_event
class WorkersEnd(Stamp):
    """This node's workers of an attempt are all gone (``workers.end``), and how the attempt ended here."""

    attempt: int
    outcome: WorkersOutcome


@_event
class Failure(Stamp):
    """The job's root cause (``failure``): once per failed attempt, on every node (each knows it)."""

    attempt: int
    rank: int
    host: str
    exit_code: int | None
    signal: str | None  # "SIGKILL"
    exception: str | None  # "Type: message", when the worker's error file said


@_event
class Restart(Stamp):
    """The job goes on with another attempt (``restart``)."""

    attempt: int  # the next attempt's number
    reason: str
    restarts_left: int


@_event
class Stall(Stamp):
    """Ranks reported stalled (``stall``)."""

    ranks: str  # a range string
    title: str  # the stall report's first line
    silent: float | None = None  # seconds the workers had been silent at the report: the stall began that long before;
    # None in files written before the key was (the goodput account then starts the stall at the report)


@_event
class StallEnd(Stamp):
    """A reported stall is over (``stall.end``): the workers wrote again, or their stacks moved. Not written when the
    attempt ends first: its ``workers.end`` ends the stall."""

    ranks: str  # a range string: the ranks the stall's report was about
    seconds: float  # from the silence's start to the first sign that it ended


@_event
class Training(Stamp):
    """This node's workers of an attempt are training (``training``): the first collective any of its ranks entered
    after ``init_process_group``, as torch's Flight Recorder saw it (read where the straggler watch reads it,
    ``--straggler-window``); once per attempt, at most."""

    attempt: int
    seconds: float  # from the workers' start (``workers.start``) to that collective, by the wall clock


@_event
class StragglerEvent(Stamp):
    """A straggler verdict that changed (``straggler``): a rank the others waited for over a window, newly ``named``,
    or ``recovered`` (named before, no longer). Judged by the host for the whole job and told on every node, once."""

    rank: int
    where: str  # its node as lines name it: "node-3/10.0.0.13"
    verdict: StragglerVerdict
    lag: float | None  # seconds: its median lag on the collectives it was late on; None when judged on stack samples
    share: float  # 0..1: the share of collectives it was late on, or of the others' stack samples found waiting
    collectives: int  # the window's collectives it took part in; 0 when judged on stack samples
    line: str  # the console line that said it


@_event
class NodeLost(Stamp):
    """Nodes lost by the job (``node.lost``): their leases ended."""

    nodes: tuple[str, ...]
    reason: str


@_event
class NodeExcluded(Stamp):
    """Nodes excluded from the job for good (``node.excluded``): blamed for too many failures, or unhealthy."""

    nodes: tuple[str, ...]
    reason: str


@_event
class Startup(Stamp):
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


@_event
class Preload(Stamp):
    """This node's preloading process (``--preload``; ``preload``): ``ready`` once it imported the modules and forks
    the workers; then ``unsafe`` (a preloaded module left a thread, a socket or a CUDA context: this node's workers
    start cold from now on) or ``ended`` (it died: later workers start cold), once, with why."""

    modules: str  # the module names, comma-separated, as given to --preload
    seconds: float  # how long the one import took in the preloading process; 0.0 when it never got ready
    state: PreloadState
    why: str = ""  # for unsafe and ended: the reason, in one line


@_event
class Warm(Stamp):
    """How this node's workers of an attempt started under ``--preload`` (``warm``): which ranks were forked from the
    preloading process and which started as fresh interpreters; once per attempt, right after they started."""

    attempt: int
    forked: str  # a range string, "" for none
    cold: str  # a range string, "" for none
    fork_p50: float | None  # seconds from the launcher's fork request to the preloading process's answer, over the
    fork_max: float | None  # forked workers; None when none was forked


@_event
class CheckpointKept(Stamp):
    """A step this node's ranks saved (``rankrun.checkpoint.save``) is kept (``checkpoint.kept``): once per node per
    step, when every local rank that saved it is complete in the memory the launcher owns, or refused (it did not fit:
    the previous step stays kept)."""

    step: int
    ranks: str  # the range string of this node's ranks that saved it
    bytes: int  # over those ranks
    seconds: float  # the longest blocking time of ``save`` among them
    state: KeptState
    why: str | None  # the refusal in one line; None when kept


@_event
class CheckpointWritten(Stamp):
    """A copy of this node's kept step is complete elsewhere, or was abandoned (``checkpoint.written``): held by the
    neighbour node's launcher, or written to ``--checkpoint-dir``."""

    step: int
    to: CopyTarget
    where: str  # the neighbour node's address, or the disk path
    bytes: int
    seconds: float  # the copy's own time, from its start to complete (or abandoned); it starts after the copy before it
    state: CopyState


@_event
class CheckpointRestored(Stamp):
    """This node's ranks of an attempt loaded a kept step (``checkpoint.restored``): once per node per attempt, with
    where the step came from."""

    attempt: int
    step: int
    source: RestoreSource
    ranks: str  # the range string of this node's ranks that loaded it
    bytes: int  # over those ranks
    seconds: float  # the longest load among them


@_event
class JobEnd(Stamp):
    """The job ended (``job.end``): always the last event, also after SIGTERM."""

    exit_code: int
    outcome: JobOutcome
    goodput: Goodput | None = None  # this node's account of its wall time (``events.goodput``); None in files written
    # before the key was


@record
class Goodput:
    """Where one node's wall time went (``events.goodput``), in seconds: the six parts sum to ``wall_s``."""

    wall_s: float  # from job.start to job.end (or to now, while the job runs)
    productive_s: float
    waiting_s: float
    startup_s: float
    restart_s: float
    stall_s: float
    lost_s: float


Record = (JobStart | RdzvRound | WorkersStart | WorkersEnd | Failure | Restart | Stall | StallEnd | Training
          | StragglerEvent | NodeLost | NodeExcluded | Startup | Preload | Warm | CheckpointKept | CheckpointWritten
          | CheckpointRestored | JobEnd)
R = TypeVar("R", bound=Record)  # one record class, or several (a producer's union): stamped, it keeps its type

EVENTS: dict[type[Record], str] = {
    JobStart: "job.start",
    RdzvRound: "rdzv.round",
    WorkersStart: "workers.start",
    WorkersEnd: "workers.end",
    Failure: "failure",
    Restart: "restart",
    Stall: "stall",
    StallEnd: "stall.end",
    Training: "training",
    StragglerEvent: "straggler",
    NodeLost: "node.lost",
    NodeExcluded: "node.excluded",
    Startup: "startup",
    Preload: "preload",
    Warm: "warm",
    CheckpointKept: "checkpoint.kept",
    CheckpointWritten: "checkpoint.written",
    CheckpointRestored: "checkpoint.restored",
    JobEnd: "job.end",
}
_KINDS: dict[str, type[Record]] = {name: kind for kind, name in EVENTS.items()}
# the free text cut in the JSON, and to how many characters: a restart's reason repeats the failure's exception,
# which its ``failure`` event already carries whole (to TEXT_LIMIT), so a node's file stays small; a straggler's line
# holds a host name, which a user's machines choose; a preload's why may hold an import error's last line; a refused
# step's why and a copy's where may hold a path, which a user chooses (up to PATH_MAX, longer than a pipe takes whole)
_CUT = {(Failure, "exception"): TEXT_LIMIT, (Stall, "title"): TEXT_LIMIT, (StragglerEvent, "line"): TEXT_LIMIT,
        (Preload, "why"): TEXT_LIMIT, (Restart, "reason"): REASON_LIMIT, (CheckpointKept, "why"): TEXT_LIMIT,
        (CheckpointWritten, "where"): TEXT_LIMIT}


def keys(kind: type[Stamp]) -> tuple[str, ...]:
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
        elif isinstance(value, Goodput):
            value = {name: getattr(value, name) for name in Goodput.__match_args__}
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
        if isinstance(values.get("goodput"), dict):
            values["goodput"] = Goodput(**values["goodput"])
        return kind(**values)
    except TypeError as exc:  # a key missing or unknown
        raise ValueError(f"{EVENTS[kind]}: {exc}") from None
