"""What to do after a worker group ended, as a pure function: the one place the restart budget is applied.

One node's restart loop (``rankrun.agent.loop``) and the coordinator of several
(``rankrun.rendezvous.round``, for the whole job's budget) both ask ``decide``. Exit codes are not
decided here: ``rankrun.errors.exit_code`` turns the outcome into one.
"""

from __future__ import annotations

from enum import Enum

from rankrun.record import record


@record
class Succeeded:
    """Every worker exited 0."""


@record
class Failed:
    """A worker failed (on this node, or, across nodes, anywhere in the job)."""


@record
class Signalled:
    """A handled signal stopped the group."""

    signum: int


GroupEnded = Succeeded | Failed | Signalled


class Action(Enum):
    FINISH = "finish"  # the job is done (exit 0)
    RESTART = "restart"  # run the workers again, one restart of the budget used
    GIVE_UP = "give_up"  # failed and the budget is spent (report, exit 1)
    SHUT_DOWN = "shut_down"  # a signal: stop everything (exit 128+N)


def decide(event: GroupEnded, restarts_done: int, max_restarts: int) -> Action:
    """What to do after a group ended. A signal wins over everything; only failures use the restart budget."""
    if isinstance(event, Signalled):
        return Action.SHUT_DOWN
    if isinstance(event, Succeeded):
        return Action.FINISH
    return Action.RESTART if restarts_done < max_restarts else Action.GIVE_UP
