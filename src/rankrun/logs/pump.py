"""Move one worker stream from its pipe (or terminal) to its sinks, as it comes.

Sinks: the per-rank file (the worker's bytes exactly), the duplicate-filter file (whole
matching lines, prefixed), the tail kept for the failure report, and the console.

The console gets every chunk at once, with one exception that keeps ranks from being cut into
pieces: when other sources share its destination, the partial line at the end of a chunk is
held for up to ``HOLD`` seconds, since the rest of a line usually follows within
microseconds (``print`` writes the text and the newline separately). A line still open after
``HOLD`` (a progress bar, a prompt) is shown as it is; a held line past ``HOLD_MAX`` bytes is
passed on in pieces. Nothing is held for a source alone on its destination.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rankrun.errors import LauncherError
from rankrun.logs.console import Source
from rankrun.logs.lines import HOLD_MAX, LineSplitter, Tail, matching_lines, prefix_lines, split_complete
from rankrun.logs.routes import RoutePlan
from rankrun.proc.output import StreamSource

HOLD = 0.05  # seconds a partial line may wait for its end when ranks share the console


@dataclass
class Activity:
    """When a worker of the group last wrote a byte, on the event loop's clock: a stall's first sign."""

    last: float = 0.0


@dataclass
class Route:
    console: Source | None
    file: BinaryIO | None = None
    filtered: BinaryIO | None = None
    filter_prefix: bytes = b""
    needles: tuple[bytes, ...] = ()
    tail: Tail | None = None
    reading: bool = False  # waiting on the pipe (not on the console)
    activity: Activity | None = None  # told of every chunk read

    @staticmethod
    def open_file(plan: RoutePlan, path: Path | None) -> BinaryIO | None:
        try:
            return open(path, "wb") if plan.to_file and path is not None else None
        except OSError as exc:
            raise LauncherError(f"cannot open worker log {path}: {exc.strerror or exc}") from exc


async def pump(source: StreamSource, route: Route, hold: float = HOLD) -> None:
    """Read until the stream ends; every byte read is delivered to every sink."""
    splitter = LineSplitter() if route.filtered is not None and route.needles else None
    held, deadline = b"", 0.0  # the partial line held back, and when it must be shown at the latest
    loop = asyncio.get_running_loop()
    try:
        while True:
            route.reading = True
            chunk = await source.read(max(0.0, deadline - loop.time()) if held else None)
            route.reading = False
            if chunk is None:  # the held partial line did not end in time: show it as it is
                held = await _to_console(route, held, b"", hold_partial=False)
                continue
            if not chunk:
                break
            if route.activity is not None:
                route.activity.last = loop.time()
            _to_files(route, chunk, splitter)
            if route.console is not None:
                was_held = bool(held)
                held = await _to_console(route, held, chunk, hold_partial=route.console.shared)
                if held and (not was_held or b"\n" in chunk):  # a new partial line: its own deadline
                    deadline = loop.time() + hold
        if held:
            await _to_console(route, held, b"", hold_partial=False)
        if splitter is not None:
            _filtered(route, splitter.flush())
    finally:
        if route.file is not None:
            route.file.close()
        if route.console is not None:
            route.console.close()


def _to_files(route: Route, chunk: bytes, splitter: LineSplitter | None) -> None:
    if route.tail is not None:
        route.tail.add(chunk)
    if route.file is not None:
        try:
            route.file.write(chunk)
        except OSError as exc:  # a full disk: the job cannot keep its logs; say so instead of a traceback
            raise LauncherError(f"cannot write worker log {route.file.name}: {exc.strerror or exc}") from exc
    if splitter is not None:
        _filtered(route, splitter.feed(chunk))


def _filtered(route: Route, lines: bytes) -> None:
    if route.filtered is not None and lines:
        hits = matching_lines(lines, route.needles)
        if hits:
            route.filtered.write(prefix_lines(hits, route.filter_prefix))


async def _to_console(route: Route, held: bytes, chunk: bytes, *, hold_partial: bool) -> bytes:
    """Write ``held + chunk`` (but a partial last line, when holding); return what is held now."""
    assert route.console is not None
    data = held + chunk if held else chunk
    rest = b""
    if hold_partial:
        data, rest = split_complete(data)
        if len(rest) > HOLD_MAX:
            data, rest = data + rest, b""
    if data:
        await route.console.write(data)
    return rest
