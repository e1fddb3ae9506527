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
no change to user code is needed. One rule gives those words (``failure_words``) to every place that says a failure:
the report, the restart line (``restart_reason``), the ``failure`` event (``rankrun.agent.facts``) and this node's
first failure in the other nodes' reports (``node_summary``).
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


def root_cause(results: Sequence[WorkerResult]) -> WorkerResult | None:
    failures = [r for r in results if r.ending is Ending.FAILED]
    return min(failures, key=lambda r: (r.ended_at, r.rank)) if failures else None


@record
class FailureWords:
    """A failed worker's failure in words (``failure_words``), one view for each place that says it."""

    source: str  # where the words come from: "error file", "signal", or the tail's label ("stderr", "output")
    text: str  # what the report quotes (several lines; the other nodes' reports quote its last ones)
    exception: str | None  # ``Type: message``, the ``failure`` event's (so the other nodes' restart line's); None: none
    line: str  # one line, this node's restart line: ``rank 1 (pid 4242) exited 1: ValueError: bad lr``


def failure_words(result: WorkerResult) -> FailureWords:
    """A failed worker's failure in words, by one rule (pure): the text of its error file (``@record``), else the
    traceback that ended its output (``rankrun.report.cause``: the last one, followed by at most ``AFTER`` non-blank
    lines, whatever ended the process: an exit code, or a signal in its teardown), else its exit code or signal.

    The exception is the error file's first line (or its traceback's exception line), else that traceback's
    exception line; None when neither says. The one line names it: ``rank 1 (pid 4242) was killed by signal 6
    (SIGABRT): ValueError: bad lr``; an exit without one names the last line of what the tail explains (e.g.
    ``sys.exit("message")``'s).
    """
    error = result.error
    if error is not None and (error.message.strip() or error.traceback.strip()):
        text = error.traceback.rstrip("\n") or error.message
        said = error.message.strip().split("\n")[0] or _last_said(text)  # "ValueError: ..." starts the message
        return FailureWords("error file", text, said, _one_line(result, said))
    return _tail_words(result)


def _tail_words(result: WorkerResult) -> FailureWords:
    """``failure_words`` of a worker whose error file says nothing: its output's tail, else its status."""
    raised, quoted, label = ending_exception(result.stderr_tail), explain(result.stderr_tail), result.tail_label
    said = raised if raised is not None or result.status < 0 else _last_said(quoted)
    line = _one_line(result, said or "")
    if result.status >= 0:
        return FailureWords(label, quoted or f"<the worker wrote nothing to {label}>", raised, line)
    head = f"Signal {-result.status} ({signal_name(-result.status)}) received by PID {result.pid}"
    if raised is not None:  # it raised, then died in its teardown
        head += f" after {raised}"
    return FailureWords("signal", f"{head}; its last {label} lines:\n{quoted}" if quoted else head, raised, line)


def _last_said(text: str) -> str:
    return next((line.strip() for line in reversed(text.split("\n")) if line.strip()), "")


def _one_line(result: WorkerResult, said: str) -> str:
    how = f"was killed by {describe_status(result.status)}" if result.status < 0 else f"exited {result.status}"
    return f"rank {result.rank} (pid {result.pid}) {how}" + (f": {said}" if said else "")


def restart_reason(results: Sequence[WorkerResult], stalled: str | None) -> str:
    """Why a node restarts its workers, the ``restart`` event's reason: the stall that stopped them, else the root
    cause's one line (``failure_words``)."""
    if stalled is not None:
        return f"the workers stalled ({stalled})"
    root = root_cause(results)
    return failure_words(root).line if root else "workers failed"


def node_summary(results: Sequence[WorkerResult], host: str, stalled: str | None) -> str:
    """This node's first failure in a few lines, for the other nodes' reports (the job's first failure): the stall
    that stopped its workers, else the root cause's status and the last 12 lines of its text (``failure_words``)."""
    if stalled is not None:
        return f"the workers on {host} stalled: {stalled}"
    root = root_cause(results)
    if root is None:
        return f"a worker on {host} failed"
    head = f"rank {root.rank} (local_rank {root.local_rank}) on {host}, pid {root.pid}: {describe_status(root.status)}"
    return "\n".join([head, *failure_words(root).text.split("\n")[-12:]])


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
        out.append(_slurm_line(slurm))
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
        out += _root_cause_lines(root, host, error_files_kept)
    others = sorted((r for r in results if r is not root), key=lambda r: r.rank)
    if others:
        out += [thin, "Other workers:", *(_other_worker_line(r) for r in others)]
    out.append(bar)
    return "\n".join(out) + "\n"


def _slurm_line(slurm: Mapping[str, str]) -> str:
    """``Slurm job 4242, step 0, restart 1``: the job id bare, each other field (``slurm.job_words``) named."""
    return "Slurm job " + ", ".join(f"{k} {v}" if k != "job" else v for k, v in slurm.items())


def _root_cause_lines(root: WorkerResult, host: str, error_files_kept: bool) -> list[str]:
    """The root cause's block: who failed, where, when and how, then its words and the hint they suggest."""
    words = failure_words(root)
    return [
        f"Root cause (first failure, at {_stamp(root.ended_at)}):",
        f"  rank       : {root.rank} (local_rank: {root.local_rank})",
        f"  host       : {host}",
        f"  pid        : {root.pid}",
        f"  exit       : {describe_status(root.status)}",
        f"  error_file : {_error_file_line(root, error_files_kept)}",
        f"  exception  : (from {words.source})",
        _indent(words.text),
        *hint(words.text),
    ]


def _other_worker_line(result: WorkerResult) -> str:
    """One line for a worker that is not the root cause: how it ended, in the words its ending calls for."""
    what = {
        Ending.FAILED: f"also failed at {_stamp(result.ended_at)}: {describe_status(result.status)}",
        Ending.STOPPED: f"stopped by rankrun ({describe_status(result.status)})",
        Ending.SUCCEEDED: "exited 0",
    }[result.ending]
    return f"  rank {result.rank} (local_rank {result.local_rank}, pid {result.pid}): {what}"


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
    text = failure_words(result).text
    message = result.error.message if result.error is not None else text.rstrip("\n").split("\n")[-1]
    timestamp = result.error.timestamp if result.error is not None and result.error.timestamp else int(result.ended_at)
    return error_json(message, text, timestamp, error_code=result.status,
                      extra={f"slurm_{k}": v for k, v in (slurm or {}).items()})
