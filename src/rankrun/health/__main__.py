"""``python -m rankrun.health``: the node check rankrun ships for ``--health-check``.

Every probe asked for runs at once, each in its own process with the same ``--timeout``. All healthy: nothing
printed, exit 0. Otherwise one line per failure on stdout, ``rankrun.health: <probe>: <what>``, exit 1 (the launcher
takes the last line as the node's reason). Bad input: one line on stderr naming the flag and the value, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import NoReturn

from rankrun.errors import EXIT_SIGNAL_BASE, EXIT_SUCCESS, EXIT_USAGE
from rankrun.fsutil import temp_root
from rankrun.health.isolate import Probe, Stopped, run_probes
from rankrun.health.probes import (
    checkpoint_room_probe,
    free_space_probe,
    gpu_recovery_probe,
    gpus_probe,
    nofile_needed,
    nofile_probe,
    parse_size,
    path_probe,
)

PROG = "python -m rankrun.health"
EXIT_UNHEALTHY = 1
DEFAULT_TIMEOUT_S = 10.0
SHM = "/dev/shm"
PROC_ROOT_ENV = "RANKRUN_HEALTH_PROC_ROOT"  # where the driver's /proc files are read (tests hand in a directory)


class BadInput(Exception):
    """A flag's value (or the environment's) this command cannot use; the message names both."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (through BadInput), never the usage block."""

    def error(self, message: str) -> NoReturn:
        raise BadInput(f"{message} (see {PROG} --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG, description="Check this node before it joins a rankrun round: GPUs, paths, free space, open files, "
                    "memory for kept progress.",
        epilog="exit codes: 0 healthy (nothing printed), 1 unhealthy (one line per failure on stdout), "
               "2 bad input (one line on stderr), 128+N stopped by signal N")
    parser.add_argument("--gpus", metavar="N", help="at least N GPUs visible (nvidia-smi -L, else "
                        "/proc/driver/nvidia/gpus) and none waiting for a reset or reboot (nvidia-smi -q); 0: no GPU probe")
    parser.add_argument("--paths", metavar="A,B", help="each of these directories can be listed")
    parser.add_argument("--min-free", metavar="SIZE", help="at least SIZE free in --log-dir and in /dev/shm "
                        "(K, M, G, T: powers of 1024)")
    parser.add_argument("--min-shm", metavar="SIZE", help="at least SIZE free in /dev/shm (default: --min-free)")
    parser.add_argument("--checkpoint-room", metavar="SIZE", help="SIZE of memory fits in this node's room for "
                        "rankrun.checkpoint's kept state, as each save is judged (MemAvailable, the memory cgroup's "
                        "limit and usage, a margin left free)")
    parser.add_argument("--log-dir", metavar="DIR", help="where --min-free is checked (default: $TMPDIR, else /tmp)")
    parser.add_argument("--nofile", metavar="N", help="the open-files soft limit is at least N (default: "
                        "64 + 32 x $LOCAL_WORLD_SIZE; 0: no check)")
    parser.add_argument("--timeout", metavar="S", default=str(DEFAULT_TIMEOUT_S),
                        help=f"seconds each probe may take (default {DEFAULT_TIMEOUT_S:g}); they run at once")
    return parser


def _count(flag: str, text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise BadInput(f"{flag} {text!r}: not {what} (an integer >= 0)")
    return value


def _size(flag: str, text: str) -> int:
    try:
        return parse_size(text)
    except ValueError:
        raise BadInput(f"{flag} {text!r}: not a size (bytes, or a number with K, M, G or T: 20G)") from None


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise BadInput(f"--timeout {text!r}: not a number of seconds > 0")
    return value


def _nofile(text: str | None, env: Mapping[str, str]) -> tuple[int, str]:
    """The open-files limit asked for and why: ``--nofile``, else the rule on the node's LOCAL_WORLD_SIZE."""
    if text is not None:
        return _count("--nofile", text, "a number of open files"), "--nofile"
    local = env.get("LOCAL_WORLD_SIZE")
    if local is None:
        return nofile_needed(1), "64 + 32 x LOCAL_WORLD_SIZE, unset: 1"
    workers = _count("LOCAL_WORLD_SIZE", local, "a number of workers")
    return nofile_needed(workers), f"64 + 32 x LOCAL_WORLD_SIZE {workers}"


def probes(args: argparse.Namespace, env: Mapping[str, str]) -> list[Probe]:
    """The probes the command line asks for, in the order their failures are printed: the node's settings first,
    its hardware last, because a launcher quotes the check's last line as the node's reason and a GPU that needs a
    reset says more about a node than its open-files limit."""
    found: list[Probe] = []
    nofile, why = _nofile(args.nofile, env)
    if nofile:
        found.append(Probe("nofile", partial(nofile_probe, nofile, why)))
    free = _size("--min-free", args.min_free) if args.min_free is not None else None
    shm = _size("--min-shm", args.min_shm) if args.min_shm is not None else free
    if free is not None:
        log_dir = args.log_dir or str(temp_root())
        found.append(Probe("free-space", partial(free_space_probe, log_dir, free)))
    if shm is not None:
        found.append(Probe("free-space", partial(free_space_probe, SHM, shm, optional=True)))
    if args.checkpoint_room is not None:
        room = _size("--checkpoint-room", args.checkpoint_room)
        found.append(Probe("checkpoint-room", partial(checkpoint_room_probe, room, env)))
    if args.paths is not None:
        paths = [p for p in args.paths.split(",") if p]
        if not paths:
            raise BadInput(f"--paths {args.paths!r}: names no path")
        found.extend(Probe(f"path {p}", partial(path_probe, p)) for p in paths)
    gpus = _count("--gpus", args.gpus, "a number of GPUs") if args.gpus is not None else 0
    if gpus:
        found.append(Probe("gpus", partial(gpus_probe, gpus, Path(env.get(PROC_ROOT_ENV) or "/proc"), env)))
        found.append(Probe("gpu-recovery", partial(gpu_recovery_probe, env)))
    return found


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        timeout = _timeout(args.timeout)
        chosen = probes(args, os.environ)
    except BadInput as err:
        print(f"rankrun.health: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        failures = run_probes(chosen, timeout)
    except Stopped as stop:
        print(f"rankrun.health: stopped by {stop}")
        return EXIT_SIGNAL_BASE + stop.signum
    for name, message in failures:
        print(f"rankrun.health: {name}: {message}")
    return EXIT_UNHEALTHY if failures else EXIT_SUCCESS


if __name__ == "__main__":
    sys.exit(main())
