"""Racing awaitables (``first_of``) and unwrapping task-group failures (``first_error``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def first_of(*awaitables: Awaitable[Any]) -> tuple[int, Any]:
    """(index, result) of the first awaitable to finish; the losers are cancelled and awaited.

    An exception of the winner is raised; the losers' outcomes are discarded.
    """
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        index = next(i for i, t in enumerate(tasks) if t in done)
        return index, tasks[index].result()
    finally:
        losers = [t for t in tasks if not t.done()]
        for task in losers:
            task.cancel()
        await asyncio.gather(*losers, return_exceptions=True)  # our own cancellation still propagates
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: no "exception was never retrieved" for a loser that also failed


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first error in a (nested) exception group: what a ``TaskGroup`` failure really was."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
