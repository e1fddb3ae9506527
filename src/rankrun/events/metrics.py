"""``rankrun --metrics-port``: the job's Prometheus series, folded from its events, and the endpoint serving them.

``Metrics`` is a consumer of the event stream: ``on_event`` takes each stamped record (``rankrun.events.records``)
and keeps the few numbers the series show; ``render`` writes them in Prometheus's
text exposition format 0.0.4. Every series carries the job's run id as ``run``, and a label only where its values
are a fixed set (a worker's state, a start-up phase, how a worker started, where a kept step's copy is), never a pid
or a host, and a rank only for the few stragglers named now (``rankrun_straggler_lag_seconds``: at most
``STRAGGLER_SERIES``, those of the largest lags): the number of series is bounded, the same for 8 workers as for 512.

``MetricsServer`` answers ``GET /metrics`` (and ``HEAD``) over HTTP/1.1, one request per connection, on the socket
``rankrun.listen`` binds. It serves from memory on the event loop, so it answers while the job forms or fails. A
client gets ``TIMEOUT`` seconds and ``MAX_REQUEST`` bytes for its request, and at most ``MAX_CONNECTIONS`` are
open at once (the next ones get 503): a slow or silent client holds neither memory nor the others' answers.

``rankrun_job_seconds_total{category}`` is the goodput account (``rankrun.events.goodput``) of every event folded so
far, taken at the scrape: each category shows the largest value any scrape showed, as a counter must never go down
while the account may move seconds from one category to another when a later event says where they belonged.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping

from rankrun.events.fields import ranks_in
from rankrun.events.goodput import PARTS, Ledger
from rankrun.events.records import (
    CheckpointKept,
    CheckpointRestored,
    CheckpointWritten,
    Failure,
    JobEnd,
    JobStart,
    NodeExcluded,
    NodeLost,
    Preload,
    RdzvRound,
    Record,
    Restart,
    Stall,
    StallEnd,
    Startup,
    StragglerEvent,
    Training,
    Warm,
    WorkersEnd,
    WorkersStart,
)
from rankrun.listen import listen
from rankrun.ranges import runs

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PATH = "/metrics"
STATES = ("running", "succeeded", "failed", "stopped")
STARTUP_PHASES = ("total", "rendezvous", "spawn", "script_p50", "script_max", "store_p50", "store_max")
HOW = ("forked", "exec")  # how a worker started: forked from the --preload process, or a fresh interpreter
KEPT_WHERE = ("memory", "neighbour", "disk")  # where a kept step's copy is: the launcher's memory, a neighbour, the dir
SAVES = ("kept", "refused")  # what became of a step this node's ranks saved
TIMEOUT = 5.0  # seconds a connection may stay open: a scraper sends its request at once and reads a few KB
MAX_REQUEST = 8192  # bytes of request line and headers; Prometheus sends about 300
MAX_CONNECTIONS = 32  # open at once; one scraper or two is the usual
STRAGGLER_SERIES = 8  # rankrun_straggler_lag_seconds's series at most: a slow node's ranks, not a whole job's

# workers.end's one outcome where the workers ended on their own; on any other the launcher ended those still running
_SUCCEEDED = "succeeded"


class _Attempt:
    """This node's workers in the latest attempt: its ranks, how it ended (None while it runs), the root cause's rank.
    A plain class, not a dataclass: making one costs ~0.3 ms at import, which every launch with --metrics-port pays."""

    __slots__ = ("failed_rank", "number", "outcome", "runs")

    def __init__(self, number: int, runs: tuple[tuple[int, int], ...]) -> None:
        self.number, self.runs = number, runs
        self.outcome: str | None = None
        self.failed_rank: int | None = None

    def size(self) -> int:
        return sum(last - first + 1 for first, last in self.runs)

    def holds(self, rank: int) -> bool:
        return any(first <= rank <= last for first, last in self.runs)

    def states(self) -> dict[str, int]:
        """How many of its workers are in each state. The job's root cause is ``failed`` when its rank is this node's,
        whatever the order of ``failure`` and ``workers.end``; the others of a failed attempt were ended by the
        launcher (or by the failure), ``stopped``, as are all of an attempt ended for any reason but success."""
        total = self.size()
        failed = int(self.failed_rank is not None and self.holds(self.failed_rank))
        if self.outcome is None:
            return {"running": total - failed, "succeeded": 0, "failed": failed, "stopped": 0}
        if self.outcome == _SUCCEEDED:
            return {"running": 0, "succeeded": total, "failed": 0, "stopped": 0}
        return {"running": 0, "succeeded": 0, "failed": failed, "stopped": total - failed}


def top_lags(lags: Mapping[int, float], most: int = STRAGGLER_SERIES) -> list[tuple[int, float]]:
    """The ``most`` ranks of the largest lags (the lower rank first on a tie), in rank order (pure)."""
    kept = sorted(lags.items(), key=lambda item: (-item[1], item[0]))[:most]
    return sorted(kept)


class Metrics:
    """The series of one node's launcher, folded from its events; ``render`` is their exposition."""

    def __init__(self, run: str = "", monotonic: Callable[[], float] = time.monotonic) -> None:
        self.run = run  # the label every series carries; each event's own ``run`` replaces it
        # this node's monotonic clock, the stream's (an event's ``mono``): a kept step's age is read from it at scrape
        self._monotonic = monotonic
        self.up = False
        self.attempt: _Attempt | None = None
        self.restarts = 0
        self.restarts_left: int | None = None
        self.failures = 0
        self.stalls = 0
        self.nodes_lost = 0
        self.nodes_excluded = 0
        self.round: int | None = None
        self.nodes: int | None = None
        self.world_size: int | None = None
        self.group_rank: int | None = None
        self.rendezvous_seconds: float | None = None
        self.startup: dict[str, float] = {}
        self.import_seconds: float | None = None  # the --preload process's one import, once it was ready
        self.starts = dict.fromkeys(HOW, 0)
        # each workers.start counts its ranks as exec; under --preload its attempt's warm event, which the launcher
        # emits right after it in the same step of its loop (no scrape is answered between them), moves those it says
        # were forked to forked. ``unsorted``: the latest workers.start's (attempt, ranks counted), until its warm event
        self.unsorted: tuple[int, int] | None = None
        # the newest kept step (``rankrun.checkpoint``): its number and when (``mono``) it was kept; bytes by where
        self.kept_step: int | None = None
        self.kept_at: float | None = None
        self.save_seconds: float | None = None
        self.kept_bytes: dict[str, int] = {}
        self.saves = dict.fromkeys(SAVES, 0)
        # rank -> median lag of each rank named a straggler now (all of them: when one of the shown recovers, the next
        # largest is shown); at most the job's ranks, a few bytes each
        self.stragglers: dict[int, float] = {}
        # where this node's time went (the goodput account), fed every event, read at each scrape on ``monotonic``;
        # ``shown``: each category's largest value a scrape showed, the floor of the next (a counter never goes down)
        self.ledger = Ledger()
        self.shown = dict.fromkeys(PARTS, 0.0)

    def on_event(self, event: Record) -> None:
        """Fold one record in. Never raises: a consumer never breaks the stream that feeds it."""
        self.run = event.run
        self.ledger.add(event)
        match event:
            case JobStart():
                self.up = True
                self.restarts_left = event.max_restarts  # none used yet
            case JobEnd():
                self._job_end()
            case RdzvRound():
                self.round, self.nodes, self.world_size = event.round, event.nodes, event.world_size
                self.group_rank, self.rendezvous_seconds = event.group_rank, float(event.seconds)
            case WorkersStart() | WorkersEnd():
                self._workers(event)
            case Failure():
                self.failures += 1
                if self.attempt is not None and event.attempt == self.attempt.number:
                    self.attempt.failed_rank = event.rank
            case StragglerEvent():
                self._straggler(event)
            case Startup():
                self.startup = {phase: float(value) for phase in STARTUP_PHASES
                                if (value := getattr(event, phase)) is not None}
            case Preload() | Warm():
                self._preload(event)
            case CheckpointKept() | CheckpointWritten() | CheckpointRestored():
                self._checkpoint(event)
            case StallEnd() | Training():
                pass
            case _:
                self._count(event)

    def _count(self, event: Restart | Stall | NodeLost | NodeExcluded) -> None:
        match event:
            case Restart():
                self.restarts += 1
                self.restarts_left = event.restarts_left
            case Stall():
                self.stalls += 1
            case NodeLost():
                self.nodes_lost += len(event.nodes)
            case NodeExcluded():
                self.nodes_excluded += len(event.nodes)
                self.nodes_lost += len(event.nodes)  # the counter's "lost or excluded": gone from the job either way

    def _preload(self, event: Preload | Warm) -> None:
        if isinstance(event, Preload):
            if event.state == "ready":
                self.import_seconds = float(event.seconds)
        elif self.unsorted is not None and self.unsorted[0] == event.attempt:
            forked = min(ranks_in(event.forked), self.unsorted[1])  # never more than its workers.start counted
            self.starts["exec"] -= forked
            self.starts["forked"] += forked
            self.unsorted = None

    def _checkpoint(self, event: CheckpointKept | CheckpointWritten | CheckpointRestored) -> None:
        """A step kept counts and becomes the newest (the latest told, also when an attempt resumed from an older one
        and saves again from there); a refused one only counts. A copy complete elsewhere gives its bytes; an abandoned
        one, and a restore, change nothing shown."""
        if isinstance(event, CheckpointKept):
            if event.state not in SAVES:
                return
            self.saves[event.state] += 1
            if event.state == "kept":
                self.kept_step, self.kept_at, self.save_seconds = event.step, event.mono, float(event.seconds)
                self.kept_bytes["memory"] = event.bytes
        elif isinstance(event, CheckpointWritten) and event.state == "complete" and event.to in KEPT_WHERE:
            self.kept_bytes[event.to] = event.bytes

    def _age(self) -> float | None:
        """Seconds since the newest step was kept, now (never below 0)."""
        return None if self.kept_at is None else max(self._monotonic() - self.kept_at, 0.0)

    def _job_seconds(self) -> dict[str, float]:
        """The account now, each category raised to the largest value shown before, which it becomes."""
        account = self.ledger.at(self._monotonic())
        for part in PARTS:
            self.shown[part] = max(self.shown[part], getattr(account, f"{part}_s"))
        return self.shown

    def _job_end(self) -> None:
        self.up = False
        self.stragglers.clear()  # no worker runs: nobody holds the others back
        if self.attempt is not None and self.attempt.outcome is None:
            self.attempt.outcome = "stopped"  # the launcher leaves no worker running when it ends

    def _workers(self, event: WorkersStart | WorkersEnd) -> None:
        if isinstance(event, WorkersStart):
            self.stragglers.clear()  # a new attempt's processes: the watch judges them afresh
            try:
                self.attempt = _Attempt(event.attempt, tuple(runs(event.ranks)))
            except ValueError:
                self.attempt = _Attempt(event.attempt, ())
            self.starts["exec"] += self.attempt.size()
            self.unsorted = (event.attempt, self.attempt.size())
        elif self.attempt is not None and event.attempt == self.attempt.number:
            self.attempt.outcome = event.outcome
            self.stragglers.clear()  # the attempt's workers are gone, and with them its stragglers

    def _straggler(self, event: StragglerEvent) -> None:
        if event.rank < 0:
            return
        if event.verdict == "named":
            lag = event.lag
            self.stragglers[event.rank] = lag if lag is not None and math.isfinite(lag) else 0.0  # stack samples: no lag
        elif event.verdict == "recovered":
            self.stragglers.pop(event.rank, None)

    def render(self) -> bytes:
        """The exposition text: one HELP and TYPE per family, then its samples; a gauge not known yet has none."""
        states = self.attempt.states() if self.attempt is not None else dict.fromkeys(STATES, 0)
        families: list[tuple[str, str, str, list[tuple[dict[str, str], float | None]]]] = [
            ("rankrun_up", "gauge", "1 while the job runs on this node (from its start to its end), else 0.",
             [({}, int(self.up))]),
            ("rankrun_workers", "gauge", "This node's workers in the latest attempt, by state: running, succeeded, "
             "failed (the job's root cause, when it is on this node), stopped (ended by the launcher or by the "
             "failure).", [({"state": s}, states[s]) for s in STATES]),
            ("rankrun_attempt", "gauge", "The latest attempt's number, 0 for the first.",
             [({}, self.attempt.number if self.attempt is not None else None)]),
            ("rankrun_restarts_total", "counter", "Restarts of the workers the job decided.", [({}, self.restarts)]),
            ("rankrun_restarts_left", "gauge", "Restarts left before a failure ends the job.",
             [({}, self.restarts_left)]),
            ("rankrun_failures_total", "counter", "Failed attempts, each with one root cause.", [({}, self.failures)]),
            ("rankrun_world_size", "gauge", "Workers in the job, all nodes together, as of the latest round.",
             [({}, self.world_size)]),
            ("rankrun_nodes", "gauge", "Nodes by state: member (in the latest round), excluded (from the job for good: "
             "blamed for --max-node-failures failures, or unhealthy).",
             [({"state": "member"}, self.nodes), ({"state": "excluded"}, self.nodes_excluded)]),
            ("rankrun_node_rank", "gauge", "This node's rank among the nodes (its group rank) in the latest round.",
             [({}, self.group_rank)]),
            ("rankrun_rendezvous_round", "gauge", "The latest round's number.", [({}, self.round)]),
            ("rankrun_rendezvous_seconds", "gauge", "Seconds the latest round took to form, from this node's join.",
             [({}, self.rendezvous_seconds)]),
            ("rankrun_stalls_total", "counter", "Stall reports.", [({}, self.stalls)]),
            ("rankrun_nodes_lost_total", "counter", "Nodes the job lost or excluded.", [({}, self.nodes_lost)]),
            ("rankrun_startup_seconds", "gauge", "The latest start-up reported, by phase: total, rendezvous, spawn, "
             "and over its ranks the p50 and max of reaching the script and of the first store request.",
             [({"phase": p}, self.startup.get(p)) for p in STARTUP_PHASES]),
            ("rankrun_straggler_lag_seconds", "gauge", "The median lag (seconds) of each rank named a straggler now, "
             "by rank: how late the others found it in the collectives it was late on, 0 when judged on stack samples "
             f"(they give no lag). At most {STRAGGLER_SERIES} series, those of the largest lags; a rank's series goes "
             "when it recovers or its attempt ends.",
             [({"rank": str(rank)}, lag) for rank, lag in top_lags(self.stragglers)]),
            ("rankrun_preload_import_seconds", "gauge", "Seconds the --preload process took to import its modules, "
             "once, when it got ready.", [({}, self.import_seconds)]),
            ("rankrun_worker_starts_total", "counter", "Workers started on this node, by how: forked (from the "
             "--preload process) or exec (a fresh interpreter).", [({"how": how}, self.starts[how]) for how in HOW]),
            ("rankrun_checkpoint_step", "gauge", "The newest step this node's ranks saved that is kept "
             "(rankrun.checkpoint: every local rank's state complete in the memory the launcher owns).",
             [({}, self.kept_step)]),
            ("rankrun_checkpoint_age_seconds", "gauge", "Seconds since the newest kept step was kept, at the scrape: the "
             "work a failure now would cost.", [({}, self._age())]),
            ("rankrun_checkpoint_bytes", "gauge", "The bytes of the latest copy of a kept step, by where: memory (the "
             "launcher's, over this node's ranks), neighbour (held by the neighbour node), disk (--checkpoint-dir).",
             [({"where": w}, self.kept_bytes.get(w)) for w in KEPT_WHERE]),
            ("rankrun_checkpoint_saves_total", "counter", "Steps this node's ranks saved, by state: kept, or refused "
             "(it did not fit: the previous step stays kept).", [({"state": s}, self.saves[s]) for s in SAVES]),
            ("rankrun_checkpoint_save_seconds", "gauge", "The longest blocking time of save() among this node's ranks, "
             "for the newest kept step.", [({}, self.save_seconds)]),
            ("rankrun_job_seconds_total", "counter", "Seconds of this node's time since the job's start, by category "
             "of the goodput account: productive, waiting, startup, restart, stall, lost (goodput: productive over "
             "their sum); the final account once the job ended. A later event can move seconds from one category to "
             "another (a first collective seen late turns start-up into productive): each shows the largest value "
             "shown so far, never less.", [({"category": c}, v) for c, v in self._job_seconds().items()]),
        ]
        run = _label_value(self.run)
        lines: list[str] = []
        for name, kind, text, samples in families:
            lines += [f"# HELP {name} {_help(text)}", f"# TYPE {name} {kind}"]
            for labels, value in samples:
                if value is not None:
                    rest = "".join(f',{k}="{_label_value(v)}"' for k, v in labels.items())
                    lines.append(f'{name}{{run="{run}"{rest}}} {_number(value)}')
        return ("\n".join(lines) + "\n").encode()


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def url(host: str, port: int) -> str:
    """Where the series are: an IPv6 address in brackets, as URLs write it."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{PATH}"


def announcement(host: str, port: int) -> str:
    """The one console line that says where the series are."""
    return f"rankrun: metrics at {url(host, port)}"


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 503: "Service Unavailable"}


def answer(request: bytes, metrics: Metrics) -> bytes:
    """The whole response to one request (its request line and headers, up to the empty line)."""
    parts = request.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return _response(400)
    method, target = parts[0], parts[1]
    if target.split(b"?", 1)[0] != PATH.encode():
        return _response(404)
    if method not in {b"GET", b"HEAD"}:
        return _response(405, extra=b"Allow: GET, HEAD\r\n")
    body = metrics.render()
    head = _response(200, body=body, content_type=CONTENT_TYPE)
    return head[: len(head) - len(body)] if method == b"HEAD" else head


def _response(status: int, body: bytes | None = None, content_type: str = "text/plain; charset=utf-8",
              extra: bytes = b"") -> bytes:
    reason = _REASONS[status]
    if body is None:
        body = f"{status} {reason}\n".encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n").encode() + extra + b"\r\n" + body


class _Exchange(asyncio.Protocol):
    """One connection: read the request (bounded in size and time), answer, close."""

    def __init__(self, server: MetricsServer) -> None:
        self._server = server
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if len(self._server.open) >= MAX_CONNECTIONS:
            self._finish(_response(503))
            return
        self._server.open.add(transport)
        # one deadline for the whole exchange: a client that sends nothing, or reads nothing, is cut off
        self._deadline = asyncio.get_running_loop().call_later(TIMEOUT, transport.abort)

    def data_received(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._buffer += data
        end = min((i for i in (self._buffer.find(b"\r\n\r\n"), self._buffer.find(b"\n\n")) if i >= 0), default=-1)
        if end >= 0 and end <= MAX_REQUEST:
            self._finish(answer(self._buffer[:end], self._server.metrics))
        elif len(self._buffer) > MAX_REQUEST:
            self._finish(_response(431))

    def eof_received(self) -> bool:
        return False  # the client stopped sending before its request was whole: close

    def connection_lost(self, exc: Exception | None) -> None:
        del exc  # however it ended, the connection is no longer open
        if self._deadline is not None:
            self._deadline.cancel()
        if self._transport is not None:
            self._server.open.discard(self._transport)

    def _finish(self, response: bytes) -> None:
        assert self._transport is not None
        self._buffer = b""
        self._transport.pause_reading()
        self._transport.write(response)
        self._transport.close()  # after the response is flushed


class MetricsServer:
    """``metrics`` at ``http://host:port/metrics``; ``start`` binds (port 0: the OS picks) and returns the port."""

    def __init__(self, metrics: Metrics, host: str, port: int = 0) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self.open: set[asyncio.Transport] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen (a bind that fails is ``rankrun.listen``'s ``StoreError``); the port bound."""
        self._server, self.port = await listen(self.host, self.port, lambda: _Exchange(self))
        return self.port

    async def close(self) -> None:
        """Stop listening and cut the connections still open."""
        if self._server is not None:
            self._server.close()
        for transport in list(self.open):
            transport.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> MetricsServer:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
