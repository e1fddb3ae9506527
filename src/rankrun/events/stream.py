"""One job's event stream: the producers hand it a fact, it stamps the common keys and passes it to each consumer.

One ``EventStream`` per job, made with the agent's seams (``agent/deps.py``) and handed to the agent, which emits each
fact where it decides it (its loop, the rounds, the attempt's watch); there is no module-level bus. The consumers (the
``--events`` file, the metrics, torchelastic's lines, the DCGM files, the console's lines) take the stamped records
themselves and see every record in the order it was emitted, each stamped with the same run id and node and the
stream's clocks. The stream has no end of its own: ``job.end`` is the last record, after which the job's observers
(``agent/observers.py``) close the consumers that hold something open.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

from rankrun.events.records import R, Record, stamp


class Consumer(Protocol):
    def on_event(self, event: Record) -> None:
        """Take one stamped record. Called from the job's one thread (the event loop's): never raises, and never waits
        on a device (a file is written by a thread of its own, a pipe without blocking; a line for the launcher's
        stdout or stderr is queued to the console, which makes its caller wait only while its queue is full, as it
        does for every line of the launcher's own)."""
        ...


class EventStream:
    """Stamps each fact with ``run``, ``node``, ``wall()`` and ``monotonic()`` and fans it out, in order."""

    def __init__(self, run: str, node: str, consumers: Iterable[Consumer] = (),
                 wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.run, self.node = run, node
        self._consumers = list(consumers)
        self._wall, self._monotonic = wall, monotonic

    def add(self, consumer: Consumer) -> None:
        """A consumer that sees the facts emitted from now on."""
        self._consumers.append(consumer)

    def emit(self, fact: R, *, mono: float | None = None) -> R:
        """Stamp ``fact`` (its common fields are ignored) and give it to every consumer; the stamped record. ``mono``:
        the monotonic time it is stamped with, when a value it carries was computed for that moment (``now``)."""
        event = stamp(fact, self._wall(), self._monotonic() if mono is None else mono, self.run, self.node)
        for consumer in self._consumers:
            consumer.on_event(event)
        return event

    def now(self) -> float:
        """The stream's monotonic clock now: what the next event's ``mono`` would be."""
        return self._monotonic()

    @property
    def wanted(self) -> bool:
        """Whether anyone listens: a producer may skip computing a costly fact for nobody."""
        return bool(self._consumers)
