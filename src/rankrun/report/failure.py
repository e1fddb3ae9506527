"""Worker results → root cause → the report printed last on stderr. Pure and golden-tested.

This node's root cause = the earliest *failure*: the worker whose non-zero exit the agent noticed
first (millisecond wall-clock resolution; exit events, not a polling tick); exits noticed
together are ordered by rank. Across nodes, the job's first failure (``job_cause``) is the one the
rendezvous store recorded first (``rendezvous.coordinator``: by store revision, never by clocks); the report
shows it first, then this node's own. Workers that
ended because rankrun stopped them are listed as stopped, never as failures. The
exception shown comes from the worker's error file when it used ``@record``, otherwise from
its last output (``rankrun.report.cause``: the traceback that ended it, never one Python
marked as ignored, whatever ended the process: an exit code, or a signal in its teardown), so
no change to user code is needed.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping, Sequence
from enum import Enum

from rankrun.record import record
from rankrun.report.cause import ending_exception, explain
from rankrun.report.errorfile import WorkerError, error_json

WIDTH = 72


class Ending(Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # ended after rankrun signalled it (a sibling's failure or a signal)


@record
class WorkerResult:
    local_rank: int
    rank: int
    pid: int
    status: int  # exit code, or -N for "killed by signal N"
    ending: Ending
    ended_at: float  # wall clock, seconds
    error_file: str
    error: WorkerError | None
    stderr_tail: str
    tail_label: str = "stderr"  # "output" when stdout and stderr were one stream (a terminal, a merged pipe)


def describe_status(status: int) -> str:
    if status < 0:
        return f"signal {-status} ({signal_name(-status)})"
    return f"exit code {status}"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def root_cause(results: list[WorkerResult]) -> WorkerResult | None:
    failures = [r for r in results if r.ending is Ending.FAILED]
    return min(failures, key=lambda r: (r.ended_at, r.rank)) if failures else None


def exception_text(result: WorkerResult) -> tuple[str, str]:
    """(where it came from, the text) for the root cause's exception."""
    if result.error is not None and (result.error.traceback or result.error.message):
        return ("error file", result.error.traceback.rstrip("\n") or result.error.message)
    quoted = explain(result.stderr_tail)
    if result.status < 0:
        line = f"Signal {-result.status} ({signal_name(-result.status)}) received by PID {result.pid}"
        if (raised := ending_exception(result.stderr_tail)) is not None:  # it raised, then died in its teardown
            line += f" after {raised}"
        return ("signal", f"{line}; its last {result.tail_label} lines:\n{quoted}" if quoted else line)
    return (result.tail_label, quoted or f"<the worker wrote nothing to {result.tail_label}>")


def failure_cause(result: WorkerResult) -> str | None:
    """``Type: message`` of the exception that ended a worker, whatever ended it (an exit code or a signal): its error
    file's first line, else the exception line of the traceback that ended its output (``ending_exception``)."""
    if result.error is not None and result.error.message.strip():
        return result.error.message.strip().split("\n")[0]  # "ValueError: ..." starts it; more lines may follow
    return ending_exception(result.stderr_tail)


def one_line(result: WorkerResult) -> str:
    """How a failed worker ended, in one line: ``rank 1 (pid 4242) exited 1: ValueError: bad lr`` (pure).

    The exception is ``failure_cause``'s; an exit without one names the last line of what the worker's tail explains
    (``rankrun.report.cause``: e.g. ``sys.exit("message")``'s). A death by signal names the signal, and the exception
    when a traceback ended its output: ``rank 1 (pid 4242) was killed by signal 6 (SIGABRT): ValueError: bad lr``.
    """
    who = f"rank {result.rank} (pid {result.pid})"
    cause = failure_cause(result)
    if result.status < 0:
        how = f"{who} was killed by {describe_status(result.status)}"
        return f"{how}: {cause}" if cause else how
    if cause is None:
        quoted = explain(result.stderr_tail)
        cause = next((line.strip() for line in reversed(quoted.split("\n")) if line.strip()), "")
    return f"{who} exited {result.status}: {cause}" if cause else f"{who} exited {result.status}"


def _error_file_line(root: WorkerResult, kept: bool) -> str:
    if root.error is None:
        return "<not written>"
    return root.error_file if kept else "<read, then removed with the private log dir; --log-dir keeps it>"


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"


def _indent(text: str, pad: str = "    ") -> str:
    return "\n".join(pad + line if line else line for line in text.split("\n"))


def render_report(
    title: str, host: str, restarts: int, results: list[WorkerResult], *, error_files_kept: bool = True, job_cause: str = "",
    stalled: str | None = None, slurm: Mapping[str, str] | None = None, excluded: Sequence[tuple[str, str]] = (),
) -> str:
    """The failure report (multi-line, ends with a newline); ``restarts``: the restarts the job used, shown as
    ``FAILED (attempt N)`` (the first attempt is 0); ``job_cause``: the job's first failure on any node;
    ``stalled``: the stall that stopped this node's workers (``--hang-action fail``), its root cause; ``slurm``: the
    Slurm job it ran in (``rankrun.slurm.job_words``); ``excluded``: the nodes the job excluded, each with why."""
    root = root_cause(results)
    bar, thin = "=" * WIDTH, "-" * WIDTH
    out = [bar, f"rankrun: {title} FAILED (attempt {restarts})"]
    if slurm:
        out.append("Slurm job " + ", ".join(f"{k} {v}" if k != "job" else v for k, v in slurm.items()))
    out.append(thin)
    if excluded:
        out += ["Nodes excluded from the job (drain them or reschedule elsewhere):",
                *(f"  {name}: {why}" for name, why in excluded), thin]
    if job_cause:
        out += ["The job's first failure (on any node):", _indent(job_cause), thin, f"This node ({host}):"]
    if stalled is not None:
        out += [f"Root cause: the workers on {host} stalled (--hang-action fail; the stack report is above):",
                f"  {stalled}"]
    if root is not None:
        source, text = exception_text(root)
        out += [
            f"Root cause (first failure, at {_stamp(root.ended_at)}):",
            f"  rank       : {root.rank} (local_rank: {root.local_rank})",
            f"  host       : {host}",
            f"  pid        : {root.pid}",
            f"  exit       : {describe_status(root.status)}",
            f"  error_file : {_error_file_line(root, error_files_kept)}",
            f"  exception  : (from {source})",
            _indent(text),
            *hint(text),
        ]
    others = [r for r in results if r is not root]
    if others:
        out += [thin, "Other workers:"]
        for r in sorted(others, key=lambda r: r.rank):
            what = {
                Ending.FAILED: f"also failed at {_stamp(r.ended_at)}: {describe_status(r.status)}",
                Ending.STOPPED: f"stopped by rankrun ({describe_status(r.status)})",
                Ending.SUCCEEDED: "exited 0",
            }[r.ending]
            out.append(f"  rank {r.rank} (local_rank {r.local_rank}, pid {r.pid}): {what}")
    out.append(bar)
    return "\n".join(out) + "\n"


LOCAL_RANK_REFUSED = "unrecognized arguments: --local-rank="


def hint(text: str) -> list[str]:
    """Lines that say how to fix a failure rankrun recognises in the root cause's text (pure)."""
    if LOCAL_RANK_REFUSED in text:
        return ["  how to fix : the script's argument parser refuses --local-rank=N, which python -m rankrun.launch passes",
                "               after the script (torch.distributed.launch's contract). Read os.environ['LOCAL_RANK'] and",
                "               add --use-env, or accept both spellings: add_argument('--local-rank', '--local_rank', type=int)"]
    return []


def root_cause_json(result: WorkerResult, slurm: Mapping[str, str] | None = None) -> str:
    """What the launcher writes to its own ``TORCHELASTIC_ERROR_FILE`` (torch's format plus ``errorCode``, and the
    Slurm job in ``extraInfo`` as ``slurm_job``, ``slurm_step``, ``slurm_restart`` when there is one)."""
    _, text = exception_text(result)
    message = result.error.message if result.error is not None else text.rstrip("\n").split("\n")[-1]
    timestamp = result.error.timestamp if result.error is not None and result.error.timestamp else int(result.ended_at)
    return error_json(message, text, timestamp, error_code=result.status,
                      extra={f"slurm_{k}": v for k, v in (slurm or {}).items()})
