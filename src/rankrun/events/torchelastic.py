"""``--event-log-handler console``: torchelastic's own events, in torch's shape, from rankrun's event stream.

torch (``torch/distributed/elastic/agent/server/api.py``: ``_construct_event``, ``record_duration``,
``_record_worker_events``; ``launcher/api.py`` for the agent's last event) records ``Event(name, source,
timestamp, metadata)`` serialized as ``json.dumps(asdict(event))``: ``name`` is
``torchelastic.worker.status.<STATE>``, ``source`` ``AGENT`` or ``WORKER``, and ``metadata`` holds the run id,
ranks, host, state, times, and under ``metadata`` a JSON *string* with the worker group's size, the entry point
and, for a worker's event, its ranks as 1-element lists. ``TorchelasticEvents`` writes the same names in the same
order and layout (tests/golden/torchelastic_events_*.jsonl are torchrun's own lines), one line each, with what torch
leaves out filled in: ``timestamp`` is when it happened (milliseconds since the epoch, as torch's docstring says;
torch writes 0), ``group_rank`` and ``group_world_size`` once the round formed, ``worker_pid`` from the start,
``total_run_time`` as it grows.

Where rankrun knows less, or differently: a failed attempt's root cause is its one ``FAILED`` worker (with its exit
code; a signal as torch's ``-signum``), its other workers are ``TERMINATED`` (torch's name for a worker the agent
ended), and ``raw_error`` is ``{"message": "<Type: message>"}`` (``"<NONE>"`` where no exception is known) rather
than the worker's whole error file. Worker events close every attempt (torch writes them once, at the job's end).
``ASSIGN_WORKER_RANKS`` has no ``duration_ms`` (the round assigns the ranks). ``entry_point`` is the script,
module or program, not the interpreter that runs it. The agent's last event is ``SUCCEEDED`` when the launcher ran
its course whatever the workers did, ``FAILED`` when it was interrupted or failed itself, as torch's are.
"""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rankrun.events.records import Failure, JobEnd, JobStart, RdzvRound, Record, Restart, WorkersEnd, WorkersStart
from rankrun.ranges import parse_ranges

PREFIX = "torchelastic.worker.status."
ROLE = "default"  # torchrun's only role


@dataclass
class _Cause:
    """The job's root cause of one failed attempt."""

    rank: int | None
    exit_code: int | None
    exception: str | None


@dataclass
class _Workers:
    """This node's workers in one attempt."""

    attempt: int
    ranks: list[int]
    pids: list[int | None]
    ended: tuple[str, float] | None = None  # outcome and ts, once workers.end came and its lines wait for a failure


class TorchelasticEvents:
    """Writes torchelastic's event lines (each without its newline) through ``write_line`` as rankrun's events come."""

    def __init__(self, write_line: Callable[[str], None], hostname: str | None = None) -> None:
        self.write_line = write_line
        self.hostname = socket.gethostname() if hostname is None else hostname  # torch asks DNS (getfqdn); not here
        self.run_id: str | None = None
        self.entry: str | None = None
        self.rdzv_backend: str | None = None
        self.started: float | None = None  # job.start's mono
        self.mono: float | None = None  # the latest event's mono
        self.restarts = 0
        self.group_rank: int | None = None
        self.nodes: int | None = None
        self.world_size: int | None = None
        self.workers: _Workers | None = None
        self.causes: dict[int, _Cause] = {}  # attempt -> its root cause

    def on_event(self, event: Record) -> None:
        """Fold one record in and write what torch would have recorded at that point; other events write nothing.
        Never raises: a consumer never breaks the stream that feeds it."""
        self.run_id, self.mono = event.run, event.mono
        match event:
            case JobStart():
                self.entry, self.rdzv_backend, self.started = event.entry, event.rdzv_backend, self.mono
            case RdzvRound():
                self._round(event)
            case WorkersStart():
                self._workers_start(event)
            case WorkersEnd():
                self._workers_end(event)
            case Failure():
                self._failure(event)
            case Restart():
                self._flush()
                self.restarts += 1
            case JobEnd():
                self._flush()
                ran_its_course = event.outcome in ("succeeded", "failed")
                self._emit("SUCCEEDED" if ran_its_course else "FAILED", "AGENT", event.ts)

    def _round(self, event: RdzvRound) -> None:
        self._flush()
        self.group_rank, self.nodes, self.world_size = event.group_rank, event.nodes, event.world_size
        self._emit("RENDEZVOUS", "AGENT", event.ts, duration_ms=event.seconds * 1000)
        self._emit("ASSIGN_WORKER_RANKS", "AGENT", event.ts)

    def _workers_start(self, event: WorkersStart) -> None:
        self._flush()
        try:
            global_ranks = parse_ranges(event.ranks)  # torch's events are one per worker
        except ValueError:
            return
        pid_list: list[int | None] = [*event.pids]
        pid_list += [None] * (len(global_ranks) - len(pid_list))
        self.workers = _Workers(event.attempt, global_ranks, pid_list)
        for local_rank in range(len(global_ranks)):
            self._emit_worker("START", event.ts, local_rank)

    def _workers_end(self, event: WorkersEnd) -> None:
        if self.workers is None or event.attempt != self.workers.attempt:
            return
        self.workers.ended = (event.outcome, event.ts)
        if event.outcome != "failed" or self.workers.attempt in self.causes:
            self._flush()
        # else the root cause may come next (on another node's word): it flushes, or the next round, start, restart
        # or the job's end does

    def _failure(self, event: Failure) -> None:
        exit_code, name = event.exit_code, event.signal
        if exit_code is None and name is not None and name in signal.Signals.__members__:
            exit_code = -signal.Signals[name]  # torch's exit code for a worker a signal ended
        self.causes[event.attempt] = _Cause(event.rank, exit_code, event.exception)
        if self.workers is not None and self.workers.attempt == event.attempt:
            self._flush()

    def _flush(self) -> None:
        """The worker lines of an attempt that ended, once."""
        workers = self.workers
        if workers is None or workers.ended is None:
            return
        (outcome, ts), workers.ended = workers.ended, None
        cause = self.causes.get(workers.attempt)
        for local_rank, rank in enumerate(workers.ranks):
            if outcome == "succeeded":
                self._emit_worker("SUCCEEDED", ts, local_rank)
            elif outcome == "failed" and cause is not None and cause.rank == rank:
                raw_error = json.dumps({"message": cause.exception or "<NONE>"})
                self._emit_worker("FAILED", ts, local_rank, raw_error=raw_error, exit_code=cause.exit_code)
            else:
                self._emit_worker("TERMINATED", ts, local_rank)

    def _emit_worker(self, state: str, ts: float, local_rank: int, raw_error: str | None = None,
                     exit_code: int | None = None) -> None:
        assert self.workers is not None
        rank, pid = self.workers.ranks[local_rank], self.workers.pids[local_rank]
        worker: dict[str, list[int | None]] = {
            "local_rank": [local_rank], "role_rank": [rank], "role_world_size": [self.world_size],
            "exit_code": [exit_code], "worker_pid": [pid],
        }
        self._emit(state, "WORKER", ts, global_rank=rank, worker_id=None if pid is None else str(pid),
                   raw_error=raw_error, worker=worker)

    def _emit(self, state: str, source: str, ts: float, *, global_rank: int | None = None,
              worker_id: str | None = None, raw_error: str | None = None, duration_ms: float | None = None,
              worker: dict[str, list[int | None]] | None = None) -> None:
        inner: dict[str, Any] = {"group_world_size": self.nodes, "entry_point": self.entry, **(worker or {})}
        running = 0 if self.started is None or self.mono is None else int(self.mono - self.started)
        metadata = {
            "run_id": self.run_id, "global_rank": global_rank, "group_rank": self.group_rank, "worker_id": worker_id,
            "role": ROLE, "hostname": self.hostname, "state": state, "total_run_time": running,
            "rdzv_backend": self.rdzv_backend, "raw_error": raw_error, "metadata": json.dumps(inner),
            "agent_restarts": self.restarts, "duration_ms": duration_ms,
        }
        self.write_line(json.dumps({"name": PREFIX + state, "source": source, "timestamp": int(ts * 1000),
                                    "metadata": metadata}))
