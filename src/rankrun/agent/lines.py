"""The console's lines that say a lifecycle fact: a consumer of the job's event stream, so a line and its event can
never disagree, and a fact decided in one place is said in one place.

A ``restart`` is said as ``attempt N failed: WHAT; restarting workers (U/M restarts used)``, where WHAT is the
record's reason (the root cause's one line, or the stall). One node decides its restarts itself; with several, each
node hears the restart in the coordinator's word for the next round, and says it then. A ``node.excluded`` is said as
``node NAME is excluded from the job: WHY``, on every node that hears it (the excluded node says its own line).
"""

from __future__ import annotations

from collections.abc import Callable

from rankrun.events.records import NodeExcluded, Record, Restart


def restart_line(event: Restart, max_restarts: int) -> str:
    """The line for a ``restart`` record (pure)."""
    used = max_restarts - event.restarts_left
    return f"attempt {event.attempt - 1} failed: {event.reason}; restarting workers ({used}/{max_restarts} restarts used)"


class ConsoleLines:
    """Says the facts that have a console line, through ``say`` (the console's ``rankrun: ...`` line)."""

    def __init__(self, say: Callable[[str], None], max_restarts: int) -> None:
        self._say, self._max_restarts = say, max_restarts

    def on_event(self, event: Record) -> None:
        if isinstance(event, Restart):
            self._say(restart_line(event, self._max_restarts))
        elif isinstance(event, NodeExcluded):
            for name in event.nodes:
                self._say(f"node {name} is excluded from the job: {event.reason}")
