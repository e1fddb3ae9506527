"""rankrun's console script with stage marks: where the wall clock goes from exec to exit.

Usage: ``BENCH_T0=<time.time() just before exec> BENCH_MARKS=<file> python timeline.py RANKRUN-ARGS...``.
Runs ``rankrun.__main__.main_exit`` unchanged and wraps (never replaces) a few functions to note when each stage
begins and ends; ``BENCH_MARKS`` gets one ``<ms since exec> <cpu ms of this process> <stage>`` line each. The
imports are done in the order the launcher itself does them, so each import mark is that stage's own cost.
"""

import os
import sys
import time

T0 = float(os.environ["BENCH_T0"])
_marks: list[tuple[float, float, str]] = []


def mark(stage: str) -> None:
    _marks.append((time.time(), time.process_time(), stage))


mark("interpreter ready (site imported)")
from rankrun import __main__ as entry  # noqa: E402

mark("rankrun.__main__ imported (signal catcher)")
sys.modules.setdefault("ssl", None)  # as main_exit does for a job without TLS
from rankrun import cli  # noqa: E402

mark("rankrun.cli imported (argparse, the spec)")
import asyncio  # noqa: E402

mark("asyncio imported")
from rankrun import main as launcher_main  # noqa: E402

mark("rest of the launcher imported (agent, proc, logs, worker store)")
from rankrun.logs.console import Console  # noqa: E402
from rankrun.proc import spawn, watchdog  # noqa: E402

_spec_from_args = cli.spec_from_args
_launch = launcher_main.launch
_spawn = spawn.OsSpawner.spawn
_run = asyncio.run
_reap = launcher_main.reap_orphans
_close = Console.close
_spawned = [0]


def spec_from_args(*args, **kwargs):  # type: ignore[no-untyped-def]
    spec = _spec_from_args(*args, **kwargs)
    mark("arguments parsed")
    return spec


def launch(*args, **kwargs):  # type: ignore[no-untyped-def]
    mark("launch(): watchdog fork, subreaper, console thread")
    return _launch(*args, **kwargs)


async def spawn_(self, command):  # type: ignore[no-untyped-def]
    if _spawned[0] == 0:
        mark("first worker forked")
    _spawned[0] += 1
    handle = await _spawn(self, command)
    mark(f"worker {_spawned[0]} spawned")
    return handle


def run(coro, **kwargs):  # type: ignore[no-untyped-def]
    mark("event loop started")
    try:
        return _run(coro, **kwargs)
    finally:
        mark("event loop closed (workers exited, output drained)")


def reap(*args, **kwargs):  # type: ignore[no-untyped-def]
    mark("orphan sweep")
    return _reap(*args, **kwargs)


def close(self):  # type: ignore[no-untyped-def]
    mark("console flush")
    _close(self)
    mark("console closed")


cli.spec_from_args = spec_from_args
launcher_main.launch = launch
spawn.OsSpawner.spawn = spawn_
asyncio.run = run
launcher_main.reap_orphans = reap
Console.close = close
del watchdog


def _write() -> None:
    with open(os.environ["BENCH_MARKS"], "w") as fh:
        for at, cpu, stage in _marks:
            fh.write(f"{(at - T0) * 1000:.2f} {cpu * 1000:.2f} {stage}\n")


_exit_now = entry._exit_now


def exit_now(code: int) -> None:
    mark("exit chosen (os._exit: no interpreter teardown)")
    _write()
    _exit_now(code)


entry._exit_now = exit_now  # type: ignore[assignment]
sys.argv[0] = "rankrun"
entry.main_exit()
