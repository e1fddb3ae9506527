"""A failure in one line, as a node that did not run the rank says it (pure): ``rank 5 on HOST exited 1: Type:
message``, ``killed by SIGKILL`` for a signal, the host left out when unknown. The restart line of every node
(``agent.facts``) and the reason a node is excluded for (``rendezvous.round``) say it the same way."""

from __future__ import annotations


def failure_line(rank: int, host: str | None, exit_code: int | None, signal: str | None, exception: str | None) -> str:
    where = f"rank {rank} on {host}" if host else f"rank {rank}"
    how = f"killed by {signal}" if signal is not None else f"exited {exit_code}" if exit_code is not None else "failed"
    return f"{where} {how}: {exception}" if exception else f"{where} {how}"
