"""One job's event stream: the producers hand it a fact, it stamps the common keys and passes it to each consumer.

One ``EventStream`` per job, made where the job starts and handed to whoever decides a fact (the agent's loop, the
rendezvous round, the failure report); there is no module-level bus. The consumers (the ``--events`` file, the
metrics, the DCGM files, the console) see every record in the order it was emitted, each stamped with the same run
id and node and the stream's clocks. A consumer that needs the end of the job gets ``close()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

from rankrun.events.records import R, Record, stamp


class Consumer(Protocol):
    def on_event(self, event: Record) -> None:
        """Take one stamped record. Called from the job's one thread (the event loop's): never blocks, never raises."""
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

    def emit(self, fact: R) -> R:
        """Stamp ``fact`` (its common fields are ignored) and give it to every consumer; the stamped record."""
        event = stamp(fact, self._wall(), self._monotonic(), self.run, self.node)
        for consumer in self._consumers:
            consumer.on_event(event)
        return event

    @property
    def wanted(self) -> bool:
        """Whether anyone listens: a producer may skip computing a costly fact for nobody."""
        return bool(self._consumers)
