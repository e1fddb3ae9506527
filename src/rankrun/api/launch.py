"""``rankrun.launch(fn, *args, nproc_per_node=1, **options)``: the CLI's job, run from Python, every rank's value back.

The options are the CLI's, as keywords (``nnodes=2``, ``rdzv_conf={"join_timeout": 5}``, ``standalone=True``), turned
into its command line and validated by its own parser first: a bad value is a ``ValueError`` naming the option, and
nothing starts. Then the launcher itself runs, as a child process (``python -m rankrun ... -m rankrun.api.worker PAYLOAD RESULTS
NAME``, ``NAME`` only for the failure report's title):
the same agent as the CLI, with its restarts, its root cause and its no-orphans guarantees, and nothing of it in the
caller's process (no signal handler, no event loop, no fork of an interpreter that may hold CUDA or a notebook's
threads). It dies with the caller (``PR_SET_PDEATHSIG``), and its watchdog takes the workers with it, and the
caller's private directory (``API_DIR``): a caller ended by a signal (SIGTERM) runs no clean-up of its own.

Each worker is a fresh interpreter that loads ``(fn, args)`` (``rankrun.api.ship``: what ``__main__`` defines goes
by value) and writes its value to the run's private directory (``rankrun.api.worker``); on this node values are
files, so their size is bounded only by the disk. The other nodes' values come through the rendezvous store
(``rankrun.api.values``: up to ``VALUE_LIMIT`` bytes each, larger ones spilled to files under ``log_dir``), and so
do their failures when the job fails (``rankrun.api.failures``).
The launcher's output is relayed, line by line, to the caller's ``sys.stdout`` and ``sys.stderr`` (a notebook's
cell output), with the CLI's rank prefixes. A failure raises ``WorkerError``, whose message is the failure report:
the launcher hands the report to the caller (``RANKRUN_REPORT_JSON``) instead of printing it, so it is shown where an
uncaught exception is (Python's ``sys.excepthook``, a notebook's cell), and a caller that catches it prints nothing.
``KeyboardInterrupt`` in the caller stops the job: SIGINT to the launcher (forwarded to the workers), then, after
``INTERRUPT_GRACE`` seconds, SIGKILL (its watchdog kills every worker).

Several launches at once from threads of one process are independent jobs (each its own launcher, its own port);
only the main thread gets ``KeyboardInterrupt``. A launch from inside a worker is refused with ``RuntimeError``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from rankrun.api.results import cause, failures, read_report, root_rank
from rankrun.api.ship import dumps, loads
from rankrun.api.values import read_spilled
from rankrun.cli import build_parser, spec_from_args
from rankrun.errors import LauncherError, RankrunError, WorkerError
from rankrun.proc.spawn import pdeathsig_exec
from rankrun.spec import API_DIR, API_DIR_PREFIX, API_WORKER

INTERRUPT_GRACE = 1.0  # seconds from the caller's KeyboardInterrupt to SIGKILL of a launcher still running
NESTED = "RANKRUN_API_WORKER"  # in the launcher's environment, so in its workers': a launch from inside one is refused


def _flags() -> dict[str, tuple[str, bool]]:
    """Each option's keyword → (its flag, whether it is a switch)."""
    out = {}
    for action in build_parser({})._actions:
        long = [s for s in action.option_strings if s.startswith("--")]
        if long and action.dest not in ("help", "version", "stacks"):
            out[action.dest] = (long[0], action.nargs == 0)
    return out


def command_line(nproc_per_node: int | str, options: Mapping[str, Any]) -> list[str]:
    """The CLI's options for these keywords; ``ValueError`` for one the CLI does not have."""
    flags = _flags()
    argv = ["--nproc-per-node", str(nproc_per_node)]
    for key, value in options.items():
        if key not in flags or key in ("module", "no_python", "run_path", "training_script"):
            raise ValueError(f"rankrun.launch: unknown option {key!r} (the CLI's options, as keywords: "
                             f"{', '.join(sorted(k for k in flags if k not in ('module', 'no_python', 'run_path')))})")
        flag, switch = flags[key]
        if switch:
            argv += [flag] if value else []
        elif value is not None:
            text = ",".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, Mapping) else \
                ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
            argv += [flag, text]
    return argv


def _relay(stream: IO[bytes], sink: Callable[[], IO[str]], kept: list[str]) -> None:
    for raw in stream:
        line = raw.decode(errors="replace")
        kept.append(line)
        out = sink()
        out.write(line)
        out.flush()


def launch(fn: Callable[..., Any], *args: Any, nproc_per_node: int | str = 1, **options: Any) -> dict[int, Any]:
    """Run ``fn(*args)`` in every worker of the job the options describe; the value of each rank, by rank."""
    if os.environ.get(NESTED):
        raise RuntimeError("rankrun.launch: called inside a worker of rankrun.launch: a worker cannot start a job of "
                           "its own (return what it needs, and launch again from the caller)")
    argv = command_line(nproc_per_node, options)
    with tempfile.TemporaryDirectory(prefix=API_DIR_PREFIX) as tmp:
        run = Path(tmp)
        payload, results, report = run / "payload", run / "results", run / "report.json"
        results.mkdir()
        full = [*argv, "-m", API_WORKER, str(payload), str(results), getattr(fn, "__qualname__", type(fn).__name__)]
        try:
            spec_from_args(full, os.environ)  # the CLI's own validation, before anything starts
        except RankrunError as exc:
            raise ValueError(f"rankrun.launch: {exc}") from None
        payload.write_bytes(pickle.dumps((list(sys.path), dumps((fn, args)))))
        code, err = _run(full, {**os.environ, "RANKRUN_REPORT_JSON": str(report), NESTED: "1", API_DIR: tmp})
        if code == 0:
            return _values(results)
        if code == WorkerError.exit_code:  # the launcher's "workers failed"
            found = read_report(report)
            failed = failures(found, results)
            error = WorkerError(str(found.get("report", "")).rstrip("\n") or "the workers failed", dict(failed))
            raise error from cause(results, root_rank(found, results))
        last = next((line.strip() for line in reversed(err) if line.strip()), f"exit code {code}")
        raise LauncherError(f"rankrun.launch: the launcher failed: {last}")


def _values(results: Path) -> dict[int, Any]:
    """Every rank's value: this node's and the other nodes' (``rankrun.api.values``), by rank."""
    found = {int(p.name.split(".")[0]): p.read_bytes() for p in results.glob("*.value")}
    for at in results.glob("*.at"):  # over the store's limit: spilled to a file, read from where it lies
        try:
            found[int(at.name.split(".")[0])] = read_spilled(at)
        except OSError as exc:
            raise LauncherError(f"rankrun.launch: {exc}") from None
    return {rank: loads(data) for rank, data in sorted(found.items())}


def _run(argv: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    """The launcher, its output relayed to the caller's ``sys.stdout``/``sys.stderr``; its exit code and stderr."""
    proc = subprocess.Popen([*pdeathsig_exec(), sys.executable, "-m", "rankrun", *argv], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stderr is not None
    out: list[str] = []
    err: list[str] = []
    relays = [threading.Thread(target=_relay, args=(proc.stdout, lambda: sys.stdout, out), daemon=True),
              threading.Thread(target=_relay, args=(proc.stderr, lambda: sys.stderr, err), daemon=True)]
    for relay in relays:
        relay.start()
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        _stop(proc)
        raise
    finally:
        for relay in relays:
            relay.join(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    return code, err


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """The caller gave up: SIGINT (forwarded to the workers), then SIGKILL; the watchdog takes the rest."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=INTERRUPT_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


__all__ = ["launch"]
