"""The agent's decisions, as a pure function of what just happened."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from rankrun.errors import EXIT_SIGNAL_BASE, EXIT_SUCCESS, EXIT_WORKERS_FAILED


class Action(Enum):
    SUCCEED = "succeed"
    RESTART = "restart"
    GIVE_UP = "give_up"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Decision:
    action: Action
    exit_code: int | None  # None while the job goes on


def decide(*, failed: bool, interrupted_by: int | None, restarts_done: int, max_restarts: int) -> Decision:
    """What to do after an attempt ended. A signal wins over everything; failures use the restart budget."""
    if interrupted_by is not None:
        return Decision(Action.INTERRUPTED, EXIT_SIGNAL_BASE + interrupted_by)
    if not failed:
        return Decision(Action.SUCCEED, EXIT_SUCCESS)
    if restarts_done < max_restarts:
        return Decision(Action.RESTART, None)
    return Decision(Action.GIVE_UP, EXIT_WORKERS_FAILED)
