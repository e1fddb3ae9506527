"""When the attempt's drain cuts a worker's pumps (``agent.attempt._stuck_reading``): only when every pump still
running waits on its pipe; one waiting on the console (a slow terminal) is never cut short."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from rankrun.agent.attempt import _stuck_reading
from rankrun.logs.pump import Route


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _pumps(loop: asyncio.AbstractEventLoop, *ended: bool) -> list[asyncio.Future[None]]:
    pumps = [loop.create_future() for _ in ended]
    for pump, over in zip(pumps, ended, strict=True):
        if over:
            pump.set_result(None)
    return pumps


@pytest.mark.parametrize(("reading", "ended", "stuck"), [
    ((True, True), (False, False), True),  # stdout and stderr both wait on a pipe held open
    ((True, False), (False, False), False),  # stderr waits on the console: never cut short
    ((False, True), (False, True), False),  # the one still running waits on the console
    ((False, True), (True, False), True),  # stdout ended; stderr's pipe is held open
    ((True, True), (True, True), False),  # nothing left to cut
    ((), (), False),  # no pumps at all
])
def test_a_worker_is_stuck_only_when_every_live_pump_waits_on_its_pipe(loop, reading, ended, stuck):
    routes = [Route(console=None, reading=r) for r in reading]
    assert _stuck_reading(routes, _pumps(loop, *ended)) is stuck
