"""The job's consumers of its event stream that the options ask for, for as long as the job runs on this node.

``--events PATH`` is the ``EventLog`` (``rankrun.events.log``), opened before anything starts (a path that cannot
be written is the user's error: nothing has started). ``--metrics-port PORT`` is the ``Metrics`` fold and its
``MetricsServer`` (``rankrun.events.metrics``), bound once this node's address is known (one node: ``--local-addr``
or 127.0.0.1, at once; several: the address the rendezvous knows, once the session is open, so it answers while the
round forms), and announced in one line. ``--event-log-handler console`` is ``TorchelasticEvents`` (torchelastic's
own lines on stderr), and ``DCGM_HPC_JOB_MAPPING_DIR`` is ``DcgmMapping`` (dcgm-exporter's GPU-to-job files, which
the watchdog removes if the launcher is killed). No consumer's module is imported unless it is asked for (a plain
launch imports no ``json``).

The goodput account (``agent.goodput``) is always kept: ``end`` gives it to ``job.end`` and says it in one line.
``begin(node)`` emits ``job.start``; ``end`` emits ``job.end``, whatever ended the job, then closes the consumers: the
log writes what it holds (in a thread: the loop goes on) and says once what it dropped, and the endpoint stops
listening (a scrape that came after ``job.end`` was folded saw ``rankrun_up 0``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from rankrun.agent.facts import job_outcome, job_start
from rankrun.agent.goodput import JobGoodput
from rankrun.errors import StoreError, UsageError
from rankrun.events.records import JobEnd
from rankrun.events.stream import EventStream
from rankrun.spec import LaunchSpec

if TYPE_CHECKING:
    from rankrun.events.log import EventLog
    from rankrun.events.metrics import MetricsServer


def _nothing(*_args: str) -> None:
    return None


class ConsoleWriter(Protocol):
    """The console's writer (``rankrun.logs.console.Console``): the only one of the launcher's stdout and stderr."""

    stdout_fd: int
    stderr_fd: int

    def write_blocking(self, fd: int, data: bytes) -> None: ...


class JobObservers:
    """``open`` (before anything starts), ``begin`` (this node's address known), ``end`` (the exit code known).
    Their lines, and ``--events /dev/stdout`` or ``/dev/stderr``, go through the ``console``."""

    def __init__(self, spec: LaunchSpec, events: EventStream, console: ConsoleWriter,
                 owned: tuple[Callable[[str, str], None], Callable[[str], None]] | None = None) -> None:
        """``owned``: the watchdog's ``own_file``/``disown_file``, so DCGM's files go even after ``kill -9``."""
        self._spec, self._events, self._console, self._owned = spec, events, console, owned
        self._log: EventLog | None = None
        self._server: MetricsServer | None = None
        self._begun = self._ended = False
        self.goodput = JobGoodput()  # always: every job's end says where its time went
        events.add(self.goodput)

    def open(self) -> None:
        """The ``--events`` log, added to the stream; ``UsageError`` naming the flag when PATH cannot be written."""
        path = self._spec.observe.events
        if path is not None:
            from rankrun.events.log import EventLog  # noqa: PLC0415 - imports json: only a job with --events pays

            self._log = EventLog.open(path, self._say, self._std)
            self._events.add(self._log)
        observe = self._spec.observe
        if observe.torchelastic:
            from rankrun.events.torchelastic import TorchelasticEvents  # noqa: PLC0415 - imports json: asked for only

            self._events.add(TorchelasticEvents(self._say))
        if observe.dcgm_dir is not None:
            from rankrun.events.dcgm import DcgmMapping  # noqa: PLC0415 - only a node that dcgm-exporter watches

            on_file, off_file = self._owned if self._owned is not None else (_nothing, _nothing)
            self._events.add(DcgmMapping(observe.dcgm_dir, observe.dcgm_gpus, on_file, off_file, self._say))

    def _say(self, line: str) -> None:
        """One whole line of the launcher's own (``rankrun: ...``) on its stderr."""
        self._console.write_blocking(self._console.stderr_fd, f"{line}\n".encode())

    def _std(self, fd: int, line: bytes) -> None:
        """A line on the launcher's stdout (``fd`` 1) or stderr (2), wherever the console has them."""
        self._console.write_blocking(self._console.stdout_fd if fd == 1 else self._console.stderr_fd, line)

    async def begin(self, node: str) -> None:
        """This node's address is ``node``: serve the metrics there (``UsageError`` when the port is taken), and emit
        ``job.start``. Once."""
        if self._begun:
            return
        self._events.node = node
        port = self._spec.observe.metrics_port
        if port is not None:
            from rankrun.events.metrics import Metrics, MetricsServer, announcement  # noqa: PLC0415 - --metrics-port only

            metrics = Metrics(self._events.run)
            server = MetricsServer(metrics, node, port)
            try:
                bound = await server.start()
            except StoreError as exc:
                cause = exc.__cause__
                reason = os.strerror(cause.errno) if isinstance(cause, OSError) and cause.errno else str(exc)
                raise UsageError("--metrics-port", port, f"cannot listen on {node}: {reason}") from None
            self._server = server
            self._events.add(metrics)
            self._say(announcement(node, bound))
        self._begun = True
        self._events.emit(job_start(self._spec))

    async def end(self, code: int, *, error: bool = False, node: str = "") -> None:
        """``job.end`` (after ``job.start`` if the job ended before this node's address was known: then ``node``),
        then the consumers closed. Once."""
        if self._ended:
            return
        self._ended = True
        if not self._begun:
            self._begun = True
            self._events.node = self._events.node or node
            self._events.emit(job_start(self._spec))
        now, outcome = self._events.now(), job_outcome(code, error)
        account = self.goodput.ledger.at_end(now, succeeded=outcome == "succeeded")  # the same the line says
        self._events.emit(JobEnd(code, outcome, account), mono=now)
        said = self.goodput.line(account)
        if said is not None:
            self._say(f"rankrun: {said}")
        if self._log is not None:
            await asyncio.to_thread(self._log.close)  # waits for a file's or a terminal's lines: off the loop
        if self._server is not None:
            await self._server.close()
