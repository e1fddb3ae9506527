"""Move one worker stream from its pipe to its sinks, whole lines only.

Per stream the route is decided once (``plan_route``, pure): console or not (torchrun's
``-r``/``-t``/``--local-ranks-filter`` table), a per-rank file or not, filter duplicates,
and a tail kept for the failure report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rankrun.errors import LauncherError
from rankrun.logs.console import Console
from rankrun.logs.lines import LineSplitter, Tail, matching_lines, prefix_lines
from rankrun.proc.spawn import StreamSource
from rankrun.spec import LogSpec

CHUNK = 1 << 16


@dataclass(frozen=True)
class RoutePlan:
    to_console: bool
    to_file: bool


def plan_route(spec: LogSpec, local_rank: int, stdout: bool) -> RoutePlan:
    """torchrun's console/file semantics for one stream of one local rank."""
    redirect, tee = spec.redirects[local_rank], spec.tee[local_rank]
    redirected = redirect.has_stdout() if stdout else redirect.has_stderr()
    teed = tee.has_stdout() if stdout else tee.has_stderr()
    to_file = (redirected or teed) and not spec.discard_files
    visible = spec.local_ranks_filter is None or local_rank in spec.local_ranks_filter
    to_console = visible and (teed or not redirected)
    return RoutePlan(to_console=to_console, to_file=to_file)


@dataclass
class Route:
    console_fd: int | None
    prefix: bytes
    file: BinaryIO | None = None
    filtered: BinaryIO | None = None
    needles: tuple[bytes, ...] = ()
    tail: Tail | None = None
    reading: bool = False  # waiting on the pipe (not on the console)

    @classmethod
    def open(cls, plan: RoutePlan, console_fd: int, prefix: bytes, path: Path | None) -> Route:
        try:
            fh = open(path, "wb") if plan.to_file and path is not None else None  # noqa: SIM115 - closed by pump
        except OSError as exc:
            raise LauncherError(f"cannot open worker log {path}: {exc.strerror or exc}") from exc
        return cls(console_fd if plan.to_console else None, prefix, fh)


async def pump(source: StreamSource, route: Route, console: Console) -> None:
    """Read until EOF; every byte read is delivered, the last partial line with a newline added."""
    splitter = LineSplitter()
    try:
        while True:
            route.reading = True
            chunk = await source.read(CHUNK)
            route.reading = False
            if not chunk:
                break
            lines = splitter.feed(chunk)
            if lines:
                await _deliver(lines, route, console)
        rest = splitter.flush()
        if rest:
            await _deliver(rest, route, console)
    finally:
        if route.file is not None:
            route.file.close()


async def _deliver(lines: bytes, route: Route, console: Console) -> None:
    if route.tail is not None:
        route.tail.add(lines)
    if route.file is not None:
        route.file.write(lines)
    if route.filtered is not None and route.needles:
        hits = matching_lines(lines, route.needles)
        if hits:
            route.filtered.write(prefix_lines(hits, route.prefix))
    if route.console_fd is not None:
        await console.write(route.console_fd, prefix_lines(lines, route.prefix))
