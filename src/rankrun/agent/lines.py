"""The console's lines that say a lifecycle fact: a consumer of the job's event stream, so a line and its event can
never disagree, and a fact decided in one place is said in one place.

A ``restart`` is said as ``attempt N failed: WHAT; restarting workers (U/M restarts used)`` (``attempt N
(TORCHELASTIC_RESTART_COUNT=R) failed`` where the workers' restart count is not N: ``restart_line``), where WHAT is the
record's reason (``rankrun.report.failure.restart_reason``: the root cause's one line, or the stall). One node decides
its restarts itself; with several, each node hears the restart in the coordinator's word for the next round, and says
it then. A ``node.excluded`` is said as ``node NAME is excluded from the job: WHY``, on every node that hears it (the
excluded node says its own line). A ``checkpoint.restored`` is said as ``attempt 1 resumes from step 120 kept in
memory: ranks 0-7, 4.2 GB in 0.61 s`` (``restored_line``), once per node per attempt that resumed.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence

from rankrun.events.fields import restored_from, size_words
from rankrun.events.records import CheckpointRestored, NodeExcluded, Record, Restart
from rankrun.report.failure import Ending, WorkerResult, signal_name


def restart_line(event: Restart, max_restarts: int) -> str:
    """The line for a ``restart`` record (pure).

    Two counters meet here. The attempt is rankrun's: every group of workers this node starts (its ``attempt_<n>``
    logs). ``TORCHELASTIC_RESTART_COUNT`` is torchrun's: the restarts spent before the workers started, so the workers
    that failed saw the restarts used before this one. A membership change starts a new attempt without spending a
    restart; from then on the two differ, and the line gives both, since the worker's own output names the second.
    """
    used = max_restarts - event.restarts_left
    attempt, seen = event.attempt - 1, used - 1
    counted = f" (TORCHELASTIC_RESTART_COUNT={seen})" if seen != attempt else ""
    return f"attempt {attempt}{counted} failed: {event.reason}; restarting workers ({used}/{max_restarts} restarts used)"


def restored_line(event: CheckpointRestored) -> str:
    """The line for a ``checkpoint.restored`` record (pure): ``attempt 1 resumes from step 120 kept in memory: ranks
    0-7, 4.2 GB in 0.61 s``."""
    source = restored_from(event.source)
    took = f"{event.seconds:.2f} s" if round(event.seconds, 2) < 10 else f"{event.seconds:.1f} s"
    ranks = f"ranks {event.ranks}, " if event.ranks else ""
    return f"attempt {event.attempt} resumes from step {event.step} {source}: {ranks}{size_words(event.bytes)} in {took}"


def received(signum: int, when: str) -> str:
    """The line of a node that a signal stops outside an attempt (``when``: what it was doing)."""
    return f"received {signal_name(signum)} {when}; exiting"


def interrupted_line(signum: int, second: int | None, results: Sequence[WorkerResult]) -> str:
    """What a node says when a signal (``signum``, then ``second`` if one came) stopped its workers (pure): every node
    that receives it says it, on one node or several."""
    stopped = [r for r in results if r.ending is Ending.STOPPED]
    killed = sum(1 for r in stopped if r.status == -signal.SIGKILL)
    if second is not None:
        return (f"received {signal_name(signum)}, then {signal_name(second)}: killed {killed} worker(s) without waiting "
                f"({len(stopped) - killed} had already stopped)")
    if killed:
        return (f"received {signal_name(signum)}: forwarded to {len(stopped)} worker(s); {killed} did not stop "
                "within --shutdown-timeout and were killed")
    return f"received {signal_name(signum)}: forwarded to {len(stopped)} worker(s) and stopped them"


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
        elif isinstance(event, CheckpointRestored):
            self._say(restored_line(event))
