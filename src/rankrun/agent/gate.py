"""A node's health gate: the ``--health-check`` command, run before each round this node joins (``HealthGate``, a
round-level feature: ``agent.round``).

The check is ``rankrun.health.check``'s: ``/bin/sh -c CMD`` in its own process group, with the launcher's
environment plus ``LOCAL_WORLD_SIZE`` and ``TORCHELASTIC_RUN_ID``, killed with its whole group at
``--health-check-timeout``. Here it is made one of the launcher's own children: the stray reaper leaves its exit
status to the event loop (``OsSpawner.foreign``), and the watchdog kills its group if the launcher is killed -9
while it runs. A stop (SIGTERM, Ctrl-C) that arrives meanwhile ends the check at once (its group killed) and is left
queued for the caller, which stops the job as it would before any round.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator

from rankrun.agent.deps import AgentDeps
from rankrun.agent.round import Feature, Round
from rankrun.proc.signals import StopStream
from rankrun.proc.spawn import OsSpawner
from rankrun.spec import LaunchSpec


def excluded(host: str, run_id: str, reason: str) -> str:
    """The line of a node whose own check failed (``NodeExcluded``'s message: exit 4)."""
    return (f"this node ({host}) is unhealthy: health check: {reason}; it runs no workers in job {run_id}: "
            "drain it or reschedule the job elsewhere")


class HealthGate(Feature):
    """``--health-check`` before a round: a round goes only while the checks pass; ``sick`` is why one failed (the
    node then runs no workers again). ``first``: the first round is checked too (one node: before every attempt);
    else the check before joining stands for it (several nodes: ``sick`` starts as its verdict). ``report``: who is
    told of a failed check (several nodes: the coordinator, which excludes the node)."""

    def __init__(self, check: Callable[[], Awaitable[str | None]], *, first: bool, sick: str | None = None,
                 report: Callable[[str], Awaitable[None]] | None = None) -> None:
        self._check, self._first, self._report = check, first, report
        self.sick = sick

    async def before(self, round_: Round) -> bool:
        if self.sick is not None:
            return False
        if round_.attempt == 0 and not self._first:
            return True
        self.sick = await self._check()
        if self.sick is not None and self._report is not None:
            await self._report(f"health check: {self.sick}")
        return self.sick is None


async def unhealthy(spec: LaunchSpec, deps: AgentDeps, stops: StopStream) -> str | None:
    """Run the check once: None when it passed (or when there is none, or a stop came first), else its reason."""
    cmd = spec.health.check
    if cmd is None:
        return None
    from rankrun.health.check import check_env, run_check  # noqa: PLC0415 - a job with --health-check only

    env = check_env(spec.base_env, spec.worker.nproc, spec.rendezvous.run_id)
    with _own_child(deps) as on_spawn:
        check = asyncio.ensure_future(run_check(cmd, env, spec.health.timeout, on_spawn=on_spawn))
        stop = asyncio.ensure_future(stops.arrived())
        try:
            await asyncio.wait({check, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not check.done():
                check.cancel()  # run_check kills the check's group as it is cancelled
            with contextlib.suppress(asyncio.CancelledError):
                await check
    if check.cancelled():
        return None
    result = check.result()
    return None if result.healthy else result.reason


@contextlib.contextmanager
def _own_child(deps: AgentDeps) -> Iterator[Callable[[int], None]]:
    """What to tell of the check's pid (its process group's id): the spawner and the watchdog, for as long as it runs."""
    watchdog = deps.watchdog
    groups: list[int] = []
    held = deps.spawner.foreign() if isinstance(deps.spawner, OsSpawner) else contextlib.nullcontext(_nobody)
    with held as told:
        def on_spawn(pid: int) -> None:
            told(pid)
            if watchdog is not None:
                watchdog.register(pid)
                groups.append(pid)

        try:
            yield on_spawn
        finally:
            if watchdog is not None:
                for group in groups:
                    watchdog.unregister(group)


def _nobody(_pid: int) -> None:
    return None
